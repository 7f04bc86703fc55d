/* optim.c — see optim.h. The step is five visible phases (dp reduction, norm, clip factor, AdamW,
 * ZeRO-1 all-gather); the arithmetic is in lr_schedule and clip_scale here and the backend's adamw
 * and sum_squares entries (kernels/cpu/optim.c), which tests/test_optim.c checks against torch.
 *
 * ZeRO-1 (Megatron's distributed optimizer, without its bucketing): the flat gradient arena of
 * n_grad floats (n_params padded to a multiple of 16 * dp) is reduce-scattered over dp, so dp rank r
 * holds the dp-sum of arena floats [r * S, (r + 1) * S), S = n_grad / dp. It keeps Adam moments for
 * that slice only (S floats each instead of n_params), updates those params, and the dp group
 * all-gathers the updated slices. A slice boundary may cut a tensor: each tensor's part in the slice
 * is updated with that tensor's decay flag. The element-wise math is the same as plain data
 * parallel, so both modes give the same params whenever their dp sums agree (always for dp = 2,
 * where a + b is commutative; for dp > 2 MPI's all-reduce and reduce-scatter may add in different
 * orders, ~1 ulp on the averaged gradient). */
#include "train/optim.h"
#include "runtime/util.h"
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NORM_CHUNK 65536   /* floats per partial sum of the norm (Backend.sum_squares) */
#define BOUNCE (1u << 22)  /* floats per copy between the state and its file (16 MiB) */
#define ARENA_ALIGN 16     /* floats: ZeRO-1 slices start on 64-byte boundaries */

/* ---- the pieces on plain arrays -------------------------------------------------------------- */

double lr_schedule(const OptimConfig *c, int step) {
    if (step < c->warmup) return c->lr * ((double)step / (double)c->warmup);   /* HF: lr * lambda */
    int decay_steps = c->total_steps - c->warmup > 1 ? c->total_steps - c->warmup : 1;
    double progress = (double)(step - c->warmup) / (double)decay_steps;
    if (progress > 1.0) progress = 1.0;
    switch (c->schedule) {
    case LR_COSINE: return c->min_lr + (c->lr - c->min_lr) * (0.5 * (1.0 + cos(M_PI * progress)));
    case LR_LINEAR: {
        double left = (double)(c->total_steps - step) / (double)decay_steps;
        return c->min_lr + (c->lr - c->min_lr) * (left > 0.0 ? left : 0.0);
    }
    case LR_CONSTANT: return c->lr;
    }
    return c->lr;
}

float clip_scale(float norm, double max_norm) {
    if (max_norm <= 0.0) return 1.0f;
    /* torch: clamp(max_norm / (total_norm + 1e-6), max=1) with a 0-dim fp32 tensor; Tensor's
     * __rdiv__ is reciprocal() * max_norm */
    float coef = (1.0f / (norm + 1e-6f)) * (float)max_norm;
    return coef < 1.0f ? coef : 1.0f;
}

/* ---- setup ------------------------------------------------------------------------------------ */

LrSchedule lr_schedule_parse(const char *flag, const char *name) {
    if (!strcmp(name, "cosine")) return LR_COSINE;
    if (!strcmp(name, "linear")) return LR_LINEAR;
    if (!strcmp(name, "constant")) return LR_CONSTANT;
    user_error("%s %s: expected cosine, linear or constant", flag, name);
}

OptimConfig optim_config_default(void) {
    OptimConfig c = {0};
    c.lr = 1e-5;
    c.min_lr = 0.0;
    c.warmup = 0;
    c.total_steps = 1000;
    c.schedule = LR_COSINE;
    c.beta1 = 0.9;
    c.beta2 = 0.95;
    c.eps = 1e-8;
    c.weight_decay = 0.1;
    c.clip = 1.0;
    c.zero = 0;
    return c;
}

