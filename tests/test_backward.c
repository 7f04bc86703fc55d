/* test_backward.c — checks behind tests/backward.bats for kernels/cpu/backward.c. Usage:
 *   test_backward KERNEL torch CASES.json   the backward kernel against torch autograd (fixtures by
 *                                           tests/fixtures/backward/make_backward_fixtures.py), and the
 *                                           forward kernel against torch's output on the same inputs
 *   test_backward KERNEL fd                 the backward kernel against central finite differences of
 *                                           OUR forward kernel (kernels/cpu/ops.c); no fixtures
 * KERNEL: matmul rmsnorm rope attention swiglu embedding xent.
 * Both also check the buffer contract of backward.h: activation gradients are written (the buffers
 * start as NaN, so an element left unwritten fails), parameter gradients accumulate (a second call
 * must double them). Each prints one line per tensor with the measured max |diff|, then
 * "ok: KERNEL ..." and exits 0, or names what failed and exits 1. */
#include "kernels/cpu/cpu.h"
#include "runtime/util.h"
#include <cjson/cJSON.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Against torch: |C - torch| <= 1e-5 * max(1, max |ref|) per tensor. Both sides are fp32 with the
 * same inputs; they differ only in summation order (BLAS blocking, torch's vectorised reductions,
 * our per-element loops) and in libm's expf/cosf vs torch's. Each gradient element here is a sum of
 * at most ~40 products of O(1) numbers, so the rounding difference is a few fp32 ulps of the
 * largest term (~1e-6 relative); 1e-5 leaves a 10x margin and still fails any wrong term, which is
 * O(1). The same bound is checked against torch's float64 run: fp32 rounding (ours) vs exact math is
 * the same few ulps (RoPE's angle pos * inv_freq rounded in fp32 at pos 40 is the largest: ~4e-6
 * of an angle, so ~4e-6 of |x|). */
#define TOL_TORCH 1e-5

/* Against finite differences: |(L(x+h) - L(x-h)) / (2h) - analytic| <= 1e-2 * max(1, max |analytic|),
 * L = sum(forward(x) * g) evaluated in double from fp32 forward outputs, h = 1e-3 (the actual
 * fp32 step (float)(x+h) - (float)(x-h) is used). Noise: each affected output carries ~1 ulp of
 * fp32 rounding (6e-8 relative, outputs O(1..10)) that changes between the two evaluations; summed
 * over <= ~100 affected outputs and divided by 2h that is up to ~1e-3. Truncation error is
 * h^2/6 * f''' ~ 1e-6. So 1e-2 is ~10x the noise; a wrong gradient term is O(1) and fails. */
#define TOL_FD 1e-2
#define FD_H 1e-3

/* ------------------------------------------------------------------------------- helpers */

static int g_fail;

static void fill_nan(float *x, size_t n) { for (size_t i = 0; i < n; i++) x[i] = NAN; }
static float *falloc(size_t n) { return xcalloc(n ? n : 1, sizeof(float)); }
static float *fdup(const float *x, size_t n) { float *y = falloc(n); memcpy(y, x, n * sizeof(float)); return y; }

/* xorshift64* + Box-Muller: deterministic normal test data */
static uint64_t g_state = 0x9E3779B97F4A7C15ull;
static double rand_u(void) {
    g_state ^= g_state >> 12; g_state ^= g_state << 25; g_state ^= g_state >> 27;
    return ((g_state * 0x2545F4914F6CDD1Dull) >> 11) * (1.0 / 9007199254740992.0);
}
static float *randn(size_t n, double scale) {
    float *x = falloc(n);
    for (size_t i = 0; i < n; i++) {
        double u = rand_u(), v = rand_u();
        x[i] = (float)(scale * sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v));
    }
    return x;
}

/* max |got - mult * want| (NaN -> infinity, so it fails) and max |want| */
static double max_diff(const float *got, const double *want, size_t n, double mult, double *max_ref) {
    double d = 0.0, m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - mult * want[i]);
        if (!(e <= d)) d = isnan(e) ? INFINITY : e;
        if (fabs(mult * want[i]) > m) m = fabs(mult * want[i]);
    }
    *max_ref = m;
    return d;
}

/* ------------------------------------------------------------------------------- fixtures */

static const cJSON *g_cases;  /* the fixture's "cases" array */
static const cJSON *g_case;   /* the case being checked */

