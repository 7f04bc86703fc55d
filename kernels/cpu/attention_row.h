/* attention_row.h — one query row's softmax numerators, shared by cpu_attention (ops.c) and
 * cpu_attention_backward (backward.c) so the backward recomputes exactly the forward's numbers.
 * Private to kernels/cpu. */
#ifndef TANDEM_ATTENTION_ROW_H
#define TANDEM_ATTENTION_ROW_H
#include <math.h>
#include <stddef.h>

/* dot(a, b) over n floats in a fixed order: 16 lanes over k = lane (mod 16), the lanes summed by
 * a fixed tree, then the tail in order. Vectorises without depending on the compiler's choices. */
typedef float attn_v16 __attribute__((vector_size(64)));
static inline float dot_fixed(const float *a, const float *b, int n) {
    attn_v16 acc = {0};
    int k = 0;
    for (; k + 16 <= n; k += 16) {
        attn_v16 x, y;
        __builtin_memcpy(&x, a + k, sizeof x);
        __builtin_memcpy(&y, b + k, sizeof y);
        acc = acc + x * y;
    }
    float s[16];
    __builtin_memcpy(s, &acc, sizeof s);
    for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) s[i] = s[i] + s[i + w];
    float r = s[0];
    for (; k < n; k++) r = r + a[k] * b[k];
    return r;
}

/* For query qi (Dh) at position i and keys j0..i (key j at row table[j / block] * block + j % block
 * of k, rows ks floats apart, this head's columns at koff): p[j] = exp(s_j - max s), s_j =
 * scale * qi.k_j. Returns sum_j p[j]. */
static inline float attention_row_exp(const float *qi, const float *k, const int *table, int block, size_t ks,
                                      size_t koff, int j0, int i, int Dh, float scale, float *p) {
    float mx = -INFINITY;
    for (int j = j0; j <= i; j++) {
        const float *kj = k + ((size_t)table[j / block] * block + j % block) * ks + koff;
        float s = dot_fixed(qi, kj, Dh) * scale;
        p[j] = s;
        if (s > mx) mx = s;
    }
    float sum = 0.0f;
    for (int j = j0; j <= i; j++) sum += (p[j] = expf(p[j] - mx));
    return sum;
}
#endif
