/* adapter.c — see adapter.h. Reading: the config's fields, then every tensor of the file is matched
 * to (layer, module, lora_A | lora_B) or the score head and checked against the base model's
 * global shapes, on every rank and for every layer. Merging walks this rank's parameter table
 * (model_param_infos: the block [row0, row0 + rows) x [col0, col0 + cols) of each weight), so each
 * delta is sharded exactly as its base weight: column-parallel q/k/v/gate/up take the block's rows
 * of B (and all of A), row-parallel o/down the block's columns of A (and all of B); a pp stage
 * merges its own layers only. */
#include "runtime/adapter.h"
#include "runtime/args.h"
#include "runtime/lora.h"
#include "runtime/peft.h"
#include "runtime/safetensors.h"
#include "runtime/util.h"
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *config_path, *weights_path;
    int r;                    /* the rank: lora_A (r, in), lora_B (out, r) */
    int target[LORA_TARGETS]; /* target_modules names it */
    int save_score;           /* modules_to_save names "score" */
    float scale;              /* lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora */
    double alpha, dropout;    /* lora_alpha, lora_dropout (0 when absent) */
    int rslora;               /* use_rslora */
} Adapter;

/* ---- adapter_config.json ------------------------------------------------------------------ */

static const cJSON *field(const cJSON *j, const char *name) { return cJSON_GetObjectItemCaseSensitive(j, name); }
static int unset(const cJSON *e) { return !e || cJSON_IsNull(e); }
/* a boolean field, false when absent or null */
static int flag(const cJSON *j, const char *path, const char *name) {
    const cJSON *e = field(j, name);
    if (unset(e)) return 0;
    if (!cJSON_IsBool(e)) user_error("%s: field \"%s\" must be true or false", path, name);
    return cJSON_IsTrue(e);
}
/* a field that must be absent, null, empty ({} or []) or false: what Tandem does not support */
static void refuse_set(const cJSON *j, const char *path, const char *name, const char *why) {
    const cJSON *e = field(j, name);
    if (unset(e) || cJSON_IsFalse(e) || ((cJSON_IsObject(e) || cJSON_IsArray(e)) && !cJSON_GetArraySize(e))) return;
    user_error("%s: field \"%s\" is set: %s", path, name, why);
}

static int target_named(const char *s) {
    for (int t = 0; t < LORA_TARGETS; t++)
        if (!strcmp(s, PEFT_TARGET_NAMES[t]) || !strcmp(s, PEFT_TARGET_PATHS[t])) return t;
    return -1;
}

