/* test_ppo_loss.c — rlhf/ppo_loss.c against torch (tests/fixtures/ppo/ppo_cases.json and
 * ppo_variants.json, written from verl's core_algos.py by make_ppo_fixtures.py and
 * make_ppo_variants.py). ppo_cases.json: KL estimators k1 / k2 / k3 (the clamp) and their
 * gradients, token rewards, GAE at three (gamma, lambda), masked whitening, GRPO (std-norm on / off,
 * G = 1, 2, 4), RLOO (G = 2, 4), the clipped policy loss (clip-higher, dual clip, KL in loss, the
 * log-ratio clamp, on-policy) and the clipped value loss (ties included) through their hooks: loss,
 * d loss / d output and every PpoStats field; then each hook again over the batch split in two
 * micro-batches, whose stats must accumulate to the same totals and whose dout must not change.
 * ppo_variants.json: REINFORCE++ returns (three gammas) and their whitening, REINFORCE++-baseline's
 * token advantages (G 2, 4), and the actor hook under each loss aggregation (its weights from
 * loss_agg_weight, as experience_minibatch sets them) with the ppo, gspo and cispo policy losses,
 * checked as above (whole and in two micro-batches of whole sequences: GSPO's sequence mean).
 * Usage: test_ppo_loss FIXTURE.json   (one line per comparison; "ok: N ppo cases match torch"; exit 1
 * on any mismatch)
 * Tolerances:
 *   double results (KL, rewards, GAE, whitening, group advantages, hook losses, stat sums): 1e-12
 *   relative to max(1, |torch|). Both sides compute in float64 from the same fp32-representable
 *   inputs (the fixture's weights are the fp32 ones the hook reads), so they differ only by rounding
 *   order and a few ulps of exp / sqrt (~1e-15); 1e-12 leaves room for that and nothing else (verl's
 *   n + 1e-8 in masked_mean alone moves the whitened values by 2e-10).
 *   Counts (clip fractions, tokens) and logprob_diff_max (|a - b| of two floats, exact in double):
 *   exactly.
 *   dout (fp32 out of the hook, what the backward consumes): 1e-6 relative to |torch| itself, not to
 *   max(1, .): rounding a double to fp32 moves it by at most 2^-24 (6e-8) of its value, and the
 *   gradients are ~1e-2, so a floor of 1 would hide a wrong gradient; an exact 0 in torch (a
 *   non-action, a clipped ratio, a dual clip, a clamped log-ratio or k3) must be an exact 0 here. */
#include "rlhf/ppo_loss.h"
#include "runtime/util.h"
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_fail, g_cases;

static const cJSON *get(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v) { fprintf(stderr, "fixture: field %s missing\n", k); exit(1); }
    return v;
}
static double num(const cJSON *o, const char *k) { return get(o, k)->valuedouble; }
/* a numeric array of exactly n values (n < 0: any length, returned in *len) */
static double *dbl(const cJSON *o, const char *k, int n) {
    const cJSON *a = get(o, k);
    int m = cJSON_GetArraySize(a), i = 0;
    if (n >= 0 && m != n) { fprintf(stderr, "fixture: %s has %d values, expected %d\n", k, m, n); exit(1); }
    double *x = xmalloc(sizeof(double) * (m ? m : 1));
    const cJSON *v;
    cJSON_ArrayForEach(v, a) x[i++] = v->valuedouble;
    return x;
}
static float *flt(const cJSON *o, const char *k, int n) {
    double *d = dbl(o, k, n);
    float *x = xmalloc(sizeof(float) * n);
    for (int i = 0; i < n; i++) x[i] = (float)d[i];
    free(d);
    return x;
}

/* got (n) vs want (n): |got - want| <= tol * max(floor, |want|); names (n, may be NULL) name the
 * entries in a failure line */
static void cmp_scaled(const char *what, const double *got, const double *want, int n, double tol, double floor,
                       const char *const *names) {
    double worst = 0;
    int at = -1;
    for (int i = 0; i < n; i++) {
        double d = fabs(got[i] - want[i]), e = d == 0 ? 0 : d / fmax(floor, fabs(want[i]));
        if (!(e <= worst)) { worst = isnan(e) ? INFINITY : e; at = i; }
    }
    int ok = worst <= tol;
    printf("%-62s (%2d) max rel diff %-9.3g tol %.0e", what, n, worst, tol);
    if (!ok && names) printf("  FAIL %s: %.17g vs torch %.17g", names[at], got[at], want[at]);
    else if (!ok) printf("  FAIL at [%d]: %.17g vs torch %.17g", at, got[at], want[at]);
    printf("\n");
    g_fail |= !ok;
    g_cases++;
}
static void cmp(const char *what, const double *got, const double *want, int n, double tol) {
    cmp_scaled(what, got, want, n, tol, 1.0, NULL);
}
static void cmp1(const char *what, double got, double want, double tol) { cmp(what, &got, &want, 1, tol); }
static void cmp_dout(const char *what, const float *dout, const double *want, int n) {
    double *got = xmalloc(sizeof(double) * n);
    for (int i = 0; i < n; i++) got[i] = dout[i];
    cmp_scaled(what, got, want, n, 1e-6, 0.0, NULL);
    free(got);
}

