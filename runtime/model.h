/* model.h — a LLaMA-family model on a TP x PP mesh: the parameter spec table, this rank's shard
 * of the weights (one arena), the activation arena, and THE forward pass (runtime/forward.c): one
 * per-layer forward used by generation (keys/values in the paged KV cache), eval, scoring and
 * training (keys/values in the batch's own rows, every layer's activations kept for the backward),
 * with the heads (LM logits -> logprobs, or a scalar score) at the end of the last stage.
 * Owns: sharding rules (ARCHITECTURE.md table), loading from an HF directory, the forward, the
 * vocab-parallel log-softmax helpers, the paged KV cache's struct (its pool: generate/kv_cache.c).
 * The choice of backend and dtype (--device, --dtype) is runtime/device.h's; the optional parts
 * (LoRA's adapters, ZeRO-3's slices) are their own files', which register their destructors here.
 * Kernels only through m->be, and memory placement too: the weights, inv_freq, the run state and the
 * KV pool are the backend's memory (m->be->alloc), which host code reads and writes only through
 * to_host / to_device (on the CPU those are copies; on a GPU, transfers). What a function takes on
 * the host and what in the backend's memory is said at each below.
 * Does not own: sampling, scheduling, the backward and the optimizer (train/), I/O formats.
 * Shapes: N tokens packed over sequences, D, F, H, Hkv, Dh, V; `_local` = this TP rank's share. */
#ifndef TANDEM_MODEL_H
#define TANDEM_MODEL_H
#include <stddef.h>
#include <stdint.h>
#include "kernels/kernels.h"
#include "runtime/config.h"
#include "runtime/mesh.h"

/* Weight pointers are untyped: the model's own are of Model.dtype; the same structs laid over a
 * gradient or moment arena (model_weights_place) point at fp32. */
typedef struct {
    void *attn_norm;  /* (D) */
    void *wq;         /* (H_local*Dh, D)    column-parallel by query heads */
    void *bq;         /* (H_local*Dh)       qwen2 / attention_bias, else NULL */
    void *wk;         /* (Hkv_local*Dh, D)  column-parallel by kv heads (replicated if tp > Hkv) */
    void *bk;         /* (Hkv_local*Dh) */
    void *wv;         /* (Hkv_local*Dh, D) */
    void *bv;         /* (Hkv_local*Dh) */
    void *wo;         /* (D, H_local*Dh)    row-parallel: partial sums, all-reduced over tp */
    void *q_norm;     /* (Dh)               qwen3: RMSNorm weight of every q head (replicated), else NULL */
    void *k_norm;     /* (Dh)               qwen3: of every k head (replicated), else NULL */
    void *mlp_norm;   /* (D) */
    void *w_gate;     /* (F_local, D)       column-parallel */
    void *w_up;       /* (F_local, D)       column-parallel, split separately from gate */
    void *w_down;     /* (D, F_local)       row-parallel */
    /* a MoE layer (cfg.moe) instead of gate/up/down (NULL then): E routed experts, each a SwiGLU MLP
     * of width Fe split over tp like the dense one; qwen2_moe's shared expert of width Fs likewise */
    void *router;     /* (E, D)             replicated: every tp rank routes every token identically */
    void *e_gate;     /* (E_local, Fe_local, D) column-parallel, this rank's experts back to back (E / ep) */
    void *e_up;       /* (E_local, Fe_local, D) column-parallel */
    void *e_down;     /* (E_local, D, Fe_local) row-parallel */
    void *s_gate;     /* (Fs_local, D)      shared expert (qwen2_moe), else NULL */
    void *s_up;       /* (Fs_local, D) */
    void *s_down;     /* (D, Fs_local)      row-parallel */
    void *s_router;   /* (1, D)             the shared expert's sigmoid gate, replicated */
} LayerWeights;

typedef struct {
    void *embed;      /* (V_local, D) vocab rows [vocab_start, +V_local); first stage */
    void *final_norm; /* (D) last stage */
    void *lm_head;    /* (V_local, D) last stage, LM head; same pointer as embed when tied and pp == 1 */
    void *score;      /* (1, D) last stage, score head (replicated over tp); NULL for an LM */
    LayerWeights *layers; /* (L_local) this stage's layers */
} ModelWeights;

/* What one layer's forward reads and writes, (N, .) each at the batch's rows. Training keeps one
 * set per layer for the backward; inference points every layer at one reused set with
 * x_in == x_mid (the residual updated in place), xb2 == xb1 and act == gate. */
