/* grad.h — training on the one forward: the activations the backward needs (TrainActs, one arena
 * sized up front), train_forward (runtime/forward.c's forward with every layer's activations kept),
 * the loss hook, and train_loss_backward (the hook, then the backward through the head, every layer
 * in reverse and the embedding, accumulating parameter gradients). Tensor parallel uses Megatron's
 * conjugate collectives (see grad.c); pipeline parallel moves x forward and dx backward between
 * neighbouring stages.
 * Does not own: the optimizer, gradient clipping, data-parallel gradient reduction, micro-batch
 * schedules (1F1B), nor zeroing the gradient arena (the caller does, once per step).
 * Batch: whole sequences from position 0, packed back to back exactly as model_forward takes them:
 * tokens (N), seq_start (n_seqs + 1); positions restart per sequence; attention never crosses
 * sequences; no KV cache. Shapes: N D F H Hkv Dh V, `_local` = this TP rank's share.
 * Memory: TrainActs' buffers and the gradients are the model's backend's (Model.be); a MicroBatch
 * and the hook's arguments are host memory. Per micro-batch the ids go up in two copies (tokens +
 * positions; targets), the hook's N outputs come down and its N gradients go up. The tp / pp
 * collectives (runtime/comm.c) take the backend's buffers as they are: over the device's own link
 * (NCCL) or staged through host memory (runtime/comm_device.c), so a device trains at any tp, pp
 * and dp (tests/device_train.bats). */
#ifndef TANDEM_GRAD_H
#define TANDEM_GRAD_H
#include <stddef.h>
#include "generate/sampler.h"
#include "runtime/comm.h"
#include "runtime/model.h"

/* One micro-batch of a training step and its per-token context for the loss hook. */
typedef struct {
    const int *tokens;     /* (N) */
    const int *seq_start;  /* (n_seqs + 1) whole sequences packed back to back */
    int n_seqs;
    const int *targets;    /* (N) LM head: the token whose logprob each position gives (the next one
                            * for SFT), -1 = none there; unused by a score head (a value everywhere) */
    const float *weight;   /* (N) per-position weight (SFT: 1 / loss tokens of the whole step); may be NULL */
    const void *ctx;       /* anything else the hook needs for this micro-batch (advantages, old
                            * logprobs, masks, pair indices, ...) */
} MicroBatch;

/* The loss hook. The step gives the last stage's per-token outputs of one micro-batch:
 *     out (N) = LM head:    logprob of targets[n] under softmax(logits / temperature) (the formula
 *                           generation uses: runtime/forward.c model_pair_logprobs); 0 where
 *                           targets[n] < 0
 *               score head: the value at each position (score.weight . final-normed hidden)
 * and the hook returns the micro-batch's loss and writes dout (N) = d loss / d out (0 where the
 * loss does not depend on out[n]). Called on the last pp stage only, identically on every tp rank.
 * The step backpropagates dout; nothing else about the loss is known to it. */
typedef double (*LossFn)(const MicroBatch *mb, int N, const float *out, float *dout, void *user);
typedef struct {
    LossFn fn;
    void *user;            /* the hook's own state (e.g. accumulated metrics) */
    float temperature;     /* LM head: logits are divided by it (1: the raw distribution) */
    /* LM head, optional: an entropy bonus, added by the step itself (the hook sees only the targets'
     * logprobs): loss -= entropy_coef * sum_n weight[n] H_n over positions with a target, H_n the
     * entropy of softmax(logits_n / temperature), with its gradient through every logit. entropy
     * (double[2], may be NULL): += the sum of those H_n and their count (a metric; computed even
     * when entropy_coef is 0). */
    float entropy_coef;
    double *entropy;
    /* LM head, optional (NULL: the full softmax): PPO's truncated policy. Before the log-softmax, each
     * row with a target keeps only sampler_truncate's kept set under these params (the rest -inf),
     * the set the rollout sampled from, recomputed from the same logits (a constant of the
     * gradient): out is then the kept set's renormalised logprob, the backward's softmax is the
     * truncated one, and so is the entropy above. Costs one gather of each such row over tp to the
     * host and one upload of its shard: O(N V) host work per micro-batch. */
    const SamplingParams *truncate;
} LossHook;
/* SFT's cross-entropy as a hook: loss = -sum_n weight[n] * out[n] over targets >= 0, temperature 1 */
double loss_xent(const MicroBatch *mb, int N, const float *out, float *dout, void *user);
extern const LossHook LOSS_XENT;