static void check_config(const OptimConfig *c) {
    if (!(c->lr >= 0.0)) user_error("optimizer: lr %g must be >= 0", c->lr);
    if (!(c->min_lr >= 0.0 && c->min_lr <= c->lr)) user_error("optimizer: min_lr %g must be in [0, lr = %g]", c->min_lr, c->lr);
    if (c->warmup < 0 || c->total_steps < 0) user_error("optimizer: warmup %d and total_steps %d must be >= 0", c->warmup, c->total_steps);
    if (c->warmup > c->total_steps)
        user_error("optimizer: warmup %d is longer than total_steps %d", c->warmup, c->total_steps);
    if (!(c->beta1 >= 0.0 && c->beta1 < 1.0) || !(c->beta2 >= 0.0 && c->beta2 < 1.0))
        user_error("optimizer: betas (%g, %g) must be in [0, 1)", c->beta1, c->beta2);
    if (!(c->eps > 0.0)) user_error("optimizer: eps %g must be > 0", c->eps);
    if (!(c->weight_decay >= 0.0)) user_error("optimizer: weight_decay %g must be >= 0", c->weight_decay);
    if (!(c->clip >= 0.0)) user_error("optimizer: clip %g must be >= 0 (0 = off)", c->clip);
    if (c->zero < 0 || c->zero > 3) user_error("optimizer: zero %d must be 0, 1, 2 or 3", c->zero);
    if (c->schedule != LR_COSINE && c->schedule != LR_LINEAR && c->schedule != LR_CONSTANT)
        user_error("optimizer: unknown lr schedule %d", (int)c->schedule);
}

/* The optimizer state file (optim_save), little-endian, and the head of Optim.state. */
#define OPTIM_MAGIC "TNDMOPTM"
#define OPTIM_VERSION 2u
typedef struct {
    char magic[8];                          /* OPTIM_MAGIC */
    uint32_t version;                       /* OPTIM_VERSION */
    uint16_t zero;                          /* 1: the moments are this dp rank's ZeRO-1 slice */
    uint16_t dtype;                         /* the weights' DType; BF16: the fp32 master follows v
                                             * (version 1 had uint32_t zero here: dtype reads 0, F32) */
    int32_t tp, pp, dp;                     /* the mesh that wrote it */
    int32_t tp_rank, pp_rank, dp_rank;      /* the rank that wrote it */
    int64_t step;                           /* optimizer steps taken */
    uint64_t n_params;                      /* floats in the rank's parameter arena */
    uint64_t n_state;                       /* floats per moment; then m (n_state), v (n_state), [master] */
} OptimHeader;
_Static_assert(sizeof(OptimHeader) == 64, "OptimHeader is the 64-byte file header");

/* fp32 sections after the header: m, v, and the master with BF16 weights */
static int optim_sections(const Optim *o) { return o->dtype == DTYPE_BF16 ? 3 : 2; }

/* the group a unit is split over: the experts' unit at ep > 1 over the edp group, the others over dp */
static const Comm *unit_comm(const Optim *o, const OptimUnit *un) {
    return un->kind == 2 ? &o->mesh->edp_comm : &o->mesh->dp_comm;
}

static int in_unit(const Optim *o, const OptimUnit *un, int t) {
    if (un->kind && o->ranges[t].expert != (un->kind == 2)) return 0;
    return un->t0 >= 0 ? t == un->t0 : un->layer < 0 || o->ranges[t].layer == un->layer;
}
/* dp rank r's pieces (of tensor `only`, or all when -1): each unit's tensors in packed order, cut to
 * [r S, (r + 1) S); at most one per tensor (a tensor is in one unit, a slice is one run of it) */
static int pieces_of(const Optim *o, int r, int only, OptimPiece *out) {
    int n = 0;
    for (int u = 0; u < o->n_units; u++) {
        const OptimUnit *un = &o->units[u];
        int ur = un->kind == 2 ? r / o->mesh->ep : r;   /* the experts' unit: dp rank r's edp rank */
        size_t at = 0, lo = (size_t)ur * un->S, hi = lo + un->S;   /* packed */
        for (int t = 0; t < o->n_ranges; t++) {
            const OptimRange *rg = &o->ranges[t];
            if (!in_unit(o, un, t)) continue;
            size_t len = rg->hi - rg->lo, a = at > lo ? at : lo, b = at + len < hi ? at + len : hi;
            if (a < b && (only < 0 || t == only))
                out[n++] = (OptimPiece){rg->lo + (a - at), rg->lo + (b - at), un->held + (a - lo), t, u};
            at += len;
        }
        CHECK(at == un->n);
    }
    return n;
}

