/* bf16dot.c — `--cpu-bf16-dot native`: the forward matmul on bf16 weights with AVX512_BF16's
 * vdpbf16ps arithmetic, and that arithmetic's scalar emulation, which runs where the CPU lacks the
 * instruction (and is what the tests compare the instruction with, bit for bit).
 * Owns: the process's choice (cpu_set_bf16_dot), the emulation (cpu_dpbf16_lane), the native matmul
 * (cpu_matmul_native, called by ops.c's matmuls_leaves). Does not own: the default exact bf16 path
 * (ops.c: fp32 multiply-adds on the upcast weights, the same bits on every ISA), the tp leaves' and
 * cache blocking's cut of n_in (ops.c decides the leaves; this file sums each leaf).
 *
 * What vdpbf16ps computes (Intel SDM vol. 2C, VDPBF16PS, "Operation"): for each fp32 lane i,
 *   srcdest[i] += make_fp32(src1.bf16[2i+1]) * make_fp32(src2.bf16[2i+1])
 *   srcdest[i] += make_fp32(src1.bf16[2i])   * make_fp32(src2.bf16[2i])
 * the odd pair first, each step one multiply-add rounded to nearest even ("Round to nearest even
 * rounding mode is used when doing each accumulation of the FMA"), input denormals treated as zero
 * and output denormals flushed to zero, MXCSR neither read nor written. A product of two bf16
 * values is exact in fp32 (8 x 8 significand bits), so each step is fmaf's rounding of the exact
 * sum, then the flush (dp_step: save one case at 2^-126). (tests/test_bf16_kernels.c checks this model against the instruction where the
 * CPU has it, bit for bit, on random and on denormal, overflowing and signed-zero inputs.)
 *
 * The native dot product of a run of K inputs (x rounded to bf16 first: exact in --dtype bf16,
 * where every matmul input already is a bf16 value): 16 lanes, lane i taking the pairs
 * (32c + 2i, 32c + 2i + 1) for c = 0, 1, ... in increasing c, the run zero-padded to a multiple of
 * 32; then vec.h's lane tree (hsum16). Each output is that over each of the leaves ops.c cut n_in
 * into, combined by tree_sum, then the bias: a fixed order per output, so batch invariance and the
 * tp leaves hold as in the exact path; only the arithmetic differs (pairs, flushed denormals,
 * 32-element chunks instead of 16 lanes of single products), so its bits are not the exact path's. */
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/vec.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

static int native_mode;      /* --cpu-bf16-dot native */
static int force_emulation;  /* tests: the emulation even where the instruction exists */

void cpu_set_bf16_dot(int native) { native_mode = native; }
int cpu_bf16_dot_native(void) { return native_mode; }
void cpu_bf16_dot_emulate(int on) { force_emulation = on; }

int cpu_has_avx512bf16(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512f");
#else
    return 0;
#endif
}

/* a denormal to the zero of its sign */
static inline float flush(float f) { return fpclassify(f) == FP_SUBNORMAL ? copysignf(0.0f, f) : f; }

/* One step: x y + acc rounded as the instruction rounds, then flushed. The instruction rounds to 24
 * bits with an unbounded exponent and flushes a result below 2^-126; fmaf rounds with gradual
 * underflow, so an exact sum within 2^-150 below 2^-126 comes out as 2^-126 from fmaf but 0 from the
 * instruction. That case alone is redone scaled by 2^24 (exact: a power of two on the smaller factor
 * and on acc), far from the denormals. */
static inline float dp_step(float x, float y, float acc) {
    float r = fmaf(x, y, acc);
    if (fabsf(r) != 0x1p-126f) return flush(r);
    float r2 = fabsf(x) < fabsf(y) ? fmaf(x * 0x1p24f, y, acc * 0x1p24f) : fmaf(x, y * 0x1p24f, acc * 0x1p24f);
    return fabsf(r2) < 0x1p-102f ? copysignf(0.0f, r2) : r;
}

float cpu_dpbf16_lane(float acc, uint32_t a, uint32_t b) {
    float a1 = flush(bf16_to_f32((uint16_t)(a >> 16))), b1 = flush(bf16_to_f32((uint16_t)(b >> 16)));
    float a0 = flush(bf16_to_f32((uint16_t)a)), b0 = flush(bf16_to_f32((uint16_t)b));
    acc = dp_step(a1, b1, flush(acc));
    return dp_step(a0, b0, acc);
}

/* ---- the tile: 4 rows of x by 4 rows of w over one run, 16 results ------------------------------
 * xr[r], wr[j] point at the run's first element (bf16); r[4 i + j] = the native dot of row i and
 * output j. Rows or outputs past the tile's edge repeat the last one (computed, not stored; the
 * instruction's tile computes only rows 0 .. rn - 1 of 1 or 2: decode). */