static void config_read(Adapter *a) {
    const char *cp = a->config_path;
    char *text = read_file(cp, NULL);
    if (!text)
        user_error("%s: not found (--adapter takes a PEFT adapter directory: adapter_config.json and "
                   "adapter_model.safetensors)", cp);
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(j)) user_error("%s: not a JSON object", cp);
    const cJSON *e = field(j, "peft_type");
    if (!unset(e) && (!cJSON_IsString(e) || strcmp(e->valuestring, "LORA")))
        user_error("%s: field \"peft_type\" is %s: only LORA adapters are supported", cp,
                   cJSON_IsString(e) ? e->valuestring : "not a string");
    e = field(j, "r");
    if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 1 || e->valuedouble > 1 << 20)
        user_error("%s: field \"r\" must be a positive integer (the LoRA rank)", cp);
    a->r = (int)e->valuedouble;
    e = field(j, "lora_alpha");
    if (!cJSON_IsNumber(e) || !(e->valuedouble > 0 && e->valuedouble <= ADAPTER_ALPHA_MAX))
        user_error("%s: field \"lora_alpha\" must be a number > 0 and <= %g (the adapters' scale is lora_alpha / r)",
                   cp, ADAPTER_ALPHA_MAX);
    double alpha = a->alpha = e->valuedouble;
    int rslora = a->rslora = flag(j, cp, "use_rslora");
    e = field(j, "lora_dropout");
    if (!unset(e) && (!cJSON_IsNumber(e) || !(e->valuedouble >= 0 && e->valuedouble < 1)))
        user_error("%s: field \"lora_dropout\" must be a number in [0, 1)", cp);
    a->dropout = unset(e) ? 0.0 : e->valuedouble;
    /* PEFT: scaling = lora_alpha / r (a Python float), rounded to fp32 where it multiplies B A */
    a->scale = (float)(rslora ? alpha / sqrt((double)a->r) : alpha / a->r);
    if (flag(j, cp, "use_dora"))
        user_error("%s: field \"use_dora\" is true: DoRA adapters are not supported (plain LoRA only)", cp);
    if (flag(j, cp, "fan_in_fan_out"))
        user_error("%s: field \"fan_in_fan_out\" is true: that is GPT-2's Conv1D layout; LLaMA-family projections "
                   "are nn.Linear (false)", cp);
    e = field(j, "bias");
    if (!unset(e) && (!cJSON_IsString(e) || strcmp(e->valuestring, "none")))
        user_error("%s: field \"bias\" is %s: only \"none\" is supported (the adapter trains no biases)", cp,
                   cJSON_IsString(e) ? e->valuestring : "not a string");
    refuse_set(j, cp, "rank_pattern", "per-module ranks are not supported (one r for every module)");
    refuse_set(j, cp, "alpha_pattern", "per-module alphas are not supported (one lora_alpha for every module)");
    refuse_set(j, cp, "layers_to_transform", "adapting some layers only is not supported (every layer)");
    refuse_set(j, cp, "layer_replication", "layer replication is not supported");

    e = field(j, "target_modules");
    if (cJSON_IsString(e)) {
        if (strcmp(e->valuestring, "all-linear"))
            user_error("%s: field \"target_modules\" is the pattern \"%s\": patterns are not supported; list the "
                       "modules (q_proj k_proj v_proj o_proj gate_proj up_proj down_proj) or give \"all-linear\"",
                       cp, e->valuestring);
        for (int t = 0; t < LORA_TARGETS; t++) a->target[t] = 1;   /* PEFT's all-linear: every Linear but lm_head */
    } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) > 0) {
        const cJSON *s;
        cJSON_ArrayForEach(s, e) {
            int t = cJSON_IsString(s) ? target_named(s->valuestring) : -1;
            if (t < 0)
                user_error("%s: field \"target_modules\" names %s: supported are the LLaMA-family projections q_proj "
                           "k_proj v_proj o_proj gate_proj up_proj down_proj (a Mixture-of-Experts model's q_proj "
                           "k_proj v_proj o_proj only: its routed experts and router are excluded)", cp,
                           cJSON_IsString(s) ? s->valuestring : "a non-string");
            a->target[t] = 1;
        }
    } else {
        user_error("%s: field \"target_modules\" must be a non-empty list of module names or \"all-linear\"", cp);
    }
    e = field(j, "modules_to_save");
    if (!unset(e)) {
        if (!cJSON_IsArray(e)) user_error("%s: field \"modules_to_save\" must be a list of module names or null", cp);
        const cJSON *s;
        cJSON_ArrayForEach(s, e) {
            /* PEFT puts "classifier" and "score" in every sequence-classification adapter; the LLaMA
             * family has a score head only */
            if (cJSON_IsString(s) && !strcmp(s->valuestring, "score")) a->save_score = 1;
            else if (!cJSON_IsString(s) || strcmp(s->valuestring, "classifier"))
                user_error("%s: field \"modules_to_save\" names %s: only a sequence-classification adapter's \"score\" "
                           "head is supported", cp, cJSON_IsString(s) ? s->valuestring : "a non-string");
        }
    }
    cJSON_Delete(j);
}

/* ---- adapter_model.safetensors ------------------------------------------------------------- */

/* A tensor name as (layer, target, 0 = lora_A | 1 = lora_B); 0 if it is not of that form. */
static int parse_lora_name(const char *name, int *layer, int *target, int *b) {
    size_t np = strlen(PEFT_LAYERS);
    if (strncmp(name, PEFT_LAYERS, np)) return 0;
    const char *p = name + np;
    char *end;
    long l = strtol(p, &end, 10);
    if (end == p || *end != '.' || l < 0 || l > 1 << 20) return 0;
    p = end + 1;
    for (int t = 0; t < LORA_TARGETS; t++) {
        size_t n = strlen(PEFT_TARGET_PATHS[t]);
        if (strncmp(p, PEFT_TARGET_PATHS[t], n)) continue;
        if (!strcmp(p + n, ".lora_A.weight")) *b = 0;
        else if (!strcmp(p + n, ".lora_B.weight")) *b = 1;
        else return 0;
        *layer = (int)l;
        *target = t;
        return 1;
    }
    return 0;
}

