/* pref_loss.h — the preference losses over per-pair scalars, and the loss hooks that turn them into
 * per-token gradients for the training step (train/grad.h's LossHook).
 * Owns: Bradley–Terry (reward models) and DPO (sigmoid with label smoothing, IPO) with their
 * gradients and TRL-named metrics. Does not own: data, the forward, reductions over ranks.
 *
 * Micro-batch layout both hooks expect (train/data.c in pairs mode): sequences 2i and 2i+1 are
 * the chosen and rejected response of pair i; targets >= 0 exactly on response tokens (and EOS).
 *
 * Bradley–Terry (TRL RewardTrainer, OpenRLHF PairWiseLoss): r = the score head's value at the
 * last token of a sequence (its EOS), per pair
 *     loss = -logsigmoid(r_c - r_r - margin) + center * (r_c + r_r)^2
 * (TRL adds center_rewards_coefficient * mean((r_c + r_r)^2)); the step's loss is the mean over
 * its pairs: each pair is weighted by 1 / (pairs in the step over all micro-batches and dp ranks).
 *
 * DPO (Rafailov et al.; TRL DPOTrainer): pi = sum of the policy's logprobs over a response's tokens,
 * ref the same under the frozen reference; IPO uses the mean over the response's tokens instead
 * (TRL divides by the token count for ipo). With h = (pi_c - pi_r) - (ref_c - ref_r):
 *     sigmoid: loss = -(1 - ls) logsigmoid(beta h) - ls logsigmoid(-beta h)
 *     ipo:     loss = (h - 1 / (2 beta))^2
 * rewards/chosen = beta (pi_c - ref_c), rewards/rejected = beta (pi_r - ref_r) (TRL, detached). */
#ifndef TANDEM_PREF_LOSS_H
#define TANDEM_PREF_LOSS_H
#include "train/grad.h"

/* Bradley–Terry for one pair: returns the loss, writes d loss / d r_c and d r_r. */
double bt_loss(double rc, double rr, double margin, double center, double *drc, double *drr);

typedef enum { DPO_SIGMOID, DPO_IPO } DpoLossType;
/* DPO for one pair (pi / ref: summed, or for IPO mean, logprobs): returns the loss, writes
 * d loss / d pi_c and d pi_r. */
double dpo_loss(DpoLossType type, double beta, double label_smoothing, double pi_c, double pi_r, double ref_c,
                double ref_r, double *dpi_c, double *dpi_r);

/* Sums over the pairs a hook has seen (one dp rank's last stage; the caller reduces over dp). */
typedef struct {
    double n_pairs, loss, correct;      /* correct: r_c > r_r (RM) or reward_c > reward_r (DPO) */
    double chosen, rejected;            /* rewards: RM values; DPO beta (pi - ref) */
    double logp_chosen, logp_rejected;  /* DPO: the policy's pi */
    double sq;                          /* RM: sum of r_c^2 + r_r^2 (the rewards' std) */
} PrefStats;
enum { PREF_STATS_N = sizeof(PrefStats) / sizeof(double) };

/* The hooks' user data. pair_weight: 1 / (pairs in the whole step); margin: per pair of this
 * micro-batch or NULL; ref: per sequence of this micro-batch, the reference's response logprob
 * sums (DPO), set by the caller before each micro-batch via MicroBatch.ctx (a PrefCtx). */
typedef struct {
    const float *margin;   /* (n_seqs / 2) or NULL */
    const double *ref;     /* (n_seqs) DPO only: reference pi per sequence (sum; mean for IPO) */
} PrefCtx;

typedef struct {
    double pair_weight;
    double center;                      /* RM: center_rewards_coefficient */
    DpoLossType type;                   /* DPO */
    double beta, label_smoothing;       /* DPO */
    PrefStats stats;                    /* accumulated over the hook's calls */
} PrefHook;

/* LossFn for reward models: out = values (N), loss at each sequence's last token. */
double loss_bt(const MicroBatch *mb, int N, const float *out, float *dout, void *user);
/* LossFn for DPO: out = policy logprobs (N); mb->ctx is a PrefCtx with ref set. */
double loss_dpo(const MicroBatch *mb, int N, const float *out, float *dout, void *user);

/* Per-sequence response logprob: sum (or mean when mean != 0) of lp[t] over targets[t] >= 0. */
void pref_seq_logps(const int *seq_start, int n_seqs, const int *targets, const float *lp, int mean, double *out);
#endif
