/* backward.c — cuda_vs_cpu's cases of the backward entries: matmul_backward, rmsnorm_backward,
 * attention_backward, swiglu_backward, embedding_backward, logprob_backward, and matmul_backward's
 * bf16 == fp32. Owns those cases. */
#include "tests/cuda/cuda_vs_cpu.h"

/* ---- matmul_backward -------------------------------------------------------------------------------- */
typedef struct {
    int N, n_in, n_out, has_dx, has_db;
    float *dout, *x, *wf, *dw0, *db0; /* (N, n_out), (N, n_in), (n_out, n_in) fp32 values, the accumulators' start */
    void *w;                          /* (n_out, n_in) in the call's dtype */
} MmBack;
/* ints: dout 12-bit odd integers, x and w +-1, dw0 and db0 +-1 (n_out, N < 4096: exact in any order) */
static MmBack mm_back(int N, int n_in, int n_out, int has_dx, int has_db, DType wt, int ints) {
    MmBack m = {N, n_in, n_out, has_dx, has_db, NULL, NULL, NULL, NULL, NULL, NULL};
    if (ints) {
        m.dout = rand_ints((size_t)N * n_out, 12), m.x = rand_ints((size_t)N * n_in, 0);
        m.wf = rand_ints((size_t)n_out * n_in, 0), m.w = store_weight(m.wf, wt, (size_t)n_out * n_in);
        m.dw0 = rand_ints((size_t)n_out * n_in, 0), m.db0 = rand_ints(n_out, 0);
        return m;
    }
    m.dout = rand_f32((size_t)N * n_out, 1.0f), m.x = rand_f32((size_t)N * n_in, 1.0f);
    m.wf = rand_weight(&m.w, wt, (size_t)n_out * n_in, 1.0f);
    m.dw0 = rand_f32((size_t)n_out * n_in, 1.0f), m.db0 = rand_f32(n_out, 1.0f);
    return m;
}
static void free_mm_back(MmBack *m) { free(m->dout), free(m->x), free(m->wf), free(m->w), free(m->dw0), free(m->db0); }
static void run_matmul_backward(const Backend *be, float *dx, float *dw, float *db, const MmBack *m, DType wt) {
    Dev d = {be, {0}, 0};
    float *ddx = m->has_dx ? dput(&d, NULL, nf(m->N, m->n_in)) : NULL, *ddw = dput(&d, m->dw0, nf(m->n_out, m->n_in));
    float *ddb = m->has_db ? dput(&d, m->db0, nf(m->n_out, 1)) : NULL;
    be->matmul_backward(ddx, ddw, ddb, dput(&d, m->dout, nf(m->N, m->n_out)), dput(&d, m->x, nf(m->N, m->n_in)),
                        dput(&d, m->w, nw(wt, m->n_out, m->n_in)), wt, m->N, m->n_in, m->n_out);
    if (ddx) dget(&d, dx, ddx, nf(m->N, m->n_in));
    dget(&d, dw, ddw, nf(m->n_out, m->n_in));
    if (ddb) dget(&d, db, ddb, nf(m->n_out, 1));
    dfree(&d);
}
static void cmp_matmul_backward(const MmBack *m, DType wt, const char *sh, float *const *got, float *const *want,
                                int ints) {
    int N = m->N, n_in = m->n_in, n_out = m->n_out;
    if (ints) {   /* exact: see the tolerance comment */
        if (m->has_dx) cmp_exact("matmul_backward.dx", wt, sh, got[0], want[0], (size_t)N * n_in);
        cmp_exact("matmul_backward.dw", wt, sh, got[1], want[1], (size_t)n_out * n_in);
        if (m->has_db) cmp_exact("matmul_backward.db", wt, sh, got[2], want[2], n_out);
        return;
    }
    double *mdx = dzeros((size_t)N * n_in), *mdw = dzeros((size_t)n_out * n_in), *mdb = dzeros(n_out);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < n_out; o++) {
            double g = fabs(m->dout[(size_t)n * n_out + o]);
            mdb[o] += g;
            for (int i = 0; i < n_in; i++) {
                mdx[(size_t)n * n_in + i] += g * fabs(m->wf[(size_t)o * n_in + i]);
                mdw[(size_t)o * n_in + i] += g * fabs(m->x[(size_t)n * n_in + i]);
            }
        }
    for (size_t i = 0; i < (size_t)n_out * n_in; i++) mdw[i] += fabs(m->dw0[i]);
    for (int o = 0; o < n_out; o++) mdb[o] += fabs(m->db0[o]);
    if (m->has_dx) cmp_tol("matmul_backward.dx", wt, sh, got[0], want[0], (size_t)N * n_in, mdx, 2 * gam(n_out), 0.0);
    cmp_tol("matmul_backward.dw", wt, sh, got[1], want[1], (size_t)n_out * n_in, mdw, 2 * gam(N + 1), 0.0);
    if (m->has_db) cmp_tol("matmul_backward.db", wt, sh, got[2], want[2], n_out, mdb, 2 * gam(N + 1), 0.0);
    free(mdx), free(mdw), free(mdb);
}
static void case_matmul_backward(int N, int n_in, int n_out, int has_dx, int has_db, DType wt, int ints) {
    cur_entry = "matmul_backward";
    MmBack m = mm_back(N, n_in, n_out, has_dx, has_db, wt, ints);
    float *want[3], *got[3];
    size_t sizes[3] = {(size_t)N * n_in, (size_t)n_out * n_in, (size_t)n_out};
    for (int i = 0; i < 3; i++) want[i] = xmalloc(fb(sizes[i])), got[i] = xmalloc(fb(sizes[i]));
    run_matmul_backward(ref, want[0], want[1], want[2], &m, wt);
    run_matmul_backward(dut, got[0], got[1], got[2], &m, wt);
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,n_in=%d,n_out=%d%s%s%s", N, n_in, n_out, has_dx ? "" : ",dx=NULL", has_db ? ",db" : "",
             ints ? ",ints_exact" : "");
    cmp_matmul_backward(&m, wt, sh, got, want, ints);
    for (int i = 0; i < 3; i++) free(want[i]), free(got[i]);
    free_mm_back(&m);
}

