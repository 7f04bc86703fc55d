/* attention.c — cuda_vs_cpu's KV-cache and attention cases (kv_store, attention, kv_store_batch,
 * attention_batch) and attention's invariances (cache layout, prefill / decode / chunk split), with
 * the softmax reference the backward cases share. Owns those cases. */
#include "tests/cuda/cuda_vs_cpu.h"

/* ---- the KV cache: pools, tables, kv_store -------------------------------------------------------- */
/* [0, n_pool) shuffled: its first entries, as many as a sequence needs, are its block table */
static int *shuffled_table(int n_pool) {
    int *ids = xmalloc(ni(n_pool));
    for (int i = 0; i < n_pool; i++) ids[i] = i;
    for (int i = n_pool - 1; i > 0; i--) {
        int j = rand_int(i + 1), t = ids[i];
        ids[i] = ids[j], ids[j] = t;
    }
    return ids;
}
/* The paged pool (n_pool, Hkv, block, Dh) holding rows kr (n_keys, Hkv * Dh) through table (host);
 * the slots no key fills hold NaN: a recycled block may hold anything, so a key past the query or
 * an unused slot must never reach an output (0 * NaN is NaN) */
static float *to_pool(const float *kr, int n_keys, int Hkv, int Dh, int block, const int *table, int n_pool) {
    size_t kvd = (size_t)Hkv * Dh, n = (size_t)n_pool * block * kvd;
    float *pool = xmalloc(fb(n));
    for (size_t i = 0; i < n; i++) pool[i] = NAN;
    KVLayout kv = kv_paged(table, block, Dh);   /* a host table: host-side offsets only */
    for (int j = 0; j < n_keys; j++)
        for (int hk = 0; hk < Hkv; hk++)
            memcpy(pool + kv_offset(&kv, kvd, j) + hk * kv.head, kr + j * kvd + (size_t)hk * Dh, fb(Dh));
    return pool;
}
/* T rows k, v stored at positions pos into pools (n_pool blocks) through table (NULL: kv_rows of n_pool * block
 * positions); the pools start as kc0, vc0 */
static void case_kv_store(int T, const int *pos, int Hkv, int Dh, int block, int n_table, int n_pool) {
    cur_entry = "kv_store";
    size_t kvd = (size_t)Hkv * Dh, pn = (size_t)n_pool * block * kvd;
    float *k = rand_f32(T * kvd, 1.0f), *v = rand_f32(T * kvd, 1.0f);   /* (T, Hkv*Dh) */
    float *kc0 = rand_f32(pn, 1.0f), *vc0 = rand_f32(pn, 1.0f);          /* the pools before: (pn) */
    int *table = n_table ? shuffled_table(n_pool) : NULL;
    float *kw = xmalloc(fb(pn)), *vw = xmalloc(fb(pn)), *kg = xmalloc(fb(pn)), *vg = xmalloc(fb(pn));
    float *kres[2] = {kw, kg}, *vres[2] = {vw, vg};
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *kc = dput(&d, kc0, fb(pn)), *vc = dput(&d, vc0, fb(pn));
        KVLayout kv = table ? kv_paged(dput(&d, table, ni(n_table)), block, Dh) : kv_rows(n_pool * block, Hkv, Dh);
        const float *dk = dput(&d, k, fb(T * kvd)), *dv = dput(&d, v, fb(T * kvd));
        be[s]->kv_store(kc, vc, dk, dv, &kv, dput(&d, pos, ni(T)), T, Hkv, Dh);
        dget(&d, kres[s], kc, fb(pn)), dget(&d, vres[s], vc, fb(pn));
        dfree(&d);
    }
    char sh[96];
    snprintf(sh, sizeof sh, "T=%d,Hkv=%d,Dh=%d,%s,block=%d", T, Hkv, Dh, table ? "paged" : "rows", block);
    cmp_exact("kv_store.k", DTYPE_F32, sh, kg, kw, pn);
    cmp_exact("kv_store.v", DTYPE_F32, sh, vg, vw, pn);
    free(k), free(v), free(kc0), free(vc0), free(table), free(kw), free(vw), free(kg), free(vg);
}

