/* pointwise.c — cuda_vs_cpu's cases of the row-wise and element-wise forward entries: rmsnorm,
 * round_to / pack / unpack, rope_table / rope, swiglu, add_to, scale / dropout, tree_sum, copy,
 * gather_rows, embedding, mask_cols, and rmsnorm's and embedding's bf16 == fp32. Owns those cases. */
#include "tests/cuda/cuda_vs_cpu.h"

/* ---- rmsnorm ------------------------------------------------------------------------------------ */
static void run_rmsnorm(const Backend *be, float *out, const float *x, const void *w, DType wt, int N, int D, float eps) {
    Dev d = {be, {0}, 0};
    float *o = dput(&d, NULL, nf(N, D));
    be->rmsnorm(o, dput(&d, x, nf(N, D)), dput(&d, w, nw(wt, D, 1)), wt, N, D, eps);
    dget(&d, out, o, nf(N, D));
    dfree(&d);
}
double rms_r(const float *x, int D, float eps) { /* 1 / sqrt(mean x^2 + eps), in double */
    double ss = 0.0;
    for (int i = 0; i < D; i++) ss += (double)x[i] * x[i];
    return 1.0 / sqrt(ss / D + eps);
}
static void case_rmsnorm(int N, int D, float eps, float amp, int zero_row, DType wt) {
    cur_entry = "rmsnorm";
    void *w;
    float *x = rand_f32((size_t)N * D, amp), *wf = rand_weight(&w, wt, D, 1.0f);
    if (zero_row) memset(x, 0, fb(D));   /* eps alone: the output must be exactly 0 */
    float *want = xmalloc(nf(N, D)), *got = xmalloc(nf(N, D));
    run_rmsnorm(ref, want, x, w, wt, N, D, eps);
    run_rmsnorm(dut, got, x, w, wt, N, D, eps);
    double *mag = dzeros((size_t)N * D);
    for (int n = 0; n < N; n++) {
        double r = rms_r(x + (size_t)n * D, D, eps);
        for (int i = 0; i < D; i++) mag[(size_t)n * D + i] = fabs((double)wf[i] * x[(size_t)n * D + i]) * r;
    }
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,D=%d,eps=%.0e,amp=%g%s", N, D, (double)eps, (double)amp, zero_row ? ",zero_row" : "");
    cmp_tol("rmsnorm", wt, sh, got, want, (size_t)N * D, mag, gam(D) + 14 * U, 0.0);
    free(x), free(w), free(wf), free(want), free(got), free(mag);
}

/* ---- round_to, pack, unpack ------------------------------------------------------------------------ */
static void case_round_to(size_t n, DType t) {
    cur_entry = "round_to";
    float *x = rand_f32(n, 3.0f), *want = xmalloc(fb(n)), *got = xmalloc(fb(n));
    plant_specials(x, n);
    const Backend *be[2] = {ref, dut};
    float *res[2] = {want, got};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *dx = dput(&d, x, fb(n));
        be[s]->round_to(dx, n, t);
        dget(&d, res[s], dx, fb(n));
        dfree(&d);
    }
    char sh[96];
    snprintf(sh, sizeof sh, "n=%zu,specials", n);
    cmp_exact("round_to", t, sh, got, want, n);
    free(x), free(want), free(got);
}
static void case_pack(size_t n, DType t) {
    cur_entry = "pack";
    size_t bytes = dtype_size(t) * n;
    float *x = rand_f32(n, 3.0f);
    unsigned char *res[2] = {xmalloc(bytes), xmalloc(bytes)};
    plant_specials(x, n);
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        void *dst = dput(&d, NULL, bytes);
        be[s]->pack(dst, t, dput(&d, x, fb(n)), n);
        dget(&d, res[s], dst, bytes);
        dfree(&d);
    }
    char sh[96];
    snprintf(sh, sizeof sh, "n=%zu,specials", n);
    if (t == DTYPE_BF16) cmp_bf16("pack", sh, (uint16_t *)res[1], (uint16_t *)res[0], n);
    else cmp_exact("pack", t, sh, (float *)res[1], (float *)res[0], n);
    free(x), free(res[0]), free(res[1]);
}
static void case_unpack(size_t n, DType t) {
    cur_entry = "unpack";
    size_t bytes = dtype_size(t) * n;
    unsigned char *src = xmalloc(bytes);
    for (size_t i = 0; i < bytes; i++) src[i] = (unsigned char)rand_u64();   /* every bit pattern, NaNs too */
    float *want = xmalloc(fb(n)), *got = xmalloc(fb(n)), *res[2] = {want, got};
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *dst = dput(&d, NULL, fb(n));
        be[s]->unpack(dst, dput(&d, src, bytes), t, n);
        dget(&d, res[s], dst, fb(n));
        dfree(&d);
    }
    char sh[96];
    snprintf(sh, sizeof sh, "n=%zu,random_bits", n);
    cmp_exact("unpack", t, sh, got, want, n);
    free(src), free(want), free(got);
}