static void tile_emulated(float *r, const uint16_t *const *xr, const uint16_t *const *wr, int K) {
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            v16 acc = {0};
            for (int k = 0; k < K; k += 32)
                for (int l = 0; l < 16; l++) {
                    int e = k + 2 * l;   /* elements e, e + 1 of the pair; past K: zero */
                    uint32_t a = (e < K ? xr[i][e] : 0) | (uint32_t)(e + 1 < K ? xr[i][e + 1] : 0) << 16;
                    uint32_t b = (e < K ? wr[j][e] : 0) | (uint32_t)(e + 1 < K ? wr[j][e + 1] : 0) << 16;
                    acc[l] = cpu_dpbf16_lane(acc[l], a, b);
                }
            r[4 * i + j] = hsum16(acc);
        }
}

#if defined(__x86_64__) && defined(__GNUC__)
#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))
/* R rows (1 or 2: a constant after inlining) by 4 outputs, a[4 i + j] for row i, output j */
static inline __attribute__((always_inline)) BF16_TARGET void tile_rows(float *r, const uint16_t *const *xr,
                                                                     const uint16_t *const *wr, int K, const int R) {
    __m512 a[8];
    for (int t = 0; t < 4 * R; t++) a[t] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += 32) {
        __mmask32 m = K - k >= 32 ? 0xffffffffu : (1u << (K - k)) - 1;   /* the zero-padded last chunk */
        __m512i w0 = _mm512_maskz_loadu_epi16(m, wr[0] + k), w1 = _mm512_maskz_loadu_epi16(m, wr[1] + k);
        __m512i w2 = _mm512_maskz_loadu_epi16(m, wr[2] + k), w3 = _mm512_maskz_loadu_epi16(m, wr[3] + k);
        for (int i = 0; i < R; i++) {
            __m512i x = _mm512_maskz_loadu_epi16(m, xr[i] + k);
            a[4 * i] = _mm512_dpbf16_ps(a[4 * i], (__m512bh)x, (__m512bh)w0);
            a[4 * i + 1] = _mm512_dpbf16_ps(a[4 * i + 1], (__m512bh)x, (__m512bh)w1);
            a[4 * i + 2] = _mm512_dpbf16_ps(a[4 * i + 2], (__m512bh)x, (__m512bh)w2);
            a[4 * i + 3] = _mm512_dpbf16_ps(a[4 * i + 3], (__m512bh)x, (__m512bh)w3);
        }
    }
    for (int t = 0; t < 4 * R; t++) r[t] = hsum16((v16)a[t]);
}
/* R = 4 written out: 16 named accumulators stay in registers (GCC keeps tile_rows' array of 16 in
 * memory) */
BF16_TARGET static void tile_4x4(float *r, const uint16_t *const *xr, const uint16_t *const *wr, int K) {
    __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    __m512 a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00, a32 = a00, a33 = a00;
    const uint16_t *x0 = xr[0], *x1 = xr[1], *x2 = xr[2], *x3 = xr[3], *v0 = wr[0], *v1 = wr[1], *v2 = wr[2], *v3 = wr[3];
    for (int k = 0; k < K; k += 32) {
        __mmask32 m = K - k >= 32 ? 0xffffffffu : (1u << (K - k)) - 1;   /* the zero-padded last chunk */
        __m512bh w0 = (__m512bh)_mm512_maskz_loadu_epi16(m, v0 + k), w1 = (__m512bh)_mm512_maskz_loadu_epi16(m, v1 + k);
        __m512bh w2 = (__m512bh)_mm512_maskz_loadu_epi16(m, v2 + k), w3 = (__m512bh)_mm512_maskz_loadu_epi16(m, v3 + k);
        __m512bh p = (__m512bh)_mm512_maskz_loadu_epi16(m, x0 + k);
        a00 = _mm512_dpbf16_ps(a00, p, w0); a01 = _mm512_dpbf16_ps(a01, p, w1); a02 = _mm512_dpbf16_ps(a02, p, w2); a03 = _mm512_dpbf16_ps(a03, p, w3);
        p = (__m512bh)_mm512_maskz_loadu_epi16(m, x1 + k);
        a10 = _mm512_dpbf16_ps(a10, p, w0); a11 = _mm512_dpbf16_ps(a11, p, w1); a12 = _mm512_dpbf16_ps(a12, p, w2); a13 = _mm512_dpbf16_ps(a13, p, w3);
        p = (__m512bh)_mm512_maskz_loadu_epi16(m, x2 + k);
        a20 = _mm512_dpbf16_ps(a20, p, w0); a21 = _mm512_dpbf16_ps(a21, p, w1); a22 = _mm512_dpbf16_ps(a22, p, w2); a23 = _mm512_dpbf16_ps(a23, p, w3);
        p = (__m512bh)_mm512_maskz_loadu_epi16(m, x3 + k);
        a30 = _mm512_dpbf16_ps(a30, p, w0); a31 = _mm512_dpbf16_ps(a31, p, w1); a32 = _mm512_dpbf16_ps(a32, p, w2); a33 = _mm512_dpbf16_ps(a33, p, w3);
    }
    v16 s = hsum16x16((v16)a00, (v16)a01, (v16)a02, (v16)a03, (v16)a10, (v16)a11, (v16)a12, (v16)a13, (v16)a20, (v16)a21,
                      (v16)a22, (v16)a23, (v16)a30, (v16)a31, (v16)a32, (v16)a33);
    memcpy(r, &s, sizeof s);
}
BF16_TARGET static void tile_vdpbf16ps(float *r, const uint16_t *const *xr, const uint16_t *const *wr, int K, int rn) {
    if (rn >= 3) tile_4x4(r, xr, wr, K);   /* 3 rows: the fourth repeats the third */
    else if (rn == 1) tile_rows(r, xr, wr, K, 1);
    else tile_rows(r, xr, wr, K, 2);
}
/* lane i of the result = cpu_dpbf16_lane(acc[i], a[i], b[i]) by the instruction (the tests) */
BF16_TARGET void cpu_dpbf16_hw(float *acc, const uint32_t *a, const uint32_t *b) {
    __m512 c = _mm512_loadu_ps(acc);
    c = _mm512_dpbf16_ps(c, (__m512bh)_mm512_loadu_si512(a), (__m512bh)_mm512_loadu_si512(b));
    _mm512_storeu_ps(acc, c);
}
#else
static void tile_vdpbf16ps(float *r, const uint16_t *const *xr, const uint16_t *const *wr, int K, int rn) {
    (void)rn;
    tile_emulated(r, xr, wr, K);
}
void cpu_dpbf16_hw(float *acc, const uint32_t *a, const uint32_t *b) {
    (void)acc, (void)a, (void)b;
    abort();
}
#endif

