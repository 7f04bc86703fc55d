/* shards.c — ZeRO-3's sliced weights (runtime/model.h says the contract): the slices, the two layer
 * buffers of a training step with the next layer's gather started ahead, the embedding's and the
 * head's gathers, and the whole-model gather for eval, generation and saving. Owns the layout of a
 * slice: a unit (a layer packed as model_layer_place packs it, or one other tensor) padded to 16 dp
 * elements and cut in dp equal slices, which is how the optimizer's ZeRO-2/3 units (train/optim.c)
 * cut it; at ep > 1 a layer's two units (its non-expert tensors over dp, its routed experts over the
 * edp group: runtime/model.h).
 * Does not own: updating the slices (the optimizer writes them), which commands shard (learner). */
#include "runtime/model.h"
#include "runtime/lora.h"
#include "runtime/util.h"
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static size_t es_of(const ModelShards *z) { return dtype_size(z->dtype); }
static size_t per_rank(size_t n, int dp) {
    size_t quantum = (size_t)16 * dp;
    return (n + quantum - 1) / quantum * quantum / dp;
}
static char *slice_of(const ModelShards *z, int l) { return (char *)z->shard + (size_t)l * z->S * es_of(z); }
/* elements in floats for the collectives (S is a multiple of 16, so bf16 slices are whole floats) */
static size_t floats(const ModelShards *z, size_t elems) { return elems * es_of(z) / sizeof(float); }
static void **field_of(Model *m, const ShardTensor *t) { return (void **)((char *)&m->w + t->field); }

/* the slices and buffers gone (model_free calls it: model_shard_weights registers it); a parameter
 * arena freed by the slicing is NULL, so that model_free does not free it again */
static void shards_free(Model *m) {
    ModelShards *z = m->z3;
    comm_wait(&z->pending);
    const Backend *be = m->be;
    for (int i = 0; i < z->n_t; i++) {
        be->free(z->t[i].shard);
        be->free(z->t[i].buf);
    }
    free(z->t);
    be->free(z->shard);
    be->free(z->slot[0]);
    be->free(z->slot[1]);
    be->free(z->full);
    be->free(z->stage);
    free(z->lt);
    if (z->arena_freed) m->params = NULL;
    free(z);
    m->z3 = NULL;
    m->free_z3 = NULL;
}

