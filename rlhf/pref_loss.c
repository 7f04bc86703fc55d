/* pref_loss.c — see pref_loss.h. Double precision throughout: the per-pair scalars are few. */
#include "rlhf/pref_loss.h"
#include "runtime/util.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static double sigmoid(double x) { return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x)); }
static double logsigmoid(double x) { return x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x)); }

double bt_loss(double rc, double rr, double margin, double center, double *drc, double *drr) {
    double x = rc - rr - margin, s = rc + rr;
    double g = -sigmoid(-x);                       /* d -logsigmoid(x) / dx */
    *drc = g + 2.0 * center * s;
    *drr = -g + 2.0 * center * s;
    return -logsigmoid(x) + center * s * s;
}

double dpo_loss(DpoLossType type, double beta, double ls, double pi_c, double pi_r, double ref_c, double ref_r,
                double *dpi_c, double *dpi_r) {
    double h = (pi_c - pi_r) - (ref_c - ref_r), loss, dh;
    if (type == DPO_IPO) {
        double d = h - 1.0 / (2.0 * beta);
        loss = d * d;
        dh = 2.0 * d;
    } else {
        double z = beta * h;
        loss = -(1.0 - ls) * logsigmoid(z) - ls * logsigmoid(-z);
        dh = beta * (-(1.0 - ls) * sigmoid(-z) + ls * sigmoid(z));
    }
    *dpi_c = dh;
    *dpi_r = -dh;
    return loss;
}

void pref_seq_logps(const int *seq_start, int n_seqs, const int *targets, const float *lp, int mean, double *out) {
    for (int s = 0; s < n_seqs; s++) {
        double sum = 0.0;
        int n = 0;
        for (int t = seq_start[s]; t < seq_start[s + 1]; t++)
            if (targets[t] >= 0) { sum += lp[t]; n++; }
        out[s] = mean && n ? sum / n : sum;
    }
}

double loss_bt(const MicroBatch *mb, int N, const float *out, float *dout, void *user) {
    PrefHook *h = user;
    const PrefCtx *ctx = mb->ctx;
    CHECK(mb->n_seqs % 2 == 0);
    memset(dout, 0, sizeof(float) * N);
    double loss = 0.0;
    for (int i = 0; i < mb->n_seqs / 2; i++) {
        int lc = mb->seq_start[2 * i + 1] - 1, lr = mb->seq_start[2 * i + 2] - 1;   /* last tokens (EOS) */
        double rc = out[lc], rr = out[lr], drc, drr;
        double m = ctx && ctx->margin ? ctx->margin[i] : 0.0;
        double l = bt_loss(rc, rr, m, h->center, &drc, &drr);
        loss += h->pair_weight * l;
        dout[lc] = (float)(h->pair_weight * drc);
        dout[lr] = (float)(h->pair_weight * drr);
        h->stats.n_pairs += 1;
        h->stats.loss += l;
        h->stats.correct += rc > rr;
        h->stats.chosen += rc;
        h->stats.rejected += rr;
        h->stats.sq += rc * rc + rr * rr;
    }
    return loss;
}

double loss_dpo(const MicroBatch *mb, int N, const float *out, float *dout, void *user) {
    PrefHook *h = user;
    const PrefCtx *ctx = mb->ctx;
    CHECK(mb->n_seqs % 2 == 0 && ctx && ctx->ref);
    int mean = h->type == DPO_IPO;
    double *pi = xmalloc(sizeof(double) * mb->n_seqs);
    pref_seq_logps(mb->seq_start, mb->n_seqs, mb->targets, out, mean, pi);
    memset(dout, 0, sizeof(float) * N);
    double loss = 0.0;
    for (int i = 0; i < mb->n_seqs / 2; i++) {
        int c = 2 * i, r = 2 * i + 1;
        double dc, dr;
        double l = dpo_loss(h->type, h->beta, h->label_smoothing, pi[c], pi[r], ctx->ref[c], ctx->ref[r], &dc, &dr);
        loss += h->pair_weight * l;
        const double d[2] = {dc, dr};
        for (int k = 0; k < 2; k++) {
            int s = 2 * i + k, n = 0;
            for (int t = mb->seq_start[s]; t < mb->seq_start[s + 1]; t++) n += mb->targets[t] >= 0;
            double g = h->pair_weight * d[k] / (mean && n ? n : 1);
            for (int t = mb->seq_start[s]; t < mb->seq_start[s + 1]; t++)
                if (mb->targets[t] >= 0) dout[t] = (float)g;
        }
        double rw_c = h->beta * (pi[c] - ctx->ref[c]), rw_r = h->beta * (pi[r] - ctx->ref[r]);
        h->stats.n_pairs += 1;
        h->stats.loss += l;
        h->stats.correct += rw_c > rw_r;
        h->stats.chosen += rw_c;
        h->stats.rejected += rw_r;
        h->stats.logp_chosen += pi[c];
        h->stats.logp_rejected += pi[r];
    }
    free(pi);
    return loss;
}
