/* attention_row.h — one query row's softmax numerators, shared by cpu_attention (ops.c) and
 * cpu_attention_backward (backward.c) so the backward recomputes exactly the forward's numbers.
 * Private to kernels/cpu. */
#ifndef TANDEM_ATTENTION_ROW_H
#define TANDEM_ATTENTION_ROW_H
#include "kernels/cpu/vec.h"
#include <math.h>
#include <stddef.h>

/* Keys live in a paged cache: key j is row table[j / block] * block + j % block. Loops over keys
 * step (*b, *o) = (j / block, j % block) along with j, so no key costs a division. */
static inline size_t key_row_next(const int *table, int block, int *b, int *o) {
    size_t r = (size_t)table[*b] * block + *o;
    if (++*o == block) { *o = 0; ++*b; }
    return r;
}

/* For query qi (Dh) at position i and keys j0..i (rows of k ks floats apart, this head's columns at
 * koff): p[j] = exp(s_j - max s), s_j = scale * dot_fixed(qi, k_j). Returns sum_j p[j]. Scores
 * are computed four keys at a time (the same bits as one at a time: dot_fixed4). */
static inline float attention_row_exp(const float *qi, const float *k, const int *table, int block, size_t ks,
                                      size_t koff, int j0, int i, int Dh, float scale, float *p) {
    int b = j0 / block, o = j0 % block, j = j0;
    for (; j + 3 <= i; j += 4) {
        const float *k0 = k + key_row_next(table, block, &b, &o) * ks + koff;
        const float *k1 = k + key_row_next(table, block, &b, &o) * ks + koff;
        const float *k2 = k + key_row_next(table, block, &b, &o) * ks + koff;
        const float *k3 = k + key_row_next(table, block, &b, &o) * ks + koff;
        dot_fixed4(p + j, qi, k0, k1, k2, k3, Dh);
    }
    for (; j <= i; j++) p[j] = dot_fixed(qi, k + key_row_next(table, block, &b, &o) * ks + koff, Dh);
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (j = j0; j <= i; j++) {   /* exact per element, and max is order-free: vectorised */
        p[j] = p[j] * scale;
        mx = p[j] > mx ? p[j] : mx;
    }
    float sum = 0.0f;
    for (j = j0; j <= i; j++) sum += (p[j] = expf(p[j] - mx));
    return sum;
}
#endif
