/* ppo_loss.c — see ppo_loss.h. Double precision for every accumulation. */
#include "rlhf/ppo_loss.h"
#include "runtime/util.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

KlEstimator kl_estimator_parse(const char *flag, const char *name) {
    if (!strcmp(name, "k1")) return KL_K1;
    if (!strcmp(name, "k2")) return KL_K2;
    if (!strcmp(name, "k3")) return KL_K3;
    user_error("%s %s: expected k1, k2 or k3", flag, name);
}

AdvantageKind advantage_kind_parse(const char *flag, const char *name) {
    if (!strcmp(name, "gae")) return ADV_GAE;
    if (!strcmp(name, "grpo")) return ADV_GRPO;
    if (!strcmp(name, "rloo")) return ADV_RLOO;
    if (!strcmp(name, "reinforce++") || !strcmp(name, "reinforce_plus_plus")) return ADV_RPP;
    if (!strcmp(name, "reinforce++-baseline") || !strcmp(name, "reinforce_plus_plus_baseline")) return ADV_RPP_BASELINE;
    user_error("%s %s: expected gae, grpo, rloo, reinforce++ or reinforce++-baseline", flag, name);
}

int advantage_kl_in_reward(AdvantageKind kind) { return kind == ADV_GAE || kind == ADV_RPP; }

LossAgg loss_agg_parse(const char *flag, const char *name) {
    if (!strcmp(name, "token-mean")) return AGG_TOKEN_MEAN;
    if (!strcmp(name, "seq-mean-token-mean")) return AGG_SEQ_MEAN_TOKEN_MEAN;
    if (!strcmp(name, "seq-mean-token-sum")) return AGG_SEQ_MEAN_TOKEN_SUM;
    if (!strcmp(name, "seq-mean-token-sum-norm")) return AGG_SEQ_MEAN_TOKEN_SUM_NORM;
    user_error("%s %s: expected token-mean, seq-mean-token-mean, seq-mean-token-sum or seq-mean-token-sum-norm", flag, name);
}

PolicyLoss policy_loss_parse(const char *flag, const char *name) {
    if (!strcmp(name, "ppo") || !strcmp(name, "vanilla")) return PL_PPO;
    if (!strcmp(name, "gspo")) return PL_GSPO;
    if (!strcmp(name, "cispo")) return PL_CISPO;
    user_error("%s %s: expected ppo, gspo or cispo", flag, name);
}

double loss_agg_weight(LossAgg agg, int len, int n_seqs, long actions, int norm, int dp) {
    if (len <= 0) return 0.0;
    double den = agg == AGG_TOKEN_MEAN ? (double)actions
               : agg == AGG_SEQ_MEAN_TOKEN_MEAN ? (double)n_seqs * len
               : agg == AGG_SEQ_MEAN_TOKEN_SUM ? (double)n_seqs : (double)n_seqs * norm;
    return (double)dp / den;
}

/* k3 as verl's "low_var_kl": kl = clamp(ref - lp, -20, 20), clamp(e^kl - kl - 1, -10, 10). The inner
 * clamp never changes a finite result (past +-20 the value is > 10) but keeps an infinite lp from
 * giving inf - inf. */
static double k3_inner(double lp, double ref_lp) {
    double kl = ref_lp - lp;
    return kl < -20.0 ? -20.0 : kl > 20.0 ? 20.0 : kl;
}

double kl_estimate(KlEstimator k, double lp, double ref_lp) {
    double d = lp - ref_lp;
    if (k == KL_K1) return d;
    if (k == KL_K2) return 0.5 * d * d;
    double kl = k3_inner(lp, ref_lp), v = exp(kl) - kl - 1.0;
    return v < -10.0 ? -10.0 : v > 10.0 ? 10.0 : v;
}

double kl_estimate_grad(KlEstimator k, double lp, double ref_lp) {
    double d = lp - ref_lp;
    if (k == KL_K1) return 1.0;
    if (k == KL_K2) return d;
    double kl = k3_inner(lp, ref_lp), v = exp(kl) - kl - 1.0;
    if (!(v <= 10.0)) return 0.0;   /* clamped (also whenever the inner clamp is: v > 10 there; v >= 0) */
    return 1.0 - exp(kl);                                       /* d (e^kl - kl - 1) / d kl * d kl / d lp */
}

