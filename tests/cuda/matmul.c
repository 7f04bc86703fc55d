/* matmul.c — cuda_vs_cpu's matmul and matmuls cases (fp32 and bf16 weights, integers, unaligned
 * operands, leaves), their invariances (rows of any batch, tp, matmuls == matmul, bf16 == fp32) and
 * the SIMT pass of CUDA's bf16 matmul. Owns those cases; the bounds are cuda_vs_cpu.h's comment. */
#include "tests/cuda/cuda_vs_cpu.h"

/* ---- matmul, matmuls ---------------------------------------------------------------------------- */
double dot_mag(const float *a, const float *b, int n) { /* sum |a b| in double */
    double s = 0.0;
    for (int k = 0; k < n; k++) s += fabs((double)a[k] * b[k]);
    return s;
}
/* off 1: x and w one element past an aligned start (4 and 2 bytes for bf16: no 16- or 8-byte loads) */
static void run_matmul_at(const Backend *be, float *out, const float *x, const void *w, const void *bias, DType wt,
                          int N, int n_in, int n_out, int leaves, int off) {
    Dev d = {be, {0}, 0};
    size_t es = dtype_size(wt);
    float *o = dput(&d, NULL, nf(N, n_out));
    float *dx = (float *)dput(&d, NULL, nf(N, n_in) + fb(off)) + off;
    char *dw = (char *)dput(&d, NULL, nw(wt, n_out, n_in) + es * off) + es * off;
    be->to_device(dx, x, nf(N, n_in));
    be->to_device(dw, w, nw(wt, n_out, n_in));
    const void *db = bias ? dput(&d, bias, nw(wt, n_out, 1)) : NULL;
    be->matmul(o, dx, dw, db, wt, N, n_in, n_out, leaves);
    dget(&d, out, o, nf(N, n_out));
    dfree(&d);
}
void run_matmul(const Backend *be, float *out, const float *x, const void *w, const void *bias, DType wt, int N,
                       int n_in, int n_out, int leaves) {
    run_matmul_at(be, out, x, w, bias, wt, N, n_in, n_out, leaves, 0);
}
/* The matmul's bound relative to matmul_mag (the tolerance comment): on a GPU a bf16 weight takes the
 * tensor-core kernel; --self compares the CPU with itself (any bound: it must be 0) */
int tc_mode;   /* the dut's bf16 matmul is the tensor-core kernel (cuda_matmul_set_simt_bf16(0)) */
/* s(n_in) of the tolerance comment: the steps of the longest accumulator chain and the roundings after */
static double tc_steps(int n_in) {
    double s = 0.0;
    for (int l = 1; l <= MMA_MAX_LEAVES; l *= 2) {
        if (n_in % l) break;
        int KL = n_in / l, C = (KL + MMA_K - 1) / MMA_K, R = mma_runs(KL), lg = 0;
        for (int v = l * R; v > 1; v /= 2) lg++;
        s = fmax(s, 4.0 * MMA_K * ((C + R - 1) / R) + 3 + lg);
    }
    return s;
}
static double matmul_tol(DType wt, int n_in) {
    if (wt == DTYPE_BF16 && tc_mode) return gam(n_in + 1) + (1 + 0x1p-7) * gam(tc_steps(n_in));
    return 2 * gam(n_in + 1);
}
/* mag (N, n_out) = sum_k |x w| + |bias| */
static double *matmul_mag(const float *x, const float *wf, const float *bf, int N, int n_in, int n_out) {
    double *mag = dzeros((size_t)N * n_out);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int j = 0; j < n_out; j++)
            mag[(size_t)n * n_out + j] =
                dot_mag(x + (size_t)n * n_in, wf + (size_t)j * n_in, n_in) + (bf ? fabs(bf[j]) : 0.0);
    return mag;
}
/* leaves: the tree of leaf sums (kernels.h) adds log2(leaves) roundings to a leaf's n_in / leaves:
 * within the bound of n_in + 1 */
