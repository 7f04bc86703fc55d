/* optim.h — the optimizer of one rank: AdamW with torch.optim.AdamW's arithmetic, global
 * gradient-norm clipping over the whole mesh (torch.nn.utils.clip_grad_norm_), the learning-rate
 * schedule, and the data-parallel gradient reduction and state partition (OptimUnit):
 *   plain   all-reduce (a fixed-tree reduce-scatter, then an all-gather); every dp rank holds the full
 *           moments and updates every param;
 *   ZeRO-1  Megatron's distributed optimizer: one reduce-scatter of the flat arena per step, each dp
 *           rank owns the moments (and master) of 1/dp of it, updates those params, all-gather;
 *   ZeRO-2  DeepSpeed's stage 2: the gradients are partitioned too. Each layer's gradient is
 *           reduce-scattered right after that layer's backward of every micro-batch, from one
 *           buffer the layers share, and its owner adds its slice into a 1/dp accumulator; the
 *           embedding and head keep whole buffers over the step (reduced once, after the tied
 *           embedding's cross-stage sum). Each layer is split over dp on its own (FSDP's units);
 *   ZeRO-3  and the weights too (FSDP's full sharding): the optimizer updates each rank's slices of
 *           the weights in place (runtime/model.h model_shard_weights) and nothing is gathered after
 *           the step; the forward and backward gather a unit where it is used.
 * What it trains is an OptimSet: the model's own weights (optim_new), or LoRA's adapters beside the
 * frozen weights (runtime/lora.h; their state sharded as ZeRO-1 under ZeRO-2/3).
 * Expert parallelism (--ep > 1, runtime/mesh.h): the routed experts' gradients are reduced over the
 * expert-data-parallel group, the rest over dp, and ZeRO-1 shards the experts' state over that group
 * (train/optim_ep.c). ZeRO-2/3 with ep: each layer is two units, its non-expert tensors over dp,
 * reduce-scattered after the layer's backward as at ep 1, and its routed experts over the edp group,
 * whose buffer (its own, for the step) moe_ep_fold_grads fills with the step's folded sources at the
 * step's end (an expert's gradient is complete only then), reduced by optim_step; ZeRO-3 slices the
 * weights by the same units (runtime/shards.c).
 * Every dp sum adds the ranks by one fixed pairwise tree (comm_all_reduce_sum_fixed and
 * comm_reduce_scatter_sum_fixed), so the stages agree bit for bit at any dp whenever each rank's
 * step is one micro-batch. With M > 1 micro-batches ZeRO-2/3 sum each micro-batch over dp before
 * adding the micro-batches (as DeepSpeed's stage 2 does), plain and ZeRO-1 the other way round: the
 * layers' gradients then differ by fp32 rounding (tests/zero.bats measures it).
 * Reads (and writes, for tests) the per-rank state files of earlier builds' checkpoints;
 * checkpoints are written layout-free by train/optim_state.c.
 * Does not own: computing or accumulating gradients (train/grad.c), summing a tied embedding's two
 * copies across pp stages (train_tied_embedding_all_reduce, called before optim_step), the training
 * loop or its checkpoints of the weights themselves.
 *
 * Mixed precision (Megatron's --bf16, FSDP's MixedPrecision): with fp32 weights (Model.dtype F32)
 * the params are the master weights. With BF16 weights the optimizer keeps an fp32 master copy of
 * what it updates (all of it plain, 1/dp under ZeRO, sharded with the moments), AdamW updates the
 * master, and the bf16 weights are the master rounded to nearest even after every step; the saved
 * state holds the master with the moments, so a resume continues bit for bit.
 *
 * One step, in this order (optim_step):
 *   1. dp reduction: grads = mean over the dp group (sum, then / dp). Plain: every rank gets the
 *      whole arena. ZeRO: rank r holds slice r of each unit only.
 *   2. global norm of the reduced gradient: every element of the global model counted ONCE:
 *      sum of squares over what this rank holds, skipping copies (ParamInfo.norm_once), in
 *      double, all-reduced over tp and pp (and dp under ZeRO, where each rank holds 1/dp).
 *   3. clip: scale = min(1, clip / (norm + 1e-6)) (torch: (1 / (norm + 1e-6)) * clip in fp32).
 *   4. AdamW on what this rank holds, lr from the schedule at the current step (BF16: on the
 *      master, then the bf16 weights = round(master)).
 *   5. ZeRO: all-gather of the updated slices (in the weights' dtype), so every dp rank again
 *      holds all its params.
 * Replicas (dp ranks; tp copies of norms and of replicated kv heads; a tied embedding's copy on the
 * last stage) see identical gradients and identical state, so they stay bit-identical.
 *
 * Memory: the gradient arena, the moments and the master are the model's backend's (Model.be);
 * AdamW, the norm's sums of squares and the master's rounding run as its entries (adamw,
 * sum_squares, pack: kernels/cpu/cpu.h's contracts, torch's arithmetic), and a step moves one
 * double per piece to the host (the norm is summed there, in held order). The dp reduction and
 * ZeRO's gathers and scatters take the backend's buffers as they are (runtime/comm.c: a device's
 * over its link or staged through host memory), so every ZeRO stage runs on a device too.
 * optim_save / optim_load copy the state through a bounded host buffer.
 *
 * Arena layout: plain and ZeRO-1's grads use the parameter arena's layout (model_param_infos
 * offsets). The gradient arena passed to optim_step must hold optim_grad_floats(o) floats: the
 * parameter count rounded up to a multiple of 16 * dp (ZeRO-1 splits it into dp equal slices that
 * start on 64-byte boundaries; the tail is padding that optim_zero_grad keeps zero). The held arrays
 * (moments, master, slice) hold this rank's pieces (OptimPiece) one after another. */
