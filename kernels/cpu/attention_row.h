/* attention_row.h — one query row's softmax numerators, shared by cpu_attention (ops.c) and
 * cpu_attention_backward (backward.c) so the backward recomputes exactly the forward's numbers.
 * Private to kernels/cpu. */
#ifndef TANDEM_ATTENTION_ROW_H
#define TANDEM_ATTENTION_ROW_H
#include "kernels/cpu/vec.h"
#include <math.h>
#include <stddef.h>

/* For query qi (Dh) at position i and keys j0..i (key j at row table[j / block] * block + j % block
 * of k, rows ks floats apart, this head's columns at koff): p[j] = exp(s_j - max s), s_j =
 * scale * dot_fixed(qi, k_j). Returns sum_j p[j]. Scores are computed four keys at a time (the
 * same bits as one at a time: dot_fixed4). */
static inline float attention_row_exp(const float *qi, const float *k, const int *table, int block, size_t ks,
                                      size_t koff, int j0, int i, int Dh, float scale, float *p) {
#define KEY_ROW(j) (k + ((size_t)table[(j) / block] * block + (j) % block) * ks + koff)
    int j = j0;
    for (; j + 3 <= i; j += 4) dot_fixed4(p + j, qi, KEY_ROW(j), KEY_ROW(j + 1), KEY_ROW(j + 2), KEY_ROW(j + 3), Dh);
    for (; j <= i; j++) p[j] = dot_fixed(qi, KEY_ROW(j), Dh);
#undef KEY_ROW
    float mx = -INFINITY;
    for (j = j0; j <= i; j++) {
        p[j] = p[j] * scale;
        if (p[j] > mx) mx = p[j];
    }
    float sum = 0.0f;
    for (j = j0; j <= i; j++) sum += (p[j] = expf(p[j] - mx));
    return sum;
}
#endif