/* ---- attention -------------------------------------------------------------------------------------- */
typedef struct {
    int Tq, q_pos0, H, Hkv, Dh, window, block; /* block 0: kv_rows */
    float *q;                                  /* (Tq, H * Dh) */
    float *kr, *vr;                            /* the keys and values as rows (n_keys, Hkv * Dh) */
    float *k, *v;                              /* what the entry reads: kr, vr, or pools (n_pool, Hkv, block, Dh) */
    size_t kv_floats;                          /* floats in k (and in v) */
    int *table, n_table;                       /* paged: the block table (n_table), host */
} AttnIn;

int first_key(int i, int window) { return window > 0 && i - window + 1 > 0 ? i - window + 1 : 0; }
int most_keys(int n_keys, int window) { return window > 0 && window < n_keys ? window : n_keys; }

static AttnIn attn_in(int Tq, int q_pos0, int H, int Hkv, int Dh, int window, int block, float amp) {
    int n_keys = q_pos0 + Tq;
    size_t kvd = (size_t)Hkv * Dh;
    AttnIn a = {Tq, q_pos0, H, Hkv, Dh, window, block, NULL, NULL, NULL, NULL, NULL, 0, NULL, 0};
    a.q = rand_f32((size_t)Tq * H * Dh, amp);
    a.kr = rand_f32(n_keys * kvd, amp), a.vr = rand_f32(n_keys * kvd, 1.0f);
    a.k = a.kr, a.v = a.vr, a.kv_floats = n_keys * kvd;
    if (block) {
        a.n_table = (n_keys + block - 1) / block;
        int n_pool = a.n_table + 2;
        a.table = shuffled_table(n_pool);
        a.k = to_pool(a.kr, n_keys, Hkv, Dh, block, a.table, n_pool);
        a.v = to_pool(a.vr, n_keys, Hkv, Dh, block, a.table, n_pool);
        a.kv_floats = (size_t)n_pool * block * kvd;
    }
    return a;
}
static void free_attn(AttnIn *a) {
    if (a->block) free(a->k), free(a->v);
    free(a->q), free(a->kr), free(a->vr), free(a->table);
}
static void run_attention(const Backend *be, float *out, const AttnIn *a) {
    Dev d = {be, {0}, 0};
    int n_keys = a->q_pos0 + a->Tq;
    size_t qn = (size_t)a->Tq * a->H * a->Dh;
    float *o = dput(&d, NULL, fb(qn)), *sc = dput(&d, NULL, nf(threads() * a->H, n_keys));
    KVLayout kv = kv_rows(n_keys, a->Hkv, a->Dh);
    if (a->block) kv = kv_paged(dput(&d, a->table, ni(a->n_table)), a->block, a->Dh);
    const float *q = dput(&d, a->q, fb(qn)), *k = dput(&d, a->k, fb(a->kv_floats)), *v = dput(&d, a->v, fb(a->kv_floats));
    be->attention(o, q, k, v, &kv, a->Tq, a->q_pos0, a->H, a->Hkv, a->Dh, a->window, sc);
    dget(&d, out, o, fb(qn));
    dfree(&d);
}
/* p[j0..i] = the softmax of query qh (Dh) over keys j0..i of kv head hk in rows kr (., kvd), in
 * double; returns max_j scale sum_d |q_d k_jd| (the S of the tolerance) */