void ppo_token_rewards(const int *seq_start, int S, const float *mask, const float *lp, const float *ref_lp,
                       const double *score, KlEstimator k, double kl_coef, double *rewards, double *kl) {
    for (int s = 0; s < S; s++) {
        int last = -1;
        for (int n = seq_start[s]; n < seq_start[s + 1]; n++) {
            double e = mask[n] > 0 ? kl_estimate(k, lp[n], ref_lp[n]) : 0.0;
            if (kl) kl[n] = e;
            rewards[n] = mask[n] > 0 ? -kl_coef * e : 0.0;
            if (mask[n] > 0) last = n;
        }
        if (last >= 0) rewards[last] += score[s];
    }
}

void ppo_gae(const int *seq_start, int S, const float *mask, const double *rewards, const float *values, double gamma,
             double lambda, double *advantages, double *returns) {
    for (int s = 0; s < S; s++) {
        double next_v = 0.0, next_a = 0.0;
        for (int n = seq_start[s + 1] - 1; n >= seq_start[s]; n--) {
            if (!(mask[n] > 0)) { advantages[n] = returns[n] = 0.0; continue; }
            double delta = rewards[n] + gamma * next_v - values[n];
            next_a = delta + gamma * lambda * next_a;
            advantages[n] = next_a;
            returns[n] = next_a + values[n];
            next_v = values[n];
        }
    }
}

void ppo_discounted_returns(const int *seq_start, int S, const float *mask, const double *rewards, double gamma,
                            double *returns) {
    for (int s = 0; s < S; s++) {
        double g = 0.0;
        for (int n = seq_start[s + 1] - 1; n >= seq_start[s]; n--) {
            if (!(mask[n] > 0)) { returns[n] = 0.0; continue; }
            g = rewards[n] + gamma * g;
            returns[n] = g;
        }
    }
}

void ppo_whiten(double *x, const float *mask, int N) {
    double sum = 0.0, n = 0.0;
    for (int i = 0; i < N; i++) if (mask[i] > 0) { sum += x[i]; n += 1.0; }
    if (n < 2) return;
    double mean = sum / (n + 1e-8), ss = 0.0;   /* verl masked_mean: / (n + 1e-8) */
    for (int i = 0; i < N; i++) if (mask[i] > 0) ss += (x[i] - mean) * (x[i] - mean);
    double var = ss / (n + 1e-8) * (n / (n - 1.0)), r = 1.0 / sqrt(var + 1e-8);
    for (int i = 0; i < N; i++) if (mask[i] > 0) x[i] = (x[i] - mean) * r;
}

void group_advantages(AdvantageKind kind, const double *score, int S, int G, int std_norm, double eps, double *adv) {
    CHECK(G >= 1 && S % G == 0 && (kind != ADV_RLOO || G >= 2));
    for (int g = 0; g < S; g += G) {
        double mean = 0.0, ss = 0.0, sd = 1.0;
        if (G > 1) {
            for (int i = g; i < g + G; i++) mean += score[i];
            mean /= G;
            for (int i = g; i < g + G; i++) ss += (score[i] - mean) * (score[i] - mean);
            sd = sqrt(ss / (G - 1));
        }
        for (int i = g; i < g + G; i++) {
            if (kind == ADV_RLOO) adv[i] = (score[i] - mean) * G / (G - 1.0);
            else if (kind == ADV_RPP_BASELINE) adv[i] = score[i] - mean;
            else adv[i] = std_norm ? (score[i] - mean) / (sd + eps) : score[i] - mean;
        }
    }
}

void outcome_advantages(AdvantageKind kind, const int *seq_start, int S, const float *mask, const double *score, int G,
                        int std_norm, double eps, double *adv) {
    double *gadv = xmalloc(sizeof(double) * S);
    group_advantages(kind, score, S, G, std_norm, eps, gadv);
    for (int s = 0; s < S; s++)
        for (int n = seq_start[s]; n < seq_start[s + 1]; n++) adv[n] = mask[n] > 0 ? gadv[s] : 0.0;
    if (kind == ADV_RPP_BASELINE) ppo_whiten(adv, mask, seq_start[S]);
    free(gadv);
}