typedef struct {
    float *x_in;   /* (N, D) block input: the residual stream entering the layer */
    float *xb1;    /* (N, D) rmsnorm(x_in) * attn_norm: input of q/k/v */
    float *q;      /* (N, H_local*Dh) after RoPE */
    float *k;      /* (N, Hkv_local*Dh) after RoPE */
    float *v;      /* (N, Hkv_local*Dh) */
    float *att;    /* (N, H_local*Dh) attention output: input of o_proj */
    float *x_mid;  /* (N, D) residual after the attention block */
    float *xb2;    /* (N, D) rmsnorm(x_mid) * mlp_norm: input of gate/up */
    float *gate;   /* (N, F_local) gate pre-activation */
    float *up;     /* (N, F_local) up pre-activation */
    float *act;    /* (N, F_local) silu(gate) * up: input of down_proj */
    float *q_pre;  /* with q_norm (qwen3): (N, H_local*Dh) q_proj's output before its per-head RMSNorm (training
                    * keeps it for the norm's backward; inference points it at q: normed in place); else NULL */
    float *k_pre;  /* with k_norm: (N, Hkv_local*Dh) the same for k; else NULL */
    float *lora_u; /* with LoRA: (LORA_TARGETS, N, r) each adapted projection's scale * x A^T (its tp sum for
                    * o/down), kept for the backward; NULL without */
} LayerActs;

struct KVCache;
/* One batch as this stage's layers see it: n_seqs sequences packed back to back. Buffers are the
 * backend's memory but seq_start (and paged's host copies). */
typedef struct {
    int N, n_seqs;
    const int *seq_start;  /* (n_seqs + 1) host: rows of each sequence, from seq_start[0] (a group's offset) */
    const int *pos;        /* (N) position of each row in its sequence */
    const float *rope;     /* (N, Dh) the rows' RoPE cos/sin (rope_table) */
    struct KVCache *kv;    /* the paged cache (k, v stored there first), or NULL: this batch's own rows */
    PagedBatch paged;      /* with kv: the rows' sequences, positions and block tables */
    float *xo;             /* (N, D) scratch: a block's output before the residual add */
    float *scratch;        /* attention scratch, scratch_stride floats per thread */
    size_t scratch_stride;
    /* sequence parallelism (training's --sequence-parallel, Megatron's): the residual stream and the
     * norms' outputs (x_in, x_mid, xb1, xb2) hold this tp rank's rows [sp_lo, sp_hi) only; sp_full
     * (N, D) receives a norm's output from every rank before the column-parallel matmuls, and a
     * row-parallel output is reduce-scattered to the rows (the tp sum's tree: the same bits). NULL:
     * every row on every rank. */
    float *sp_full;
    int sp_lo, sp_hi;
    float *lora_tmp; /* with LoRA: (N, max(D, F_local, H_local Dh)) scratch: an adapter's term before it is added */
    uint64_t lora_key; /* LoRA dropout's key of this micro-batch (lora_micro_key), 0: none (inference, eval) */
    float *lora_xd;  /* with lora_key: (N, max(D, F_local, H_local Dh)) the dropped-out input */
    double *moe_stats; /* MoE, training's forward: (2 E) += each expert's choices (N k in all) and its summed
                        * routing probability over the rows, every local layer (the load-balancing loss); NULL */
} LayerBatch;

/* The buffers model_target_logprobs works in, the backend's memory, `rows` rows each: a run
 * state's (the last stage of an LM: max_tokens rows) or training's (TrainActs). */
typedef struct {
    float *lse;    /* (rows) the log-sum-exp of each logits row, left there for the caller */
    float *pick;   /* (rows) scratch: the targets' logits */
    float *lp;     /* (rows) the logprobs on their way to the host */
    int *targets;  /* (rows) the targets, uploaded */
    int rows;
} LogprobBufs;