/* ---- rmsnorm_backward ---------------------------------------------------------------------------------- */
/* alias: dx is dout's buffer (the contract allows it) */
void run_rmsnorm_backward(const Backend *be, float *dx, float *dw, const float *dout, const float *x,
                                 const float *dw0, const void *w, DType wt, int N, int D, float eps, int alias) {
    Dev d = {be, {0}, 0};
    float *dg = dput(&d, dout, nf(N, D)), *ddx = alias ? dg : dput(&d, NULL, nf(N, D)), *ddw = dput(&d, dw0, nf(D, 1));
    be->rmsnorm_backward(ddx, ddw, dg, dput(&d, x, nf(N, D)), dput(&d, w, nw(wt, D, 1)), wt, N, D, eps);
    dget(&d, dx, ddx, nf(N, D)), dget(&d, dw, ddw, nf(D, 1));
    dfree(&d);
}
static void rmsnorm_backward_mags(double *mdx, double *mdw, const float *g, const float *x, const float *wf,
                                  const float *dw0, int N, int D, float eps) {
    for (int i = 0; i < D; i++) mdw[i] = fabs(dw0[i]);
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * D, *gr = g + (size_t)n * D;
        double r = rms_r(xr, D, eps), C = 0.0;
        for (int i = 0; i < D; i++) C += fabs((double)gr[i] * wf[i] * xr[i] * r) / D;
        for (int i = 0; i < D; i++) {
            double xh = fabs(xr[i] * r);
            mdx[(size_t)n * D + i] = r * (fabs((double)gr[i] * wf[i]) + xh * C);
            mdw[i] += fabs(gr[i]) * xh;
        }
    }
}
static void case_rmsnorm_backward(int N, int D, float eps, int alias, DType wt) {
    cur_entry = "rmsnorm_backward";
    void *w;
    float *g = rand_f32((size_t)N * D, 1.0f), *x = rand_f32((size_t)N * D, 2.0f), *wf = rand_weight(&w, wt, D, 1.0f);
    float *dw0 = rand_f32(D, 1.0f), *wdw = xmalloc(fb(D)), *gdw = xmalloc(fb(D));   /* (D) */
    float *wdx = xmalloc(nf(N, D)), *gdx = xmalloc(nf(N, D));                       /* (N, D) */
    run_rmsnorm_backward(ref, wdx, wdw, g, x, dw0, w, wt, N, D, eps, alias);
    run_rmsnorm_backward(dut, gdx, gdw, g, x, dw0, w, wt, N, D, eps, alias);
    double *mdx = dzeros((size_t)N * D), *mdw = dzeros(D);
    rmsnorm_backward_mags(mdx, mdw, g, x, wf, dw0, N, D, eps);
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,D=%d,eps=%.0e%s", N, D, (double)eps, alias ? ",dx=dout" : "");
    cmp_tol("rmsnorm_backward.dx", wt, sh, gdx, wdx, (size_t)N * D, mdx, 5 * gam(D) + 46 * U, 0.0);
    cmp_tol("rmsnorm_backward.dw", wt, sh, gdw, wdw, D, mdw, gam(D) + 14 * U + 2 * gam(N + 1), 0.0);
    free(g), free(x), free(w), free(wf), free(dw0), free(wdx), free(gdx), free(wdw), free(gdw), free(mdx), free(mdw);
}

