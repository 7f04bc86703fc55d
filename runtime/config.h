/* config.h — model hyperparameters from a Hugging Face config.json (never from flags).
 * Owns parsing and validation of config.json for model_type llama, mistral, qwen2, qwen3 and the
 * Mixture-of-Experts families mixtral, qwen2_moe, qwen3_moe; anything it
 * does not support is a user_error naming the key, never silently ignored. */
#ifndef TANDEM_CONFIG_H
#define TANDEM_CONFIG_H

typedef enum { ROPE_DEFAULT = 0, ROPE_LINEAR, ROPE_LLAMA3 } RopeScaling;
/* Which MoE MLP a family has (its tensor names and keys): none (dense), Mixtral's block_sparse_moe
 * (w1/w3/w2, top-k always renormalised), Qwen's mlp.gate + mlp.experts (qwen2_moe: + a shared expert) */
typedef enum { MOE_NONE = 0, MOE_MIXTRAL, MOE_QWEN } MoeKind;
enum { MAX_EOS_IDS = 8 };

typedef struct {
    char model_type[16];   /* "llama" | "mistral" | "qwen2" | "qwen3" | "mixtral" | "qwen2_moe" | "qwen3_moe" */
    int dim;               /* D: hidden_size */
    int hidden_dim;        /* F: intermediate_size (a MoE model's dense MLP width: unused, every layer is sparse) */
    int n_layers;          /* L */
    int n_heads;           /* H */
    int n_heads_kv;        /* Hkv */
    int head_dim;          /* Dh (explicit head_dim, else D / H) */
    int vocab_size;        /* V */
    int max_pos;           /* max_position_embeddings */
    float norm_eps;
    float rope_theta;
    RopeScaling rope_scaling;
    float rope_factor;             /* linear and llama3 */
    float rope_low_freq_factor;    /* llama3 */
    float rope_high_freq_factor;   /* llama3 */
    int rope_orig_max_pos;         /* llama3 original_max_position_embeddings */
    int tie_embeddings;
    int qkv_bias;          /* qwen2, or llama's / qwen3's attention_bias */
    int qk_norm;           /* qwen3: RMSNorm of each q and k head over Dh (q_norm, k_norm) before RoPE */
    MoeKind moe;           /* MOE_NONE: the dense MLP on every layer; else every layer's MLP is a MoE block */
    int n_experts;         /* E: num_local_experts (mixtral) / num_experts (qwen); 0 dense */
    int n_experts_tok;     /* k: num_experts_per_tok */
    int moe_dim;           /* Fe: an expert's intermediate width (mixtral intermediate_size, qwen moe_intermediate_size) */
    int shared_dim;        /* Fs: qwen2_moe shared_expert_intermediate_size (sigmoid-gated shared expert), 0 none */
    int norm_topk;         /* renormalise the top-k probabilities (mixtral always; qwen norm_topk_prob) */
    float router_aux_coef; /* router_aux_loss_coef (training's load-balancing loss; read, not yet used) */
    int output_router_logits;
    int sliding_window;    /* W, 0 = full attention */
    int window_from_layer; /* layers >= this use the window (qwen2 max_window_layers; 0 for mistral) */
    int bos_id;            /* -1 if none */
    int eos_ids[MAX_EOS_IDS];
    int n_eos;
    char torch_dtype[16];
    int score_head;        /* architectures[0] is *ForSequenceClassification: score.weight, no lm_head */
    int num_labels;        /* score head rows (1: a scalar reward / value; the only one supported) */
    int pad_id;            /* pad_token_id, -1 if none */
    float init_range;      /* initializer_range (0.02): std of a new score head */
    int has_reward_stats;  /* a reward model with "normalize_reward": its eval rewards' mean and std */
    float reward_mean, reward_std;   /* config "mean", "std" (OpenRLHF's names) */
} ModelConfig;

/* Reads DIR/config.json; user_error on a missing file, a missing or unsupported key. */
void config_load(ModelConfig *c, const char *dir);
/* 1 if layer l uses the sliding window */
int config_layer_window(const ModelConfig *c, int l);
/* Writes a llama config.json for c (used by convert and checkpoint export). Returns malloc'd text. */
char *config_to_json(const ModelConfig *c);
#endif