/* Where the backward puts the parameter gradients: it adds (+=) into w's tensors (a ModelWeights
 * placed over a gradient arena by model_weights_place, or ZeRO-2's unit buffers). layer_done (may be
 * NULL): called after each local layer's backward of every micro-batch, with that layer's gradient
 * complete in w.layers[l] (ZeRO-2 reduce-scatters and empties it there: train/learner.c). */
typedef struct GradSink {
    ModelWeights w;            /* a NULL tensor is frozen: its gradient is not computed (LoRA's base) */
    float *lora;               /* with LoRA adapters (m->lora): their gradients, laid out as m->lora->arena */
    void (*layer_done)(struct GradSink *g, int l);
    void *ctx;
} GradSink;

typedef struct {
    int max_tokens, max_seq;   /* capacity: tokens per batch, tokens per sequence */
    int N, n_seqs;             /* the batch of the last train_forward */
    int recompute;             /* 1: keep only each layer's input; backward re-runs the layer first */
    /* sequence parallelism (tp > 1): x_in, xb1, x_mid, xb2 of every layer and x_final hold this tp
     * rank's rows [lb.sp_lo, lb.sp_hi) only; the backward gathers them into sp_x / sp_xb (N, D) where
     * it needs every row, so it runs on the very values of the run without it (the same bits) */
    int sp;
    float *sp_x, *sp_xb;       /* (N, D) each with sp, else NULL; sp_xb is lb.sp_full */
    /* BF16 weights without recompute: the four matmul inputs of each layer (xb1, att, xb2, act: bf16
     * values, runtime/forward.c) are kept packed as bf16, half the bytes; one fp32 set (layer 0's
     * LayerActs pointers, shared by every layer) is where the forward writes them and the backward
     * unpacks them. NULL otherwise. */
    uint16_t **packed;         /* (L_local * 4): layer l's xb1, att, xb2, act, (N, width) each */
    const Backend *be;         /* the model's: every buffer below is its memory unless it says host */
    int *ids;                  /* (3 * max_tokens) the batch's tokens (N), positions (N) and targets (N),
                                * packed from the front: train_forward uploads the first two in one
                                * copy, train_outputs the targets */
    int *tokens, *pos, *targets;/* (N) each, views into ids for the batch of the last train_forward */
    int *ids_host;             /* (2 * max_tokens) host: tokens and positions, staged for their upload */
    int *pos_host;             /* (N) host: the positions (a view into ids_host) */
    int *seq_start;            /* (max_tokens + 1) host: the batch's sequence starts */
    LayerActs *layers;         /* (L_local) */
    float *x_final;            /* (N, D) last stage: residual after the last layer */
    float *xb_final;           /* (N, D) last stage: final-normed, input of lm_head */
    float *logits;             /* (N, V_local) last stage, LM head (padded vocab columns -inf); score head (N, 1) */
    /* backward scratch, written before it is read */
    float *dx;                 /* (N, D) gradient of the residual stream */
    float *dxb, *dtmp;         /* (N, D) gradient at a norm's output; a second input gradient */
    float *dq, *datt;          /* (N, H_local*Dh) */
    float *dk, *dv;            /* (N, Hkv_local*Dh) */
    float *dgate, *dup, *dact; /* (N, F_local) */
    float *dqk_norm;           /* qwen3: (2 Dh) this rank's partial gradients of q_norm then k_norm; else empty */
    float *dlogits;            /* (N, V_local) last stage: the logits buffer, overwritten by the backward */
    float *out, *dout;         /* (N) the hook's per-token outputs (logprobs or values) and their gradient */
    float *ent, *dent;         /* (N) LM head with an entropy term: each row's entropy, d loss / d it */
    float *host_out, *host_dout; /* (N) host: copies the hook reads and writes (to_host / to_device) */
    float *lse, *pick;         /* (N) log-sum-exp of each row (LM), target logits (scratch) */
    float *rope;               /* (N, Dh) cos then sin of each token's RoPE angles, made by train_forward */
    float *scratch;            /* attention: omp threads * scratch_stride */
    size_t scratch_stride;     /* per thread: max(2, local heads) * max_seq (forward: heads x keys, backward: 2 x keys) */
    float *arena;              /* every float buffer above (the packed bf16 copies too) */
    size_t n_arena;            /* floats in it */
    int *iarena;               /* host: seq_start, ids_host */
    LayerBatch lb;             /* the batch as model_layer_forward sees it */
    /* tp > Hkv: the tp ranks that hold the same (replicated) kv head; size 1 otherwise */
    Comm kv_comm;
    int kv_rep;                /* tp ranks per kv head (1 when tp <= Hkv) */
    /* tied embeddings with pp > 1: first and last stage (the two copies of the embedding); else size 1 */
    Comm emb_comm;
    CommRequest send_req;      /* the pending pipeline send of this slot (x forward or dx backward) */
    /* with LoRA adapters (m->lora), one more arena: each layer's lora_u (LORA_TARGETS, N, r), and
     * lora_tmp (N, m->lora_width), lora_du (N, r), lora_dx (N, m->lora_width) scratch */
    float *lora_arena, *lora_tmp, *lora_du, *lora_dx;
    uint64_t lora_key;         /* LoRA dropout's key of this slot's micro-batch (lora_micro_key; 0: none) */
    /* MoE, optional (moe_aux_coef 0: none): HF's load-balancing loss (transformers'
     * load_balancing_loss_func) of each micro-batch, times moe_aux_coef, added to the hook's loss:
     * aux = E sum_e f_e P_e, f_e the share of the micro-batch's (token, choice) pairs routed to e over
     * every layer (HF's tokens_per_expert summed over the k choices), P_e the mean routing probability
     * of e over every layer and token; its gradient reaches each router through P (f is a count: a
     * constant). pp 1 only (every layer's routing on one stage). learner_step sets the coefficient:
     * router_aux_loss_coef / the step's micro-batches when config.json says output_router_logits (an
     * LM head), so the step's loss is the CE mean + coef x the micro-batches' mean aux: HF's loss
     * for one micro-batch. moe_stats: the micro-batch's routing statistics (LayerBatch.moe_stats;
     * host, 2 E); moe_aux_dp: d (coef aux) / d p_e (host, E; the same for every layer and token);
     * moe_aux_sum: the aux losses (unscaled) of this slot's micro-batches since the caller zeroed it */
    float moe_aux_coef;
    double *moe_stats;
    double *moe_load;          /* MoE (host, 2 E): += each expert's choices, then its summed routing
                                * probability, in the local layers of every train_forward (the step's
                                * routing statistics; the caller zeroes it) */
    float *moe_aux_dp;
    double moe_aux_sum;
    /* MoE, optional (0: none): the router z-loss (ST-MoE, Zoph et al. 2022; Megatron-Core's
     * --moe-z-loss-coeff): moe_z_coef x mean over the micro-batch's tokens of logsumexp(router
     * logits)^2, for each local MoE layer, its gradient into the routers (train/moe_grad.c), not in
     * the hook's loss; learner_step sets the coefficient (--moe-z-loss-coef / the step's
     * micro-batches, as Megatron scales it). moe_z_sum: += each local layer's unscaled mean in the
     * backward of every micro-batch since the caller zeroed it */
    float moe_z_coef;
    double moe_z_sum;
} TrainActs;