int optim_piece(const Optim *o, int r, size_t offset, OptimPiece *pc) {
    for (int t = 0; t < o->n_ranges; t++)
        if (o->ranges[t].lo == offset) return pieces_of(o, o->cfg.zero ? r : 0, t, pc);
    return 0;
}

/* The partition (OptimUnit) and this rank's pieces of it. A unit's tensors in packed order: its
 * own for a non-layer unit, else the layer's in arena order (model_layer_place's order). */
static void build_partition(Optim *o) {
    const Mesh *mesh = o->mesh;
    int dp = o->cfg.zero ? mesh->dp : 1, L = 0;
    for (int t = 0; t < o->n_ranges; t++) if (o->ranges[t].layer + 1 > L) L = o->ranges[t].layer + 1;
    o->units = xcalloc(2 * (size_t)o->n_ranges + 1, sizeof(OptimUnit));
    o->n_units = 0;
    if (o->cfg.zero == 1 && mesh->ep > 1) {   /* the experts apart, over the edp group */
        size_t n[2] = {0, 0};
        for (int t = 0; t < o->n_ranges; t++) n[o->ranges[t].expert] += o->ranges[t].hi - o->ranges[t].lo;
        for (int k = 0; k < 2; k++) o->units[o->n_units++] = (OptimUnit){-1, -1, n[k], 0, 0, k + 1};
    } else if (o->cfg.zero < 2) {
        o->units[o->n_units++] = (OptimUnit){-1, -1, o->n_params, 0, 0, 0};
    } else {   /* in arena order of each unit's first tensor: the embedding, layers 0 .. L-1, the head; at
                * ep > 1 each layer two units: without its experts, and its experts (over the edp group,
                * reduced once the step's sources are folded; runtime/shards.c slices a layer so) */
        int ep = mesh->ep > 1;
        for (int t = 0; t < o->n_ranges; t++) {
            const OptimRange *rg = &o->ranges[t];
            if (rg->layer < 0) o->units[o->n_units++] = (OptimUnit){-1, t, rg->hi - rg->lo, 0, 0, 0};
            else if (t == 0 || o->ranges[t - 1].layer < 0) {   /* the first layer tensor: all the layers here */
                size_t n = 0, nx = 0;
                for (int k = 0; k < o->n_ranges; k++) {
                    size_t len = o->ranges[k].hi - o->ranges[k].lo;
                    if (ep && o->ranges[k].expert) nx += len;
                    else if (o->ranges[k].layer == 0) n += len;
                }
                for (int l = 0; l < L; l++) {
                    o->units[o->n_units++] = (OptimUnit){l, -1, n, 0, 0, ep};
                    if (ep) o->units[o->n_units++] = (OptimUnit){l, -1, nx / L, 0, 0, 2};
                }
            }
        }
    }
    size_t held = 0;
    for (int u = 0; u < o->n_units; u++) {
        OptimUnit *un = &o->units[u];
        size_t P = un->kind == 2 ? (size_t)mesh->edp : (size_t)dp, quantum = ARENA_ALIGN * P;
        un->S = o->cfg.zero ? (un->n + quantum - 1) / quantum * quantum / P : un->n;
        un->held = held;
        held += un->S;
    }
    o->n_state = held;
    o->pieces = xmalloc(sizeof(OptimPiece) * ((size_t)o->n_ranges + 1));
    o->n_pieces = pieces_of(o, o->cfg.zero ? mesh->dp_rank : 0, -1, o->pieces);
}

/* Where piece pc's params are: in the arena, or under ZeRO-3 (once the model is sliced) in its
 * unit's slice, packed as the unit is */
static void *piece_params(const Optim *o, const Model *m, const OptimPiece *pc) {
    const OptimUnit *un = &o->units[pc->u];
    size_t es = dtype_size(o->dtype);
    char *slice = o->params == m->params ? model_shard_slice(m, un->layer, un->t0 >= 0 ? o->ranges[un->t0].lo : 0, un->kind == 2) : NULL;
    if (slice) return slice + (pc->held - un->held) * es;
    return (char *)o->params + pc->lo * es;
}