static const cJSON *item(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v) { fprintf(stderr, "fixture: field %s missing\n", k); exit(1); }
    return v;
}
static int param_i(const char *k) { return item(item(g_case, "params"), k)->valueint; }
static double param_d(const char *k) { return item(item(g_case, "params"), k)->valuedouble; }

static double *json_doubles(const cJSON *arr, size_t n, const char *name) {
    if ((size_t)cJSON_GetArraySize(arr) != n) {
        fprintf(stderr, "fixture: %s has %d values, expected %zu\n", name, cJSON_GetArraySize(arr), n);
        exit(1);
    }
    double *x = xmalloc((n ? n : 1) * sizeof(double));
    size_t i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) x[i++] = v->valuedouble;
    return x;
}
static float *in_f(const char *name, size_t n) {
    double *d = json_doubles(item(item(g_case, "inputs"), name), n, name);
    float *x = falloc(n);
    for (size_t i = 0; i < n; i++) x[i] = (float)d[i];   /* fp32-exact in the file */
    free(d);
    return x;
}
static int *in_i(const char *name, size_t n) {
    double *d = json_doubles(item(item(g_case, "inputs"), name), n, name);
    int *x = xmalloc((n ? n : 1) * sizeof(int));
    for (size_t i = 0; i < n; i++) x[i] = (int)d[i];
    free(d);
    return x;
}

/* got vs mult * torch's f32 and f64 results for `name`; prints the measured diffs */
static void vs_torch(const char *name, const float *got, size_t n, double mult) {
    double *r32 = json_doubles(item(item(g_case, "f32"), name), n, name);
    double *r64 = json_doubles(item(item(g_case, "f64"), name), n, name);
    for (size_t i = 0; i < n; i++) r32[i] = (float)r32[i];   /* shortest decimal -> the exact fp32 it names */
    double m32, m64, d32 = max_diff(got, r32, n, mult, &m32), d64 = max_diff(got, r64, n, mult, &m64);
    double tol = TOL_TORCH * (m32 > 1.0 ? m32 : 1.0);
    int ok = d32 <= tol && d64 <= tol;
    printf("  %-14s max|ref| %-9.3g max|diff| vs torch f32 %-9.3g vs f64 %-9.3g tol %.2g%s\n", name, m32, d32, d64,
           tol, ok ? "" : "  FAIL");
    g_fail |= !ok;
    free(r32);
    free(r64);
}

/* ------------------------------------------------------------------------------- finite differences */

typedef double (*LossFn)(void *ctx);   /* L = sum(forward(inputs) * g), in double */

/* Central differences of f over every element of x (which f reads through ctx) vs grad. */
static void vs_fd(const char *name, LossFn f, void *ctx, float *x, size_t n, const float *grad) {
    double d = 0.0, m = 0.0;
    for (size_t i = 0; i < n; i++) {
        float x0 = x[i], xp = (float)(x0 + FD_H), xm = (float)(x0 - FD_H);
        x[i] = xp;
        double lp = f(ctx);
        x[i] = xm;
        double lm = f(ctx);
        x[i] = x0;
        double fd = (lp - lm) / ((double)xp - (double)xm);
        double e = fabs(fd - grad[i]);
        if (!(e <= d)) d = isnan(e) ? INFINITY : e;
        if (fabs(grad[i]) > m) m = fabs(grad[i]);
    }
    double tol = TOL_FD * (m > 1.0 ? m : 1.0);
    int ok = d <= tol;
    printf("  %-14s max|grad| %-9.3g max|analytic - central difference| %-9.3g tol %.2g%s\n", name, m, d, tol,
           ok ? "" : "  FAIL");
    g_fail |= !ok;
}

static double dot_g(const float *out, const float *g, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)out[i] * g[i];
    return s;
}

/* written (=): no NaN left from the prefill */
static void all_written(const char *name, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (isnan(x[i])) { printf("  %s[%zu] was not written  FAIL\n", name, i); g_fail = 1; return; }
}

/* ------------------------------------------------------------------------------- matmul */

typedef struct { int N, n_in, n_out; float *x, *w, *b, *g, *out; } MatmulCtx;
static double matmul_loss(void *p) {
    MatmulCtx *c = p;
    cpu_matmul(c->out, c->x, c->w, c->b, DTYPE_F32, c->N, c->n_in, c->n_out, 1);
    return dot_g(c->out, c->g, (size_t)c->N * c->n_out);
}

