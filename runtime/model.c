/* model.c — see model.h. The parameter spec table below drives allocation, sharding and loading;
 * training (gradients, optimizer, saving) walks the same table. */
#include "runtime/model.h"
#include "runtime/device.h"
#include "runtime/peft.h"
#include "runtime/safetensors.h"
#include "runtime/util.h"
#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* ---- the parameter spec table ------------------------------------------------------------ */

typedef enum { DIM_1 = 0, DIM_D, DIM_F, DIM_V, DIM_QD, DIM_KVD, DIM_LABELS, DIM_HD, DIM_E, DIM_FE, DIM_FS } Dim; /* DIM_1: 1-D */
typedef enum {
    SHARD_NONE,     /* replicated on every tp rank */
    SHARD_VOCAB,    /* rows by vocab, V padded to a multiple of tp */
    SHARD_Q_ROWS,   /* rows by query heads (column-parallel q) */
    SHARD_KV_ROWS,  /* rows by kv heads; one replicated head per rank when tp > Hkv */
    SHARD_F_ROWS,   /* rows by intermediate dim (column-parallel gate / up; an expert's, the shared expert's) */
    SHARD_Q_COLS,   /* columns by query heads (row-parallel o_proj) */
    SHARD_F_COLS,   /* columns by intermediate dim (row-parallel down_proj; an expert's, the shared expert's) */
} Shard;
typedef enum { ON_LAYER, ON_FIRST, ON_LAST } Where;
typedef enum { IF_ALWAYS, IF_QKV_BIAS, IF_QK_NORM, IF_LM, IF_SCORE, IF_DENSE, IF_MIXTRAL, IF_QWEN_MOE, IF_SHARED } When;   /* ties: spec_aliased, spec_source_name */

typedef struct {
    const char *hf_name;  /* %d = global layer index */
    Where where;
    When when;
    size_t offset;        /* offsetof in LayerWeights (ON_LAYER) or ModelWeights */
    Dim rows, cols;       /* global shape (rows) or (rows, cols) */
    Shard shard;
    int decay;            /* AdamW weight decay applies */
    int per_expert;       /* one tensor per routed expert (a 2nd %d in hf_name): E back to back in the arena */
} ParamSpec;