Optim *optim_new(const Model *m, const Mesh *mesh, OptimConfig cfg) {
    int n = model_param_infos(m, NULL, 0);
    ParamInfo *infos = xmalloc(sizeof(ParamInfo) * n);
    model_param_infos(m, infos, n);
    OptimSet set = {infos, n, m->params, m->n_params, m->dtype};
    Optim *o = optim_new_set(m, &set, mesh, cfg);
    free(infos);
    return o;
}

Optim *optim_new_set(const Model *m, const OptimSet *set, const Mesh *mesh, OptimConfig cfg) {
    check_config(&cfg);
    const Backend *be = m->be;
    Optim *o = xcalloc(1, sizeof(Optim));
    o->cfg = cfg;
    o->mesh = mesh;
    o->be = be;
    o->params = set->params;
    o->n_params = set->n_params;
    o->dtype = set->dtype;

    int n_info = set->n_infos;
    const ParamInfo *infos = set->infos;
    o->ranges = xmalloc(sizeof(OptimRange) * n_info);
    o->n_ranges = n_info;
    size_t end = 0;
    for (int i = 0; i < n_info; i++) {
        CHECK(infos[i].offset == end);   /* the infos tile the arena in order */
        o->ranges[i] = (OptimRange){infos[i].offset, infos[i].offset + infos[i].numel, infos[i].decay,
                                    infos[i].norm_once, infos[i].layer,
                                    mesh->ep > 1 && set->params == m->params && infos[i].expert >= 0};
        end += infos[i].numel;
    }
    CHECK(end == o->n_params);
    build_partition(o);

    size_t quantum = (size_t)ARENA_ALIGN * mesh->dp;
    o->n_grad = cfg.zero >= 2 ? 0 : (o->n_params + quantum - 1) / quantum * quantum;
    if (cfg.zero) o->slice = be->alloc(sizeof(float) * o->n_state);   /* zero; the model's backend's, as are all below */
    if (cfg.zero >= 2) {   /* the layers' shared buffer first, then one per other unit */
        o->ubuf_off = xmalloc(sizeof(size_t) * o->n_units);
        size_t layer_at = SIZE_MAX;
        for (int u = 0; u < o->n_units; u++) {
            const OptimUnit *un = &o->units[u];
            int shared = un->layer >= 0 && un->kind != 2;   /* a layer's experts (ep > 1): a buffer of their own */
            if (shared && layer_at != SIZE_MAX) { o->ubuf_off[u] = layer_at; continue; }
            o->ubuf_off[u] = o->n_ubuf;
            if (shared) layer_at = o->n_ubuf;
            o->n_ubuf += un->S * unit_comm(o, un)->size;
        }
        o->ubuf = be->alloc(sizeof(float) * o->n_ubuf);
        size_t S = 1;
        for (int u = 0; u < o->n_units; u++) if (o->units[u].S > S) S = o->units[u].S;
        o->rbuf = be->alloc(sizeof(float) * S);
    }
    o->n_epbuf = optim_ep_buf_floats(o);
    o->epbuf = o->n_epbuf ? xmalloc(sizeof(float) * o->n_epbuf) : NULL;
    o->m = be->alloc(optim_sections(o) * sizeof(float) * o->n_state);   /* zero */
    o->v = o->m + o->n_state;
    if (o->dtype == DTYPE_BF16) {   /* the master starts as the loaded weights (exact upcast) */
        o->master = o->v + o->n_state;
        for (int i = 0; i < o->n_pieces; i++) {
            const OptimPiece *pc = &o->pieces[i];
            be->unpack(o->master + pc->held, piece_params(o, m, pc), DTYPE_BF16, pc->hi - pc->lo);
        }
    }
    o->sums = be->alloc(sizeof(double) * (o->n_pieces ? o->n_pieces : 1));
    o->sums_host = xcalloc(o->n_pieces ? o->n_pieces : 1, sizeof(double));
    o->partials = be->alloc(sizeof(double) * (o->n_state / NORM_CHUNK + 2));
    return o;
}

void optim_free(Optim *o) {
    if (!o) return;
    o->be->free(o->m);
    o->be->free(o->sums);
    o->be->free(o->partials);
    free(o->sums_host);
    o->be->free(o->slice);
    free(o->ranges);
    free(o->units);
    free(o->pieces);
    o->be->free(o->ubuf);
    free(o->ubuf_off);
    o->be->free(o->rbuf);
    free(o->epbuf);
    free(o);
}

