/* ops.c — CPU forward kernels (the oracle for CUDA): the batch-invariant matmul, attention over the
 * paged cache, and plain loops for the rest (the rows of the vocabulary: vocab.c). Owns no memory and does no communication. */
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/attention_row.h"
#include "kernels/cpu/vec.h"
#include <cblas.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <omp.h>
#include <math.h>
#include <string.h>

/* One thread pool: we link OpenBLAS's OpenMP build, so it and our kernels share libgomp's pool.
 * (With the pthread build, two pools spinning on 2 cores halved both: 2-thread matmul fell from
 * 93 to 25 GFLOP/s.) */
int cpu_default_threads(void) {
    cpu_set_t set;
    int mine = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    int local = ls && atoi(ls) > 0 ? atoi(ls) : 1;
    int n = mine < online ? mine : mine / local;   /* bound by the launcher: already this rank's share */
    return n > 0 ? n : 1;
}

int cpu_set_threads(int n) {
    n = n > 0 ? n : cpu_default_threads();
    openblas_set_num_threads(n);
    omp_set_num_threads(n);
    return n;
}

/* ---- batch-invariant matmul ---------------------------------------------------------------
 * Every output element is dot(x_row, w_row) computed the same way wherever it sits: 16 lanes
 * accumulate k = lane (mod 16) with fused multiply-adds in increasing k, the lanes are summed by a
 * fixed tree, then the k tail is added in order, then the bias. Tiling (4 rows x 4 outputs, for
 * register reuse), batch size and the thread split only choose WHICH elements are computed
 * together, never how: the same token gives the same bits at batch 1 and batch 64, in generation
 * and in training. (OpenBLAS's sgemm does not: its small-matrix path rounds differently.) The lanes
 * and the tree are vec.h's, shared with attention. */

/* dot_fixed over each of `leaves` runs of K / leaves elements, the runs' sums added by tree_sum
 * (kernels.h): the tp-invariant dot product of a row-parallel layer; leaves = 1 is dot_fixed */
static inline float dot_leaves(const float *x, const float *w, int K, int leaves) {
    if (leaves == 1) return dot_fixed(x, w, K);   /* (the same arithmetic, without the VLA: decode's path) */
    int Kl = K / leaves;
    float part[leaves];   /* (leaves) */
    for (int l = 0; l < leaves; l++) part[l] = dot_fixed(x + (size_t)l * Kl, w + (size_t)l * Kl, Kl);
    tree_sum(part, leaves, 1);
    return part[0];
}

/* one element (edges): dot_leaves, then the bias */
static void mm_1x1(float *out, const float *x, const float *w, const float *bias, int K, int leaves) {
    float s = dot_leaves(x, w, K, leaves);
    *out = bias ? s + *bias : s;
}

#ifndef __AVX512F__
/* AVX2 has 16 ymm registers and a v16 takes two: the 4x4 tile's 16 accumulators would spill on
 * every multiply-add (10 GFLOP/s hot where the FMA peak is 80). So there the tile is computed as
 * four blocks of 2 rows x 4 outputs x one 8-lane half (h = 0: lanes 0-7, 1: lanes 8-15), 8
 * accumulators and 6 loads in registers. Lane l still sums x[k + l] w[k + l] for k = 0, 16, 32, ...
 * in order, so every accumulator gets the AVX-512 tile's bits. acc[4 r + j] (v8) for row r, output j. */
static void mm_2x4_half(v8 *acc, const float *x0, const float *x1, const float *w0, const float *w1,
                        const float *w2, const float *w3, int K16) {
    v8 a00 = {0}, a01 = {0}, a02 = {0}, a03 = {0}, a10 = {0}, a11 = {0}, a12 = {0}, a13 = {0};
    for (int k = 0; k < K16; k += 16) {
        v8 p0 = ld8(x0 + k), p1 = ld8(x1 + k), q0 = ld8(w0 + k), q1 = ld8(w1 + k), q2 = ld8(w2 + k), q3 = ld8(w3 + k);
#ifdef __AVX__   /* (without AVX a v8 is two of SSE's registers: no pinning, it only has to build) */
        __asm__("" : "+v"(p0), "+v"(p1), "+v"(q0), "+v"(q1), "+v"(q2), "+v"(q3));   /* loaded once (as above) */
#endif
        a00 = a00 + p0 * q0; a01 = a01 + p0 * q1; a02 = a02 + p0 * q2; a03 = a03 + p0 * q3;
        a10 = a10 + p1 * q0; a11 = a11 + p1 * q1; a12 = a12 + p1 * q2; a13 = a13 + p1 * q3;
    }
    acc[0] = a00, acc[1] = a01, acc[2] = a02, acc[3] = a03, acc[4] = a10, acc[5] = a11, acc[6] = a12, acc[7] = a13;
}
#endif