/* x (N, n_in) rounded to bf16, in this thread's buffer (kept, grown to the largest call) */
static const uint16_t *x_bf16(const float *x, size_t n) {
    static _Thread_local uint16_t *buf;
    static _Thread_local size_t cap;
    if (n > cap) {
        free(buf);
        buf = malloc(sizeof(uint16_t) * n);
        if (!buf) { fprintf(stderr, "cpu_matmul: out of memory for %zu bf16 inputs\n", n); abort(); }
        cap = n;
    }
    for (size_t i = 0; i < n; i++) buf[i] = f32_to_bf16(x[i]);
    return buf;
}

void cpu_matmul_native(const float *x, int N, int n_in, const MatmulOut *outs, int n, int leaves) {
    const uint16_t *xb = x_bf16(x, (size_t)N * n_in);   /* (N, n_in) */
    int hw = !force_emulation && cpu_has_avx512bf16(), Kl = n_in / leaves;
    int first[n + 1];   /* the 4-output tiles of outs[j] are first[j] .. first[j + 1] - 1 */
    first[0] = 0;
    for (int j = 0; j < n; j++) first[j + 1] = first[j] + (outs[j].n_out + 3) / 4;
    int tiles = first[n];
    enum { ROW_BLOCK = 64 };   /* rows of x kept hot in cache while a thread sweeps its w rows (as ops.c) */
    for (int b0 = 0; b0 < N; b0 += ROW_BLOCK) {
        int b1 = b0 + ROW_BLOCK < N ? b0 + ROW_BLOCK : N;
#pragma omp parallel for schedule(static) if (tiles > 4)
    for (int t = 0; t < tiles; t++) {
        int j = 0;
        while (t >= first[j + 1]) j++;
        const MatmulOut *o = &outs[j];
        int j0 = (t - first[j]) * 4, ro = o->n_out - j0 < 4 ? o->n_out - j0 : 4;
        const uint16_t *w = (const uint16_t *)o->w;   /* (n_out, n_in) */
        for (int n0 = b0; n0 < b1; n0 += 4) {
            int rn = b1 - n0 < 4 ? b1 - n0 : 4;
            float part[leaves * 16];   /* (leaves, 4, 4) */
            for (int l = 0; l < leaves; l++) {
                const uint16_t *xr[4], *wr[4];
                for (int i = 0; i < 4; i++) xr[i] = xb + (size_t)(n0 + (i < rn ? i : rn - 1)) * n_in + (size_t)l * Kl;
                for (int i = 0; i < 4; i++) wr[i] = w + (size_t)(j0 + (i < ro ? i : ro - 1)) * n_in + (size_t)l * Kl;
                if (hw) tile_vdpbf16ps(part + 16 * l, xr, wr, Kl, rn);
                else tile_emulated(part + 16 * l, xr, wr, Kl);
            }
            tree_sum(part, leaves, 16);
            for (int i = 0; i < rn; i++)
                for (int c = 0; c < ro; c++) {
                    float s = part[4 * i + c];
                    o->out[(size_t)(n0 + i) * o->n_out + j0 + c] = o->bias ? s + weight_at(o->bias, DTYPE_BF16, (size_t)j0 + c) : s;
                }
        }
    }
    }
}