/* PpoStats fields against the fixture's values of the same names: sums to 1e-12, counts and the max
 * exactly; one line each */
static void cmp_stats(const char *pre, const cJSON *c, const PpoStats *st, int actor) {
    const char *sums_a[] = {"pg_loss", "ppo_kl", "kl_loss"}, *cnts_a[] = {"n_tokens", "pg_clipfrac",
                            "pg_clipfrac_lower", "logprob_diff_max", "n_checked"};
    const char *sums_c[] = {"vf_loss"}, *cnts_c[] = {"n_tokens", "vf_clipfrac"};
    double gs_a[] = {st->pg_loss, st->ppo_kl, st->kl_loss}, gc_a[] = {st->n_tokens, st->pg_clipfrac,
                     st->pg_clipfrac_lower, st->logprob_diff_max, st->n_checked};
    double gs_c[] = {st->vf_loss}, gc_c[] = {st->n_tokens, st->vf_clipfrac};
    const char *const *sums = actor ? sums_a : sums_c, *const *cnts = actor ? cnts_a : cnts_c;
    const double *gs = actor ? gs_a : gs_c, *gc = actor ? gc_a : gc_c;
    int ns = actor ? 3 : 1, nc = actor ? 5 : 2;
    double ws[5], wc[5];
    char what[160], list[120];
    for (int i = 0; i < ns; i++) ws[i] = num(c, sums[i]);
    for (int i = 0; i < nc; i++) wc[i] = num(c, cnts[i]);
    list[0] = 0;
    for (int i = 0; i < ns; i++) snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? " " : "", sums[i]);
    snprintf(what, sizeof what, "%sstats %s", pre, list);
    cmp_scaled(what, gs, ws, ns, 1e-12, 1.0, sums);
    list[0] = 0;
    for (int i = 0; i < nc; i++) snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? " " : "", cnts[i]);
    snprintf(what, sizeof what, "%sstats %s", pre, list);
    cmp_scaled(what, gc, wc, nc, 0, 1.0, cnts);
    /* the other hook's fields stay 0 */
    double other = actor ? fabs(st->vf_loss) + st->vf_clipfrac : fabs(st->pg_loss) + st->pg_clipfrac +
                   st->pg_clipfrac_lower + fabs(st->ppo_kl) + fabs(st->kl_loss) + st->logprob_diff_max + st->n_checked;
    if (other != 0) { printf("%sthe %s hook wrote the other hook's stats  FAIL\n", pre, actor ? "actor" : "critic"); g_fail = 1; }
}

typedef struct {
    int N, S, n_act;
    int *seq_start, *targets;
    float *mask, *lp, *ref, *adv, *weight;
} PpoBatch;

/* runs a hook over the whole batch and over its two halves (sequences [0, S/2) and [S/2, S)); the
 * halves' stats accumulate in one PpoHook. ctx_at(ctx, off) gives the context shifted by off tokens. */
typedef PpoCtx (*CtxAt)(const PpoCtx *c, int off);
static PpoCtx actor_at(const PpoCtx *c, int off) {
    return (PpoCtx){c->old_lp + off, c->ref_lp + off, c->adv + off, NULL, NULL, c->prox_lp ? c->prox_lp + off : NULL, c->check,
                    c->prox_self};
}
static PpoCtx critic_at(const PpoCtx *c, int off) {
    return (PpoCtx){NULL, NULL, NULL, c->old_values + off, c->returns + off, NULL, c->check, 0};
}
static double run_hook(LossFn fn, const PpoBatch *b, const PpoCtx *ctx, CtxAt at, const float *out, PpoHook *h,
                       float *dout, int split) {
    if (!split) {
        MicroBatch mb = {b->targets, b->seq_start, b->S, b->targets, b->weight, ctx};
        return fn(&mb, b->N, out, dout, h);
    }
    double loss = 0;
    int half[3] = {0, b->S / 2, b->S};
    for (int k = 0; k < 2; k++) {
        int off = b->seq_start[half[k]], n = b->seq_start[half[k + 1]] - off, S = half[k + 1] - half[k];
        int *ss = xmalloc(sizeof(int) * (S + 1));
        for (int s = 0; s <= S; s++) ss[s] = b->seq_start[half[k] + s] - off;
        PpoCtx c = at(ctx, off);
        MicroBatch mb = {b->targets + off, ss, S, b->targets + off, b->weight + off, &c};
        loss += fn(&mb, n, out + off, dout + off, h);
        free(ss);
    }
    return loss;
}