/* 4 rows of x by 4 rows of w, 16 accumulators in registers */
static void mm_4x4(float *out, size_t ldo, const float *x, size_t ldx, const float *w, size_t ldw,
                   const float *bias, int K) {
    const float *x0 = x, *x1 = x + ldx, *x2 = x + 2 * ldx, *x3 = x + 3 * ldx;
    const float *w0 = w, *w1 = w + ldw, *w2 = w + 2 * ldw, *w3 = w + 3 * ldw;
#ifdef __AVX512F__
    v16 a00 = {0}, a01 = {0}, a02 = {0}, a03 = {0}, a10 = {0}, a11 = {0}, a12 = {0}, a13 = {0};
    v16 a20 = {0}, a21 = {0}, a22 = {0}, a23 = {0}, a30 = {0}, a31 = {0}, a32 = {0}, a33 = {0};
    int k = 0;
    for (; k + 16 <= K; k += 16) {
        v16 p0 = ld16(x0 + k), p1 = ld16(x1 + k), p2 = ld16(x2 + k), p3 = ld16(x3 + k);
        v16 q0 = ld16(w0 + k), q1 = ld16(w1 + k), q2 = ld16(w2 + k), q3 = ld16(w3 + k);
        /* keep the loaded vectors in registers: folded into each FMA they would be loaded 4 times,
         * and the loop becomes load-bound */
        __asm__("" : "+v"(p0), "+v"(p1), "+v"(p2), "+v"(p3), "+v"(q0), "+v"(q1), "+v"(q2), "+v"(q3));
        a00 = a00 + p0 * q0; a01 = a01 + p0 * q1; a02 = a02 + p0 * q2; a03 = a03 + p0 * q3;
        a10 = a10 + p1 * q0; a11 = a11 + p1 * q1; a12 = a12 + p1 * q2; a13 = a13 + p1 * q3;
        a20 = a20 + p2 * q0; a21 = a21 + p2 * q1; a22 = a22 + p2 * q2; a23 = a23 + p2 * q3;
        a30 = a30 + p3 * q0; a31 = a31 + p3 * q1; a32 = a32 + p3 * q2; a33 = a33 + p3 * q3;
    }
#else
    int k = K & ~15;
    v8 lo[16], hi[16];   /* [4 row + output]: lanes 0-7 and 8-15 */
    mm_2x4_half(lo, x0, x1, w0, w1, w2, w3, k);
    mm_2x4_half(lo + 8, x2, x3, w0, w1, w2, w3, k);
    mm_2x4_half(hi, x0 + 8, x1 + 8, w0 + 8, w1 + 8, w2 + 8, w3 + 8, k);
    mm_2x4_half(hi + 8, x2 + 8, x3 + 8, w0 + 8, w1 + 8, w2 + 8, w3 + 8, k);
#endif
    /* lane sums of the 16 accumulators at once (hsum16's tree), then the k tail in order and the
     * bias: exactly mm_1x1's arithmetic (dot_fixed, then the bias) per element */
    float r[16];
#ifdef __AVX512F__
    v16 r16 = hsum16x16(a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, a30, a31, a32, a33);
    memcpy(r, &r16, sizeof r);
#else
    v8 sums[16];   /* hsum16x16's first stage (lane i + lane i + 8) is lo + hi here */
    for (int i = 0; i < 16; i++) sums[i] = lo[i] + hi[i];
    hsum16x16_halves(r, sums);
#endif
    for (int i = 0; i < 4; i++) memcpy(out + i * ldo, r + 4 * i, 4 * sizeof(float));
    if (k < K || bias) {
        const float *xs[4] = {x0, x1, x2, x3}, *ws[4] = {w0, w1, w2, w3};
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) {
                float s = out[i * ldo + j];
                for (int kk = k; kk < K; kk++) s = fmaf(xs[i][kk], ws[j][kk], s);
                out[i * ldo + j] = bias ? s + bias[j] : s;
            }
    }
}

/* The rows [j0, j0 + rows) of w (ld n_in) as fp32: w itself (F32), or their exact upcast (BF16) in
 * this thread's buffer, kept between calls and grown to the largest tile seen (the kernels' one
 * allocation: a pool thread lives as long as the process). Upcast once per tile, the rows are then
 * reused by every row group, so a BF16 weight costs its conversion once per 64 rows of x. */
