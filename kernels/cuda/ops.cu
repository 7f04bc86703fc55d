/* ops.cu — the CUDA forward kernels (kernels/cuda/cuda.h, common.cuh): the batch-invariant matmul,
 * RMSNorm, RoPE, the paged-cache store, flash-style attention and the elementwise kernels (the row
 * reductions of the logprob path: vocab.cu; the matmul for bf16 weights: matmul_tc.cu). Each launcher has its cpu_ twin's contract on device pointers.
 * Owns no memory and does no communication.
 *
 * Batch invariance (what the logprob path needs): every reduction here runs in an order fixed by
 * the reduced length alone — the matmul's lanes and tree by n_in, RMSNorm's and the row
 * reductions' by D or V, attention's tiles by absolute key position — never by N, the grid or which
 * rows share a launch. So a token's logits have the same bits at batch 1 and batch 64, in a
 * prefill, a decode step and a training forward. No cuBLAS on this path: its kernel choice (and
 * split-K) depends on the shape. */
#include "kernels/cuda/common.cuh"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- matmul ------------------------------------------------------------------------------------
 * out (N, n_out) = x (N, n_in) w^T [+ bias]. A warp computes CUDA_MM_ROWS outputs for XR rows of x.
 * Lane l multiplies elements [4l, 4l + 4) of every CUDA_MM_CHUNK-element chunk of the row, fused
 * multiply-adds in increasing k into one accumulator per output, then the fixed xor tree adds the
 * 32 lanes, then the bias. bf16 weights go to the tensor cores (matmul_tc.cu) unless
 * TANDEM_CUDA_MATMUL=simt: then a bf16 weight is read here through its exact upcast, so its result
 * has the fp32 kernel's bits on the upcast weights. Memory-bound at decode: the weight rows are streamed
 * once per launch (16-byte fp32 / 8-byte bf16 loads, coalesced across the warp); x rows come from
 * L1 (the block's warps share them). */
template <typename WT> struct W4;
template <> struct W4<float> {
    static __device__ __forceinline__ float4 load(const float *w, size_t i) { return __ldg((const float4 *)(w + i)); }
    static __device__ __forceinline__ float one(const float *w, size_t i) { return __ldg(w + i); }
};
template <> struct W4<uint16_t> {
    static __device__ __forceinline__ float4 load(const uint16_t *w, size_t i) {
        uint2 u = __ldg((const uint2 *)(w + i));
        return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                           __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
    }
    static __device__ __forceinline__ float one(const uint16_t *w, size_t i) { return bf16_up(__ldg(w + i)); }
};

template <typename WT, int XR>
__global__ void __launch_bounds__(CUDA_MM_WARPS *WARP)
matmul_kernel(float *out, const float *x, const WT *w, const WT *bias, int N, int K, int n_out, int leaves, int aligned) {
    constexpr int R = CUDA_MM_ROWS;
    static_assert(R * XR <= WARP, "a lane keeps the result of at most one output");
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    int j0 = (blockIdx.x * CUDA_MM_WARPS + warp) * R;   /* first output row */
    int n0 = blockIdx.y * XR;                            /* first x row */
    if (j0 >= n_out) return;
    /* run lf covers inputs [lf * KL, (lf + 1) * KL): the lanes' dot product of each run as below, the
     * runs' sums added by the pairwise tree of tree_sum (kernels.h) on a stack, held by the lane that
     * writes the output (lane r * XR + c for output r, row c) */
    int KL = K / leaves, top = 0;
    float stack[7];   /* leaves <= 64: at most log2(64) + 1 partial sums pending */
    for (int lf = 0; lf < leaves; lf++) {
        const float *xl = x + (size_t)lf * KL;
        const WT *wl = w + (size_t)lf * KL;
        float acc[R][XR];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int c = 0; c < XR; c++) acc[r][c] = 0.0f;
        int K_full = aligned ? KL / CUDA_MM_CHUNK * CUDA_MM_CHUNK : 0;
        /* U chunks' loads issued before their multiply-adds: a warp keeps U x 2 KB (fp32) of weights in
         * flight instead of waiting a memory latency per chunk (decode is bound by that, not by the
         * bandwidth). Each accumulator still takes its chunks in increasing order: same bits. */
        constexpr int U = XR <= 2 ? 4 : 2;
        int k = 4 * lane;
        for (; k + (U - 1) * CUDA_MM_CHUNK < K_full; k += U * CUDA_MM_CHUNK) {
            float4 wv[U][R], xv[U][XR];
#pragma unroll
            for (int u = 0; u < U; u++) {
#pragma unroll
                for (int r = 0; r < R; r++)
                    wv[u][r] = j0 + r < n_out ? W4<WT>::load(wl, (size_t)(j0 + r) * K + k + u * CUDA_MM_CHUNK)
                                              : make_float4(0, 0, 0, 0);
#pragma unroll
                for (int c = 0; c < XR; c++)
                    xv[u][c] = n0 + c < N ? __ldg((const float4 *)(xl + (size_t)(n0 + c) * K + k + u * CUDA_MM_CHUNK))
                                          : make_float4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int c = 0; c < XR; c++) {
                        acc[r][c] = fmaf(wv[u][r].x, xv[u][c].x, acc[r][c]);
                        acc[r][c] = fmaf(wv[u][r].y, xv[u][c].y, acc[r][c]);
                        acc[r][c] = fmaf(wv[u][r].z, xv[u][c].z, acc[r][c]);
                        acc[r][c] = fmaf(wv[u][r].w, xv[u][c].w, acc[r][c]);
                    }
        }
        for (; k < K_full; k += CUDA_MM_CHUNK) {   /* the last < U whole chunks, one at a time */
            float4 wv[R], xv[XR];
#pragma unroll
            for (int r = 0; r < R; r++)
                wv[r] = j0 + r < n_out ? W4<WT>::load(wl, (size_t)(j0 + r) * K + k) : make_float4(0, 0, 0, 0);
#pragma unroll
            for (int c = 0; c < XR; c++)
                xv[c] = n0 + c < N ? __ldg((const float4 *)(xl + (size_t)(n0 + c) * K + k)) : make_float4(0, 0, 0, 0);
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int c = 0; c < XR; c++) {
                    acc[r][c] = fmaf(wv[r].x, xv[c].x, acc[r][c]);
                    acc[r][c] = fmaf(wv[r].y, xv[c].y, acc[r][c]);
                    acc[r][c] = fmaf(wv[r].z, xv[c].z, acc[r][c]);
                    acc[r][c] = fmaf(wv[r].w, xv[c].w, acc[r][c]);
                }
        }
        /* the tail chunk, or every chunk when rows are not 16-byte aligned: the same elements per lane
         * in the same order, one at a time */
        for (int k0 = K_full; k0 < KL; k0 += CUDA_MM_CHUNK)
            for (int e = 0; e < 4; e++) {
                int k = k0 + 4 * lane + e;
                if (k >= KL) break;
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float wk = j0 + r < n_out ? W4<WT>::one(wl, (size_t)(j0 + r) * K + k) : 0.0f;
#pragma unroll
                    for (int c = 0; c < XR; c++) {
                        float xk = n0 + c < N ? __ldg(xl + (size_t)(n0 + c) * K + k) : 0.0f;
                        acc[r][c] = fmaf(wk, xk, acc[r][c]);
                    }
                }
            }
        float v = 0.0f;   /* this run's sum of the output this lane writes */
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int c = 0; c < XR; c++) {
                float s = warp_sum(acc[r][c]);
                if (lane == r * XR + c) v = s;
            }
        for (int m = lf + 1; m % 2 == 0; m /= 2) v = stack[--top] + v;   /* (left subtree) + (this one) */
        stack[top++] = v;
    }
    int r = lane / XR, c = lane % XR, j = j0 + r, n = n0 + c;
    if (r < R && j < n_out && n < N) out[(size_t)n * n_out + j] = bias ? stack[0] + W4<WT>::one(bias, j) : stack[0];
}

