/* vocab.cu — the CUDA kernels over a logits row of the vocabulary (cpu_ twins in kernels/cpu/vocab.c):
 * masking the padded columns, and the row reductions of the logprob path (the first maximum, the
 * row max, the leaves' sums of exp and of the entropy term, target logits, the log-softmax's last
 * steps), one block per row by the fixed block tree: batch-invariant as ops.cu says. Owns no memory
 * and does no communication. */
#include "kernels/cuda/common.cuh"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

__global__ void mask_cols_kernel(float *x, int N, int V, int from) {
    int w = V - from;
    GRID_STRIDE(e, (size_t)N * w) x[(e / w) * V + from + e % w] = -INFINITY;
}
extern "C" void cuda_mask_cols(float *x, int N, int V, int from) {
    if (from < 0) from = 0;
    if (N == 0 || from >= V) return;
    mask_cols_kernel<<<blocks_for((size_t)N * (V - from)), THREADS>>>(x, N, V, from);
    CUDA_CHECK_LAUNCH();
}

/* ---- row reductions of the logprob path: one block per row, the fixed block tree --------------- */

/* The first maximum (a strict >: NaN never wins; among equals the lowest index); a row with no value
 * above -inf: its first -inf, else 0 (cpu_argmax). */
__global__ void argmax_kernel(int *ids, float *vals, const float *x, int V, int v0) {
    __shared__ float sv[THREADS];
    __shared__ int si[THREADS];
    const float *row = x + (size_t)blockIdx.x * V;
    float best = -INFINITY;
    int at = -1, first_inf = -1;
    for (int c = threadIdx.x; c < V; c += blockDim.x) {
        float xc = row[c];
        if (xc > best) best = xc, at = c;
        if (xc == -INFINITY && first_inf < 0) first_inf = c;
    }
    sv[threadIdx.x] = best;
    si[threadIdx.x] = at >= 0 ? at : (first_inf >= 0 ? V + first_inf : 2 * V);   /* ranks: found, -inf, none */
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s /= 2) {
        if (threadIdx.x < s) {
            int o = threadIdx.x + s;
            float a = sv[threadIdx.x], b = sv[o];
            int ia = si[threadIdx.x], ib = si[o];
            int a_found = ia < V, b_found = ib < V;
            int take_b = b_found && (!a_found || b > a || (b == a && ib < ia));
            if (!a_found && !b_found) take_b = ib < ia;
            if (take_b) sv[threadIdx.x] = b, si[threadIdx.x] = ib;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        int c = si[0] < V ? si[0] : si[0] < 2 * V ? si[0] - V : 0;
        ids[blockIdx.x] = v0 + c;
        vals[blockIdx.x] = row[c];
    }
}
extern "C" void cuda_argmax_rows(int *ids, float *vals, const float *x, int N, int V, int v0) {
    if (N == 0) return;
    argmax_kernel<<<N, THREADS>>>(ids, vals, x, V, v0);
    CUDA_CHECK_LAUNCH();
}

__global__ void row_max_kernel(float *mx, const float *x, int V, float T) {
    __shared__ float sh[THREADS / WARP];
    const float *row = x + (size_t)blockIdx.x * V;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < V; c += blockDim.x) m = row[c] > m ? row[c] : m;   /* NaN ignored */
    m = warp_max(m);
    if (threadIdx.x % WARP == 0) sh[threadIdx.x / WARP] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < THREADS / WARP; w++) m = fmaxf(m, sh[w]);
        mx[blockIdx.x] = fmaxf(sh[0], m) / T;
    }
}
extern "C" void cuda_row_max(float *mx, const float *x, int N, int V, float T) {
    if (N == 0) return;
    row_max_kernel<<<N, THREADS>>>(mx, x, V, T);
    CUDA_CHECK_LAUNCH();
}

/* Row sums over V columns in `leaves` runs of ceil(V / leaves) (kernels.h), each in double and
 * rounded once, added by tree_sum's pairwise tree: of exp(x / T - mx) (entropy 0), or of
 * exp(x / T - mx) * x / T (entropy 1, mx = lse: the entropy's sum of p z) */
__global__ void row_sums_kernel(float *sum, const float *x, const float *mx, int V, float T, int leaves, int entropy) {
    __shared__ double sh[THREADS / WARP];
    const float *row = x + (size_t)blockIdx.x * V;
    float m = mx[blockIdx.x], stack[7];   /* leaves <= 64: at most 7 partial sums pending */
    int w = (V + leaves - 1) / leaves, top = 0;
    for (int l = 0; l < leaves; l++) {
        int lo = l * w < V ? l * w : V, hi = lo + w < V ? lo + w : V;
        double acc = 0.0;
        for (int c = lo + threadIdx.x; c < hi; c += blockDim.x) {
            float z = row[c] / T;
            float p = expf(z - m);
            acc += entropy ? (p == 0.0f ? 0.0 : (double)p * z) : (double)p;   /* -inf (padded): 0, not 0 * inf */
        }
        float v = (float)block_sum(acc, sh);
        for (int k = l + 1; k % 2 == 0; k /= 2) v = stack[--top] + v;   /* (left subtree) + (this one) */
        stack[top++] = v;
    }
    if (threadIdx.x == 0) sum[blockIdx.x] = stack[0];
}
static void row_sums(float *sum, const float *x, const float *mx, int N, int V, float T, int leaves, int entropy) {
    if (N == 0) return;
    if (leaves < 1 || leaves > 64) {
        fprintf(stderr, "cuda_row_sums: %d leaves (1 to 64)\n", leaves);
        abort();
    }
    row_sums_kernel<<<N, THREADS>>>(sum, x, mx, V, T, leaves, entropy);
    CUDA_CHECK_LAUNCH();
}
extern "C" void cuda_row_sumexp(float *sum, const float *x, const float *mx, int N, int V, float T, int leaves) {
    row_sums(sum, x, mx, N, V, T, leaves, 0);
}
extern "C" void cuda_row_entropy_part(float *s, const float *x, const float *lse, int N, int V, float T, int leaves) {
    row_sums(s, x, lse, N, V, T, leaves, 1);
}

__global__ void pick_logits_kernel(float *z, const float *x, const int *targets, int N, int V, int v0, float T) {
    GRID_STRIDE(n, (size_t)N) {
        int r = targets[n] - v0;
        z[n] = (targets[n] >= 0 && r >= 0 && r < V) ? x[n * V + r] / T : 0.0f;
    }
}
extern "C" void cuda_pick_logits(float *z, const float *x, const int *targets, int N, int V, int v0, float T) {
    if (N == 0) return;
    pick_logits_kernel<<<blocks_for(N), THREADS>>>(z, x, targets, N, V, v0, T);
    CUDA_CHECK_LAUNCH();
}

__global__ void log_add_kernel(float *lse, const float *sum, int N) {
    GRID_STRIDE(n, (size_t)N) lse[n] += logf(sum[n]);
}
extern "C" void cuda_log_add(float *lse, const float *sum, int N) {
    if (N == 0) return;
    log_add_kernel<<<blocks_for(N), THREADS>>>(lse, sum, N);
    CUDA_CHECK_LAUNCH();
}

__global__ void sub_at_kernel(float *out, const float *a, const float *b, const int *idx, int n) {
    GRID_STRIDE(i, (size_t)n) out[i] = a[i] - b[idx ? idx[i] : i];
}
extern "C" void cuda_sub_at(float *out, const float *a, const float *b, const int *idx, int n) {
    if (n == 0) return;
    sub_at_kernel<<<blocks_for(n), THREADS>>>(out, a, b, idx, n);
    CUDA_CHECK_LAUNCH();
}