static const float *tile_weights(const void *w, DType wt, int j0, int rows, int n_in) {
    if (wt == DTYPE_F32) return (const float *)w + (size_t)j0 * n_in;
    static _Thread_local float *buf;
    static _Thread_local size_t cap;
    size_t n = (size_t)rows * n_in;
    if (n > cap) {
        free(buf);
        buf = malloc(sizeof(float) * n);
        if (!buf) { fprintf(stderr, "cpu_matmul: out of memory for a %zu-float weight tile\n", n); abort(); }
        cap = n;
    }
    const uint16_t *src = (const uint16_t *)w + (size_t)j0 * n_in;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {   /* 16 at a time: dword k holds elements 2k, 2k + 1 (vec.h) */
        vu8 u;
        memcpy(&u, src + i, sizeof u);
        v8 e = (v8)(u << 16), o = (v8)(u & 0xffff0000u);
        v8 lo = __builtin_shufflevector(e, o, 0, 8, 1, 9, 2, 10, 3, 11), hi = __builtin_shufflevector(e, o, 4, 12, 5, 13, 6, 14, 7, 15);
        memcpy(buf + i, &lo, sizeof lo);
        memcpy(buf + i + 8, &hi, sizeof hi);
    }
    for (; i < n; i++) buf[i] = bf16_to_f32(src[i]);
    return buf;
}

/* Output tile ot (4 outputs) of o for x rows [n0, n1), each output over `leaves` runs of n_in
 * (dot_leaves). xs: x split for dot_split_bf16 run by run (bf16 weights and N <= 4: decode), else
 * NULL */
static void matmul_tile(const MatmulOut *o, DType wt, const float *x, const float *xs, int n_in, int leaves, int n0,
                        int n1, int ot) {
    int n_out = o->n_out, n_otiles = (n_out + 3) / 4, j0 = ot * 4, ro = n_out - j0 < 4 ? n_out - j0 : 4;
    int Kl = n_in / leaves;
    float *out = o->out;
    if (xs) {
        /* decode: each bf16 row read once, front to back, straight from the weights (half the
         * bytes of fp32, no buffer in between; one stream at a time, as the fp32 path reads them),
         * dot_leaves' bits on the upcast */
        const uint16_t *wb = (const uint16_t *)o->w + (size_t)j0 * n_in;   /* (ro, n_in) */
        float part[leaves];                                                /* (leaves) */
        for (int n = n0; n < n1; n++)
            for (int j = 0; j < ro; j++) {
                for (int l = 0; l < leaves; l++)
                    part[l] = dot_split_bf16(xs + (size_t)n * n_in + (size_t)l * Kl, wb + (size_t)j * n_in + (size_t)l * Kl, Kl);
                if (leaves > 1) tree_sum(part, leaves, 1);
                out[(size_t)n * n_out + j0 + j] = o->bias ? part[0] + weight_at(o->bias, wt, (size_t)j0 + j) : part[0];
            }
        return;
    }
    const float *w = tile_weights(o->w, wt, j0, ro, n_in);   /* (ro, n_in) */
    float bias_f[4], *bias = NULL;                            /* (ro) */
    if (o->bias) {
        bias = bias_f;
        for (int j = 0; j < ro; j++) bias[j] = weight_at(o->bias, wt, (size_t)j0 + j);
    }
    for (int n = n0; n < n1; n += 4) {
        int rn = n1 - n < 4 ? n1 - n : 4;
        /* this tile's w rows are read from memory once and then reused from cache by every row
         * group: fetch the next tile's rows into L2 ahead, a share per row group, so the first group
         * does not wait on DRAM (at N <= 4 the hardware prefetcher streams w better alone). Only
         * speed: the arithmetic is unchanged. */
        if (ot + 1 < n_otiles && n1 - n0 > 4)
            prefetch_part((const char *)o->w + (size_t)(j0 + 4) * n_in * dtype_size(wt), (size_t)4 * n_in * dtype_size(wt),
                          (size_t)(n - n0) / 4, (size_t)(n1 - n0 + 3) / 4);
        if (rn == 4 && ro == 4 && leaves == 1) {
            mm_4x4(out + (size_t)n * n_out + j0, n_out, x + (size_t)n * n_in, n_in, w, n_in, bias, n_in);
            continue;
        }
        if (rn == 4 && ro == 4) {   /* the tile run by run (4 x 4 results each), then tree_sum: mm_1x1's bits */
            float part[leaves * 16];   /* (leaves, 4, 4) */
            for (int l = 0; l < leaves; l++)
                mm_4x4(part + 16 * l, 4, x + (size_t)n * n_in + (size_t)l * Kl, n_in, w + (size_t)l * Kl, n_in, NULL, Kl);
            tree_sum(part, leaves, 16);
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++)
                    out[(size_t)(n + i) * n_out + j0 + j] = bias ? part[4 * i + j] + bias[j] : part[4 * i + j];
            continue;
        }
        for (int i = 0; i < rn; i++)
            for (int j = 0; j < ro; j++)
                mm_1x1(out + (size_t)(n + i) * n_out + j0 + j, x + (size_t)(n + i) * n_in, w + (size_t)j * n_in,
                       bias ? bias + j : NULL, n_in, leaves);
    }
}

