/* lora.c — see lora.h. The adapters' blocks follow the base weights' blocks (model_param_infos):
 * a column-parallel projection's block is rows [row0, row0 + rows) of its output, so B keeps those
 * rows and A is whole (the same on every tp rank); a row-parallel one's block is columns [col0,
 * col0 + cols) of its input, so A keeps those columns and B is whole. */
#include "runtime/lora.h"
#include "runtime/peft.h"
#include "runtime/safetensors.h"
#include "runtime/util.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int row_parallel(int t) { return t == LORA_O || t == LORA_DOWN; }
/* an adapter tensor's projection (LORA_*) and whether it is lora_B, from its PEFT name */
static int name_target(const ParamInfo *in, int *is_b) {
    int t = 0;
    while (!strstr(in->name, PEFT_TARGET_PATHS[t])) t++;
    *is_b = strstr(in->name, ".lora_B.") != NULL;
    return t;
}

void lora_targets_parse(const char *flag, const char *list, int target[LORA_TARGETS]) {
    memset(target, 0, sizeof(int) * LORA_TARGETS);
    if (!strcmp(list, "all-linear")) {
        for (int t = 0; t < LORA_TARGETS; t++) target[t] = 1;
        return;
    }
    char *s = xstrdup(list), *save = NULL;
    for (char *tok = strtok_r(s, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int t = 0;
        while (t < LORA_TARGETS && strcmp(tok, PEFT_TARGET_NAMES[t])) t++;
        if (t == LORA_TARGETS)
            user_error("%s %s: %s is not a projection: all-linear, or a list of q_proj,k_proj,v_proj,o_proj,gate_proj,"
                       "up_proj,down_proj", flag, list, tok);
        target[t] = 1;
    }
    free(s);
    int any = 0;
    for (int t = 0; t < LORA_TARGETS; t++) any |= target[t];
    if (!any)
        user_error("%s '%s': names no projection (all-linear, or a list of q_proj,k_proj,v_proj,o_proj,gate_proj,"
                   "up_proj,down_proj)", flag, list);
}

void lora_moe_check(const ModelConfig *c, const int target[LORA_TARGETS], const char *what) {
    if (c->moe == MOE_NONE || !(target[LORA_GATE] || target[LORA_UP] || target[LORA_DOWN])) return;
    user_error("%s: model_type %s is a Mixture-of-Experts model: only q_proj,k_proj,v_proj,o_proj may be targeted (the "
               "routed experts and the router are excluded: PEFT's suffix match would adapt every expert, and "
               "per-expert adapters under --ep are left for later)", what, c->model_type);
}

/* the base weight of projection t: its ParamInfo name ends so */
static int base_target(const ParamInfo *in) {
    for (int t = 0; t < LORA_TARGETS; t++) {
        char tail[64];
        snprintf(tail, sizeof tail, ".%s.weight", PEFT_TARGET_PATHS[t]);
        size_t n = strlen(in->name), k = strlen(tail);
        if (in->layer >= 0 && n > k && !strcmp(in->name + n - k, tail)) return t;
    }
    return -1;
}

/* A's element idx of the whole (r, in) tensor: kaiming_uniform(a = sqrt(5)) is U(-1/sqrt(in), 1/sqrt(in)) */
static float init_a(uint64_t key, size_t idx, int in) {
    uint64_t z = key + (idx + 1) * 0x9E3779B97F4A7C15ull;
    float u = (float)((splitmix64_next(&z) >> 40) * 0x1.0p-24);   /* [0, 1) */
    return (2.0f * u - 1.0f) / sqrtf((float)in);
}

/* m's adapters gone (model_free calls it: lora_new registers it) */
static void lora_free(Model *m) {
    Lora *lo = m->lora;
    m->be->free(lo->arena);
    free(lo->A);
    free(lo->B);
    free(lo->infos);
    free(lo);
    m->lora = NULL;
    m->free_lora = NULL;
    m->lora_r = 0;
    m->lora_width = 0;
}

Lora *lora_new(Model *m, int r, double alpha, int rslora, const int target[LORA_TARGETS], uint64_t seed) {
    CHECK(!m->lora);
    lora_moe_check(&m->cfg, target, "--lora-target");
    const Mesh *mesh = m->mesh;
    if (r < 1) user_error("--lora-r %d: must be >= 1", r);
    if (!(alpha > 0)) user_error("--lora-alpha %g: must be > 0", alpha);
    Lora *lo = xcalloc(1, sizeof *lo);
    lo->r = r;
    lo->alpha = alpha;
    lo->rslora = rslora;
    memcpy(lo->target, target, sizeof lo->target);
    lo->scale = (float)(rslora ? alpha / sqrt((double)r) : alpha / r);   /* PEFT: a Python float, then fp32 */
    lo->enabled = 1;
    lo->seed = seed;
    int L = m->n_layers_local;
    lo->A = xcalloc((size_t)L * LORA_TARGETS, sizeof(float *));
    lo->B = xcalloc((size_t)L * LORA_TARGETS, sizeof(float *));
    int n_base = model_param_infos(m, NULL, 0);
    ParamInfo *base = xmalloc(sizeof(ParamInfo) * n_base);
    model_param_infos(m, base, n_base);
    lo->infos = xcalloc((size_t)2 * L * LORA_TARGETS + 1, sizeof(ParamInfo));   /* + a score head */
    /* the tensors in PEFT's order: layer by layer, each projection's A then B */
    for (int l = 0; l < L; l++)
        for (int t = 0; t < LORA_TARGETS; t++) {
            if (!target[t]) continue;
            const ParamInfo *w = NULL;
            for (int i = 0; i < n_base && !w; i++) if (base[i].layer == l && base_target(&base[i]) == t) w = &base[i];
            CHECK(w);
            int gl = m->layer_start + l, tp = mesh->tp;
            for (int b = 0; b < 2; b++) {
                ParamInfo *in = &lo->infos[lo->n_infos++];
                snprintf(in->name, sizeof in->name, PEFT_LAYERS "%d.%s.lora_%c.weight", gl, PEFT_TARGET_PATHS[t],
                         b ? 'B' : 'A');
                in->layer = l;
                in->decay = 1;
                int whole = row_parallel(t) ? b : !b;   /* replicated over tp: B of o/down, A of the others */
                in->replicas = whole ? tp : w->replicas;   /* k/v's B: a replicated kv head's, as its weight */
                in->tp_replicated = whole && tp > 1;
                in->norm_once = mesh->tp_rank % in->replicas == 0;
                if (!b) {   /* A (r, in) */
                    in->rows = in->rows_global = r;
                    in->cols_global = w->cols_global;
                    in->cols = row_parallel(t) ? w->cols : w->cols_global;
                    in->col0 = row_parallel(t) ? w->col0 : 0;
                } else {    /* B (out, r) */
                    in->cols = in->cols_global = r;
                    in->rows_global = w->rows_global;
                    in->rows = row_parallel(t) ? w->rows_global : w->rows;
                    in->row0 = row_parallel(t) ? 0 : w->row0;
                }
                in->numel = (size_t)in->rows * in->cols;
                in->offset = lo->n;
                lo->n += in->numel;
            }
        }
    free(base);
    ParamInfo *sc = NULL;   /* a score head: trained in full (PEFT's modules_to_save), last in the arena */
    if (m->head == HEAD_SCORE && m->is_last) {
        sc = &lo->infos[lo->n_infos++];
        snprintf(sc->name, sizeof sc->name, PEFT_SCORE);
        sc->layer = -1;
        sc->decay = 1;
        sc->tp_replicated = mesh->tp > 1;
        sc->replicas = mesh->tp;
        sc->norm_once = mesh->tp_rank == 0;
        sc->rows = sc->rows_global = m->cfg.num_labels;
        sc->cols = sc->cols_global = m->cfg.dim;
        sc->numel = (size_t)sc->rows * sc->cols;
        sc->offset = lo->n;
        lo->n += sc->numel;
    }
    lo->arena = m->be->alloc(sizeof(float) * (lo->n ? lo->n : 1));   /* zero: B */
    float *host = xcalloc(lo->n ? lo->n : 1, sizeof(float));
    if (sc) {   /* the model's head, upcast; the forward then reads the arena's */
        size_t es = dtype_size(m->dtype);
        void *raw = xmalloc(es * sc->numel);
        m->be->to_host(raw, m->w.score, es * sc->numel);
        for (size_t e = 0; e < sc->numel; e++) host[sc->offset + e] = weight_at(raw, m->dtype, e);
        free(raw);
        lo->score = lo->arena + sc->offset;
    }
    for (int i = 0; i < lo->n_infos; i++) {
        ParamInfo *in = &lo->infos[i];
        if (in->layer < 0) continue;
        int is_b, t = name_target(in, &is_b);
        float *p = lo->arena + in->offset;
        if (is_b) { lo->B[in->layer * LORA_TARGETS + t] = p; continue; }
        lo->A[in->layer * LORA_TARGETS + t] = p;
        uint64_t key = seed ^ ((uint64_t)(m->layer_start + in->layer) << 32) ^ ((uint64_t)t << 56);
        for (int k = 0; k < in->rows; k++)
            for (int j = 0; j < in->cols; j++)
                host[in->offset + (size_t)k * in->cols + j] = init_a(key, (size_t)k * in->cols_global + in->col0 + j, in->cols_global);
    }
    m->be->to_device(lo->arena, host, sizeof(float) * lo->n);
    free(host);
    if (lo->score) lo->score_base = m->w.score, m->w.score = lo->score;
    m->lora = lo;
    m->free_lora = lora_free;
    m->lora_r = r;
    size_t D = m->cfg.dim, F = m->hidden_local, qd = (size_t)m->n_heads_local * m->cfg.head_dim, w = F > D ? F : D;
    m->lora_width = qd > w ? qd : w;   /* an adapter's widest output or input */
    return lo;
}

uint64_t lora_micro_key(const Model *m, int micro) {
    const Lora *lo = m->lora;
    if (!lo || !(lo->dropout > 0)) return 0;
    uint64_t t0 = lo->token0 ? (uint64_t)lo->token0[micro] : 0, at = lo->token0 ? 0 : (uint64_t)micro;
    if (t0 >> 24) rank_error("--lora-dropout: a step of more than 2^24 tokens (micro-batch %d starts at token %llu)",
                             micro, (unsigned long long)t0);
    uint64_t k = splitmix64_mix(lo->seed ^ splitmix64_mix((uint64_t)lo->step * 0x100000001ull + at + 1)) & ((1ull << 40) - 1);
    return (k ? k : 1) | t0 << 40;
}

DType lora_score_dtype(const Model *m) { return m->lora && m->lora->score ? DTYPE_F32 : m->dtype; }

void lora_read_blocks(const Model *m, const char *path, float *host) {
    const Lora *lo = m->lora;
    if (!file_exists(path)) user_error("%s: not found (a PEFT adapter directory's weights)", path);
    SafeTensors *st = st_open_file(path);
    for (int i = 0; i < lo->n_infos; i++) {
        const ParamInfo *in = &lo->infos[i];
        if (!st_find(st, in->name)) user_error("%s: tensor %s missing (--lora-target names it)", path, in->name);
        float *buf = host + in->offset;
        st_read_block(st, in->name, in->rows_global, in->cols_global, in->row0, in->rows, in->col0, in->cols, buf, DTYPE_F32);
        for (size_t e = 0; e < in->numel; e++)
            if (!isfinite(buf[e])) user_error("%s: tensor %s holds a non-finite value", path, in->name);
    }
    st_close(st);
}

int lora_write_blocks(const Model *m, const float *host, const char *path, char *err, size_t cap) {
    const Lora *lo = m->lora;
    const Mesh *mesh = m->mesh;
    const ModelConfig *c = &m->cfg;
    int r = lo->r, L = c->n_layers;
    /* every tensor whole on every rank: each element written by the one rank that holds it (dp rank
     * 0, the first of its tp replicas), zeros elsewhere, summed over the mesh (exact) */
    int64_t outs[LORA_TARGETS], ins[LORA_TARGETS];
    size_t per = 0, off[LORA_TARGETS];
    for (int t = 0; t < LORA_TARGETS; t++) {
        peft_target_shape(c, t, &outs[t], &ins[t]);
        off[t] = per;
        if (lo->target[t]) per += (size_t)r * (ins[t] + outs[t]);
    }
    size_t score_n = m->head == HEAD_SCORE ? (size_t)c->num_labels * c->dim : 0;   /* after the layers */
    float *all = xcalloc((size_t)L * per + score_n + 1, sizeof(float));
    if (mesh->dp_rank == 0)
        for (int i = 0; i < lo->n_infos; i++) {
            const ParamInfo *in = &lo->infos[i];
            if (mesh->tp_rank % in->replicas) continue;
            if (in->layer < 0) {
                memcpy(all + (size_t)L * per, host + in->offset, sizeof(float) * in->numel);
                continue;
            }
            int b, t = name_target(in, &b);
            float *g = all + (size_t)(m->layer_start + in->layer) * per + off[t] + (b ? (size_t)r * ins[t] : 0);
            for (int k = 0; k < in->rows; k++)
                memcpy(g + (size_t)(in->row0 + k) * in->cols_global + in->col0, host + in->offset + (size_t)k * in->cols,
                       sizeof(float) * in->cols);
        }
    comm_all_reduce_sum(&mesh->group, all, (size_t)L * per + score_n + 1);
    err[0] = 0;
    if (mesh->rank == 0) {
        StWriteTensor *ts = xcalloc((size_t)2 * L * LORA_TARGETS + 1, sizeof(StWriteTensor));
        char (*names)[128] = xcalloc((size_t)2 * L * LORA_TARGETS + 1, sizeof(*names));
        int n = 0;
        for (int l = 0; l < L; l++)
            for (int t = 0; t < LORA_TARGETS; t++) {
                if (!lo->target[t]) continue;
                for (int b = 0; b < 2; b++) {
                    snprintf(names[n], sizeof names[n], PEFT_LAYERS "%d.%s.lora_%c.weight", l, PEFT_TARGET_PATHS[t],
                             b ? 'B' : 'A');
                    ts[n] = (StWriteTensor){names[n], 2, {b ? outs[t] : r, b ? r : ins[t]},
                                            all + (size_t)l * per + off[t] + (b ? (size_t)r * ins[t] : 0)};
                    n++;
                }
            }
        if (score_n)
            ts[n++] = (StWriteTensor){PEFT_SCORE, 2, {c->num_labels, c->dim}, all + (size_t)L * per};
        if (st_write(path, ts, n, ST_F32) != 0) snprintf(err, cap, "%s: cannot write: %s", path, strerror(errno));
        free(ts);
        free(names);
    }
    free(all);
    return comm_first_error(&mesh->group, err, cap) ? -1 : 0;
}

int lora_save(const Model *m, const char *dir, const char *base, char *err, size_t cap) {
    const Lora *lo = m->lora;
    const Mesh *mesh = m->mesh;
    float *host = xmalloc(sizeof(float) * (lo->n ? lo->n : 1));
    m->be->to_host(host, lo->arena, sizeof(float) * lo->n);
    char *wpath = path_join(dir, "adapter_model.safetensors");
    int rc = lora_write_blocks(m, host, wpath, err, cap);
    free(host);
    free(wpath);
    if (rc) return -1;
    if (mesh->rank == 0) {
        char *cpath = path_join(dir, "adapter_config.json");
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "peft_type", "LORA");
        cJSON_AddStringToObject(j, "task_type", m->head == HEAD_SCORE ? "SEQ_CLS" : "CAUSAL_LM");
        cJSON_AddStringToObject(j, "base_model_name_or_path", base);
        cJSON_AddNumberToObject(j, "r", lo->r);
        cJSON_AddNumberToObject(j, "lora_alpha", lo->alpha);
        cJSON_AddNumberToObject(j, "lora_dropout", round(lo->dropout * 1e6) / 1e6);   /* the flag as given */
        cJSON_AddBoolToObject(j, "use_rslora", lo->rslora);
        cJSON_AddBoolToObject(j, "use_dora", 0);
        cJSON_AddBoolToObject(j, "fan_in_fan_out", 0);
        cJSON_AddStringToObject(j, "bias", "none");
        cJSON_AddBoolToObject(j, "inference_mode", 1);
        cJSON_AddBoolToObject(j, "init_lora_weights", 1);
        cJSON *tm = cJSON_AddArrayToObject(j, "target_modules");
        for (int t = 0; t < LORA_TARGETS; t++)
            if (lo->target[t]) cJSON_AddItemToArray(tm, cJSON_CreateString(PEFT_TARGET_NAMES[t]));
        if (m->head == HEAD_SCORE) {   /* PEFT's sequence-classification adapters name both */
            cJSON *ms = cJSON_AddArrayToObject(j, "modules_to_save");
            cJSON_AddItemToArray(ms, cJSON_CreateString("classifier"));
            cJSON_AddItemToArray(ms, cJSON_CreateString("score"));
        } else {
            cJSON_AddNullToObject(j, "modules_to_save");
        }
        char *text = cJSON_Print(j);
        cJSON_Delete(j);
        if (write_file_atomic(cpath, text, strlen(text)) != 0)
            snprintf(err, cap, "%s: cannot write: %s", cpath, strerror(errno));
        free(text);
        free(cpath);
        if (!err[0] && m->cfg.has_reward_stats) {   /* a reward model's eval statistics (runtime/adapter.h) */
            char *spath = path_join(dir, PEFT_REWARD_STATS), stats[128];
            int n = snprintf(stats, sizeof stats, "{\"mean\": %.9g, \"std\": %.9g}\n", m->cfg.reward_mean, m->cfg.reward_std);
            if (write_file_atomic(spath, stats, (size_t)n) != 0)
                snprintf(err, cap, "%s: cannot write: %s", spath, strerror(errno));
            free(spath);
        }
    }
    return comm_first_error(&mesh->group, err, cap) ? -1 : 0;
}