static void case_matmul(int N, int n_in, int n_out, int with_bias, DType wt, int leaves) {
    cur_entry = "matmul";
    void *w, *b = NULL;
    float *x = rand_f32((size_t)N * n_in, 1.0f), *wf = rand_weight(&w, wt, (size_t)n_out * n_in, 1.0f);
    float *bf = with_bias ? rand_weight(&b, wt, n_out, 1.0f) : NULL;
    size_t no = (size_t)N * n_out;
    float *want = xmalloc(fb(no)), *got = xmalloc(fb(no));
    run_matmul(ref, want, x, w, b, wt, N, n_in, n_out, leaves);
    run_matmul(dut, got, x, w, b, wt, N, n_in, n_out, leaves);
    double *mag = matmul_mag(x, wf, bf, N, n_in, n_out);
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,n_in=%d,n_out=%d%s,leaves=%d", N, n_in, n_out, with_bias ? ",bias" : "", leaves);
    cmp_tol("matmul", wt, sh, got, want, no, mag, matmul_tol(wt, n_in), 0.0);
    free(x), free(w), free(wf), free(b), free(bf), free(want), free(got), free(mag);
}
/* x and w one element past an aligned start (no vector loads): within the bound of the ref, and the
 * dut's bits of the aligned call (the same values in the same order, element by element) */
static void case_matmul_unaligned(int N, int n_in, int n_out, DType wt, int leaves) {
    cur_entry = "matmul";
    void *w, *b;
    float *x = rand_f32((size_t)N * n_in, 1.0f), *wf = rand_weight(&w, wt, (size_t)n_out * n_in, 1.0f);
    float *bf = rand_weight(&b, wt, n_out, 1.0f);
    size_t no = (size_t)N * n_out;
    float *want = xmalloc(fb(no)), *got = xmalloc(fb(no)), *aligned = xmalloc(fb(no));
    run_matmul_at(ref, want, x, w, b, wt, N, n_in, n_out, leaves, 1);
    run_matmul_at(dut, got, x, w, b, wt, N, n_in, n_out, leaves, 1);
    run_matmul_at(dut, aligned, x, w, b, wt, N, n_in, n_out, leaves, 0);
    double *mag = matmul_mag(x, wf, bf, N, n_in, n_out);
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,n_in=%d,n_out=%d,bias,leaves=%d,unaligned", N, n_in, n_out, leaves);
    cmp_tol("matmul", wt, sh, got, want, no, mag, matmul_tol(wt, n_in), 0.0);
    cmp_bits("inv.matmul_unaligned", wt, sh, got, aligned, no);
    free(x), free(w), free(wf), free(b), free(bf), free(want), free(got), free(aligned), free(mag);
}

/* x: odd integers of `bits` bits (12: n_in <= 4096; 20: n_in <= 15), w: +-1, bias: integers below 1000:
 * exact in any order */
static void case_matmul_ints(int N, int n_in, int n_out, DType wt, int bits) {
    cur_entry = "matmul";
    float *x = rand_ints((size_t)N * n_in, bits), *wf = rand_ints((size_t)n_out * n_in, 0), *bf = xmalloc(fb(n_out));
    for (int j = 0; j < n_out; j++) bf[j] = (float)(rand_int(1999) - 999);
    void *w = store_weight(wf, wt, (size_t)n_out * n_in), *b = store_weight(bf, wt, n_out);
    float *want = xmalloc(nf(N, n_out)), *got = xmalloc(nf(N, n_out));
    run_matmul(ref, want, x, w, b, wt, N, n_in, n_out, 1);
    run_matmul(dut, got, x, w, b, wt, N, n_in, n_out, 1);
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,n_in=%d,n_out=%d,bias,ints%d_exact", N, n_in, n_out, bits);
    cmp_exact("matmul", wt, sh, got, want, (size_t)N * n_out);
    free(x), free(w), free(wf), free(b), free(bf), free(want), free(got);
}

