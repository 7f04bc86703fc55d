/* dynamic_sampling.h — DAPO's dynamic sampling for `tandem ppo --dynamic-sampling` (verl's
 * filter_groups, OpenRLHF's dynamic_filtering): a step samples and scores its B prompts x G
 * samples, drops every group whose shaped scores are all equal (its GRPO / RLOO advantages are 0:
 * it would train nothing), and draws B more prompts (rollout + reward) until B groups are kept, at
 * most --max-sample-draws draws. Draw 0 is the step's own prompts and samples (what the step is
 * without the option); draw d >= 1 takes B prompts from a shuffle seeded by (seed, step, d), those
 * not drawn yet in the step first, and its sample s has seed index s + d B G (experience_rollout):
 * the batch is a function of (seed, step) and the weights, so --resume needs no state.
 * At the cap with fewer than B kept, the batch is filled with the first dropped groups (in draw
 * order: with none kept, exactly the step's own batch) and the metrics say how many.
 * Owns: the draws, the filter and the fill. Does not own: the rollout and the reward
 * (rlhf/experience.h), the shaping (experience_shape_score). */
#ifndef TANDEM_DYNAMIC_SAMPLING_H
#define TANDEM_DYNAMIC_SAMPLING_H
#include "rlhf/experience.h"

/* What a step's sampling did (the metrics: rlhf/ppo_log.c) */
typedef struct {
    int draws;            /* rollouts of B prompts x G samples */
    int drawn, dropped;   /* groups sampled; those of them with equal rewards */
    int filled;           /* dropped groups in the batch (the cap was reached with fewer than B kept) */
} DrawStats;

typedef struct {
    Experience draw, spare;   /* one draw's B x G samples; the first dropped groups (B at most) */
    int *draw_pidx, *spare_pidx;   /* (B) their prompts */
    char *used;               /* (n_prompts) drawn in this step */
} DynamicSampler;

void dynamic_sampler_alloc(DynamicSampler *d, const ExperienceMaker *x);
void dynamic_sampler_free(DynamicSampler *d);
/* Step `step`'s batch into b (its B x G samples with their raw scores) and its prompts into pidx
 * (B); every rank, the same collectives in the same order. t_gen, t_reward: += seconds in the
 * rollouts and the rewards. */
void dynamic_sample(DynamicSampler *d, ExperienceMaker *x, Roles *rs, int step, int *pidx, Experience *b, DrawStats *ds,
                    float *t_gen, float *t_reward);
#endif