/* An aggregated case's loss (one with "loss_abs"): its weights are the fp32 roundings of verl's
 * exact 1 / denominators (relative error <= 2^-24 each), and verl's seq-mean-token-mean divides by
 * len + 1e-8 (relative 1e-8 / len), so the loss may move by (2^-24 + 1e-8) times the aggregation of
 * |each term| (loss_abs, torch's), plus the 1e-12 of the other cases; else 1e-12 relative as those. */
static void cmp_loss(const char *what, double got, const cJSON *c) {
    const cJSON *la = cJSON_GetObjectItemCaseSensitive(c, "loss_abs");
    double want = num(c, "loss");
    if (!la) { cmp1(what, got, want, 1e-12); return; }
    double d = fabs(got - want), bound = (0x1p-24 + 1e-8) * la->valuedouble + 1e-12 * fmax(1.0, fabs(want));
    int ok = d <= bound;
    printf("%-62s ( 1) abs diff %-9.3g bound %.2g%s\n", what, d, bound, ok ? "" : "  FAIL");
    if (!ok) printf("  FAIL: %.17g vs torch %.17g\n", got, want);
    g_fail |= !ok;
    g_cases++;
}

/* A case with "agg": the batch's weights as experience_minibatch gives them for that aggregation
 * (the whole batch one mini-batch at dp 1; len: a sequence's actions), else the fixture's weights. */
static const float *case_weights(const PpoBatch *b, const cJSON *c, int norm, float *w) {
    const cJSON *agg = cJSON_GetObjectItemCaseSensitive(c, "agg");
    if (!agg) return b->weight;
    LossAgg a = loss_agg_parse("agg", agg->valuestring);
    for (int s = 0; s < b->S; s++) {
        int len = 0;
        for (int n = b->seq_start[s]; n < b->seq_start[s + 1]; n++) len += b->mask[n] > 0;
        for (int n = b->seq_start[s]; n < b->seq_start[s + 1]; n++)
            w[n] = b->mask[n] > 0 ? (float)loss_agg_weight(a, len, b->S, b->n_act, norm, 1) : 0.0f;
    }
    return w;
}

static void check_actor(const PpoBatch *b, const cJSON *c, int norm) {
    const char *name = get(c, "name")->valuestring;
    const cJSON *pl = cJSON_GetObjectItemCaseSensitive(c, "policy");
    float *old = flt(c, "old_lp", b->N), *dout = xmalloc(sizeof(float) * b->N), *dout2 = xmalloc(sizeof(float) * b->N);
    float *w = xmalloc(sizeof(float) * b->N);
    double *want = dbl(c, "dlp", b->N);
    const cJSON *has_prox = cJSON_GetObjectItemCaseSensitive(c, "prox_lp"), *cap = cJSON_GetObjectItemCaseSensitive(c, "behav_cap");
    float *prox = has_prox ? flt(c, "prox_lp", b->N) : NULL;   /* decoupled PPO (ppo_decoupled.json) */
    const cJSON *self = cJSON_GetObjectItemCaseSensitive(c, "prox_self");
    PpoCtx ctx = {old, b->ref, b->adv, NULL, NULL, self ? NULL : prox, 1, self != NULL};
    PpoBatch bw = *b;
    bw.weight = (float *)case_weights(b, c, norm, w);
    char what[160];
    for (int split = 0; split < 2; split++) {
        PpoHook h = {.clip_low = num(c, "clip_low"), .clip_high = num(c, "clip_high"), .clip_c = num(c, "clip_c"),
                     .kl_loss_coef = num(c, "kl_loss_coef"), .policy = pl ? policy_loss_parse("policy", pl->valuestring) : PL_PPO,
                     .behav_cap = cap ? cap->valuedouble : 0.0};
        double loss = run_hook(loss_ppo_actor, &bw, &ctx, actor_at, b->lp, &h, split ? dout2 : dout, split);
        if (!split) {
            snprintf(what, sizeof what, "actor %s: loss", name);
            cmp_loss(what, loss, c);
            cmp_dout("  d loss / d logprob (fp32)", dout, want, b->N);
        } else {
            cmp_loss("  in 2 micro-batches: loss", loss, c);
            cmp1("  in 2 micro-batches: dout bit for bit", !memcmp(dout, dout2, sizeof(float) * b->N), 1, 0);
        }
        cmp_stats(split ? "  in 2 micro-batches: " : "  ", c, &h.stats, 1);
        if (prox) {   /* the behaviour weights' sum (to 1e-12 relative) and the capped count (exactly) */
            double bw = num(c, "behav_weight");
            cmp1("  stats behav_weight (relative)", h.stats.behav_weight / bw, 1.0, 1e-12);
            cmp1("  stats behav_capped", h.stats.behav_capped, num(c, "behav_capped"), 0);
        }
    }
    free(old); free(dout); free(dout2); free(want); free(w); free(prox);
}

