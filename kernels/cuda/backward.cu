/* backward.cu — the CUDA backward kernels (kernels/cpu/backward.h's contracts on device pointers):
 * parameter gradients accumulate (+=), activation gradients are written (=). Deterministic: no
 * atomics, no library GEMM; every sum runs in an order fixed by the shapes, so a repeated step
 * gives the same bits (bit-exact resume). Not batch-invariant (training sums gradients anyway).
 * The products of matmul_backward are one plain tiled SGEMM (true fp32, k in order per element):
 * simple and dependency-free; cuBLAS or tensor cores here are a measured later step (its 120 ms
 * library load on every start was not worth it before training runs on the GPU). */
#include "kernels/cuda/common.cuh"
#include <math.h>

/* C (M, Nc) row-major [+]= sum_k A(m, k) B(k, n): A (M, K) at any strides, A(m, k) = A[m * a_m + k * a_k];
 * B (K, Nc) rows ldb apart, B(k, n) = B[k * ldb + n] (fp32, or bf16 read through its exact upcast). 64 x 64 tiles of C, k in
 * steps of 16 through shared memory; each of the 256 threads owns a 4 x 4 block of its tile and
 * adds k in increasing order. */
constexpr int GT = 64, GK = 16;
template <typename BT>
__device__ __forceinline__ float b_at(const BT *b, size_t i);
template <> __device__ __forceinline__ float b_at<float>(const float *b, size_t i) { return b[i]; }
template <> __device__ __forceinline__ float b_at<uint16_t>(const uint16_t *b, size_t i) { return bf16_up(b[i]); }

template <typename BT>
__global__ void __launch_bounds__(THREADS) gemm_kernel(float *C, const float *A, size_t a_m, size_t a_k, const BT *B,
                                                       size_t ldb, int M, int Nc, int K, int accumulate) {
    __shared__ float As[GK][GT], Bs[GK][GT + 1];
    int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    int m0 = blockIdx.y * GT, n0 = blockIdx.x * GT;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < K; k0 += GK) {
        for (int e = threadIdx.x; e < GK * GT; e += THREADS) {
            int kk = e / GT, mm = e % GT, k = k0 + kk;
            As[kk][mm] = (m0 + mm < M && k < K) ? A[(size_t)(m0 + mm) * a_m + (size_t)k * a_k] : 0.0f;
            Bs[kk][mm] = (n0 + mm < Nc && k < K) ? b_at(B, (size_t)k * ldb + n0 + mm) : 0.0f;
        }
        __syncthreads();
        int kn = K - k0 < GK ? K - k0 : GK;   /* only real k: no fma with padding zeros */
        for (int kk = 0; kk < kn; kk++)
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(As[kk][ty * 4 + i], Bs[kk][tx * 4 + j], acc[i][j]);
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int m = m0 + ty * 4 + i, n = n0 + tx * 4 + j;
            if (m < M && n < Nc) C[(size_t)m * Nc + n] = accumulate ? C[(size_t)m * Nc + n] + acc[i][j] : acc[i][j];
        }
}
template <typename BT>
static void gemm(float *C, const float *A, size_t a_m, size_t a_k, const BT *B, size_t ldb, int M, int Nc, int K,
                 int accumulate) {
    dim3 grid((Nc + GT - 1) / GT, (M + GT - 1) / GT);
    gemm_kernel<BT><<<grid, THREADS>>>(C, A, a_m, a_k, B, ldb, M, Nc, K, accumulate);
    CUDA_CHECK_LAUNCH();
}

/* db (n_out) += column sums of dout (N, n_out), rows in order: one thread per column */
__global__ void col_sum_kernel(float *db, const float *dout, int N, int n_out) {
    GRID_STRIDE(o, (size_t)n_out) {
        float s = 0.0f;
        for (int n = 0; n < N; n++) s += dout[(size_t)n * n_out + o];
        db[o] += s;
    }
}

/*   dx (N, n_in)      = dout (N, n_out) @ w (n_out, n_in)   A = dout,   B = w (bf16: upcast as read)
 *   dw (n_out, n_in) += dout^T @ x (N, n_in)                A = dout^T, B = x */
