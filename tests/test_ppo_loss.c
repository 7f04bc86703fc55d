/* test_ppo_loss.c — rlhf/ppo_loss.c against torch (tests/fixtures/ppo/ppo_cases.json, written from
 * verl's core_algos.py by make_ppo_fixtures.py): KL estimators k1 / k2 / k3 (with the clamp),
 * token rewards, GAE at two (gamma, lambda), masked whitening, GRPO (std-norm on / off, G = 1),
 * RLOO, the clipped policy loss (clip-higher, dual clip, KL in loss) and the clipped value loss
 * through their hooks: loss, d loss / d output and the clip fractions.
 * Usage: test_ppo_loss FIXTURE.json
 * Tolerances: float64 on both sides from the same fp32 inputs: 1e-12 relative to max(1, |torch|)
 * (a few ulps of exp/sqrt); a hook's dout is fp32 (what the backward consumes): 1e-6 relative. */
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
static double *dbl(const cJSON *a, int *n) {
    int k = cJSON_GetArraySize(a), i = 0;
    double *x = xmalloc(sizeof(double) * (k ? k : 1));
    const cJSON *v;
    cJSON_ArrayForEach(v, a) x[i++] = v->valuedouble;
    if (n) *n = k;
    return x;
}
static float *flt(const cJSON *a) {
    int k = cJSON_GetArraySize(a), i = 0;
    float *x = xmalloc(sizeof(float) * (k ? k : 1));
    const cJSON *v;
    cJSON_ArrayForEach(v, a) x[i++] = (float)v->valuedouble;
    return x;
}

