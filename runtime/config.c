/* config.c — see config.h. */
#include "runtime/config.h"
#include "runtime/util.h"
#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *path;
    cJSON *root;
} Cfg;

static cJSON *get(const Cfg *g, const char *key) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(g->root, key);
    return (v && !cJSON_IsNull(v)) ? v : NULL;
}
/* key of obj (the root, or a nested object such as rope_scaling): an integer in [0, INT_MAX] */
static int get_int_in(const Cfg *g, const cJSON *obj, const char *key, int required, int dflt) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) user_error("%s: missing key \"%s\"", g->path, key);
        return dflt;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 || v->valuedouble > INT_MAX)
        user_error("%s: \"%s\" must be an integer in [0, %d]", g->path, key, INT_MAX);
    return (int)v->valuedouble;
}
static int get_int(const Cfg *g, const char *key, int required, int dflt) { return get_int_in(g, g->root, key, required, dflt); }
static float get_float(const Cfg *g, const cJSON *obj, const char *key, int required, float dflt) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) user_error("%s: missing key \"%s\"", g->path, key);
        return dflt;
    }
    if (!cJSON_IsNumber(v)) user_error("%s: \"%s\" must be a number", g->path, key);
    return (float)v->valuedouble;
}
static int get_bool(const Cfg *g, const char *key, int dflt) {
    cJSON *v = get(g, key);
    if (!v) return dflt;
    if (!cJSON_IsBool(v)) user_error("%s: \"%s\" must be true or false", g->path, key);
    return cJSON_IsTrue(v);
}

/* ---- the families: what each model_type always has, and how it reads the rest ------------ */

/* Where a family's sliding window comes from. */
typedef enum {
    WINDOW_NONE,        /* full attention on every layer */
    WINDOW_ALL_LAYERS,  /* "sliding_window" on every layer (mistral; null or absent: none) */
    WINDOW_OPT_IN,      /* only with "use_sliding_window": true, on layers >= "max_window_layers" (qwen2) */
} WindowRule;

/* One row per supported model_type. A feature a family may or may not have is a column here,
 * never an is_<family> branch below. */
typedef struct {
    const char *model_type;
    int qkv_bias;        /* 1: q/k/v biases always; 0: as "attention_bias" says (default false) */
    WindowRule window;
    int qk_norm;         /* 1: RMSNorm of each q and k head (q_norm / k_norm, (Dh) each) before RoPE */
    MoeKind moe;         /* the MoE MLP's kind (read_moe), MOE_NONE: dense */
    int shared_expert;   /* 1: a sigmoid-gated shared expert beside the routed ones (qwen2_moe) */
} Family;

static const Family FAMILIES[] = {
    {"llama",     0, WINDOW_NONE,       0, MOE_NONE,    0},
    {"mistral",   0, WINDOW_ALL_LAYERS, 0, MOE_NONE,    0},
    {"qwen2",     1, WINDOW_OPT_IN,     0, MOE_NONE,    0},
    {"qwen3",     0, WINDOW_OPT_IN,     1, MOE_NONE,    0},
    {"mixtral",   0, WINDOW_ALL_LAYERS, 0, MOE_MIXTRAL, 0},
    {"qwen2_moe", 1, WINDOW_OPT_IN,     0, MOE_QWEN,    1},
    {"qwen3_moe", 0, WINDOW_OPT_IN,     1, MOE_QWEN,    0},
};
enum { N_FAMILIES = (int)(sizeof(FAMILIES) / sizeof(FAMILIES[0])) };

/* "model_type" -> its row; user_error naming the supported ones. */
static const Family *read_family(const Cfg *g, ModelConfig *c) {
    cJSON *mt = get(g, "model_type");
    if (!mt || !cJSON_IsString(mt)) user_error("%s: missing key \"model_type\"", g->path);
    for (int i = 0; i < N_FAMILIES; i++)
        if (!strcmp(mt->valuestring, FAMILIES[i].model_type)) {
            snprintf(c->model_type, sizeof(c->model_type), "%s", mt->valuestring);
            return &FAMILIES[i];
        }
    char names[128] = "";
    for (int i = 0; i < N_FAMILIES; i++)
        snprintf(names + strlen(names), sizeof(names) - strlen(names), "%s%s", i ? ", " : "", FAMILIES[i].model_type);
    user_error("%s: model_type \"%s\" is not supported (%s)", g->path, mt->valuestring, names);
    return NULL;
}