/* Up to 4 weights read the same x. */
typedef struct {
    int n;
    int n_out[4];
    void *w[4], *b[4];    /* host, in the call's dtype; b[j] NULL: no bias */
    float *wf[4], *bf[4]; /* their fp32 values */
} MatmulSet;
static MatmulSet matmul_set(int n, const int *n_out, const int *bias, int n_in, DType wt) {
    MatmulSet s = {.n = n};
    for (int j = 0; j < n; j++) {
        s.n_out[j] = n_out[j];
        s.wf[j] = rand_weight(&s.w[j], wt, (size_t)n_out[j] * n_in, 1.0f);
        s.bf[j] = bias[j] ? rand_weight(&s.b[j], wt, n_out[j], 1.0f) : NULL;
    }
    return s;
}
static void free_set(MatmulSet *s) {
    for (int j = 0; j < s->n; j++) free(s->w[j]), free(s->b[j]), free(s->wf[j]), free(s->bf[j]);
}
static void run_matmuls(const Backend *be, float **outs, const float *x, int N, int n_in, const MatmulSet *s, DType wt) {
    Dev d = {be, {0}, 0};
    MatmulOut mo[4];
    const float *dx = dput(&d, x, nf(N, n_in));
    for (int j = 0; j < s->n; j++) {
        mo[j].out = dput(&d, NULL, nf(N, s->n_out[j]));
        mo[j].w = dput(&d, s->w[j], nw(wt, s->n_out[j], n_in));
        mo[j].bias = s->b[j] ? dput(&d, s->b[j], nw(wt, s->n_out[j], 1)) : NULL;
        mo[j].n_out = s->n_out[j];
    }
    be->matmuls(dx, N, n_in, mo, s->n, wt);
    for (int j = 0; j < s->n; j++) dget(&d, outs[j], mo[j].out, nf(N, s->n_out[j]));
    dfree(&d);
}
static void case_matmuls(int N, int n_in, int n, const int *n_out, const int *bias, DType wt) {
    cur_entry = "matmuls";
    MatmulSet s = matmul_set(n, n_out, bias, n_in, wt);
    float *x = rand_f32((size_t)N * n_in, 1.0f), *want[4], *got[4];
    for (int j = 0; j < n; j++) want[j] = xmalloc(nf(N, n_out[j])), got[j] = xmalloc(nf(N, n_out[j]));
    run_matmuls(ref, want, x, N, n_in, &s, wt);
    run_matmuls(dut, got, x, N, n_in, &s, wt);
    for (int j = 0; j < n; j++) {
        double *mag = matmul_mag(x, s.wf[j], s.bf[j], N, n_in, n_out[j]);
        char sh[96];
        snprintf(sh, sizeof sh, "N=%d,n_in=%d,out=%d/%d,n_out=%d%s", N, n_in, j + 1, n, n_out[j], bias[j] ? ",bias" : "");
        cmp_tol("matmuls", wt, sh, got[j], want[j], (size_t)N * n_out[j], mag, matmul_tol(wt, n_in), 0.0);
        free(mag), free(want[j]), free(got[j]);
    }
    free(x);
    free_set(&s);
}

/* ---- the dut's own invariances, bit for bit ------------------------------------------------------------ */
/* rows of one N = 512 call == each row alone (N = 1) == the rows of calls of 7, 8, 20, 37 and 64 rows
 * at offsets 0, s, 2s, ... and 512 - s (x and the output offset in the dut's memory): every tile
 * variant of the CUDA kernels (decode, batched, prefill; a tile's runs over a block's warps or in
 * turn) and every position of a row in a tile */
/* bf16x: x bf16-valued (the forward's matmul inputs in bf16 mode): N > 32 takes the tensor cores'
 * hi-only kernel where its shape allows (checked it did), N <= 32 the decode kernels */
