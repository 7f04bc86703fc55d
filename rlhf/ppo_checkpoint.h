/* ppo_checkpoint.h — tandem ppo's checkpoints and resume state (rlhf/ppo_checkpoint.c). */
#ifndef TANDEM_PPO_CHECKPOINT_H
#define TANDEM_PPO_CHECKPOINT_H
#include <stdint.h>
#include "rlhf/roles.h"
#include "train/learner.h"

/* --resume's ppo_state.json */
typedef struct { int step; double kl_coef; char placement[512]; } PpoState;

/* Every rank calls it: the actor and critic members save their parts (learner_save, from
 * load_dir[role]), world rank 0 the in-flight batches of --async-lag (inflight, NULL: none; rlhf/async.h)
 * as inflight.bin, then ppo_state.json, atomically and last; a failed save is
 * one line on every rank and leaves no partial checkpoint. Keeps the newest save_limit (0 = all). */
void ppo_checkpoint_save(const Roles *rs, Learner *learner, const char *const *load_dir, const char *out, int step,
                         double kl_coef, uint64_t seed, int save_limit, const char *inflight, size_t inflight_bytes);
/* --merge (LoRA): the checkpoint-STEP adapters of the actor and critic merged into their weights
 * (lora_merge, as --adapter merges them) and written as OUT/merged/actor and critic HF models.
 * Collective over each trained role's members. */
void ppo_checkpoint_merge(Roles *rs, const char *const *load_dir, const char *out, int step, DType save_dtype);
/* DIR/ppo_state.json into st; a missing or malformed file is one user_error naming it */
void ppo_state_load(const char *dir, PpoState *st);
#endif