extern "C" void cuda_matmul_backward(float *dx, float *dw, float *db, const float *dout, const float *x, const void *w,
                                     DType wt, int N, int n_in, int n_out) {
    if (N == 0) return;
    if (dx && n_out == 0) CUDA_CHECK(cudaMemsetAsync(dx, 0, sizeof(float) * (size_t)N * n_in));
    else if (dx && wt == DTYPE_BF16) gemm(dx, dout, n_out, 1, (const uint16_t *)w, n_in, N, n_in, n_out, 0);
    else if (dx) gemm(dx, dout, n_out, 1, (const float *)w, n_in, N, n_in, n_out, 0);
    if (dw && n_out > 0 && n_in > 0) gemm(dw, dout, 1, n_out, x, n_in, n_out, n_in, N, 1);   /* NULL: frozen */
    if (db && n_out > 0) {
        col_sum_kernel<<<blocks_for(n_out), THREADS>>>(db, dout, N, n_out);
        CUDA_CHECK_LAUNCH();
    }
}

/* ---- RMSNorm: r per row (the forward's reduction), then dw by columns (before dx, which may
 * overwrite dout), then dx by rows ------------------------------------------------------------- */
__global__ void rms_scale_kernel(float *r, const float *x, int D, float eps) {
    __shared__ float sh[THREADS / WARP];
    const float *xr = x + (size_t)blockIdx.x * D;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
    ss = block_sum(ss, sh);
    if (threadIdx.x == 0) r[blockIdx.x] = 1.0f / sqrtf(ss / (float)D + eps);
}
__global__ void rms_dw_kernel(float *dw, const float *dout, const float *x, const float *r, int N, int D) {
    GRID_STRIDE(i, (size_t)D) {
        float s = 0.0f;
        for (int n = 0; n < N; n++) s += dout[(size_t)n * D + i] * (x[(size_t)n * D + i] * r[n]);
        dw[i] += s;
    }
}
__global__ void rms_dx_kernel(float *dx, const float *dout, const float *x, const void *w, DType wt, const float *r,
                              int D) {
    __shared__ float sh[THREADS / WARP];
    size_t o = (size_t)blockIdx.x * D;
    float rn = r[blockIdx.x], dot = 0.0f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) dot += dout[o + i] * weight_at_dev(w, wt, i) * (x[o + i] * rn);
    float c = block_sum(dot, sh) / (float)D;   /* its barrier: every dout read before any dx write */
    for (int i = threadIdx.x; i < D; i += blockDim.x)
        dx[o + i] = rn * (dout[o + i] * weight_at_dev(w, wt, i) - x[o + i] * rn * c);
}
extern "C" void cuda_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const void *w, DType wt,
                                      int N, int D, float eps) {
    if (N == 0 || D == 0) return;
    float *r = (float *)cuda_scratch(1, sizeof(float) * N);
    rms_scale_kernel<<<N, THREADS>>>(r, x, D, eps);
    CUDA_CHECK_LAUNCH();
    if (dw) {   /* NULL: a frozen weight */
        rms_dw_kernel<<<blocks_for(D), THREADS>>>(dw, dout, x, r, N, D);
        CUDA_CHECK_LAUNCH();
    }
    rms_dx_kernel<<<N, THREADS>>>(dx, dout, x, w, wt, r, D);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_rope_backward(float *dx, const float *cs, int N, int n_heads, int Dh) {
    rope_launch(dx, cs, N, n_heads, Dh, -1.0f);
}

/* ---- attention backward: three passes, no (T, T) matrix and no atomics -------------------------
 * 1. per (query i, head h): the forward's row (attention_row_dev) -> its max m, sum l and
 *    D = dout_i . o_i (o = acc / l);
 * 2. per (i, h): p_ij = exp(s_ij - m) / l, dp_ij = dout_i . v_j, ds = p (dp - D) / sqrt(Dh),
 *    dq_i = sum_j ds k_j (keys in tiles by position, lane l owning columns l + 32c);
 * 3. per (key j, kv head hk): dk_j = sum over its query heads and visible queries i of ds q_i,
 *    dv_j = sum of p dout_i, queries in tiles of 32 by position. */
/* stats (T, H, {m, l, D}); dout, q (T, H*Dh); k, v (T, Hkv*Dh): one sequence's own rows */
__global__ void att_stats_kernel(float *stats, const float *dout, const float *q, const float *k, const float *v, int T,
                                 int H, int Hkv, int Dh, int window, float scale) {
    __shared__ float qs[ATT_WARPS][ATT_MAX_DH];
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, task = blockIdx.x * ATT_WARPS + warp;
    if (task >= T * H) return;
    int i = task / H, h = task % H, hk = h / (H / Hkv);
    int j0 = (window > 0 && i - window + 1 > 0) ? i - window + 1 : 0;
    size_t kvd = (size_t)Hkv * Dh, qd = (size_t)H * Dh;
    for (int d = lane; d < Dh; d += WARP) qs[warp][d] = q[(size_t)i * qd + (size_t)h * Dh + d];
    __syncwarp();
    float acc[ATT_PER_LANE], m, l;
    attention_row_dev(qs[warp], k, v, NULL, T, kvd, Dh, kvd, hk, j0, i, Dh, scale, 0, 1, 0, acc, &m, &l);
    const float *gi = dout + (size_t)i * qd + (size_t)h * Dh;
    float part = 0.0f;
#pragma unroll
    for (int c = 0; c < ATT_PER_LANE; c++) {
        int d = lane + c * WARP;
        if (d < Dh) part = fmaf(gi[d], acc[c] / l, part);
    }
    float Dd = warp_sum(part);
    if (lane == 0) {
        stats[(size_t)task * 3 + 0] = m;
        stats[(size_t)task * 3 + 1] = l;
        stats[(size_t)task * 3 + 2] = Dd;
    }
}

/* p and ds of query i against key j (contiguous rows), head h */
__device__ __forceinline__ void att_p_ds(const float *qi, const float *gi, const float *kj, const float *vj, int Dh,
                                         float scale, const float *st, float *p, float *ds) {
    float dot = 0.0f, dp = 0.0f;
    for (int d = 0; d < Dh; d++) {
        dot = fmaf(qi[d], kj[d], dot);
        dp = fmaf(gi[d], vj[d], dp);
    }
    *p = expf(dot * scale - st[0]) / st[1];
    *ds = *p * (dp - st[2]) * scale;
}

__global__ void att_dq_kernel(float *dq, const float *stats, const float *dout, const float *q, const float *k,
                              const float *v, int T, int H, int Hkv, int Dh, int window, float scale) {
    __shared__ float qs[ATT_WARPS][ATT_MAX_DH], gs[ATT_WARPS][ATT_MAX_DH];
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, task = blockIdx.x * ATT_WARPS + warp;
    if (task >= T * H) return;
    int i = task / H, h = task % H, hk = h / (H / Hkv);
    int j0 = (window > 0 && i - window + 1 > 0) ? i - window + 1 : 0;
    size_t kvd = (size_t)Hkv * Dh, qd = (size_t)H * Dh;
    for (int d = lane; d < Dh; d += WARP) {
        qs[warp][d] = q[(size_t)i * qd + (size_t)h * Dh + d];
        gs[warp][d] = dout[(size_t)i * qd + (size_t)h * Dh + d];
    }
    __syncwarp();
    const float *st = stats + (size_t)task * 3;
    float acc[ATT_PER_LANE];
#pragma unroll
    for (int c = 0; c < ATT_PER_LANE; c++) acc[c] = 0.0f;
    for (int tile = j0 / ATT_TILE; tile <= i / ATT_TILE; tile++) {
        int j = tile * ATT_TILE + lane;
        float p = 0.0f, ds = 0.0f;
        if (j >= j0 && j <= i)
            att_p_ds(qs[warp], gs[warp], k + (size_t)j * kvd + (size_t)hk * Dh, v + (size_t)j * kvd + (size_t)hk * Dh,
                     Dh, scale, st, &p, &ds);
        int ja = max(j0, tile * ATT_TILE), jb = min(i, tile * ATT_TILE + ATT_TILE - 1);
        for (int jj = ja; jj <= jb; jj++) {
            float dsj = __shfl_sync(0xffffffffu, ds, jj - tile * ATT_TILE);
            const float *kj = k + (size_t)jj * kvd + (size_t)hk * Dh;
#pragma unroll
            for (int c = 0; c < ATT_PER_LANE; c++) {
                int d = lane + c * WARP;
                if (d < Dh) acc[c] = fmaf(dsj, kj[d], acc[c]);
            }
        }
    }
#pragma unroll
    for (int c = 0; c < ATT_PER_LANE; c++) {
        int d = lane + c * WARP;
        if (d < Dh) dq[(size_t)i * qd + (size_t)h * Dh + d] = acc[c];
    }
}

__global__ void att_dkv_kernel(float *dk, float *dv, const float *stats, const float *dout, const float *q,
                               const float *k, const float *v, int T, int H, int Hkv, int Dh, int window, float scale) {
    __shared__ float ks[ATT_WARPS][ATT_MAX_DH], vs[ATT_WARPS][ATT_MAX_DH];
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, task = blockIdx.x * ATT_WARPS + warp;
    if (task >= T * Hkv) return;
    int j = task / Hkv, hk = task % Hkv, group = H / Hkv;
    int i_last = (window > 0 && j + window - 1 < T - 1) ? j + window - 1 : T - 1;
    size_t kvd = (size_t)Hkv * Dh, qd = (size_t)H * Dh;
    for (int d = lane; d < Dh; d += WARP) {
        ks[warp][d] = k[(size_t)j * kvd + (size_t)hk * Dh + d];
        vs[warp][d] = v[(size_t)j * kvd + (size_t)hk * Dh + d];
    }
    __syncwarp();
    float ak[ATT_PER_LANE], av[ATT_PER_LANE];
#pragma unroll
    for (int c = 0; c < ATT_PER_LANE; c++) ak[c] = av[c] = 0.0f;
    for (int h = hk * group; h < (hk + 1) * group; h++)
        for (int tile = j / ATT_TILE; tile <= i_last / ATT_TILE; tile++) {
            int i = tile * ATT_TILE + lane;
            float p = 0.0f, ds = 0.0f;
            if (i >= j && i <= i_last)
                att_p_ds(q + (size_t)i * qd + (size_t)h * Dh, dout + (size_t)i * qd + (size_t)h * Dh, ks[warp], vs[warp],
                         Dh, scale, stats + ((size_t)i * H + h) * 3, &p, &ds);
            int ia = max(j, tile * ATT_TILE), ib = min(i_last, tile * ATT_TILE + ATT_TILE - 1);
            for (int ii = ia; ii <= ib; ii++) {
                float pi = __shfl_sync(0xffffffffu, p, ii - tile * ATT_TILE);
                float dsi = __shfl_sync(0xffffffffu, ds, ii - tile * ATT_TILE);
                const float *qi = q + (size_t)ii * qd + (size_t)h * Dh, *gi = dout + (size_t)ii * qd + (size_t)h * Dh;
#pragma unroll
                for (int c = 0; c < ATT_PER_LANE; c++) {
                    int d = lane + c * WARP;
                    if (d < Dh) {
                        ak[c] = fmaf(dsi, qi[d], ak[c]);
                        av[c] = fmaf(pi, gi[d], av[c]);
                    }
                }
            }
        }
#pragma unroll
    for (int c = 0; c < ATT_PER_LANE; c++) {
        int d = lane + c * WARP;
        if (d < Dh) {
            dk[(size_t)j * kvd + (size_t)hk * Dh + d] = ak[c];
            dv[(size_t)j * kvd + (size_t)hk * Dh + d] = av[c];
        }
    }
}

extern "C" void cuda_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                        const float *k, const float *v, int T, int H, int Hkv, int Dh, int window,
                                        float *scratch) {
    (void)scratch;
    if (T == 0 || H == 0) return;
    if (Dh > ATT_MAX_DH) backend_fatal("internal error: cuda_attention_backward supports head_dim <= %d (got %d)", ATT_MAX_DH, Dh);
    float scale = 1.0f / sqrtf((float)Dh);
    float *stats = (float *)cuda_scratch(0, sizeof(float) * 3 * (size_t)T * H);   /* (T, H, {m, l, D}) */
    unsigned bq = (unsigned)(((size_t)T * H + ATT_WARPS - 1) / ATT_WARPS);
    unsigned bk = (unsigned)(((size_t)T * Hkv + ATT_WARPS - 1) / ATT_WARPS);
    att_stats_kernel<<<bq, ATT_WARPS * WARP>>>(stats, dout, q, k, v, T, H, Hkv, Dh, window, scale);
    CUDA_CHECK_LAUNCH();
    att_dq_kernel<<<bq, ATT_WARPS * WARP>>>(dq, stats, dout, q, k, v, T, H, Hkv, Dh, window, scale);
    CUDA_CHECK_LAUNCH();
    att_dkv_kernel<<<bk, ATT_WARPS * WARP>>>(dk, dv, stats, dout, q, k, v, T, H, Hkv, Dh, window, scale);
    CUDA_CHECK_LAUNCH();
}

