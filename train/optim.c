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
    if (c->zero != 0 && c->zero != 1) user_error("optimizer: zero %d must be 0 or 1", c->zero);
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

Optim *optim_new(const Model *m, const Mesh *mesh, OptimConfig cfg) {
    check_config(&cfg);
    const Backend *be = m->be;
    /* runtime/comm.c moves host memory: a device trains on one rank without ZeRO (the commands say so) */
    CHECK(be == backend_named("cpu") || (mesh->size == 1 && !cfg.zero));
    Optim *o = xcalloc(1, sizeof(Optim));
    o->cfg = cfg;
    o->mesh = mesh;
    o->be = be;
    o->n_params = m->n_params;
    size_t quantum = (size_t)ARENA_ALIGN * mesh->dp;
    o->n_grad = (m->n_params + quantum - 1) / quantum * quantum;
    if (cfg.zero) {
        o->n_state = o->n_grad / mesh->dp;
        o->slice_lo = (size_t)mesh->dp_rank * o->n_state;
        o->slice_hi = o->slice_lo + o->n_state;
        o->slice = xmalloc(sizeof(float) * o->n_state);
    } else {
        o->n_state = m->n_params;
        o->slice_lo = 0;
        o->slice_hi = m->n_params;
    }
    o->dtype = m->dtype;
    o->m = be->alloc(optim_sections(o) * sizeof(float) * o->n_state);   /* zero */
    o->v = o->m + o->n_state;
    if (o->dtype == DTYPE_BF16) {   /* the master starts as the loaded weights (exact upcast) */
        o->master = o->v + o->n_state;
        size_t hi = o->slice_hi < m->n_params ? o->slice_hi : m->n_params;
        if (hi > o->slice_lo)
            be->unpack(o->master, (const uint16_t *)m->params + o->slice_lo, DTYPE_BF16, hi - o->slice_lo);
    }

    int n_info = model_param_infos(m, NULL, 0);
    ParamInfo *infos = xmalloc(sizeof(ParamInfo) * n_info);
    model_param_infos(m, infos, n_info);
    o->ranges = xmalloc(sizeof(OptimRange) * n_info);
    o->n_ranges = n_info;
    size_t end = 0;
    for (int i = 0; i < n_info; i++) {
        CHECK(infos[i].offset == end);   /* the infos tile the arena in order */
        o->ranges[i] = (OptimRange){infos[i].offset, infos[i].offset + infos[i].numel, infos[i].decay,
                                    infos[i].norm_once};
        end += infos[i].numel;
    }
    CHECK(end == m->n_params);
    free(infos);
    o->sums = be->alloc(sizeof(double) * (n_info ? n_info : 1));
    o->sums_host = xcalloc(n_info ? n_info : 1, sizeof(double));
    o->partials = be->alloc(sizeof(double) * (o->n_state / NORM_CHUNK + 2));
    return o;
}

void optim_free(Optim *o) {
    if (!o) return;
    o->be->free(o->m);
    o->be->free(o->sums);
    o->be->free(o->partials);
    free(o->sums_host);
    free(o->slice);
    free(o->ranges);
    free(o);
}

size_t optim_grad_floats(const Optim *o) { return o->n_grad; }
size_t optim_state_bytes(const Optim *o) {
    return sizeof(float) * o->n_state * (optim_sections(o) + (o->cfg.zero ? 1 : 0));
}
size_t optim_master_bytes(const Optim *o) { return o->master ? sizeof(float) * o->n_state : 0; }
void optim_zero_grad(const Optim *o, float *grads) { o->be->zero(grads, sizeof(float) * o->n_grad); }
double optim_lr(const Optim *o, int step) { return lr_schedule(&o->cfg, step); }