void model_shard_weights(Model *m, const Comm *dp) {
    CHECK(!m->z3);
    const Backend *be = m->be;
    ModelShards *z = xcalloc(1, sizeof *z);
    z->dp = dp;
    z->L = m->n_layers_local;
    z->dtype = m->dtype;
    LayerWeights probe;
    model_layer_place(m, NULL, z->dtype, &probe, &z->n);
    int n_info = model_param_infos(m, NULL, 0);
    ParamInfo *infos = xmalloc(sizeof(ParamInfo) * n_info);
    model_param_infos(m, infos, n_info);
    z->S = per_rank(z->n, dp->size);
    z->stride = z->S * dp->size;
    if (m->mesh->ep > 1 && m->cfg.moe != MOE_NONE) {   /* a layer's two units (model.h; LoRA's frozen base too) */
        z->edp = &m->mesh->edp_comm;
        z->lt = xcalloc((size_t)n_info + 1, sizeof(ShardPart));
        size_t at[2] = {0, 0};
        for (int i = 0; i < n_info; i++) {
            if (infos[i].layer != 0) continue;
            int x = infos[i].expert >= 0;
            z->lt[z->n_lt++] = (ShardPart){infos[i].layer_offset, at[x], infos[i].numel, x};
            at[x] += infos[i].numel;
        }
        z->Sa = per_rank(at[0], dp->size);
        z->Sx = per_rank(at[1], z->edp->size);
        z->S = z->Sa + z->Sx;
        z->stride = z->n;
        z->stage = be->alloc((z->Sa * dp->size + z->Sx * z->edp->size) * es_of(z));
    }
    size_t es = es_of(z), full = z->stride;
    z->shard = be->alloc((size_t)z->L * z->S * es);
    for (int k = 0; k < 2; k++) {
        z->slot[k] = be->alloc(full * es);
        z->slot_layer[k] = -1;
    }
    z->pending_layer = -1;
    z->last_slot = 1;

    /* each layer packed from the arena into a slot, then this rank's slice kept */
    char *packed = z->slot[0];
    for (int l = 0; l < z->L; l++) {
        be->zero(packed, es * full);
        for (int i = 0; i < n_info; i++)
            if (infos[i].layer == l)
                be->copy_bytes(packed + infos[i].layer_offset * es, (char *)m->params + infos[i].offset * es,
                               infos[i].numel * es);
        if (!z->edp) {
            be->copy_bytes(slice_of(z, l), packed + (size_t)dp->rank * z->S * es, z->S * es);
            continue;
        }
        char *a = z->stage, *x = a + z->Sa * dp->size * es;   /* the two parts packed, then my slices */
        be->zero(a, (z->Sa * dp->size + z->Sx * z->edp->size) * es);
        for (int i = 0; i < z->n_lt; i++)
            be->copy_bytes((z->lt[i].x ? x : a) + z->lt[i].part_off * es, packed + z->lt[i].layer_off * es, z->lt[i].n * es);
        be->copy_bytes(slice_of(z, l), a + (size_t)dp->rank * z->Sa * es, z->Sa * es);
        be->copy_bytes(slice_of(z, l) + z->Sa * es, x + (size_t)z->edp->rank * z->Sx * es, z->Sx * es);
    }
    /* the embedding and head tensors: each its own unit */
    z->t = xcalloc(4, sizeof(ShardTensor));
    static const size_t fields[] = {offsetof(ModelWeights, embed), offsetof(ModelWeights, final_norm),
                                    offsetof(ModelWeights, lm_head), offsetof(ModelWeights, score)};
    for (int f = 0; f < 4; f++) {
        void *p = *(void **)((char *)&m->w + fields[f]);
        if (!p || (f == 2 && p == m->w.embed)) continue;   /* absent, or the tied embedding itself */
        if ((char *)p < (char *)m->params || (char *)p >= (char *)m->params + m->n_params * es) continue;   /* LoRA's score */
        ShardTensor *t = &z->t[z->n_t++];
        t->offset = (size_t)((char *)p - (char *)m->params) / es;
        for (int i = 0; i < n_info; i++) if (infos[i].offset == t->offset) t->n = infos[i].numel;
        t->S = per_rank(t->n, dp->size);
        t->field = fields[f];
        t->head = f > 0;
        t->tied = f == 0 && m->w.lm_head == m->w.embed;
        t->shard = be->alloc(t->S * es);   /* zero: the padding past the tensor's end */
        size_t lo = (size_t)dp->rank * t->S, k = lo < t->n ? (t->n - lo < t->S ? t->n - lo : t->S) : 0;
        be->copy_bytes(t->shard, (char *)p + lo * es, k * es);
    }
    free(infos);
    /* the arena back to the OS: its whole pages read zero if ever touched, and nothing touches them
     * (every weight pointer is NULL until a gather sets it) */
    if (be->owns) {   /* a device's: freed whole (part of a cudaMalloc cannot go back) */
        be->free(m->params);
        z->arena_freed = 1;
    } else {
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        uintptr_t a = ((uintptr_t)m->params + page - 1) / page * page,
                  b = ((uintptr_t)m->params + m->n_params * es) / page * page;
        if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
    }
    ModelWeights none = {.layers = m->w.layers, .score = m->lora && m->lora->score ? m->w.score : NULL};
    for (int l = 0; l < z->L; l++) memset(&m->w.layers[l], 0, sizeof(LayerWeights));
    m->w = none;
    m->z3 = z;
    m->free_z3 = shards_free;
    /* what the weights take now: the slices, the step's two layer buffers and the larger of the
     * embedding's and the head's gathers */
    double slices = (double)z->L * z->S, emb = 0, head = 0;
    for (int i = 0; i < z->n_t; i++) {
        slices += z->t[i].S;
        if (z->t[i].head || z->t[i].tied) head += (double)z->t[i].S * dp->size;
        else emb += (double)z->t[i].S * dp->size;
    }
    double stage = z->edp ? (double)(z->Sa * dp->size + z->Sx * z->edp->size) : 0.0;
    m->weight_bytes = (slices + 2.0 * z->stride + stage + (emb > head ? emb : head)) * es;
}

/* layer l whole into dst (stride elements): one all-gather of its slice over dp; at ep > 1 one per
 * unit (dp, edp), unpacked into model_layer_place's packing */
static void gather_layer(Model *m, ModelShards *z, int l, char *dst) {
    if (!z->edp) {
        comm_all_gather(z->dp, (const float *)slice_of(z, l), (float *)dst, floats(z, z->S));
        return;
    }
    size_t es = es_of(z);
    char *a = z->stage, *x = a + z->Sa * z->dp->size * es;
    comm_all_gather(z->dp, (const float *)slice_of(z, l), (float *)a, floats(z, z->Sa));
    comm_all_gather(z->edp, (const float *)(slice_of(z, l) + z->Sa * es), (float *)x, floats(z, z->Sx));
    for (int i = 0; i < z->n_lt; i++)
        m->be->copy_bytes(dst + z->lt[i].layer_off * es, (z->lt[i].x ? x : a) + z->lt[i].part_off * es, z->lt[i].n * es);
}

static void release_tensor(Model *m, ShardTensor *t) {
    m->be->free(t->buf);
    t->buf = NULL;
    *field_of(m, t) = NULL;
    if (t->tied) m->w.lm_head = NULL;
}

/* the gather started ahead has landed: its slot holds its layer */
static void land(ModelShards *z) {
    comm_wait(&z->pending);
    if (z->pending_layer >= 0) z->slot_layer[z->pending_slot] = z->pending_layer;
    z->pending_layer = -1;
}

