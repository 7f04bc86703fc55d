/* peak.c — the machine's fp32 multiply-add throughput: what no kernel can beat, the yardstick
 * `bench --generate` holds batched decode against (every weight costs one multiply-add per token,
 * so tokens/s <= peak / (2 x weights)). Here because only KERNEL_FLAGS make `a * m + b` one FMA;
 * the bench times it. */
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/vec.h"

/* Twelve independent FMA chains per thread of the widest native vector (16 lanes with AVX-512, 8
 * with AVX2: twelve of them plus the two operands fit the register file either way), enough to
 * cover the FMA latency on current x86 cores, no loads; the empty asm keeps them in registers.
 * Returns the FMAs done per thread and iteration (12 x lanes); *sink keeps the work alive. */
int cpu_fma_chains(long iters, float *sink_out) {
    float sink = 0;
    const int lanes = NAT;
#pragma omp parallel reduction(+ : sink)
    {
        vnat m, b;
        for (int i = 0; i < lanes; i++) m[i] = 0.999f, b[i] = 1e-6f;
        vnat a0 = m, a1 = m * 2, a2 = m * 3, a3 = m * 4, a4 = m * 5, a5 = m * 6;
        vnat a6 = m * 7, a7 = m * 8, a8 = m * 9, a9 = m * 10, a10 = m * 11, a11 = m * 12;
        for (long i = 0; i < iters; i++) {
            a0 = a0 * m + b; a1 = a1 * m + b; a2 = a2 * m + b; a3 = a3 * m + b;
            a4 = a4 * m + b; a5 = a5 * m + b; a6 = a6 * m + b; a7 = a7 * m + b;
            a8 = a8 * m + b; a9 = a9 * m + b; a10 = a10 * m + b; a11 = a11 * m + b;
            __asm__("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7),
                    "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));
        }
        vnat s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
        sink += s[0];
    }
    *sink_out = sink;
    return 12 * lanes;
}
