/* attention_row.h — one query row's softmax numerators, shared by cpu_attention (ops.c) and
 * cpu_attention_backward (backward.c) so the backward recomputes exactly the forward's numbers.
 * Private to kernels/cpu. */
#ifndef TANDEM_ATTENTION_ROW_H
#define TANDEM_ATTENTION_ROW_H
#include "kernels/kernels.h"
#include "kernels/cpu/vec.h"
#include <math.h>
#include <stddef.h>

/* Offset of key j0 + n (n = 0, 1, ... on successive calls), kv head 0: the walk keeps
 * (b, o) = (j / block, j % block), so no key costs a division. */
typedef struct { const KVLayout *kv; size_t block_floats; int b, o; } KeyWalk;
static inline KeyWalk key_walk(const KVLayout *kv, int Hkv, int Dh, int j0) {
    return (KeyWalk){kv, (size_t)kv->block * Hkv * Dh, j0 / kv->block, j0 % kv->block};
}
static inline size_t key_next(KeyWalk *w) {
    size_t r = (size_t)w->kv->table[w->b] * w->block_floats + (size_t)w->o * w->kv->row;
    if (++w->o == w->kv->block) { w->o = 0; ++w->b; }
    return r;
}

/* Softmax numerators of one row from its raw scores p[j0..i]: p[j] = exp(scale * p[j] - max).
 * Returns their sum, added in increasing j. */
static inline float attention_row_softmax(float *p, int j0, int i, float scale) {
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int j = j0; j <= i; j++) {   /* exact per element, and max is order-free: vectorised */
        p[j] = p[j] * scale;
        mx = p[j] > mx ? p[j] : mx;
    }
    float sum = 0.0f;
    for (int j = j0; j <= i; j++) sum += (p[j] = expf(p[j] - mx));
    return sum;
}

/* For query qi (Dh) at position i and keys j0..i of kv head hk: p[j] = exp(s_j - max s),
 * s_j = scale * dot_fixed(qi, k_j). Returns sum_j p[j]. Scores are computed four keys at a time
 * (the same bits as one at a time: dot_fixed4). */
static inline float attention_row_exp(const float *qi, const float *k, const KVLayout *kv, int Hkv, int hk, int j0,
                                      int i, int Dh, float scale, float *p) {
    KeyWalk w = key_walk(kv, Hkv, Dh, j0);
    k += (size_t)hk * kv->head;
    int j = j0;
    for (; j + 3 <= i; j += 4) {
        const float *k0 = k + key_next(&w), *k1 = k + key_next(&w), *k2 = k + key_next(&w), *k3 = k + key_next(&w);
        dot_fixed4(p + j, qi, k0, k1, k2, k3, Dh);
    }
    for (; j <= i; j++) p[j] = dot_fixed(qi, k + key_next(&w), Dh);
    return attention_row_softmax(p, j0, i, scale);
}
#endif