static void matmul_torch(void) {
    int N = param_i("N"), n_in = param_i("n_in"), n_out = param_i("n_out");
    size_t nx = (size_t)N * n_in, nw = (size_t)n_out * n_in, no = (size_t)N * n_out;
    float *x = in_f("x", nx), *w = in_f("w", nw), *b = in_f("b", n_out), *g = in_f("dout", no);
    float *out = falloc(no), *dx = falloc(nx), *dw = falloc(nw), *db = falloc(n_out);
    cpu_matmul(out, x, w, b, DTYPE_F32, N, n_in, n_out, 1);
    vs_torch("out", out, no, 1.0);
    fill_nan(dx, nx);
    cpu_matmul_backward(dx, dw, db, g, x, w, DTYPE_F32, N, n_in, n_out);
    vs_torch("dx", dx, nx, 1.0);
    vs_torch("dw", dw, nw, 1.0);
    vs_torch("db", db, n_out, 1.0);
    printf("  second call with dx = db = NULL: dw accumulates to 2x, db untouched\n");
    cpu_matmul_backward(NULL, dw, NULL, g, x, w, DTYPE_F32, N, n_in, n_out);
    vs_torch("dw", dw, nw, 2.0);
    vs_torch("db", db, n_out, 1.0);
    free(x); free(w); free(b); free(g); free(out); free(dx); free(dw); free(db);
}

static void matmul_fd(void) {
    /* n_in 19 > 16 and N, n_out >= 4: the forward's 16-lane and 4x4 paths and its edges */
    MatmulCtx c = {.N = 6, .n_in = 19, .n_out = 9};
    size_t nx = (size_t)c.N * c.n_in, nw = (size_t)c.n_out * c.n_in, no = (size_t)c.N * c.n_out;
    c.x = randn(nx, 1.0); c.w = randn(nw, 0.3); c.b = randn(c.n_out, 0.2); c.g = randn(no, 1.0);
    c.out = falloc(no);
    float *dx = falloc(nx), *dw = falloc(nw), *db = falloc(c.n_out);
    cpu_matmul_backward(dx, dw, db, c.g, c.x, c.w, DTYPE_F32, c.N, c.n_in, c.n_out);
    vs_fd("dx", matmul_loss, &c, c.x, nx, dx);
    vs_fd("dw", matmul_loss, &c, c.w, nw, dw);
    vs_fd("db", matmul_loss, &c, c.b, c.n_out, db);
    free(c.x); free(c.w); free(c.b); free(c.g); free(c.out); free(dx); free(dw); free(db);
}

/* ------------------------------------------------------------------------------- rmsnorm */

typedef struct { int N, D; float eps, *x, *w, *g, *out; } RmsCtx;
static double rms_loss(void *p) {
    RmsCtx *c = p;
    cpu_rmsnorm(c->out, c->x, c->w, DTYPE_F32, c->N, c->D, c->eps);
    return dot_g(c->out, c->g, (size_t)c->N * c->D);
}

static void rmsnorm_torch(void) {
    int N = param_i("N"), D = param_i("D");
    float eps = (float)param_d("eps");
    size_t n = (size_t)N * D;
    float *x = in_f("x", n), *w = in_f("w", D), *g = in_f("dout", n);
    float *out = falloc(n), *dx = falloc(n), *dw = falloc(D);
    cpu_rmsnorm(out, x, w, DTYPE_F32, N, D, eps);
    vs_torch("out", out, n, 1.0);
    fill_nan(dx, n);
    cpu_rmsnorm_backward(dx, dw, g, x, w, DTYPE_F32, N, D, eps);
    vs_torch("dx", dx, n, 1.0);
    vs_torch("dw", dw, D, 1.0);
    cpu_rmsnorm_backward(dx, dw, g, x, w, DTYPE_F32, N, D, eps);
    printf("  second call: dw accumulates to 2x, dx is rewritten\n");
    vs_torch("dw", dw, D, 2.0);
    vs_torch("dx", dx, n, 1.0);
    free(x); free(w); free(g); free(out); free(dx); free(dw);
}