/* Sizes (D, F, L, H, Hkv, Dh, V, max_pos) with their consistency checks. */
static void read_shape(const Cfg *g, ModelConfig *c) {
    c->dim = get_int(g, "hidden_size", 1, 0);
    c->hidden_dim = get_int(g, "intermediate_size", 1, 0);
    c->n_layers = get_int(g, "num_hidden_layers", 1, 0);
    c->n_heads = get_int(g, "num_attention_heads", 1, 0);
    c->n_heads_kv = get_int(g, "num_key_value_heads", 0, c->n_heads);
    c->vocab_size = get_int(g, "vocab_size", 1, 0);
    c->max_pos = get_int(g, "max_position_embeddings", 0, 2048);
    if (c->dim <= 0 || c->hidden_dim <= 0 || c->n_layers <= 0 || c->n_heads <= 0 || c->n_heads_kv <= 0 || c->vocab_size <= 0)
        user_error("%s: hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, "
                   "num_key_value_heads and vocab_size must be positive", g->path);
    if (c->n_heads % c->n_heads_kv)
        user_error("%s: num_attention_heads (%d) is not a multiple of num_key_value_heads (%d)", g->path,
                   c->n_heads, c->n_heads_kv);
    c->head_dim = get_int(g, "head_dim", 0, 0);
    if (c->head_dim == 0) {
        if (c->dim % c->n_heads) user_error("%s: hidden_size %% num_attention_heads != 0 and no head_dim", g->path);
        c->head_dim = c->dim / c->n_heads;
    }
    if (c->head_dim % 2) user_error("%s: head_dim %d must be even for RoPE", g->path, c->head_dim);
}

/* Keys whose other values change the math in ways not implemented: refused, never ignored. */
static void refuse_unsupported(const Cfg *g) {
    cJSON *act = get(g, "hidden_act");
    if (act && (!cJSON_IsString(act) || (strcmp(act->valuestring, "silu") && strcmp(act->valuestring, "swish"))))
        user_error("%s: hidden_act \"%s\" is not supported (silu)", g->path, cJSON_IsString(act) ? act->valuestring : "?");
    if (get_bool(g, "mlp_bias", 0)) user_error("%s: mlp_bias true is not supported", g->path);
    if (cJSON_IsNumber(get(g, "pretraining_tp")) && get_int(g, "pretraining_tp", 0, 1) != 1)
        user_error("%s: pretraining_tp != 1 is not supported", g->path);
}

/* "rope_scaling": null (default), linear or llama3, with their keys. */
static void read_rope_scaling(const Cfg *g, ModelConfig *c) {
    cJSON *rs = get(g, "rope_scaling");
    c->rope_scaling = ROPE_DEFAULT;
    c->rope_factor = 1.0f;
    if (!rs) return;
    if (!cJSON_IsObject(rs)) user_error("%s: rope_scaling must be an object or null", g->path);
    cJSON *type = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!type) type = cJSON_GetObjectItemCaseSensitive(rs, "type");
    if (!type || !cJSON_IsString(type)) user_error("%s: rope_scaling has no \"rope_type\"", g->path);
    const char *t = type->valuestring;
    if (!strcmp(t, "default")) {
    } else if (!strcmp(t, "linear")) {
        c->rope_scaling = ROPE_LINEAR;
        c->rope_factor = get_float(g, rs, "factor", 1, 1.0f);
    } else if (!strcmp(t, "llama3")) {
        c->rope_scaling = ROPE_LLAMA3;
        c->rope_factor = get_float(g, rs, "factor", 1, 1.0f);
        c->rope_low_freq_factor = get_float(g, rs, "low_freq_factor", 1, 1.0f);
        c->rope_high_freq_factor = get_float(g, rs, "high_freq_factor", 1, 4.0f);
        c->rope_orig_max_pos = get_int_in(g, rs, "original_max_position_embeddings", 1, 8192);
    } else {
        user_error("%s: rope_scaling type \"%s\" is not supported (linear, llama3)", g->path, t);
    }
    if (!(c->rope_factor > 0 && isfinite(c->rope_factor))) user_error("%s: rope_scaling.factor must be > 0", g->path);
}

/* The sliding window by the family's rule (see WindowRule). */
static void read_window(const Cfg *g, const Family *f, ModelConfig *c) {
    c->sliding_window = 0;
    if (f->window == WINDOW_ALL_LAYERS) {
        c->sliding_window = get_int(g, "sliding_window", 0, 0);
        c->window_from_layer = 0;
    } else if (f->window == WINDOW_OPT_IN && get_bool(g, "use_sliding_window", 0)) {
        c->sliding_window = get_int(g, "sliding_window", 0, 0);
        c->window_from_layer = get_int(g, "max_window_layers", 0, 0);
    }
}

