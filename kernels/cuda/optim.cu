/* optim.cu — the optimizer's CUDA kernels (kernels/cpu/cpu.h's cpu_adamw and cpu_sum_squares
 * contracts on device pointers): AdamW's element-wise update and the gradient norm's sum of squares.
 * Both keep the CPU's arithmetic in the CPU's order, so they give its bits:
 *   adamw: the fp32 scalars are made on the host in double exactly as cpu_adamw makes them (the
 *     same pow and sqrt of the host's libm), and each element runs the CPU's operations: the two
 *     fmaf it spells, every other product, quotient, square root and sum rounded on its own
 *     (__fmul_rn, __fdiv_rn, __fsqrt_rn, __fadd_rn: IEEE round-to-nearest, and never fused by nvcc,
 *     which would otherwise contract p * decay + step into one FMA).
 *   sum_squares: one warp per chunk of CPU_NORM_CHUNK floats; its lanes 0-7 are the CPU's 8
 *     lanes, each adding its elements (lo + k + 8j) in increasing j in double, the tail of the last
 *     chunk into lane 0, then the CPU's tree ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)) into
 *     partials[c]; one thread then adds the chunks in order from 0.0 into *out. A float's square
 *     is exact in double, so fused or not the sums are the CPU's, bit for bit.
 * Cost: each lane's sum is a serial chain of 8192 double adds (the CPU's order; the loads run ahead
 * of it, 32 per lane), about 35 us per call whatever the tensor's size up to a wave of chunks:
 * one call per parameter tensor and step. */
#include "kernels/cuda/common.cuh"
#include <math.h>

__global__ void adamw_kernel(float *p, const float *g, float *m, float *v, size_t n, float grad_scale, float decay,
                             float b1, float one_minus_b1, float b2, float one_minus_b2, float neg_step_size,
                             float bc2_sqrt, float eps) {
    GRID_STRIDE(i, n) {
        float gi = __fmul_rn(g[i], grad_scale);
        float mi = fmaf(gi, one_minus_b1, __fmul_rn(m[i], b1));
        float vi = fmaf(__fmul_rn(one_minus_b2, gi), gi, __fmul_rn(v[i], b2));
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
        p[i] = __fadd_rn(__fmul_rn(p[i], decay), __fdiv_rn(__fmul_rn(neg_step_size, mi), denom));
        m[i] = mi;
        v[i] = vi;
    }
}

extern "C" void cuda_adamw(float *p, const float *g, float *m, float *v, size_t n, float grad_scale, double lr,
                           double beta1, double beta2, double eps, double weight_decay, int t) {
    if (n == 0) return;
    /* cpu_adamw's scalars, line for line */
    const float decay = (float)(1.0 - lr * weight_decay);
    const float b1 = (float)beta1, one_minus_b1 = (float)(1.0 - beta1);
    const float b2 = (float)beta2, one_minus_b2 = (float)(1.0 - beta2);
    const float neg_step_size = (float)(-(lr / (1.0 - pow(beta1, t))));
    const float bc2_sqrt = (float)sqrt(1.0 - pow(beta2, t));
    adamw_kernel<<<blocks_for(n), THREADS>>>(p, g, m, v, n, grad_scale, decay, b1, one_minus_b1, b2, one_minus_b2,
                                             neg_step_size, bc2_sqrt, (float)eps);
    CUDA_CHECK_LAUNCH();
}

constexpr int NORM_CHUNK = 65536, NORM_LANES = 8, NORM_AHEAD = 32, NORM_WARPS = 4;
static_assert(NORM_CHUNK % (NORM_LANES * NORM_AHEAD) == 0, "whole unrolled steps per full chunk");

/* partials[c] = chunk c's sum, one warp per chunk (lanes 8-31 idle: the CPU has 8 lanes) */
__global__ void sum_squares_kernel(double *partials, const float *x, size_t n, size_t n_chunks) {
    size_t c = (size_t)blockIdx.x * NORM_WARPS + threadIdx.x / WARP;
    int k = threadIdx.x % WARP;
    if (c >= n_chunks || k >= NORM_LANES) return;
    size_t lo = c * NORM_CHUNK, hi = lo + NORM_CHUNK < n ? lo + NORM_CHUNK : n, i = lo;
    double acc = 0.0;
    for (; i + NORM_LANES * NORM_AHEAD <= hi; i += NORM_LANES * NORM_AHEAD) {
        float xs[NORM_AHEAD];   /* the loads first, then the adds in order */
#pragma unroll
        for (int u = 0; u < NORM_AHEAD; u++) xs[u] = x[i + (size_t)NORM_LANES * u + k];
#pragma unroll
        for (int u = 0; u < NORM_AHEAD; u++) acc = __dadd_rn(acc, __dmul_rn((double)xs[u], (double)xs[u]));
    }
    for (; i + NORM_LANES <= hi; i += NORM_LANES) acc = __dadd_rn(acc, __dmul_rn((double)x[i + k], (double)x[i + k]));
    if (k == 0)   /* the tail (< 8 elements), in order */
        for (size_t j = i; j < hi; j++) acc = __dadd_rn(acc, __dmul_rn((double)x[j], (double)x[j]));
    double a[NORM_LANES];
#pragma unroll
    for (int l = 0; l < NORM_LANES; l++) a[l] = __shfl_sync(0xffu, acc, l);
    if (k == 0)
        partials[c] = __dadd_rn(__dadd_rn(__dadd_rn(a[0], a[1]), __dadd_rn(a[2], a[3])),
                                __dadd_rn(__dadd_rn(a[4], a[5]), __dadd_rn(a[6], a[7])));
}
/* *out = the chunks' sums added in order from 0.0 */
__global__ void sum_chunks_kernel(double *out, const double *partials, size_t n_chunks) {
    double total = 0.0;
    for (size_t c = 0; c < n_chunks; c++) total = __dadd_rn(total, partials[c]);
    *out = total;
}

extern "C" void cuda_sum_squares(double *out, const float *x, size_t n, double *partials) {
    size_t n_chunks = (n + NORM_CHUNK - 1) / NORM_CHUNK;
    if (n_chunks) {
        sum_squares_kernel<<<(unsigned)((n_chunks + NORM_WARPS - 1) / NORM_WARPS), NORM_WARPS * WARP>>>(partials, x, n,
                                                                                                         n_chunks);
        CUDA_CHECK_LAUNCH();
    }
    sum_chunks_kernel<<<1, 1>>>(out, partials, n_chunks);
    CUDA_CHECK_LAUNCH();
}