size_t optim_grad_floats(const Optim *o) { return o->n_grad; }
size_t optim_state_bytes(const Optim *o) { return sizeof(float) * o->n_state * optim_sections(o); }
size_t optim_master_bytes(const Optim *o) { return o->master ? sizeof(float) * o->n_state : 0; }
size_t optim_grad_bytes(const Optim *o) {
    size_t slice = o->cfg.zero ? o->n_state : 0;
    return sizeof(float) * (o->cfg.zero >= 2 ? o->n_ubuf + slice : o->n_grad + slice + o->n_epbuf);
}
void optim_zero_grad(const Optim *o, float *grads) {
    if (grads) o->be->zero(grads, sizeof(float) * o->n_grad);
    if (o->slice) o->be->zero(o->slice, sizeof(float) * o->n_state);
    if (o->ubuf) o->be->zero(o->ubuf, sizeof(float) * o->n_ubuf);
}
double optim_lr(const Optim *o, int step) { return lr_schedule(&o->cfg, step); }

int optim_layer_unit(const Optim *o, int l) {
    for (int u = 0; u < o->n_units; u++) if (o->units[u].layer == l) return u;
    return -1;
}
float *optim_unit_grads(const Optim *o, int u) { return o->ubuf + o->ubuf_off[u]; }

void optim_reduce_unit(Optim *o, int u) {
    const OptimUnit *un = &o->units[u];
    float *buf = optim_unit_grads(o, u), *acc = o->slice + un->held;
    const Comm *c = unit_comm(o, un);
    comm_reduce_scatter_sum_fixed(c, buf, o->rbuf, un->S);
    o->be->add_to(acc, acc, o->rbuf, un->S);
    o->be->zero(buf, sizeof(float) * un->S * c->size);
}

float *optim_layer_tensor_grads(const Optim *o, int l, size_t layer_off) {
    size_t at = 0;
    int t = 0;
    for (; t < o->n_ranges && !(o->ranges[t].layer == l && at == layer_off); t++)
        if (o->ranges[t].layer == l) at += o->ranges[t].hi - o->ranges[t].lo;
    CHECK(t < o->n_ranges);
    int u = 0;
    while (u < o->n_units && !(o->units[u].layer == l && in_unit(o, &o->units[u], t))) u++;
    CHECK(u < o->n_units);
    size_t pos = 0;   /* t's place in its unit's packed order */
    for (int k = 0; k < t; k++) pos += in_unit(o, &o->units[u], k) ? o->ranges[k].hi - o->ranges[k].lo : 0;
    return optim_unit_grads(o, u) + pos;
}

void optim_print_summary(const Optim *o) {
    if (o->mesh->rank != 0) return;
    const OptimConfig *c = &o->cfg;
    const char *sched = c->schedule == LR_COSINE ? "cosine" : c->schedule == LR_LINEAR ? "linear" : "constant";
    char name[16];
    snprintf(name, sizeof name, c->zero ? "AdamW ZeRO%d" : "AdamW", c->zero);
    fprintf(stderr, "+----------------------+------------+\n");
    fprintf(stderr, "| %-20s | %-10s |\n", "optimizer", name);
    fprintf(stderr, "| %-20s | %-10s |\n", "master weights", o->master ? "fp32" : "= weights");
    fprintf(stderr, "| %-20s | %10.3g |\n| %-20s | %10.3g |\n", "lr", c->lr, "min_lr", c->min_lr);
    fprintf(stderr, "| %-20s | %-10s |\n| %-20s | %10d |\n| %-20s | %10d |\n", "schedule", sched, "warmup",
            c->warmup, "total_steps", c->total_steps);
    fprintf(stderr, "| %-20s | %10.3g |\n| %-20s | %10.3g |\n| %-20s | %10.3g |\n", "beta1", c->beta1, "beta2",
            c->beta2, "eps", c->eps);
    fprintf(stderr, "| %-20s | %10.3g |\n| %-20s | %10.3g |\n", "weight_decay", c->weight_decay, "clip", c->clip);
    fprintf(stderr, "| %-20s | %10.1f |\n", "state MiB / rank", (double)optim_state_bytes(o) / (1 << 20));
    fprintf(stderr, "+----------------------+------------+\n");
}

/* ---- the step -------------------------------------------------------------------------------- */