/* cpu_matmuls with every output over `leaves` runs of n_in (dot_leaves) */
static void matmuls_leaves(const float *x, int N, int n_in, const MatmulOut *outs, int n, DType wt, int leaves) {
    if (leaves < 1 || n_in % leaves || (leaves & (leaves - 1)) || leaves > 64) {
        fprintf(stderr, "cpu_matmul: %d leaves of %d inputs (a power of two up to 64 that divides them)\n", leaves, n_in);
        abort();
    }
    /* Cache blocking: runs of 2 x MM_BLOCK inputs or more are cut into a power-of-two number of runs
     * of at least MM_BLOCK (a finer tree of the same kind), so a tile's 4 rows of x and 4 of w stay
     * in L1 over a run: at D = 2048, q_proj and gate_proj took 37% less time at N = 32 and 512
     * (bench --kernels, 1 thread, same run); at D = 768 a cut was 10% slower, so runs under 1024
     * stay whole. It depends on a run's length only: batch invariance holds, and tp invariance (a
     * leaf's length is the same at every tp). */
    enum { MM_BLOCK = 512 };
    while (leaves < 64 && n_in % (2 * leaves) == 0 && n_in / (2 * leaves) >= MM_BLOCK) leaves *= 2;
    if (wt == DTYPE_BF16 && cpu_bf16_dot_native()) { cpu_matmul_native(x, N, n_in, outs, n, leaves); return; }
    /* decode with bf16 weights: x split once for every weight row (dot_split_bf16), run by run */
    int split = wt == DTYPE_BF16 && N <= 4, Kl = n_in / leaves;
    float xs[split ? (size_t)N * n_in : 1];   /* (N, n_in): at most 4 rows, on this thread's stack */
    for (int r = 0; split && r < N; r++)
        for (int l = 0; l < leaves; l++)
            eo_split_row(xs + (size_t)r * n_in + (size_t)l * Kl, x + (size_t)r * n_in + (size_t)l * Kl, Kl);
    int first[n + 1];   /* the tiles of outs[j] are first[j] .. first[j + 1] - 1 */
    first[0] = 0;
    for (int j = 0; j < n; j++) first[j + 1] = first[j] + (outs[j].n_out + 3) / 4;
    int tiles = first[n];
    enum { ROW_BLOCK = 64 };   /* rows of x kept hot in cache while a thread sweeps its w rows */
    for (int n0 = 0; n0 < N && tiles > 0; n0 += ROW_BLOCK) {
        int n1 = n0 + ROW_BLOCK < N ? n0 + ROW_BLOCK : N;
#pragma omp parallel for schedule(static) if (tiles > 4)
        for (int t = 0; t < tiles; t++) {
            int j = 0;
            while (t >= first[j + 1]) j++;
            matmul_tile(&outs[j], wt, x, split ? xs : NULL, n_in, leaves, n0, n1, t - first[j]);
        }
    }
}

void cpu_matmuls(const float *x, int N, int n_in, const MatmulOut *outs, int n, DType wt) {
    matmuls_leaves(x, N, n_in, outs, n, wt, 1);
}

void cpu_matmul(float *out, const float *x, const void *w, const void *bias, DType wt, int N, int n_in, int n_out,
                int leaves) {
    matmuls_leaves(x, N, n_in, &(MatmulOut){out, w, bias, n_out}, 1, wt, leaves);
}

void cpu_pack(void *dst, DType t, const float *src, size_t n) {
    if (t == DTYPE_F32) { memcpy(dst, src, sizeof(float) * n); return; }
    uint16_t *d = dst;
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
    for (size_t i = 0; i < n; i++) d[i] = f32_to_bf16(src[i]);
}

void cpu_unpack(float *dst, const void *src, DType t, size_t n) {
    if (t == DTYPE_F32) { memcpy(dst, src, sizeof(float) * n); return; }
    const uint16_t *s = src;
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
    for (size_t i = 0; i < n; i++) dst[i] = bf16_to_f32(s[i]);
}

void cpu_round_to(float *x, size_t n, DType t) {
    if (t != DTYPE_BF16) return;
#pragma omp parallel for schedule(static) if (n >= (1 << 16))
    for (size_t i = 0; i < n; i++) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
}

/* Elementwise kernels split rows or elements over threads only when there is enough work to pay
 * for waking them; each element's arithmetic is the same either way. */