/* ---- rope_table, rope, rope_backward ----------------------------------------------------------------- */
static void case_rope_table(int N, const int *pos, int Dh, double theta) {
    cur_entry = "rope_table";
    int half = Dh / 2;
    float *inv = xmalloc(fb(half)), *want = xmalloc(nf(N, Dh)), *got = xmalloc(nf(N, Dh)), *res[2] = {want, got};
    for (int i = 0; i < half; i++) inv[i] = (float)pow(theta, -2.0 * i / Dh);
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *cs = dput(&d, NULL, nf(N, Dh));
        be[s]->rope_table(cs, dput(&d, pos, ni(N)), dput(&d, inv, fb(half)), N, Dh);
        dget(&d, res[s], cs, nf(N, Dh));
        dfree(&d);
    }
    double *mag = dzeros((size_t)N * Dh);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < half; i++) {
            float angle = (float)pos[n] * inv[i];   /* the contract's fp32 angle */
            mag[(size_t)n * Dh + i] = fabs(cos((double)angle));
            mag[(size_t)n * Dh + half + i] = fabs(sin((double)angle));
        }
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,Dh=%d,theta=%g,max_pos=%d", N, Dh, theta, pos[N - 1]);
    cmp_tol("rope_table", DTYPE_F32, sh, got, want, (size_t)N * Dh, mag, 6 * U, 0.0);
    free(inv), free(want), free(got), free(mag);
}
/* rope (backward 0) or rope_backward (1) in place on x (N, n_heads * Dh) */
static void run_rope(const Backend *be, int backward, float *out, const float *x, const float *cs, int N, int n_heads,
                     int Dh) {
    Dev d = {be, {0}, 0};
    size_t n = (size_t)N * n_heads * Dh;
    float *dx = dput(&d, x, fb(n)), *dcs = dput(&d, cs, nf(N, Dh));
    if (backward) be->rope_backward(dx, dcs, N, n_heads, Dh);
    else be->rope(dx, dcs, N, n_heads, Dh);
    dget(&d, out, dx, fb(n));
    dfree(&d);
}
static void case_rope(int backward, int N, int n_heads, int Dh) {
    const char *entry = backward ? "rope_backward" : "rope";
    cur_entry = entry;
    int half = Dh / 2;
    size_t n = (size_t)N * n_heads * Dh;
    float *x = rand_f32(n, 2.0f), *cs = xmalloc(nf(N, Dh)), *want = xmalloc(fb(n)), *got = xmalloc(fb(n));
    for (int r = 0; r < N; r++)
        for (int i = 0; i < half; i++) {
            double a = 100.0 * rand_uniform();
            cs[(size_t)r * Dh + i] = (float)cos(a), cs[(size_t)r * Dh + half + i] = (float)sin(a);
        }
    run_rope(ref, backward, want, x, cs, N, n_heads, Dh);
    run_rope(dut, backward, got, x, cs, N, n_heads, Dh);
    double *mag = dzeros(n);
    for (int r = 0; r < N; r++)
        for (int h = 0; h < n_heads; h++)
            for (int i = 0; i < half; i++) {
                const float *xh = x + ((size_t)r * n_heads + h) * Dh;
                double c = fabs(cs[(size_t)r * Dh + i]), s = fabs(cs[(size_t)r * Dh + half + i]);
                double m = fabs((double)xh[i]) * c + fabs((double)xh[i + half]) * s;   /* |a c| + |b s| */
                double m2 = fabs((double)xh[i + half]) * c + fabs((double)xh[i]) * s;
                mag[((size_t)r * n_heads + h) * Dh + i] = m, mag[((size_t)r * n_heads + h) * Dh + half + i] = m2;
            }
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,heads=%d,Dh=%d", N, n_heads, Dh);
    cmp_tol(entry, DTYPE_F32, sh, got, want, n, mag, 2 * gam(2), 0.0);
    free(x), free(cs), free(want), free(got), free(mag);
}

