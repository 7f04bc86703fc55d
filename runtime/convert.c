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

int convert_main(int argc, char **argv) {
    const char *from, *in = NULL, *tok = NULL, *out = NULL;
    int overwrite;
    Option opts[] = {
        {"--from", OPT_STR, &from, "llama2c", "source format (llama2c: legacy or v1 \"ak42\" .bin)"},
        {"--tokenizer", OPT_STR, &tok, NULL, "tokenizer.model to copy into the output directory"},
        {"--out", OPT_STR, &out, NULL, "output Hugging Face directory"},
        {"--overwrite", OPT_FLAG, &overwrite, NULL, "replace an existing output directory"},
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
    args_parse("usage: tandem convert --from llama2c MODEL.bin [--tokenizer tokenizer.model] --out DIR", opts, 4, nrest, rest);
    free(rest);
    if (strcmp(from, "llama2c")) user_error("convert: --from %s is not supported (llama2c)", from);
    if (!in) user_error("convert: no input checkpoint given");
    if (!out) user_error("convert: --out DIR is required");
    if (tok && !file_exists(tok)) user_error("%s: tokenizer file not found", tok);
    if (dir_exists(out) && !overwrite) user_error("%s: already exists (use --overwrite to replace it)", out);

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

    size_t tl = strlen(out) + 32;
    char *tmp = xmalloc(tl);
    snprintf(tmp, tl, "%s.tmp.%d", out, (int)getpid());
    mkdir_p(tmp);
    char *cfg_json = config_to_json(&c);
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
    fprintf(stderr, "converted %s (%s, dim %d, layers %d, heads %d/%d, vocab %d%s) -> %s\n", in, v1 ? "v1" : "legacy", D,
            L, H, Hkv, V, shared ? ", tied" : "", out);
    for (int i = 0; i < nt; i++) free(names[i]);
    for (int i = 0; i < 2 * L; i++) free(owned[i]);
    free(names); free(owned); free(t); free(cfg_json); free(cp); free(sp); free(tmp); free(buf);
    return 0;
}