static void shape_text(const StTensor *t, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = 0;
    for (int d = 0; d < t->ndim && len < cap; d++)
        len += snprintf(buf + len, cap - len, d ? ", %lld" : "%lld", (long long)t->shape[d]);
}

/* Every tensor of the file explained by the config, every targeted module of every layer present,
 * every shape the base model's (and the ranks of A and B the same, and r). */
static void check_tensors(const Adapter *a, const Model *m, const SafeTensors *st) {
    const ModelConfig *c = &m->cfg;
    const char *wp = a->weights_path;
    int L = c->n_layers;
    const StTensor **found = xcalloc((size_t)L * LORA_TARGETS * 2, sizeof(StTensor *));   /* (L, targets, A|B) */
    for (int i = 0; i < st->n_tensors; i++) {
        const StTensor *t = &st->tensors[i];
        char shape[96];
        shape_text(t, shape, sizeof shape);
        if (!strcmp(t->name, PEFT_SCORE)) {
            if (!a->save_score)
                user_error("%s: tensor %s: a score head, but adapter_config.json's field \"modules_to_save\" does not "
                           "name \"score\"", wp, t->name);
            if (m->head != HEAD_SCORE)
                user_error("%s: tensor %s: a sequence-classification adapter's score head, but the base model is a "
                           "causal LM", wp, t->name);
            if (t->ndim != 2 || t->shape[0] != c->num_labels || t->shape[1] != c->dim)
                user_error("%s: tensor %s has shape [%s], expected [%d, %d] (the base model's score.weight)", wp,
                           t->name, shape, c->num_labels, c->dim);
            continue;
        }
        int layer, target, b;
        if (!parse_lora_name(t->name, &layer, &target, &b))
            user_error("%s: tensor %s: not a LoRA weight of a LLaMA-family projection (expected names like "
                       PEFT_LAYERS "0.self_attn.q_proj.lora_A.weight)", wp, t->name);
        if (!a->target[target])
            user_error("%s: tensor %s: adapter_config.json's field \"target_modules\" does not name %s", wp, t->name,
                       PEFT_TARGET_NAMES[target]);
        if (layer >= L)
            user_error("%s: tensor %s: layer %d, but the base model has %d layers (num_hidden_layers)", wp, t->name,
                       layer, L);
        found[((size_t)layer * LORA_TARGETS + target) * 2 + b] = t;
    }
    for (int l = 0; l < L; l++)
        for (int t = 0; t < LORA_TARGETS; t++) {
            if (!a->target[t]) continue;
            const StTensor *A = found[((size_t)l * LORA_TARGETS + t) * 2],
                           *B = found[((size_t)l * LORA_TARGETS + t) * 2 + 1];
            if (!A || !B)
                user_error("%s: tensor " PEFT_LAYERS "%d.%s.%s.weight missing (target_modules names %s)", wp, l,
                           PEFT_TARGET_PATHS[t], A ? "lora_B" : "lora_A", PEFT_TARGET_NAMES[t]);
            char sa[96], sb[96];
            shape_text(A, sa, sizeof sa);
            shape_text(B, sb, sizeof sb);
            if (A->ndim != 2 || B->ndim != 2)
                user_error("%s: tensors %s [%s] and %s [%s]: LoRA weights are matrices", wp, A->name, sa, B->name, sb);
            if (A->shape[0] != B->shape[1])
                user_error("%s: tensors %s [%s] and %s [%s]: ranks differ (lora_A's rows, lora_B's columns)", wp,
                           A->name, sa, B->name, sb);
            if (A->shape[0] != a->r)
                user_error("%s: tensor %s [%s]: rank %lld, but adapter_config.json's field \"r\" is %d", wp, A->name, sa,
                           (long long)A->shape[0], a->r);
            int64_t out, in;
            peft_target_shape(c, t, &out, &in);
            if (A->shape[1] != in)
                user_error("%s: tensor %s has shape [%s], expected [%d, %lld]: the base model's %s.weight is [%lld, %lld]",
                           wp, A->name, sa, a->r, (long long)in, PEFT_TARGET_NAMES[t], (long long)out, (long long)in);
            if (B->shape[0] != out)
                user_error("%s: tensor %s has shape [%s], expected [%lld, %d]: the base model's %s.weight is [%lld, %lld]",
                           wp, B->name, sb, (long long)out, a->r, PEFT_TARGET_NAMES[t], (long long)out, (long long)in);
        }
    free(found);
}

/* ---- the merge ----------------------------------------------------------------------------- */