/* ---- elementwise and by columns -------------------------------------------------------------- */
__global__ void swiglu_backward_kernel(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                                       size_t n) {
    GRID_STRIDE(i, n) {
        float g = gate[i], u = up[i], d = dout[i];
        float sig = 1.0f / (1.0f + expf(-g));
        dgate[i] = d * u * sig * (1.0f + g * (1.0f - sig));
        dup[i] = d * (g * sig);
    }
}
extern "C" void cuda_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                                     size_t n) {
    if (n == 0) return;
    swiglu_backward_kernel<<<blocks_for(n), THREADS>>>(dgate, dup, dout, gate, up, n);
    CUDA_CHECK_LAUNCH();
}

/* one thread per column: repeated ids add up in increasing n, as on the CPU */
__global__ void embedding_backward_kernel(float *dtable, const float *dout, const int *ids, int N, int D, int v0,
                                          int V_local) {
    GRID_STRIDE(i, (size_t)D)
        for (int n = 0; n < N; n++) {
            int r = ids[n] - v0;
            if (r >= 0 && r < V_local) dtable[(size_t)r * D + i] += dout[(size_t)n * D + i];
        }
}
extern "C" void cuda_embedding_backward(float *dtable, const float *dout, const int *ids, int N, int D, int v0,
                                        int V_local) {
    if (N == 0 || D == 0) return;
    embedding_backward_kernel<<<blocks_for(D), THREADS>>>(dtable, dout, ids, N, D, v0, V_local);
    CUDA_CHECK_LAUNCH();
}

