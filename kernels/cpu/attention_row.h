/* attention_row.h — one query row's softmax numerators, shared by cpu_attention (ops.c) and
 * cpu_attention_backward (backward.c) so the backward recomputes exactly the forward's numbers.
 * Private to kernels/cpu. */
#ifndef TANDEM_ATTENTION_ROW_H
#define TANDEM_ATTENTION_ROW_H
#include <math.h>
#include <stddef.h>

/* For query qi (Dh) at position i and keys j0..i (key j at row table[j / block] * block + j % block
 * of k, rows ks floats apart, this head's columns at koff): p[j] = exp(s_j - max s), s_j =
 * scale * qi.k_j. Returns sum_j p[j]. */
static inline float attention_row_exp(const float *qi, const float *k, const int *table, int block, size_t ks,
                                      size_t koff, int j0, int i, int Dh, float scale, float *p) {
    float mx = -INFINITY;
    for (int j = j0; j <= i; j++) {
        const float *kj = k + ((size_t)table[j / block] * block + j % block) * ks + koff;
        float s = 0.0f;
        for (int d = 0; d < Dh; d++) s += qi[d] * kj[d];
        s *= scale;
        p[j] = s;
        if (s > mx) mx = s;
    }
    float sum = 0.0f;
    for (int j = j0; j <= i; j++) sum += (p[j] = expf(p[j] - mx));
    return sum;
}
#endif