enum { PAR_MIN = 1 << 14 };

void cpu_rmsnorm(float *out, const float *x, const void *w, DType wt, int N, int D, float eps) {
#pragma omp parallel for schedule(static) if ((size_t)N * D >= PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * D;
        float *o = out + (size_t)n * D;
        float ss = dot_fixed(xr, xr, D);   /* 16 lanes, not one serial chain of D adds */
        float scale = 1.0f / sqrtf(ss / D + eps);
        if (wt == DTYPE_F32)
            for (int i = 0; i < D; i++) o[i] = ((const float *)w)[i] * (xr[i] * scale);
        else
            for (int i = 0; i < D; i++) o[i] = weight_at(w, wt, i) * (xr[i] * scale);
    }
}

void cpu_rope_table(float *cs, const int *pos, const float *inv_freq, int N, int Dh) {
    int half = Dh / 2;
    for (int n = 0; n < N; n++)
        for (int i = 0; i < half; i++) {
            float angle = (float)pos[n] * inv_freq[i];
            cs[(size_t)n * Dh + i] = cosf(angle);
            cs[(size_t)n * Dh + half + i] = sinf(angle);
        }
}

void cpu_rope(float *x, const float *cs, int N, int n_heads, int Dh) { rope_rotate(x, cs, N, n_heads, Dh, 1.0f); }

/* o[c * 16 .. c * 16 + 15] for c < nch (a constant after inlining) += p[j] * v_j[c * 16 ...] over keys
 * j = ja..jb (v: key ja, `row` floats between keys), one FMA per key in increasing j. The
 * accumulators start from o and go back to it, so a row summed block by block gets the bits it
 * would get in registers throughout. */
static inline __attribute__((always_inline)) void pv_cols(float *o, const float *p, const float *v, size_t row,
                                                          int ja, int jb, int nch) {
    /* nv native vectors (1-4 with AVX-512, 2-8 with AVX2), named, not an array: GCC keeps them in
     * registers; each element's FMAs are the same either way */
    const int nv = nch * 16 / NAT;
    vnat a0 = ldnat(o), a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
    if (nv > 1) a1 = ldnat(o + NAT);
    if (nv > 2) a2 = ldnat(o + 2 * NAT);
    if (nv > 3) a3 = ldnat(o + 3 * NAT);
    if (nv > 4) a4 = ldnat(o + 4 * NAT);
    if (nv > 5) a5 = ldnat(o + 5 * NAT);
    if (nv > 6) a6 = ldnat(o + 6 * NAT);
    if (nv > 7) a7 = ldnat(o + 7 * NAT);
    for (int j = ja; j <= jb; j++, v += row) {
        float pj = p[j];
        a0 = a0 + pj * ldnat(v);
        if (nv > 1) a1 = a1 + pj * ldnat(v + NAT);
        if (nv > 2) a2 = a2 + pj * ldnat(v + 2 * NAT);
        if (nv > 3) a3 = a3 + pj * ldnat(v + 3 * NAT);
        if (nv > 4) a4 = a4 + pj * ldnat(v + 4 * NAT);
        if (nv > 5) a5 = a5 + pj * ldnat(v + 5 * NAT);
        if (nv > 6) a6 = a6 + pj * ldnat(v + 6 * NAT);
        if (nv > 7) a7 = a7 + pj * ldnat(v + 7 * NAT);
    }
    memcpy(o, &a0, sizeof a0);
    if (nv > 1) memcpy(o + NAT, &a1, sizeof a1);
    if (nv > 2) memcpy(o + 2 * NAT, &a2, sizeof a2);
    if (nv > 3) memcpy(o + 3 * NAT, &a3, sizeof a3);
    if (nv > 4) memcpy(o + 4 * NAT, &a4, sizeof a4);
    if (nv > 5) memcpy(o + 5 * NAT, &a5, sizeof a5);
    if (nv > 6) memcpy(o + 6 * NAT, &a6, sizeof a6);
    if (nv > 7) memcpy(o + 7 * NAT, &a7, sizeof a7);
}

/* o (Dh) += sum over keys ja..jb of p[j] v_j: up to 64 columns at a time in registers, then singly */
static void pv_block(float *o, const float *p, const float *v, size_t row, int ja, int jb, int Dh) {
    enum { MAX_CH = NAT >= 8 ? 4 : 2 };   /* pv_cols holds 8 native vectors at most */
    int d0 = 0;
    for (int nch; (nch = (Dh - d0) / 16) > 0; d0 += 16 * nch) {
        if (nch > MAX_CH) nch = MAX_CH;
        switch (nch) {
        case 1: pv_cols(o + d0, p, v + d0, row, ja, jb, 1); break;
        case 2: pv_cols(o + d0, p, v + d0, row, ja, jb, 2); break;
        case 3: pv_cols(o + d0, p, v + d0, row, ja, jb, 3); break;
        default: pv_cols(o + d0, p, v + d0, row, ja, jb, 4); break;
        }
    }
    for (int j = ja; j <= jb && d0 < Dh; j++, v += row)
        for (int d = d0; d < Dh; d++) o[d] = fmaf(p[j], v[d], o[d]);
}