static void rmsnorm_fd(void) {
    RmsCtx c = {.N = 4, .D = 23, .eps = 1e-5f};
    size_t n = (size_t)c.N * c.D;
    c.x = randn(n, 1.0); c.w = randn(c.D, 0.3); c.g = randn(n, 1.0); c.out = falloc(n);
    for (int i = 0; i < c.D; i++) c.w[i] += 1.0f;
    for (int i = 0; i < c.D; i++) c.x[c.D + i] *= 0.02f;   /* a row where eps is ~5% of mean(x^2) */
    float *dx = falloc(n), *dw = falloc(c.D);
    cpu_rmsnorm_backward(dx, dw, c.g, c.x, c.w, DTYPE_F32, c.N, c.D, c.eps);
    vs_fd("dx", rms_loss, &c, c.x, n, dx);
    vs_fd("dw", rms_loss, &c, c.w, c.D, dw);
    free(c.x); free(c.w); free(c.g); free(c.out); free(dx); free(dw);
}

/* ------------------------------------------------------------------------------- rope */

typedef struct { int N, n_heads, Dh; float *cs, *x, *g, *out; } RopeCtx;
static double rope_loss(void *p) {
    RopeCtx *c = p;
    size_t n = (size_t)c->N * c->n_heads * c->Dh;
    memcpy(c->out, c->x, n * sizeof(float));
    cpu_rope(c->out, c->cs, c->N, c->n_heads, c->Dh);
    return dot_g(c->out, c->g, n);
}

static void rope_torch(void) {
    int N = param_i("N"), n_heads = param_i("n_heads"), Dh = param_i("Dh");
    size_t n = (size_t)N * n_heads * Dh;
    float *x = in_f("x", n), *inv_freq = in_f("inv_freq", Dh / 2), *g = in_f("dout", n);
    int *pos = in_i("pos", N);
    float *out = fdup(x, n), *dx = fdup(g, n), *cs = falloc((size_t)N * Dh);
    cpu_rope_table(cs, pos, inv_freq, N, Dh);
    cpu_rope(out, cs, N, n_heads, Dh);
    vs_torch("out", out, n, 1.0);
    cpu_rope_backward(dx, cs, N, n_heads, Dh);
    vs_torch("dx", dx, n, 1.0);
    free(x); free(inv_freq); free(g); free(pos); free(out); free(dx); free(cs);
}

static void rope_fd(void) {
    RopeCtx c = {.N = 4, .n_heads = 2, .Dh = 10};
    size_t n = (size_t)c.N * c.n_heads * c.Dh;
    int pos[4] = {0, 3, 57, 101};
    float *inv_freq = falloc(c.Dh / 2);
    for (int i = 0; i < c.Dh / 2; i++) inv_freq[i] = 1.0f / powf(10000.0f, (float)(2 * i) / c.Dh);
    c.cs = falloc((size_t)c.N * c.Dh);
    cpu_rope_table(c.cs, pos, inv_freq, c.N, c.Dh);
    c.x = randn(n, 1.0); c.g = randn(n, 1.0); c.out = falloc(n);
    float *dx = fdup(c.g, n);
    cpu_rope_backward(dx, c.cs, c.N, c.n_heads, c.Dh);
    vs_fd("dx", rope_loss, &c, c.x, n, dx);
    free(inv_freq); free(c.cs); free(c.x); free(c.g); free(c.out); free(dx);
}

/* ------------------------------------------------------------------------------- attention */

/* the forward for one contiguous sequence: block table {0}, block = T */
typedef struct { int T, H, Hkv, Dh, window; float *q, *k, *v, *g, *out, *scratch; } AttnCtx;
static double attn_loss(void *p) {
    AttnCtx *c = p;
    KVLayout rows = kv_rows(c->T, c->Hkv, c->Dh);
    cpu_attention(c->out, c->q, c->k, c->v, &rows, c->T, 0, c->H, c->Hkv, c->Dh, c->window, c->scratch);
    return dot_g(c->out, c->g, (size_t)c->T * c->H * c->Dh);
}
/* enough for the forward (threads * T) and the backward (threads * 2T) */
static float *attn_scratch(int T, int H) { return falloc((size_t)omp_get_max_threads() * (H > 2 ? H : 2) * T); }

