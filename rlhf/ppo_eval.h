/* ppo_eval.h — `tandem ppo --eval-prompts FILE [--eval-every N]`: a held-out greedy evaluation, as
 * verl's val_files / test_freq / val_before_train and OpenRLHF's eval: every prompt of FILE (the
 * --prompts line format) once, greedy (temperature 0: argmax), one sample each, scored by the run's
 * own reward source (the reward model, --reward-cmd / --reward-url / --reward-fn, the environment),
 * before the first step, after every N-th step (0: none between) and after the last. The result is
 * a metrics.jsonl line of its own after that step's training line, {"step": K, "eval/reward_mean":
 * .., "eval/n": .., "eval/response_length/mean": ..} (step 0: before training), and one stderr line
 * "eval step K: reward_mean X over N prompts" on world rank 0.
 * It runs the actor's rollout (experience_rollout) on a copy of the run's ExperienceMaker whose
 * prompts, batch and sampling are the eval's, with an Engine of its own on the actor's live weights
 * (the training one may sample a truncated policy, which excludes greedy), and experience_reward on
 * the result. Nothing of the training run changes: no weight, optimizer state or RNG stream is
 * touched (rollout seeds are functions of the step and sample, and greedy draws none).
 * Owns: the eval's maker, engine and batch, its schedule's rule for resumed runs (trainer.c's: the
 * "before" line only where the uninterrupted run has one). Does not own: the rollout and reward
 * (rlhf/experience.c), the metrics file (train/metrics.h). */
#ifndef TANDEM_PPO_EVAL_H
#define TANDEM_PPO_EVAL_H
#include "rlhf/experience.h"
#include "rlhf/roles.h"
#include "train/metrics.h"

typedef struct {
    ExperienceMaker x;   /* the run's maker, copied: the eval's prompts, B (a chunk), G = 1, greedy, its engine */
    Experience b;        /* one chunk's batch */
    int *pidx;           /* (chunk) */
    int chunk, n_chunks; /* prompts per rollout, and rollouts per eval */
    int step0, n_evals;  /* the rollouts' step argument: step0 + n_evals * n_chunks + chunk (episode ids apart
                            from the training steps'; greedy draws no seed) */
    double before;       /* the "before" eval's mean, repeated in the "after" stderr line */
} PpoEval;

/* Reads path (with the run's --input-key, --chat-template and --truncate) into a copy of the run's
 * maker x; actor: the actor's role (its engine is built on members only); steps: the run's (--steps). A prompt whose sequence
 * would not fit the run's max_len when a reward model scores it is a user_error naming the line.
 * Every rank calls it, after the run's setup. */
void ppo_eval_init(PpoEval *e, const ExperienceMaker *x, const Role *actor, int reward_model, int steps, const char *path,
                   const char *key, const char *chat_template, int truncate, const ModelConfig *acfg);
/* One pass over the eval prompts with the actor's current weights (gathered first, ZeRO-3), after
 * step `step` (0: before training); when: "before", "" or "after" (the stderr line's words). The
 * metrics line goes to ml (NULL: none, for a resumed run's "before" pass that the uninterrupted run
 * did not log). Collective over the world. Returns the mean reward. */
double ppo_eval_run(PpoEval *e, Roles *rs, int step, const char *when, MetricsLog *ml);
void ppo_eval_free(PpoEval *e);
#endif
