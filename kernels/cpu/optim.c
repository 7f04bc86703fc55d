/* optim.c — the optimizer's CPU kernels: AdamW's element-wise update (torch.optim.AdamW's fp32
 * arithmetic) and the gradient norm's sum of squares, both on fp32 arrays of the parameter arena's
 * layout. train/optim.c calls them through the Backend table (adamw, sum_squares); the CUDA
 * versions (kernels/cuda/optim.cu) follow the same arithmetic order. tests/test_optim.c checks these
 * against torch.
 * Unlike the other CPU kernels, no multiply-add here may become an FMA unless the source says fmaf:
 * torch's ops round every product (its fmadd / addcmul are the two fmaf below), and the Makefile's
 * KERNEL_FLAGS (-ffp-contract=fast) would fuse p * decay + step into one rounding. The pragma turns
 * contraction off for this file, as plain CFLAGS (ISO C) leave it. */
#pragma GCC optimize("fp-contract=off")
#include "kernels/cpu/cpu.h"
#include <math.h>

void cpu_adamw(float *p, const float *g, float *m, float *v, size_t n, float grad_scale, double lr, double beta1,
               double beta2, double eps, double weight_decay, int t) {
    /* torch's Python-float scalars, each rounded to fp32 once where it meets a tensor */
    const float decay = (float)(1.0 - lr * weight_decay);
    const float b1 = (float)beta1, one_minus_b1 = (float)(1.0 - beta1);
    const float b2 = (float)beta2, one_minus_b2 = (float)(1.0 - beta2);
    const float neg_step_size = (float)(-(lr / (1.0 - pow(beta1, t))));
    const float bc2_sqrt = (float)sqrt(1.0 - pow(beta2, t));
    const float epsf = (float)eps;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * grad_scale;
        float mi = fmaf(gi, one_minus_b1, m[i] * b1);       /* torch's vectorised add: fmadd */
        float vi = fmaf(one_minus_b2 * gi, gi, v[i] * b2);   /* torch's addcmul: fma too */
        float denom = sqrtf(vi) / bc2_sqrt + epsf;           /* eps outside the sqrt */
        p[i] = p[i] * decay + (neg_step_size * mi) / denom;  /* addcdiv: value * t1 / t2 */
        m[i] = mi;
        v[i] = vi;
    }
}

void cpu_sum_squares(double *out, const float *x, size_t n, double *partials) {
    size_t n_chunks = (n + CPU_NORM_CHUNK - 1) / CPU_NORM_CHUNK;
#pragma omp parallel for schedule(static) if (n_chunks > 1)
    for (size_t c = 0; c < n_chunks; c++) {
        size_t lo = c * CPU_NORM_CHUNK, hi = lo + CPU_NORM_CHUNK < n ? lo + CPU_NORM_CHUNK : n;
        double acc[8] = {0};   /* 8 fixed lanes: a fixed order that still pipelines */
        size_t i = lo;
        for (; i + 8 <= hi; i += 8)
            for (int k = 0; k < 8; k++) acc[k] += (double)x[i + k] * (double)x[i + k];
        for (; i < hi; i++) acc[0] += (double)x[i] * (double)x[i];
        partials[c] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    }
    double total = 0.0;
    for (size_t c = 0; c < n_chunks; c++) total += partials[c];
    *out = total;
}