static void attention_torch(void) {
    const cJSON *c;
    int n_cases = 0;
    cJSON_ArrayForEach(c, g_cases) {             /* window 0 and window 3 */
        if (strcmp(item(c, "kernel")->valuestring, "attention")) continue;
        g_case = c;
        int T = param_i("T"), H = param_i("H"), Hkv = param_i("Hkv"), Dh = param_i("Dh"), window = param_i("window");
        printf(" T=%d H=%d Hkv=%d Dh=%d window=%d\n", T, H, Hkv, Dh, window);
        size_t nq = (size_t)T * H * Dh, nk = (size_t)T * Hkv * Dh;
        float *q = in_f("q", nq), *k = in_f("k", nk), *v = in_f("v", nk), *g = in_f("dout", nq);
        float *out = falloc(nq), *dq = falloc(nq), *dk = falloc(nk), *dv = falloc(nk), *scratch = attn_scratch(T, H);
        KVLayout rows = kv_rows(T, Hkv, Dh);
        cpu_attention(out, q, k, v, &rows, T, 0, H, Hkv, Dh, window, scratch);
        vs_torch("out", out, nq, 1.0);
        fill_nan(dq, nq); fill_nan(dk, nk); fill_nan(dv, nk);
        cpu_attention_backward(dq, dk, dv, g, q, k, v, T, H, Hkv, Dh, window, scratch);
        vs_torch("dq", dq, nq, 1.0);
        vs_torch("dk", dk, nk, 1.0);
        vs_torch("dv", dv, nk, 1.0);
        free(q); free(k); free(v); free(g); free(out); free(dq); free(dk); free(dv); free(scratch);
        n_cases++;
    }
    if (n_cases != 2) { printf("  expected 2 attention cases, found %d  FAIL\n", n_cases); g_fail = 1; }
}

static void attention_fd(void) {
    /* T 33, H 4: H*T*T > 4096, so both the forward and the backward take their threaded paths;
     * at least 2 threads even on a 1-core machine, so a scratch race can show */
    int windows[2] = {0, 5}, threads0 = omp_get_max_threads();
    if (threads0 < 2) omp_set_num_threads(2);
    for (int wi = 0; wi < 2; wi++) {
        AttnCtx c = {.T = 33, .H = 4, .Hkv = 2, .Dh = 8, .window = windows[wi]};
        printf(" T=%d H=%d Hkv=%d Dh=%d window=%d\n", c.T, c.H, c.Hkv, c.Dh, c.window);
        size_t nq = (size_t)c.T * c.H * c.Dh, nk = (size_t)c.T * c.Hkv * c.Dh;
        c.q = randn(nq, 1.0); c.k = randn(nk, 1.0); c.v = randn(nk, 1.0); c.g = randn(nq, 1.0);
        c.out = falloc(nq); c.scratch = attn_scratch(c.T, c.H);
        float *dq = falloc(nq), *dk = falloc(nk), *dv = falloc(nk);
        fill_nan(dq, nq); fill_nan(dk, nk); fill_nan(dv, nk);
        cpu_attention_backward(dq, dk, dv, c.g, c.q, c.k, c.v, c.T, c.H, c.Hkv, c.Dh, c.window, c.scratch);
        all_written("dq", dq, nq); all_written("dk", dk, nk); all_written("dv", dv, nk);
        vs_fd("dq", attn_loss, &c, c.q, nq, dq);
        vs_fd("dk", attn_loss, &c, c.k, nk, dk);
        vs_fd("dv", attn_loss, &c, c.v, nk, dv);
        /* each kv head's arithmetic is the same on any thread: 1 thread gives the same bits */
        float *dq1 = falloc(nq), *dk1 = falloc(nk), *dv1 = falloc(nk);
        int threads = omp_get_max_threads();
        omp_set_num_threads(1);
        cpu_attention_backward(dq1, dk1, dv1, c.g, c.q, c.k, c.v, c.T, c.H, c.Hkv, c.Dh, c.window, c.scratch);
        omp_set_num_threads(threads);
        int same = !memcmp(dq, dq1, nq * 4) && !memcmp(dk, dk1, nk * 4) && !memcmp(dv, dv1, nk * 4);
        printf("  1 thread vs %d threads: %s\n", threads, same ? "identical bits" : "DIFFERENT  FAIL");
        g_fail |= !same;
        free(c.q); free(c.k); free(c.v); free(c.g); free(c.out); free(c.scratch);
        free(dq); free(dk); free(dv); free(dq1); free(dk1); free(dv1);
    }
    omp_set_num_threads(threads0);
}

/* ------------------------------------------------------------------------------- swiglu */

typedef struct { size_t n; float *gate, *up, *g, *out; } SwiCtx;
static double swi_loss(void *p) {
    SwiCtx *c = p;
    cpu_swiglu(c->out, c->gate, c->up, c->n);
    return dot_g(c->out, c->g, c->n);
}