/* W (rows, cols), this rank's block of a weight of the arena (in the backend's memory), += scale *
 * B[row0 : row0 + rows, :] A[:, col0 : col0 + cols] in fp32: each element's sum over the rank in
 * order k = 0 .. r-1, times scale, added to the weight's fp32 value, stored (bf16: rounded once). */
static void merge_block(Model *m, const Adapter *a, const SafeTensors *st, const ParamInfo *in, int layer, int t) {
    char name_a[160], name_b[160];
    snprintf(name_a, sizeof name_a, PEFT_LAYERS "%d.%s.lora_A.weight", layer, PEFT_TARGET_PATHS[t]);
    snprintf(name_b, sizeof name_b, PEFT_LAYERS "%d.%s.lora_B.weight", layer, PEFT_TARGET_PATHS[t]);
    int r = a->r, rows = in->rows, cols = in->cols;
    float *B = xmalloc(sizeof(float) * (size_t)rows * r);   /* (rows, r) the block's rows of lora_B */
    float *A = xmalloc(sizeof(float) * (size_t)r * cols);   /* (r, cols) the block's columns of lora_A */
    st_read_block(st, name_b, in->rows_global, r, in->row0, rows, 0, r, B, DTYPE_F32);
    st_read_block(st, name_a, r, in->cols_global, 0, r, in->col0, cols, A, DTYPE_F32);
    DType dt = m->dtype;
    size_t es = dtype_size(dt), numel = (size_t)rows * cols;
    void *slot = (char *)m->params + in->offset * es, *w = xmalloc(es * numel);   /* w (rows, cols) on the host */
    m->be->to_host(w, slot, es * numel);
    float scale = a->scale;
    long long bad = -1;   /* the first non-finite merged element */
#pragma omp parallel
    {
        float *acc = xmalloc(sizeof(float) * (size_t)cols);   /* (cols) one row of B A */
#pragma omp for schedule(static)
        for (int i = 0; i < rows; i++) {
            for (int j = 0; j < cols; j++) acc[j] = 0.0f;
            for (int k = 0; k < r; k++) {
                float bik = B[(size_t)i * r + k];
                const float *ak = A + (size_t)k * cols;
                for (int j = 0; j < cols; j++) acc[j] += bik * ak[j];
            }
            for (int j = 0; j < cols; j++) {
                size_t e = (size_t)i * cols + j;
                float v = weight_at(w, dt, e) + acc[j] * scale;
                if (dt == DTYPE_BF16) ((uint16_t *)w)[e] = f32_to_bf16(v);
                else ((float *)w)[e] = v;
                if (!isfinite(weight_at(w, dt, e))) {
#pragma omp critical
                    if (bad < 0 || (long long)e < bad) bad = (long long)e;
                }
            }
        }
        free(acc);
    }
    /* only this rank merged its block: it reports */
    if (bad >= 0)
        rank_error("%s: %s and %s give %s a non-finite value at [%lld, %lld]: refusing the adapter", a->weights_path,
                   name_a, name_b, in->name, in->row0 + bad / cols, in->col0 + bad % cols);
    m->be->to_device(slot, w, es * numel);
    free(w);
    free(A);
    free(B);
}

/* The score head of a sequence-classification adapter replaces the base's (replicated; last stage). */
static void replace_score(Model *m, const Adapter *a, const SafeTensors *st) {
    if (!m->is_last) return;
    const ModelConfig *c = &m->cfg;
    size_t es = dtype_size(m->dtype), numel = (size_t)c->num_labels * c->dim;
    void *h = xmalloc(es * numel);
    st_read_block(st, PEFT_SCORE, c->num_labels, c->dim, 0, c->num_labels, 0, c->dim, h, m->dtype);
    for (size_t i = 0; i < numel; i++)
        if (!isfinite(weight_at(h, m->dtype, i)))
            rank_error("%s: tensor " PEFT_SCORE " holds a non-finite value: refusing the adapter", a->weights_path);
    m->be->to_device(m->w.score, h, es * numel);
    m->score_seed = 0;   /* read, not initialised */
    free(h);
}

static void adapter_paths(Adapter *a, const char *dir) {
    if (!dir_exists(dir)) user_error("--adapter %s: not a directory (a PEFT adapter directory: adapter_config.json and "
                                     "adapter_model.safetensors)", dir);
    a->config_path = path_join(dir, "adapter_config.json");
    a->weights_path = path_join(dir, "adapter_model.safetensors");
}