/* The MoE block's keys (Family.moe). Only models whose every layer is sparse are supported: Qwen's
 * decoder_sparse_step != 1 or a non-empty mlp_only_layers (dense layers between sparse ones) are
 * refused, as is Mixtral's training-time router_jitter_noise. */
static void read_moe(const Cfg *g, const Family *f, ModelConfig *c) {
    c->moe = f->moe;
    if (f->moe == MOE_NONE) return;
    int mixtral = f->moe == MOE_MIXTRAL;
    c->n_experts = get_int(g, mixtral ? "num_local_experts" : "num_experts", 1, 0);
    c->n_experts_tok = get_int(g, "num_experts_per_tok", 1, 0);
    c->moe_dim = mixtral ? c->hidden_dim : get_int(g, "moe_intermediate_size", 1, 0);
    c->shared_dim = f->shared_expert ? get_int(g, "shared_expert_intermediate_size", 1, 0) : 0;
    c->norm_topk = mixtral ? 1 : get_bool(g, "norm_topk_prob", 0);
    c->router_aux_coef = get_float(g, g->root, "router_aux_loss_coef", 0, 0.001f);
    c->output_router_logits = get_bool(g, "output_router_logits", 0);
    if (c->n_experts < 1 || c->n_experts_tok < 1 || c->n_experts_tok > c->n_experts || c->moe_dim < 1)
        user_error("%s: num_experts_per_tok %d must be in [1, %s %d] and the experts' intermediate size %d positive",
                   g->path, c->n_experts_tok, mixtral ? "num_local_experts" : "num_experts", c->n_experts, c->moe_dim);
    if (f->shared_expert && c->shared_dim < 1)
        user_error("%s: shared_expert_intermediate_size must be positive", g->path);
    if (!mixtral && get_int(g, "decoder_sparse_step", 0, 1) != 1)
        user_error("%s: decoder_sparse_step != 1 (dense MLP layers between MoE layers) is not supported", g->path);
    cJSON *dense = get(g, "mlp_only_layers");
    if (!mixtral && dense && (!cJSON_IsArray(dense) || cJSON_GetArraySize(dense) > 0))
        user_error("%s: a non-empty mlp_only_layers (dense MLP layers in a MoE model) is not supported", g->path);
    if (mixtral && get_float(g, g->root, "router_jitter_noise", 0, 0.0f) != 0.0f)
        user_error("%s: router_jitter_noise != 0 is not supported", g->path);
}

/* "eos_token_id": one id or a list (the first MAX_EOS_IDS kept). */
static void read_eos(const Cfg *g, ModelConfig *c) {
    cJSON *eos = get(g, "eos_token_id");
    if (eos && cJSON_IsNumber(eos)) {
        c->eos_ids[c->n_eos++] = eos->valueint;
    } else if (eos && cJSON_IsArray(eos)) {
        cJSON *e;
        cJSON_ArrayForEach(e, eos) {
            if (!cJSON_IsNumber(e)) user_error("%s: eos_token_id entries must be integers", g->path);
            if (c->n_eos < MAX_EOS_IDS) c->eos_ids[c->n_eos++] = e->valueint;
        }
    } else if (eos) {
        user_error("%s: eos_token_id must be an integer or a list", g->path);
    }
}

/* A *ForSequenceClassification directory: score.weight (num_labels, D) instead of lm_head, and
 * a reward model's normalisation stats. */
static void read_score_head(const Cfg *g, ModelConfig *c) {
    cJSON *arch = get(g, "architectures"), *a0 = cJSON_IsArray(arch) ? cJSON_GetArrayItem(arch, 0) : NULL;
    const char *suffix = "ForSequenceClassification";
    size_t la = cJSON_IsString(a0) ? strlen(a0->valuestring) : 0, ls = strlen(suffix);
    c->score_head = la > ls && !strcmp(a0->valuestring + la - ls, suffix);
    cJSON *id2label = get(g, "id2label");
    c->num_labels = get_int(g, "num_labels", 0, cJSON_IsObject(id2label) ? cJSON_GetArraySize(id2label) : 2);
    if (c->score_head && c->num_labels != 1)
        user_error("%s: num_labels %d: only 1 (a scalar reward or value head) is supported", g->path, c->num_labels);
    if (c->score_head) c->tie_embeddings = 0;   /* no lm_head to tie */
    c->pad_id = get_int(g, "pad_token_id", 0, -1);
    c->init_range = get_float(g, g->root, "initializer_range", 0, 0.02f);
    c->has_reward_stats = c->score_head && get_bool(g, "normalize_reward", 0);
    c->reward_mean = c->has_reward_stats ? get_float(g, g->root, "mean", 1, 0.0f) : 0.0f;
    c->reward_std = c->has_reward_stats ? get_float(g, g->root, "std", 1, 1.0f) : 1.0f;
    if (c->has_reward_stats && !(c->reward_std > 0 && isfinite(c->reward_std) && isfinite(c->reward_mean)))
        user_error("%s: \"std\" must be > 0 and \"mean\" finite (reward normalisation)", g->path);
    if (!(c->init_range >= 0 && isfinite(c->init_range))) user_error("%s: initializer_range must be >= 0", g->path);
}