/* d (m, Dh) = the exact fp32 values of m rows of Dh bf16 at s, `row` elements apart: a zero-extend and
 * a shift per element, 16 at a time (the paged cache's rows of one head are contiguous: row == Dh) */
typedef unsigned short vu16x16 __attribute__((vector_size(32)));
typedef unsigned int vu32x16 __attribute__((vector_size(64)));
static inline void upcast_rows(float *d, const uint16_t *s, size_t row, int m, int Dh) {
    size_t n = row == (size_t)Dh ? (size_t)m * Dh : (size_t)Dh;
    for (int r = 0; r < (row == (size_t)Dh ? 1 : m); r++, s += row, d += Dh) {
        size_t i = 0;
        for (; i + 16 <= n; i += 16) {
            vu16x16 h;
            memcpy(&h, s + i, sizeof h);
            vu32x16 u = __builtin_convertvector(h, vu32x16) << 16;
            memcpy(d + i, &u, sizeof u);
        }
        for (; i < n; i++) d[i] = bf16_to_f32(s[i]);
    }
}

static void pv_span(float *o, const float *p, const void *v, DType vt, size_t off, size_t row, int ja, int jb, int Dh,
                    float *buf) {
    if (vt == DTYPE_F32) { pv_block(o, p, (const float *)v + off, row, ja, jb, Dh); return; }
    for (int j = ja; j <= jb; j += 16) {
        int m = jb - j + 1 < 16 ? jb - j + 1 : 16;
        upcast_rows(buf, (const uint16_t *)v + off + (size_t)(j - ja) * row, row, m, Dh);
        pv_block(o, p, buf, Dh, j, j + m - 1, Dh);
    }
}

/* The keys ja..jb of one head in one block (at `off` elements of k, `row` elements between keys) as
 * fp32 for attention_scores / pv_block: an fp32 cache is read in place; a bf16 one (--kv-dtype bf16)
 * is upcast exactly, up to 16 keys at a time, into buf (16 * Dh floats, rows of Dh). Every score and
 * every P.V multiply-add is per key and in increasing j either way, so a bf16 cache gives the bits of
 * an fp32 one holding the same (bf16-valued) numbers: training's rows, rounded where produced. */
static void scores_span(float *p, const float *qh, const void *k, DType kt, size_t off, size_t row, int ja, int jb,
                        int Dh, float *buf) {
    if (kt == DTYPE_F32) { attention_scores(p, qh, (const float *)k + off, row, ja, jb, Dh); return; }
    for (int j = ja; j <= jb; j += 16) {
        int m = jb - j + 1 < 16 ? jb - j + 1 : 16;
        upcast_rows(buf, (const uint16_t *)k + off + (size_t)(j - ja) * row, row, m, Dh);
        attention_scores(p, qh, buf, Dh, j, j + m - 1, Dh);
    }
}
static void pv_span(float *o, const float *p, const void *v, DType vt, size_t off, size_t row, int ja, int jb, int Dh,
                    float *buf);

/* One query row (position i, keys j0..i) for kv heads [hk0, hk1) and their query heads: qi, oi
 * (H * Dh) point at the row; sc (heads of the slice, n_keys) holds their scores. Keys and values
 * are swept block by block, every head of the slice in each block: in the paged cache a block's
 * heads are one contiguous run, so the memory streams instead of restarting per head (decode at
 * batch 32 spends a quarter of its step here, bound by DRAM), and the next block is fetched into L2
 * while this one is computed (the hardware prefetcher does not cross to another block). Every
 * element gets attention_row_exp's arithmetic: the order of blocks and heads changes no bits.
 * k, v: elements of dtype kt (scores_span). */