static void check_critic(const PpoBatch *b, const cJSON *c) {
    const char *name = get(c, "name")->valuestring;
    float *v = flt(c, "values", b->N), *ov = flt(c, "old_values", b->N), *R = flt(c, "returns", b->N);
    float *dout = xmalloc(sizeof(float) * b->N), *dout2 = xmalloc(sizeof(float) * b->N);
    double *want = dbl(c, "dv", b->N);
    PpoCtx ctx = {NULL, NULL, NULL, ov, R, NULL, 0, 0};
    char what[160];
    for (int split = 0; split < 2; split++) {
        PpoHook h = {.value_clip = num(c, "value_clip")};
        double loss = run_hook(loss_ppo_critic, b, &ctx, critic_at, v, &h, split ? dout2 : dout, split);
        if (!split) {
            snprintf(what, sizeof what, "critic %s: loss", name);
            cmp1(what, loss, num(c, "loss"), 1e-12);
            cmp_dout("  d loss / d value (fp32)", dout, want, b->N);
        } else {
            cmp1("  in 2 micro-batches: loss", loss, num(c, "loss"), 1e-12);
            cmp1("  in 2 micro-batches: dout bit for bit", !memcmp(dout, dout2, sizeof(float) * b->N), 1, 0);
        }
        cmp_stats(split ? "  in 2 micro-batches: " : "  ", c, &h.stats, 0);
    }
    free(v); free(ov); free(R); free(dout); free(dout2); free(want);
}

