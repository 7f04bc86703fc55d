/* ppo_loss.h — the math of PPO / GRPO / RLOO / REINFORCE++ over per-token arrays, and the loss hooks
 * of the actor and the critic. Pure host code, double accumulation; no model, no communication.
 * Owns: KL estimators, token-level rewards, GAE, discounted returns, masked whitening, group
 * advantages (GRPO, RLOO, REINFORCE++-baseline), the loss aggregations (the per-token weights), the
 * policy losses (PPO's clipped one with clip-higher and dual clip, GSPO, CISPO) and the clipped
 * value loss with their gradients and verl-named statistics. Formulas follow verl's trainer/ppo/core_algos.py (the reference the
 * tests' torch implementation is written from).
 *
 * Layout: a batch of S sequences packed back to back (seq_start (S + 1), N tokens). An "action" is
 * a response token; it is indexed by the position BEFORE it (the state that emitted it): position n
 * is an action iff targets[n] >= 0, and then targets[n] = tokens[n + 1]. Per-token arrays (N) hold a
 * value at action positions and are ignored (or written 0) elsewhere: logprobs lp / old_lp / ref_lp,
 * values, rewards, advantages, returns. mask (N): 1 at actions, 0 elsewhere. */
#ifndef TANDEM_PPO_LOSS_H
#define TANDEM_PPO_LOSS_H
#include "train/grad.h"

typedef enum { KL_K1, KL_K2, KL_K3 } KlEstimator;   /* k1: lp - ref; k2: 0.5 (lp - ref)^2; k3: e^(ref-lp) - (ref-lp) - 1 */
/* "k1" | "k2" | "k3"; anything else is a user_error naming flag and name */
KlEstimator kl_estimator_parse(const char *flag, const char *name);
/* One token's KL estimate of pi (lp) against the reference (ref_lp). k3 is clamped to [-10, 10] as verl,
 * after verl's clamp of ref - lp to [-20, 20] before exp (k3 > 10 beyond it, so it changes no finite
 * result; an infinite lp gives 10, not NaN). */
double kl_estimate(KlEstimator k, double lp, double ref_lp);
/* d kl_estimate / d lp (for the KL-in-loss term): torch autograd's, so 0 where k3 is clamped (> 10) */
double kl_estimate_grad(KlEstimator k, double lp, double ref_lp);

/* Token-level rewards: rewards[n] = -kl_coef * kl_estimate(lp[n], ref_lp[n]) at every action, plus
 * score[s] at each sequence's LAST action (score: the reward model's or command's scalar, already
 * clipped / penalised by the caller). Non-actions get 0. kl (N, may be NULL) receives the estimates. */
void ppo_token_rewards(const int *seq_start, int S, const float *mask, const float *lp, const float *ref_lp,
                       const double *score, KlEstimator k, double kl_coef, double *rewards, double *kl);

/* GAE per sequence over its actions in order (verl compute_gae_advantage_return): with V after the
 * last action = 0,
 *     delta_t = r_t + gamma V_{t+1} - V_t,   A_t = delta_t + gamma lambda A_{t+1},   R_t = A_t + V_t
 * advantages / returns (N): 0 at non-actions. Advantages are NOT whitened here. */
void ppo_gae(const int *seq_start, int S, const float *mask, const double *rewards, const float *values, double gamma,
             double lambda, double *advantages, double *returns);

/* Masked whitening over every action of the batch (verl masked_whiten, shift_mean): x = (x - mean)
 * / sqrt(var + 1e-8), with verl's masked_mean, which divides by n + 1e-8 (not n), for both the mean and
 * the variance: mean = sum x / (n + 1e-8), var = sum (x - mean)^2 / (n + 1e-8) * n / (n - 1) (Bessel).
 * Non-actions are left as they are; with fewer than 2 actions nothing changes (verl raises). */
void ppo_whiten(double *x, const float *mask, int N);

/* Group advantages for outcome rewards, groups of G consecutive sequences (the samples of one prompt;
 * S % G == 0). score (S) -> adv (S):
 *     GRPO: (s - mean_g) / (std_g + eps), std unbiased (torch.std); std_norm = 0: s - mean_g (Dr. GRPO)
 *     RLOO: s - mean of the OTHER G - 1 samples = G / (G - 1) (s - mean_g)
 * G == 1: GRPO uses mean 0, std 1 (as verl: s / (1 + eps)); RLOO needs G >= 2 (CHECK). */
/* The metrics' means over the actions: sum of x where mask > 0 / their count (0 when none). */
double masked_mean(const double *x, const float *mask, int N);
/* verl's vf_explained_var: 1 - Var(ret - values) / Var(ret) over the actions (population
 * variances); 0 when Var(ret) is 0. */
double explained_variance(const double *ret, const float *values, const float *mask, int N);

typedef enum { ADV_GAE, ADV_GRPO, ADV_RLOO, ADV_RPP, ADV_RPP_BASELINE } AdvantageKind;
/* "gae" | "grpo" | "rloo" | "reinforce++" | "reinforce++-baseline" (verl's names reinforce_plus_plus
 * and reinforce_plus_plus_baseline too); anything else is a user_error naming flag and name */
