/* backward.c — CPU backward kernels for training (declared and derived in kernels/cpu/backward.h).
 * Each mirrors its forward in ops.c: the same fp32 arithmetic where a forward quantity is
 * recomputed (RMS scale, RoPE angles, attention probabilities), so the gradient is the gradient of
 * exactly the function the forward computes. Parameter gradients accumulate, activation gradients
 * are written. Owns no memory and does no communication; not batch-invariant (does not need to be). */
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/attention_row.h"
#include "kernels/cpu/vec.h"
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Both products run as fixed 128-row tiles, one single-threaded sgemm each (OpenBLAS does not thread
 * inside an OpenMP region), spread over the threads: an element's arithmetic depends on its tile's
 * shape only, never on the thread count. OpenBLAS's own threading rounds differently at 1 and 2
 * threads (16 of 18 training shapes tried); the tiles cost 0-6% of a 15M training step (README). */
enum { BW_TILE = 128 };

/* dx (N, n_in) = dout (N, n_out) @ w (n_out, n_in), w fp32, in fixed 128-row tiles of dx; beta 1
 * adds into dx (a later block of w's rows) */
static void dx_tiles(float *dx, const float *dout, int ld_dout, const float *w, int N, int n_in, int n_out, float beta) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < N; r += BW_TILE) {
        int m = N - r < BW_TILE ? N - r : BW_TILE;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n_in, n_out, 1.0f, dout + (size_t)r * ld_dout,
                    ld_dout, w, n_in, beta, dx + (size_t)r * n_in, n_in);
    }
}

void cpu_matmul_backward(float *dx, float *dw, float *db, const float *dout, const float *x, const void *w, DType wt,
                         int N, int n_in, int n_out) {
    if (N == 0) return;                                  /* nothing to write, nothing to add */
    if (dx && n_out == 0) memset(dx, 0, sizeof(float) * (size_t)N * n_in);
    else if (dx && wt == DTYPE_F32) dx_tiles(dx, dout, n_out, w, N, n_in, n_out, 0.0f);
    else if (dx) {
        /* BF16: w's exact upcast, W_ROWS rows at a time (never a full fp32 copy of an lm_head):
         * dx = sum over the blocks of dout[:, block] @ w[block], added in block order */
        enum { W_ROWS = 512 };
        int rows = n_out < W_ROWS ? n_out : W_ROWS;
        float *wf = malloc(sizeof(float) * (size_t)rows * n_in);
        if (!wf) { fprintf(stderr, "cpu_matmul_backward: out of memory for a %d x %d block\n", rows, n_in); abort(); }
        for (int o = 0; o < n_out; o += W_ROWS) {
            int m = n_out - o < W_ROWS ? n_out - o : W_ROWS;
            size_t n = (size_t)m * n_in;
#pragma omp parallel for schedule(static) if (n > 65536)
            for (size_t i = 0; i < n; i++) wf[i] = weight_at(w, wt, (size_t)o * n_in + i);
            dx_tiles(dx, dout + o, n_out, wf, N, n_in, m, o ? 1.0f : 0.0f);
        }
        free(wf);
    }
    /* dw (n_out, n_in) += dout^T (n_out, N) @ x (N, n_in), in tiles of dw's rows; NULL: a frozen weight */
    int n_dw = dw ? n_out : 0;
#pragma omp parallel for schedule(static)
    for (int o = 0; o < n_dw; o += BW_TILE) {
        int m = n_out - o < BW_TILE ? n_out - o : BW_TILE;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, n_in, N, 1.0f, dout + o, n_out, x, n_in, 1.0f,
                    dw + (size_t)o * n_in, n_in);
    }
    if (db)
        for (int n = 0; n < N; n++) {
            const float *g = dout + (size_t)n * n_out;
            for (int o = 0; o < n_out; o++) db[o] += g[o];
        }
}

void cpu_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const void *w, DType wt, int N,
                          int D, float eps) {
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * D, *g = dout + (size_t)n * D;
        float *o = dx + (size_t)n * D;
        float ss = dot_fixed(xr, xr, D);                 /* the forward's scale, the forward's way */
        float r = 1.0f / sqrtf(ss / D + eps);
        float dot = 0.0f;                                /* sum_i (dout * w)_i * xh_i */
        for (int i = 0; i < D; i++) dot += g[i] * weight_at(w, wt, i) * (xr[i] * r);
        float c = dot / D;
        for (int i = 0; i < D; i++) {                    /* reads g[i] before writing o[i]: dx may alias dout */
            float xh = xr[i] * r, gi = g[i];
            if (dw) dw[i] += gi * xh;   /* NULL: a frozen weight */
            o[i] = r * (gi * weight_at(w, wt, i) - xh * c);
        }
    }
}

void cpu_rope_backward(float *dx, const float *cs, int N, int n_heads, int Dh) { rope_rotate(dx, cs, N, n_heads, Dh, -1.0f); }

void cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                            const float *v, int T, int H, int Hkv, int Dh, int window, float *scratch) {
    int group = H / Hkv;
    float scale = 1.0f / sqrtf((float)Dh);
    size_t qs = (size_t)H * Dh, ks = (size_t)Hkv * Dh;
    KVLayout rows = kv_rows(T, Hkv, Dh);
    /* one kv head per iteration: it alone writes its dk, dv columns and its query heads' dq columns */
#pragma omp parallel for schedule(static) if (Hkv > 1 && (size_t)H * T * T > 4096)
    for (int hk = 0; hk < Hkv; hk++) {
        float *p = scratch + (size_t)omp_get_thread_num() * 2 * T, *dp = p + T;   /* this thread's rows */
        for (int j = 0; j < T; j++) {
            memset(dk + j * ks + (size_t)hk * Dh, 0, sizeof(float) * Dh);
            memset(dv + j * ks + (size_t)hk * Dh, 0, sizeof(float) * Dh);
        }
        for (int h = hk * group; h < (hk + 1) * group; h++) {
            for (int i = 0; i < T; i++) {
                const float *qi = q + i * qs + (size_t)h * Dh, *gi = dout + i * qs + (size_t)h * Dh;
                int j0 = (window > 0 && i - window + 1 > 0) ? i - window + 1 : 0;
                /* probabilities exactly as cpu_attention computes them */
                float sum = attention_row_exp(qi, k, &rows, Hkv, hk, j0, i, Dh, scale, p);
                /* dp_j = dout_i . v_j; their p-weighted mean is dout_i . o_i */
                float pdp = 0.0f;
                for (int j = j0; j <= i; j++) {
                    p[j] = p[j] / sum;
                    const float *vj = v + j * ks + (size_t)hk * Dh;
                    float s = dot_fixed(gi, vj, Dh);
                    dp[j] = s;
                    pdp += p[j] * s;
                }
                float *dqi = dq + i * qs + (size_t)h * Dh;
                memset(dqi, 0, sizeof(float) * Dh);
                for (int j = j0; j <= i; j++) {
                    const float *kj = k + j * ks + (size_t)hk * Dh;
                    float *dkj = dk + j * ks + (size_t)hk * Dh, *dvj = dv + j * ks + (size_t)hk * Dh;
                    float ds = p[j] * (dp[j] - pdp) * scale;   /* softmax backward, then the 1/sqrt(Dh) */
#pragma omp simd
                    for (int d = 0; d < Dh; d++) {   /* independent per d: vectorised, same bits */
                        dqi[d] += ds * kj[d];
                        dkj[d] += ds * qi[d];
                        dvj[d] += p[j] * gi[d];
                    }
                }
            }
        }
    }
}

/* the forward's exp16 for m <= 16 elements */
static inline __attribute__((always_inline)) void swiglu_backward_lanes(float *dgate, float *dup, const float *dout,
                                                                        const float *gate, const float *up, size_t m) {
    v16 g = ld16n(gate, m), u = ld16n(up, m), d = ld16n(dout, m);
    v16 sig = 1.0f / (1.0f + exp16(-g));                 /* exp16 overflow -> sig 0, both terms finite */
    st16n(dgate, d * u * sig * (1.0f + g * (1.0f - sig)), m);
    st16n(dup, d * (g * sig), m);
}

void cpu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n) {
    size_t n16 = n / 16 * 16;
    for (size_t i = 0; i < n16; i += 16) swiglu_backward_lanes(dgate + i, dup + i, dout + i, gate + i, up + i, 16);
    if (n16 < n) swiglu_backward_lanes(dgate + n16, dup + n16, dout + n16, gate + n16, up + n16, n - n16);
}

void cpu_embedding_backward(float *dtable, const float *dout, const int *ids, int N, int D, int v0, int V_local) {
    for (int n = 0; n < N; n++) {
        int r = ids[n] - v0;
        if (r < 0 || r >= V_local) continue;             /* another rank's row */
        float *t = dtable + (size_t)r * D;
        const float *g = dout + (size_t)n * D;
        for (int i = 0; i < D; i++) t[i] += g[i];
    }
}

void cpu_logprob_backward(float *dlogits, const float *logits, const float *lse, const int *targets,
                          const float *dlogprob, const float *H, const float *dH, int N, int V_local, int v0, float T) {
#pragma omp parallel for schedule(static) if (N > 1 && (size_t)N * V_local > 65536)
    for (int n = 0; n < N; n++) {
        float *g = dlogits + (size_t)n * V_local;
        const float *row = logits + (size_t)n * V_local;
        if (targets[n] < 0) {                            /* no logprob here: no gradient */
            memset(g, 0, sizeof(float) * V_local);
            continue;
        }
        float gn = -dlogprob[n] / T, l = lse[n];
        int r = targets[n] - v0, owned = r >= 0 && r < V_local;
        float zt = owned ? row[r] : 0.0f;                /* read before g may overwrite it (in place) */
        if (!dH || dH[n] == 0.0f) {
            for (int c = 0; c < V_local; c++) g[c] = gn * expf(row[c] / T - l);
            if (owned) g[r] = gn * (expf(zt / T - l) - 1.0f); /* p - 1, not p*g - g */
            continue;
        }
        float ge = -dH[n] / T, h = H[n];                  /* with the entropy's term: one pass (in place) */
        for (int c = 0; c < V_local; c++) {
            float z = row[c] / T, pc = expf(z - l);
            g[c] = pc == 0.0f ? gn * pc : gn * pc + ge * pc * (z - l + h);   /* a -inf (padded) logit: 0, not 0 * inf */
        }
        if (owned) {
            float z = zt / T, pt = expf(z - l);
            g[r] = gn * (pt - 1.0f) + ge * pt * (z - l + h);
        }
    }
}