/* train_acts_init's flags: recompute each layer in the backward (keep only its input); sequence
 * parallelism (TrainActs.sp) */
enum { TRAIN_RECOMPUTE = 1, TRAIN_SEQ_PARALLEL = 2 };
/* Sizes the arena for batches of up to max_tokens tokens, max_seq per sequence, and prints its
 * MiB (world rank 0). Collective over the tp group when tp > Hkv (splits kv_comm). flags: TRAIN_*. */
void train_acts_init(TrainActs *a, const Model *m, int max_tokens, int max_seq, int flags);
void train_acts_free(TrainActs *a);

/* Forward of whole sequences from position 0; every rank of the mesh calls it. Keeps what backward
 * needs in a. The same functions as model_forward (runtime/forward.c), so on the last pp stage
 * a->logits (N, V_local) is bit-identical to s.logits after model_forward on the same input. A
 * batch larger than the capacity of a is a CHECK failure (the caller sized it). */
void train_forward(Model *m, TrainActs *a, const int *tokens, const int *seq_start, int n_seqs);

/* After train_forward, on the last stage: a->out (N) = the hook's per-token outputs (logprobs of
 * targets (host, N) at `temperature`, or values), copied to the host (a->host_out, 0 where
 * targets[n] < 0); returns a->host_out (NULL on other stages). The hook is host code: this is its
 * one transfer in (the LM head's targets go to a->targets first). */