/* After the update: every dp rank gets every unit's updated params back, in the weights' dtype (bf16
 * sends half the bytes; S is a multiple of 16). ZeRO-1: the grads arena is the gather buffer; ZeRO-2:
 * each unit's gradient buffer (spent: its gradient is reduced). */
static void gather_params(Optim *o, Model *m, float *grads) {
    const Backend *be = o->be;
    size_t es = dtype_size(o->dtype);
    int p = 0;
    for (int u = 0; u < o->n_units; u++) {
        const OptimUnit *un = &o->units[u];
        if (m->z3 && o->params == m->params) break;   /* ZeRO-3: the slices were updated in place; nothing to send */
        char *all = (char *)(o->cfg.zero >= 2 ? optim_unit_grads(o, u) : grads);   /* (dp * S) elements */
        char *mine = (char *)o->slice + un->held * es;   /* my slice's params, packed; the slice is spent */
        be->zero(mine, es * un->S);
        for (; p < o->n_pieces && o->pieces[p].held < un->held + un->S; p++) {
            const OptimPiece *pc = &o->pieces[p];
            be->copy_bytes(mine + (pc->held - un->held) * es, (char *)o->params + pc->lo * es, es * (pc->hi - pc->lo));
        }
        const Comm *dp = unit_comm(o, un);   /* the experts': edp */
        CHECK(o->cfg.zero >= 2 || un->S * dp->size <= o->n_grad);
        comm_all_gather(dp, (float *)mine, (float *)all, un->S * es / sizeof(float));
        if (o->cfg.zero < 2 && !un->kind) {   /* one unit, packed = the arena */
            be->copy_bytes(o->params, all, es * o->n_params);
            continue;
        }
        /* every rank's pieces of this unit: the unit's tensors packed in order */
        size_t at = 0;
        for (int t = 0; t < o->n_ranges; t++) {
            const OptimRange *rg = &o->ranges[t];
            if (!in_unit(o, un, t)) continue;
            be->copy_bytes((char *)o->params + rg->lo * es, all + at * es, es * (rg->hi - rg->lo));
            at += rg->hi - rg->lo;
        }
        be->zero(all, sizeof(float) * un->S * dp->size);   /* the unit's gradient buffer again */
    }
}

/* held[0 .. n) /= dp, the same bits on every backend: a power-of-two dp is the backend's exact
 * multiply by 2^-k; else a host division, through a host copy when held is a device's memory */
static void mean_over_dp(const Optim *o, float *held, size_t n) {
    int dp = o->mesh->dp;
    if ((dp & (dp - 1)) == 0) {
        o->be->scale(held, 1.0f / (float)dp, n);
        return;
    }
    float *h = o->be->owns ? xmalloc(sizeof(float) * n) : held;
    if (h != held) o->be->to_host(h, held, sizeof(float) * n);
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) h[i] /= (float)dp;
    if (h != held) o->be->to_device(held, h, sizeof(float) * n), free(h);
}