double ref_probs(double *p, const float *qh, const float *kr, size_t kvd, int hk, int Dh, int j0, int i,
                        double scale) {
    double mx = -INFINITY, S = 0.0, sum = 0.0;
    for (int j = j0; j <= i; j++) {
        const float *kj = kr + j * kvd + (size_t)hk * Dh;
        double s = 0.0;
        for (int d = 0; d < Dh; d++) s += (double)qh[d] * kj[d];
        p[j] = scale * s, mx = fmax(mx, p[j]), S = fmax(S, scale * dot_mag(qh, kj, Dh));
    }
    for (int j = j0; j <= i; j++) sum += p[j] = exp(p[j] - mx);
    for (int j = j0; j <= i; j++) p[j] /= sum;
    return S;
}
/* e_p of the tolerance comment: one side's relative error of a probability */
double softmax_eps(double S, int Dh, int n) {
    double E = 2 * gam(Dh + 1) * S + 8 * U * S;
    return E + gam(n) + (5.0 * n + 5) * U;
}
/* mag (Tq, H * Dh) = sum_j p_j |v_j|; returns the relative tolerance */
static double attention_mag(double *mag, const AttnIn *a) {
    int group = a->H / a->Hkv, Dh = a->Dh, n_keys = a->q_pos0 + a->Tq;
    size_t kvd = (size_t)a->Hkv * Dh;
    double scale = 1.0f / sqrtf((float)Dh), S = 0.0, *p = dzeros(n_keys);
    for (int t = 0; t < a->Tq; t++)
        for (int h = 0; h < a->H; h++) {
            int i = a->q_pos0 + t, j0 = first_key(i, a->window), hk = h / group;
            S = fmax(S, ref_probs(p, a->q + ((size_t)t * a->H + h) * Dh, a->kr, kvd, hk, Dh, j0, i, scale));
            for (int d = 0; d < Dh; d++) {
                double m = 0.0;
                for (int j = j0; j <= i; j++) m += p[j] * fabs(a->vr[j * kvd + (size_t)hk * Dh + d]);
                mag[((size_t)t * a->H + h) * Dh + d] = m;
            }
        }
    free(p);
    int n = most_keys(n_keys, a->window);
    return 2 * (softmax_eps(S, Dh, n) + gam(n));
}
static void case_attention(int Tq, int q_pos0, int H, int Hkv, int Dh, int window, int block) {
    cur_entry = "attention";
    AttnIn a = attn_in(Tq, q_pos0, H, Hkv, Dh, window, block, 1.0f);
    size_t qn = (size_t)Tq * H * Dh;
    float *want = xmalloc(fb(qn)), *got = xmalloc(fb(qn));
    run_attention(ref, want, &a);
    run_attention(dut, got, &a);
    double *mag = dzeros(qn), tol = attention_mag(mag, &a);
    char sh[96];
    snprintf(sh, sizeof sh, "Tq=%d,pos0=%d,H=%d,Hkv=%d,Dh=%d,win=%d,%s=%d", Tq, q_pos0, H, Hkv, Dh, window,
             block ? "paged" : "rows", block ? block : q_pos0 + Tq);
    cmp_tol("attention", DTYPE_F32, sh, got, want, qn, mag, tol, 0.0);
    free(want), free(got), free(mag);
    free_attn(&a);
}

/* One sequence of T tokens on the dut: a prefill over kv_rows is the reference; the same over a paged
 * cache (block 16, shuffled table, filled by the dut's kv_store, NaN elsewhere); T one-token decode
 * steps, step p storing key p into a fresh NaN pool and attending over keys 0..p (Tq 1, q_pos0 p);
 * and chunks of rows [p0, T) with q_pos0 = p0: all the same bits. */