typedef struct {
    float *x;      /* (N, D) residual stream */
    float *xb;     /* (N, D) normed input of a block */
    float *q;      /* (N, H_local*Dh) */
    float *k;      /* (N, Hkv_local*Dh) */
    float *v;      /* (N, Hkv_local*Dh) */
    float *att;    /* (N, H_local*Dh) attention output before o_proj */
    float *xo;     /* (N, D) block output (partial sum before the tp all-reduce) */
    float *hb;     /* (N, F_local) gate, then silu(gate) * up */
    float *hb2;    /* (N, F_local) up */
    float *logits; /* (N, V_local) last stage; padded vocab columns are -inf. Score head: (N, 1) values */
    float *scratch;/* (threads, heads, max_seq) attention scores */
    float *rope;   /* (N, Dh) cos then sin of each token's RoPE angles (the backend's rope_table) */
    float *lora_u; /* with LoRA (sized when the run state is): (N, LORA_TARGETS, r), else empty */
    float *lora_tmp;/* with LoRA: (N, max(D, F_local)), else empty */
    LogprobBufs lp; /* the last stage of an LM: model_target_logprobs' (N rows each), else empty */
    int *ids;      /* (4 * max_tokens) a forward's positions (N), tokens (N), logit rows (R) and each row's
                    * sequence (N), packed from the front: one upload per forward; then lp.targets */
    int *ids_host; /* (4 * max_tokens) host: the same, staged (its positions are the forward's control flow) */
    float *arena;  /* every float buffer above: the backend's memory, as ids */
    const Backend *be;
    size_t n_floats;
    int max_tokens, max_seq;
} RunState;

typedef enum { HEAD_LM = 0, HEAD_SCORE } HeadKind;

typedef struct Model {
    ModelConfig cfg;
    const Mesh *mesh;
    const Backend *be;                                   /* every kernel call goes through it */
    HeadKind head;                                       /* LM logits or a scalar score (last stage) */
    uint64_t score_seed;                                 /* != 0: score.weight was initialised, not read */
    int n_heads_local, n_heads_kv_local, hidden_local;  /* H_local, Hkv_local, F_local */
    int vocab_padded, vocab_local, vocab_start;          /* V rounded up (below); this rank's rows */
    /* tp-invariant sums (kernels.h TP_LEAVES): this rank's leaves of o_proj's and down_proj's dot
     * products and of the vocabulary's sums; 1 each where tp does not divide TP_LEAVES */
    int o_leaves, down_leaves, vocab_leaves;
    int moe_dim_local, shared_dim_local;                 /* Fe_local, Fs_local (MoE; 0 dense) */
    int moe_leaves, shared_leaves;                       /* the experts' and shared expert's down_proj leaves */
    int n_experts_local, expert_start;                   /* MoE: this rank's experts, E / ep from expert_start
                                                          * (mesh ep_rank's block); E and 0 at ep 1 */
    int layer_start, n_layers_local;                     /* this pp stage's layers */
    int is_first, is_last;                               /* pp stage owns embedding / head */
    DType dtype;          /* the weights' storage dtype (F32 or BF16, never AUTO); matmul inputs are rounded
                           * to it (runtime/forward.c) */
    DType kv_dtype;       /* --kv-dtype: keys (after RoPE) and values rounded to it where produced, and the
                           * KV cache's elements (runtime/forward.c; F32: no rounding) */
    ModelWeights w;       /* pointers into params */
    void *params;         /* the parameter arena, n_params elements of dtype, the backend's memory */
    size_t n_params;      /* elements in it */
    float *inv_freq;      /* (Dh/2) RoPE inverse frequencies, scaling applied (the backend's memory) */
    RunState s;           /* the run state of model_forward / model_score (model_alloc_state); a
                           * generation engine owns its own */
    double weight_bytes;  /* what this rank's weights take: the arena, or ZeRO-3's slices and buffers */
    /* the optional parts, each added by its own file, which registers its destructor for model_free */
    struct ModelShards *z3; /* ZeRO-3 (runtime/shards.c): the weights sliced over dp; NULL */
    void (*free_z3)(struct Model *m);    /* model_shard_weights' */
    struct Lora *lora;      /* trainable LoRA adapters beside the frozen weights (runtime/lora.h); NULL */
    void (*free_lora)(struct Model *m);  /* lora_new's */
    int lora_r;             /* their rank r, 0 without (lora_new sets it; the run state's LoRA buffers) */
    float *moe_src_grads;   /* training at ep > 1: each source rank's expert gradients apart (runtime/moe_ep.c);
                             * NULL until used, freed by model_free */
    size_t lora_width;      /* floats per row of an adapter's scratch: its widest output or input,
                             * max(D, F_local, H_local Dh) with adapters, else 0 (lora_new sets it) */
} Model;

/* One parameter tensor of this rank, as the spec table describes it (for gradients, the optimizer,
 * gradient-norm clipping and saving). */