/* dlogits, logits (N, V) (may alias); lse, dlogprob, H, dH (N); targets (N). One block per row; the
 * target's logit is read before any element is written (in place) */
__global__ void logprob_backward_kernel(float *dlogits, const float *logits, const float *lse, const int *targets,
                                        const float *dlogprob, const float *H, const float *dH, int V, int v0, float T) {
    __shared__ float zt_sh;
    size_t n = blockIdx.x;
    float *g = dlogits + n * V;
    const float *row = logits + n * V;
    int tgt = targets[n], r = tgt - v0, owned = tgt >= 0 && r >= 0 && r < V;
    if (threadIdx.x == 0) zt_sh = owned ? row[r] : 0.0f;
    __syncthreads();
    if (tgt < 0) {
        for (int c = threadIdx.x; c < V; c += blockDim.x) g[c] = 0.0f;
        return;
    }
    float gn = -dlogprob[n] / T, l = lse[n], zt = zt_sh;
    int entropy = dH && dH[n] != 0.0f;
    float ge = entropy ? -dH[n] / T : 0.0f, h = entropy ? H[n] : 0.0f;
    for (int c = threadIdx.x; c < V; c += blockDim.x) {
        float z = (c == r ? zt : row[c]) / T, pc = expf(z - l);
        float base = c == r ? gn * (pc - 1.0f) : gn * pc;
        g[c] = entropy && pc != 0.0f ? base + ge * pc * (z - l + h) : base;   /* -inf (padded): 0, not 0 * inf */
    }
}
extern "C" void cuda_logprob_backward(float *dlogits, const float *logits, const float *lse, const int *targets,
                                      const float *dlogprob, const float *H, const float *dH, int N, int V_local, int v0,
                                      float T) {
    if (N == 0) return;
    logprob_backward_kernel<<<N, THREADS>>>(dlogits, logits, lse, targets, dlogprob, H, dH, V_local, v0, T);
    CUDA_CHECK_LAUNCH();
}