void optim_print_summary(const Optim *o) {
    if (o->mesh->rank != 0) return;
    const OptimConfig *c = &o->cfg;
    const char *sched = c->schedule == LR_COSINE ? "cosine" : c->schedule == LR_LINEAR ? "linear" : "constant";
    fprintf(stderr, "+----------------------+------------+\n");
    fprintf(stderr, "| %-20s | %-10s |\n", "optimizer", c->zero ? "AdamW ZeRO1" : "AdamW");
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

float optim_step(Optim *o, Model *m, float *grads) {
    const Mesh *mesh = o->mesh;
    const OptimConfig *c = &o->cfg;
    CHECK(m->n_params == o->n_params);

    /* 1. mean over dp; held[i - slice_lo] is the reduced gradient of arena float i */
    float *held;
    if (c->zero) {
        comm_reduce_scatter_sum(&mesh->dp_comm, grads, o->slice, o->n_state);
        held = o->slice;
    } else {
        comm_all_reduce_sum(&mesh->dp_comm, grads, o->n_params);   /* no-op for dp = 1 */
        held = grads;
    }
    if (mesh->dp > 1) {
        float dp = (float)mesh->dp;
        size_t n = o->slice_hi - o->slice_lo;
#pragma omp parallel for schedule(static) if (n > 65536)
        for (size_t i = 0; i < n; i++) held[i] /= dp;
    }

    /* 2. global norm: each element of the global model once, over tp and pp (and dp for ZeRO-1) */
    const Backend *be = o->be;
    for (int r = 0; r < o->n_ranges; r++) {   /* each tensor's sum into its slot, one copy back */
        const OptimRange *rg = &o->ranges[r];
        size_t lo = rg->lo > o->slice_lo ? rg->lo : o->slice_lo, hi = rg->hi < o->slice_hi ? rg->hi : o->slice_hi;
        if (rg->in_norm && lo < hi) be->sum_squares(o->sums + r, held + (lo - o->slice_lo), hi - lo, o->partials);
    }
    be->to_host(o->sums_host, o->sums, sizeof(double) * o->n_ranges);
    double sumsq = 0.0;   /* in tensor order */
    for (int r = 0; r < o->n_ranges; r++) {
        const OptimRange *rg = &o->ranges[r];
        size_t lo = rg->lo > o->slice_lo ? rg->lo : o->slice_lo, hi = rg->hi < o->slice_hi ? rg->hi : o->slice_hi;
        if (rg->in_norm && lo < hi) sumsq += o->sums_host[r];
    }
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

    /* 4. AdamW on this rank's slice, tensor by tensor (decay flag per tensor) */
    double lr = lr_schedule(c, o->step);
    for (int r = 0; r < o->n_ranges; r++) {
        const OptimRange *rg = &o->ranges[r];
        size_t lo = rg->lo > o->slice_lo ? rg->lo : o->slice_lo, hi = rg->hi < o->slice_hi ? rg->hi : o->slice_hi;
        if (lo >= hi) continue;
        size_t k = lo - o->slice_lo;
        float *p = o->master ? o->master + k : (float *)m->params + lo;
        be->adamw(p, held + k, o->m + k, o->v + k, hi - lo, scale, lr, c->beta1, c->beta2, c->eps,
                  rg->decay ? c->weight_decay : 0.0, o->step + 1);
        /* the bf16 weights: the updated master, rounded to nearest even */
        if (o->master) be->pack((uint16_t *)m->params + lo, DTYPE_BF16, p, hi - lo);
    }

    /* 5. ZeRO-1: every dp rank gets every slice back (the grads arena is the gather buffer) */
    if (c->zero) {   /* in the weights' dtype: bf16 sends half the bytes (n_state is a multiple of 16) */
        size_t es = dtype_size(m->dtype), own = o->slice_lo >= o->n_params ? 0
                   : (o->slice_hi < o->n_params ? o->slice_hi : o->n_params) - o->slice_lo;
        memcpy(o->slice, (char *)m->params + o->slice_lo * es, es * own);
        memset((char *)o->slice + es * own, 0, es * (o->n_state - own));
        comm_all_gather(&mesh->dp_comm, o->slice, grads, o->n_state * es / sizeof(float));
        memcpy(m->params, grads, es * o->n_params);
    }
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