/* max / min as torch.maximum / torch.minimum: a NaN propagates (fmax would drop it, hiding a broken
 * logprob), and the gradient given da, db splits evenly on an exact tie. clamp_grad: torch.clamp
 * passes the gradient on the closed range. */
static double max_nan(double a, double b) { return isnan(a) || isnan(b) ? NAN : a > b ? a : b; }
static double min_nan(double a, double b) { return isnan(a) || isnan(b) ? NAN : a < b ? a : b; }
static double max_grad(double a, double b, double da, double db) { return a > b ? da : a < b ? db : 0.5 * (da + db); }
static double min_grad(double a, double b, double da, double db) { return a < b ? da : a > b ? db : 0.5 * (da + db); }
static double clamp(double x, double lo, double hi) { return x < lo ? lo : x > hi ? hi : x; }
static double clamp_grad(double x, double lo, double hi, double dx) { return x >= lo && x <= hi ? dx : 0.0; }

/* One action's policy loss l (returned) and d l / d lp (*g) for ppo and cispo; d = lp - old_lp. */
static double token_policy_loss(const PpoHook *h, double lp, double d, double A, double *g, PpoStats *st) {
    /* the loss of verl's compute_policy_loss, each value with its d / d lp beside it */
    double dc = clamp(d, -20.0, 20.0);
    double ratio = exp(dc), dratio = clamp_grad(d, -20.0, 20.0, ratio);
    double lo = 1.0 - h->clip_low, hi = 1.0 + h->clip_high;
    double rc = clamp(ratio, lo, hi), drc = clamp_grad(ratio, lo, hi, dratio);
    st->ppo_kl += -dc;
    if (h->policy == PL_CISPO) {                       /* -sg(clip(ratio)) A lp */
        st->pg_clipfrac += ratio != rc;
        *g = -rc * A;
        return -rc * A * lp;
    }
    double l1 = -A * ratio, l2 = -A * rc;
    double l = max_nan(l1, l2);
    *g = max_grad(l1, l2, -A * dratio, -A * drc);
    st->pg_clipfrac += l2 > l1;
    if (h->clip_c > 0 && A < 0) {                      /* dual clip: at most -A c (no gradient) */
        double l3 = -A * h->clip_c;
        st->pg_clipfrac_lower += l > l3;
        *g = min_grad(l3, l, 0.0, *g);
        l = min_nan(l3, l);
    }
    return l;
}

/* GSPO's token loss given its sequence's log s_i (seq_lr): the ratio's value is the sequence's, its
 * gradient the token's own. */
static double token_gspo_loss(const PpoHook *h, double seq_lr, double d, double A, double *g, PpoStats *st) {
    double ratio = exp(seq_lr < 10.0 ? seq_lr : 10.0), dratio = seq_lr <= 10.0 ? ratio : 0.0;
    double lo = 1.0 - h->clip_low, hi = 1.0 + h->clip_high;
    double rc = clamp(ratio, lo, hi), drc = clamp_grad(ratio, lo, hi, dratio);
    double l1 = -A * ratio, l2 = -A * rc;
    *g = max_grad(l1, l2, -A * dratio, -A * drc);
    st->pg_clipfrac += l2 > l1;
    st->ppo_kl += -d;                                  /* verl's GSPO: the unclamped log-ratio */
    return max_nan(l1, l2);
}