/* ---- attention_backward --------------------------------------------------------------------------------- */
typedef struct {
    int T, H, Hkv, Dh, window;
    float *q, *k, *v, *dout; /* (T, H*Dh), (T, Hkv*Dh) x 2, (T, H*Dh) */
} AttnBack;
static void run_attention_backward(const Backend *be, float *const *res, const AttnBack *a) {
    Dev d = {be, {0}, 0};
    size_t qn = (size_t)a->T * a->H * a->Dh, kn = (size_t)a->T * a->Hkv * a->Dh;
    float *dq = dput(&d, NULL, fb(qn)), *dk = dput(&d, NULL, fb(kn)), *dv = dput(&d, NULL, fb(kn));
    float *sc = dput(&d, NULL, nf(threads() * 2, a->T));
    be->attention_backward(dq, dk, dv, dput(&d, a->dout, fb(qn)), dput(&d, a->q, fb(qn)), dput(&d, a->k, fb(kn)),
                           dput(&d, a->v, fb(kn)), a->T, a->H, a->Hkv, a->Dh, a->window, sc);
    dget(&d, res[0], dq, fb(qn)), dget(&d, res[1], dk, fb(kn)), dget(&d, res[2], dv, fb(kn));
    dfree(&d);
}
/* adds query (i, h)'s share to the mags (see the tolerance comment); p: its probabilities, A (T) scratch */
static void attention_backward_row(double *const *mag, const AttnBack *a, const double *p, double *A, int i, int h) {
    int Dh = a->Dh, hk = h / (a->H / a->Hkv), j0 = first_key(i, a->window);
    size_t qs = (size_t)a->H * Dh, ks = (size_t)a->Hkv * Dh;
    const float *qi = a->q + i * qs + (size_t)h * Dh, *gi = a->dout + i * qs + (size_t)h * Dh;
    double scale = 1.0f / sqrtf((float)Dh), B = 0.0;
    for (int j = j0; j <= i; j++) B += p[j] * (A[j] = dot_mag(gi, a->v + j * ks + (size_t)hk * Dh, Dh));
    for (int j = j0; j <= i; j++) {
        const float *kj = a->k + j * ks + (size_t)hk * Dh;
        double w = scale * p[j] * (A[j] + B);
        for (int d = 0; d < Dh; d++) {
            mag[0][i * qs + (size_t)h * Dh + d] += w * fabs(kj[d]);
            mag[1][j * ks + (size_t)hk * Dh + d] += w * fabs(qi[d]);
            mag[2][j * ks + (size_t)hk * Dh + d] += p[j] * fabs(gi[d]);
        }
    }
}
/* mag[0..2]: dq, dk, dv's magnitudes; tol[0..2] their relative tolerances */
static void attention_backward_mags(double *const *mag, double *tol, const AttnBack *a) {
    int T = a->T, Dh = a->Dh, group = a->H / a->Hkv;
    double scale = 1.0f / sqrtf((float)Dh), S = 0.0, *p = dzeros(T), *A = dzeros(T);
    for (int h = 0; h < a->H; h++)
        for (int i = 0; i < T; i++) {
            const float *qi = a->q + ((size_t)i * a->H + h) * Dh;
            S = fmax(S, ref_probs(p, qi, a->k, (size_t)a->Hkv * Dh, h / group, Dh, first_key(i, a->window), i, scale));
            attention_backward_row(mag, a, p, A, i, h);
        }
    int n = most_keys(T, a->window), m = group * n;
    double ep = softmax_eps(S, Dh, n), c = 2 * ep + gam(n) + gam(Dh) + 4 * U;
    tol[0] = 2 * (c + gam(n) + U), tol[1] = 2 * (c + gam(m) + U), tol[2] = 2 * (ep + gam(m) + U);
    free(p), free(A);
}
static void case_attention_backward(int T, int H, int Hkv, int Dh, int window) {
    cur_entry = "attention_backward";
    size_t qn = (size_t)T * H * Dh, kn = (size_t)T * Hkv * Dh, sizes[3] = {qn, kn, kn};
    AttnBack a = {T, H, Hkv, Dh, window, rand_f32(qn, 1.0f), rand_f32(kn, 1.0f), rand_f32(kn, 1.0f), rand_f32(qn, 1.0f)};
    float *want[3], *got[3];
    double *mag[3], tol[3];
    for (int i = 0; i < 3; i++) {
        want[i] = xmalloc(fb(sizes[i])), got[i] = xmalloc(fb(sizes[i]));
        mag[i] = dzeros(sizes[i]);
    }
    run_attention_backward(ref, want, &a);
    run_attention_backward(dut, got, &a);
    attention_backward_mags(mag, tol, &a);
    char sh[96];
    snprintf(sh, sizeof sh, "T=%d,H=%d,Hkv=%d,Dh=%d,win=%d", T, H, Hkv, Dh, window);
    const char *names[3] = {"attention_backward.dq", "attention_backward.dk", "attention_backward.dv"};
    for (int i = 0; i < 3; i++) cmp_tol(names[i], DTYPE_F32, sh, got[i], want[i], sizes[i], mag[i], tol[i], 0.0);
    for (int i = 0; i < 3; i++) free(want[i]), free(got[i]), free(mag[i]);
    free(a.q), free(a.k), free(a.v), free(a.dout);
}