#ifndef TANDEM_OPTIM_H
#define TANDEM_OPTIM_H
#include <stddef.h>
#include <stdint.h>
#include "runtime/mesh.h"
#include "runtime/model.h"

typedef enum { LR_COSINE = 0, LR_LINEAR, LR_CONSTANT } LrSchedule;
/* "cosine" | "linear" | "constant"; anything else is a user_error naming flag and name */
LrSchedule lr_schedule_parse(const char *flag, const char *name);

/* Scalars are double because torch computes them in Python floats: 1 - beta1 in double and then
 * rounded to fp32 differs from 1 - (float)beta1 (0.1f vs 0.100000024f). */
typedef struct {
    double lr;            /* peak learning rate, reached at step `warmup` */
    double min_lr;        /* floor of the cosine / linear decay (0 = HF's schedules) */
    int warmup;           /* steps of linear warmup from 0 */
    int total_steps;      /* steps over which the decay reaches min_lr; later steps stay there */
    LrSchedule schedule;
    double beta1, beta2, eps;
    double weight_decay;  /* decoupled (AdamW), on ParamInfo.decay tensors only */
    double clip;          /* max global gradient norm; 0 = no clipping (the norm is still returned) */
    int zero;             /* 0 = plain data parallel; 1 = ZeRO-1 (moments and master sharded over dp);
                             2 = ZeRO-2 (and the gradients: each layer's reduce-scattered after its backward);
                             3 = ZeRO-3 (and the weights: runtime/model.h model_shard_weights) */
} OptimConfig;

/* torch.optim.AdamW(betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1), warmup + cosine, clip 1. */
OptimConfig optim_config_default(void);

/* One run of consecutive arena floats [lo, hi) with the same treatment (one ParamInfo). */
typedef struct {
    size_t lo, hi;
    int decay;            /* weight decay applies */
    int in_norm;          /* counted in the global gradient norm on this rank */
    int layer;            /* ParamInfo.layer: the local layer, -1 embedding and head */
    int expert;           /* 1: a routed expert's tensor at ep > 1 (reduced over the edp group: train/optim_ep.c) */
} OptimRange;

/* A unit of the partition of the state over dp: whole tensors packed in arena order, n floats,
 * padded to a multiple of 16 dp; dp rank r holds its packed floats [r S, (r + 1) S), at held offset
 * `held` of every held array. Plain: one unit of every tensor, not split (S = n = n_params). ZeRO-1:
 * one unit of every tensor (packed = the arena). ZeRO-2: each local layer a unit (packed as
 * model_layer_place packs a layer: every layer alike), and each other tensor a unit of its own.
 * ZeRO-1 at ep > 1: two units, the tensors but the routed experts' split over dp, the experts'
 * split over the edp group (the dp / ep ranks holding the same experts: edp rank j holds [j S, ...)).
 * ZeRO-2/3 at ep > 1: two units per layer, its non-expert tensors (kind 1) and its routed experts
 * (kind 2, split over the edp group, with a gradient buffer of its own). */
typedef struct {
    int layer;            /* the local layer, -1 for a unit of one non-layer tensor */
    int t0;               /* non-layer: its tensor (ranges index); layer: -1 */
    size_t n, S, held;
    int kind;             /* 0: any tensor; ZeRO-1/2 at ep > 1: 1 the non-expert tensors, 2 the experts' */
} OptimUnit;

/* This rank's part of one tensor: arena floats [lo, hi) of ranges[t], held at offset held. */
typedef struct {
    size_t lo, hi, held;
    int t, u;             /* its tensor (ranges) and unit (units) */
} OptimPiece;