typedef struct {
    int T, H, Hkv, Dh, window, n_table, n_pool;
    float *q, *k, *v, *sc; /* the dut's: (T, H*Dh), (T, Hkv*Dh) x 2, scratch */
    int *table, *pos;      /* the dut's: (n_table), (T) = 0..T-1 */
    float *nan_pool;       /* host: (n_pool, Hkv, 16, Dh) of NaN */
} InvAttn;
enum { INV_BLOCK = 16 };
static float *inv_pool(Dev *d, const InvAttn *a) { /* a fresh dut pool of NaN */
    return dput(d, a->nan_pool, nf(a->n_pool * INV_BLOCK, a->Hkv * a->Dh));
}
static void inv_attention_paged(Dev *d, const InvAttn *a, const float *full, const char *sh) {
    size_t qn = (size_t)a->T * a->H * a->Dh;
    KVLayout kv = kv_paged(a->table, INV_BLOCK, a->Dh);
    float *kc = inv_pool(d, a), *vc = inv_pool(d, a), *o = dput(d, NULL, fb(qn)), *got = xmalloc(fb(qn));
    dut->kv_store(kc, vc, a->k, a->v, &kv, a->pos, a->T, a->Hkv, a->Dh);
    dut->attention(o, a->q, kc, vc, &kv, a->T, 0, a->H, a->Hkv, a->Dh, a->window, a->sc);
    dget(d, got, o, fb(qn));
    cmp_bits("inv.attention_paged", DTYPE_F32, sh, got, full, qn);
    /* chunks: rows [p0, T) at q_pos0 = p0 over the same cache */
    const int p0s[] = {1, INV_BLOCK, a->T / 2 + 1, a->T - 1};
    for (int c = 0; c < 4; c++) {
        size_t off = (size_t)p0s[c] * a->H * a->Dh;
        dut->attention(o, a->q + off, kc, vc, &kv, a->T - p0s[c], p0s[c], a->H, a->Hkv, a->Dh, a->window, a->sc);
        dget(d, got, o, fb(qn - off));
        char shc[112];
        snprintf(shc, sizeof shc, "%s,p0=%d", sh, p0s[c]);
        cmp_bits("inv.attention_chunk", DTYPE_F32, shc, got, full + off, qn - off);
    }
    free(got);
}
static void inv_attention_decode(Dev *d, const InvAttn *a, const float *full, const char *sh) {
    size_t qs = (size_t)a->H * a->Dh, kvd = (size_t)a->Hkv * a->Dh;
    KVLayout kv = kv_paged(a->table, INV_BLOCK, a->Dh);
    float *kc = inv_pool(d, a), *vc = inv_pool(d, a), *o = dput(d, NULL, fb(a->T * qs)), *got = xmalloc(fb(a->T * qs));
    for (int p = 0; p < a->T; p++) {
        dut->kv_store(kc, vc, a->k + p * kvd, a->v + p * kvd, &kv, a->pos + p, 1, a->Hkv, a->Dh);
        dut->attention(o + p * qs, a->q + p * qs, kc, vc, &kv, 1, p, a->H, a->Hkv, a->Dh, a->window, a->sc);
    }
    dget(d, got, o, fb(a->T * qs));
    cmp_bits("inv.attention_decode", DTYPE_F32, sh, got, full, a->T * qs);
    free(got);
}
void inv_attention(int T, int H, int Hkv, int Dh, int window) {
    cur_entry = "inv";
    size_t qn = (size_t)T * H * Dh, kn = (size_t)T * Hkv * Dh;
    float *q = rand_f32(qn, 1.0f), *k = rand_f32(kn, 1.0f), *v = rand_f32(kn, 1.0f), *full = xmalloc(fb(qn));
    int n_table = (T + INV_BLOCK - 1) / INV_BLOCK, n_pool = n_table + 2, *table = shuffled_table(n_pool);
    int *pos = xmalloc(ni(T));
    for (int t = 0; t < T; t++) pos[t] = t;
    size_t pn = (size_t)n_pool * INV_BLOCK * Hkv * Dh;
    float *nan_pool = xmalloc(fb(pn));
    for (size_t i = 0; i < pn; i++) nan_pool[i] = NAN;
    Dev d = {dut, {0}, 0};
    InvAttn a = {T, H, Hkv, Dh, window, n_table, n_pool, dput(&d, q, fb(qn)), dput(&d, k, fb(kn)), dput(&d, v, fb(kn)),
                 dput(&d, NULL, nf(threads() * H, T)), dput(&d, table, ni(n_table)), dput(&d, pos, ni(T)), nan_pool};
    KVLayout rows = kv_rows(T, Hkv, Dh);
    float *o = dput(&d, NULL, fb(qn));
    dut->attention(o, a.q, a.k, a.v, &rows, T, 0, H, Hkv, Dh, window, a.sc);
    dget(&d, full, o, fb(qn));
    char sh[96];
    snprintf(sh, sizeof sh, "T=%d,H=%d,Hkv=%d,Dh=%d,win=%d,block=%d", T, H, Hkv, Dh, window, INV_BLOCK);
    inv_attention_paged(&d, &a, full, sh);
    inv_attention_decode(&d, &a, full, sh);
    dfree(&d);
    free(q), free(k), free(v), free(full), free(table), free(pos), free(nan_pool);
}