/* ---- swiglu_backward, embedding_backward, logprob_backward --------------------------------------------- */
static void case_swiglu_backward(size_t n, int edges) {
    cur_entry = "swiglu_backward";
    float *g = swiglu_gates(n, edges), *u = rand_f32(n, 2.0f), *dout = rand_f32(n, 1.0f);
    float *wdg = xmalloc(fb(n)), *wdu = xmalloc(fb(n)), *gdg = xmalloc(fb(n)), *gdu = xmalloc(fb(n));
    float *dgs[2] = {wdg, gdg}, *dus[2] = {wdu, gdu};
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *dg = dput(&d, NULL, fb(n)), *du = dput(&d, NULL, fb(n));
        be[s]->swiglu_backward(dg, du, dput(&d, dout, fb(n)), dput(&d, g, fb(n)), dput(&d, u, fb(n)), n);
        dget(&d, dgs[s], dg, fb(n)), dget(&d, dus[s], du, fb(n));
        dfree(&d);
    }
    double *mg = dzeros(n), *mu = dzeros(n);
    for (size_t i = 0; i < n; i++) {
        double sg = sigmoid(g[i]), F = 1.0 + g[i] * (1.0 - sg);
        mg[i] = fabs((double)dout[i] * u[i] * sg) * (1.0 + fabs(g[i]) + fabs(F));
        mu[i] = fabs((double)dout[i] * g[i] * sg);
    }
    char sh[96];
    snprintf(sh, sizeof sh, "n=%zu%s", n, edges ? ",exp_edges" : "");
    cmp_tol("swiglu_backward.dgate", DTYPE_F32, sh, gdg, wdg, n, mg, 20 * U, FLT_MIN);
    cmp_tol("swiglu_backward.dup", DTYPE_F32, sh, gdu, wdu, n, mu, 16 * U, FLT_MIN);
    free(g), free(u), free(dout), free(wdg), free(wdu), free(gdg), free(gdu), free(mg), free(mu);
}
static void case_embedding_backward(int N, const int *ids, int D, int v0, int V_local) {
    cur_entry = "embedding_backward";
    size_t tn = (size_t)V_local * D;
    float *dout = rand_f32((size_t)N * D, 1.0f);                                        /* (N, D) */
    float *t0 = rand_f32(tn, 1.0f), *want = xmalloc(fb(tn)), *got = xmalloc(fb(tn));   /* (V_local, D) */
    float *res[2] = {want, got};
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *dt = dput(&d, t0, fb(tn));
        be[s]->embedding_backward(dt, dput(&d, dout, nf(N, D)), dput(&d, ids, ni(N)), N, D, v0, V_local);
        dget(&d, res[s], dt, fb(tn));
        dfree(&d);
    }
    double *mag = dzeros(tn);
    int *count = xcalloc(V_local, sizeof(int)), most = 0;
    for (size_t i = 0; i < tn; i++) mag[i] = fabs(t0[i]);
    for (int n = 0; n < N; n++) {
        int r = ids[n] - v0;
        if (r < 0 || r >= V_local) continue;
        most = ++count[r] > most ? count[r] : most;
        for (int i = 0; i < D; i++) mag[(size_t)r * D + i] += fabs(dout[(size_t)n * D + i]);
    }
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,D=%d,v0=%d,V_local=%d,%s", N, D, v0, V_local,
             most > 1 ? "repeated_ids" : "distinct_ids");
    if (most > 1) cmp_tol("embedding_backward", DTYPE_F32, sh, got, want, tn, mag, 2 * gam(most + 1), 0.0);
    else cmp_exact("embedding_backward", DTYPE_F32, sh, got, want, tn);
    free(dout), free(t0), free(want), free(got), free(mag), free(count);
}