#define LW(f) offsetof(LayerWeights, f)
#define MW(f) offsetof(ModelWeights, f)
static const ParamSpec SPECS[] = {
    {"model.embed_tokens.weight", ON_FIRST, IF_ALWAYS, MW(embed), DIM_V, DIM_D, SHARD_VOCAB, 1, 0},
    {"model.layers.%d.input_layernorm.weight", ON_LAYER, IF_ALWAYS, LW(attn_norm), DIM_D, DIM_1, SHARD_NONE, 0, 0},
    {"model.layers.%d.self_attn.q_proj.weight", ON_LAYER, IF_ALWAYS, LW(wq), DIM_QD, DIM_D, SHARD_Q_ROWS, 1, 0},
    {"model.layers.%d.self_attn.q_proj.bias", ON_LAYER, IF_QKV_BIAS, LW(bq), DIM_QD, DIM_1, SHARD_Q_ROWS, 0, 0},
    {"model.layers.%d.self_attn.k_proj.weight", ON_LAYER, IF_ALWAYS, LW(wk), DIM_KVD, DIM_D, SHARD_KV_ROWS, 1, 0},
    {"model.layers.%d.self_attn.k_proj.bias", ON_LAYER, IF_QKV_BIAS, LW(bk), DIM_KVD, DIM_1, SHARD_KV_ROWS, 0, 0},
    {"model.layers.%d.self_attn.v_proj.weight", ON_LAYER, IF_ALWAYS, LW(wv), DIM_KVD, DIM_D, SHARD_KV_ROWS, 1, 0},
    {"model.layers.%d.self_attn.v_proj.bias", ON_LAYER, IF_QKV_BIAS, LW(bv), DIM_KVD, DIM_1, SHARD_KV_ROWS, 0, 0},
    {"model.layers.%d.self_attn.o_proj.weight", ON_LAYER, IF_ALWAYS, LW(wo), DIM_D, DIM_QD, SHARD_Q_COLS, 1, 0},
    /* qwen3: one (Dh) weight shared by every head, so replicated over tp like the other norms */
    {"model.layers.%d.self_attn.q_norm.weight", ON_LAYER, IF_QK_NORM, LW(q_norm), DIM_HD, DIM_1, SHARD_NONE, 0, 0},
    {"model.layers.%d.self_attn.k_norm.weight", ON_LAYER, IF_QK_NORM, LW(k_norm), DIM_HD, DIM_1, SHARD_NONE, 0, 0},
    {"model.layers.%d.post_attention_layernorm.weight", ON_LAYER, IF_ALWAYS, LW(mlp_norm), DIM_D, DIM_1, SHARD_NONE, 0, 0},
    {"model.layers.%d.mlp.gate_proj.weight", ON_LAYER, IF_DENSE, LW(w_gate), DIM_F, DIM_D, SHARD_F_ROWS, 1, 0},
    {"model.layers.%d.mlp.up_proj.weight", ON_LAYER, IF_DENSE, LW(w_up), DIM_F, DIM_D, SHARD_F_ROWS, 1, 0},
    {"model.layers.%d.mlp.down_proj.weight", ON_LAYER, IF_DENSE, LW(w_down), DIM_D, DIM_F, SHARD_F_COLS, 1, 0},
    /* MoE (cfg.moe): the router replicated, each expert split over tp like the dense MLP */
    {"model.layers.%d.block_sparse_moe.gate.weight", ON_LAYER, IF_MIXTRAL, LW(router), DIM_E, DIM_D, SHARD_NONE, 1, 0},
    {"model.layers.%d.block_sparse_moe.experts.%d.w1.weight", ON_LAYER, IF_MIXTRAL, LW(e_gate), DIM_FE, DIM_D, SHARD_F_ROWS, 1, 1},
    {"model.layers.%d.block_sparse_moe.experts.%d.w3.weight", ON_LAYER, IF_MIXTRAL, LW(e_up), DIM_FE, DIM_D, SHARD_F_ROWS, 1, 1},
    {"model.layers.%d.block_sparse_moe.experts.%d.w2.weight", ON_LAYER, IF_MIXTRAL, LW(e_down), DIM_D, DIM_FE, SHARD_F_COLS, 1, 1},
    {"model.layers.%d.mlp.gate.weight", ON_LAYER, IF_QWEN_MOE, LW(router), DIM_E, DIM_D, SHARD_NONE, 1, 0},
    {"model.layers.%d.mlp.experts.%d.gate_proj.weight", ON_LAYER, IF_QWEN_MOE, LW(e_gate), DIM_FE, DIM_D, SHARD_F_ROWS, 1, 1},
    {"model.layers.%d.mlp.experts.%d.up_proj.weight", ON_LAYER, IF_QWEN_MOE, LW(e_up), DIM_FE, DIM_D, SHARD_F_ROWS, 1, 1},
    {"model.layers.%d.mlp.experts.%d.down_proj.weight", ON_LAYER, IF_QWEN_MOE, LW(e_down), DIM_D, DIM_FE, SHARD_F_COLS, 1, 1},
    {"model.layers.%d.mlp.shared_expert.gate_proj.weight", ON_LAYER, IF_SHARED, LW(s_gate), DIM_FS, DIM_D, SHARD_F_ROWS, 1, 0},
    {"model.layers.%d.mlp.shared_expert.up_proj.weight", ON_LAYER, IF_SHARED, LW(s_up), DIM_FS, DIM_D, SHARD_F_ROWS, 1, 0},
    {"model.layers.%d.mlp.shared_expert.down_proj.weight", ON_LAYER, IF_SHARED, LW(s_down), DIM_D, DIM_FS, SHARD_F_COLS, 1, 0},
    {"model.layers.%d.mlp.shared_expert_gate.weight", ON_LAYER, IF_SHARED, LW(s_router), DIM_LABELS, DIM_D, SHARD_NONE, 1, 0},
    {"model.norm.weight", ON_LAST, IF_ALWAYS, MW(final_norm), DIM_D, DIM_1, SHARD_NONE, 0, 0},
    /* tied: the last stage reads model.embed_tokens.weight here (see spec_source_name) */
    {"lm_head.weight", ON_LAST, IF_LM, MW(lm_head), DIM_V, DIM_D, SHARD_VOCAB, 1, 0},
    /* *ForSequenceClassification: reward models and critics (a value at every position) */
    {"score.weight", ON_LAST, IF_SCORE, MW(score), DIM_LABELS, DIM_D, SHARD_NONE, 1, 0},
};
#define N_SPECS ((int)(sizeof(SPECS) / sizeof(SPECS[0])))

static int64_t dim_size(const Model *m, Dim d) {
    const ModelConfig *c = &m->cfg;
    switch (d) {
    case DIM_D: return c->dim;
    case DIM_F: return c->hidden_dim;
    case DIM_V: return c->vocab_size;
    case DIM_QD: return (int64_t)c->n_heads * c->head_dim;
    case DIM_KVD: return (int64_t)c->n_heads_kv * c->head_dim;
    case DIM_LABELS: return 1;
    case DIM_HD: return c->head_dim;
    case DIM_E: return c->n_experts;
    case DIM_FE: return c->moe_dim;
    case DIM_FS: return c->shared_dim;
    default: return 0;
    }
}

/* whether the model has this tensor at all (on some stage) */
static int spec_in_model(const Model *m, const ParamSpec *p) {
    switch (p->when) {
    case IF_QKV_BIAS: return m->cfg.qkv_bias;
    case IF_QK_NORM: return m->cfg.qk_norm;
    case IF_LM: return m->head == HEAD_LM;
    case IF_SCORE: return m->head == HEAD_SCORE;
    case IF_DENSE: return m->cfg.moe == MOE_NONE;
    case IF_MIXTRAL: return m->cfg.moe == MOE_MIXTRAL;
    case IF_QWEN_MOE: return m->cfg.moe == MOE_QWEN;
    case IF_SHARED: return m->cfg.shared_dim > 0;
    default: return 1;
    }
}
/* whether this rank's stage holds it */
static int spec_present(const Model *m, const ParamSpec *p) {
    if (!spec_in_model(m, p)) return 0;
    if (p->where == ON_FIRST) return m->is_first;
    if (p->where == ON_LAST) return m->is_last;
    return 1;
}