void inv_matmul_batch_x(int n_in, int n_out, int with_bias, DType wt, int leaves, int bf16x) {
    cur_entry = "inv";
    enum { N = 512 };
    void *w, *b = NULL;
    float *x = rand_f32((size_t)N * n_in, 1.0f), *wf = rand_weight(&w, wt, (size_t)n_out * n_in, 1.0f);
    if (bf16x)
        for (size_t i = 0; i < (size_t)N * n_in; i++) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
    float *bf = with_bias ? rand_weight(&b, wt, n_out, 1.0f) : NULL;
    float *all = xmalloc(nf(N, n_out)), *part = xmalloc(nf(N, n_out));
    Dev d = {dut, {0}, 0};
    float *dx = dput(&d, x, nf(N, n_in)), *o = dput(&d, NULL, nf(N, n_out)), *o2 = dput(&d, NULL, nf(N, n_out));
    const void *dw = dput(&d, w, nw(wt, n_out, n_in)), *db = b ? dput(&d, b, nw(wt, n_out, 1)) : NULL;
    dut->matmul(o, dx, dw, db, wt, N, n_in, n_out, leaves);
    dget(&d, all, o, nf(N, n_out));
    if (bf16x && wt == DTYPE_BF16) {
        char shp[96];
        snprintf(shp, sizeof shp, "N=512,n_in=%d,n_out=%d,leaves=%d,bf16_x", n_in, n_out, leaves);
        int want = hi_expected(N, n_in, n_out, leaves);
        report("inv.tc_hi_taken", DTYPE_BF16, shp, 0.0, 0.0, 0.0, want < 0 || cuda_matmul_tc_hi_taken() == want);
    }
    const int sizes[] = {1, 7, 8, 20, 37, 64};
    for (int i = 0; i < 6; i++) {
        int s = sizes[i];
        dut->zero(o2, nf(N, n_out));
        for (int r0 = 0; r0 < N; r0 += s) {
            int at = r0 + s <= N ? r0 : N - s;   /* the last call ends at row 512 */
            dut->matmul(o2 + (size_t)at * n_out, dx + (size_t)at * n_in, dw, db, wt, s, n_in, n_out, leaves);
        }
        dget(&d, part, o2, nf(N, n_out));
        char sh[96];
        snprintf(sh, sizeof sh, "N=512_vs_%d,n_in=%d,n_out=%d%s,leaves=%d%s", s, n_in, n_out, with_bias ? ",bias" : "", leaves,
                 bf16x ? ",bf16_x" : "");
        cmp_bits("inv.matmul_rows", wt, sh, part, all, (size_t)N * n_out);
    }
    dfree(&d);
    free(x), free(w), free(wf), free(b), free(bf), free(all), free(part);
}
void inv_matmul_batch(int n_in, int n_out, int with_bias, DType wt, int leaves) {
    inv_matmul_batch_x(n_in, n_out, with_bias, wt, leaves, 0);
}
/* tp invariance (kernels.h TP_LEAVES): TP_LEAVES leaves over n_in == the host's tree_sum over t
 * "ranks" of n_in / t columns each with TP_LEAVES / t leaves (the tp sum is host arithmetic,
 * comm_all_reduce_sum_fixed), for t = 2, 4, 8 */
