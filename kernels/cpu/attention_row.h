/* attention_row.h — what the attention forward (ops.c) and backward (backward.c) share: one query
 * row's softmax numerators, so the backward recomputes exactly the forward's numbers, and RoPE's
 * rotation. Private to kernels/cpu. */
#ifndef TANDEM_ATTENTION_ROW_H
#define TANDEM_ATTENTION_ROW_H
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/vec.h"
#include <math.h>
#include <stddef.h>

/* x (N, n_heads * Dh) rotated in place, pairs (i, i + Dh/2), by the angles of cs (cpu_rope_table):
 * sign 1 is the forward, x * cos + rotate_half(x) * sin with rotate_half = (-b, a); sign -1 the
 * backward, the transpose of [[c, -s], [s, c]]. (Negating the sine is exact.) */
static inline void rope_rotate(float *x, const float *cs, int N, int n_heads, int Dh, float sign) {
    int half = Dh / 2;
    for (int n = 0; n < N; n++)
        for (int i = 0; i < half; i++) {
            float c = cs[(size_t)n * Dh + i], s = sign * cs[(size_t)n * Dh + half + i];
            for (int h = 0; h < n_heads; h++) {
                float *xh = x + ((size_t)n * n_heads + h) * Dh;
                float a = xh[i], b = xh[i + half];
                xh[i] = a * c - b * s;
                xh[i + half] = b * c + a * s;
            }
        }
}

/* The keys of row (j0..i) that block b holds: [*ja, *jb] */
static inline void block_span(const KVLayout *kv, int b, int j0, int i, int *ja, int *jb) {
    int first = b * kv->block, last = first + kv->block - 1;
    *ja = j0 > first ? j0 : first;
    *jb = i < last ? i : last;
}

/* Raw scores p[j] = dot_fixed(qh, k_j) for keys ja..jb of one block: kj points at key ja, `row`
 * floats between keys. Sixteen keys at a time, then four (dot_fixed16, dot_fixed4: the same bits
 * as one at a time). */
static inline void attention_scores(float *p, const float *qh, const float *kj, size_t row, int ja, int jb, int Dh) {
    int j = ja;
    for (; j + 15 <= jb; j += 16, kj += 16 * row) dot_fixed16(p + j, qh, kj, row, Dh);
    for (; j + 3 <= jb; j += 4, kj += 4 * row) dot_fixed4(p + j, qh, kj, kj + row, kj + 2 * row, kj + 3 * row, Dh);
    for (; j <= jb; j++, kj += row) p[j] = dot_fixed(qh, kj, Dh);
}

/* Softmax numerators of one row from its raw scores p[j0..i]: p[j] = exp(scale * p[j] - max), by
 * exp16 (expf cost a sixth of decode's attention). Returns their sum, added in increasing j. */
static inline float attention_row_softmax(float *p, int j0, int i, float scale) {
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int j = j0; j <= i; j++) {   /* exact per element, and max is order-free: vectorised */
        p[j] = p[j] * scale;
        mx = p[j] > mx ? p[j] : mx;
    }
    for (int j = j0; j <= i; j += 16) {
        size_t m = i + 1 - j < 16 ? (size_t)(i + 1 - j) : 16;
        if (m == 16) st16n(p + j, exp16(ld16(p + j) - mx), 16);   /* one load and store: keep m a constant */
        else st16n(p + j, exp16(ld16n(p + j, m) - mx), m);
    }
    float sum = 0.0f;
    for (int j = j0; j <= i; j++) sum += p[j];
    return sum;
}

/* For query qi (Dh) at position i and keys j0..i of kv head hk: p[j] = exp(s_j - max s),
 * s_j = scale * dot_fixed(qi, k_j). Returns sum_j p[j]. */
static inline float attention_row_exp(const float *qi, const float *k, const KVLayout *kv, int Hkv, int hk, int j0,
                                      int i, int Dh, float scale, float *p) {
    for (int b = j0 / kv->block, ja, jb; b <= i / kv->block; b++) {
        block_span(kv, b, j0, i, &ja, &jb);
        attention_scores(p, qi, k + kv_offset(kv, (size_t)Hkv * Dh, ja) + (size_t)hk * kv->head, kv->row, ja, jb, Dh);
    }
    return attention_row_softmax(p, j0, i, scale);
}
#endif