/* lm_head of a tied model is embed_tokens; it needs its own copy only on a different stage. */
static int spec_aliased(const Model *m, const ParamSpec *p) {
    return p->offset == MW(lm_head) && p->where == ON_LAST && m->cfg.tie_embeddings && m->is_first;
}
static const char *spec_source_name(const Model *m, const ParamSpec *p) {
    if (p->offset == MW(lm_head) && p->where == ON_LAST && m->cfg.tie_embeddings) return SPECS[0].hf_name;
    return p->hf_name;
}

/* This rank's block of the global (rows, cols) tensor: rows [r0, r0+nr), cols [c0, c0+nc). */
static void spec_block(const Model *m, const ParamSpec *p, int64_t *r0, int64_t *nr, int64_t *c0, int64_t *nc) {
    const ModelConfig *c = &m->cfg;
    int tr = m->mesh->tp_rank, Dh = c->head_dim;
    *r0 = 0; *nr = dim_size(m, p->rows);
    *c0 = 0; *nc = p->cols ? dim_size(m, p->cols) : 1;
    switch (p->shard) {
    case SHARD_NONE: break;
    case SHARD_VOCAB: *r0 = m->vocab_start; *nr = m->vocab_local; break;
    case SHARD_Q_ROWS: *nr = (int64_t)m->n_heads_local * Dh; *r0 = tr * *nr; break;
    case SHARD_KV_ROWS: {
        int tp = m->mesh->tp, Hkv = c->n_heads_kv;
        int first_head = tp <= Hkv ? tr * m->n_heads_kv_local : tr / (tp / Hkv);
        *r0 = (int64_t)first_head * Dh;
        *nr = (int64_t)m->n_heads_kv_local * Dh;
        break;
    }
    case SHARD_F_ROWS: *nr /= m->mesh->tp; *r0 = tr * *nr; break;
    case SHARD_Q_COLS: *nc = (int64_t)m->n_heads_local * Dh; *c0 = tr * *nc; break;
    case SHARD_F_COLS: *nc /= m->mesh->tp; *c0 = tr * *nc; break;
    }
}

/* tensors a spec has per layer on this rank: the E / ep local experts for a per-expert spec, else 1 */
static int spec_copies(const Model *m, const ParamSpec *p) { return p->per_expert ? m->n_experts_local : 1; }
/* a global expert id's place among this rank's (0 for a spec that is not per expert) */
static size_t local_expert(const Model *m, int expert) { return expert < 0 ? 0 : (size_t)(expert - m->expert_start); }

/* Calls fn for every (spec, local layer, expert) present on this rank, in arena order; expert: the
 * global id, -1 for a spec that is not per expert (all_experts: every expert of the model, also those
 * other ep ranks hold). A per-expert spec's slot is its first local expert's: the E / ep follow it. */
typedef void (*SpecFn)(Model *m, const ParamSpec *p, int layer, int expert, void **slot, size_t numel, void *ctx);
static void for_each_param(Model *m, SpecFn fn, void *ctx, int all_experts) {
    for (int i = 0; i < N_SPECS; i++) {
        const ParamSpec *p = &SPECS[i];
        if (!spec_present(m, p)) continue;
        int64_t r0, nr, c0, nc;
        spec_block(m, p, &r0, &nr, &c0, &nc);
        size_t numel = (size_t)nr * (size_t)nc;
        if (p->where != ON_LAYER) {
            fn(m, p, -1, -1, (void **)((char *)&m->w + p->offset), numel, ctx);
            continue;
        }
        int e0 = !p->per_expert ? -1 : all_experts ? 0 : m->expert_start;
        int e1 = !p->per_expert ? 0 : all_experts ? m->cfg.n_experts : m->expert_start + m->n_experts_local;
        for (int l = 0; l < m->n_layers_local; l++)
            for (int e = e0; e < e1; e++)
                fn(m, p, m->layer_start + l, e, (void **)((char *)&m->w.layers[l] + p->offset), numel, ctx);
    }
}

static void count_param(Model *m, const ParamSpec *p, int layer, int expert, void **slot, size_t numel, void *ctx) {
    (void)layer; (void)expert; (void)slot;
    if (!spec_aliased(m, p)) *(size_t *)ctx += numel;
}
static void place_param(Model *m, const ParamSpec *p, int layer, int expert, void **slot, size_t numel, void *ctx) {
    (void)layer;
    size_t *off = ctx;
    if (spec_aliased(m, p)) { *slot = m->w.embed; return; }
    if (local_expert(m, expert) == 0) *slot = (char *)m->params + *off * dtype_size(m->dtype);
    *off += numel;
}
/* Every tensor of the whole model, all stages and all tp shards, by name and full shape, before
 * anything is allocated: a config.json that disagrees with the tensors names the tensor instead of
 * failing an allocation of whatever size it implies, and since every rank checks everything, a bad
 * tensor that only another stage reads is still reported by rank 0 (user_error speaks from rank 0;
 * the job used to abort without a word). */