void inv_matmul_tp(int N, int n_in, int n_out, DType wt) {
    cur_entry = "inv";
    void *w;
    float *x = rand_f32((size_t)N * n_in, 1.0f), *wf = rand_weight(&w, wt, (size_t)n_out * n_in, 1.0f);
    float *whole = xmalloc(nf(N, n_out)), *parts = xmalloc(nf(TP_LEAVES * N, n_out));
    float *xr = xmalloc(nf(N, n_in));
    char *wr = xmalloc(nw(wt, n_out, n_in));
    size_t es = dtype_size(wt);
    run_matmul(dut, whole, x, w, NULL, wt, N, n_in, n_out, TP_LEAVES);
    for (int t = 2; t <= TP_LEAVES; t *= 2) {
        int Kr = n_in / t;
        for (int r = 0; r < t; r++) {
            for (int n = 0; n < N; n++) memcpy(xr + (size_t)n * Kr, x + (size_t)n * n_in + (size_t)r * Kr, fb(Kr));
            for (int o = 0; o < n_out; o++) memcpy(wr + es * o * Kr, (char *)w + es * ((size_t)o * n_in + (size_t)r * Kr), es * Kr);
            run_matmul(dut, parts + (size_t)r * N * n_out, xr, wr, NULL, wt, N, Kr, n_out, TP_LEAVES / t);
        }
        tree_sum(parts, t, (size_t)N * n_out);
        char sh[96];
        snprintf(sh, sizeof sh, "N=%d,n_in=%d,n_out=%d,tp=%d_vs_1", N, n_in, n_out, t);
        cmp_bits("inv.matmul_tp", wt, sh, parts, whole, (size_t)N * n_out);
    }
    free(x), free(w), free(wf), free(whole), free(parts), free(xr), free(wr);
}
/* matmuls == one matmul per output */
void inv_matmuls(int N, int n_in, DType wt) {
    cur_entry = "inv";
    const int n_out[3] = {64, 17, 40}, bias[3] = {1, 0, 1};
    MatmulSet s = matmul_set(3, n_out, bias, n_in, wt);
    float *x = rand_f32((size_t)N * n_in, 1.0f), *fused[3], *single[3];
    for (int j = 0; j < 3; j++) fused[j] = xmalloc(nf(N, n_out[j])), single[j] = xmalloc(nf(N, n_out[j]));
    run_matmuls(dut, fused, x, N, n_in, &s, wt);
    for (int j = 0; j < 3; j++) run_matmul(dut, single[j], x, s.w[j], s.b[j], wt, N, n_in, n_out[j], 1);
    for (int j = 0; j < 3; j++) {
        char sh[96];
        snprintf(sh, sizeof sh, "N=%d,n_in=%d,out=%d/3,n_out=%d", N, n_in, j + 1, n_out[j]);
        cmp_bits("inv.matmuls_eq_matmul", wt, sh, fused[j], single[j], (size_t)N * n_out[j]);
        free(fused[j]), free(single[j]);
    }
    free(x);
    free_set(&s);
}
/* bf16 entries == the fp32 entries on the upcast weights (the dut against itself). CUDA's bf16 matmul
 * and matmuls on the tensor cores (tc_mode) are another function (kernels.h): then the CPU's (ref's)
 * bits are checked instead, and the dut's bf16 result against its fp32 one within the sum of their
 * bounds from the exact sum, gamma(n_in + 1) (fp32 kernel) + (1 + 2^-7) gamma(s(n_in)) (tensor cores)
 * = matmul_tol. On the SIMT kernel (not tc_mode) the dut's own bits, as everywhere else. */