typedef struct {
    int N, V, v0, with_entropy, in_place;
    float T;
    float *x, *lse, *dlp, *H, *dH; /* (N, V) logits; (N) each */
    int *targets;                  /* (N) */
} LpBack;
static void run_logprob_backward(const Backend *be, float *out, const LpBack *l) {
    Dev d = {be, {0}, 0};
    float *x = dput(&d, l->x, nf(l->N, l->V)), *g = l->in_place ? x : dput(&d, NULL, nf(l->N, l->V));
    const float *H = l->with_entropy ? dput(&d, l->H, nf(l->N, 1)) : NULL;
    const float *dH = l->with_entropy ? dput(&d, l->dH, nf(l->N, 1)) : NULL;
    be->logprob_backward(g, x, dput(&d, l->lse, nf(l->N, 1)), dput(&d, l->targets, ni(l->N)),
                         dput(&d, l->dlp, nf(l->N, 1)), H, dH, l->N, l->V, l->v0, l->T);
    dget(&d, out, g, nf(l->N, l->V));
    dfree(&d);
}
static double *logprob_backward_mag(const LpBack *l) {
    double *mag = dzeros((size_t)l->N * l->V);
    for (int n = 0; n < l->N; n++) {
        if (l->targets[n] < 0) continue;   /* written 0: exact */
        double gn = fabs(l->dlp[n] / l->T), ge = 0.0, h = 0.0;
        if (l->with_entropy) ge = fabs(l->dH[n] / l->T), h = l->H[n];
        for (int c = 0; c < l->V; c++) {
            float z = l->x[(size_t)n * l->V + c] / l->T, zl = z - l->lse[n];
            double p = exp((double)zl), one = l->v0 + c == l->targets[n] ? 1.0 : 0.0;
            mag[(size_t)n * l->V + c] = gn * (p + one) + ge * p * (fabs(zl) + fabs(h) + fabs(zl + h));
        }
    }
    return mag;
}
static void case_logprob_backward(int N, int V, int v0, float T, int with_entropy, int in_place) {
    cur_entry = "logprob_backward";
    LpBack l = {N, V, v0, with_entropy, in_place, T, logits(N, V, 8.0f, 0), xmalloc(fb(N)), rand_f32(N, 1.0f),
                rand_f32(N, 3.0f), rand_f32(N, 1.0f), xmalloc(ni(N))};
    true_lse(l.lse, l.x, N, V, T);
    for (int n = 0; n < N; n++) {   /* none, the shard's first and last column, outside it, inside */
        const int pick[] = {-1, v0, v0 + V - 1, v0 > 0 ? v0 - 1 : v0 + V, v0 + V, v0 + V / 3};
        l.targets[n] = pick[n % 6];
        if (n % 4 == 3) l.dH[n] = 0.0f;   /* the entropy's term off in this row */
    }
    float *want = xmalloc(nf(N, V)), *got = xmalloc(nf(N, V));
    run_logprob_backward(ref, want, &l);
    run_logprob_backward(dut, got, &l);
    double *mag = logprob_backward_mag(&l);
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,V=%d,v0=%d,T=%g%s%s", N, V, v0, (double)T, with_entropy ? ",entropy" : "",
             in_place ? ",in_place" : "");
    cmp_tol("logprob_backward", DTYPE_F32, sh, got, want, (size_t)N * V, mag, 14 * U, 0.0);
    free(l.x), free(l.lse), free(l.dlp), free(l.H), free(l.dH), free(l.targets), free(want), free(got), free(mag);
}