typedef struct {
    char name[96];        /* HF name, layer index filled in */
    size_t offset;        /* elements from the start of the arena (params, grads and moments share it) */
    size_t numel;         /* this rank's shard */
    int layer;            /* the local layer it belongs to (0 .. L_local), -1: embedding and head */
    size_t layer_offset;  /* a layer tensor's place among its layer's packed tensors (model_layer_place) */
    int decay;            /* AdamW weight decay applies (matrices, not norms or biases) */
    int tp_replicated;    /* identical on every tp rank (norms) */
    int replicas;         /* tp ranks holding an identical copy: tp for norms, tp / Hkv for k/v when
                           * tp > Hkv, else 1. A gradient norm counts each copy 1 / replicas. */
    int norm_once;        /* 1 on exactly one holder of each global element (tp rank 0 of a replica
                           * group; 0 for a tied lm_head's copy on the last stage): count it in norms */
    int rows, cols;       /* local shape; cols 0 for 1-D */
    int row0, col0;       /* where this shard starts in the HF tensor (rows past rows_global: vocab padding) */
    int rows_global, cols_global; /* the HF tensor's shape (vocab unpadded); cols_global 0 for 1-D */
    int expert;           /* a routed expert's tensor: its global id; -1 otherwise */
    int ep_owner;         /* the ep rank holding it (0 but for experts at ep > 1) */
    int held;             /* this rank holds it (always, but model_param_infos_all's other ep ranks' experts:
                           * offset and layer_offset are then meaningless) */
} ParamInfo;

/* Fills infos (capacity max) in arena order; returns how many. A tied lm_head that aliases the
 * embedding on the same stage is listed once. */
int model_param_infos(const Model *m, ParamInfo *infos, int max);
/* The same list with every routed expert of the model (the ep ranks' blocks in order, those of other
 * ep ranks not held): what a checkpoint holds (saving, train/checkpoint.c). At ep 1 the same. */
int model_param_infos_all(const Model *m, ParamInfo *infos, int max);
/* Points a ModelWeights at another (fp32) arena with the parameter layout (gradients, Adam moments). */
void model_weights_place(const Model *m, float *arena, ModelWeights *w, LayerWeights *layers);
/* One layer's tensors packed in buf (elements of dt), in arena order (the order of model_param_infos
 * restricted to one layer: every layer the same); *n (may be NULL) = elements per layer. buf NULL:
 * only *n. ZeRO-2/3's per-layer buffers (train/optim.h). */
void model_layer_place(const Model *m, void *buf, DType dt, LayerWeights *lw, size_t *n);

/* Loads this rank's shard from an HF directory onto backend `be`, tensor by tensor, converted to
 * `dtype` as it is read (DTYPE_AUTO: model_dtype_auto, runtime/device.h, of the directory's
 * config.json): into the arena when it is host memory (the CPU), elsewhere through one tensor's
 * host buffer and to_device. Checks the layout against the config first (tp must divide heads,
 * pp <= layers, ...): a violation is one user_error on rank 0. The head is the directory's: a
 * *ForSequenceClassification directory has the score head, else the LM head. */
void model_load(Model *m, const char *dir, const Mesh *mesh, DType dtype, const Backend *be);
/* model_load with a score head whatever the directory: a causal-LM directory's lm_head is not read
 * and score.weight starts as normal(0, initializer_range) from `seed` (model.c score_init). */
void model_load_score(Model *m, const char *dir, const Mesh *mesh, uint64_t seed, DType dtype, const Backend *be);
/* Sizes a run state (inference activations, in m's backend memory) for batches of up to max_tokens
 * tokens, max_seq per sequence; run_state_free releases it. model_alloc_state sizes the model's own,
 * m->s. */
void run_state_init(RunState *s, const Model *m, int max_tokens, int max_seq);
void run_state_free(RunState *s);
void model_alloc_state(Model *m, int max_tokens, int max_seq);
void model_free(Model *m);
/* Prints the parameter/value table and arena sizes (rank 0). */
void model_print_summary(const Model *m);
/* Bytes one rank holds, by kind: what each command prints as its memory plan. */
typedef struct {
    double weights, master, grads, moments, acts, kv;
    int expert_zero;   /* training at ep > 1: the ZeRO stage, whose sharding of the experts (over edp) the plan names */
} MemPlan;
/* The plan of a model's rank before the command's own parts: weights, and the run state's
 * activations when allocated. */
