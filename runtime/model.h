/* model.h — a LLaMA-family model on a TP x PP mesh: the parameter spec table, this rank's shard
 * of the weights (one arena), the activation arena, and the forward pass over a packed batch.
 * Owns: sharding rules (ARCHITECTURE.md table), loading from an HF directory, forward, and the
 * vocab-parallel log-softmax helpers. Does not own: sampling, KV cache, training, I/O formats.
 * Shapes: N tokens packed over sequences, D, F, H, Hkv, Dh, V; `_local` = this TP rank's share. */
#ifndef TANDEM_MODEL_H
#define TANDEM_MODEL_H
#include <stddef.h>
#include "runtime/config.h"
#include "runtime/mesh.h"

typedef struct {
    float *attn_norm;  /* (D) */
    float *wq;         /* (H_local*Dh, D)    column-parallel by query heads */
    float *bq;         /* (H_local*Dh)       qwen2 / attention_bias, else NULL */
    float *wk;         /* (Hkv_local*Dh, D)  column-parallel by kv heads (replicated if tp > Hkv) */
    float *bk;         /* (Hkv_local*Dh) */
    float *wv;         /* (Hkv_local*Dh, D) */
    float *bv;         /* (Hkv_local*Dh) */
    float *wo;         /* (D, H_local*Dh)    row-parallel: partial sums, all-reduced over tp */
    float *mlp_norm;   /* (D) */
    float *w_gate;     /* (F_local, D)       column-parallel */
    float *w_up;       /* (F_local, D)       column-parallel, split separately from gate */
    float *w_down;     /* (D, F_local)       row-parallel */
} LayerWeights;

typedef struct {
    float *embed;      /* (V_local, D) vocab rows [vocab_start, +V_local); first stage */
    float *final_norm; /* (D) last stage */
    float *lm_head;    /* (V_local, D) last stage; same pointer as embed when tied and pp == 1 */
    LayerWeights *layers; /* (L_local) this stage's layers */
} ModelWeights;

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
    float *logits; /* (N, V_local) last stage; padded vocab columns are -inf */
    float *scratch;/* (threads, heads, max_seq) attention scores */
    float *rope;   /* (N, Dh) cos then sin of each token's RoPE angles (cpu_rope_table) */
    int *pos;      /* (N) position of each token in its sequence */
} RunState;

typedef struct {
    ModelConfig cfg;
    const Mesh *mesh;
    int n_heads_local, n_heads_kv_local, hidden_local;  /* H_local, Hkv_local, F_local */
    int vocab_padded, vocab_local, vocab_start;          /* V rounded up to tp; this rank's rows */
    int layer_start, n_layers_local;                     /* this pp stage's layers */
    int is_first, is_last;                               /* pp stage owns embedding / head */
    ModelWeights w;
    float *params;        /* the parameter arena */
    size_t n_params;      /* floats in it */
    float *inv_freq;      /* (Dh/2) RoPE inverse frequencies, scaling applied */
    RunState s;
    float *acts;          /* the activation arena */
    size_t n_acts;
    int max_tokens, max_seq;
} Model;

/* One parameter tensor of this rank, as the spec table describes it (for gradients, the optimizer,
 * gradient-norm clipping and saving). */
typedef struct {
    char name[96];        /* HF name, layer index filled in */
    size_t offset;        /* floats from the start of the arena (params, grads and moments share it) */
    size_t numel;         /* this rank's shard */
    int decay;            /* AdamW weight decay applies (matrices, not norms or biases) */
    int tp_replicated;    /* identical on every tp rank (norms) */
    int replicas;         /* tp ranks holding an identical copy: tp for norms, tp / Hkv for k/v when
                           * tp > Hkv, else 1. A gradient norm counts each copy 1 / replicas. */
    int norm_once;        /* 1 on exactly one holder of each global element (tp rank 0 of a replica
                           * group; 0 for a tied lm_head's copy on the last stage): count it in norms */
    int rows, cols;       /* local shape; cols 0 for 1-D */
    int row0, col0;       /* where this shard starts in the HF tensor (rows past rows_global: vocab padding) */
    int rows_global, cols_global; /* the HF tensor's shape (vocab unpadded); cols_global 0 for 1-D */
} ParamInfo;

/* Fills infos (capacity max) in arena order; returns how many. A tied lm_head that aliases the
 * embedding on the same stage is listed once. */