static void check_tensors(const Model *m, const SafeTensors *st) {
    for (int i = 0; i < N_SPECS; i++) {
        const ParamSpec *p = &SPECS[i];
        if (!spec_in_model(m, p) || (p->when == IF_SCORE && m->score_seed)) continue;
        int64_t rows = dim_size(m, p->rows), cols = p->cols ? dim_size(m, p->cols) : 0;
        int copies = p->per_expert ? m->cfg.n_experts : 1;
        for (int le = 0; le < (p->where == ON_LAYER ? m->cfg.n_layers : 1) * copies; le++) {
            char name[256];
            snprintf(name, sizeof(name), spec_source_name(m, p), le / copies, le % copies);
            if (!st_find(st, name) && p->offset == MW(lm_head) && !m->cfg.tie_embeddings)
                user_error("%s: tensor lm_head.weight not found and config.json says tie_word_embeddings is false",
                           st->files[0].path);
            st_read_block(st, name, rows, cols, 0, 0, 0, cols ? cols : 1, NULL, DTYPE_F32);   /* 0 rows: checks only */
        }
    }
}

/* A new score head (model_load_score from a causal LM): normal(0, initializer_range), as
 * transformers' _init_weights gives a fresh *ForSequenceClassification's score.weight; drawn by
 * Box-Muller from splitmix64(seed), the same on every rank (the head is replicated). */
static void score_init(float *w, size_t n, float std, uint64_t seed) {
    uint64_t st = seed;
    for (size_t i = 0; i < n; i += 2) {
        double u1 = ((splitmix64_next(&st) >> 11) + 1.0) * 0x1.0p-53, u2 = (splitmix64_next(&st) >> 11) * 0x1.0p-53;
        double r = sqrt(-2.0 * log(u1));
        w[i] = (float)(std * r * cos(2.0 * M_PI * u2));
        if (i + 1 < n) w[i + 1] = (float)(std * r * sin(2.0 * M_PI * u2));
    }
}

/* Where load_param reads a tensor: straight into the arena when it is host memory (a backend
 * without `owns`: the CPU), else into `stage`, one tensor's host buffer of the model's dtype, then
 * to_device: never a second host copy of the weights. */
typedef struct {
    const SafeTensors *st;
    void *stage;
    size_t cap;   /* bytes */
} Loader;

static void load_param(Model *m, const ParamSpec *p, int layer, int expert, void **slot, size_t numel, void *ctx) {
    if (spec_aliased(m, p)) return;
    Loader *ld = ctx;
    size_t bytes = numel * dtype_size(m->dtype);
    void *at = (char *)*slot + local_expert(m, expert) * bytes, *dst = at;   /* the e-th local expert: e after the slot */
    if (m->be->owns) {   /* memory the host cannot touch */
        if (bytes > ld->cap) { free(ld->stage); ld->stage = xmalloc(bytes); ld->cap = bytes; }
        dst = ld->stage;
    }
    if (p->when == IF_SCORE && m->score_seed) {
        float *w = xmalloc(sizeof(float) * numel);
        score_init(w, numel, m->cfg.init_range, m->score_seed);
        for (size_t i = 0; i < numel; i++) {
            if (m->dtype == DTYPE_BF16) ((uint16_t *)dst)[i] = f32_to_bf16(w[i]);
            else ((float *)dst)[i] = w[i];
        }
        free(w);
        m->be->to_device(at, dst, bytes);
        return;
    }
    char name[256];
    snprintf(name, sizeof(name), spec_source_name(m, p), layer, expert);
    int64_t r0, nr, c0, nc;
    spec_block(m, p, &r0, &nr, &c0, &nc);
    st_read_block(ld->st, name, dim_size(m, p->rows), p->cols ? dim_size(m, p->cols) : 0, r0, nr, c0, nc, dst,
                  m->dtype);
    /* A NaN or inf weight (a diverged run's checkpoint, a corrupt file) would give NaN logits and
     * losses later, far from the cause: refuse it here, in the one pass over what this rank loaded.
     * Only this rank reads its block, so it reports (rank_error). */
    for (size_t i = 0; i < (size_t)(nr * nc); i++) {
        float wi = weight_at(dst, m->dtype, i);
        if (isfinite(wi)) continue;
        const SafeTensors *st = ld->st;
        char at[64];
        long long r = r0 + (long long)(i / nc), c = c0 + (long long)(i % nc);
        if (p->cols) snprintf(at, sizeof at, "[%lld, %lld]", r, c);
        else snprintf(at, sizeof at, "[%lld]", r);
        rank_error("%s: tensor %s holds a non-finite value (%s%s = %g): refusing to load it (a diverged run's "
                   "checkpoint? use an earlier one)", st->files[st_find(st, name)->file].path, name, name, at, wi);
    }
    m->be->to_device(at, dst, bytes);   /* nothing on the CPU: dst is the slot */
}