static void bf16_vs_fp32(const char *what, int N, int n_in, int n_out, const float *x, const float *wf,
                         const float *bf, const float *h, const float *f, const float *ref_h, const float *ref_f) {
    char sh[96];
    if (!tc_mode) {
        snprintf(sh, sizeof sh, "%s:N=%d,n_in=%d,n_out=%d", what, N, n_in, n_out);
        cmp_bits("inv.bf16_eq_fp32", DTYPE_BF16, sh, h, f, (size_t)N * n_out);
        return;
    }
    snprintf(sh, sizeof sh, "ref:%s:N=%d,n_in=%d,n_out=%d", what, N, n_in, n_out);
    cmp_bits("inv.bf16_eq_fp32", DTYPE_BF16, sh, ref_h, ref_f, (size_t)N * n_out);
    double *mag = matmul_mag(x, wf, bf, N, n_in, n_out);
    snprintf(sh, sizeof sh, "bf16_vs_fp32:%s:N=%d,n_in=%d,n_out=%d", what, N, n_in, n_out);
    cmp_tol("matmul", DTYPE_BF16, sh, h, f, (size_t)N * n_out, mag, matmul_tol(DTYPE_BF16, n_in), 0.0);
    free(mag);
}
static void inv_bf16_matmul(int N, int n_in, int n_out) {
    cur_entry = "inv";
    void *w, *b;
    float *x = rand_f32((size_t)N * n_in, 1.0f), *wf = rand_weight(&w, DTYPE_BF16, (size_t)n_out * n_in, 1.0f);
    float *bf = rand_weight(&b, DTYPE_BF16, n_out, 1.0f), *h = xmalloc(nf(N, n_out)), *f = xmalloc(nf(N, n_out));
    float *rh = xmalloc(nf(N, n_out)), *rf = xmalloc(nf(N, n_out));
    run_matmul(dut, h, x, w, b, DTYPE_BF16, N, n_in, n_out, 8);
    run_matmul(dut, f, x, wf, bf, DTYPE_F32, N, n_in, n_out, 8);
    if (tc_mode) {
        run_matmul(ref, rh, x, w, b, DTYPE_BF16, N, n_in, n_out, 8);
        run_matmul(ref, rf, x, wf, bf, DTYPE_F32, N, n_in, n_out, 8);
    }
    char sh[96];
    bf16_vs_fp32("matmul", N, n_in, n_out, x, wf, bf, h, f, rh, rf);
    /* matmuls: the same three weights */
    const int n_outs[3] = {n_out, 9, 33}, bias[3] = {1, 0, 1};
    MatmulSet s = matmul_set(3, n_outs, bias, n_in, DTYPE_BF16), sf = s;
    for (int j = 0; j < 3; j++) sf.w[j] = s.wf[j], sf.b[j] = s.bf[j];
    float *hs[3], *fs[3], *rhs[3], *rfs[3];
    for (int j = 0; j < 3; j++) {
        hs[j] = xmalloc(nf(N, n_outs[j])), fs[j] = xmalloc(nf(N, n_outs[j]));
        rhs[j] = xmalloc(nf(N, n_outs[j])), rfs[j] = xmalloc(nf(N, n_outs[j]));
    }
    run_matmuls(dut, hs, x, N, n_in, &s, DTYPE_BF16);
    run_matmuls(dut, fs, x, N, n_in, &sf, DTYPE_F32);
    if (tc_mode) run_matmuls(ref, rhs, x, N, n_in, &s, DTYPE_BF16), run_matmuls(ref, rfs, x, N, n_in, &sf, DTYPE_F32);
    for (int j = 0; j < 3; j++) {
        snprintf(sh, sizeof sh, "matmuls.out%d/3", j + 1);
        bf16_vs_fp32(sh, N, n_in, n_outs[j], x, s.wf[j], s.bf[j], hs[j], fs[j], rhs[j], rfs[j]);
        free(hs[j]), free(fs[j]), free(rhs[j]), free(rfs[j]);
    }
    free_set(&s);
    free(x), free(w), free(wf), free(b), free(bf), free(h), free(f), free(rh), free(rf);
}
/* ---- the cases ----------------------------------------------------------------------------------------- */
/* the matmul and matmuls cases, weights of dtype d0 .. bf16 (d0 = 1: bf16 alone, the SIMT pass) */
void matmul_cases(int d0) {
    static const int mm[][4] = {{1, 1, 1, 1},     {7, 33, 65, 0},   {1, 4096, 1024, 1}, {3, 2048, 256, 0},
                                {33, 1000, 129, 1}, {64, 2048, 11, 0}, {5, 11008, 64, 1}};
    for (int dt = d0; dt < 2; dt++) {
        for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++)
            case_matmul(mm[i][0], mm[i][1], mm[i][2], mm[i][3], (DType)dt, 1);
        case_matmul(3, 2048, 256, 0, (DType)dt, 8), case_matmul(33, 1000, 129, 1, (DType)dt, 8);
        case_matmul(1, 5632, 64, 0, (DType)dt, 4), case_matmul(2, 24, 5, 1, (DType)dt, 8);
        case_matmul_ints(2, 4096, 64, (DType)dt, 12), case_matmul_ints(5, 1000, 33, (DType)dt, 12);
    }
    /* the tensor-core kernel's shapes (bf16; fp32 too where cheap): real layers (TinyLlama's gate_proj at a
     * 512-token prefill, its down_proj at decode), each tile variant with tails in n_in, n_out and N,
     * leaves split over the grid (N <= 32) and in turn (N > 32), n_in = 1, unaligned operands, integers */
    case_matmul(512, 2048, 5632, 0, DTYPE_BF16, 1), case_matmul(1, 5632, 2048, 0, DTYPE_BF16, 8);
    case_matmul(1, 5632, 2048, 1, DTYPE_BF16, 1);
    static const int odd[][5] = {{3, 1, 5, 1, 1},   {7, 33, 65, 1, 1},  {9, 17, 100, 1, 1}, {20, 48, 33, 0, 1},
                                 {40, 33, 70, 1, 1}, {65, 130, 67, 1, 1}, {2, 24, 5, 1, 8},   {40, 24, 70, 1, 8},
                                 {7, 64, 65, 0, 64}, {100, 1000, 129, 1, 8}, {31, 4096, 48, 1, 2}};
    for (int dt = d0; dt < 2; dt++)
        for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++)
            case_matmul(odd[i][0], odd[i][1], odd[i][2], odd[i][3], (DType)dt, odd[i][4]);
    for (int dt = d0; dt < 2; dt++) {
        case_matmul_unaligned(1, 2048, 67, (DType)dt, 1), case_matmul_unaligned(20, 1000, 33, (DType)dt, 8);
        case_matmul_unaligned(40, 256, 70, (DType)dt, 4);
        case_matmul_ints(40, 4096, 64, (DType)dt, 12), case_matmul_ints(1, 4096, 17, (DType)dt, 12);
        case_matmul_ints(7, 15, 33, (DType)dt, 20), case_matmul_ints(40, 15, 20, (DType)dt, 20);
    }
    const int qkv[3] = {256, 64, 64}, qkv_bias[3] = {0, 1, 1}, gu[2] = {173, 173}, no_bias[2] = {0, 0};
    for (int dt = d0; dt < 2; dt++) {
        case_matmuls(9, 2048, 3, qkv, qkv_bias, (DType)dt);
        case_matmuls(1, 300, 2, gu, no_bias, (DType)dt);
    }
}
void inv_bf16_matmuls(void) {
    inv_bf16_matmul(1, 1000, 67), inv_bf16_matmul(3, 2048, 40), inv_bf16_matmul(37, 1000, 67);
}
/* CUDA's bf16 matmul on the SIMT kernel too (cuda_matmul_set_simt_bf16(1), the default): the bf16
 * matmul cases against the CPU within the fp32 bound, its rows' batch invariance, and bf16 == fp32 on
 * the upcast weights bit for bit. --self has one matmul: nothing to add. */
void simt_bf16_checks(void) {
    if (self_mode) return;
    cuda_matmul_set_simt_bf16(1), tc_mode = 0;
    printf("-- bf16 weights on the SIMT kernel (TANDEM_CUDA_MATMUL=simt)\n");
    matmul_cases(1);
    inv_matmul_batch(1000, 67, 1, DTYPE_BF16, 1), inv_matmul_batch(2048, 32, 0, DTYPE_BF16, 8);
    inv_bf16_matmuls();
    cuda_matmul_set_simt_bf16(0), tc_mode = 1;
}