static void swiglu_torch(void) {
    size_t n = (size_t)param_i("n");
    float *gate = in_f("gate", n), *up = in_f("up", n), *g = in_f("dout", n);
    float *out = falloc(n), *dgate = falloc(n), *dup = falloc(n);
    cpu_swiglu(out, gate, up, n);
    vs_torch("out", out, n, 1.0);
    fill_nan(dgate, n); fill_nan(dup, n);
    cpu_swiglu_backward(dgate, dup, g, gate, up, n);
    vs_torch("dgate", dgate, n, 1.0);
    vs_torch("dup", dup, n, 1.0);
    free(gate); free(up); free(g); free(out); free(dgate); free(dup);
}

static void swiglu_fd(void) {
    SwiCtx c = {.n = 41};
    c.gate = randn(c.n, 3.0); c.up = randn(c.n, 1.0); c.g = randn(c.n, 1.0); c.out = falloc(c.n);
    float *dgate = falloc(c.n), *dup = falloc(c.n);
    cpu_swiglu_backward(dgate, dup, c.g, c.gate, c.up, c.n);
    vs_fd("dgate", swi_loss, &c, c.gate, c.n, dgate);
    vs_fd("dup", swi_loss, &c, c.up, c.n, dup);
    free(c.gate); free(c.up); free(c.g); free(c.out); free(dgate); free(dup);
}

/* ------------------------------------------------------------------------------- embedding */

/* The full table (V, D) split into vocab shards [v0[s], v0[s+1]); shard s's table is rows v0[s]..
 * of the full one (row-major, so a pointer offset). Forward over all shards summed = what the tp
 * all-reduce of the vocab-parallel lookup gives. */
typedef struct { int N, D, n_shards; const int *v0, *ids; float *table, *g, *out, *part; } EmbCtx;
static void emb_forward(EmbCtx *c) {
    size_t n = (size_t)c->N * c->D;
    memset(c->out, 0, n * sizeof(float));
    for (int s = 0; s < c->n_shards; s++) {
        cpu_embedding(c->part, c->table + (size_t)c->v0[s] * c->D, DTYPE_F32, c->ids, c->N, c->D, c->v0[s], c->v0[s + 1] - c->v0[s]);
        cpu_add(c->out, c->part, n);
    }
}
static double emb_loss(void *p) {
    EmbCtx *c = p;
    emb_forward(c);
    return dot_g(c->out, c->g, (size_t)c->N * c->D);
}
static void emb_backward(EmbCtx *c, float *dtable) {
    for (int s = 0; s < c->n_shards; s++)
        cpu_embedding_backward(dtable + (size_t)c->v0[s] * c->D, c->g, c->ids, c->N, c->D, c->v0[s],
                               c->v0[s + 1] - c->v0[s]);
}

static void embedding_torch(void) {
    int N = param_i("N"), D = param_i("D"), V = param_i("V");
    int v0[4] = {0, 3, 7, V};                            /* shards of 3, 4, 3 rows */
    EmbCtx c = {.N = N, .D = D, .n_shards = 3, .v0 = v0};
    c.ids = in_i("ids", N);
    c.table = in_f("table", (size_t)V * D); c.g = in_f("dout", (size_t)N * D);
    c.out = falloc((size_t)N * D); c.part = falloc((size_t)N * D);
    float *dtable = falloc((size_t)V * D);
    emb_forward(&c);
    vs_torch("out", c.out, (size_t)N * D, 1.0);
    emb_backward(&c, dtable);
    vs_torch("dtable", dtable, (size_t)V * D, 1.0);
    emb_backward(&c, dtable);
    printf("  second call: dtable accumulates to 2x\n");
    vs_torch("dtable", dtable, (size_t)V * D, 2.0);
    free((void *)c.ids); free(c.table); free(c.g); free(c.out); free(c.part); free(dtable);
}

static void embedding_fd(void) {
    int v0[3] = {0, 4, 9}, ids[10] = {8, 0, 4, 4, 3, 8, 1, 4, 5, 0};
    EmbCtx c = {.N = 10, .D = 6, .n_shards = 2, .v0 = v0, .ids = ids};
    size_t nt = (size_t)9 * c.D, n = (size_t)c.N * c.D;
    c.table = randn(nt, 1.0); c.g = randn(n, 1.0); c.out = falloc(n); c.part = falloc(n);
    float *dtable = falloc(nt);
    emb_backward(&c, dtable);
    vs_fd("dtable", emb_loss, &c, c.table, nt, dtable);
    free(c.table); free(c.g); free(c.out); free(c.part); free(dtable);
}