typedef struct {
    ParamInfo *infos;
    int n, max;
    float *arena;
    ModelWeights *w;
    LayerWeights *layers;
    size_t off;
    size_t layers_at;     /* arena offset of the first layer tensor (SIZE_MAX until met) */
} ParamWalk;

static void info_param(Model *m, const ParamSpec *p, int layer, int expert, void **slot, size_t numel, void *ctx) {
    (void)slot;
    ParamWalk *pw = ctx;
    if (spec_aliased(m, p)) return;
    int El = m->n_experts_local, held = expert < 0 || (expert >= m->expert_start && expert < m->expert_start + El);
    if (pw->n < pw->max) {
        ParamInfo *in = &pw->infos[pw->n];
        snprintf(in->name, sizeof in->name, p->hf_name, layer, expert);
        in->expert = expert;
        in->ep_owner = expert < 0 ? 0 : expert / El;
        in->held = held;
        in->offset = pw->off;
        in->numel = numel;
        in->layer = layer < 0 ? -1 : layer - m->layer_start;
        /* the arena holds each layer spec's tensors (E of them per expert spec) for every layer in a
         * row, so the specs before this one take (its block's start - the first layer tensor's) /
         * L_local of a layer; expert e is e tensors after its spec's first */
        if (layer >= 0 && pw->layers_at == SIZE_MAX) pw->layers_at = pw->off;
        size_t e = held ? local_expert(m, expert) : 0, before = ((size_t)in->layer * spec_copies(m, p) + e) * numel;
        in->layer_offset = layer < 0 ? 0 : (pw->off - before - pw->layers_at) / m->n_layers_local + e * numel;
        in->decay = p->decay;
        in->tp_replicated = p->shard == SHARD_NONE;
        int64_t r0, nr, c0, nc;
        spec_block(m, p, &r0, &nr, &c0, &nc);
        in->rows = (int)nr;
        in->cols = p->cols ? (int)nc : 0;
        in->row0 = (int)r0;
        in->col0 = (int)c0;
        in->rows_global = (int)dim_size(m, p->rows);
        in->cols_global = p->cols ? (int)dim_size(m, p->cols) : 0;
        int tp = m->mesh->tp, Hkv = m->cfg.n_heads_kv;
        in->replicas = p->shard == SHARD_NONE ? tp : (p->shard == SHARD_KV_ROWS && tp > Hkv) ? tp / Hkv : 1;
        in->norm_once = m->mesh->tp_rank % in->replicas == 0;
        if (p->offset == MW(lm_head) && p->where == ON_LAST && m->cfg.tie_embeddings) in->norm_once = 0; /* the table's 2nd copy */
    }
    pw->n++;
    pw->off += held ? numel : 0;
}

int model_param_infos(const Model *m, ParamInfo *infos, int max) {
    ParamWalk pw = {infos, 0, max, NULL, NULL, NULL, 0, SIZE_MAX};
    for_each_param((Model *)m, info_param, &pw, 0);
    return pw.n;
}
int model_param_infos_all(const Model *m, ParamInfo *infos, int max) {
    ParamWalk pw = {infos, 0, max, NULL, NULL, NULL, 0, SIZE_MAX};
    for_each_param((Model *)m, info_param, &pw, 1);
    return pw.n;
}

static void place_other(Model *m, const ParamSpec *p, int layer, int expert, void **slot, size_t numel, void *ctx) {
    ParamWalk *pw = ctx;
    /* the same slot in the other struct: same offset from its base */
    char *base = layer < 0 ? (char *)&m->w : (char *)&m->w.layers[layer - m->layer_start];
    char *obase = layer < 0 ? (char *)pw->w : (char *)&pw->layers[layer - m->layer_start];
    void **oslot = (void **)(obase + ((char *)slot - base));
    if (spec_aliased(m, p)) { *oslot = pw->w->embed; return; }
    if (local_expert(m, expert) == 0) *oslot = pw->arena + pw->off;
    pw->off += numel;
}

void model_weights_place(const Model *m, float *arena, ModelWeights *w, LayerWeights *layers) {
    memset(w, 0, sizeof(*w));
    memset(layers, 0, sizeof(LayerWeights) * m->n_layers_local);
    w->layers = layers;
    ParamWalk pw = {NULL, 0, 0, arena, w, layers, 0, SIZE_MAX};
    for_each_param((Model *)m, place_other, &pw, 0);
    CHECK(pw.off == m->n_params);
}

void model_layer_place(const Model *m, void *buf, DType dt, LayerWeights *lw, size_t *n) {
    memset(lw, 0, sizeof *lw);
    size_t off = 0;
    for (int i = 0; i < N_SPECS; i++) {   /* the layer's tensors in arena order */
        const ParamSpec *p = &SPECS[i];
        if (p->where != ON_LAYER || !spec_present(m, p)) continue;
        int64_t r0, nr, c0, nc;
        spec_block(m, p, &r0, &nr, &c0, &nc);
        *(void **)((char *)lw + p->offset) = buf ? (char *)buf + off * dtype_size(dt) : NULL;
        off += (size_t)nr * (size_t)nc * spec_copies(m, p);
    }
    if (n) *n = off;
}

/* ---- setup ------------------------------------------------------------------------------- */

