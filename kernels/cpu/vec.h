/* vec.h — the 16-lane vector type and the one fixed summation tree that every CPU dot product
 * uses (matmul, attention scores, their backward). Private to kernels/cpu. These files are compiled
 * with KERNEL_FLAGS (Makefile) so that every `acc + x * y` is one fused multiply-add; scalar tails
 * also say fmaf outright, since a dot product must round the same way in every call site. */
#ifndef TANDEM_VEC_H
#define TANDEM_VEC_H
#include <math.h>
#include <string.h>
#include "kernels/kernels.h"   /* bf16_to_f32 */

typedef float v16 __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

static inline v16 ld16(const float *p) {
    v16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The first m (<= 16) floats at p, the other lanes 0; and their store. With m a constant 16 these
 * are one vector load / store; a variable m costs a memcpy call, so keep it to tails. */
static inline __attribute__((always_inline)) v16 ld16n(const float *p, size_t m) {
    v16 v = {0};
    memcpy(&v, p, sizeof(float) * m);
    return v;
}
static inline __attribute__((always_inline)) void st16n(float *p, v16 v, size_t m) { memcpy(p, &v, sizeof(float) * m); }

/* Part `part` of `parts` of [p, p + bytes) fetched into L2, one line at a time: a kernel spreads the
 * next tile's (or block's) fetch over the work it does on this one. */
static inline void prefetch_part(const void *p, size_t bytes, size_t part, size_t parts) {
    for (size_t byte = bytes * part / parts & ~(size_t)63; byte < bytes * (part + 1) / parts; byte += 64)
        __builtin_prefetch((const char *)p + byte, 0, 2);
}

static inline __attribute__((always_inline)) v8 ld8(const float *p) {
    v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* the fixed tree: lanes i and i+8, then i and i+4, then i and i+2, then 0 and 1; hsum8 is the
 * part after the first step (b = lanes 0-7 + lanes 8-15) */
static inline float hsum8(v8 b) {
    v4 c = __builtin_shufflevector(b, b, 0, 1, 2, 3) + __builtin_shufflevector(b, b, 4, 5, 6, 7);
    float d0 = c[0] + c[2], d1 = c[1] + c[3];
    return d0 + d1;
}
static inline float hsum16(v16 a) {
    return hsum8(__builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15));
}

/* hsum16 of four vectors, the same additions in the same order, results to out[0..3] */
static inline __attribute__((always_inline)) void hsum4(float *out, v16 a, v16 b, v16 c, v16 d) {
    v8 a8 = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
    v8 b8 = __builtin_shufflevector(b, b, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(b, b, 8, 9, 10, 11, 12, 13, 14, 15);
    v8 c8 = __builtin_shufflevector(c, c, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(c, c, 8, 9, 10, 11, 12, 13, 14, 15);
    v8 d8 = __builtin_shufflevector(d, d, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(d, d, 8, 9, 10, 11, 12, 13, 14, 15);
    v4 a4 = __builtin_shufflevector(a8, a8, 0, 1, 2, 3) + __builtin_shufflevector(a8, a8, 4, 5, 6, 7);
    v4 b4 = __builtin_shufflevector(b8, b8, 0, 1, 2, 3) + __builtin_shufflevector(b8, b8, 4, 5, 6, 7);
    v4 c4 = __builtin_shufflevector(c8, c8, 0, 1, 2, 3) + __builtin_shufflevector(c8, c8, 4, 5, 6, 7);
    v4 d4 = __builtin_shufflevector(d8, d8, 0, 1, 2, 3) + __builtin_shufflevector(d8, d8, 4, 5, 6, 7);
    /* transpose: tK holds lane K of a4, b4, c4, d4 */
    v4 ab_lo = __builtin_shufflevector(a4, b4, 0, 4, 1, 5), ab_hi = __builtin_shufflevector(a4, b4, 2, 6, 3, 7);
    v4 cd_lo = __builtin_shufflevector(c4, d4, 0, 4, 1, 5), cd_hi = __builtin_shufflevector(c4, d4, 2, 6, 3, 7);
    v4 t0 = __builtin_shufflevector(ab_lo, cd_lo, 0, 1, 4, 5), t1 = __builtin_shufflevector(ab_lo, cd_lo, 2, 3, 6, 7);
    v4 t2 = __builtin_shufflevector(ab_hi, cd_hi, 0, 1, 4, 5), t3 = __builtin_shufflevector(ab_hi, cd_hi, 2, 3, 6, 7);
    v4 r = (t0 + t2) + (t1 + t3);   /* (lane0 + lane2) + (lane1 + lane3), as hsum16 */
    memcpy(out, &r, sizeof r);
}

/* hsum16 of 16 accumulators aIJ, to lane 4I + J of the result (a 4 x 4 matmul tile: row I,
 * output J; or 16 keys' scores): the same additions in the same order as hsum16, done as a
 * transposing network in which every 16-lane add serves two to eight accumulators: 15 adds and 30
 * shuffles, where four hsum4 take 44 narrow adds and 64 shuffles. At K = 288 (18 FMAs per output,
 * the 15M shapes) that is 14% more matmul throughput hot in L2. Each stage (tree8 .. tree1) adds,
 * for two vectors at once, the lanes hsum16 adds at that step; only the lane lists differ. */
#define SHUF16(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
/* lanes i and i + 8: x's eight sums to lanes 0-7, y's to 8-15 */
static inline v16 tree8(v16 x, v16 y) {
    return SHUF16(x, y, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           SHUF16(x, y, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
}
/* lanes i and i + 4 of each 8-lane half: x's halves to quarters 0, 1, y's to 2, 3 */
static inline v16 tree4(v16 x, v16 y) {
    return SHUF16(x, y, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           SHUF16(x, y, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
}
/* lanes 0 + 2 and 1 + 3 of each quarter: quarter q gets x's two sums, then y's */
static inline v16 tree2(v16 x, v16 y) {
    return SHUF16(x, y, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) +
           SHUF16(x, y, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
}
/* the last add, lanes 0 + 1 of each pair: quarter q gets x's two sums, then y's */
static inline v16 tree1(v16 x, v16 y) {
    return SHUF16(x, y, 0, 2, 16, 18, 4, 6, 20, 22, 8, 10, 24, 26, 12, 14, 28, 30) +
           SHUF16(x, y, 1, 3, 17, 19, 5, 7, 21, 23, 9, 11, 25, 27, 13, 15, 29, 31);
}
#undef SHUF16
static inline __attribute__((always_inline)) v16 hsum16x16(v16 a00, v16 a01, v16 a02, v16 a03, v16 a10, v16 a11,
                                                          v16 a12, v16 a13, v16 a20, v16 a21, v16 a22, v16 a23,
                                                          v16 a30, v16 a31, v16 a32, v16 a33) {
    /* after tree4, quarter I of cJ is aIJ's four partial sums (the pairing puts rows in quarters) */
    v16 c0 = tree4(tree8(a00, a10), tree8(a20, a30)), c1 = tree4(tree8(a01, a11), tree8(a21, a31));
    v16 c2 = tree4(tree8(a02, a12), tree8(a22, a32)), c3 = tree4(tree8(a03, a13), tree8(a23, a33));
    /* so after tree2 and tree1, lane 4I + J is hsum16(aIJ) */
    return tree1(tree2(c0, c1), tree2(c2, c3));
}
/* The same sums from the 16 accumulators' lane-half sums b[i] = lanes 0-7 + lanes 8-15 (tree8's
 * additions, done by the caller), to out[0..15], in 8-lane vectors only: AVX2 keeps the halves of
 * an accumulator apart, and GCC moves a v16 built from two v8 through memory a float at a time.
 * A pairs lanes i, i + 4 of two accumulators (x's four sums, then y's); B lanes 0 + 2 and 1 + 3 of
 * each four (x, z, y, w two each); C the last pair: out = b0, b1, b2, ... in order. */
static inline __attribute__((always_inline)) void hsum16x16_halves(float *out, const v8 *b) {
#define S8(x, y, ...) __builtin_shufflevector(x, y, __VA_ARGS__)
#define A(x, y) (S8(x, y, 0, 1, 2, 3, 8, 9, 10, 11) + S8(x, y, 4, 5, 6, 7, 12, 13, 14, 15))
#define B(u, v) (S8(u, v, 0, 1, 8, 9, 4, 5, 12, 13) + S8(u, v, 2, 3, 10, 11, 6, 7, 14, 15))
#define C(p, q) (S8(p, q, 0, 2, 8, 10, 4, 6, 12, 14) + S8(p, q, 1, 3, 9, 11, 5, 7, 13, 15))
    for (int h = 0; h < 16; h += 8) {
        const v8 *e = b + h;
        v8 r = C(B(A(e[0], e[4]), A(e[1], e[5])), B(A(e[2], e[6]), A(e[3], e[7])));
        memcpy(out + h, &r, sizeof r);
    }
#undef S8
#undef A
#undef B
#undef C
}

/* exp(x), 16 lanes: x = n ln2 + r (n = round(x / ln2), ln2 in two parts so r is exact), Cephes'
 * degree-5 polynomial for exp(r) on |r| <= ln2 / 2, times 2^n set in the exponent bits. Within 2 ulp
 * of expf (tests/test_kernels.c checks silu built on it on 10^6 points); 0 below -87.3 (no subnormals), inf
 * above 88.7. glibc's scalar expf costs ~18 cycles an element here and libmvec's 16-lane one was
 * no faster, which made silu a tenth of a decode step. */
typedef int vi16 __attribute__((vector_size(64)));
static inline v16 sel16(vi16 mask, v16 a, v16 b) { return (v16)(((vi16)a & mask) | ((vi16)b & ~mask)); }

/* The native vector, one register: 16 lanes with AVX-512, 8 with AVX2 (where GCC lowers a v16 that
 * a loop carries through memory), 4 with SSE only. For loops whose bits do not depend on the lane
 * count. */
#if defined(__AVX512F__)
typedef v16 vnat;
typedef vi16 vinat;
#elif defined(__AVX__)
typedef v8 vnat;
typedef int vinat __attribute__((vector_size(32)));
#else
typedef v4 vnat;
typedef int vinat __attribute__((vector_size(16)));
#endif
enum { NAT = sizeof(vnat) / sizeof(float) };
static inline __attribute__((always_inline)) vnat ldnat(const float *p) {
    vnat v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline vnat selnat(vinat mask, vnat a, vnat b) { return (vnat)(((vinat)a & mask) | ((vinat)b & ~mask)); }
static inline v16 exp16(v16 x) {
    const v16 zero = {0};
    vi16 over = x > 88.7228f, under = x < -87.3365f;
    x = sel16(over, zero + 88.7228f, sel16(under, zero - 87.3365f, x));
    v16 n = x * 1.44269504088896341f + 12582912.0f - 12582912.0f;        /* round to nearest: n in [-126, 128] */
    v16 r = x - n * 0.693359375f + n * 2.12194440e-4f;
    v16 p = zero + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    vi16 ni = __builtin_convertvector(n, vi16), n1 = ni >> 1, n2 = ni - n1;   /* 2^n as 2^n1 2^n2, both normal */
    v16 y = p * (v16)((n1 + 127) << 23) * (v16)((n2 + 127) << 23);
    return sel16(over, zero + INFINITY, sel16(under, zero, y));
}

/* dot(a, b) over n floats in the fixed order: 16 lanes over k = lane (mod 16) in increasing k,
 * hsum16, then the tail [n - n % 16, n) in order */
static inline float dot_fixed(const float *a, const float *b, int n) {
    int k = 0;
#ifdef __AVX512F__
    v16 acc = {0};
    for (; k + 16 <= n; k += 16) acc = acc + ld16(a + k) * ld16(b + k);
    float s = hsum16(acc);
#else   /* AVX2: the two 8-lane halves as two vectors (GCC keeps a lone v16 in memory there) */
    v8 lo = {0}, hi = {0};
    for (; k + 16 <= n; k += 16) lo = lo + ld8(a + k) * ld8(b + k), hi = hi + ld8(a + k + 8) * ld8(b + k + 8);
    float s = hsum8(lo + hi);
#endif
    for (; k < n; k++) s = fmaf(a[k], b[k], s);
    return s;
}

/* dot_fixed(a, b[i], n) for four b at once (four independent chains), results to out[0..3] */
static inline void dot_fixed4(float *out, const float *a, const float *b0, const float *b1, const float *b2,
                              const float *b3, int n) {
    v16 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    int k = 0;
    for (; k + 16 <= n; k += 16) {
        v16 x = ld16(a + k);
        s0 = s0 + x * ld16(b0 + k);
        s1 = s1 + x * ld16(b1 + k);
        s2 = s2 + x * ld16(b2 + k);
        s3 = s3 + x * ld16(b3 + k);
    }
    float r[4];
    hsum4(r, s0, s1, s2, s3);
    for (; k < n; k++) {
        r[0] = fmaf(a[k], b0[k], r[0]);
        r[1] = fmaf(a[k], b1[k], r[1]);
        r[2] = fmaf(a[k], b2[k], r[2]);
        r[3] = fmaf(a[k], b3[k], r[3]);
    }
    memcpy(out, r, sizeof r);
}

/* dot_fixed(a, b + j * stride, n) for j = 0..15 (16 chains, one lane-sum network), results to
 * out[0..15]: the attention scores of a whole 16-key block, where four dot_fixed4 spend more on
 * their lane sums than on the multiply-adds at head_dim 48 */
static inline void dot_fixed16(float *out, const float *a, const float *b, size_t stride, int n) {
    int k = 0;
#ifdef __AVX512F__
    const float *b0 = b, *b4 = b + 4 * stride, *b8 = b + 8 * stride, *b12 = b + 12 * stride;
    size_t s1 = stride, s2 = 2 * stride, s3 = 3 * stride;
    v16 c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0}, c4 = {0}, c5 = {0}, c6 = {0}, c7 = {0};
    v16 c8 = {0}, c9 = {0}, c10 = {0}, c11 = {0}, c12 = {0}, c13 = {0}, c14 = {0}, c15 = {0};
    for (; k + 16 <= n; k += 16) {
        v16 x = ld16(a + k);
        c0 = c0 + x * ld16(b0 + k); c1 = c1 + x * ld16(b0 + s1 + k); c2 = c2 + x * ld16(b0 + s2 + k); c3 = c3 + x * ld16(b0 + s3 + k);
        c4 = c4 + x * ld16(b4 + k); c5 = c5 + x * ld16(b4 + s1 + k); c6 = c6 + x * ld16(b4 + s2 + k); c7 = c7 + x * ld16(b4 + s3 + k);
        c8 = c8 + x * ld16(b8 + k); c9 = c9 + x * ld16(b8 + s1 + k); c10 = c10 + x * ld16(b8 + s2 + k); c11 = c11 + x * ld16(b8 + s3 + k);
        c12 = c12 + x * ld16(b12 + k); c13 = c13 + x * ld16(b12 + s1 + k); c14 = c14 + x * ld16(b12 + s2 + k); c15 = c15 + x * ld16(b12 + s3 + k);
    }
    v16 r = hsum16x16(c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15);
    memcpy(out, &r, sizeof r);
#else   /* AVX2: four keys at a time, both 8-lane halves (8 accumulators in the 16 ymm registers) */
    v8 sums[16];
    for (int g = 0; g < 16; g += 4) {
        const float *b0 = b + g * stride, *b1 = b0 + stride, *b2 = b1 + stride, *b3 = b2 + stride;
        v8 l0 = {0}, l1 = {0}, l2 = {0}, l3 = {0}, h0 = {0}, h1 = {0}, h2 = {0}, h3 = {0};
        for (k = 0; k + 16 <= n; k += 16) {
            v8 xl = ld8(a + k), xh = ld8(a + k + 8);
            l0 = l0 + xl * ld8(b0 + k); h0 = h0 + xh * ld8(b0 + k + 8);
            l1 = l1 + xl * ld8(b1 + k); h1 = h1 + xh * ld8(b1 + k + 8);
            l2 = l2 + xl * ld8(b2 + k); h2 = h2 + xh * ld8(b2 + k + 8);
            l3 = l3 + xl * ld8(b3 + k); h3 = h3 + xh * ld8(b3 + k + 8);
        }
        sums[g] = l0 + h0, sums[g + 1] = l1 + h1, sums[g + 2] = l2 + h2, sums[g + 3] = l3 + h3;
    }
    hsum16x16_halves(out, sums);
#endif
    for (int j = 0; j < 16 && k < n; j++)
        for (int kk = k; kk < n; kk++) out[j] = fmaf(a[kk], b[j * stride + kk], out[j]);
}

/* ---- bf16 weights: dot_fixed's bits with b read through its exact upcast ----------------------
 * A bf16 value is the top half of an fp32 one, so shifting its 16 bits up gives the fp32 value
 * itself; batch-1 decode streams every weight once, so reading half the bytes is its speed. */
/* The bf16 dot product below reads b 16 values (32 bytes) at a time as 8 dwords: dword i holds
 * b[2i] in its low half and b[2i + 1] in its high half, so `<< 16` gives the fp32 values of the even
 * elements and `& 0xffff0000` those of the odd ones, with no shuffle (a widening move costs a
 * shuffle per 8 values, and the shuffle port, not memory, then sets batch-1 decode's speed). a comes
 * split the same way (eo_split_row, once per row of x for all the weight rows). Lane i of the even
 * accumulator then sums class 2i (elements k = 2i mod 16), lane i of the odd one class 2i + 1, each
 * in increasing k: the very FMA chains of dot_fixed's 16 lanes, in other registers; eo_hsum puts the
 * 16 classes back in dot_fixed's order and adds them with its tree. So the result has dot_fixed's
 * bits on the upcast b, on every ISA (8-lane vectors everywhere). */
typedef unsigned int vu8 __attribute__((vector_size(32)));
/* xs (n) = x (n) with each whole 16-element chunk as its 8 even elements, then its 8 odd ones; the
 * tail (n % 16) as it is */
static inline void eo_split_row(float *xs, const float *x, int n) {
    int k = 0;
    for (; k + 16 <= n; k += 16)
        for (int i = 0; i < 8; i++) xs[k + i] = x[k + 2 * i], xs[k + 8 + i] = x[k + 2 * i + 1];
    for (; k < n; k++) xs[k] = x[k];
}
static inline __attribute__((always_inline)) float eo_hsum(v8 e, v8 o) {
    v8 lo = __builtin_shufflevector(e, o, 0, 8, 1, 9, 2, 10, 3, 11);    /* classes 0..7 */
    v8 hi = __builtin_shufflevector(e, o, 4, 12, 5, 13, 6, 14, 7, 15);  /* classes 8..15 */
    return hsum8(lo + hi);
}
/* dot_fixed(x, upcast(b), n), xs = eo_split_row(x): one row of b streamed front to back */
static inline __attribute__((always_inline)) float dot_split_bf16(const float *xs, const unsigned short *b, int n) {
    v8 e = {0}, o = {0};
    int k = 0;
    for (; k + 16 <= n; k += 16) {
        vu8 u;
        memcpy(&u, b + k, sizeof u);
        e = e + ld8(xs + k) * (v8)(u << 16);
        o = o + ld8(xs + k + 8) * (v8)(u & 0xffff0000u);
    }
    float s = eo_hsum(e, o);
    for (; k < n; k++) s = fmaf(xs[k], bf16_to_f32(b[k]), s);
    return s;
}
#endif