/* ---- swiglu, add_to, copy, gather_rows, embedding, mask_cols ------------------------------------------ */
double sigmoid(double g) { return 1.0 / (1.0 + exp(-g)); }
float *swiglu_gates(size_t n, int edges) { /* (n) in [-12, 12), or exp's range edges first */
    static const float e[] = {0.0f, -0.0f, 87.3f, 87.4f, -87.3f, -87.4f, 88.7f, 88.8f, -88.7f, -88.8f,
                              -100.0f, 100.0f, -1e30f, 1e30f, 1e-30f, -20.0f, 20.0f};
    float *g = rand_f32(n, 12.0f);
    for (size_t i = 0; edges && i < n && i < sizeof e / sizeof e[0]; i++) g[i] = e[i];
    return g;
}
static void case_swiglu(size_t n, int edges) {
    cur_entry = "swiglu";
    float *g = swiglu_gates(n, edges), *u = rand_f32(n, 2.0f), *want = xmalloc(fb(n)), *got = xmalloc(fb(n));
    float *res[2] = {want, got};
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *o = dput(&d, NULL, fb(n));
        be[s]->swiglu(o, dput(&d, g, fb(n)), dput(&d, u, fb(n)), n);
        dget(&d, res[s], o, fb(n));
        dfree(&d);
    }
    double *mag = dzeros(n);
    for (size_t i = 0; i < n; i++) mag[i] = fabs((double)g[i] * sigmoid(g[i]) * u[i]);
    char sh[96];
    snprintf(sh, sizeof sh, "n=%zu%s", n, edges ? ",exp_edges" : "");
    cmp_tol("swiglu", DTYPE_F32, sh, got, want, n, mag, 16 * U, FLT_MIN);
    free(g), free(u), free(want), free(got), free(mag);
}
/* in_place: out is a (cpu_add's case) */
static void case_add_to(size_t n, int in_place) {
    cur_entry = "add_to";
    float *a = rand_f32(n, 1.0f), *b = rand_f32(n, 1.0f), *want = xmalloc(fb(n)), *got = xmalloc(fb(n));
    float *res[2] = {want, got};
    plant_specials(a, n), plant_specials(b + n / 2, n - n / 2);
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *da = dput(&d, a, fb(n)), *o = in_place ? da : dput(&d, NULL, fb(n));
        be[s]->add_to(o, da, dput(&d, b, fb(n)), n);
        dget(&d, res[s], o, fb(n));
        dfree(&d);
    }
    char sh[96];
    snprintf(sh, sizeof sh, "n=%zu%s", n, in_place ? ",in_place" : "");
    cmp_exact("add_to", DTYPE_F32, sh, got, want, n);
    free(a), free(b), free(want), free(got);
}
/* x *= s and LoRA's dropout: one fp32 product per element (the same mask from dropout_keep): exact */
static void case_scale_dropout(int N, int cols, int col0, int cols_global, float p) {
    size_t n = (size_t)N * cols;
    float *x = rand_f32(n, 3.0f), *want = xmalloc(fb(n)), *got = xmalloc(fb(n)), *res[2] = {want, got};
    const Backend *be[2] = {ref, dut};
    char sh[96];
    for (int op = 0; op < 2; op++) {
        cur_entry = op ? "dropout" : "scale";
        for (int s = 0; s < 2; s++) {
            Dev d = {be[s], {0}, 0};
            float *o = dput(&d, x, fb(n));
            if (op) be[s]->dropout(o, o, N, cols, col0, cols_global, p, 0x1234567ull);
            else be[s]->scale(o, 2.5f, n);
            dget(&d, res[s], o, fb(n));
            dfree(&d);
        }
        snprintf(sh, sizeof sh, "N=%d,cols=%d/%d@%d,p=%g", N, cols, cols_global, col0, p);
        cmp_exact(cur_entry, DTYPE_F32, sh, got, want, n);
    }
    free(x), free(want), free(got);
}
/* the ranks' partials added by kernels.h's pairwise tree (runtime/comm.c's fixed sums on device
 * memory): the same additions in the same order, exact */
