/* ppo_loss.c — see ppo_loss.h. Double precision for every accumulation. */
#include "rlhf/ppo_loss.h"
#include "runtime/util.h"
#include <math.h>
#include <string.h>

double kl_estimate(KlEstimator k, double lp, double ref_lp) {
    double d = lp - ref_lp;
    if (k == KL_K1) return d;
    if (k == KL_K2) return 0.5 * d * d;
    double kl = -d, v = exp(kl) - kl - 1.0;   /* k3 (verl "low_var_kl"): ratio = e^(ref - lp) */
    return v < -10.0 ? -10.0 : v > 10.0 ? 10.0 : v;
}

double kl_estimate_grad(KlEstimator k, double lp, double ref_lp) {
    double d = lp - ref_lp;
    if (k == KL_K1) return 1.0;
    if (k == KL_K2) return d;
    double v = exp(-d) + d - 1.0;
    if (v > 10.0) return 0.0;                  /* clamped: no gradient */
    return -exp(-d) + 1.0;
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

void ppo_whiten(double *x, const float *mask, int N) {
    double sum = 0.0, n = 0.0;
    for (int i = 0; i < N; i++) if (mask[i] > 0) { sum += x[i]; n += 1.0; }
    if (n < 2) return;
    double mean = sum / n, ss = 0.0;
    for (int i = 0; i < N; i++) if (mask[i] > 0) ss += (x[i] - mean) * (x[i] - mean);
    double var = ss / (n - 1.0), r = 1.0 / sqrt(var + 1e-8);
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
            else adv[i] = std_norm ? (score[i] - mean) / (sd + eps) : score[i] - mean;
        }
    }
}

double loss_ppo_actor(const MicroBatch *mb, int N, const float *out, float *dout, void *user) {
    PpoHook *h = user;
    const PpoCtx *c = mb->ctx;
    PpoStats *st = &h->stats;
    double loss = 0.0;
    for (int n = 0; n < N; n++) {
        dout[n] = 0.0f;
        if (mb->targets[n] < 0) continue;
        double lp = out[n], A = c->adv[n], w = mb->weight[n];
        if (c->check) {
            double d = fabs(lp - (double)c->old_lp[n]);
            if (!(d <= st->logprob_diff_max)) st->logprob_diff_max = isnan(d) ? INFINITY : d;
            st->n_checked += 1;
        }
        double ratio = exp(lp - (double)c->old_lp[n]);
        double lo = 1.0 - h->clip_low, hi = 1.0 + h->clip_high;
        double rc = ratio < lo ? lo : ratio > hi ? hi : ratio;
        double l1 = -A * ratio, l2 = -A * rc, l = l1 >= l2 ? l1 : l2;
        /* d l / d lp: the unclipped branch (or a tie inside the range) -A ratio; a clipped one 0 */
        double g = (l1 > l2 || (l1 == l2 && rc == ratio)) ? -A * ratio : 0.0;
        st->pg_clipfrac += l2 > l1;
        if (h->clip_c > 0 && A < 0) {
            double l3 = -A * h->clip_c;
            if (l3 < l) { l = l3; g = 0.0; st->pg_clipfrac_lower += 1; }
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
        st->ppo_kl += (double)c->old_lp[n] - lp;
        st->kl_loss += kl;
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
        if (mb->targets[n] < 0) continue;
        double v = out[n], old = c->old_values[n], R = c->returns[n], w = mb->weight[n];
        double lo = old - h->value_clip, hi = old + h->value_clip;
        double vc = v < lo ? lo : v > hi ? hi : v;
        double e1 = (v - R) * (v - R), e2 = (vc - R) * (vc - R);
        double g = e1 >= e2 ? (v - R) : (vc == v ? (vc - R) : 0.0);   /* d 0.5 max(e1, e2) / d v */
        loss += w * 0.5 * (e1 >= e2 ? e1 : e2);
        dout[n] = (float)(w * g);
        st->n_tokens += 1;
        st->vf_loss += 0.5 * (e1 >= e2 ? e1 : e2);
        st->vf_clipfrac += e2 > e1;
    }
    return loss;
}
