/* cuda_vs_cpu.c — the CPU kernels are the oracle for the CUDA ones (STYLE.md 8): cuda_matmul and
 * cuda_rmsnorm against cpu_matmul and cpu_rmsnorm on seeded random inputs of several shapes, odd sizes
 * included. Prints the max abs / rel difference per case.
 * Exit: 0 all cases pass, 1 some case fails, 77 "SKIP: no CUDA device" (bats and automake read 77 as
 * skip). Does not test speed. Built by `make cuda`, run by tests/cuda.bats. */
#include "kernels/cpu/cpu.h"
#include "kernels/cuda/cuda.h"
#include "runtime/util.h"
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Tolerance. Both sides compute in fp32; they differ only in the order of summation (the CPU
 * kernel's fixed 16-lane order vs cuBLAS tiling / split-K; one serial loop vs a tree of warp
 * shuffles). Measured against the sum of the terms' magnitudes, a reordered fp32 sum typically moves
 * by about 2^-24 (~1e-7) whatever K is; the worst case grows like K * 2^-24. Each output is compared
 * relative to the magnitude of what produced it:
 *   matmul:  |gpu - cpu| <= 1e-5 * (sum_k |x[n,k] * w[j,k]| + |bias[j]|)
 *   rmsnorm: |gpu - cpu| <= 1e-5 * max_i |cpu[n,i]|   (the row's magnitude)
 * Wrong indexing, a missed transpose or a lost bias miss this by orders of magnitude. TF32 inputs
 * (error ~5e-4 / sqrt(K) on this measure) are caught at small K but only by 1.5-3x at K = 4096 and
 * 11008. Never run on a GPU yet: the first run should print its max relative difference and, if
 * it is ~1e-7 as expected, tighten REL_TOL to ~1e-6. */
#define REL_TOL 1e-5

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float rand_uniform(void) { /* xorshift64*, uniform in [-1, 1) */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (float)((rng_state * 0x2545F4914F6CDD1Dull) >> 40) / (float)(1 << 24) * 2.0f - 1.0f;
}
static float *rand_array(size_t n, float amp) {
    float *a = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) a[i] = amp * rand_uniform();
    return a;
}
static float *to_device(const float *h, size_t n) {
    float *d = cuda_alloc(n * sizeof(float));
    cuda_to_device(d, h, n * sizeof(float));
    return d;
}

/* Returns 1 on pass. */
static int check_matmul(int N, int n_in, int n_out, int with_bias) {
    size_t nx = (size_t)N * n_in, nw = (size_t)n_out * n_in, no = (size_t)N * n_out;
    float *x = rand_array(nx, 1.0f);                            /* (N, n_in) */
    float *w = rand_array(nw, 1.0f);                            /* (n_out, n_in) */
    float *bias = with_bias ? rand_array(n_out, 1.0f) : NULL;   /* (n_out) */
    float *ref = xmalloc(no * sizeof(float));                   /* (N, n_out) */
    float *got = xmalloc(no * sizeof(float));                   /* (N, n_out) */
    cpu_matmul(ref, x, w, bias, DTYPE_F32, N, n_in, n_out);

    float *dx = to_device(x, nx), *dw = to_device(w, nw), *db = bias ? to_device(bias, n_out) : NULL;
    float *dout = cuda_alloc(no * sizeof(float));
    cuda_matmul(dout, dx, dw, db, N, n_in, n_out, NULL);
    cuda_sync();
    cuda_to_host(got, dout, no * sizeof(float));

    double max_abs = 0.0, max_rel = 0.0;
    for (int n = 0; n < N; n++) {
        for (int j = 0; j < n_out; j++) {
            double mag = bias ? fabs(bias[j]) : 0.0;
            const float *xr = x + (size_t)n * n_in, *wr = w + (size_t)j * n_in;
            for (int k = 0; k < n_in; k++) mag += fabs((double)xr[k] * wr[k]);
            double d = fabs((double)got[(size_t)n * n_out + j] - ref[(size_t)n * n_out + j]);
            double rel = mag > 0.0 ? d / mag : (d > 0.0 ? INFINITY : 0.0);
            if (!(d <= max_abs)) max_abs = d; /* NaN-aware: a NaN difference sticks */
            if (!(rel <= max_rel)) max_rel = rel;
        }
    }
    int ok = max_rel <= REL_TOL;
    printf("%s matmul  N=%-3d n_in=%-5d n_out=%-5d bias=%d  max abs diff %.3e  max rel diff %.3e\n",
           ok ? "ok  " : "FAIL", N, n_in, n_out, with_bias, max_abs, max_rel);

    cuda_free(dout);
    cuda_free(db);
    cuda_free(dw);
    cuda_free(dx);
    free(got);
    free(ref);
    free(bias);
    free(w);
    free(x);
    return ok;
}