typedef struct {
    OptimConfig cfg;
    const Mesh *mesh;
    const Backend *be;        /* the model's: the moments, the master and the norm's sums are its memory */
    int step;                 /* optimizer steps taken; the next step uses lr_schedule(cfg, step) */
    void *params;             /* the trained arena (OptimSet's): the model's weights, or LoRA's adapters */
    size_t n_params;          /* elements in it */
    size_t n_grad;            /* plain / ZeRO-1: n_params rounded up to a multiple of 16 * dp
                                 (optim_grad_floats); ZeRO-2: 0 (the gradients are the units' buffers) */
    size_t n_state;           /* floats this rank holds per moment: the sum of its units' S */
    DType dtype;              /* the model's weights' dtype */
    float *m, *v;             /* (n_state) Adam moments of the held floats; one backend block
                                 laid out as the file optim_save writes after its header: m, v[, master] */
    float *master;            /* (n_state) BF16 weights: the fp32 master of the held floats (0 in the
                                 padding); NULL for F32 weights (the params are the master) */
    float *slice;             /* (n_state) ZeRO-1/2: the dp-reduced gradient of the held
                                 floats (ZeRO-2: accumulated over the step's micro-batches); NULL plain */
    OptimRange *ranges;       /* (n_ranges) the parameter tensors in arena order */
    int n_ranges;
    OptimUnit *units;         /* (n_units) the partition */
    int n_units;
    OptimPiece *pieces;       /* (n_pieces) what this rank holds, in held order */
    int n_pieces;
    /* ZeRO-2 (CPU): each unit's gradient buffer, packed (units[u].S * dp floats): the layers share one
     * (the backward fills it one layer at a time, optim_reduce_unit empties it), every other unit has
     * its own (accumulated over the step, reduced once at its end); also the all-gather's buffers */
    float *ubuf;
    size_t *ubuf_off;         /* (n_units) offset of unit u's buffer in ubuf */
    size_t n_ubuf;
    float *rbuf;              /* (max S) ZeRO-2: one reduce-scatter's result, added into slice */
    float *epbuf;             /* (n_epbuf) host, ep > 1 plain / ZeRO-1: one kind's gradients (experts or
                                 not) packed for its reduction (optim_ep.c), made once here */
    size_t n_epbuf;
    double *sums;             /* (n_pieces) backend: each piece's sum of squares (Backend.sum_squares) */
    double *sums_host;        /* (n_pieces) host: the same, copied back once per step */
    double *partials;         /* (n_state / 65536 + 2) backend: sum_squares' chunk sums */
} Optim;

/* What an optimizer trains: tensors (their ParamInfo, arena order, tiling the arena) of an arena of
 * n_params elements of dtype in the model's backend. optim_new's is the model's own (its weights);
 * LoRA's (train/learner.c) is the adapters' arena beside the frozen weights. */
typedef struct {
    const ParamInfo *infos;
    int n_infos;
    void *params;
    size_t n_params;
    DType dtype;
} OptimSet;
Optim *optim_new_set(const Model *m, const OptimSet *set, const Mesh *mesh, OptimConfig cfg);

/* Allocates everything the steps need (optim_step allocates nothing); not collective. A bad
 * config value (lr < 0, beta outside [0, 1), warmup > total_steps, ...) is a user_error. */
Optim *optim_new(const Model *m, const Mesh *mesh, OptimConfig cfg);
void optim_free(Optim *o);
/* Prints the optimizer's settings and state MiB per rank (world rank 0). */
void optim_print_summary(const Optim *o);

size_t optim_grad_floats(const Optim *o);   /* floats the gradient arena must hold (0 under ZeRO-2) */
size_t optim_grad_bytes(const Optim *o);    /* the gradients' bytes per rank: arena (+ the reduced slice);
                                               ZeRO-2: the units' buffers + the reduced slice */
size_t optim_state_bytes(const Optim *o);   /* bytes of moments and master */
size_t optim_master_bytes(const Optim *o);  /* bytes of the fp32 master copy (0 for F32 weights) */
void optim_zero_grad(const Optim *o, float *grads);   /* zeroes grads (optim_grad_floats(o) floats; may
                                                         be NULL under ZeRO-2) and the ZeRO buffers */
/* ZeRO-2: where the backward adds the gradients. Unit u's buffer (units[u].S * dp floats, packed):
 * the layers' units share one, which the backward fills one layer at a time and optim_reduce_unit
 * empties; every other unit has its own for the whole step. optim_layer_unit: local layer l's unit. */
float *optim_unit_grads(const Optim *o, int u);
int optim_layer_unit(const Optim *o, int l);
/* ZeRO-2: where the gradient of local layer l's tensor at layer_off (its place in model_layer_place's
 * packing) lives: in the layer's unit's buffer, or at ep > 1 for a routed expert's in the layer's
 * experts' unit's */