/* got (n) vs want (n), tolerance tol relative to max(1, |want|) */
static void cmp(const char *what, const double *got, const double *want, int n, double tol) {
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double e = fabs(got[i] - want[i]) / fmax(1.0, fabs(want[i]));
        if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
    }
    int ok = worst <= tol;
    printf("%-52s (%3d) max rel diff %-9.3g tol %.0e%s\n", what, n, worst, tol, ok ? "" : "  FAIL");
    g_fail |= !ok;
    g_cases++;
}
static void cmp1(const char *what, double got, double want, double tol) { cmp(what, &got, &want, 1, tol); }

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: test_ppo_loss FIXTURE.json\n"); return 2; }
    char *text = read_file(argv[1], NULL);
    cJSON *fx = text ? cJSON_Parse(text) : NULL;
    if (!fx) { fprintf(stderr, "%s: cannot read as JSON\n", argv[1]); return 1; }
    int n_start, N;
    double *ss = dbl(get(fx, "seq_start"), &n_start);
    int S = n_start - 1, *seq_start = xmalloc(sizeof(int) * n_start);
    for (int i = 0; i < n_start; i++) seq_start[i] = (int)ss[i];
    N = seq_start[S];
    float *mask = flt(get(fx, "mask")), *lp = flt(get(fx, "lp")), *old = flt(get(fx, "old_lp"));
    float *ref = flt(get(fx, "ref_lp")), *values = flt(get(fx, "values")), *adv = flt(get(fx, "adv"));
    float *rets = flt(get(fx, "returns"));
    double *score = dbl(get(fx, "score"), NULL), w = get(fx, "weight")->valuedouble;
    double *x = xmalloc(sizeof(double) * N), *y = xmalloc(sizeof(double) * N), *kl = xmalloc(sizeof(double) * N);
    char what[128];

    const char *names[3] = {"k1", "k2", "k3"};
    for (int k = 0; k < 3; k++) {
        double *want_kl = dbl(get(get(fx, "kl"), names[k]), NULL), *want_r = dbl(get(get(fx, "rewards"), names[k]), NULL);
        ppo_token_rewards(seq_start, S, mask, lp, ref, score, (KlEstimator)k, 0.05, x, kl);
        snprintf(what, sizeof what, "kl estimator %s", names[k]);
        cmp(what, kl, want_kl, N, 1e-12);
        snprintf(what, sizeof what, "token rewards (kl_coef 0.05, %s)", names[k]);
        cmp(what, x, want_r, N, 1e-12);
        free(want_kl); free(want_r);
    }
    double *rw = dbl(get(get(fx, "rewards"), "k1"), NULL);
    const cJSON *c;
    cJSON_ArrayForEach(c, get(fx, "gae")) {
        double g = get(c, "gamma")->valuedouble, l = get(c, "lambda")->valuedouble;
        double *wa = dbl(get(c, "adv"), NULL), *wr = dbl(get(c, "ret"), NULL), *ww = dbl(get(c, "whitened"), NULL);
        ppo_gae(seq_start, S, mask, rw, values, g, l, x, y);
        snprintf(what, sizeof what, "gae advantages (gamma %g, lambda %g)", g, l);
        cmp(what, x, wa, N, 1e-12);
        snprintf(what, sizeof what, "gae returns (gamma %g, lambda %g)", g, l);
        cmp(what, y, wr, N, 1e-12);
        ppo_whiten(x, mask, N);
        snprintf(what, sizeof what, "whitened advantages (gamma %g, lambda %g)", g, l);
        cmp(what, x, ww, N, 1e-12);
        free(wa); free(wr); free(ww);
    }
    cJSON_ArrayForEach(c, get(fx, "group")) {
        int G = get(c, "G")->valueint, sn = get(c, "std_norm")->valueint;
        int rloo = !strcmp(get(c, "kind")->valuestring, "rloo");
        double *wa = dbl(get(c, "adv"), NULL);
        group_advantages(rloo ? ADV_RLOO : ADV_GRPO, score, S, G, sn, 1e-6, x);
        snprintf(what, sizeof what, "%s advantages (G %d, std_norm %d)", rloo ? "rloo" : "grpo", G, sn);
        cmp(what, x, wa, S, 1e-12);
        free(wa);
    }
    int *targets = xmalloc(sizeof(int) * N);
    float *weight = xmalloc(sizeof(float) * N), *dout = xmalloc(sizeof(float) * N);
    for (int n = 0; n < N; n++) { targets[n] = mask[n] > 0 ? 0 : -1; weight[n] = (float)(mask[n] * w); }
    cJSON_ArrayForEach(c, get(fx, "actor")) {
        PpoHook h = {.clip_low = get(c, "clip_low")->valuedouble, .clip_high = get(c, "clip_high")->valuedouble,
                     .clip_c = get(c, "clip_c")->valuedouble, .kl_loss_coef = get(c, "kl_loss_coef")->valuedouble};
        PpoCtx ctx = {old, ref, adv, NULL, NULL, 1};
        MicroBatch mb = {targets, seq_start, S, targets, weight, &ctx};
        double loss = loss_ppo_actor(&mb, N, lp, dout, &h);
        double *want = dbl(get(c, "dlp"), NULL);
        for (int n = 0; n < N; n++) x[n] = dout[n];
        snprintf(what, sizeof what, "actor clip [%g, %g] dual %g kl %g: loss", h.clip_low, h.clip_high, h.clip_c, h.kl_loss_coef);
        /* the weights are fp32 in the hook (as in training), float64 in torch: 1e-7 relative */
        cmp1(what, loss, get(c, "loss")->valuedouble, 1e-7);
        cmp("  d loss / d logprob (fp32)", x, want, N, 1e-6);
        cmp1("  sum of pg losses", h.stats.pg_loss, get(c, "pg_loss")->valuedouble, 1e-12);
        cmp1("  clipped tokens", h.stats.pg_clipfrac, get(c, "pg_clipfrac")->valuedouble, 0);
        cmp1("  dual-clipped tokens", h.stats.pg_clipfrac_lower, get(c, "pg_clipfrac_lower")->valuedouble, 0);
        cmp1("  sum of old_lp - lp (ppo_kl)", h.stats.ppo_kl, get(c, "ppo_kl")->valuedouble, 1e-12);
        cmp1("  rollout check: lp == old_lp? max |diff| > 0 here", h.stats.logprob_diff_max > 0, 1, 0);
        free(want);
    }
    cJSON_ArrayForEach(c, get(fx, "critic")) {
        PpoHook h = {.value_clip = get(c, "value_clip")->valuedouble};
        float *ov = flt(get(c, "old_values"));
        PpoCtx ctx = {NULL, NULL, NULL, ov, rets, 0};
        MicroBatch mb = {targets, seq_start, S, targets, weight, &ctx};
        double loss = loss_ppo_critic(&mb, N, values, dout, &h);
        double *want = dbl(get(c, "dv"), NULL);
        for (int n = 0; n < N; n++) x[n] = dout[n];
        snprintf(what, sizeof what, "critic value clip %g: loss", h.value_clip);
        cmp1(what, loss, get(c, "loss")->valuedouble, 1e-7);
        cmp("  d loss / d value (fp32)", x, want, N, 1e-6);
        cmp1("  sum of 0.5 max(...) (vf_loss)", h.stats.vf_loss, get(c, "vf_loss")->valuedouble, 1e-12);
        cmp1("  clipped tokens", h.stats.vf_clipfrac, get(c, "vf_clipfrac")->valuedouble, 0);
        free(want); free(ov);
    }
    if (!g_fail) printf("ok: %d ppo cases match torch\n", g_cases);
    cJSON_Delete(fx);
    free(text); free(ss); free(seq_start); free(mask); free(lp); free(old); free(ref); free(values); free(adv);
    free(rets); free(score); free(x); free(y); free(kl); free(rw); free(targets); free(weight); free(dout);
    return g_fail;
}
