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
 * Owns: reading and checking adapters, the merge's arithmetic and sharding. Does not own: training
 * adapters, unmerging, several adapters at once, adapter_model.bin (pickle). */
#ifndef TANDEM_ADAPTER_H
#define TANDEM_ADAPTER_H
#include "runtime/model.h"

/* lora_alpha's range, from a flag or an adapter_config.json: the adapters' scale alpha / r multiplies
 * their term in fp32, and an alpha past this is a typo (it overflows the forward long before it
 * could be meant) */
#define ADAPTER_ALPHA_MAX 1e6
/* DIR/adapter_config.json's settings, checked as adapter_merge checks them (one user_error line naming
 * the file and the field): what a LoRA checkpoint was trained with. target: the LLaMA projections
 * q k v o gate up down (runtime/lora.h's order), 1 where target_modules names one. */
typedef struct {
    int r, rslora, target[7];
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
 * them, in DIR/reward_stats.json {"mean", "std"} (PEFT's adapter_config.json takes no other keys;
 * a full reward model has them in config.json: normalize_reward, mean, std). 1 and the values when
 * the file is there (a malformed one is a user_error naming it), else 0. adapter_merge applies them. */
#define ADAPTER_REWARD_STATS "reward_stats.json"
int adapter_reward_stats(const char *dir, float *mean, float *std);
#endif