/* ------------------------------------------------------------------------------- cross-entropy */

/* The protocol of backward.h across n_shards emulated ranks; logits (N, V) full, the shard of rank s
 * is columns [v0[s], v0[s+1]) copied into a contiguous (N, V_local) buffer as that rank holds it. */
typedef struct { int N, V, n_shards; const int *v0, *targets; float *logits, *weight, *local, *z, *lse; float T; } XentCtx;

static void shard_get(float *local, const float *full, int N, int V, int a, int b) {
    for (int n = 0; n < N; n++) memcpy(local + (size_t)n * (b - a), full + (size_t)n * V + a, sizeof(float) * (b - a));
}
static void shard_put(float *full, const float *local, int N, int V, int a, int b) {
    for (int n = 0; n < N; n++) memcpy(full + (size_t)n * V + a, local + (size_t)n * (b - a), sizeof(float) * (b - a));
}

/* steps 1-3 of the protocol at temperature T (as runtime/forward.c computes lse and logprobs);
 * returns the cross-entropy loss = -sum_n w_n lp_n */
static double xent_forward(XentCtx *c) {
    int N = c->N, V = c->V;
    float *mx = falloc(N), *sum = falloc(N), *zsum = falloc(N);
    for (int n = 0; n < N; n++) mx[n] = -INFINITY;
    for (int s = 0; s < c->n_shards; s++) {             /* 1: local max, all-reduce MAX */
        int a = c->v0[s], b = c->v0[s + 1];
        shard_get(c->local, c->logits, N, V, a, b);
        for (int n = 0; n < N; n++)
            for (int j = 0; j < b - a; j++) mx[n] = fmaxf(mx[n], c->local[(size_t)n * (b - a) + j] / c->T);
    }
    for (int s = 0; s < c->n_shards; s++) {             /* 2: local sum of exp, all-reduce SUM; 3: target logit */
        int a = c->v0[s], b = c->v0[s + 1];
        shard_get(c->local, c->logits, N, V, a, b);
        for (int n = 0; n < N; n++) {
            double acc = 0.0;
            for (int j = 0; j < b - a; j++) acc += expf(c->local[(size_t)n * (b - a) + j] / c->T - mx[n]);
            sum[n] += (float)acc;
        }
        cpu_pick_logits(c->z, c->local, c->targets, N, b - a, a, c->T);
        cpu_add(zsum, c->z, N);
    }
    double loss = 0.0;
    for (int n = 0; n < N; n++) {
        c->lse[n] = mx[n] + logf(sum[n]);
        if (c->targets[n] >= 0) loss -= (double)c->weight[n] * (double)(zsum[n] - c->lse[n]);
    }
    free(mx); free(sum); free(zsum);
    return loss;
}
static double xent_loss(void *p) { return xent_forward(p); }

/* step 4 on every shard, reassembled into dlogits (N, V) */
static void xent_backward_all(XentCtx *c, float *dlogits) {
    float *dlocal = falloc((size_t)c->N * c->V), *dlp = falloc(c->N);
    for (int n = 0; n < c->N; n++) dlp[n] = -c->weight[n];   /* d(-sum w lp) / d lp */
    for (int s = 0; s < c->n_shards; s++) {
        int a = c->v0[s], b = c->v0[s + 1];
        shard_get(c->local, c->logits, c->N, c->V, a, b);
        fill_nan(dlocal, (size_t)c->N * (b - a));
        cpu_logprob_backward(dlocal, c->local, c->lse, c->targets, dlp, NULL, NULL, c->N, b - a, a, c->T);
        shard_put(dlogits, dlocal, c->N, c->V, a, b);
    }
    free(dlocal); free(dlp);
}