float optim_step(Optim *o, Model *m, float *grads) {
    const Mesh *mesh = o->mesh;
    const OptimConfig *c = &o->cfg;

    /* 1. sum over dp, each element by one fixed tree (comm_all_reduce_sum_fixed): every ZeRO stage
     * gives plain's bits; held[i] is then the reduced gradient of held float i */
    float *held;
    if (c->zero >= 2) {   /* the layers were reduced after each micro-batch's backward; the rest now */
        for (int u = 0; u < o->n_units; u++) if (o->units[u].layer < 0 || o->units[u].kind == 2) optim_reduce_unit(o, u);
        held = o->slice;
    } else if (c->zero && mesh->ep > 1) {
        optim_ep_reduce_zero(o, grads);   /* the experts over the edp group */
        held = o->slice;
    } else if (c->zero) {
        comm_reduce_scatter_sum_fixed(&mesh->dp_comm, grads, o->slice, o->n_state);
        held = o->slice;
    } else {   /* the same tree as an all-reduce, by the bandwidth-optimal pattern at every size */
        if (mesh->ep > 1) optim_ep_reduce(o, grads);   /* the experts over the edp group */
        else if (mesh->dp > 1) {
            size_t S = o->n_grad / mesh->dp;
            float *mine = grads + (size_t)mesh->dp_rank * S;
            comm_reduce_scatter_sum_fixed(&mesh->dp_comm, grads, mine, S);   /* in place */
            comm_all_gather(&mesh->dp_comm, mine, grads, S);
        }
        held = grads;
    }
    if (mesh->dp > 1) mean_over_dp(o, held, o->n_state);

    /* 2. global norm: each element of the global model once, over tp and pp (and dp under ZeRO) */
    const Backend *be = o->be;
    for (int i = 0; i < o->n_pieces; i++) {   /* each piece's sum into its slot, one copy back */
        const OptimPiece *pc = &o->pieces[i];
        if (o->ranges[pc->t].in_norm) be->sum_squares(o->sums + i, held + pc->held, pc->hi - pc->lo, o->partials);
    }
    be->to_host(o->sums_host, o->sums, sizeof(double) * o->n_pieces);
    double sumsq = 0.0;   /* in held order (ep > 1: ep 1's, the ep group's experts in place) */
    int ep_order = mesh->ep > 1 && !c->zero;
    for (int i = 0; i < o->n_pieces && !ep_order; i++)
        if (o->ranges[o->pieces[i].t].in_norm) sumsq += o->sums_host[i];
    if (ep_order) sumsq = optim_ep_sumsq(o, m, o->sums_host);
    comm_all_reduce_sum_f64(&mesh->tp_comm, &sumsq, 1);
    comm_all_reduce_sum_f64(&mesh->pp_comm, &sumsq, 1);
    if (c->zero) comm_all_reduce_sum_f64(&mesh->dp_comm, &sumsq, 1);
    float norm = (float)sqrt(sumsq);
    /* A NaN or inf anywhere in the gradient makes the global norm non-finite, on every rank alike
     * (the sum went over the whole mesh): apply nothing, so the weights, the moments and the step
     * stay as the last good step left them. The caller decides what follows (the learner stops). */
    if (!isfinite(norm)) return norm;

    /* 3. clip factor, folded into the update (grads are not rescaled in place) */
    float scale = clip_scale(norm, c->clip);

    /* 4. AdamW on this rank's pieces (decay flag per tensor) */
    double lr = lr_schedule(c, o->step);
    for (int i = 0; i < o->n_pieces; i++) {
        const OptimPiece *pc = &o->pieces[i];
        size_t k = pc->held;
        float *p = o->master ? o->master + k : piece_params(o, m, pc);
        be->adamw(p, held + k, o->m + k, o->v + k, pc->hi - pc->lo, scale, lr, c->beta1, c->beta2, c->eps,
                  o->ranges[pc->t].decay ? c->weight_decay : 0.0, o->step + 1);
        /* the bf16 weights: the updated master, rounded to nearest even */
        if (o->master) be->pack(piece_params(o, m, pc), DTYPE_BF16, p, pc->hi - pc->lo);
    }

    /* 5. ZeRO: every dp rank gets every slice back */
    if (c->zero) gather_params(o, m, grads);
    o->step++;
    return norm;
}

/* ---- save / load ----------------------------------------------------------------------------- */

static void header_fill(const Optim *o, OptimHeader *h) {
    const Mesh *mesh = o->mesh;
    memset(h, 0, sizeof(*h));
    memcpy(h->magic, OPTIM_MAGIC, 8);
    h->version = OPTIM_VERSION;
    h->zero = (uint16_t)o->cfg.zero;
    h->dtype = (uint16_t)o->dtype;
    h->tp = mesh->tp; h->pp = mesh->pp; h->dp = mesh->dp;
    h->tp_rank = mesh->tp_rank; h->pp_rank = mesh->pp_rank; h->dp_rank = mesh->dp_rank;
    h->step = o->step;
    h->n_params = o->n_params;
    h->n_state = o->n_state;
}

/* The file's bytes: the header, then m, v[, master] copied out of the backend's memory through a
 * host buffer of at most BOUNCE floats (the state may be most of the memory: never a second copy) */