extern "C" MatmulGeometry cuda_matmul_geometry(int N, int n_out) {
    MatmulGeometry g;
    g.x_rows = N <= 1 ? 1 : N <= 2 ? 2 : N <= 4 ? 4 : 8;
    g.grid_x = (unsigned)((n_out + CUDA_MM_ROWS * CUDA_MM_WARPS - 1) / (CUDA_MM_ROWS * CUDA_MM_WARPS));
    g.grid_y = (unsigned)((N + g.x_rows - 1) / g.x_rows);
    return g;
}

template <typename WT>
static void matmul_launch(float *out, const float *x, const WT *w, const WT *bias, int N, int K, int n_out, int leaves) {
    MatmulGeometry g = cuda_matmul_geometry(N, n_out);
    dim3 grid(g.grid_x, g.grid_y), block(CUDA_MM_WARPS * WARP);
    /* 16-byte loads need every row and run start 16-byte aligned: K / leaves a multiple of 4 and
     * aligned bases */
    int aligned = (K / leaves) % 4 == 0 && ((uintptr_t)x % 16) == 0 && ((uintptr_t)w % (4 * sizeof(WT))) == 0;
    switch (g.x_rows) {
    case 1: matmul_kernel<WT, 1><<<grid, block>>>(out, x, w, bias, N, K, n_out, leaves, aligned); break;
    case 2: matmul_kernel<WT, 2><<<grid, block>>>(out, x, w, bias, N, K, n_out, leaves, aligned); break;
    case 4: matmul_kernel<WT, 4><<<grid, block>>>(out, x, w, bias, N, K, n_out, leaves, aligned); break;
    default: matmul_kernel<WT, 8><<<grid, block>>>(out, x, w, bias, N, K, n_out, leaves, aligned); break;
    }
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_matmul(float *out, const float *x, const void *w, const void *bias, DType wt, int N, int n_in,
                            int n_out, int leaves) {
    if (N == 0 || n_out == 0) return;
    if (leaves < 1 || leaves > 64 || n_in % leaves || (leaves & (leaves - 1))) {
        fprintf(stderr, "cuda_matmul: %d leaves of %d inputs (a power of two up to 64 that divides them)\n", leaves, n_in);
        abort();
    }
    if (wt == DTYPE_BF16 && !cuda_matmul_simt_bf16())   /* tensor cores: matmul_tc.cu */
        matmul_tc(out, x, (const uint16_t *)w, (const uint16_t *)bias, N, n_in, n_out, leaves);
    else if (wt == DTYPE_BF16) matmul_launch(out, x, (const uint16_t *)w, (const uint16_t *)bias, N, n_in, n_out, leaves);
    else matmul_launch(out, x, (const float *)w, (const float *)bias, N, n_in, n_out, leaves);
}

/* One launch per weight: each output gets cuda_matmul's bits. */
extern "C" void cuda_matmuls(const float *x, int N, int n_in, const MatmulOut *outs, int n, DType wt) {
    for (int i = 0; i < n; i++) cuda_matmul(outs[i].out, x, outs[i].w, outs[i].bias, wt, N, n_in, outs[i].n_out, 1);
}

/* ---- RMSNorm: one block per row; sum of squares by the fixed block tree; 1/sqrtf (correctly
 * rounded, like the CPU) rather than rsqrtf; normalised first, then times w (HF order) ---------- */
__global__ void rmsnorm_kernel(float *out, const float *x, const void *w, DType wt, int D, float eps) {
    __shared__ float sh[THREADS / WARP];
    const float *xr = x + (size_t)blockIdx.x * D;  /* (D) */
    float *o = out + (size_t)blockIdx.x * D;       /* (D) */
    float ss = 0.0f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
    ss = block_sum(ss, sh);
    float scale = 1.0f / sqrtf(ss / (float)D + eps);
    for (int i = threadIdx.x; i < D; i += blockDim.x) o[i] = weight_at_dev(w, wt, i) * (xr[i] * scale);
}

extern "C" void cuda_rmsnorm(float *out, const float *x, const void *w, DType wt, int N, int D, float eps) {
    if (N == 0 || D == 0) return;
    rmsnorm_kernel<<<N, THREADS>>>(out, x, w, wt, D, eps);
    CUDA_CHECK_LAUNCH();
}

/* ---- elementwise ------------------------------------------------------------------------------ */
__global__ void round_kernel(float *x, size_t n) {
    GRID_STRIDE(i, n) x[i] = bf16_up(bf16_round(x[i]));
}
extern "C" void cuda_round_to(float *x, size_t n, DType t) {
    if (t != DTYPE_BF16 || n == 0) return;
    round_kernel<<<blocks_for(n), THREADS>>>(x, n);
    CUDA_CHECK_LAUNCH();
}

__global__ void pack_kernel(uint16_t *dst, const float *src, size_t n) {
    GRID_STRIDE(i, n) dst[i] = bf16_round(src[i]);
}
__global__ void unpack_kernel(float *dst, const uint16_t *src, size_t n) {
    GRID_STRIDE(i, n) dst[i] = bf16_up(src[i]);
}
extern "C" void cuda_pack(void *dst, DType t, const float *src, size_t n) {
    if (n == 0) return;
    if (t == DTYPE_F32) { CUDA_CHECK(cudaMemcpyAsync(dst, src, sizeof(float) * n, cudaMemcpyDeviceToDevice)); return; }
    pack_kernel<<<blocks_for(n), THREADS>>>((uint16_t *)dst, src, n);
    CUDA_CHECK_LAUNCH();
}
extern "C" void cuda_unpack(float *dst, const void *src, DType t, size_t n) {
    if (n == 0) return;
    if (t == DTYPE_F32) { CUDA_CHECK(cudaMemcpyAsync(dst, src, sizeof(float) * n, cudaMemcpyDeviceToDevice)); return; }
    unpack_kernel<<<blocks_for(n), THREADS>>>(dst, (const uint16_t *)src, n);
    CUDA_CHECK_LAUNCH();
}

/* cs (N, Dh): cos of pos * inv_freq for i < Dh/2, then the sines; the angle's product in fp32 */
__global__ void rope_table_kernel(float *cs, const int *pos, const float *inv_freq, int N, int Dh) {
    int half = Dh / 2;
    GRID_STRIDE(e, (size_t)N * half) {
        int n = (int)(e / half), i = (int)(e % half);
        float angle = (float)pos[n] * inv_freq[i];
        cs[(size_t)n * Dh + i] = cosf(angle);
        cs[(size_t)n * Dh + half + i] = sinf(angle);
    }
}
extern "C" void cuda_rope_table(float *cs, const int *pos, const float *inv_freq, int N, int Dh) {
    if (N == 0) return;
    rope_table_kernel<<<blocks_for((size_t)N * Dh / 2), THREADS>>>(cs, pos, inv_freq, N, Dh);
    CUDA_CHECK_LAUNCH();
}

/* pairs (i, i + Dh/2) of each head rotated by cs; sign -1: the inverse rotation (the backward) */
__global__ void rope_kernel(float *x, const float *cs, int N, int n_heads, int Dh, float sign) {
    int half = Dh / 2;
    GRID_STRIDE(e, (size_t)N * n_heads * half) {
        int i = (int)(e % half);
        size_t nh = e / half, n = nh / n_heads;
        float c = cs[n * Dh + i], s = sign * cs[n * Dh + half + i];
        float *xh = x + nh * Dh;
        float a = xh[i], b = xh[i + half];
        xh[i] = a * c - b * s;
        xh[i + half] = b * c + a * s;
    }
}
void rope_launch(float *x, const float *cs, int N, int n_heads, int Dh, float sign) {
    if (N == 0 || n_heads == 0) return;
    rope_kernel<<<blocks_for((size_t)N * n_heads * Dh / 2), THREADS>>>(x, cs, N, n_heads, Dh, sign);
    CUDA_CHECK_LAUNCH();
}
extern "C" void cuda_rope(float *x, const float *cs, int N, int n_heads, int Dh) { rope_launch(x, cs, N, n_heads, Dh, 1.0f); }

/* k, v rows (T, Hkv*Dh) into their cache slots (kv_paged): element (t, h, d) */
__global__ void kv_store_kernel(float *kc, float *vc, const float *k, const float *v, const int *table, int block,
                                size_t row, size_t head, const int *pos, int T, int Hkv, int Dh) {
    size_t kvd = (size_t)Hkv * Dh;
    GRID_STRIDE(e, (size_t)T * kvd) {
        size_t t = e / kvd, hd = e % kvd, h = hd / Dh, d = hd % Dh;
        size_t slot = kv_offset_dev(table, block, row, kvd, pos[t]) + h * head + d;
        kc[slot] = k[e];
        vc[slot] = v[e];
    }
}
/* the batch's rows k, v (N, Hkv*Dh) into their sequences' slots of kc, vc (n_blocks, Hkv, block, Dh):
 * row r through table tables + seq[r] * stride at position pos[r] (seq, pos: (N)) */
__global__ void kv_store_batch_kernel(float *kc, float *vc, const float *k, const float *v, const int *tables,
                                      int stride, int block, const int *seq, const int *pos, int N, int Hkv, int Dh) {
    size_t kvd = (size_t)Hkv * Dh;
    GRID_STRIDE(e, (size_t)N * kvd) {
        size_t r = e / kvd, hd = e % kvd, h = hd / Dh, d = hd % Dh;
        const int *table = tables + (size_t)seq[r] * stride;
        size_t slot = kv_offset_dev(table, block, Dh, kvd, pos[r]) + h * (size_t)block * Dh + d;
        kc[slot] = k[e];
        vc[slot] = v[e];
    }
}
extern "C" void cuda_kv_store_batch(void *kc, void *vc, const float *k, const float *v, const PagedBatch *pb, int Hkv,
                                    int Dh) {
    if (pb->N == 0) return;
    if (pb->kv_dtype != DTYPE_F32) backend_fatal("internal error: the cuda KV cache is fp32 (--kv-dtype is refused on cuda)");
    kv_store_batch_kernel<<<blocks_for((size_t)pb->N * Hkv * Dh), THREADS>>>((float *)kc, (float *)vc, k, v, pb->tables, pb->table_stride,
                                                                             pb->block, pb->seq, pb->pos, pb->N, Hkv, Dh);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_kv_store(float *kc, float *vc, const float *k, const float *v, const KVLayout *kv, const int *pos,
                              int T, int Hkv, int Dh) {
    if (T == 0) return;
    kv_store_kernel<<<blocks_for((size_t)T * Hkv * Dh), THREADS>>>(kc, vc, k, v, kv->table, kv->block, kv->row,
                                                                  kv->head, pos, T, Hkv, Dh);
    CUDA_CHECK_LAUNCH();
}

/* ---- attention ---------------------------------------------------------------------------------
 * Flash-style: one block of ATT_SPLIT warps per (query row, head), keys in tiles of 32 by absolute
 * position (ATT_TILE); warp w takes the tiles t with t % ATT_SPLIT == w and runs an online softmax
 * over them (attention_row_dev), then the warps' (max, sum, acc) are combined in warp order. No
 * (Tq, keys) score matrix exists anywhere, and which warp takes a tile, and the order of every
 * sum, depend on the keys' positions alone: a row's bits are the same in a prefill, a decode step
 * and training, whatever the layout. In a tile, lane j scores key 32t + j (a dot product over d in
 * order); the output accumulates the tile's keys in increasing position, lane l owning columns
 * l, l + 32, ... of the head. Query head h reads kv head h / (H / Hkv) (GQA); key j is visible to
 * query i iff 0 <= i - j < window (window 0: all j <= i). Keys are found through the layout
 * (kv_rows: table NULL; kv_paged: the block table), which changes where they are read, never the
 * arithmetic. Splitting a row over 8 warps keeps 8 tiles' loads in flight: a decode step has one
 * row per head, and one warp walking 1024 keys alone took 0.58 ms (H200, 1.1B shape). */
/* out, q (Tq, H*Dh); k, v: the keys / values through table (NULL: rows) at block, row, head (KVLayout);
 * seq, pos (Tq) or NULL: a batch's rows, each with its own table (tables + seq * stride) and position */
__global__ void __launch_bounds__(ATT_SPLIT *WARP)
attention_kernel(float *out, const float *q, const float *k, const float *v, const int *table, int block, size_t row,
                 size_t head, int q_pos0, int H, int Hkv, int Dh, int window, float scale, int vec4, const int *seq,
                 const int *pos, int stride) {
    __shared__ float qs[ATT_MAX_DH];
    __shared__ float part_m[ATT_SPLIT], part_l[ATT_SPLIT], part_acc[ATT_SPLIT][ATT_MAX_DH];
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    int t = blockIdx.x / H, h = blockIdx.x % H, hk = h / (H / Hkv), i = q_pos0 + t;
    if (seq) {   /* a batch of sequences (cuda_attention_batch): this row's own table and position */
        table += (size_t)seq[t] * stride;
        i = pos[t];
    }
    int j0 = (window > 0 && i - window + 1 > 0) ? i - window + 1 : 0;
    size_t kvd = (size_t)Hkv * Dh, qd = (size_t)H * Dh;
    const float *qi = q + (size_t)t * qd + (size_t)h * Dh;   /* (Dh) */
    for (int d = threadIdx.x; d < Dh; d += blockDim.x) qs[d] = qi[d];
    __syncthreads();
    float acc[ATT_PER_LANE], m, l;
    attention_row_dev(qs, k, v, table, block, row, head, kvd, hk, j0, i, Dh, scale, warp, ATT_SPLIT, vec4, acc, &m, &l);
#pragma unroll
    for (int c = 0; c < ATT_PER_LANE; c++) {
        int d = lane + c * WARP;
        if (d < Dh) part_acc[warp][d] = acc[c];
    }
    if (lane == 0) part_m[warp] = m, part_l[warp] = l;
    __syncthreads();
    if (warp) return;
    float M = -INFINITY, L = 0.0f;
    for (int w = 0; w < ATT_SPLIT; w++) M = fmaxf(M, part_m[w]);
    for (int w = 0; w < ATT_SPLIT; w++) L += part_l[w] * expf(part_m[w] - M);   /* a warp without tiles: 0 * 0 */
    float *oi = out + (size_t)t * qd + (size_t)h * Dh;
#pragma unroll
    for (int c = 0; c < ATT_PER_LANE; c++) {
        int d = lane + c * WARP;
        if (d >= Dh) continue;
        float o = 0.0f;
        for (int w = 0; w < ATT_SPLIT; w++) o += part_acc[w][d] * expf(part_m[w] - M);
        oi[d] = o / L;
    }
}

extern "C" void cuda_attention(float *out, const float *q, const float *k, const float *v, const KVLayout *kv, int Tq,
                               int q_pos0, int H, int Hkv, int Dh, int window, float *scratch) {
    (void)scratch;
    if (Tq == 0 || H == 0) return;
    if (Dh > ATT_MAX_DH) backend_fatal("internal error: cuda_attention supports head_dim <= %d (got %d)", ATT_MAX_DH, Dh);
    int vec4 = Dh % 4 == 0 && (uintptr_t)k % 16 == 0 && kv->row % 4 == 0 && kv->head % 4 == 0;
    attention_kernel<<<(unsigned)Tq * H, ATT_SPLIT * WARP>>>(out, q, k, v, kv->table, kv->block, kv->row, kv->head,
                                                             q_pos0, H, Hkv, Dh, window, 1.0f / sqrtf((float)Dh), vec4,
                                                             NULL, NULL, 0);
    CUDA_CHECK_LAUNCH();
}

/* every row of a batch of sequences in one launch: the kernel above, each row's table and position
 * from the batch (the same arithmetic: a row's bits do not depend on how it was launched) */
extern "C" void cuda_attention_batch(float *out, const float *q, const void *kcv, const void *vcv, const PagedBatch *pb,
                                     int H, int Hkv, int Dh, int window, float *scratch, size_t scratch_stride) {
    (void)scratch, (void)scratch_stride;
    if (pb->N == 0 || H == 0) return;
    if (pb->kv_dtype != DTYPE_F32) backend_fatal("internal error: the cuda KV cache is fp32 (--kv-dtype is refused on cuda)");
    const float *kc = (const float *)kcv, *vc = (const float *)vcv;
    if (Dh > ATT_MAX_DH) backend_fatal("internal error: cuda_attention supports head_dim <= %d (got %d)", ATT_MAX_DH, Dh);
    KVLayout kv = kv_paged(pb->tables, pb->block, Dh);
    int vec4 = Dh % 4 == 0 && (uintptr_t)kc % 16 == 0;
    attention_kernel<<<(unsigned)pb->N * H, ATT_SPLIT * WARP>>>(out, q, kc, vc, pb->tables, pb->block, kv.row, kv.head, 0,
                                                                H, Hkv, Dh, window, 1.0f / sqrtf((float)Dh), vec4,
                                                                pb->seq, pb->pos, pb->table_stride);
    CUDA_CHECK_LAUNCH();
}

/* ---- elementwise ------------------------------------------------------------------------------ */
__global__ void swiglu_kernel(float *out, const float *gate, const float *up, size_t n) {
    GRID_STRIDE(i, n) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}
extern "C" void cuda_swiglu(float *out, const float *gate, const float *up, size_t n) {
    if (n == 0) return;
    swiglu_kernel<<<blocks_for(n), THREADS>>>(out, gate, up, n);
    CUDA_CHECK_LAUNCH();
}

__global__ void add_kernel(float *out, const float *a, const float *b, size_t n) {
    GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}
extern "C" void cuda_add_to(float *out, const float *a, const float *b, size_t n) {
    if (n == 0) return;
    add_kernel<<<blocks_for(n), THREADS>>>(out, a, b, n);
    CUDA_CHECK_LAUNCH();
}

__global__ void scale_kernel(float *x, float s, size_t n) {
    GRID_STRIDE(i, n) x[i] *= s;
}
__global__ void dropout_kernel(float *out, const float *x, int N, int cols, int col0, int cols_global, float p,
                               uint64_t key) {
    float k = 1.0f / (1.0f - p);
    GRID_STRIDE(e, (size_t)N * cols) {
        size_t n = e / cols, j = e % cols;
        uint64_t z = key + ((uint64_t)n * cols_global + col0 + j + 1) * 0x9E3779B97F4A7C15ull;   /* dropout_keep */
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        out[e] = (float)(z >> 40) * 0x1.0p-24f >= p ? x[e] * k : 0.0f;
    }
}
extern "C" void cuda_dropout(float *out, const float *x, int N, int cols, int col0, int cols_global, float p,
                             uint64_t key) {
    if ((size_t)N * cols == 0) return;
    dropout_kernel<<<blocks_for((size_t)N * cols), THREADS>>>(out, x, N, cols, col0, cols_global, p, key);
    CUDA_CHECK_LAUNCH();
}
extern "C" void cuda_scale(float *x, float s, size_t n) {
    if (n == 0) return;
    scale_kernel<<<blocks_for(n), THREADS>>>(x, s, n);
    CUDA_CHECK_LAUNCH();
}

extern "C" void cuda_copy(float *dst, const float *src, size_t n) {
    if (n == 0 || dst == src) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, sizeof(float) * n, cudaMemcpyDeviceToDevice));
}