AdvantageKind advantage_kind_parse(const char *flag, const char *name);
/* Whether the estimator's token rewards carry the KL penalty (--kl-coef): gae and reinforce++ (token
 * rewards); grpo, rloo and reinforce++-baseline are outcome estimators (KL in the loss instead). */
int advantage_kl_in_reward(AdvantageKind kind);
/* REINFORCE++-baseline's is GRPO's without the std: s - mean_g */
void group_advantages(AdvantageKind kind, const double *score, int S, int G, int std_norm, double eps, double *adv);
/* An outcome estimator's token advantages adv (N): group_advantages broadcast over each sequence's
 * actions (0 elsewhere); reinforce++-baseline then whitened over the batch (verl
 * compute_reinforce_plus_plus_baseline_outcome_advantage). */
void outcome_advantages(AdvantageKind kind, const int *seq_start, int S, const float *mask, const double *score, int G,
                        int std_norm, double eps, double *adv);

/* REINFORCE++ (verl compute_reinforce_plus_plus_outcome_advantage): per sequence, backwards over its
 * actions, G_t = r_t + gamma G_{t+1} (G after the last action = 0); a non-action inside the
 * response carries G through unchanged (verl: "rewards propagate past observation spans").
 * returns (N): G_t at actions, 0 elsewhere. The caller whitens them into advantages. */
void ppo_discounted_returns(const int *seq_start, int S, const float *mask, const double *rewards, double gamma,
                            double *returns);

/* Loss aggregation (verl agg_loss), as the weight of each action of a mini-batch of n_seqs sequences
 * (those with at least one action) and `actions` actions in all, for a sequence of len actions:
 *     token-mean               loss = sum_t l_t / actions                        w = 1 / actions
 *     seq-mean-token-mean      loss = 1/n_seqs sum_i (sum_t l_it / len_i)        w = 1 / (n_seqs len_i)
 *     seq-mean-token-sum       loss = 1/n_seqs sum_i sum_t l_it                  w = 1 / n_seqs
 *     seq-mean-token-sum-norm  loss = 1/n_seqs sum_i sum_t l_it / norm           w = 1 / (n_seqs norm)
 * (Dr. GRPO; norm is a constant: verl's loss_scale_factor, by default the padded response length,
 * which is --max-new-tokens.) Returned times dp (optim_step averages the dp replicas' gradients), as
 * one division of dp by an exact integer; 0 when len is 0. */
typedef enum { AGG_TOKEN_MEAN, AGG_SEQ_MEAN_TOKEN_MEAN, AGG_SEQ_MEAN_TOKEN_SUM, AGG_SEQ_MEAN_TOKEN_SUM_NORM } LossAgg;
/* "token-mean" | "seq-mean-token-mean" | "seq-mean-token-sum" | "seq-mean-token-sum-norm" */
LossAgg loss_agg_parse(const char *flag, const char *name);
double loss_agg_weight(LossAgg agg, int len, int n_seqs, long actions, int norm, int dp);

typedef enum { PL_PPO, PL_GSPO, PL_CISPO } PolicyLoss;
/* "ppo" (verl's "vanilla") | "gspo" | "cispo" */
PolicyLoss policy_loss_parse(const char *flag, const char *name);

/* Statistics a hook accumulates over its calls (sums; the caller divides and reduces over ranks). */
typedef struct {
    double n_tokens;        /* actions seen */
    double pg_loss;         /* sum of per-token clipped policy loss */
    double pg_clipfrac;     /* actions where the clipped term was taken (pg_losses2 > pg_losses1) */
    double pg_clipfrac_lower; /* dual clip taken (A < 0 and the -A c bound was the min) */
    double ppo_kl;          /* sum of old_lp - lp, clamped to [-20, 20] as the ratio is */
    double kl_loss;         /* sum of the KL-in-loss estimate (k3 vs ref) */
    double logprob_diff_max;/* max |lp - old_lp| over checked tokens (the rollout exactness check) */
    double n_checked;       /* tokens compared for logprob_diff_max */
    double vf_loss;         /* sum of per-token max((v - R)^2, (v_clipped - R)^2) (times 0.5 as verl) */
    double vf_clipfrac;     /* actions where the clipped value term was larger */
    double behav_weight;    /* decoupled PPO: sum of the behaviour importance weights (0 where capped) */
    double behav_capped;    /* actions whose weight was past --behav-imp-weight-cap (weight 0) */
} PpoStats;
enum { PPO_STATS_N = sizeof(PpoStats) / sizeof(double) };