static int write_state(FILE *f, void *ctx) {
    const Optim *o = ctx;
    OptimHeader h;
    header_fill(o, &h);
    if (fwrite(&h, sizeof h, 1, f) != 1) return -1;
    size_t n = optim_sections(o) * o->n_state, cap = n < BOUNCE ? n : BOUNCE;
    float *buf = xmalloc(sizeof(float) * (cap ? cap : 1));   /* (cap) */
    int rc = 0;
    for (size_t off = 0; off < n && !rc; off += cap) {
        size_t k = n - off < cap ? n - off : cap;
        o->be->to_host(buf, o->m + off, sizeof(float) * k);
        if (fwrite(buf, sizeof(float), k, f) != k) rc = -1;
    }
    free(buf);
    return rc;
}

int optim_save(Optim *o, const char *path) { return write_file_atomic_with(path, write_state, o); }

int optim_load(Optim *o, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    CHECK(fseek(f, 0, SEEK_END) == 0);
    long size = ftell(f);
    CHECK(size >= 0 && fseek(f, 0, SEEK_SET) == 0);
    OptimHeader h, want;
    header_fill(o, &want);
    size_t want_bytes = sizeof(OptimHeader) + optim_sections(o) * sizeof(float) * o->n_state;
    if ((size_t)size < sizeof h || fread(&h, sizeof h, 1, f) != 1)
        rank_error("%s: %ld bytes, shorter than the %zu-byte optimizer state header (an interrupted copy?); "
                   "restore it from the checkpoint, or resume without optimizer state", path, size, sizeof h);
    if (memcmp(h.magic, OPTIM_MAGIC, 8) != 0)
        rank_error("%s: not a Tandem optimizer state file (it does not start with \"" OPTIM_MAGIC "\"); "
                   "pass the optim.rank<N>.bin that optim_save wrote for this rank", path);
    if (h.version != OPTIM_VERSION && h.version != 1)
        rank_error("%s: optimizer state format version %u; this build reads version %u: resume with the build "
                   "that saved it, or resume without optimizer state (moments restart from zero)",
                   path, h.version, OPTIM_VERSION);
    if (h.tp != want.tp || h.pp != want.pp || h.dp != want.dp || h.zero != want.zero || h.tp_rank != want.tp_rank ||
        h.pp_rank != want.pp_rank || h.dp_rank != want.dp_rank)
        rank_error("%s: saved by a tp=%d pp=%d dp=%d zero=%u run (rank tp %d, dp %d, pp %d); this is tp=%d pp=%d dp=%d "
                   "zero=%u (rank tp %d, dp %d, pp %d): resume with the same --tp, --pp, number of ranks and ZeRO "
                   "setting, and each rank's own file", path, h.tp, h.pp, h.dp, h.zero, h.tp_rank, h.dp_rank,
                   h.pp_rank, want.tp, want.pp, want.dp, want.zero, want.tp_rank, want.dp_rank, want.pp_rank);
    if (h.dtype != want.dtype)
        rank_error("%s: saved by a run with %s weights; this run has %s weights: resume with --dtype %s (or "
                   "--dtype auto, which reads the checkpoint's torch_dtype)", path, dtype_name((DType)h.dtype),
                   dtype_name(o->dtype), dtype_name((DType)h.dtype));
    if (h.n_params != want.n_params || h.n_state != want.n_state)
        rank_error("%s: state for %llu parameters on this rank (%llu per moment); this model has %llu: "
                   "saved for another model or config.json", path, (unsigned long long)h.n_params,
                   (unsigned long long)h.n_state, (unsigned long long)want.n_params);
    if ((size_t)size != want_bytes)
        rank_error("%s: %ld bytes, expected %zu (64-byte header + %d x %llu floats: moments%s): truncated or "
                   "corrupt; restore it from the checkpoint", path, size, want_bytes, optim_sections(o),
                   (unsigned long long)h.n_state, o->master ? " and master" : "");
    size_t n = optim_sections(o) * o->n_state, cap = n < BOUNCE ? n : BOUNCE;
    float *buf = xmalloc(sizeof(float) * (cap ? cap : 1));   /* (cap): the file to the backend, a piece at a time */
    for (size_t off = 0; off < n; off += cap) {
        size_t k = n - off < cap ? n - off : cap;
        if (fread(buf, sizeof(float), k, f) != k) rank_error("%s: read failed: %s", path, strerror(errno));
        o->be->to_device(o->m + off, buf, sizeof(float) * k);
    }
    free(buf);
    fclose(f);
    o->step = (int)h.step;
    return 0;
}
