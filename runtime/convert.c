/* convert.c — imports llama2.c checkpoints into Hugging Face directories.
 * Formats (karpathy/llama2.c export.py):
 *   legacy: 7 x int32 header (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
 *           vocab_size < 0 means an unshared classifier), then fp32: embed (V,D), rms_att (L,D),
 *           wq (L,H*Dh,D), wk (L,Hkv*Dh,D), wv, wo (L,D,H*Dh), rms_ffn (L,D), w1 (L,F,D), w2 (L,D,F),
 *           w3 (L,F,D), rms_final (D), freq_cis_real, freq_cis_imag (seq_len*Dh/2 each), [wcls (V,D)].
 *   v1:     256-byte header: uint32 magic "ak42" (0x616b3432), int32 version 1, the 7 ints,
 *           uint8 shared_classifier; then fp32: rms_att (L,D), rms_ffn (L,D), rms_final (D),
 *           embed (V,D), wq, wk, wv, wo, w1, w2, w3 (all layers each), [wcls].
 * Meta's q/k rows pair (2j, 2j+1) for RoPE; HF's rotate_half pairs (j, j+Dh/2): rows are permuted.
 * Output is written to a temporary directory and renamed into place: no half-written model. */
#include "runtime/convert.h"
#include "runtime/args.h"
#include "runtime/config.h"
#include "runtime/safetensors.h"
#include "runtime/util.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* HF row h*Dh + i*Dh/2 + j  <-  Meta row h*Dh + 2j + i   (i in {0,1}, j < Dh/2) */
static float *permute_rope_rows(const float *w, int n_heads, int Dh, int cols) {
    float *out = xmalloc(sizeof(float) * (size_t)n_heads * Dh * cols);
    for (int h = 0; h < n_heads; h++)
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < Dh / 2; j++)
                memcpy(out + ((size_t)h * Dh + i * Dh / 2 + j) * cols, w + ((size_t)h * Dh + 2 * j + i) * cols,
                       sizeof(float) * cols);
    return out;
}

static void copy_file(const char *src, const char *dst) {
    size_t len;
    char *data = read_file(src, &len);
    if (!data) user_error("%s: cannot read", src);
    if (write_file_atomic(dst, data, len)) user_error("%s: cannot write: %s", dst, strerror(errno));
    free(data);
}

/* Writes config.json, model.safetensors and the tokenizer into a temporary directory, then renames
 * it to `out` (replacing an old one): a reader never sees a half-written model. */
static void write_hf_dir(const ModelConfig *c, const StWriteTensor *t, int nt, const char *tok, const char *out) {
    size_t tl = strlen(out) + 32;
    char *tmp = xmalloc(tl);
    snprintf(tmp, tl, "%s.tmp.%d", out, (int)getpid());
    mkdir_p(tmp);
    char *cfg_json = config_to_json(c);
    char *cp = path_join(tmp, "config.json"), *sp = path_join(tmp, "model.safetensors");
    if (write_file_atomic(cp, cfg_json, strlen(cfg_json))) user_error("%s: cannot write: %s", cp, strerror(errno));
    if (st_write(sp, t, nt, ST_F32)) user_error("%s: cannot write: %s", sp, strerror(errno));
    if (tok) {
        char *tp = path_join(tmp, "tokenizer.model");
        copy_file(tok, tp);
        free(tp);
    }
    if (dir_exists(out)) {
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
        if (system(cmd) != 0) user_error("%s: cannot remove the old directory", out);
    }
    if (rename(tmp, out)) user_error("%s: cannot rename %s into place: %s", out, tmp, strerror(errno));
    free(cfg_json); free(cp); free(sp); free(tmp);
}

/* Random weights of a real shape (speed does not depend on values): uniform with std 0.02, unit
 * norms, tied embeddings as in llama2.c's models. Shapes: 15M = llama2.c stories15M (288, 768, 6, 6, 6, 32000, 256),
 * 110M = stories110M (768, 2048, 12, 12, 12, 32000, 1024). */