/* matmul_backward at n_out <= 512 only: the CPU's bf16 dx is the sum over blocks of 512 upcast weight
 * rows (kernels/cpu/backward.h), so past 512 its own bf16 bits differ from its fp32 ones */
void inv_bf16_matmul_backward(int N, int n_in, int n_out) {
    cur_entry = "inv";
    MmBack m = mm_back(N, n_in, n_out, 1, 1, DTYPE_BF16, 0), mf = m;
    mf.w = m.wf;
    float *h[3], *f[3];
    size_t sizes[3] = {(size_t)N * n_in, (size_t)n_out * n_in, (size_t)n_out};
    for (int i = 0; i < 3; i++) h[i] = xmalloc(fb(sizes[i])), f[i] = xmalloc(fb(sizes[i]));
    run_matmul_backward(dut, h[0], h[1], h[2], &m, DTYPE_BF16);
    run_matmul_backward(dut, f[0], f[1], f[2], &mf, DTYPE_F32);
    const char *outs[3] = {"dx", "dw", "db"};
    for (int i = 0; i < 3; i++) {
        char sh[96];
        snprintf(sh, sizeof sh, "matmul_backward.%s:N=%d,n_in=%d,n_out=%d", outs[i], N, n_in, n_out);
        cmp_bits("inv.bf16_eq_fp32", DTYPE_BF16, sh, h[i], f[i], sizes[i]);
    }
    for (int i = 0; i < 3; i++) free(h[i]), free(f[i]);
    free_mm_back(&m);
}

void backward_cases(void) {
    static const int mb[][5] = {{1, 1, 1, 1, 1}, {7, 33, 65, 1, 0}, {37, 130, 600, 1, 1}, {64, 2048, 48, 1, 0},
                                {5, 64, 1000, 0, 1}};
    for (int dt = 0; dt < 2; dt++)
        for (size_t i = 0; i < sizeof mb / sizeof mb[0]; i++)
            case_matmul_backward(mb[i][0], mb[i][1], mb[i][2], mb[i][3], mb[i][4], (DType)dt, 0);
    for (int dt = 0; dt < 2; dt++) case_matmul_backward(64, 256, 2048, 1, 1, (DType)dt, 1);
    for (int dt = 0; dt < 2; dt++) {
        case_rmsnorm_backward(1, 16, 1e-5f, 0, (DType)dt);
        case_rmsnorm_backward(7, 33, 1e-6f, 1, (DType)dt);
        case_rmsnorm_backward(5, 2048, 1e-5f, 0, (DType)dt);
        case_rmsnorm_backward(3, 4097, 1e-5f, 0, (DType)dt);
    }
    case_attention_backward(1, 1, 1, 8, 0);
    case_attention_backward(37, 8, 2, 64, 0);
    case_attention_backward(50, 4, 4, 40, 13);
    case_attention_backward(20, 4, 1, 128, 0);
    case_swiglu_backward(1, 0), case_swiglu_backward(4099, 0), case_swiglu_backward(17, 1);
    const int distinct[6] = {100, 149, 99, 150, 120, 101}, repeated[9] = {3, 3, 0, 3, 7, 0, 12, 3, 7};
    case_embedding_backward(6, distinct, 33, 100, 50);
    case_embedding_backward(9, repeated, 64, 0, 8);
    case_logprob_backward(6, 1001, 500, 1.0f, 0, 0);
    case_logprob_backward(12, 1001, 0, 0.7f, 1, 0);
    case_logprob_backward(6, 1001, 500, 1.0f, 1, 1);
    case_logprob_backward(1, 32000, 0, 1.0f, 0, 0);
}