/* the largest power of two that divides n, at most cap (a power of two) */
static int pow2_divisor(int n, int cap) {
    int p = 1;
    while (p < cap && n % (2 * p) == 0) p *= 2;
    return p;
}

static void check_layout(const ModelConfig *c, const Mesh *mesh) {
    int tp = mesh->tp, pp = mesh->pp;
    if (c->n_heads % tp) user_error("--tp %d does not divide num_attention_heads %d", tp, c->n_heads);
    if (c->n_heads_kv % tp && tp % c->n_heads_kv)
        user_error("--tp %d and num_key_value_heads %d: one must divide the other", tp, c->n_heads_kv);
    if (c->moe == MOE_NONE && c->hidden_dim % tp) user_error("--tp %d does not divide intermediate_size %d", tp, c->hidden_dim);
    if (c->moe != MOE_NONE && (c->moe_dim % tp || c->shared_dim % tp))
        user_error("--tp %d does not divide the experts' intermediate size %d%s", tp, c->moe_dim,
                   c->shared_dim % tp ? " or shared_expert_intermediate_size" : "");
    if (pp > c->n_layers) user_error("--pp %d is larger than num_hidden_layers %d", pp, c->n_layers);
    if (mesh->ep > 1 && c->moe == MOE_NONE)
        user_error("%s %d: model_type %s is dense (no experts to split over ep ranks)", mesh->ep_flag, mesh->ep, c->model_type);
    const char *ek = c->moe == MOE_MIXTRAL ? "num_local_experts" : "num_experts";
    if (c->moe != MOE_NONE && c->n_experts % mesh->ep) user_error("%s %d does not divide the model's %s %d", mesh->ep_flag, mesh->ep, ek, c->n_experts);
}

static void rope_init(Model *m) {
    const ModelConfig *c = &m->cfg;
    int half = c->head_dim / 2;
    float *inv_freq = xmalloc(sizeof(float) * half);   /* (Dh/2), to the backend below */
    for (int i = 0; i < half; i++) {
        /* HF: 1 / base ** (arange(0, Dh, 2) / Dh), all in fp32 */
        float f = 1.0f / powf(c->rope_theta, (float)(2 * i) / (float)c->head_dim);
        if (c->rope_scaling == ROPE_LINEAR) {
            f /= c->rope_factor;
        } else if (c->rope_scaling == ROPE_LLAMA3) {
            /* transformers _compute_llama3_parameters: long wavelengths divided by factor, short
             * ones kept, the band between smoothly interpolated. */
            float old_ctx = (float)c->rope_orig_max_pos, factor = c->rope_factor;
            float lo = c->rope_low_freq_factor, hi = c->rope_high_freq_factor;
            float low_freq_wavelen = old_ctx / lo, high_freq_wavelen = old_ctx / hi;
            float wavelen = 2.0f * (float)M_PI / f;
            float scaled = wavelen > low_freq_wavelen ? f / factor : f;
            float smooth = (old_ctx / wavelen - lo) / (hi - lo);
            float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
            int medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
            f = medium ? smoothed : scaled;
        }
        inv_freq[i] = f;
    }
    m->inv_freq = m->be->alloc(sizeof(float) * half);
    m->be->to_device(m->inv_freq, inv_freq, sizeof(float) * half);
    free(inv_freq);
}

