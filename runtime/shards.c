/* shards.c — ZeRO-3's sharded layers (runtime/model.h says the contract): the slices, the two
 * gather buffers of a training step with the next layer's gather started ahead, and the whole-model
 * gather for eval, generation and saving. Owns the layout of a slice (a layer packed as
 * model_layer_place packs it, padded to 16 dp elements, cut in dp equal slices: the optimizer's
 * ZeRO-2/3 units, train/optim.c, cut the same way).
 * Does not own: updating the slices (the optimizer writes them), which commands shard (learner). */
#include "runtime/model.h"
#include "runtime/util.h"
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static size_t es_of(const ModelShards *z) { return dtype_size(z->dtype); }
static char *slice_of(const ModelShards *z, int l) { return (char *)z->shard + (size_t)l * z->S * es_of(z); }
/* a slice in floats for the collectives (S is a multiple of 16, so bf16 slices are whole floats) */
static size_t floats(const ModelShards *z, size_t elems) { return elems * es_of(z) / sizeof(float); }

void model_shard_layers(Model *m, const Comm *dp) {
    CHECK(!m->z3 && m->be == backend_named("cpu"));
    ModelShards *z = xcalloc(1, sizeof *z);
    z->dp = dp;
    z->L = m->n_layers_local;
    z->dtype = m->dtype;
    LayerWeights probe;
    model_layer_place(m, NULL, z->dtype, &probe, &z->n);
    size_t quantum = (size_t)16 * dp->size;
    z->S = (z->n + quantum - 1) / quantum * quantum / dp->size;
    size_t es = es_of(z), full = z->S * dp->size;
    z->shard = xcalloc(z->L && z->S ? (size_t)z->L * z->S : 1, es);
    for (int k = 0; k < 2; k++) {
        z->slot[k] = xcalloc(full ? full : 1, es);
        z->slot_layer[k] = -1;
    }
    z->pending_layer = -1;

    /* each layer packed from the arena, then this rank's slice kept */
    int n_info = model_param_infos(m, NULL, 0);
    ParamInfo *infos = xmalloc(sizeof(ParamInfo) * n_info);
    model_param_infos(m, infos, n_info);
    size_t lo = SIZE_MAX, hi = 0;   /* the arena's layer region */
    char *packed = z->slot[0];
    for (int l = 0; l < z->L; l++) {
        memset(packed, 0, es * full);
        for (int i = 0; i < n_info; i++) {
            const ParamInfo *in = &infos[i];
            if (in->layer != l) continue;
            memcpy(packed + in->layer_offset * es, (char *)m->params + in->offset * es, in->numel * es);
            if (in->offset < lo) lo = in->offset;
            if (in->offset + in->numel > hi) hi = in->offset + in->numel;
        }
        memcpy(slice_of(z, l), packed + (size_t)dp->rank * z->S * es, z->S * es);
    }
    free(infos);
    /* the layer region back to the OS: its pages (whole ones inside it) read zero if ever touched, and
     * nothing touches them (every layer pointer goes through model_layer_weights) */
    if (hi > lo) {
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        uintptr_t a = ((uintptr_t)m->params + lo * es + page - 1) / page * page;
        uintptr_t b = ((uintptr_t)m->params + hi * es) / page * page;
        if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
    }
    for (int l = 0; l < z->L; l++) memset(&m->w.layers[l], 0, sizeof(LayerWeights));
    m->z3 = z;
}

void model_shards_free(Model *m) {
    ModelShards *z = m->z3;
    if (!z) return;
    comm_wait(&z->pending);
    free(z->shard);
    free(z->slot[0]);
    free(z->slot[1]);
    free(z->full);
    free(z);
    m->z3 = NULL;
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
        k = z->slot_layer[0] == next ? 1 : 0;
        comm_all_gather(z->dp, (const float *)slice_of(z, l), (float *)z->slot[k], floats(z, z->S));
        z->slot_layer[k] = l;
    }
    model_layer_place(m, z->slot[k], z->dtype, &m->w.layers[l], NULL);
    /* the next layer into the other slot while this one computes */
    if (next < 0 || next == l || z->slot_layer[k ^ 1] == next || z->pending_layer == next) return;
    land(z);
    z->slot_layer[k ^ 1] = -1;
    z->pending_slot = k ^ 1;
    z->pending_layer = next;
    comm_iall_gather(z->dp, (const float *)slice_of(z, next), (float *)z->slot[k ^ 1], floats(z, z->S), &z->pending);
}

void model_shards_step(Model *m, int on) {
    ModelShards *z = m->z3;
    if (!z) return;
    if (on) model_shards_release(m);
    comm_wait(&z->pending);   /* a gather started ahead of a layer the step did not ask for */
    z->pending_layer = -1;
    z->slot_layer[0] = z->slot_layer[1] = -1;   /* leaving: the optimizer changes the slices */
    z->stepping = on;
}

void model_shards_gather_all(Model *m) {
    ModelShards *z = m->z3;
    if (!z || z->full) return;
    comm_wait(&z->pending);
    z->pending_layer = -1;
    size_t es = es_of(z), full = z->S * z->dp->size;
    z->full = xmalloc(es * full * (z->L ? z->L : 1));
    for (int l = 0; l < z->L; l++) {
        char *all = (char *)z->full + (size_t)l * full * es;
        comm_all_gather(z->dp, (const float *)slice_of(z, l), (float *)all, floats(z, z->S));
        model_layer_place(m, all, z->dtype, &m->w.layers[l], NULL);
    }
}

void model_shards_release(Model *m) {
    ModelShards *z = m->z3;
    if (!z || !z->full) return;
    free(z->full);
    z->full = NULL;
    for (int l = 0; l < z->L; l++) memset(&m->w.layers[l], 0, sizeof(LayerWeights));
}

const void *model_tensor_data(const Model *m, const ParamInfo *in) {
    const ModelShards *z = m->z3;
    size_t es = dtype_size(m->dtype);
    if (!z || in->layer < 0) return (const char *)m->params + in->offset * es;
    CHECK(z->full);
    return (const char *)z->full + ((size_t)in->layer * z->S * z->dp->size + in->layer_offset) * es;
}
