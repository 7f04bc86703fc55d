/* peft.h — what PEFT's LoRA files say, shared by training adapters (runtime/lora.c) and merging
 * them for inference (runtime/adapter.c): the seven LLaMA projections an adapter may target (their
 * target_modules names, their module paths inside a layer, and the base weight's global shape),
 * the tensor names of adapter_model.safetensors, and the reward statistics' file beside them.
 * Constants and names only: no code of either side. */
#ifndef TANDEM_PEFT_H
#define TANDEM_PEFT_H
#include <stdint.h>
#include "runtime/config.h"

/* the projections, in PEFT's order of a layer (and the order of an adapter's tensors) */
enum { LORA_Q, LORA_K, LORA_V, LORA_O, LORA_GATE, LORA_UP, LORA_DOWN, LORA_TARGETS };
/* target_modules names */
static const char *const PEFT_TARGET_NAMES[LORA_TARGETS] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                            "gate_proj", "up_proj", "down_proj"};
/* the module's path inside a layer: HF's model.layers.N.<path>.weight, PEFT's <path>.lora_A.weight */
static const char *const PEFT_TARGET_PATHS[LORA_TARGETS] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                            "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                                                            "mlp.down_proj"};
/* adapter_model.safetensors: PEFT_LAYERS "N.<path>.lora_A.weight" (r, in) and lora_B (out, r); the
 * score head of a sequence-classification adapter (modules_to_save) */
#define PEFT_PREFIX "base_model.model."
#define PEFT_LAYERS PEFT_PREFIX "model.layers."
#define PEFT_SCORE PEFT_PREFIX "score.weight"
/* A reward model trained as adapters (tandem rm --lora-r) keeps its eval reward statistics beside
 * them, in DIR/reward_stats.json {"mean", "std"} (PEFT's adapter_config.json takes no other keys):
 * lora_save writes it, adapter_reward_stats reads it. */
#define PEFT_REWARD_STATS "reward_stats.json"

/* projection t's base weight, global (out, in), from config.json */
static inline void peft_target_shape(const ModelConfig *c, int t, int64_t *out, int64_t *in) {
    int64_t D = c->dim, F = c->hidden_dim, QD = (int64_t)c->n_heads * c->head_dim,
            KVD = (int64_t)c->n_heads_kv * c->head_dim;
    switch (t) {
    case LORA_Q: *out = QD; *in = D; break;
    case LORA_K: case LORA_V: *out = KVD; *in = D; break;
    case LORA_O: *out = D; *in = QD; break;
    case LORA_GATE: case LORA_UP: *out = F; *in = D; break;
    default: *out = D; *in = F; break;
    }
}
#endif