double loss_ppo_actor(const MicroBatch *mb, int N, const float *out, float *dout, void *user) {
    PpoHook *h = user;
    const PpoCtx *c = mb->ctx;
    PpoStats *st = &h->stats;
    double loss = 0.0;
    CHECK(mb->seq_start[mb->n_seqs] == N);
    for (int s = 0; s < mb->n_seqs; s++) {
        int n0 = mb->seq_start[s], n1 = mb->seq_start[s + 1];
        double seq_lr = 0.0, len = 0.0;                /* GSPO: the mean log-ratio over the sequence's actions */
        if (h->policy == PL_GSPO) {
            for (int n = n0; n < n1; n++)
                if (mb->targets[n] >= 0) { seq_lr += (double)out[n] - (double)c->old_lp[n]; len += 1.0; }
            seq_lr /= len > 1.0 ? len : 1.0;
        }
        for (int n = n0; n < n1; n++) {
            dout[n] = 0.0f;
            if (mb->targets[n] < 0) continue;
            double base = c->prox_lp ? (double)c->prox_lp[n] : c->prox_self ? (double)out[n] : (double)c->old_lp[n];
            double lp = out[n], A = c->adv[n], w = mb->weight[n], d = lp - base, g;
            if (c->check) {   /* every action, also those out of the loss */
                double ad = fabs(d);
                if (!(ad <= st->logprob_diff_max)) st->logprob_diff_max = isnan(ad) ? INFINITY : ad;
                st->n_checked += 1;
            }
            if (w == 0) continue;   /* weight 0: out of the loss (--mask-truncated), and of the statistics */
            double l = h->policy == PL_GSPO ? token_gspo_loss(h, seq_lr, d, A, &g, st) : token_policy_loss(h, lp, d, A, &g, st);
            if (c->prox_lp || c->prox_self) {   /* decoupled PPO: the behaviour importance weight, a constant */
                double bw = exp(base - (double)c->old_lp[n]);
                if (h->behav_cap > 0 && !(bw <= h->behav_cap)) bw = 0.0, st->behav_capped += 1;
                l *= bw;
                g *= bw;
                st->behav_weight += bw;
            }
            double kl = 0.0, dkl = 0.0;
            if (h->kl_loss_coef > 0) {
                kl = kl_estimate(KL_K3, lp, c->ref_lp[n]);
                dkl = kl_estimate_grad(KL_K3, lp, c->ref_lp[n]);
            }
            loss += w * (l + h->kl_loss_coef * kl);
            dout[n] = (float)(w * (g + h->kl_loss_coef * dkl));
            st->n_tokens += 1;
            st->pg_loss += l;
            st->kl_loss += kl;
        }
    }
    return loss;
}

double loss_ppo_critic(const MicroBatch *mb, int N, const float *out, float *dout, void *user) {
    PpoHook *h = user;
    const PpoCtx *c = mb->ctx;
    PpoStats *st = &h->stats;
    double loss = 0.0;
    for (int n = 0; n < N; n++) {
        dout[n] = 0.0f;
        if (mb->targets[n] < 0 || mb->weight[n] == 0) continue;   /* weight 0: out of the loss (--mask-truncated) */
        double v = out[n], old = c->old_values[n], R = c->returns[n], w = mb->weight[n];
        /* verl clip_by_value: max(min(v, hi), lo), with d / d v */
        double hi = old + h->value_clip, lo = old - h->value_clip;
        double m = min_nan(v, hi), dm = min_grad(v, hi, 1.0, 0.0);
        double vc = max_nan(m, lo), dvc = max_grad(m, lo, dm, 0.0);
        double e1 = (v - R) * (v - R), e2 = (vc - R) * (vc - R), e = max_nan(e1, e2);
        double g = max_grad(e1, e2, v - R, (vc - R) * dvc);   /* d 0.5 max(e1, e2) / d v */
        loss += w * 0.5 * e;
        dout[n] = (float)(w * g);
        st->n_tokens += 1;
        st->vf_loss += 0.5 * e;
        st->vf_clipfrac += e2 > e1;
    }
    return loss;
}

double masked_mean(const double *x, const float *mask, int N) {
    double s = 0, n = 0;
    for (int i = 0; i < N; i++) if (mask[i] > 0) { s += x[i]; n += 1; }
    return n ? s / n : 0.0;
}

double explained_variance(const double *ret, const float *values, const float *mask, int N) {
    double sr = 0, sd = 0, n = 0, vd = 0, vr = 0;
    for (int i = 0; i < N; i++) if (mask[i] > 0) { sr += ret[i]; sd += ret[i] - values[i]; n += 1; }
    double mr = n ? sr / n : 0.0, md = n ? sd / n : 0.0;
    for (int i = 0; i < N; i++)
        if (mask[i] > 0) { double d = ret[i] - values[i]; vd += (d - md) * (d - md); vr += (ret[i] - mr) * (ret[i] - mr); }
    return vr > 0 ? 1 - vd / vr : 0;
}
