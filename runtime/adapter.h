/* adapter.h — PEFT LoRA adapters for inference (`--adapter DIR` of generate, eval and rm --score):
 * an adapter is merged into this rank's shard of the base weights once, right after model_load,
 * W += scale * B A, so the forward runs unchanged. DIR is what PEFT's save_pretrained writes:
 *   adapter_config.json        peft_type LORA; r, lora_alpha, use_rslora (scale = lora_alpha / r, or
 *                              lora_alpha / sqrt(r)); target_modules: a list of LLaMA projections
 *                              (q_proj k_proj v_proj o_proj gate_proj up_proj down_proj) or
 *                              "all-linear" (all seven); bias "none"; modules_to_save: none, or
 *                              "score" (and "classifier") of a sequence-classification adapter
 *   adapter_model.safetensors  base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight (r, in)
 *                              and .lora_B.weight (out, r), the same for k/v/o_proj and mlp
 *                              gate/up/down_proj; base_model.model.score.weight (1, D) with "score"
 * Anything else (DoRA, a bias, rank or alpha patterns, layers_to_transform, a regex target, a module
 * the LLaMA family does not have, a tensor the config does not explain) is refused by name.
 * Owns: reading and checking adapters, the merge's arithmetic and sharding, and merging a trained
 * run's adapters (lora_merge). Does not own: training adapters (runtime/lora.c), unmerging, several
 * adapters at once, adapter_model.bin (pickle). PEFT's names: runtime/peft.h. */
#ifndef TANDEM_ADAPTER_H
#define TANDEM_ADAPTER_H
#include "runtime/model.h"
#include "runtime/peft.h"

/* lora_alpha's range, from a flag or an adapter_config.json: the adapters' scale alpha / r multiplies
 * their term in fp32, and an alpha past this is a typo (it overflows the forward long before it
 * could be meant) */
#define ADAPTER_ALPHA_MAX 1e6
/* DIR/adapter_config.json's settings, checked as adapter_merge checks them (one user_error line naming
 * the file and the field): what a LoRA checkpoint was trained with. target: the LLaMA projections
 * q k v o gate up down (runtime/lora.h's order), 1 where target_modules names one. */
typedef struct {
    int r, rslora, target[LORA_TARGETS];
    double alpha, dropout;
    char path[4096];   /* the file, for error lines */
} AdapterConfig;
void adapter_config(const char *dir, AdapterConfig *c);
/* Merges the adapter in DIR into m's weights (this rank's tp shard of its pp stage's layers; a
 * "score" module replaces the score head). The merge is fp32: each element of B A is a sum over
 * the rank in order, times scale, added to the weight's fp32 value, then stored (bf16: rounded to
 * nearest even once); every tp layout merges the same bits. Collective in effect: every rank reads
 * the whole config and every tensor's header, so a bad adapter is one user_error line (file and
 * field or tensor) from the group's root, whichever stage the tensor belongs to; a non-finite
 * merged weight is a rank_error. */
void adapter_merge(Model *m, const char *dir);
/* Whether DIR's adapter_model.safetensors holds a score head (base_model.model.score.weight): a
 * sequence-classification adapter, whose base may be a causal LM (rm --score loads that base
 * with a score head, which the adapter's replaces). 0 when the file is missing or unreadable:
 * adapter_merge reports it. */
int adapter_has_score(const char *dir);
/* A reward model trained as adapters (tandem rm --lora-r) keeps its eval reward statistics beside
 * them, in DIR/reward_stats.json (runtime/peft.h PEFT_REWARD_STATS) {"mean", "std"} (a full reward
 * model has them in config.json: normalize_reward, mean, std). 1 and the values when the file is
 * there (a malformed one is a user_error naming it), else 0. adapter_merge applies them. */
int adapter_reward_stats(const char *dir, float *mean, float *std);
/* --merge of a run trained as adapters (runtime/lora.h): the model's own weights again (the
 * adapters off, the score head back in the arena), then the adapter in DIR (a checkpoint's, with the
 * trained score head) merged in as --adapter merges it */
void lora_merge(Model *m, const char *dir);
/* A training command's LoRA flags (--lora-r r, --lora-alpha, --lora-target, --lora-rslora,
 * --lora-dropout; sft, rm, dpo, ppo), checked after args_parse. resume: the checkpoint a run resumes
 * from (NULL: a new run), role: its adapter's subdirectory (ppo's "actor"; NULL: resume itself). A
 * LoRA checkpoint (its adapter_config.json) is
 * the truth: each flag not given takes its value (so --lora-r may be left out), and a given flag that
 * disagrees is a user_error naming it and the file. Without --lora-r, any other LoRA flag is a
 * user_error (the run would train every weight); --lora-target must name a projection; --lora-alpha
 * must be in (0, ADAPTER_ALPHA_MAX]. */
void lora_options_check(int *r, float *alpha, const char **target, int *rslora, float *dropout, const char *resume,
                        const char *role);

/* Reads a PEFT adapter directory's adapter_model.safetensors into the adapters (this rank's blocks),
 * e.g. a run's checkpoint or an adapter to start from; shapes are checked (user_error naming the file
 * and tensor). */
void lora_load(Model *m, const char *dir);

#endif
