/* logits.c — cuda_vs_cpu's cases of the vocabulary entries: argmax_rows, row_max, row_sumexp,
 * pick_logits, row_entropy_part, log_add, sub_at (the pieces of a vocab-parallel log-softmax). Owns
 * those cases. */
#include "tests/cuda/cuda_vs_cpu.h"

/* ---- logits: argmax_rows, row_max, row_sumexp, pick_logits, log_add, row_entropy_part, sub_at ------- */
/* (N, V) logits in [-amp, amp): distinct values (no near-ties: argmax is exact either way); masked:
 * the last 3 columns of odd rows are -inf (vocab padding) */
float *logits(int N, int V, float amp, int masked) {
    float *x = rand_f32((size_t)N * V, amp);
    for (int n = 1; masked && n < N; n += 2)
        for (int v = V - 3; v < V; v++)
            if (v >= 0) x[(size_t)n * V + v] = -INFINITY;
    return x;
}
static void case_argmax_rows(int V, int v0) {
    cur_entry = "argmax_rows";
    enum { N = 7 };
    float *x = logits(N, V, 8.0f, 0);
    x[1 * V + 3] = x[1 * V + V - 2] = 9.0f;                 /* row 1: an exact tie, the first wins */
    x[2 * V + 0] = NAN, x[2 * V + V / 2] = 9.5f;            /* row 2: NaN never wins */
    for (int v = 0; v < V; v++) x[3 * V + v] = v % 2 ? -INFINITY : NAN;   /* row 3: the first -inf */
    for (int v = 0; v < V; v++) x[4 * V + v] = -INFINITY;   /* row 4: all -inf */
    x[5 * V + V - 1] = 8.5f;                                /* row 5: the last column */
    x[6 * V + 0] = 8.5f;                                    /* row 6: the first column */
    int wid[N], gid[N], *ids[2] = {wid, gid};
    float wval[N], gval[N], *vals[2] = {wval, gval};
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        int *di = dput(&d, NULL, ni(N));
        float *dv = dput(&d, NULL, nf(N, 1));
        be[s]->argmax_rows(di, dv, dput(&d, x, nf(N, V)), N, V, v0);
        dget(&d, ids[s], di, ni(N)), dget(&d, vals[s], dv, nf(N, 1));
        dfree(&d);
    }
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,V=%d,v0=%d,tie/NaN/-inf_rows", N, V, v0);
    cmp_ints("argmax_rows.ids", sh, gid, wid, N);
    cmp_exact("argmax_rows.vals", DTYPE_F32, sh, gval, wval, N);
    free(x);
}
/* row_max, then row_sumexp, pick_logits and row_entropy_part on the same logits */
static void case_row_max(const float *x, int N, int V, float T, const char *sh) {
    cur_entry = "row_max";
    float want[N], got[N], *res[2] = {want, got};
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *mx = dput(&d, NULL, nf(N, 1));
        be[s]->row_max(mx, dput(&d, x, nf(N, V)), N, V, T);
        dget(&d, res[s], mx, nf(N, 1));
        dfree(&d);
    }
    cmp_exact("row_max", DTYPE_F32, sh, got, want, N);
}
static void case_row_sumexp(const float *x, const float *mx, int N, int V, float T, int leaves, const char *sh) {
    cur_entry = "row_sumexp";
    float want[N], got[N], *res[2] = {want, got};
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *sum = dput(&d, NULL, nf(N, 1));
        be[s]->row_sumexp(sum, dput(&d, x, nf(N, V)), dput(&d, mx, nf(N, 1)), N, V, T, leaves);
        dget(&d, res[s], sum, nf(N, 1));
        dfree(&d);
    }
    double mag[N];
    for (int n = 0; n < N; n++) {
        mag[n] = 0.0;
        for (int v = 0; v < V; v++) mag[n] += exp((double)(x[(size_t)n * V + v] / T - mx[n]));
    }
    cmp_tol("row_sumexp", DTYPE_F32, sh, got, want, N, mag, gam(V) + 8 * U, 0.0);
}
static void case_pick_logits(const float *x, int N, int V, int v0, float T, const char *sh) {
    cur_entry = "pick_logits";
    int targets[N];
    for (int n = 0; n < N; n++) {   /* none, the shard's first and last, outside it either side, inside */
        const int pick[] = {-1, v0, v0 + V - 1, v0 > 0 ? v0 - 1 : v0 + V + 1, v0 + V, v0 + V / 2};
        targets[n] = pick[n % 6];
    }
    float want[N], got[N], *res[2] = {want, got};
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *z = dput(&d, NULL, nf(N, 1));
        be[s]->pick_logits(z, dput(&d, x, nf(N, V)), dput(&d, targets, ni(N)), N, V, v0, T);
        dget(&d, res[s], z, nf(N, 1));
        dfree(&d);
    }
    cmp_exact("pick_logits", DTYPE_F32, sh, got, want, N);
}
static void case_row_entropy_part(const float *x, const float *lse, int N, int V, float T, int leaves, const char *sh) {
    cur_entry = "row_entropy_part";
    float want[N], got[N], *res[2] = {want, got};
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *part = dput(&d, NULL, nf(N, 1));
        be[s]->row_entropy_part(part, dput(&d, x, nf(N, V)), dput(&d, lse, nf(N, 1)), N, V, T, leaves);
        dget(&d, res[s], part, nf(N, 1));
        dfree(&d);
    }
    double mag[N];
    for (int n = 0; n < N; n++) {
        mag[n] = 0.0;
        for (int v = 0; v < V; v++) {
            float z = x[(size_t)n * V + v] / T;
            if (z > -INFINITY) mag[n] += exp((double)(z - lse[n])) * fabs(z);   /* -inf padding: 0 */
        }
    }
    cmp_tol("row_entropy_part", DTYPE_F32, sh, got, want, N, mag, gam(V) + 9 * U, 0.0);
}
/* lse (N) of x / T in double, rounded: the row_entropy_part input (and logprob_backward's) */
void true_lse(float *lse, const float *x, int N, int V, float T) {
    for (int n = 0; n < N; n++) {
        double mx = -INFINITY, s = 0.0;
        for (int v = 0; v < V; v++) mx = fmax(mx, (double)(x[(size_t)n * V + v] / T));
        for (int v = 0; v < V; v++) s += exp((double)(x[(size_t)n * V + v] / T) - mx);
        lse[n] = (float)(mx + log(s));
    }
}
/* the vocab-parallel logprob pieces on (N, V) logits of shard v0; masked: -inf padding (whose
 * entropy terms are 0, not 0 * -inf); the sums in `leaves` leaves */