static int write_random(const char *shape, int seed, const char *tok, const char *out) {
    int s[7];
    if (!strcmp(shape, "15M")) memcpy(s, (int[]){288, 768, 6, 6, 6, 32000, 256}, sizeof s);
    else if (!strcmp(shape, "110M")) memcpy(s, (int[]){768, 2048, 12, 12, 12, 32000, 1024}, sizeof s);
    else if (sscanf(shape, "%d,%d,%d,%d,%d,%d,%d", &s[0], &s[1], &s[2], &s[3], &s[4], &s[5], &s[6]) != 7)
        user_error("--shape %s: expected 15M, 110M or dim,hidden,layers,heads,kv_heads,vocab,seq", shape);
    for (int i = 0; i < 7; i++) if (s[i] <= 0) user_error("--shape %s: every entry must be positive", shape);
    if (s[0] % s[3] || s[3] % s[4]) user_error("--shape %s: heads must divide dim and kv_heads must divide heads", shape);
    ModelConfig c = {0};
    c.dim = s[0]; c.hidden_dim = s[1]; c.n_layers = s[2]; c.n_heads = s[3]; c.n_heads_kv = s[4];
    c.head_dim = s[0] / s[3]; c.vocab_size = s[5]; c.max_pos = s[6]; c.norm_eps = 1e-5f; c.rope_theta = 10000.0f;
    c.bos_id = 1; c.eos_ids[0] = 2; c.n_eos = 1; c.tie_embeddings = 1;
    int L = c.n_layers, nt = 2 + 9 * L, k = 0;
    size_t D = c.dim, F = c.hidden_dim, qd = (size_t)c.n_heads * c.head_dim, kvd = (size_t)c.n_heads_kv * c.head_dim;
    StWriteTensor *t = xcalloc(nt, sizeof(StWriteTensor));
    char **names = xcalloc(nt, sizeof(char *));
    uint64_t rng = 0x9E3779B97F4A7C15ull * (uint64_t)(seed + 1);
#define ADD(nm, r, cc, norm) do { \
        size_t n_ = (size_t)(r) * ((cc) ? (size_t)(cc) : 1); float *d_ = xmalloc(sizeof(float) * n_); \
        for (size_t i_ = 0; i_ < n_; i_++) { \
            if (norm) { d_[i_] = 1.0f; continue; } \
            rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; \
            d_[i_] = 0.02f * 1.7320508f * (2.0f * (float)((rng >> 40) * (1.0 / 16777216.0)) - 1.0f); /* std 0.02 */ \
        } \
        names[k] = xstrdup(nm); t[k] = (StWriteTensor){names[k], (cc) ? 2 : 1, {(int64_t)(r), (int64_t)(cc)}, d_}; k++; \
    } while (0)
    char nm[128];
    ADD("model.embed_tokens.weight", c.vocab_size, D, 0);
    for (int l = 0; l < L; l++) {
        snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", l); ADD(nm, D, 0, 1);
        snprintf(nm, sizeof nm, "model.layers.%d.self_attn.q_proj.weight", l); ADD(nm, qd, D, 0);
        snprintf(nm, sizeof nm, "model.layers.%d.self_attn.k_proj.weight", l); ADD(nm, kvd, D, 0);
        snprintf(nm, sizeof nm, "model.layers.%d.self_attn.v_proj.weight", l); ADD(nm, kvd, D, 0);
        snprintf(nm, sizeof nm, "model.layers.%d.self_attn.o_proj.weight", l); ADD(nm, D, qd, 0);
        snprintf(nm, sizeof nm, "model.layers.%d.post_attention_layernorm.weight", l); ADD(nm, D, 0, 1);
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.gate_proj.weight", l); ADD(nm, F, D, 0);
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.down_proj.weight", l); ADD(nm, D, F, 0);
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.up_proj.weight", l); ADD(nm, F, D, 0);
    }
    ADD("model.norm.weight", D, 0, 1);
#undef ADD
    CHECK(k == nt);
    write_hf_dir(&c, t, nt, tok, out);
    fprintf(stderr, "random model (dim %d, hidden %d, layers %d, heads %d/%d, vocab %d) -> %s\n", c.dim, c.hidden_dim,
            L, c.n_heads, c.n_heads_kv, c.vocab_size, out);
    for (int i = 0; i < nt; i++) { free(names[i]); free((void *)t[i].data); }
    free(names); free(t);
    return 0;
}

/* A llama2.c checkpoint (legacy or v1 "ak42") -> an HF LlamaForCausalLM directory: the header's
 * shape, every tensor bounds-checked against the file, q/k rows permuted to HF's RoPE layout. */