static void attention_query(float *oi, const float *qi, const void *k, const void *v, DType kt, const KVLayout *kv,
                            int Hkv, int hk0, int hk1, int group, int Dh, int j0, int i, float scale, float *sc,
                            int n_keys) {
    size_t kvd = (size_t)Hkv * Dh, es = dtype_size(kt), block_bytes = (size_t)kv->block * kvd * es;
    const char *kb = k, *vb = v;   /* for the prefetches */
    int h0 = hk0 * group, h1 = hk1 * group, b0 = j0 / kv->block, b1 = i / kv->block, ja, jb;
    float buf[kt == DTYPE_F32 ? 1 : 16 * Dh];   /* (16, Dh) upcast keys or values */
    /* 1. raw scores; the last block fetches the values' first block */
    for (int b = b0; b <= b1; b++) {
        block_span(kv, b, j0, i, &ja, &jb);
        const char *next = b < b1 ? kb + es * kv_offset(kv, kvd, (b + 1) * kv->block) : vb + es * kv_offset(kv, kvd, j0);
        for (int h = h0; h < h1; h++) {
            prefetch_part(next, block_bytes, h - h0, h1 - h0);
            scores_span(sc + (size_t)(h - h0) * n_keys, qi + (size_t)h * Dh, k,
                        kt, kv_offset(kv, kvd, ja) + (size_t)(h / group) * kv->head, kv->row, ja, jb, Dh, buf);
        }
    }
    /* 2. probabilities (the division is exact per element: vectorised) */
    for (int h = h0; h < h1; h++) {
        float *p = sc + (size_t)(h - h0) * n_keys, sum = attention_row_softmax(p, j0, i, scale);
#pragma omp simd
        for (int j = j0; j <= i; j++) p[j] = p[j] / sum;
    }
    /* 3. o = sum_j p_j v_j */
    memset(oi + (size_t)h0 * Dh, 0, sizeof(float) * (size_t)(h1 - h0) * Dh);
    for (int b = b0; b <= b1; b++) {
        block_span(kv, b, j0, i, &ja, &jb);
        for (int h = h0; h < h1; h++) {
            if (b < b1) prefetch_part(vb + es * kv_offset(kv, kvd, (b + 1) * kv->block), block_bytes, h - h0, h1 - h0);
            pv_span(oi + (size_t)h * Dh, sc + (size_t)(h - h0) * n_keys, v, kt,
                    kv_offset(kv, kvd, ja) + (size_t)(h / group) * kv->head, kv->row, ja, jb, Dh, buf);
        }
    }
}

/* cpu_attention on keys and values of dtype kt */
static void attention_typed(float *out, const float *q, const void *k, const void *v, DType kt, const KVLayout *kv,
                            int Tq, int q_pos0, int H, int Hkv, int Dh, int window, float *scratch) {
    int group = H / Hkv, n_keys = q_pos0 + Tq;
    float scale = 1.0f / sqrtf((float)Dh);
    size_t qs = (size_t)H * Dh;
    /* tasks: (query row, slice of kv heads); a lone row (decode of one sequence) is split by kv heads
     * over the threads, more rows each take all heads */
    int slices = 1;
    if (Tq == 1 && !omp_in_parallel()) slices = omp_get_max_threads() < Hkv ? omp_get_max_threads() : Hkv;
#pragma omp parallel for schedule(dynamic) if (Tq * slices > 1 && (size_t)H * Tq * n_keys > 4096)
    for (int task = 0; task < Tq * slices; task++) {
        int t = task / slices, sl = task % slices, i = q_pos0 + t;
        int j0 = (window > 0 && i - window + 1 > 0) ? i - window + 1 : 0;
        float *sc = scratch + (size_t)omp_get_thread_num() * H * n_keys;   /* this thread's scores */
        attention_query(out + t * qs, q + t * qs, k, v, kt, kv, Hkv, Hkv * sl / slices, Hkv * (sl + 1) / slices,
                        group, Dh, j0, i, scale, sc, n_keys);
    }
}

void cpu_attention(float *out, const float *q, const float *k, const float *v, const KVLayout *kv, int Tq,
                   int q_pos0, int H, int Hkv, int Dh, int window, float *scratch) {
    attention_typed(out, q, k, v, DTYPE_F32, kv, Tq, q_pos0, H, Hkv, Dh, window, scratch);
}

/* cpu_kv_store into a cache of dtype kt (BF16: each element rounded to nearest even; exact on the
 * bf16-valued keys and values that --kv-dtype bf16 produces) */
static void kv_store_typed(void *kc, void *vc, DType kt, const float *k, const float *v, const KVLayout *kv,
                           const int *pos, int T, int Hkv, int Dh) {
    size_t kvd = (size_t)Hkv * Dh;
    for (int t = 0; t < T; t++) {
        size_t slot = kv_offset(kv, kvd, pos[t]);
        for (int h = 0; h < Hkv; h++) {
            const float *kr = k + t * kvd + (size_t)h * Dh, *vr = v + t * kvd + (size_t)h * Dh;   /* (Dh) */
            if (kt == DTYPE_F32) {
                memcpy((float *)kc + slot + h * kv->head, kr, sizeof(float) * Dh);
                memcpy((float *)vc + slot + h * kv->head, vr, sizeof(float) * Dh);
                continue;
            }
            uint16_t *kd = (uint16_t *)kc + slot + h * kv->head, *vd = (uint16_t *)vc + slot + h * kv->head;
            for (int d = 0; d < Dh; d++) kd[d] = f32_to_bf16(kr[d]), vd[d] = f32_to_bf16(vr[d]);
        }
    }
}