int adapter_reward_stats(const char *dir, float *mean, float *std) {
    char *path = path_join(dir, PEFT_REWARD_STATS), *text = read_file(path, NULL);
    int ok = 0;
    if (text) {
        cJSON *j = cJSON_Parse(text);
        const cJSON *mu = field(j, "mean"), *sd = field(j, "std");
        if (!cJSON_IsNumber(mu) || !cJSON_IsNumber(sd) || !isfinite(mu->valuedouble) || !(sd->valuedouble > 0) ||
            !isfinite(sd->valuedouble))
            user_error("%s: needs a finite \"mean\" and a positive \"std\" (the reward model's eval statistics)", path);
        *mean = (float)mu->valuedouble;
        *std = (float)sd->valuedouble;
        ok = 1;
        cJSON_Delete(j);
        free(text);
    }
    free(path);
    return ok;
}

void adapter_merge(Model *m, const char *dir) {
    Adapter a = {0};
    adapter_paths(&a, dir);
    config_read(&a);
    lora_moe_check(&m->cfg, a.target, a.config_path);   /* before the tensors: the names would not parse */
    if (!file_exists(a.weights_path)) {
        char *bin = path_join(dir, "adapter_model.bin");
        int pickle = file_exists(bin);
        free(bin);
        user_error("%s: not found%s", a.weights_path,
                   pickle ? " (adapter_model.bin is a pickle, not read: save with safe_serialization=True)" : "");
    }
    SafeTensors *st = st_open_file(a.weights_path);
    check_tensors(&a, m, st);
    int n = model_param_infos(m, NULL, 0);
    ParamInfo *infos = xmalloc(sizeof(ParamInfo) * (size_t)n);
    model_param_infos(m, infos, n);
    for (int i = 0; i < n; i++) {
        int layer;
        char path[64];
        /* "model.layers.N.<path>.weight": this stage's layers, this rank's block */
        if (sscanf(infos[i].name, "model.layers.%d.%63[a-z_.]", &layer, path) != 2) continue;
        size_t pl = strlen(path);
        if (pl < 7 || strcmp(path + pl - 7, ".weight")) continue;
        path[pl - 7] = 0;
        for (int t = 0; t < LORA_TARGETS; t++)
            if (a.target[t] && !strcmp(path, PEFT_TARGET_PATHS[t])) merge_block(m, &a, st, &infos[i], layer, t);
    }
    if (a.save_score && m->head == HEAD_SCORE && st_find(st, PEFT_SCORE)) replace_score(m, &a, st);
    if (m->head == HEAD_SCORE && adapter_reward_stats(dir, &m->cfg.reward_mean, &m->cfg.reward_std))
        m->cfg.has_reward_stats = 1;   /* a LoRA reward model's (its config.json would hold them) */
    free(infos);
    st_close(st);
    free(a.config_path);
    free(a.weights_path);
}

void adapter_config(const char *dir, AdapterConfig *c) {
    Adapter a = {0};
    adapter_paths(&a, dir);
    config_read(&a);
    *c = (AdapterConfig){.r = a.r, .rslora = a.rslora, .alpha = a.alpha, .dropout = a.dropout};
    memcpy(c->target, a.target, sizeof c->target);
    snprintf(c->path, sizeof c->path, "%s", a.config_path);
    free(a.config_path);
    free(a.weights_path);
}

void lora_merge(Model *m, const char *dir) {
    Lora *lo = m->lora;
    lo->enabled = 0;
    if (lo->score) m->w.score = lo->score_base;   /* the checkpoint's trained head replaces it */
    adapter_merge(m, dir);
}

int adapter_has_score(const char *dir) {
    Adapter a = {0};
    adapter_paths(&a, dir);
    free(a.config_path);
    char *p = a.weights_path;
    int has = 0;
    if (file_exists(p)) {
        SafeTensors *st = st_open_file(p);
        has = st_find(st, PEFT_SCORE) != NULL;
        st_close(st);
    }
    free(p);
    return has;
}

/* the --lora-target text of a target set into buf: "all-linear" or the comma list */
static const char *targets_text(const int target[LORA_TARGETS], char buf[96]) {
    size_t n = 0;
    int all = 1;
    buf[0] = 0;
    for (int t = 0; t < LORA_TARGETS; t++) {
        all &= target[t];
        if (target[t]) n += (size_t)snprintf(buf + n, 96 - n, "%s%s", n ? "," : "", PEFT_TARGET_NAMES[t]);
    }
    return all ? "all-linear" : buf;
}

