/* lora.h — LoRA adapters as trainable weights beside a frozen base (PEFT's LoraLayer, Hu et al.):
 * each targeted projection y = W x becomes y = W x + scale * B (A x), A (r, in), B (out, r), scale =
 * alpha / r (alpha / sqrt(r) with rsLoRA). Owns: the adapters' spec (PEFT's tensor names), their
 * sharding under tensor parallelism (the layer's own split: column-parallel q/k/v/gate/up keep A
 * whole and B's rows of their outputs; row-parallel o/down keep A's columns of their inputs and B
 * whole), PEFT's initialisation (A kaiming-uniform, B zero), and reading / writing PEFT's adapter
 * directory. The forward's and backward's terms are in runtime/forward.c and train/grad.c.
 * Memory: one fp32 arena in the model's backend (the trained weights and their optimizer state are
 * the adapters' only: the base has no gradients and no moments).
 * Does not own: merging into the base for inference and --merge (runtime/adapter.c lora_merge),
 * PEFT's names (runtime/peft.h), the optimizer. */
#ifndef TANDEM_LORA_H
#define TANDEM_LORA_H
#include "runtime/model.h"
#include "runtime/peft.h"

typedef struct Lora {
    int r;
    double alpha;
    int rslora;
    int target[LORA_TARGETS];   /* 1: that projection is adapted */
    float scale;                /* alpha / r (rslora: alpha / sqrt(r)), in fp32 as PEFT multiplies */
    int enabled;                /* 0: the forward is the base's alone (a reference model) */
    float dropout;              /* PEFT's lora_dropout on each adapter's input, training steps only */
    uint64_t seed;              /* the run's: with the optimizer's step, the masks' key */
    int step;                   /* the optimizer step being taken (learner_step sets it) */
    const long *token0;         /* (micro-batches) where each of the step's micro-batches starts among the
                                   whole step's tokens (every dp rank's, in the data's order; train/trainer.c
                                   Step.token0): the masks follow a token's place in the step, whatever the
                                   split over micro-batches and dp ranks. NULL: the micro-batch's index */
    float **A, **B;             /* (L_local * LORA_TARGETS) this rank's blocks, NULL where not adapted:
                                   A (r, in_local), B (out_local, r); see the top for which is whole */
    float *arena;               /* every A and B, in the order of infos; the backend's memory */
    size_t n;                   /* floats in it */
    ParamInfo *infos;           /* (n_infos) the adapters' tensors on this rank, PEFT's names */
    int n_infos;
    float *score;               /* a score head (reward models, critics) trained in full as PEFT's
                                   modules_to_save: (num_labels, D) fp32 in the arena, m->w.score points at
                                   it (the forward reads it as fp32: lora_score_dtype); NULL otherwise */
    void *score_base;           /* the model's own score.weight (its arena's), where a merge writes */
} Lora;

/* --lora-target: "all-linear" or a comma list of q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,
 * down_proj; anything else is a user_error naming flag */
void lora_targets_parse(const char *flag, const char *list, int target[LORA_TARGETS]);
/* A Mixture-of-Experts model (cfg.moe) has no dense MLP: gate/up/down targeted is a user_error naming
 * `what` (the flag or the adapter's config file) that says which projections may be (the attention's:
 * runtime/moe.c's experts and router take no adapters) */
void lora_moe_check(const ModelConfig *c, const int target[LORA_TARGETS], const char *what);
/* Adapters for m (this rank's layers and tp shard), initialised as PEFT does: A ~ U(-1/sqrt(in),
 * 1/sqrt(in)) (kaiming_uniform with a = sqrt(5)), drawn for the whole tensor from `seed`, the layer
 * and the projection (every layout the same values), B = 0. A user_error when the layout cannot
 * split them (k/v adapted while tp > num_key_value_heads). Sets m->lora, m->lora_r and m->lora_width,
 * and registers the adapters' destructor (m->free_lora: model_free frees them). */
Lora *lora_new(Model *m, int r, double alpha, int rslora, const int target[LORA_TARGETS], uint64_t seed);
/* The dropout key of micro-batch `micro` of the current step (0: no dropout: without adapters, with
 * lora_dropout 0, and outside a training step): bits 0-39 a key of (seed, step), bits 40-63 the
 * micro-batch's first token's place in the step (token0; a rank_error past 2^24 tokens). Masks
 * (kernels.h dropout_keep) follow from it, the layer and the projection: element (n, j) of a
 * micro-batch's adapter input is element (token0 + n, j) of the step's, so every layout, and a
 * resumed run at any layout, draws the same masks. */
uint64_t lora_micro_key(const Model *m, int micro);
/* one projection's mask key from the micro-batch's (every projection its own dropout, as PEFT's), its
 * input cols_global wide: dropout_keep's index n * cols_global + j then counts from the step's token 0 */
static inline uint64_t lora_target_key(uint64_t key, int layer, int t, int cols_global) {
    uint64_t base = key & ((1ull << 40) - 1), token0 = key >> 40;
    return (base ^ ((uint64_t)(layer * LORA_TARGETS + t + 1) << 40)) + token0 * (uint64_t)cols_global * 0x9E3779B97F4A7C15ull;
}
/* the dtype the score head is read in: fp32 when the adapters train it, else the model's */
DType lora_score_dtype(const Model *m);
/* Writes dir/adapter_config.json and dir/adapter_model.safetensors as PEFT's save_pretrained does
 * (base_model_name_or_path = base), world rank 0 writing what every tp / pp rank of dp rank 0 sends
 * it (one file, as PEFT reads it). Collective over m's mesh. 0, or -1 with err (CHECKPOINT_ERR_CAP-
 * sized, the line naming the file) on every rank. */
int lora_save(const Model *m, const char *dir, const char *base, char *err, size_t cap);
/* The tensor file alone, of `host` (lora->n floats on the host: this rank's blocks laid out as the
 * arena; dp rank 0's are written): the optimizer's moments go the same way (train/optim_state.c). */
int lora_write_blocks(const Model *m, const float *host, const char *path, char *err, size_t cap);
/* This rank's blocks of every adapter tensor of the file at path into host (lora->n floats). */
void lora_read_blocks(const Model *m, const char *path, float *host);
#endif