void cpu_kv_store(float *kc, float *vc, const float *k, const float *v, const KVLayout *kv, const int *pos, int T,
                  int Hkv, int Dh) {
    kv_store_typed(kc, vc, DTYPE_F32, k, v, kv, pos, T, Hkv, Dh);
}

void cpu_kv_store_batch(void *kc, void *vc, const float *k, const float *v, const PagedBatch *pb, int Hkv, int Dh) {
    size_t kvd = (size_t)Hkv * Dh;
    for (int i = 0; i < pb->n_seqs; i++) {
        int t0 = pb->seq_start[i] - pb->seq_start[0];
        KVLayout paged = kv_paged(pb->tables + (size_t)(pb->seq0 + i) * pb->table_stride, pb->block, Dh);
        kv_store_typed(kc, vc, pb->kv_dtype, k + t0 * kvd, v + t0 * kvd, &paged, pb->pos + t0,
                       pb->seq_start[i + 1] - pb->seq_start[i], Hkv, Dh);
    }
}

void cpu_attention_batch(float *out, const float *q, const void *kc, const void *vc, const PagedBatch *pb, int H,
                         int Hkv, int Dh, int window, float *scratch, size_t scratch_stride) {
    size_t qd = (size_t)H * Dh;
#pragma omp parallel for schedule(dynamic) if (pb->n_seqs > 1)
    for (int i = 0; i < pb->n_seqs; i++) {
        int t0 = pb->seq_start[i] - pb->seq_start[0];
        KVLayout paged = kv_paged(pb->tables + (size_t)(pb->seq0 + i) * pb->table_stride, pb->block, Dh);
        attention_typed(out + t0 * qd, q + t0 * qd, kc, vc, pb->kv_dtype, &paged, pb->seq_start[i + 1] - pb->seq_start[i],
                        pb->pos_host[t0], H, Hkv, Dh, window, scratch + (size_t)omp_get_thread_num() * scratch_stride);
    }
}

/* out = silu(g) * u for m <= 16 elements; exp16 overflow -> inf -> -0 */
static inline __attribute__((always_inline)) void swiglu_lanes(float *out, const float *gate, const float *up, size_t m) {
    v16 g = ld16n(gate, m), u = ld16n(up, m);
    st16n(out, g / (1.0f + exp16(-g)) * u, m);
}

void cpu_swiglu(float *out, const float *gate, const float *up, size_t n) {
    size_t n16 = n / 16 * 16;
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n16; i += 16) swiglu_lanes(out + i, gate + i, up + i, 16);
    if (n16 < n) swiglu_lanes(out + n16, gate + n16, up + n16, n - n16);   /* the tail, zero-padded */
}

void cpu_add(float *x, const float *y, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

void cpu_embedding(float *out, const void *table, DType wt, const int *ids, int N, int D, int v0, int V_local) {
    for (int n = 0; n < N; n++) {
        int r = ids[n] - v0;
        float *o = out + (size_t)n * D;
        if (r < 0 || r >= V_local) memset(o, 0, sizeof(float) * D);
        else if (wt == DTYPE_F32) memcpy(o, (const float *)table + (size_t)r * D, sizeof(float) * D);
        else for (int i = 0; i < D; i++) o[i] = weight_at(table, wt, (size_t)r * D + i);
    }
}

void cpu_add_to(float *out, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void cpu_dropout(float *out, const float *x, int N, int cols, int col0, int cols_global, float p, uint64_t key) {
    float k = 1.0f / (1.0f - p);
#pragma omp parallel for schedule(static) if ((size_t)N * cols > 65536)
    for (int n = 0; n < N; n++)
        for (int j = 0; j < cols; j++) {
            size_t e = (size_t)n * cols + j;
            out[e] = dropout_keep(key, (uint64_t)n * cols_global + col0 + j, p) ? x[e] * k : 0.0f;
        }
}

void cpu_scale(float *x, float s, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

void cpu_copy(float *dst, const float *src, size_t n) {
    if (dst != src) memcpy(dst, src, sizeof(float) * n);
}

void cpu_gather_rows(float *out, const float *x, const int *rows, int R, int D) {
    for (int r = 0; r < R; r++) memcpy(out + (size_t)r * D, x + (size_t)rows[r] * D, sizeof(float) * D);
}