/* Per micro-batch context (MicroBatch.ctx), arrays (N) of the micro-batch's tokens */
typedef struct {
    const float *old_lp;    /* actor: rollout logprobs at the temperature (the behaviour policy) */
    const float *ref_lp;    /* actor: reference logprobs (KL in loss), may be NULL when kl_loss_coef 0 */
    const float *adv;       /* actor: advantages */
    const float *old_values;/* critic: the values at rollout */
    const float *returns;   /* critic: GAE returns */
    const float *prox_lp;   /* actor, --async-lag: the proximal logprobs (decoupled PPO, below); NULL: off */
    int check;              /* actor: 1 = the weights are the rollout's (with prox_lp: the proximal pass's):
                               lp must equal old_lp (prox_lp) exactly */
    int prox_self;          /* actor, --async-lag with one mini-batch and epoch: the proximal policy is the
                               weights of this very forward, prox_lp = lp (detached; no extra pass) */
} PpoCtx;

typedef struct {
    double clip_low, clip_high;  /* ratio clipped to [1 - clip_low, 1 + clip_high] (DAPO clip-higher) */
    double clip_c;               /* dual clip: for A < 0 the loss is at most -A c (c > 1); 0 = off */
    double kl_loss_coef;         /* + coef * k3(lp, ref_lp) per action (GRPO's KL in loss); 0 = off */
    PolicyLoss policy;           /* ppo | gspo | cispo (clip_low / clip_high are each one's clip range) */
    double value_clip;           /* critic: values clipped to old +- value_clip */
    double behav_cap;            /* decoupled PPO: behaviour weights above it count 0 (AReaL's
                                    behav_imp_weight_cap); 0 = no cap */
    PpoStats stats;
} PpoHook;

/* Actor hook (LM head at the sampling temperature), each action weighted by mb->weight[n] (the
 * aggregation: loss_agg_weight), loss = sum_n w_n (l_n + kl_loss_coef k3(lp_n, ref_n)) with l_n:
 *   ppo (verl compute_policy_loss_vanilla):
 *     ratio = exp(clamp(lp - old_lp, -20, 20))          (verl clamps the log-ratio "for stability")
 *     l1 = -A ratio, l2 = -A clip(ratio, 1 - clip_low, 1 + clip_high), l = max(l1, l2)
 *     dual clip (A < 0): l = min(l, -A clip_c)
 *   gspo (Zheng et al. 2025; verl compute_policy_loss_gspo): per sequence i of the micro-batch,
 *     log s_i = mean over its actions of (lp - old_lp); each token's ratio s_it = sg(s_i) e^(lp - sg(lp)),
 *     valued exp(min(log s_i, 10)) with d s_it / d lp_t = s_it (0 past verl's clamp at 10); l as ppo's
 *     l1 / l2 with s_it for ratio (no dual clip); stats: ppo_kl unclamped as verl's
 *   cispo (MiniMax-M1; verl compute_policy_loss_cispo): l = -sg(clip(ratio, 1 - clip_low,
 *     1 + clip_high)) A lp (ratio as ppo's), d l / d lp = -clip(ratio) A; pg_clipfrac counts ratios
 *     outside the range
 * dout is torch autograd's gradient of that formula: for ppo -A ratio w through the unclipped term
 * (also when l1 == l2 inside the clip range), 0 through a clipped ratio, a dual clip or a clamped
 * log-ratio; on an exact tie of max / min between terms of different gradients torch splits it
 * evenly, and so does the hook. With ctx->check, lp must equal old_lp bit for bit; the max |diff|
 * goes into stats.
 * Decoupled PPO (ctx->prox_lp; ppo only): Hilton et al. 2022, "Batch size-invariance for policy
 * optimization", eq. 3, in AReaL's form (areal/utils/functional.py ppo_actor_loss_fn with
 * proximal_logprobs): the ratio (and its clip, and the dual clip) is against the proximal policy,
 * d = lp - prox_lp, and each token's l and its gradient are multiplied by the behaviour importance
 * weight b = exp(prox_lp - old_lp) (old_lp: the behaviour policy, the rollout's), not
 * differentiated; b = 0 where b > behav_cap (AReaL's mask, not a clip) when behav_cap > 0. The KL
 * and entropy terms are not weighted. ppo_kl is then the proximal one. ctx->prox_self: the same with
 * prox_lp = lp itself (a constant): what the proximal pass gives when the update is one mini-batch of
 * one epoch, whose forward runs on the weights before the update. */
double loss_ppo_actor(const MicroBatch *mb, int N, const float *out, float *dout, void *user);
/* Critic hook (score head values at every position):
 *     v_c = clip(v, old - value_clip, old + value_clip)   (verl clip_by_value: max(min(v, hi), lo))
 *     loss = sum_n w_n 0.5 max((v - R)^2, (v_c - R)^2)
 * dout is torch autograd's: w (v - R) when the unclipped term is larger, w (v_c - R) [lo < v < hi]
 * when the clipped one is; exact ties split evenly as torch.maximum / torch.minimum do (inside the
 * range both terms are equal with the same gradient: w (v - R); at v == old +- value_clip, 0.75 of it). */
double loss_ppo_critic(const MicroBatch *mb, int N, const float *out, float *dout, void *user);
#endif
