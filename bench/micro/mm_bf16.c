/* mm_bf16.c — cpu_matmul on bf16 weights, --cpu-bf16-dot exact vs native, 6 alternating rounds of 3 calls,
 * best of each (best, not median: on a shared VM other jobs only ever slow a round down).
 * Not part of the build (the Makefile compiles bench/ but not bench/micro/). Build and run from the repository root:
 *   gcc -O2 -march=native -fopenmp -I. -Ibuild/gen bench/micro/mm_bf16.c build/libtandem.a -o build/mm_bf16 -lm \
 *       -L/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas && build/mm_bf16 N K O THREADS */
#include "kernels/cpu/cpu.h"
#include <stdio.h>
#include <stdlib.h>
#include <omp.h>
int main(int argc, char **argv) {
    int N = atoi(argv[1]), K = atoi(argv[2]), O = atoi(argv[3]), th = atoi(argv[4]);
    cpu_set_threads(th);
    float *x = malloc(4ul * N * K), *y = malloc(4ul * N * O);
    unsigned short *w = malloc(2ul * O * K);
    for (long i = 0; i < (long)N * K; i++) x[i] = bf16_to_f32(f32_to_bf16((i % 17) * 0.01f));
    for (long i = 0; i < (long)O * K; i++) w[i] = f32_to_bf16((i % 13) * 0.01f);
    double best[2] = {1e9, 1e9};
    for (int round = 0; round < 6; round++)
        for (int nat = 0; nat < 2; nat++) {
            cpu_set_bf16_dot(nat);
            double t0 = omp_get_wtime();
            int reps = 3;
            for (int r = 0; r < reps; r++) cpu_matmul(y, x, w, NULL, DTYPE_BF16, N, K, O, 1);
            double t = (omp_get_wtime() - t0) / reps;
            if (t < best[nat]) best[nat] = t;
        }
    printf("N=%d K=%d O=%d th=%d: exact %.1f GFLOP/s, native %.1f GFLOP/s (best of 6 alternating)\n", N, K, O, th,
           2.0 * N * K * O / best[0] / 1e9, 2.0 * N * K * O / best[1] / 1e9);
}