__global__ void gather_rows_kernel(float *out, const float *x, const int *rows, int R, int D) {
    GRID_STRIDE(e, (size_t)R * D) out[e] = x[(size_t)rows[e / D] * D + e % D];
}
extern "C" void cuda_gather_rows(float *out, const float *x, const int *rows, int R, int D) {
    if (R == 0 || D == 0) return;
    gather_rows_kernel<<<blocks_for((size_t)R * D), THREADS>>>(out, x, rows, R, D);
    CUDA_CHECK_LAUNCH();
}

__global__ void embedding_kernel(float *out, const void *table, DType wt, const int *ids, int N, int D, int v0,
                                 int V_local) {
    GRID_STRIDE(e, (size_t)N * D) {
        int r = ids[e / D] - v0;
        out[e] = (r < 0 || r >= V_local) ? 0.0f : weight_at_dev(table, wt, (size_t)r * D + e % D);
    }
}
extern "C" void cuda_embedding(float *out, const void *table, DType wt, const int *ids, int N, int D, int v0,
                               int V_local) {
    if (N == 0 || D == 0) return;
    embedding_kernel<<<blocks_for((size_t)N * D), THREADS>>>(out, table, wt, ids, N, D, v0, V_local);
    CUDA_CHECK_LAUNCH();
}