static void case_tree_sum(int P, size_t n) {
    cur_entry = "tree_sum";
    float *x = rand_f32((size_t)P * n, 1.0f), *want = xmalloc(fb(n)), *got = xmalloc(fb(n)), *res[2] = {want, got};
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *v = dput(&d, x, fb((size_t)P * n));
        be[s]->tree_sum(v, P, n);
        dget(&d, res[s], v, fb(n));
        dfree(&d);
    }
    char sh[96];
    snprintf(sh, sizeof sh, "P=%d,n=%zu", P, n);
    cmp_exact("tree_sum", DTYPE_F32, sh, got, want, n);
    free(x), free(want), free(got);
}
static void case_copy(size_t n) {
    cur_entry = "copy";
    float *x = rand_f32(n, 1.0f), *want = xmalloc(fb(n)), *got = xmalloc(fb(n)), *res[2] = {want, got};
    plant_specials(x, n);
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *o = dput(&d, NULL, fb(n));
        be[s]->copy(o, dput(&d, x, fb(n)), n);
        dget(&d, res[s], o, fb(n));
        dfree(&d);
    }
    char sh[96];
    snprintf(sh, sizeof sh, "n=%zu", n);
    cmp_exact("copy", DTYPE_F32, sh, got, want, n);
    free(x), free(want), free(got);
}
static void case_gather_rows(int rows_in_x, int R, const int *rows, int D) {
    cur_entry = "gather_rows";
    float *x = rand_f32((size_t)rows_in_x * D, 1.0f), *want = xmalloc(nf(R, D)), *got = xmalloc(nf(R, D));
    float *res[2] = {want, got};
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *o = dput(&d, NULL, nf(R, D));
        be[s]->gather_rows(o, dput(&d, x, nf(rows_in_x, D)), dput(&d, rows, ni(R)), R, D);
        dget(&d, res[s], o, nf(R, D));
        dfree(&d);
    }
    char sh[96];
    snprintf(sh, sizeof sh, "R=%d,x_rows=%d,D=%d,repeats", R, rows_in_x, D);
    cmp_exact("gather_rows", DTYPE_F32, sh, got, want, (size_t)R * D);
    free(x), free(want), free(got);
}
static void run_embedding(const Backend *be, float *out, const void *table, DType wt, const int *ids, int N, int D,
                          int v0, int V_local) {
    Dev d = {be, {0}, 0};
    float *o = dput(&d, NULL, nf(N, D));
    be->embedding(o, dput(&d, table, nw(wt, V_local, D)), wt, dput(&d, ids, ni(N)), N, D, v0, V_local);
    dget(&d, out, o, nf(N, D));
    dfree(&d);
}
static void case_embedding(int N, const int *ids, int D, int v0, int V_local, DType wt) {
    cur_entry = "embedding";
    void *t;
    float *tf = rand_weight(&t, wt, (size_t)V_local * D, 1.0f), *want = xmalloc(nf(N, D)), *got = xmalloc(nf(N, D));
    run_embedding(ref, want, t, wt, ids, N, D, v0, V_local);
    run_embedding(dut, got, t, wt, ids, N, D, v0, V_local);
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,D=%d,v0=%d,V_local=%d", N, D, v0, V_local);
    cmp_exact("embedding", wt, sh, got, want, (size_t)N * D);
    free(t), free(tf), free(want), free(got);
}
static void case_mask_cols(int N, int V, int from) {
    cur_entry = "mask_cols";
    float *x = rand_f32((size_t)N * V, 1.0f), *want = xmalloc(nf(N, V)), *got = xmalloc(nf(N, V)), *res[2] = {want, got};
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *dx = dput(&d, x, nf(N, V));
        be[s]->mask_cols(dx, N, V, from);
        dget(&d, res[s], dx, nf(N, V));
        dfree(&d);
    }
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,V=%d,from=%d", N, V, from);
    cmp_exact("mask_cols", DTYPE_F32, sh, got, want, (size_t)N * V);
    free(x), free(want), free(got);
}