static KlEstimator kl_kind(const char *s) {
    if (!strcmp(s, "k1")) return KL_K1;
    if (!strcmp(s, "k2")) return KL_K2;
    if (!strcmp(s, "k3")) return KL_K3;
    fprintf(stderr, "fixture: unknown KL estimator %s\n", s);
    exit(1);
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: test_ppo_loss FIXTURE.json\n"); return 2; }
    char *text = read_file(argv[1], NULL);
    cJSON *fx = text ? cJSON_Parse(text) : NULL;
    if (!fx) { fprintf(stderr, "%s: cannot read as JSON\n", argv[1]); return 1; }
    PpoBatch b = {0};
    b.S = cJSON_GetArraySize(get(fx, "seq_start")) - 1;
    double *ss = dbl(fx, "seq_start", b.S + 1);
    b.seq_start = xmalloc(sizeof(int) * (b.S + 1));
    for (int s = 0; s <= b.S; s++) b.seq_start[s] = (int)ss[s];
    b.N = b.seq_start[b.S];
    int N = b.N, S = b.S;
    b.mask = flt(fx, "mask", N);
    b.lp = flt(fx, "lp", N);
    b.ref = flt(fx, "ref_lp", N);
    b.adv = flt(fx, "adv", N);
    b.weight = flt(fx, "weight", N);
    b.targets = xmalloc(sizeof(int) * N);
    for (int n = 0; n < N; n++) { b.targets[n] = b.mask[n] > 0 ? 0 : -1; b.n_act += b.mask[n] > 0; }
    float *values = flt(fx, "values", N);
    double *score = dbl(fx, "score", S);
    double *x = xmalloc(sizeof(double) * N), *y = xmalloc(sizeof(double) * N), *kl = xmalloc(sizeof(double) * N);
    double *gae_rewards = NULL;
    char what[160];
    printf("%d tokens, %d actions, %d sequences\n", N, b.n_act, S);

    const cJSON *c;
    /* sections: each may be absent (ppo_cases.json: kl .. critic; ppo_variants.json: returns,
     * rpp_baseline, actor) */
#define SECTION(k) cJSON_GetObjectItemCaseSensitive(fx, k)
    cJSON_ArrayForEach(c, SECTION("kl")) {
        const char *est = get(c, "estimator")->valuestring;
        KlEstimator k = kl_kind(est);
        double coef = num(c, "kl_coef");
        double *wk = dbl(c, "kl", N), *wd = dbl(c, "dkl", N), *wr = dbl(c, "rewards", N);
        ppo_token_rewards(b.seq_start, S, b.mask, b.lp, b.ref, score, k, coef, x, kl);
        snprintf(what, sizeof what, "kl estimate %s", est);
        cmp(what, kl, wk, N, 1e-12);
        for (int n = 0; n < N; n++) y[n] = b.mask[n] > 0 ? kl_estimate_grad(k, b.lp[n], b.ref[n]) : 0.0;
        snprintf(what, sizeof what, "  d kl %s / d logprob", est);
        cmp(what, y, wd, N, 1e-12);
        snprintf(what, sizeof what, "  token rewards (kl_coef %g)", coef);
        cmp(what, x, wr, N, 1e-12);
        if (k == KL_K3 && coef == 0.05) { gae_rewards = xmalloc(sizeof(double) * N); memcpy(gae_rewards, x, sizeof(double) * N); }
        free(wk); free(wd); free(wr);
    }
    if (SECTION("gae") && !gae_rewards) { fprintf(stderr, "fixture: no k3 / 0.05 rewards for GAE\n"); return 1; }
    cJSON_ArrayForEach(c, SECTION("gae")) {
        double g = num(c, "gamma"), l = num(c, "lambda");
        double *wa = dbl(c, "adv", N), *wr = dbl(c, "ret", N), *ww = dbl(c, "whitened", N);
        ppo_gae(b.seq_start, S, b.mask, gae_rewards, values, g, l, x, y);
        snprintf(what, sizeof what, "gae advantages (gamma %g, lambda %g)", g, l);
        cmp(what, x, wa, N, 1e-12);
        cmp("  returns", y, wr, N, 1e-12);
        ppo_whiten(x, b.mask, N);
        cmp("  whitened advantages", x, ww, N, 1e-12);
        free(wa); free(wr); free(ww);
    }
    cJSON_ArrayForEach(c, SECTION("group")) {
        int G = get(c, "G")->valueint, sn = get(c, "std_norm")->valueint;
        int rloo = !strcmp(get(c, "kind")->valuestring, "rloo");
        double *wa = dbl(c, "adv", S);
        group_advantages(rloo ? ADV_RLOO : ADV_GRPO, score, S, G, sn, num(c, "eps"), x);
        snprintf(what, sizeof what, "%s advantages (G %d, std_norm %d)", rloo ? "rloo" : "grpo", G, sn);
        cmp(what, x, wa, S, 1e-12);
        free(wa);
    }
    cJSON_ArrayForEach(c, SECTION("returns")) {   /* reinforce++: discounted returns of given token rewards, whitened */
        double g = num(c, "gamma"), *r = dbl(c, "rewards", N), *wr = dbl(c, "ret", N), *wa = dbl(c, "adv", N);
        ppo_discounted_returns(b.seq_start, S, b.mask, r, g, x);
        snprintf(what, sizeof what, "reinforce++ returns (gamma %g)", g);
        cmp(what, x, wr, N, 1e-12);
        ppo_whiten(x, b.mask, N);
        cmp("  whitened: advantages", x, wa, N, 1e-12);
        free(r); free(wr); free(wa);
    }
    cJSON_ArrayForEach(c, SECTION("rpp_baseline")) {
        int G = get(c, "G")->valueint;
        double *wa = dbl(c, "adv", N);
        outcome_advantages(ADV_RPP_BASELINE, b.seq_start, S, b.mask, score, G, 1, 1e-6, x);
        snprintf(what, sizeof what, "reinforce++-baseline token advantages (G %d)", G);
        cmp(what, x, wa, N, 1e-12);
        free(wa);
    }
    const cJSON *norm = SECTION("norm");
    cJSON_ArrayForEach(c, SECTION("actor")) check_actor(&b, c, norm ? norm->valueint : 0);
    cJSON_ArrayForEach(c, SECTION("critic")) check_critic(&b, c);
#undef SECTION

    if (!g_fail) printf("ok: %d ppo cases match torch\n", g_cases);
    else printf("FAIL: rlhf/ppo_loss.c does not match %s\n", argv[1]);
    cJSON_Delete(fx);
    free(text); free(ss); free(b.seq_start); free(b.targets); free(b.mask); free(b.lp); free(b.ref); free(b.adv);
    free(b.weight); free(values); free(score); free(x); free(y); free(kl); free(gae_rewards);
    return g_fail;
}