/* amp scales x; row 0 is all zeros when zero_row (exercises eps: output must be exactly 0). */
static int check_rmsnorm(int N, int D, float eps, float amp, int zero_row) {
    size_t n = (size_t)N * D;
    float *x = rand_array(n, amp);             /* (N, D) */
    float *w = rand_array(D, 1.0f);            /* (D) */
    float *ref = xmalloc(n * sizeof(float));   /* (N, D) */
    float *got = xmalloc(n * sizeof(float));   /* (N, D) */
    if (zero_row)
        for (int i = 0; i < D; i++) x[i] = 0.0f;
    cpu_rmsnorm(ref, x, w, DTYPE_F32, N, D, eps);

    float *dx = to_device(x, n), *dw = to_device(w, D), *dout = cuda_alloc(n * sizeof(float));
    cuda_rmsnorm(dout, dx, dw, N, D, eps, NULL);
    cuda_sync();
    cuda_to_host(got, dout, n * sizeof(float));

    double max_abs = 0.0, max_rel = 0.0;
    for (int r = 0; r < N; r++) {
        double mag = 0.0;
        for (int i = 0; i < D; i++) mag = fmax(mag, fabs(ref[(size_t)r * D + i]));
        for (int i = 0; i < D; i++) {
            double d = fabs((double)got[(size_t)r * D + i] - ref[(size_t)r * D + i]);
            double rel = mag > 0.0 ? d / mag : (d > 0.0 ? INFINITY : 0.0);
            if (!(d <= max_abs)) max_abs = d;
            if (!(rel <= max_rel)) max_rel = rel;
        }
    }
    int ok = max_rel <= REL_TOL;
    printf("%s rmsnorm N=%-3d D=%-5d eps=%.0e amp=%-6g zero_row=%d  max abs diff %.3e  max rel diff %.3e\n",
           ok ? "ok  " : "FAIL", N, D, (double)eps, (double)amp, zero_row, max_abs, max_rel);

    cuda_free(dout);
    cuda_free(dw);
    cuda_free(dx);
    free(got);
    free(ref);
    free(w);
    free(x);
    return ok;
}

int main(void) {
    if (!cuda_available()) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    int failed = 0;
    /* Shapes: trivial, odd sizes that fit no tile, a decode-like single row, LLaMA-like widths, and a
     * long reduction (n_in = 11008, the 7B MLP width) where summation order matters most. */
    static const int mm[][3] = {{1, 1, 1},       {7, 33, 65},     {1, 4096, 4096}, {16, 256, 512},
                                {33, 1000, 129}, {64, 4096, 11},  {5, 11008, 64}};
    for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++)
        for (int b = 0; b <= 1; b++) failed += !check_matmul(mm[i][0], mm[i][1], mm[i][2], b);

    /* D below, at and above the block size (256), odd D, zero rows, large and tiny activations. */
    failed += !check_rmsnorm(1, 1, 1e-5f, 1.0f, 0);
    failed += !check_rmsnorm(7, 33, 1e-6f, 1.0f, 1);
    failed += !check_rmsnorm(3, 256, 1e-5f, 1.0f, 0);
    failed += !check_rmsnorm(17, 1000, 1e-6f, 30.0f, 0);
    failed += !check_rmsnorm(9, 4096, 1e-5f, 1e-3f, 1);
    failed += !check_rmsnorm(2, 8193, 1e-6f, 1000.0f, 0);

    if (failed) {
        printf("FAIL: %d case(s) over relative tolerance %.0e\n", failed, REL_TOL);
        return 1;
    }
    printf("PASS: cuda_matmul and cuda_rmsnorm match the CPU oracle\n");
    return 0;
}