float *optim_layer_tensor_grads(const Optim *o, int l, size_t layer_off);
/* dp rank r's piece of the tensor at arena offset `offset` (plain: rank 0's, the whole tensor):
 * 1 and *pc, or 0 when r holds none of it. */
int optim_piece(const Optim *o, int r, size_t offset, OptimPiece *pc);
/* ZeRO-2, collective over dp: reduce-scatters unit u's buffer by the fixed tree
 * (comm_reduce_scatter_sum_fixed), adds this rank's slice into o->slice and zeroes the buffer. Called
 * after each layer's backward of every micro-batch; optim_step does the other units. */
void optim_reduce_unit(Optim *o, int u);
double optim_lr(const Optim *o, int step);  /* lr_schedule(&o->cfg, step) */

/* One optimizer step on every rank of the mesh (collective). grads: this rank's gradient arena
 * (optim_grad_floats floats), summed over this rank's micro-batches, NOT yet reduced over dp, and
 * with a tied embedding's copies already summed across stages. Updates m->params in place.
 * Returns the global gradient norm before clipping, the same on every rank. Afterwards grads hold
 * scratch (dp-reduced values, or under ZeRO-1 the gathered params): zero them before accumulating
 * the next step. Increments o->step. When the norm is not finite (a NaN or inf gradient anywhere in
 * the mesh) nothing is updated (weights, moments, step) and that norm is returned. */
float optim_step(Optim *o, Model *m, float *grads);   /* grads NULL under ZeRO-2 */

/* The per-rank format of checkpoints before the layout-free one (train/optim_state.h): each rank's
 * arena slice of the state, which loads only at the layout that wrote it. learner_resume still reads
 * it there (optim_load); optim_save writes it for tests/test_optim.c only.
 * Writes this rank's moments and step (the rank's own file, e.g. optim.rank3.bin) atomically
 * (temp file + rename). Returns 0, or -1 if it cannot be written (errno says why). */
int optim_save(Optim *o, const char *path);
/* Reads what optim_save wrote. Returns 0, or -1 if the file cannot be opened (the caller decides:
 * other ranks may have found theirs). A file that is not ours, of another format version, of
 * another layout (tp/pp/dp/zero, rank) or another model, or truncated, is a rank_error naming the
 * file, the mismatch and what to run. */
int optim_load(Optim *o, const char *path);

/* ---- the pieces, on plain arrays (tested against torch by tests/test_optim.c, with the kernels
 * cpu_adamw and cpu_sum_squares of kernels/cpu/cpu.h) ------------------------------------------ */

/* Learning rate at step (0-based: the first optimizer step is step 0), lr_max = cfg->lr:
 *   step < W:          lr_max * step / W                            (linear warmup from 0)
 *   then p = min(1, (step - W) / max(1, T - W))  with T = total_steps, and
 *     LR_COSINE:       min_lr + (lr_max - min_lr) * 0.5 * (1 + cos(pi * p))
 *     LR_LINEAR:       min_lr + (lr_max - min_lr) * (T - step) / max(1, T - W)   (clamped at p = 1)
 *     LR_CONSTANT:     lr_max
 * With min_lr = 0 these are HF transformers' get_{cosine,linear,constant}_schedule_with_warmup
 * under torch's LambdaLR (the lr of optimizer step k is lambda(k), so step 0 has lr 0 when W > 0);
 * with min_lr > 0 the cosine is HF's get_cosine_with_min_lr_schedule_with_warmup (min_lr_rate =
 * min_lr / lr_max) and Megatron's. After T steps the lr stays at min_lr (HF's cosine would rise
 * again; its linear would stay at 0). */
double lr_schedule(const OptimConfig *cfg, int step);

/* clip_grad_norm_'s factor: min(1, (1 / (norm + 1e-6)) * max_norm) in fp32; 1 when max_norm <= 0. */
float clip_scale(float norm, double max_norm);

/* train/optim_ep.c, at ep > 1 (plain dp): the dp reduction of grads (experts over the edp group, the
 * rest over dp), and the norm's sum of squares in ep 1's order from this rank's pieces' sums (held
 * order) and the ep group's (collective over ep) */
void optim_ep_reduce(const Optim *o, float *grads);
/* ZeRO-1 at ep > 1: the two units' reduce-scatters into o->slice (the experts' over the edp group) */
void optim_ep_reduce_zero(const Optim *o, float *grads);
double optim_ep_sumsq(const Optim *o, const Model *m, const double *sums);
/* the floats of o->epbuf those two need (the larger kind or unit, padded); 0 at ep 1 and ZeRO-2/3 */
size_t optim_ep_buf_floats(const Optim *o);
#endif