static void load(Model *m, const char *dir, const Mesh *mesh, int score, uint64_t seed, DType dtype,
                 const Backend *be) {
    memset(m, 0, sizeof(*m));
    m->mesh = mesh;
    m->be = be;
    config_load(&m->cfg, dir);
    m->dtype = dtype == DTYPE_AUTO ? model_dtype_auto(&m->cfg) : dtype;
    m->kv_dtype = kv_dtype_default();
    if (bf16_dot_native_requested() && m->dtype != DTYPE_BF16)
        user_error("--cpu-bf16-dot native: %s loads as fp32 weights, whose matmul has no bf16 dot product (give --dtype bf16)", dir);
    if (score && !m->cfg.score_head) {   /* a score head on a causal LM: lm_head unused, nothing tied */
        m->cfg.score_head = 1;
        m->cfg.num_labels = 1;
        m->cfg.tie_embeddings = 0;
        m->score_seed = seed ? seed : 1;
    }
    m->head = m->cfg.score_head ? HEAD_SCORE : HEAD_LM;
    const ModelConfig *c = &m->cfg;
    check_layout(c, mesh);
    if (c->moe != MOE_NONE && be->owns)
        user_error("%s: model_type %s (Mixture-of-Experts) runs on the CPU backend only for now (--device cpu): the "
                   "routing is host code", dir, c->model_type);
    int tp = mesh->tp, pp = mesh->pp, s = mesh->pp_rank;
    m->n_heads_local = c->n_heads / tp;
    m->n_heads_kv_local = tp <= c->n_heads_kv ? c->n_heads_kv / tp : 1;
    m->hidden_local = c->moe == MOE_NONE ? c->hidden_dim / tp : 0;   /* MoE: no dense MLP */
    /* tp-invariant sums: a row-parallel layer's dot products and the vocabulary's sums run as leaves
     * whose boundaries every tp dividing TP_LEAVES shares (o_proj's at heads, down_proj's at F /
     * leaves; the vocabulary padded to a multiple of TP_LEAVES above tp 1, ceil(V / TP_LEAVES)
     * columns a leaf), so each rank's sum is a subtree of 1x1's tree (forward.c) */
    int tree = TP_LEAVES % tp == 0;
    m->o_leaves = tree ? pow2_divisor(c->n_heads, TP_LEAVES) / tp : 1;
    m->down_leaves = tree ? pow2_divisor(c->hidden_dim, TP_LEAVES) / tp : 1;
    m->moe_dim_local = c->moe_dim / tp;
    m->n_experts_local = c->n_experts / mesh->ep;   /* contiguous ids, the ep_rank-th block */
    m->expert_start = mesh->ep_rank * m->n_experts_local;
    m->shared_dim_local = c->shared_dim / tp;
    m->moe_leaves = tree && c->moe_dim ? pow2_divisor(c->moe_dim, TP_LEAVES) / tp : 1;
    m->shared_leaves = tree && c->shared_dim ? pow2_divisor(c->shared_dim, TP_LEAVES) / tp : 1;
    m->vocab_leaves = tree ? TP_LEAVES / tp : 1;
    int quantum = tp == 1 ? 1 : tree ? TP_LEAVES : tp;
    m->vocab_padded = (c->vocab_size + quantum - 1) / quantum * quantum;
    m->vocab_local = m->vocab_padded / tp;
    m->vocab_start = mesh->tp_rank * m->vocab_local;
    /* contiguous layer ranges, the first L % pp stages one layer longer */
    int base = c->n_layers / pp, extra = c->n_layers % pp;
    m->n_layers_local = base + (s < extra);
    m->layer_start = s * base + (s < extra ? s : extra);
    m->is_first = s == 0;
    m->is_last = s == pp - 1;
    m->w.layers = xcalloc(m->n_layers_local, sizeof(LayerWeights));

    SafeTensors *st = st_open_dir(dir);
    check_tensors(m, st);
    size_t n = 0, off = 0;
    for_each_param(m, count_param, &n, 0);
    m->n_params = n;
    m->params = be->alloc(dtype_size(m->dtype) * n);
    m->weight_bytes = (double)n * dtype_size(m->dtype);
    for_each_param(m, place_param, &off, 0);
    CHECK(off == n);
    Loader ld = {st, NULL, 0};
    for_each_param(m, load_param, &ld, 0);
    free(ld.stage);
    st_close(st);
    rope_init(m);
}

void model_load(Model *m, const char *dir, const Mesh *mesh, DType dtype, const Backend *be) {
    load(m, dir, mesh, 0, 0, dtype, be);
}
void model_load_score(Model *m, const char *dir, const Mesh *mesh, uint64_t seed, DType dtype, const Backend *be) {
    load(m, dir, mesh, 1, seed, dtype, be);
}

void run_state_init(RunState *s, const Model *m, int max_tokens, int max_seq) {
    const ModelConfig *c = &m->cfg;
    size_t N = (size_t)max_tokens, D = c->dim, Dh = c->head_dim;
    size_t qd = (size_t)m->n_heads_local * Dh, kvd = (size_t)m->n_heads_kv_local * Dh, F = m->hidden_local;
    size_t V = !m->is_last ? 0 : m->head == HEAD_SCORE ? 1 : (size_t)m->vocab_local;
    /* one arena: sizes in the order of RunState's fields */
    size_t lr = (size_t)m->lora_r, lw = m->lora_width;   /* LoRA's buffers (0 without) */
    size_t lp = m->is_last && m->head == HEAD_LM ? N : 0;   /* the targets' logprobs' buffers */
    size_t sizes[] = {N * D, N * D, N * qd, N * kvd, N * kvd, N * qd, N * D, N * F, N * F, N * V,
                      (size_t)max_seq * m->n_heads_local * backend_scratch_rows(m->be), N * Dh, N * LORA_TARGETS * lr, N * lw,
                      lp, lp, lp};
    float **slots[] = {&s->x, &s->xb, &s->q, &s->k, &s->v, &s->att, &s->xo, &s->hb, &s->hb2, &s->logits, &s->scratch,
                       &s->rope, &s->lora_u, &s->lora_tmp, &s->lp.lse, &s->lp.pick, &s->lp.lp};
    size_t total = 0;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) total += sizes[i];
    run_state_free(s);
    s->be = m->be;
    s->arena = m->be->alloc(sizeof(float) * total);
    s->n_floats = total;
    float *p = s->arena;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) { *slots[i] = p; p += sizes[i]; }
    s->ids = m->be->alloc(sizeof(int) * (4 * N + lp));   /* positions, tokens, logit rows, sequences; targets */
    s->lp.targets = s->ids + 4 * N;
    s->lp.rows = (int)lp;
    s->ids_host = xmalloc(sizeof(int) * 4 * N);
    s->max_tokens = max_tokens;
    s->max_seq = max_seq;
}

void run_state_free(RunState *s) {
    if (s->be) {
        s->be->free(s->arena);
        s->be->free(s->ids);
    }
    free(s->ids_host);
    memset(s, 0, sizeof(*s));
}