void lora_options_check(int *r, float *alpha, const char **target, int *rslora, float *dropout, const char *resume,
                        const char *role) {
    char *dir = resume ? (role ? path_join(resume, role) : xstrdup(resume)) : NULL;
    char *cpath = dir ? path_join(dir, "adapter_config.json") : NULL;
    int ck = cpath && file_exists(cpath);
    free(cpath);
    if (ck) {   /* a LoRA checkpoint: its adapter_config.json, unless a flag disagrees */
        AdapterConfig c;
        adapter_config(dir, &c);
        free(dir);
        static char taken[96];   /* *target from here on */
        int want[LORA_TARGETS];
        if (args_given(target)) lora_targets_parse("--lora-target", *target, want);
        if (args_given(r) && *r != c.r)
            user_error("--lora-r %d: --resume %s is a LoRA checkpoint of rank %d (%s: \"r\"); leave the flag out to "
                       "continue with it", *r, resume, c.r, c.path);
        if (args_given(alpha) && *alpha != (float)c.alpha)
            user_error("--lora-alpha %g: the checkpoint's %s has lora_alpha %g; leave the flag out to continue with it",
                       *alpha, c.path, c.alpha);
        if (args_given(target) && memcmp(want, c.target, sizeof want))
            user_error("--lora-target %s: the checkpoint's %s has target_modules %s; leave the flag out to continue "
                       "with them", *target, c.path, targets_text(c.target, taken));
        if (args_given(rslora) && !c.rslora)
            user_error("--lora-rslora: the checkpoint's %s has use_rslora false; leave the flag out to continue with it",
                       c.path);
        if (args_given(dropout) && *dropout != (float)c.dropout)
            user_error("--lora-dropout %g: the checkpoint's %s has lora_dropout %g; leave the flag out to continue "
                       "with it", *dropout, c.path, c.dropout);
        *r = c.r, *alpha = (float)c.alpha, *rslora = c.rslora, *dropout = (float)c.dropout;
        *target = targets_text(c.target, taken);
        return;
    }
    free(dir);
    if (!*r) {   /* full training: a LoRA setting alone would be ignored */
        const void *set[] = {alpha, target, rslora, dropout};
        const char *names[] = {"--lora-alpha", "--lora-target", "--lora-rslora", "--lora-dropout"};
        for (int i = 0; i < 4; i++)
            if (args_given(set[i]))
                user_error("%s: a LoRA setting without --lora-r: the run would train every weight (give --lora-r N)",
                           names[i]);
        return;
    }
    int t[LORA_TARGETS];
    lora_targets_parse("--lora-target", *target, t);
    if (!(*alpha > 0 && *alpha <= ADAPTER_ALPHA_MAX))
        user_error("--lora-alpha %g: must be > 0 and <= %g (the adapters' scale is alpha / r)", *alpha, ADAPTER_ALPHA_MAX);
}

void lora_load(Model *m, const char *dir) {
    Lora *lo = m->lora;
    AdapterConfig c;
    adapter_config(dir, &c);   /* the adapters are trained on as they were: the same rank, scale and modules */
    if (c.r != lo->r)
        user_error("%s: \"r\" is %d, but --lora-r is %d: give --lora-r %d (the adapter's rank)", c.path, c.r, lo->r, c.r);
    char a[96], b[96];
    if (memcmp(c.target, lo->target, sizeof lo->target))
        user_error("%s: \"target_modules\" is %s, but --lora-target is %s: give --lora-target %s", c.path,
                   targets_text(c.target, a), targets_text(lo->target, b), a);
    if ((float)c.alpha != (float)lo->alpha || c.rslora != lo->rslora)
        user_error("%s: \"lora_alpha\" %g%s, but --lora-alpha %g%s: give --lora-alpha %g%s (the adapter's scale)", c.path,
                   c.alpha, c.rslora ? " with use_rslora" : "", lo->alpha, lo->rslora ? " --lora-rslora" : "", c.alpha,
                   c.rslora ? " --lora-rslora" : "");
    char *path = path_join(dir, "adapter_model.safetensors");
    float *host = xmalloc(sizeof(float) * (lo->n ? lo->n : 1));
    lora_read_blocks(m, path, host);
    m->be->to_device(lo->arena, host, sizeof(float) * lo->n);
    free(host);
    free(path);
}