MemPlan model_mem_plan(const Model *m);
/* Gathers every rank's plan over the mesh and prints one row per rank on the root (collective). */
void model_print_memory_plan(const Model *m, const MemPlan *p);

/* Paged KV cache of this rank: its pp stage's layers, its tp rank's kv heads. Blocks of `block`
 * token slots; sequences own blocks through block tables. generate/kv_cache.c manages the pool,
 * generate/engine.c the tables. */
typedef struct KVCache {
    const Backend *be;    /* whose memory k and v are */
    int block;            /* token slots per block */
    int n_blocks;         /* blocks in the pool (the same on every rank) */
    size_t layer_stride;  /* elements per layer: n_blocks * block * Hkv_local * Dh */
    DType dtype;          /* the elements' (Model.kv_dtype): fp32, or bf16 (2 bytes) */
    void *k, *v;          /* (L_local, n_blocks, Hkv_local, block, Dh) of dtype: head-major blocks (kv_paged) */
    int *free_ids;        /* (n_blocks) stack of free block ids */
    int n_free;
} KVCache;

/* One forward step over n_seqs sequences packed back to back. Host arrays, except the tables. */
typedef struct {
    int n_seqs;
    const int *tokens;     /* (N) new tokens, packed */
    const int *seq_start;  /* (n_seqs + 1) offsets into tokens */
    const int *pos0;       /* (n_seqs) position of each sequence's first new token; NULL = 0 */
    const int *tables;     /* (n_seqs, table_stride) block tables in the backend's memory (an engine
                            * uploads a step's tables at once); NULL = no cache: keys are this batch's tokens */
    int table_stride;
    const int *logit_rows; /* rows (packed index, ascending) whose logits are wanted; NULL = all N */
    int n_logit_rows;
    int n_micro;           /* pp > 1: split the sequences into this many pipelined micro-batches */
} Batch;

/* Every rank calls it; on the last pp stage it leaves s->logits (rows, V_local) filled, one row per
 * logit row in order (score head: (rows, 1) values). With a cache, the new tokens' k and v are
 * written into their slots first. s: the caller's run state (an engine's, or &m->s). The batch's
 * positions, tokens and logit rows go to the backend in one copy. */
void model_forward_batch(Model *m, RunState *s, KVCache *kv, const Batch *b);
/* Whole sequences from position 0, no cache, logits for every token, in m->s. */
void model_forward(Model *m, const int *tokens, const int *seq_start, int n_seqs);

/* ---- the pieces of the one forward (runtime/forward.c), shared by model_forward_batch and
 * training (train/grad.c), which keeps every layer's LayerActs ---------------------------------- */
/* The stage's input x (N, D): the vocab-parallel embedding lookup of b's tokens (N) (tp all-reduce)
 * on the first stage, else received from stage s-1. Sequence parallel (b->sp_full): x holds the
 * rows [sp_lo, sp_hi) only. */
void model_stage_input(const Model *m, const LayerBatch *b, const int *tokens, float *x);
/* Local layer l over b: reads a->x_in, writes the rest of a and x_out (N, D) (x_out may be x_in). */
void model_layer_forward(const Model *m, int l, const LayerBatch *b, const LayerActs *a, float *x_out);
/* The last stage's head on R rows: xb (R, D) = rmsnorm(x) * final_norm, then
 *   LM:    out (R, V_local) = xb lm_head^T, padded vocab columns -inf (vocab-parallel)
 *   score: out (R, 1) = xb score^T (replicated: the same on every tp rank)
 * sp: NULL, or a sequence-parallel batch of R rows, whose x holds its rows [sp_lo, sp_hi) only (xb
 * is still all R rows: the norm's rows are gathered before the matmul). */
void model_head(const Model *m, const LayerBatch *sp, float *out, float *xb, const float *x, int R);
/* A MoE layer's MLP block (runtime/moe.c): out (N, D) = the routed experts' weighted outputs (+ the
 * shared expert's), summed over tp (the same on every tp rank), from xb (N, D) = the rounded
 * rmsnorm(x_mid) * mlp_norm of every row; stats (2 E) NULL or LayerBatch.moe_stats. Host buffers
 * (the CPU backend). */
void moe_forward(const Model *m, int l, const float *xb, int N, float *out, double *stats);
/* A rank with no forward work left at ep > 1 (generate's, eval's, a rollout's dp ranks finishing at
 * different times) joins its ep group's MoE exchanges with 0 tokens until every rank of the group has
 * called it (runtime/moe_ep.c; no-op at ep 1 or dense). Call it before any other collective. */