int model_param_infos(const Model *m, ParamInfo *infos, int max);
/* Points a ModelWeights at another arena with the parameter layout (gradients, Adam moments). */
void model_weights_place(const Model *m, float *arena, ModelWeights *w, LayerWeights *layers);

/* Loads this rank's shard from an HF directory. Checks the layout against the config first
 * (tp must divide heads, pp <= layers, ...): a violation is one user_error on rank 0. */
void model_load(Model *m, const char *dir, const Mesh *mesh);
/* Sizes the activation arena for batches of up to max_tokens tokens, max_seq per sequence. */
void model_alloc_state(Model *m, int max_tokens, int max_seq);
void model_free(Model *m);
/* Prints the parameter/value table and arena sizes (rank 0). */
void model_print_summary(const Model *m);

/* Paged KV cache of this rank: its pp stage's layers, its tp rank's kv heads. Blocks of `block`
 * token slots; sequences own blocks through block tables (generate/ manages them). */
typedef struct {
    int block;            /* token slots per block */
    int n_blocks;         /* blocks in the pool (the same on every rank) */
    size_t layer_stride;  /* floats per layer: n_blocks * block * Hkv_local * Dh */
    float *k, *v;         /* (L_local, n_blocks, Hkv_local, block, Dh): head-major blocks (kv_paged) */
    int *free_ids;        /* (n_blocks) stack of free block ids */
    int n_free;
} KVCache;

/* Sizes the pool from a byte budget per rank; n_blocks is the minimum over all ranks so every
 * rank's scheduler makes the same decisions. user_error if not even one block fits. */
void kv_init(KVCache *kv, const Model *m, size_t bytes, int block);
void kv_free(KVCache *kv);
int kv_block_alloc(KVCache *kv);             /* a free block id, or -1 */
void kv_block_release(KVCache *kv, int id);

/* One forward step over n_seqs sequences packed back to back. */
typedef struct {
    int n_seqs;
    const int *tokens;     /* (N) new tokens, packed */
    const int *seq_start;  /* (n_seqs + 1) offsets into tokens */
    const int *pos0;       /* (n_seqs) position of each sequence's first new token; NULL = 0 */
    int *const *tables;    /* (n_seqs) block tables; NULL = no cache: keys are this batch's tokens */
    const int *logit_rows; /* rows (packed index, ascending) whose logits are wanted; NULL = all N */
    int n_logit_rows;
    int n_micro;           /* pp > 1: split the sequences into this many pipelined micro-batches */
} Batch;

/* Every rank calls it; on the last pp stage it leaves s.logits (rows, V_local) filled, one row per
 * logit row in order. With a cache, the new tokens' k and v are written into their slots first. */
void model_forward_batch(Model *m, KVCache *kv, const Batch *b);
/* The last stage's head on R rows: xb (R, D) = rmsnorm(x) * final_norm, logits (R, V_local) =
 * xb lm_head^T, padded vocab columns -inf. Shared by inference and training (same bits). */
void model_head(const Model *m, float *logits, float *xb, const float *x, int R);
/* Whole sequences from position 0, no cache, logits for every token. */
void model_forward(Model *m, const int *tokens, const int *seq_start, int n_seqs);

/* Vocab-parallel helpers over s.logits on the last stage (collectives on the tp group; call on
 * every rank of the last stage). The full vocab is never gathered. */
void model_logsumexp(Model *m, int N, float *lse);                      /* lse (N) */
/* The same for any logits buffer (N, V_local) laid out like s.logits (training keeps its own). */
void model_logits_lse(const Model *m, const float *logits, int N, float *lse);
/* out[i] = logit of token tok[i] at packed position row[i], for i < n_pairs */
void model_token_logits(Model *m, int n_pairs, const int *row, const int *tok, float *out);
void model_argmax(Model *m, int N, int *ids, float *vals);              /* ids, vals (N) */

/* What eval and scoring need from one forward, on EVERY rank (the last stage computes, then
 * broadcasts over the pp group). Arrays are caller-allocated. */
typedef struct {
    float *lse;           /* (N) log-sum-exp of each position's logits */
    int *argmax;          /* (N) greedy next token after each position */
    float *argmax_logprob;/* (N) its logprob */
    float *pair_logprob;  /* (n_pairs) logprob of tok[i] at position row[i] */
} Scores;
void model_score(Model *m, const int *tokens, const int *seq_start, int n_seqs, int n_pairs, const int *row,
                 const int *tok, Scores *out);
#endif