void model_layer_weights(Model *m, int l, int next) {
    ModelShards *z = m->z3;
    if (!z || z->full) return;
    CHECK(z->stepping);   /* outside a step the weights are read between gather_all and release */
    if (z->pending_layer == l) land(z);
    int k = z->slot_layer[0] == l ? 0 : z->slot_layer[1] == l ? 1 : -1;
    if (k < 0) {   /* not there: gather it now, into a slot that does not hold `next` */
        land(z);
        k = z->edp ? z->last_slot ^ 1 : z->slot_layer[0] == next ? 1 : 0;   /* ep > 1: the slots in turn */
        gather_layer(m, z, l, z->slot[k]);
        z->slot_layer[k] = l;
    }
    z->last_slot = k;
    model_layer_place(m, z->slot[k], z->dtype, &m->w.layers[l], NULL);
    /* the next layer into the other slot while this one computes (ep > 1: not ahead) */
    if (z->edp || next < 0 || next == l || z->slot_layer[k ^ 1] == next || z->pending_layer == next) return;
    land(z);
    z->slot_layer[k ^ 1] = -1;
    z->pending_slot = k ^ 1;
    z->pending_layer = next;
    comm_iall_gather(z->dp, (const float *)slice_of(z, next), (float *)z->slot[k ^ 1], floats(z, z->S), &z->pending);
}

static void gather_tensor(Model *m, ShardTensor *t) {
    ModelShards *z = m->z3;
    if (t->buf) return;
    t->buf = m->be->alloc(es_of(z) * t->S * z->dp->size);
    comm_all_gather(z->dp, (const float *)t->shard, (float *)t->buf, floats(z, t->S));
    *field_of(m, t) = t->buf;
    if (t->tied) m->w.lm_head = t->buf;
}

void model_end_weights(Model *m, int head, int on) {
    ModelShards *z = m->z3;
    if (!z || z->full) return;
    CHECK(z->stepping);
    for (int i = 0; i < z->n_t; i++) {
        ShardTensor *t = &z->t[i];
        if (t->head != head && !(head && t->tied)) continue;   /* a tied embedding is the head's too */
        if (on) gather_tensor(m, t);
        else if (!(t->tied && !head)) release_tensor(m, t);    /* the head releases it, not the lookup */
    }
}

void model_shards_step(Model *m, int on) {
    ModelShards *z = m->z3;
    if (!z) return;
    model_shards_release(m);
    comm_wait(&z->pending);   /* a gather started ahead of a layer the step did not ask for */
    z->pending_layer = -1;
    z->slot_layer[0] = z->slot_layer[1] = -1;   /* leaving: the optimizer changes the slices */
    for (int i = 0; i < z->n_t; i++) if (z->t[i].buf) release_tensor(m, &z->t[i]);
    z->stepping = on;
}

void model_shards_gather_all(Model *m) {
    ModelShards *z = m->z3;
    if (!z || z->full) return;
    comm_wait(&z->pending);
    z->pending_layer = -1;
    size_t es = es_of(z), full = z->stride;
    z->full = m->be->alloc(es * full * z->L);
    for (int l = 0; l < z->L; l++) {
        char *all = (char *)z->full + (size_t)l * full * es;
        gather_layer(m, z, l, all);
        model_layer_place(m, all, z->dtype, &m->w.layers[l], NULL);
    }
    for (int i = 0; i < z->n_t; i++) gather_tensor(m, &z->t[i]);
}

void model_shards_release(Model *m) {
    ModelShards *z = m->z3;
    if (!z || !z->full) return;
    m->be->free(z->full);
    z->full = NULL;
    for (int l = 0; l < z->L; l++) memset(&m->w.layers[l], 0, sizeof(LayerWeights));
    for (int i = 0; i < z->n_t; i++) release_tensor(m, &z->t[i]);
}

void *model_shard_slice(const Model *m, int layer, size_t offset, int experts) {
    const ModelShards *z = m->z3;
    if (!z) return NULL;
    if (layer >= 0) return slice_of(z, layer) + (experts ? z->Sa * es_of(z) : 0);
    for (int i = 0; i < z->n_t; i++) if (z->t[i].offset == offset) return z->t[i].shard;
    CHECK(0);   /* every non-layer tensor of the stage is sliced */
    return NULL;
}

const void *model_tensor_data(const Model *m, const ParamInfo *in) {
    const ModelShards *z = m->z3;
    size_t es = dtype_size(m->dtype);
    if (!z) return (const char *)m->params + in->offset * es;
    CHECK(z->full);
    if (in->layer >= 0) return (const char *)z->full + ((size_t)in->layer * z->stride + in->layer_offset) * es;
    for (int i = 0; i < z->n_t; i++) if (z->t[i].offset == in->offset) return z->t[i].buf;
    CHECK(0);
    return NULL;
}