const float *train_outputs(Model *m, TrainActs *a, const int *targets, float temperature);

/* The hook and the backward of the batch of the last train_forward; every rank calls it.
 * Returns the hook's loss on the last pp stage, 0 on the others: train_loss_share gives the
 * step's total to every rank once per step, not per micro-batch.
 * Gradients ACCUMULATE (+=) into grads->w (zeroed by the caller), with grads->layer_done after
 * each layer. Replicated parameters (norms; k/v of a replicated kv head;
 * the score head) end with identical gradients on every tp rank that holds them. A tied lm_head on
 * one stage is the embedding: both uses add into the same gradient. A tied lm_head on another pp
 * stage gets only its own use: the caller sums the two once per step with
 * train_tied_embedding_all_reduce. */
float train_loss_backward(Model *m, TrainActs *a, const MicroBatch *mb, const LossHook *hook, GradSink *grads);

/* A MoE layer's MLP block backward (train/moe_grad.c): from dout (N, D), the gradient of the block's
 * output (the same on every tp rank), and xb (N, D) its input, dxb (N, D) = this tp rank's partial of
 * d xb (the caller sums it over tp) and the block's weight gradients added into g (a NULL tensor:
 * frozen). Reruns the block's forward (the same bits). Host buffers (the CPU backend). */
void moe_backward(const Model *m, int l, const float *xb, int N, const float *dout, float *dxb, LayerWeights *g,
                  const float *aux_dp, float z_coef, double *z_sum);
/* aux_dp (E): NULL, or the load-balancing loss's d loss / d p_e added for every token (TrainActs.moe_aux_coef).
 * z_coef: the router z-loss's coefficient (TrainActs.moe_z_coef; 0: none): adds z_coef x mean over
 * the N tokens of logsumexp(router logits)^2 to the loss's gradient, and that mean (unscaled) to *z_sum. */

/* Forward only (after train_forward): the summed cross-entropy of every position with a target
 * (>= 0), unweighted, on the last stage (0 elsewhere: the caller shares a total once). */
double train_eval_loss_sum(Model *m, TrainActs *a, const int *targets);
/* Waits for this slot's pending pipeline send (call before freeing or at the end of a step). */
void train_acts_wait(TrainActs *a);
/* The last stage's loss to every rank of the pp group (once per step, not per micro-batch). */
float train_loss_share(const Model *m, float loss);
/* Tied embeddings on a pp > 1 mesh: the first stage's embed and the last stage's lm_head are two
 * copies of one parameter, each with the gradient of one use. Sums them (all-reduce between the
 * two stages, Megatron's embedding group) so both hold the full gradient and stay identical after
 * the optimizer. Call once per step, after the last micro-batch's backward; every rank calls it
 * (a no-op where there is nothing to sum: untied, pp == 1, or a middle stage). */
void train_tied_embedding_all_reduce(const Model *m, TrainActs *a, ModelWeights *grads);
#endif