void model_alloc_state(Model *m, int max_tokens, int max_seq) { run_state_init(&m->s, m, max_tokens, max_seq); }

void model_free(Model *m) {
    if (m->free_z3) m->free_z3(m);       /* NULLs m->params where the slicing freed the arena */
    if (m->free_lora) m->free_lora(m);
    m->be->free(m->params);
    free(m->moe_src_grads);
    run_state_free(&m->s);
    free(m->w.layers);
    m->be->free(m->inv_freq);
    memset(m, 0, sizeof(*m));
}

void model_print_summary(const Model *m) {
    if (m->mesh->rank != 0) return;
    const ModelConfig *c = &m->cfg;
    const char *rope = c->rope_scaling == ROPE_LLAMA3 ? "llama3" : c->rope_scaling == ROPE_LINEAR ? "linear" : "none";
    fprintf(stderr, "+----------------------+------------+\n");
    fprintf(stderr, "| %-20s | %-10s |\n", "model_type", c->model_type);
    fprintf(stderr, "| %-20s | %10d |\n| %-20s | %10d |\n| %-20s | %10d |\n", "hidden_size D", c->dim,
            "intermediate F", c->hidden_dim, "layers L", c->n_layers);
    fprintf(stderr, "| %-20s | %10d |\n| %-20s | %10d |\n| %-20s | %10d |\n", "heads H", c->n_heads, "kv heads Hkv",
            c->n_heads_kv, "head_dim Dh", c->head_dim);
    fprintf(stderr, "| %-20s | %10d |\n| %-20s | %10d |\n", "vocab V", c->vocab_size, "sliding_window", c->sliding_window);
    fprintf(stderr, "| %-20s | %-10s |\n| %-20s | %10d |\n", "rope_scaling", rope, "tied embeddings", c->tie_embeddings);
    fprintf(stderr, "| %-20s | %-10s |\n", "head", m->head == HEAD_SCORE ? (m->score_seed ? "score(new)" : "score") : "lm");
    fprintf(stderr, "| %-20s | %10d |\n| %-20s | %10d |\n| %-20s | %10d |\n", "tp", m->mesh->tp, "pp", m->mesh->pp,
            "dp", m->mesh->dp);
    fprintf(stderr, "| %-20s | %-10s |\n", "dtype", dtype_name(m->dtype));
    fprintf(stderr, "| %-20s | %-10s |\n", "device", m->be->name);
    fprintf(stderr, "| %-20s | %10.2f |\n", "params MiB (rank 0)", m->n_params * (double)dtype_size(m->dtype) / (1 << 20));
    fprintf(stderr, "| %-20s | %10.2f |\n", "acts MiB (rank 0)", m->s.n_floats * 4.0 / (1 << 20));
    fprintf(stderr, "+----------------------+------------+\n");
}

MemPlan model_mem_plan(const Model *m) { return (MemPlan){m->weight_bytes, 0, 0, 0, m->s.n_floats * sizeof(float), 0, 0}; }

void model_print_memory_plan(const Model *m, const MemPlan *p) {
    const Mesh *mesh = m->mesh;
    enum { K = 6 };
    float mine[K] = {(float)p->weights, (float)p->master, (float)p->grads, (float)p->moments, (float)p->acts,
                     (float)p->kv};
    float *all = xmalloc(sizeof(float) * K * mesh->size);
    comm_all_gather(&mesh->group, mine, all, K);
    if (mesh->rank == 0) {
        /* each part's dtype in its heading: the weights change with --dtype, the cache with --kv-dtype */
        fprintf(stderr, "memory plan (MiB)     weights(%s) master(fp32) grads(fp32) moments(fp32) activations(fp32) "
                "kv_cache(%s)     total\n", dtype_name(m->dtype), dtype_name(m->kv_dtype));
        for (int r = 0; r < mesh->size; r++) {
            const float *v = all + K * r;
            double mib[K], tot = 0;
            for (int k = 0; k < K; k++) tot += mib[k] = v[k] / 1048576.0;
            static const char *zn[] = {"", "optimizer state", "gradients and optimizer state", "weights, gradients and optimizer state"};
            char zs[80] = "";   /* ZeRO at ep > 1: what is sharded over the edp group (zn) */
            if (p->expert_zero) snprintf(zs, sizeof zs, "; %s over edp %d", zn[p->expert_zero], mesh->edp);
            int er = r / mesh->tp % mesh->dp % mesh->ep, El = m->n_experts_local;   /* its experts (MoE) */
            if (El) fprintf(stderr, "  rank %-3d experts %d-%d of %d (ep %d%s)\n", r, er * El, er * El + El - 1, m->cfg.n_experts, mesh->ep, zs);
            fprintf(stderr, "  rank %-3d (tp %d pp %d) %13.2f %12.2f %11.2f %13.2f %17.2f %14.2f %9.2f\n", r,
                    r % mesh->tp, r / (mesh->tp * mesh->dp), mib[0], mib[1], mib[2], mib[3], mib[4], mib[5], tot);
        }
    }
    free(all);
}
