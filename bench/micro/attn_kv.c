/* attn_kv.c — decode attention over the paged cache (cpu_attention_batch), --kv-dtype fp32 vs bf16: S
 * sequences of CTX keys each in their own blocks (110M heads: 12 x 64), 8 alternating rounds of 10 calls,
 * best of each. Not part of the build; as bench/micro/mm_bf16.c:
 *   gcc -O2 -march=native -fopenmp -I. -Ibuild/gen bench/micro/attn_kv.c build/libtandem.a -o build/attn_kv -lm \
 *       -L/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas && build/attn_kv CTX S THREADS */
#include "kernels/cpu/cpu.h"
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    int ctx = atoi(argv[1]), S = atoi(argv[2]), th = atoi(argv[3]), H = 12, Hkv = 12, Dh = 64, B = 16;
    cpu_set_threads(th);
    int nb = (ctx + B - 1) / B;
    size_t kvd = (size_t)Hkv * Dh, pool = (size_t)S * nb * B * kvd;
    float *k = malloc(4 * pool), *v = malloc(4 * pool), *q = malloc(4ul * S * H * Dh), *o = malloc(4ul * S * H * Dh);
    for (size_t i = 0; i < pool; i++) k[i] = bf16_to_f32(f32_to_bf16((i % 31) * 0.01f)), v[i] = bf16_to_f32(f32_to_bf16((i % 17) * 0.01f));
    for (size_t i = 0; i < (size_t)S * H * Dh; i++) q[i] = (i % 7) * 0.1f;
    unsigned short *k16 = malloc(2 * pool), *v16 = malloc(2 * pool);
    cpu_pack(k16, DTYPE_BF16, k, pool); cpu_pack(v16, DTYPE_BF16, v, pool);
    int *table = malloc(sizeof(int) * nb * S), *seq = malloc(sizeof(int) * S), *pos = malloc(sizeof(int) * S), *start = malloc(sizeof(int) * (S + 1));
    for (int b = 0; b < nb * S; b++) table[b] = b;
    for (int s = 0; s < S; s++) seq[s] = s, pos[s] = ctx - 1, start[s] = s;   /* each sequence its own blocks */
    start[S] = S;
    size_t stride = (size_t)H * ctx;
    float *scratch = malloc(4 * stride * th);
    double best[2] = {1e9, 1e9};
    for (int r = 0; r < 8; r++)
        for (int d = 0; d < 2; d++) {
            PagedBatch pb = {table, nb, B, seq, pos, S, S, 0, start, pos, d ? DTYPE_BF16 : DTYPE_F32};
            double t0 = omp_get_wtime();
            for (int rep = 0; rep < 10; rep++) cpu_attention_batch(o, q, d ? (void *)k16 : k, d ? (void *)v16 : v, &pb, H, Hkv, Dh, 0, scratch, stride);
            double t = (omp_get_wtime() - t0) / 10;
            if (t < best[d]) best[d] = t;
        }
    printf("attention decode ctx %d, %d sequences, %d threads (110M heads): fp32 KV %.1f us, bf16 KV %.1f us: bf16 / fp32 time %.2fx\n",
           ctx, S, th, best[0] * 1e6, best[1] * 1e6, best[1] / best[0]);
}