/* The keys are read in this order, so a file with several faults reports the same one first. */
void config_load(ModelConfig *c, const char *dir) {
    memset(c, 0, sizeof(*c));
    if (!dir_exists(dir)) user_error("%s: model directory not found", dir);
    char *path = path_join(dir, "config.json");
    char *text = read_file(path, NULL);
    if (!text) user_error("%s: cannot read (not a Hugging Face model directory?)", path);
    Cfg g = {path, cJSON_Parse(text)};
    free(text);
    if (!g.root || !cJSON_IsObject(g.root)) user_error("%s: not valid JSON", path);

    const Family *f = read_family(&g, c);
    read_shape(&g, c);
    c->norm_eps = get_float(&g, g.root, "rms_norm_eps", 0, 1e-6f);
    c->rope_theta = get_float(&g, g.root, "rope_theta", 0, 10000.0f);
    refuse_unsupported(&g);
    read_rope_scaling(&g, c);
    if (!(c->rope_theta > 0 && isfinite(c->rope_theta))) user_error("%s: rope_theta must be > 0", path);
    if (!(c->norm_eps >= 0 && isfinite(c->norm_eps))) user_error("%s: rms_norm_eps must be >= 0", path);
    c->qkv_bias = f->qkv_bias ? 1 : get_bool(&g, "attention_bias", 0);
    c->qk_norm = f->qk_norm;
    c->tie_embeddings = get_bool(&g, "tie_word_embeddings", 0);
    read_window(&g, f, c);
    read_moe(&g, f, c);
    c->bos_id = get_int(&g, "bos_token_id", 0, -1);
    read_eos(&g, c);
    read_score_head(&g, c);
    cJSON *dt = get(&g, "torch_dtype");
    snprintf(c->torch_dtype, sizeof(c->torch_dtype), "%s", dt && cJSON_IsString(dt) ? dt->valuestring : "float32");
    cJSON_Delete(g.root);
    free(path);
}

int config_layer_window(const ModelConfig *c, int l) {
    return c->sliding_window > 0 && l >= c->window_from_layer;
}

char *config_to_json(const ModelConfig *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("LlamaForCausalLM"));
    cJSON_AddStringToObject(o, "model_type", "llama");
    cJSON_AddNumberToObject(o, "hidden_size", c->dim);
    cJSON_AddNumberToObject(o, "intermediate_size", c->hidden_dim);
    cJSON_AddNumberToObject(o, "num_hidden_layers", c->n_layers);
    cJSON_AddNumberToObject(o, "num_attention_heads", c->n_heads);
    cJSON_AddNumberToObject(o, "num_key_value_heads", c->n_heads_kv);
    cJSON_AddNumberToObject(o, "head_dim", c->head_dim);
    cJSON_AddNumberToObject(o, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(o, "max_position_embeddings", c->max_pos);
    cJSON_AddNumberToObject(o, "rms_norm_eps", c->norm_eps);
    cJSON_AddNumberToObject(o, "rope_theta", c->rope_theta);
    cJSON_AddStringToObject(o, "hidden_act", "silu");
    cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tie_embeddings);
    cJSON_AddBoolToObject(o, "attention_bias", c->qkv_bias);
    cJSON_AddBoolToObject(o, "mlp_bias", 0);
    if (c->bos_id >= 0) cJSON_AddNumberToObject(o, "bos_token_id", c->bos_id);
    if (c->n_eos == 1) cJSON_AddNumberToObject(o, "eos_token_id", c->eos_ids[0]);
    cJSON_AddStringToObject(o, "torch_dtype", "float32");
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    return s;
}