static int convert_llama2c(const char *in, const char *tok, const char *out) {
    size_t size;
    char *buf = read_file(in, &size);
    if (!buf) user_error("%s: cannot read", in);
    if (size < 28) user_error("%s: %zu bytes is too short for a llama2.c header", in, size);
    uint32_t magic;
    memcpy(&magic, buf, 4);
    int v1 = magic == 0x616b3432u, hdr[7], shared;
    size_t off;
    if (v1) {
        int version;
        memcpy(&version, buf + 4, 4);
        if (version != 1) user_error("%s: llama2.c format version %d is not supported (1)", in, version);
        if (size < 256) user_error("%s: truncated v1 header", in);
        memcpy(hdr, buf + 8, sizeof(hdr));
        shared = (unsigned char)buf[36];
        off = 256;
    } else {
        memcpy(hdr, buf, sizeof(hdr));
        shared = hdr[5] > 0;
        hdr[5] = abs(hdr[5]);
        off = 28;
    }
    int D = hdr[0], F = hdr[1], L = hdr[2], H = hdr[3], Hkv = hdr[4], V = hdr[5], S = hdr[6];
    if (D <= 0 || F <= 0 || L <= 0 || H <= 0 || Hkv <= 0 || V <= 0 || S <= 0 || D % H || H % Hkv || D > 1 << 16 ||
        L > 1024 || V > 1 << 22)
        user_error("%s: not a llama2.c checkpoint (header dim=%d hidden=%d layers=%d heads=%d kv_heads=%d vocab=%d seq=%d)",
                   in, D, F, L, H, Hkv, V, S);
    int Dh = D / H;
    size_t qd = (size_t)H * Dh, kvd = (size_t)Hkv * Dh;
    size_t per_layer = 2 * (size_t)D + qd * D + 2 * kvd * D + (size_t)D * qd + 3 * (size_t)F * D;
    size_t want = (size_t)V * D + (size_t)L * per_layer + D + (v1 ? 0 : (size_t)S * Dh) + (shared ? 0 : (size_t)V * D);
    if ((size - off) / 4 < want)
        user_error("%s: %zu bytes of weights, expected %zu for this header (truncated?)", in, size - off, want * 4);
    const float *p = (const float *)(buf + off);
    /* pointers to each weight group, all layers stacked */
    const float *embed, *rms_att, *rms_ffn, *rms_final, *wq, *wk, *wv, *wo, *w1, *w2, *w3, *wcls;
#define TAKE(ptr, n) (ptr = p, p += (n))
    if (v1) {
        TAKE(rms_att, (size_t)L * D); TAKE(rms_ffn, (size_t)L * D); TAKE(rms_final, D); TAKE(embed, (size_t)V * D);
        TAKE(wq, L * qd * D); TAKE(wk, L * kvd * D); TAKE(wv, L * kvd * D); TAKE(wo, L * D * qd);
        TAKE(w1, (size_t)L * F * D); TAKE(w2, (size_t)L * D * F); TAKE(w3, (size_t)L * F * D);
    } else {
        TAKE(embed, (size_t)V * D); TAKE(rms_att, (size_t)L * D);
        TAKE(wq, L * qd * D); TAKE(wk, L * kvd * D); TAKE(wv, L * kvd * D); TAKE(wo, L * D * qd);
        TAKE(rms_ffn, (size_t)L * D); TAKE(w1, (size_t)L * F * D); TAKE(w2, (size_t)L * D * F); TAKE(w3, (size_t)L * F * D);
        TAKE(rms_final, D);
        p += (size_t)S * Dh; /* freq_cis_real and _imag: recomputed, not stored */
    }
    wcls = shared ? embed : p;
#undef TAKE

    int nt = 3 + 9 * L - (shared ? 1 : 0);
    StWriteTensor *t = xcalloc(nt, sizeof(StWriteTensor));
    char **names = xcalloc(nt, sizeof(char *));
    float **owned = xcalloc(2 * L, sizeof(float *));
    int k = 0;
#define ADD(nm, ptr, r, c) do { names[k] = xstrdup(nm); t[k] = (StWriteTensor){names[k], (c) ? 2 : 1, {(r), (c)}, (ptr)}; k++; } while (0)
    ADD("model.embed_tokens.weight", embed, V, D);
    char nm[128];
    for (int l = 0; l < L; l++) {
        owned[2 * l] = permute_rope_rows(wq + l * qd * D, H, Dh, D);
        owned[2 * l + 1] = permute_rope_rows(wk + l * kvd * D, Hkv, Dh, D);
        snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", l); ADD(nm, rms_att + (size_t)l * D, D, 0);
        snprintf(nm, sizeof nm, "model.layers.%d.self_attn.q_proj.weight", l); ADD(nm, owned[2 * l], (int64_t)qd, D);
        snprintf(nm, sizeof nm, "model.layers.%d.self_attn.k_proj.weight", l); ADD(nm, owned[2 * l + 1], (int64_t)kvd, D);
        snprintf(nm, sizeof nm, "model.layers.%d.self_attn.v_proj.weight", l); ADD(nm, wv + l * kvd * D, (int64_t)kvd, D);
        snprintf(nm, sizeof nm, "model.layers.%d.self_attn.o_proj.weight", l); ADD(nm, wo + l * D * qd, D, (int64_t)qd);
        snprintf(nm, sizeof nm, "model.layers.%d.post_attention_layernorm.weight", l); ADD(nm, rms_ffn + (size_t)l * D, D, 0);
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.gate_proj.weight", l); ADD(nm, w1 + (size_t)l * F * D, F, D);
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.down_proj.weight", l); ADD(nm, w2 + (size_t)l * D * F, D, F);
        snprintf(nm, sizeof nm, "model.layers.%d.mlp.up_proj.weight", l); ADD(nm, w3 + (size_t)l * F * D, F, D);
    }
    ADD("model.norm.weight", rms_final, D, 0);
    if (!shared) ADD("lm_head.weight", wcls, V, D);
#undef ADD
    CHECK(k == nt);

    ModelConfig c = {0};
    c.dim = D; c.hidden_dim = F; c.n_layers = L; c.n_heads = H; c.n_heads_kv = Hkv; c.head_dim = Dh;
    c.vocab_size = V; c.max_pos = S; c.norm_eps = 1e-5f; c.rope_theta = 10000.0f; c.tie_embeddings = shared;
    c.bos_id = 1; c.eos_ids[0] = 2; c.n_eos = 1;

    write_hf_dir(&c, t, nt, tok, out);
    fprintf(stderr, "converted %s (%s, dim %d, layers %d, heads %d/%d, vocab %d%s) -> %s\n", in, v1 ? "v1" : "legacy", D,
            L, H, Hkv, V, shared ? ", tied" : "", out);
    for (int i = 0; i < nt; i++) free(names[i]);
    for (int i = 0; i < 2 * L; i++) free(owned[i]);
    free(names); free(owned); free(t); free(buf);
    return 0;
}

