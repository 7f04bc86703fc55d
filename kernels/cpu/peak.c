/* peak.c — the machine's fp32 multiply-add throughput: what no kernel can beat, the yardstick
 * `bench --generate` holds batched decode against (every weight costs one multiply-add per token,
 * so tokens/s <= peak / (2 x weights)). Here because only KERNEL_FLAGS make `a * m + b` one FMA;
 * the bench times it. */
#include "kernels/kernels.h"
#include "kernels/cpu/vec.h"

/* Twelve independent 16-lane FMA chains per thread (enough to cover the FMA latency on current
 * x86 cores), no loads; the empty asm keeps them in registers. */
float cpu_fma_chains(long iters) {
    float sink = 0;
#pragma omp parallel reduction(+ : sink)
    {
        v16 m, b;
        for (int i = 0; i < 16; i++) m[i] = 0.999f, b[i] = 1e-6f;
        v16 a0 = m, a1 = m * 2, a2 = m * 3, a3 = m * 4, a4 = m * 5, a5 = m * 6;
        v16 a6 = m * 7, a7 = m * 8, a8 = m * 9, a9 = m * 10, a10 = m * 11, a11 = m * 12;
        for (long i = 0; i < iters; i++) {
            a0 = a0 * m + b; a1 = a1 * m + b; a2 = a2 * m + b; a3 = a3 * m + b;
            a4 = a4 * m + b; a5 = a5 * m + b; a6 = a6 * m + b; a7 = a7 * m + b;
            a8 = a8 * m + b; a9 = a9 * m + b; a10 = a10 * m + b; a11 = a11 * m + b;
            __asm__("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7),
                    "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));
        }
        v16 s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
        sink += s[0];
    }
    return sink;
}