static void xent_torch(void) {
    int N = param_i("N"), V = param_i("V");
    int v0[4] = {0, 6, 12, V};                           /* 3 ranks, 6 + 6 + 5 columns */
    XentCtx c = {.N = N, .V = V, .n_shards = 3, .v0 = v0, .T = 1.0f};
    c.targets = in_i("targets", N);
    c.logits = in_f("logits", (size_t)N * V); c.weight = in_f("weight", N);
    c.local = falloc((size_t)N * V); c.z = falloc(N); c.lse = falloc(N);
    float loss = (float)xent_forward(&c), *dlogits = falloc((size_t)N * V);
    vs_torch("out", &loss, 1, 1.0);                      /* the loss */
    xent_backward_all(&c, dlogits);
    vs_torch("dlogits", dlogits, (size_t)N * V, 1.0);
    free((void *)c.targets); free(c.logits); free(c.weight); free(c.local); free(c.z); free(c.lse); free(dlogits);
}

static void xent_fd(void) {
    int v0[4] = {0, 8, 16, 23}, targets[5] = {7, 8, -1, 22, 0};   /* each shard's edges, one ignored row */
    XentCtx c = {.N = 5, .V = 23, .n_shards = 3, .v0 = v0, .targets = targets, .T = 0.7f};   /* with a temperature */
    size_t n = (size_t)c.N * c.V;
    c.logits = randn(n, 3.0); c.weight = falloc(c.N);
    for (int i = 0; i < c.N; i++) c.weight[i] = 0.1f + 0.9f * (float)rand_u();
    c.local = falloc(n); c.z = falloc(c.N); c.lse = falloc(c.N);
    float *dlogits = falloc(n);
    xent_forward(&c);                                    /* lse for the backward */
    xent_backward_all(&c, dlogits);
    all_written("dlogits", dlogits, n);
    vs_fd("dlogits", xent_loss, &c, c.logits, n, dlogits);
    free(c.logits); free(c.weight); free(c.local); free(c.z); free(c.lse); free(dlogits);
}

/* ------------------------------------------------------------------------------- main */

typedef struct { const char *name; void (*torch)(void); void (*fd)(void); } Kernel;
static const Kernel KERNELS[] = {
    {"matmul", matmul_torch, matmul_fd},       {"rmsnorm", rmsnorm_torch, rmsnorm_fd},
    {"rope", rope_torch, rope_fd},             {"attention", attention_torch, attention_fd},
    {"swiglu", swiglu_torch, swiglu_fd},       {"embedding", embedding_torch, embedding_fd},
    {"xent", xent_torch, xent_fd},
};

static int usage(const char *argv0) {
    fprintf(stderr, "usage: %s KERNEL torch CASES.json | KERNEL fd\n  KERNEL:", argv0);
    for (size_t i = 0; i < sizeof KERNELS / sizeof *KERNELS; i++) fprintf(stderr, " %s", KERNELS[i].name);
    fprintf(stderr, "\n");
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 3) return usage(argv[0]);
    const Kernel *k = NULL;
    for (size_t i = 0; i < sizeof KERNELS / sizeof *KERNELS; i++)
        if (!strcmp(argv[1], KERNELS[i].name)) k = &KERNELS[i];
    if (!k) return usage(argv[0]);
    if (argc == 3 && !strcmp(argv[2], "fd")) {
        printf("%s: backward vs central differences of the forward kernel\n", k->name);
        k->fd();
        if (g_fail) { printf("FAIL: %s disagrees with finite differences\n", k->name); return 1; }
        printf("ok: %s backward matches finite differences of the forward\n", k->name);
        return 0;
    }
    if (argc != 4 || strcmp(argv[2], "torch")) return usage(argv[0]);
    size_t len;
    char *text = read_file(argv[3], &len);
    if (!text) { fprintf(stderr, "cannot read %s\n", argv[3]); return 1; }
    cJSON *doc = cJSON_Parse(text);
    if (!doc) { fprintf(stderr, "%s: not JSON\n", argv[3]); return 1; }
    const cJSON *c;
    g_cases = item(doc, "cases");
    g_case = NULL;
    cJSON_ArrayForEach(c, g_cases) if (!g_case && !strcmp(item(c, "kernel")->valuestring, k->name)) g_case = c;
    if (!g_case) { fprintf(stderr, "%s: no %s case\n", argv[3], k->name); return 1; }
    printf("%s: forward and backward vs torch %s autograd\n", k->name, item(doc, "torch")->valuestring);
    k->torch();
    cJSON_Delete(doc);
    free(text);
    if (g_fail) { printf("FAIL: %s disagrees with torch\n", k->name); return 1; }
    printf("ok: %s forward and backward match torch\n", k->name);
    return 0;
}