void moe_drain(const Model *m);
/* At ep > 1: one forward pass's exchanges with 0 tokens (its stage's layers once), for a rank that
 * sits out a round its ep group runs (no-op at ep 1 or dense). */
void moe_idle_pass(const Model *m);
/* Before the optimizer step at ep > 1: each local expert's gradient += the pairwise tree over the
 * source ranks of their contributions (moe_ep_src_grads), which are zeroed (no-op otherwise). */
void moe_ep_fold_grads(const Model *m, ModelWeights *grads);
/* The bytes of those per-source buffers at ep > 1 in training (ep x the local experts' fp32 gradients); 0 else */
size_t moe_ep_src_bytes(const Model *m);
/* The tp sum of a row-parallel output or any partials that feed a logprob, value or loss: the
 * ranks' partials added by one fixed tree (comm_all_reduce_sum_fixed), the same bits at any batch. */
void model_tp_sum(const Model *m, float *buf, size_t n);

/* ---- ZeRO-3's sliced weights (runtime/shards.c; train/optim.h --zero 3: FSDP's full sharding, each
 * decoder layer a unit and every other tensor a unit of its own). Each dp rank keeps its 1/dp slice
 * of every unit, packed (a layer as model_layer_place packs it) and padded to a multiple of 16 dp
 * elements, exactly the optimizer's partition, which updates the slices in place. A unit's weights
 * exist whole only while used: inside a training step (model_shards_step) model_layer_weights
 * all-gathers layer l before its forward and again before its backward into one of two buffers,
 * with the next layer's gather started ahead (MPI_Iallgather), and model_end_weights gathers the
 * embedding for the stage's lookup and the head (final norm, lm_head or score) from the head's
 * forward to the end of its backward. Anything else that reads weights (eval, generation, saving)
 * runs between model_shards_gather_all and model_shards_release, which hold every unit whole (FSDP's
 * summon_full_params, verl's weight sync before a rollout): dp ranks may run different numbers of
 * eval batches or decode steps, which per-unit collectives could not allow. Collective over the dp
 * group. At ep > 1 a layer is two units: its non-expert tensors over dp (Sa per rank) and its routed
 * experts over the expert-data-parallel group (Sx per rank), each packed in arena order; layer l's
 * slice is the two back to back (S = Sa + Sx), and a gathered layer is unpacked into
 * model_layer_place's packing (the gathers are then synchronous: none is started ahead). ------------ */
typedef struct { size_t layer_off, part_off, n; int x; } ShardPart;   /* ep > 1: a layer tensor's place in its part (x 1: the experts') */
typedef struct {               /* an embedding or head tensor, sliced */
    size_t offset, n, S;       /* its arena offset, elements, elements per dp rank */
    size_t field;              /* offsetof(ModelWeights, ...) of its pointer */
    int head;                  /* 1: final norm, lm_head, score (the head); 0: the embedding */
    int tied;                  /* the embedding that is also this stage's lm_head (tied, one stage) */
    void *shard;               /* (S) this rank's slice */
    void *buf;                 /* (dp S) while whole, else NULL */
} ShardTensor;
typedef struct ModelShards {
    const Comm *dp;
    int L;                     /* local layers */
    size_t n, S;               /* a layer's elements (model_layer_place); per dp rank: n padded to 16 dp, / dp */
    DType dtype;               /* the weights' */
    void *shard;               /* (L, S) this rank's slice of each layer */
    void *slot[2];             /* (dp S) each: a layer gathered inside a step */
    int slot_layer[2];         /* the layer in each slot, -1 none */
    CommRequest pending;       /* a gather started ahead, into slot[pending_slot], of pending_layer */
    int pending_slot, pending_layer;
    void *full;                /* (L, dp S) every layer, between gather_all and release; NULL otherwise */
    ShardTensor *t;            /* (n_t) the embedding and head tensors of this stage */
    int n_t;
    int stepping;              /* 1 inside a training step */
    int arena_freed;           /* a device's parameter arena, freed whole once sliced */
    size_t stride;             /* a gathered layer's elements in slot / full: dp S (ep > 1: n) */
    const Comm *edp;           /* ep > 1: the experts' group (above); NULL otherwise */
    size_t Sa, Sx;             /* ep > 1: the two units' elements per rank */
    ShardPart *lt;             /* (n_lt) ep > 1: every layer's tensors, as layer 0's */
    int n_lt;
    void *stage;               /* (dp Sa + edp Sx) ep > 1: the two parts gathered, before unpacking */
    int last_slot;             /* the slot of the last layer used (ep > 1: the next gather takes the other) */
} ModelShards;
/* Slices m's weights over dp (collective): each rank keeps its slices (the model's backend memory,
 * as every buffer here), the parameter arena goes back to the OS (madvise; a device's is freed whole,
 * m->params then only names where tensors were), and every weight pointer is NULL until gathered. Call after the
 * optimizer has read what it needs of the weights (its fp32 master). */