int convert_main(int argc, char **argv) {
    const char *from, *in = NULL, *tok = NULL, *out = NULL, *shape = NULL;
    int overwrite, seed;
    Option opts[] = {
        {"--from", OPT_STR, &from, "llama2c", "source: llama2c (legacy or v1 \"ak42\" .bin) or random (weights for benchmarks)"},
        {"--tokenizer", OPT_STR, &tok, NULL, "tokenizer.model to copy into the output directory"},
        {"--out", OPT_STR, &out, NULL, "output Hugging Face directory"},
        {"--overwrite", OPT_FLAG, &overwrite, NULL, "replace an existing output directory"},
        {"--shape", OPT_STR, &shape, "15M", "--from random: 15M, 110M, or dim,hidden,layers,heads,kv_heads,vocab,seq"},
        {"--seed", OPT_INT, &seed, "1", "--from random: RNG seed"},
    };
    /* the checkpoint is the one positional argument */
    char **rest = xmalloc(sizeof(char *) * (argc + 1));
    int nrest = 0;
    for (int a = 0; a < argc; a++) {
        if (a > 0 && argv[a][0] != '-' && (argv[a - 1][0] != '-' || !strcmp(argv[a - 1], "--overwrite")) && !in) {
            in = argv[a];
            continue;
        }
        rest[nrest++] = argv[a];
    }
    args_parse("usage: tandem convert --from llama2c MODEL.bin [--tokenizer tokenizer.model] --out DIR\n"
               "       tandem convert --from random --shape 15M|110M|D,F,L,H,Hkv,V,S --out DIR",
               opts, sizeof(opts) / sizeof(opts[0]), nrest, rest);
    free(rest);
    if (strcmp(from, "llama2c") && strcmp(from, "random"))
        user_error("convert: --from %s is not supported (llama2c, random)", from);
    if (!out) user_error("convert: --out DIR is required");
    if (tok && !file_exists(tok)) user_error("%s: tokenizer file not found", tok);
    if (dir_exists(out) && !overwrite) user_error("%s: already exists (use --overwrite to replace it)", out);
    if (!strcmp(from, "random")) return write_random(shape, seed, tok, out);
    if (!in) user_error("convert: no input checkpoint given");
    return convert_llama2c(in, tok, out);
}