void inv_bf16_norm_embed(int N, int D) {
    cur_entry = "inv";
    void *w;
    float *x = rand_f32((size_t)N * D, 2.0f), *wf = rand_weight(&w, DTYPE_BF16, D, 1.0f);
    float *h = xmalloc(nf(N, D)), *f = xmalloc(nf(N, D)), *hw = xmalloc(fb(D)), *fw = xmalloc(fb(D));
    char sh[96];
    run_rmsnorm(dut, h, x, w, DTYPE_BF16, N, D, 1e-5f);
    run_rmsnorm(dut, f, x, wf, DTYPE_F32, N, D, 1e-5f);
    snprintf(sh, sizeof sh, "rmsnorm:N=%d,D=%d", N, D);
    cmp_bits("inv.bf16_eq_fp32", DTYPE_BF16, sh, h, f, (size_t)N * D);
    float *g = rand_f32((size_t)N * D, 1.0f), *dw0 = rand_f32(D, 1.0f);
    run_rmsnorm_backward(dut, h, hw, g, x, dw0, w, DTYPE_BF16, N, D, 1e-5f, 0);
    run_rmsnorm_backward(dut, f, fw, g, x, dw0, wf, DTYPE_F32, N, D, 1e-5f, 0);
    snprintf(sh, sizeof sh, "rmsnorm_backward.dx:N=%d,D=%d", N, D);
    cmp_bits("inv.bf16_eq_fp32", DTYPE_BF16, sh, h, f, (size_t)N * D);
    snprintf(sh, sizeof sh, "rmsnorm_backward.dw:N=%d,D=%d", N, D);
    cmp_bits("inv.bf16_eq_fp32", DTYPE_BF16, sh, hw, fw, D);
    void *t;
    float *tf = rand_weight(&t, DTYPE_BF16, (size_t)N * D, 1.0f);   /* N rows of D: a table of V_local = N */
    int ids[4] = {7, 7 + N - 1, 3, 7 + N / 2};
    run_embedding(dut, h, t, DTYPE_BF16, ids, 4, D, 7, N);
    run_embedding(dut, f, tf, DTYPE_F32, ids, 4, D, 7, N);
    snprintf(sh, sizeof sh, "embedding:N=4,D=%d,v0=7,V_local=%d", D, N);
    cmp_bits("inv.bf16_eq_fp32", DTYPE_BF16, sh, h, f, (size_t)4 * D);
    free(x), free(w), free(wf), free(h), free(f), free(hw), free(fw), free(g), free(dw0), free(t), free(tf);
}
/* rmsnorm, round_to / pack / unpack, rope_table and rope, in that order (forward_cases) */
void norm_rope_cases(void) {
    for (int dt = 0; dt < 2; dt++) {
        case_rmsnorm(1, 1, 1e-5f, 1.0f, 0, (DType)dt);
        case_rmsnorm(7, 33, 1e-6f, 1.0f, 1, (DType)dt);
        case_rmsnorm(3, 256, 1e-5f, 1.0f, 0, (DType)dt);
        case_rmsnorm(17, 1000, 1e-6f, 30.0f, 0, (DType)dt);
        case_rmsnorm(1, 4096, 1e-5f, 1e-3f, 0, (DType)dt);
        case_rmsnorm(2, 8193, 1e-6f, 1000.0f, 0, (DType)dt);
    }
    for (int dt = 0; dt < 2; dt++) {
        case_round_to(4099, (DType)dt), case_pack(4099, (DType)dt), case_unpack(4099, (DType)dt);
        case_pack(1, (DType)dt), case_unpack(1, (DType)dt);
    }
    const int pos[10] = {0, 1, 2, 17, 100, 1000, 4095, 32767, 100000, 123457}, far[1] = {131071};
    case_rope_table(10, pos, 64, 10000.0);
    case_rope_table(10, pos, 80, 1e6);
    case_rope_table(1, far, 128, 500000.0);
    for (int b = 0; b < 2; b++) case_rope(b, 7, 3, 64), case_rope(b, 1, 32, 128), case_rope(b, 5, 2, 40);
}
void elementwise_cases(void) {
    case_swiglu(1, 0), case_swiglu(4099, 0), case_swiglu(17, 1);
    case_add_to(4099, 0), case_add_to(33, 1), case_copy(1), case_copy(4099);
    case_scale_dropout(37, 64, 0, 64, 0.1f), case_scale_dropout(5, 48, 48, 96, 0.5f);
    case_tree_sum(1, 7), case_tree_sum(2, 1000), case_tree_sum(3, 65), case_tree_sum(4, 4096), case_tree_sum(8, 333);
    const int rows[7] = {12, 0, 5, 5, 7, 12, 1}, one[1] = {0};
    case_gather_rows(13, 7, rows, 33);
    case_gather_rows(1, 1, one, 1);
    const int ids[8] = {100, 149, 99, 150, 0, 123, 123, 101}, big[3] = {7, 0, 3};
    for (int dt = 0; dt < 2; dt++) {
        case_embedding(8, ids, 33, 100, 50, (DType)dt);
        case_embedding(3, big, 4096, 0, 8, (DType)dt);   /* LLaMA-width rows */
    }
    case_mask_cols(3, 37, 30), case_mask_cols(3, 37, 0), case_mask_cols(3, 37, -2), case_mask_cols(3, 37, 37);
    case_mask_cols(2, 37, 50), case_mask_cols(1, 32003, 32000);
}