void model_shard_weights(Model *m, const Comm *dp);
/* Layer l's weights whole in m->w.layers[l] (a no-op without ZeRO-3 or while gathered): inside a
 * step, gathers it unless a buffer holds it, then starts gathering `next` (-1: none) into the other. */
void model_layer_weights(Model *m, int l, int next);
/* Inside a step: the embedding (head 0) or the head (head 1) whole (on) or back to slices (off); a
 * tied embedding that is this stage's lm_head goes with the head. No-op without ZeRO-3 or while
 * gathered. */
void model_end_weights(Model *m, int head, int on);
void model_shards_step(Model *m, int on);   /* entering (1) / leaving (0) a training step */
void model_shards_gather_all(Model *m);     /* every weight whole (collective); idempotent */
void model_shards_release(Model *m);        /* back to the slices only */
/* ZeRO-3: where the slice of local layer `layer` (>= 0; ep > 1: its experts' unit when experts) or of
 * the non-layer tensor at arena offset `offset` (layer -1) starts; NULL when m is not sliced */
void *model_shard_slice(const Model *m, int layer, size_t offset, int experts);
/* where tensor `in`'s data is (ZeRO-3: gathered): what saving reads */
const void *model_tensor_data(const Model *m, const ParamInfo *in);

/* ---- vocab-parallel log-softmax over a logits buffer (N, V_local) of the last stage; every rank of
 * the last stage calls them (collectives over tp). The full vocab is never gathered. Every array is
 * the backend's memory but `row`, a host array. --------------------------------------------------- */
/* THE logprobs of targets, what training, the PPO reference, DPO's reference pass and eval read:
 * out (host, n_pairs)[i] = logits[row[i], targets[i]] / T - lse[row[i]] (row NULL: row i, and
 * n_pairs == N), 0 where targets[i] < 0. targets and row are host arrays; the lse of the N rows
 * (model_logits_lse) is left in w->lse, and the pairs go w->rows at a time (model_pair_logprobs),
 * through w's buffers only: nothing is allocated. */
void model_target_logprobs(const Model *m, const LogprobBufs *w, const float *logits, int N, int n_pairs,
                           const int *row, const int *targets, float T, float *out);
/* lse (N): log-sum-exp of logits / T over the full vocab; sum (N) is scratch */
void model_logits_lse(const Model *m, const float *logits, int N, float T, float *lse, float *sum);
/* lp[i] = logits[row[i], tok[i]] / T - lse[row[i]] for i < n_pairs (tok -1: 0 - lse; row NULL:
 * row[i] = i, one kernel call; else two per pair). The one logprob formula of generation, eval and
 * training. pick (n_pairs) is scratch. */
void model_pair_logprobs(const Model *m, const float *logits, const float *lse, int n_pairs, const int *row,
                         const int *tok, float T, float *pick, float *lp);
void model_argmax(const Model *m, const float *logits, int N, int *ids, float *vals);   /* ids, vals (N) */

/* What eval and scoring need from one forward, on EVERY rank (the last stage computes, then
 * broadcasts over the pp group). Arrays are caller-allocated, on the host, as model_score's inputs;
 * its temporaries are the run state's (m->s.lp). */
typedef struct {
    float *lse;           /* (N) log-sum-exp of each position's logits */
    int *argmax;          /* (N) greedy next token after each position */
    float *argmax_logprob;/* (N) its logprob */
    float *pair_logprob;  /* (n_pairs) logprob of tok[i] at position row[i] (row NULL: i), 0 where tok[i] < 0 */
} Scores;
void model_score(Model *m, const int *tokens, const int *seq_start, int n_seqs, int n_pairs, const int *row,
                 const int *tok, Scores *out);
#endif
