/* ppo_dump.h — `tandem ppo --dump-rollouts FILE`: one jsonl line per sample and step, what was
 * trained on, written by world rank 0 after the step's update:
 *   {"step": STEP (1-based, as metrics.jsonl), "sample": s (0-based, in the step's batch), "draw": d
 *    (--dynamic-sampling's draw that sampled it, else 0), "prompt_line": its --prompts line,
 *    "prompt_id": the line's "id" or null, "prompt_ids": [...], "response_ids": [...],
 *    "finish": "stop" | "length", "behaviour_logprobs": [...] (the rollout's), "training_logprobs":
 *    [...] (the actor's in the first epoch's forward of that sequence), "ref_logprobs": [...] and
 *    "teacher_logprobs": [...] (with a reference, a teacher), "loss_mask": [...],
 *    "advantages": [...] (per response token), "score_raw": the reward model's or program's score,
 *    "overlong_penalty": ..., "missing_eos_penalty": ..., "reward": the shaped score}
 * and with --env-cmd / --env-url (rlhf/episode.h) after "advantages": "env_token": [...] (1: the
 * environment's token (observation, feedback), loss mask 0; 0: the model's), "turn": [...] (the
 * model's turn of each token, or the turn an environment token answers, 0: the observation),
 * "turn_rewards": [...] (the environment's reward of each turn at its last token), "turns": the
 * model's turns, "env_fault": "ok" | "bad_reply" | "wrong_episode" | "timeout".
 * Per-token arrays run over the response tokens (an action's value under the token it chose); with
 * an environment the "response" is everything after the prompt.
 * The training logprobs are caught by a hook wrapped around the actor's loss hook on its last
 * stage, then shared to every rank (roles_share_f). Resumed at step k, the file first loses its
 * lines of steps after k and a cut last line, so it ends as the uninterrupted run's.
 * Owns: the file and its format, the capture. Does not own: the loss (rlhf/ppo_loss.h). */
#ifndef TANDEM_PPO_DUMP_H
#define TANDEM_PPO_DUMP_H
#include "rlhf/experience.h"
#include <stdio.h>

typedef struct {
    FILE *f;                  /* world rank 0 */
    const char *path;
    PpoHook *hook;            /* the actor's loss hook, which the capture wraps */
    const MicroBatch *mbs;    /* the mini-batch being trained */
    int cap, *pos;            /* (n_mb, cap) each micro-batch token's position in the batch */
    float *train_lp;          /* (S * max_len) the training logprobs at the batch's actions */
} RolloutDump;

/* Opens path on the writer (resume_step < 0: a new file; else trimmed past resume_step) and sizes
 * the capture for S sequences of max_len tokens. A user_error naming the file when it cannot be
 * opened or rewritten. */
void rollout_dump_open(RolloutDump *d, const char *path, int resume_step, int writer, PpoHook *hook, int S, int max_len);
void rollout_dump_close(RolloutDump *d);
/* Before a first-epoch mini-batch's step: where its micro-batches' tokens sit in b (the sequences
 * perm[k0 + dp_rank], perm[k0 + dp_rank + dp], ... in experience_minibatch's order). */
void rollout_dump_map(RolloutDump *d, const Experience *b, const int *perm, int k0, int mini, int dp, int dp_rank,
                      const Minibatch *mb, int n_mb);
/* The actor's loss hook (user: the RolloutDump) that also keeps the logprobs it is given. */
double rollout_dump_hook(const MicroBatch *mb, int N, const float *out, float *dout, void *user);
/* After the update: the training logprobs from the actor's last stages to every rank. Collective
 * over the world. */
void rollout_dump_share(RolloutDump *d, const Roles *rs, const Experience *b);
/* The step's lines (world rank 0; a no-op elsewhere), flushed. */
void rollout_dump_write(RolloutDump *d, const ExperienceMaker *x, const Experience *b, int step, const int *pidx);
#endif