static void cases_logits(int N, int V, int v0, float T, int masked, int leaves) {
    float *x = logits(N, V, 8.0f, masked), mx[N], lse[N];
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,V=%d,v0=%d,T=%g%s,leaves=%d", N, V, v0, (double)T, masked ? ",-inf_pad" : "", leaves);
    for (int n = 0; n < N; n++) {   /* the contract's max of x, then / T: what both sides get as mx */
        float m = -INFINITY;
        for (int v = 0; v < V; v++) m = x[(size_t)n * V + v] > m ? x[(size_t)n * V + v] : m;
        mx[n] = m / T;
    }
    case_row_max(x, N, V, T, sh);
    case_row_sumexp(x, mx, N, V, T, leaves, sh);
    case_pick_logits(x, N, V, v0, T, sh);
    true_lse(lse, x, N, V, T);
    case_row_entropy_part(x, lse, N, V, T, leaves, sh);
    free(x);
}
static void case_log_add(int N) {
    cur_entry = "log_add";
    float lse[N], sum[N], want[N], got[N], *res[2] = {want, got};
    for (int n = 0; n < N; n++) {
        lse[n] = 5.0f * rand_uniform();
        sum[n] = n == 0 ? 1.0f : expf(6.0f * (rand_uniform() + 0.6f));
    }
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *dl = dput(&d, lse, nf(N, 1));
        be[s]->log_add(dl, dput(&d, sum, nf(N, 1)), N);
        dget(&d, res[s], dl, nf(N, 1));
        dfree(&d);
    }
    double mag[N];
    for (int n = 0; n < N; n++) mag[n] = fabs((double)lse[n]) + fabs(log((double)sum[n]));
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,sum=[e^-2.4,e^9.6]", N);
    cmp_tol("log_add", DTYPE_F32, sh, got, want, N, mag, 6 * U, 0.0);
}
/* idx: b (n_b) indexed by idx, else b (n) elementwise */
static void case_sub_at(int n, int n_b, int with_idx) {
    cur_entry = "sub_at";
    int nb = with_idx ? n_b : n;
    float *a = rand_f32(n, 10.0f), *b = rand_f32(nb, 10.0f), *want = xmalloc(nf(n, 1)), *got = xmalloc(nf(n, 1));
    float *res[2] = {want, got};
    int *idx = xmalloc(ni(n));
    for (int i = 0; i < n; i++) idx[i] = rand_int(n_b);
    const Backend *be[2] = {ref, dut};
    for (int s = 0; s < 2; s++) {
        Dev d = {be[s], {0}, 0};
        float *o = dput(&d, NULL, nf(n, 1));
        const int *di = with_idx ? dput(&d, idx, ni(n)) : NULL;
        be[s]->sub_at(o, dput(&d, a, nf(n, 1)), dput(&d, b, nf(nb, 1)), di, n);
        dget(&d, res[s], o, nf(n, 1));
        dfree(&d);
    }
    char sh[96];
    snprintf(sh, sizeof sh, "n=%d,%s", n, with_idx ? "idx->b(n_b)" : "idx=NULL");
    cmp_exact("sub_at", DTYPE_F32, sh, got, want, n);
    free(a), free(b), free(idx), free(want), free(got);
}

void logit_cases(void) {
    case_argmax_rows(1001, 3000), case_argmax_rows(17, 0), case_argmax_rows(32000, 0);
    cases_logits(1, 32000, 0, 1.0f, 0, 1);
    cases_logits(6, 1001, 500, 0.7f, 0, 1);
    cases_logits(6, 1001, 500, 1.0f, 1, 1);
    cases_logits(7, 33, 32, 1.3f, 0, 1);
    cases_logits(1, 32000, 0, 1.0f, 0, 8);
    cases_logits(6, 1001, 500, 1.0f, 1, 4);
    cases_logits(7, 33, 32, 1.3f, 0, 8);
    case_log_add(1), case_log_add(9);
    case_sub_at(1000, 10, 1), case_sub_at(1000, 10, 0), case_sub_at(1, 1, 0);
}