/* kv_store_batch and attention_batch: three sequences (a decode row at position 40, a 5-row chunk
 * at 10..14, a first token) with their own shuffled tables in one NaN-free random pool, one call
 * each; on each backend the bits of kv_store and attention called per sequence (the pools too), and
 * the dut's batch against the ref's batch within attention's bound (kv_store_batch: exact). */
static void batch_paged_case(int window) {
    cur_entry = "attention_batch";
    enum { S = 3, H = 8, Hkv = 2, Dh = 64, BLOCK = 16, STRIDE = 4, POOL = 12 };
    static const int pos0[S] = {40, 10, 0}, rows[S] = {1, 5, 1};
    int seq_start[S + 1] = {0}, N;
    for (int i = 0; i < S; i++) seq_start[i + 1] = seq_start[i] + rows[i];
    N = seq_start[S];
    size_t qd = (size_t)H * Dh, kvd = (size_t)Hkv * Dh, pn = (size_t)POOL * BLOCK * kvd;
    int *perm = shuffled_table(POOL), tables[S * STRIDE], seq[16], pos[16];
    for (int i = 0; i < S * STRIDE; i++) tables[i] = perm[i];   /* disjoint blocks per sequence */
    for (int i = 0; i < S; i++)
        for (int t = seq_start[i]; t < seq_start[i + 1]; t++) seq[t] = i, pos[t] = pos0[i] + t - seq_start[i];
    float *q = rand_f32((size_t)N * qd, 1.0f), *k = rand_f32((size_t)N * kvd, 1.0f), *v = rand_f32((size_t)N * kvd, 1.0f);
    float *pool_k = rand_f32(pn, 1.0f), *pool_v = rand_f32(pn, 1.0f);
    float *res[2][3];   /* [backend][batch out, per-sequence out, batch pool k] */
    const Backend *be[2] = {ref, dut};
    for (int b = 0; b < 2; b++) {
        Dev d = {be[b], {0}, 0};
        const int *dt = dput(&d, tables, ni(S * STRIDE)), *ds = dput(&d, seq, ni(N)), *dp = dput(&d, pos, ni(N));
        const float *dq = dput(&d, q, fb((size_t)N * qd)), *dk = dput(&d, k, fb((size_t)N * kvd));
        const float *dv = dput(&d, v, fb((size_t)N * kvd));
        float *sc = dput(&d, NULL, nf(threads() * H, 64));
        PagedBatch pb = {dt, STRIDE, BLOCK, ds, dp, N, S, 0, seq_start, pos, DTYPE_F32};
        float *kc1 = dput(&d, pool_k, fb(pn)), *vc1 = dput(&d, pool_v, fb(pn)), *o1 = dput(&d, NULL, fb((size_t)N * qd));
        be[b]->kv_store_batch(kc1, vc1, dk, dv, &pb, Hkv, Dh);
        be[b]->attention_batch(o1, dq, kc1, vc1, &pb, H, Hkv, Dh, window, sc, (size_t)H * 64);
        float *kc2 = dput(&d, pool_k, fb(pn)), *vc2 = dput(&d, pool_v, fb(pn)), *o2 = dput(&d, NULL, fb((size_t)N * qd));
        for (int i = 0; i < S; i++) {
            int t0 = seq_start[i];
            KVLayout kv = kv_paged(dt + i * STRIDE, BLOCK, Dh);
            be[b]->kv_store(kc2, vc2, dk + t0 * kvd, dv + t0 * kvd, &kv, dp + t0, rows[i], Hkv, Dh);
            be[b]->attention(o2 + t0 * qd, dq + t0 * qd, kc2, vc2, &kv, rows[i], pos0[i], H, Hkv, Dh, window, sc);
        }
        for (int r = 0; r < 3; r++) res[b][r] = xmalloc(fb(r == 2 ? pn : (size_t)N * qd));
        dget(&d, res[b][0], o1, fb((size_t)N * qd));
        dget(&d, res[b][1], o2, fb((size_t)N * qd));
        dget(&d, res[b][2], kc1, fb(pn));
        float *k2 = xmalloc(fb(pn));
        dget(&d, k2, kc2, fb(pn));
        char sh[96];
        snprintf(sh, sizeof sh, "%s:S=3,N=%d,H=%d,Hkv=%d,Dh=%d,win=%d", b ? "dut" : "ref", N, H, Hkv, Dh, window);
        cmp_bits("inv.attention_batch", DTYPE_F32, sh, res[b][0], res[b][1], (size_t)N * qd);
        cmp_bits("inv.kv_store_batch", DTYPE_F32, sh, res[b][2], k2, pn);
        free(k2);
        dfree(&d);
    }
    char sh[96];
    snprintf(sh, sizeof sh, "S=3,N=%d,H=%d,Hkv=%d,Dh=%d,win=%d,paged=%d", N, H, Hkv, Dh, window, BLOCK);
    cmp_exact("kv_store_batch", DTYPE_F32, sh, res[1][2], res[0][2], pn);
    /* the per-sequence calls are what attention's cases bound; the same bound per sequence */
    double *mag = dzeros((size_t)N * qd), tol = 0.0;
    for (int i = 0; i < S; i++) {
        AttnIn a = {rows[i], pos0[i], H, Hkv, Dh, window, 0, q + (size_t)seq_start[i] * qd, NULL, NULL, NULL, NULL, 0,
                    NULL, 0};
        /* the sequence's keys as rows: positions < pos0 from the pool, its own rows from k, v */
        int n_keys = pos0[i] + rows[i];
        a.kr = xmalloc(fb((size_t)n_keys * kvd)), a.vr = xmalloc(fb((size_t)n_keys * kvd));
        for (int j = 0; j < n_keys; j++)
            for (int hk = 0; hk < Hkv; hk++) {
                size_t slot = ((size_t)tables[i * STRIDE + j / BLOCK] * BLOCK * Hkv + (size_t)hk * BLOCK + j % BLOCK) * Dh;
                const float *ks = j < pos0[i] ? pool_k + slot : k + ((size_t)seq_start[i] + j - pos0[i]) * kvd + hk * Dh;
                const float *vs = j < pos0[i] ? pool_v + slot : v + ((size_t)seq_start[i] + j - pos0[i]) * kvd + hk * Dh;
                memcpy(a.kr + (size_t)j * kvd + hk * Dh, ks, fb(Dh));
                memcpy(a.vr + (size_t)j * kvd + hk * Dh, vs, fb(Dh));
            }
        tol = fmax(tol, attention_mag(mag + (size_t)seq_start[i] * qd, &a));
        free(a.kr), free(a.vr);
    }
    cmp_tol("attention_batch", DTYPE_F32, sh, res[1][0], res[0][0], (size_t)N * qd, mag, tol, 0.0);
    for (int b = 0; b < 2; b++)
        for (int r = 0; r < 3; r++) free(res[b][r]);
    free(mag), free(perm), free(q), free(k), free(v), free(pool_k), free(pool_v);
}
void attention_cases(void) {
    const int scattered[5] = {0, 15, 16, 33, 63}, one[1] = {40}, run[20] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                                                                            14, 15, 16, 17, 18, 19};
    case_kv_store(5, scattered, 2, 64, 16, 4, 6);
    case_kv_store(1, one, 1, 40, 8, 6, 9);
    case_kv_store(20, run, 3, 16, 24, 0, 1);   /* kv_rows of 24 positions */
    batch_paged_case(0);
    batch_paged_case(7);
    case_attention(1, 0, 1, 1, 16, 0, 0);
    case_attention(37, 0, 8, 2, 64, 0, 0);     /* prefill, GQA 4 */
    case_attention(37, 0, 8, 2, 64, 11, 16);   /* sliding window, paged */
    case_attention(1, 70, 4, 1, 128, 0, 16);   /* decode, GQA 4, paged */
    case_attention(9, 40, 6, 3, 40, 17, 8);    /* a chunk, Dh 40, window */
    case_attention(1, 99, 8, 2, 64, 32, 32);   /* decode in a window */
    case_attention(3, 0, 2, 2, 80, 0, 5);      /* block 5: every block split */
}
