/* tokenizer.c — the model-independent half of the tokenizer: open (dir or file, config files for
 * special ids), special-token matching in text, encode (dispatched to the model per chunk), decode,
 * streaming decode and the encode benchmark. The models themselves live in spm.cpp (SentencePiece)
 * and bpe.c (byte-level BPE); chat templates in chat.c. Does not own the containers those share
 * (the id list, the string map, the UTF-8 helpers, the per-token tables and specials: vocab.c) and
 * does not parse tokenizer.json's model section (bpe.c). */
#include "tokenizer/tok_internal.h"
#include "runtime/util.h"
#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- open */

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* Decoded bytes for each SentencePiece token: "▁" -> " ", <0xNN> -> byte, unknown -> " ⁇ " (as
 * spm decodes it), control -> its piece text (dropped when decoding with skip_special).
 * Control and unknown pieces written in text ("<s>", "</s>", "<unk>") are matched as specials, as
 * HF's LlamaTokenizer does; spm_encode alone would split them as ordinary text. */
static void spm_fill_vocab(Tokenizer *t) {
    int V = spm_vocab_size(t->spm);
    tok_alloc_vocab(t, V);
    for (int id = 0; id < V; id++) {
        const char *p = spm_piece(t->spm, id);
        int type = spm_piece_type(t->spm, id);
        size_t plen = strlen(p);
        t->pieces[id] = xstrdup(p);
        strmap_put(&t->piece_ids, p, plen, id);
        char *b = xmalloc(plen + 8);
        size_t n = 0;
        unsigned byte;
        if (type == 3 && sscanf(p, "<0x%2X>", &byte) == 1) {
            b[n++] = (char)byte;
        } else if (type == 2) {
            memcpy(b, " \xE2\x81\x87 ", 5);
            n = 5;
            t->flags[id] |= TOKF_SPECIAL;
            tok_add_special(t, p, id); /* "<unk>" in text is the unk token, as in HF */
        } else if (type == 1) {
            memcpy(b, p, plen);
            n = plen;
            t->flags[id] |= TOKF_SPECIAL;
            tok_add_special(t, p, id);
        } else {
            if (!strncmp(p, "\xE2\x96\x81", 3)) t->flags[id] |= TOKF_LEAD_SPACE;
            for (size_t i = 0; i < plen;) {
                if (!strncmp(p + i, "\xE2\x96\x81", 3)) { b[n++] = ' '; i += 3; }
                else b[n++] = p[i++];
            }
        }
        b[n] = 0;
        t->tok_bytes[id] = b;
        t->tok_len[id] = (uint32_t)n;
    }
    t->bos_id = spm_bos_id(t->spm);
    t->eos_id = spm_eos_id(t->spm);
    t->pad_id = spm_pad_id(t->spm);
    t->add_bos = t->bos_id >= 0;
}

static cJSON *read_json_file(const char *dir, const char *name) {
    char *p = path_join(dir, name);
    size_t len;
    char *txt = read_file(p, &len);
    free(p);
    if (!txt) return NULL;
    cJSON *j = cJSON_ParseWithLength(txt, len);
    free(txt);
    return j;
}

/* A token given as "text" or {"content": "text"} (HF AddedToken) -> id, or -1. */
static int token_field_id(Tokenizer *t, const cJSON *cfg, const char *field) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, field);
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (!cJSON_IsString(v)) return -1;
    return tokenizer_piece_to_id(t, v->valuestring);
}

static int int_field(const cJSON *cfg, const char *field) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, field);
    if (cJSON_IsArray(v)) v = cJSON_GetArrayItem(v, 0); /* eos_token_id: [a, b] -> a */
    return cJSON_IsNumber(v) ? v->valueint : -1;
}

/* Lowest precedence first, so later files overwrite: model < generation_config < config <
 * tokenizer_config (the chat template's bos_token/eos_token are tokenizer_config's). */
static void read_config_files(Tokenizer *t, const char *dir) {
    static const char *files[] = {"generation_config.json", "config.json"};
    for (int f = 0; f < 2; f++) {
        cJSON *j = read_json_file(dir, files[f]);
        if (!j) continue;
        int v;
        if ((v = int_field(j, "bos_token_id")) >= 0 && v < t->n_vocab) t->bos_id = v;
        if ((v = int_field(j, "eos_token_id")) >= 0 && v < t->n_vocab) t->eos_id = v;
        if ((v = int_field(j, "pad_token_id")) >= 0 && v < t->n_vocab) t->pad_id = v;
        cJSON_Delete(j);
    }
    cJSON *j = read_json_file(dir, "tokenizer_config.json");
    if (!j) return;
    int v;
    if ((v = token_field_id(t, j, "bos_token")) >= 0) t->bos_id = v;
    if ((v = token_field_id(t, j, "eos_token")) >= 0) t->eos_id = v;
    if ((v = token_field_id(t, j, "pad_token")) >= 0) t->pad_id = v;
    const cJSON *ab = cJSON_GetObjectItemCaseSensitive(j, "add_bos_token");
    if (cJSON_IsBool(ab)) t->add_bos = cJSON_IsTrue(ab) && t->bos_id >= 0;
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(j, "chat_template");
    if (cJSON_IsArray(ct)) { /* [{"name": "default", "template": "..."}, ...] */
        const cJSON *e;
        cJSON_ArrayForEach(e, ct) {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
            if (cJSON_IsString(nm) && !strcmp(nm->valuestring, "default")) {
                ct = cJSON_GetObjectItemCaseSensitive(e, "template");
                break;
            }
        }
    }
    if (cJSON_IsString(ct)) {
        t->chat_template = xstrdup(ct->valuestring);
        /* Qwen2's ChatML template opens with a default system turn when the first message is not one */
        t->chatml_default_system = strstr(ct->valuestring, "You are a helpful assistant.") &&
                                   strstr(ct->valuestring, "loop.first");
    }
    /* added_tokens_decoder entries that the model file does not know are not supported here:
     * tokens must come from tokenizer.json / tokenizer.model. */
    cJSON_Delete(j);
}

Tokenizer *tokenizer_open(const char *path, char *err, size_t errlen) {
    char *file = NULL, *dir = NULL;
    if (dir_exists(path)) {
        dir = xstrdup(path);
        char *spm = path_join(path, "tokenizer.model"), *hf = path_join(path, "tokenizer.json");
        if (file_exists(spm)) { file = spm; free(hf); }
        else if (file_exists(hf)) { file = hf; free(spm); }
        else {
            snprintf(err, errlen, "%s: no tokenizer.model or tokenizer.json in this directory", path);
            free(spm); free(hf); free(dir);
            return NULL;
        }
    } else if (file_exists(path)) {
        file = xstrdup(path);
        dir = xstrdup(path);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0; else strcpy(dir, ".");
    } else {
        snprintf(err, errlen, "%s: no such file or directory", path);
        return NULL;
    }
    Tokenizer *t = xcalloc(1, sizeof(Tokenizer));
    t->path = file;
    t->bos_id = t->eos_id = t->pad_id = -1;
    if (ends_with(file, ".json")) {
        size_t len;
        char *txt = read_file(file, &len);
        if (!txt) { snprintf(err, errlen, "%s: cannot read", file); goto fail; }
        t->kind = TOK_KIND_BPE;
        t->bpe = bpe_load(t, file, txt, err, errlen);
        free(txt);
        if (!t->bpe) goto fail;
    } else {
        t->kind = TOK_KIND_SPM;
        t->spm = spm_load(file, err, errlen);
        if (!t->spm) goto fail;
        spm_fill_vocab(t);
    }
    read_config_files(t, dir);
    free(dir);
    return t;
fail:
    free(dir);
    tokenizer_free(t);
    return NULL;
}

void tokenizer_free(Tokenizer *t) {
    if (!t) return;
    if (t->spm) spm_free(t->spm);
    if (t->bpe) bpe_free(t->bpe);
    for (int i = 0; i < t->n_vocab && t->pieces; i++) {
        free(t->pieces[i]);
        free(t->tok_bytes[i]);
    }
    free(t->pieces);
    free(t->tok_bytes);
    free(t->tok_len);
    free(t->flags);
    strmap_free(&t->piece_ids);
    for (int i = 0; i < t->n_specials; i++) free(t->specials[i].text);
    free(t->specials);
    free(t->chat_template);
    free(t->path);
    free(t);
}

TokKind tokenizer_kind(const Tokenizer *t) { return t->kind; }
int tokenizer_vocab_size(const Tokenizer *t) { return t->n_vocab; }
int tokenizer_bos_id(const Tokenizer *t) { return t->bos_id; }
int tokenizer_eos_id(const Tokenizer *t) { return t->eos_id; }
int tokenizer_pad_id(const Tokenizer *t) { return t->pad_id; }
int tokenizer_add_bos_default(const Tokenizer *t) { return t->add_bos; }
const char *tokenizer_chat_template(const Tokenizer *t) { return t->chat_template; }

/* ---------------------------------------------------------------- encode */

static void encode_chunk(Tokenizer *t, const char *s, size_t len, size_t base, TokIds *out,
                         TokIds *starts) {
    if (!len) return;
    if (t->kind == TOK_KIND_SPM) spm_encode_chunk(t->spm, s, len, base, out, starts);
    else bpe_encode_chunk(t->bpe, s, len, base, out, starts);
}

void tokenizer_encode(Tokenizer *t, const char *text, size_t len, unsigned flags, TokIds *out,
                      TokIds *starts) {
    size_t clean_len = 0;
    char *clean = utf8_sanitize(text, len, &clean_len);
    if (clean) { text = clean; len = clean_len; }
    if ((flags & TOK_ADD_BOS) && t->bos_id >= 0) {
        tok_ids_push(out, t->bos_id);
        if (starts) tok_ids_push(starts, 0);
    }
    /* Split on special tokens (leftmost, then longest) and encode the stretches between them. */
    size_t chunk = 0;
    for (size_t i = 0; i < len; i++) {
        if (!t->special_first[(unsigned char)text[i]]) continue;
        for (int k = 0; k < t->n_specials; k++) {
            const SpecialTok *sp = &t->specials[k];
            if (sp->len > len - i || memcmp(text + i, sp->text, sp->len)) continue;
            encode_chunk(t, text + chunk, i - chunk, chunk, out, starts);
            tok_ids_push(out, sp->id);
            if (starts) tok_ids_push(starts, (int32_t)i);
            i += sp->len - 1;
            chunk = i + 1;
            break;
        }
    }
    encode_chunk(t, text + chunk, len - chunk, chunk, out, starts);
    if ((flags & TOK_ADD_EOS) && t->eos_id >= 0) {
        tok_ids_push(out, t->eos_id);
        if (starts) tok_ids_push(starts, (int32_t)len);
    }
    free(clean);
}

/* ---------------------------------------------------------------- decode */

typedef struct {
    char **buf;
    size_t *len, *cap;
} OutBuf;

static void out_append(OutBuf *o, const char *s, size_t n) {
    if (*o->len + n + 1 > *o->cap) {
        size_t c = *o->cap ? *o->cap : 64;
        while (c < *o->len + n + 1) c *= 2;
        *o->buf = xrealloc(*o->buf, c);
        *o->cap = c;
    }
    memcpy(*o->buf + *o->len, s, n);
    *o->len += n;
    (*o->buf)[*o->len] = 0;
}

void tok_stream_init(TokStream *s, const Tokenizer *t, int skip_special) {
    memset(s, 0, sizeof(*s));
    s->t = t;
    s->skip_special = skip_special;
}

/* Emits the complete characters at the front of pending, and invalid bytes as U+FFFD (one per
 * maximal subpart). A valid but unfinished tail waits for more bytes, unless final. */
static void drain(TokStream *s, OutBuf *o, int final) {
    while (s->n_pending) {
        int bad = 0;
        int k = utf8_seq_len(s->pending, (size_t)s->n_pending, &bad);
        if (k) {
            out_append(o, (char *)s->pending, (size_t)k);   /* a whole character */
        } else if (!final && bad >= s->n_pending) {
            break;                                          /* wait for the rest of it */
        } else {
            out_append(o, "\xEF\xBF\xBD", 3);
            k = bad;
        }
        memmove(s->pending, s->pending + k, (size_t)(s->n_pending - k));
        s->n_pending -= k;
    }
}

static void stream_bytes(TokStream *s, const unsigned char *b, size_t n, OutBuf *o) {
    for (size_t i = 0; i < n; i++) {
        s->pending[s->n_pending++] = b[i];
        drain(s, o, 0);
    }
}

void tok_stream_push(TokStream *s, int id, char **buf, size_t *len, size_t *cap) {
    OutBuf o = {buf, len, cap};
    const Tokenizer *t = s->t;
    if (id < 0 || id >= t->n_vocab) return;
    if (s->skip_special && (t->flags[id] & TOKF_SPECIAL)) return;
    const unsigned char *b = (const unsigned char *)t->tok_bytes[id];
    size_t n = t->tok_len[id];
    if (s->n_seen++ == 0 && t->kind == TOK_KIND_SPM && (t->flags[id] & TOKF_LEAD_SPACE)) {
        b++; /* SentencePiece's dummy prefix: the first token's leading "▁" is not text */
        n--;
    }
    stream_bytes(s, b, n, &o);
}

void tok_stream_flush(TokStream *s, char **buf, size_t *len, size_t *cap) {
    OutBuf o = {buf, len, cap};
    drain(s, &o, 1);   /* an unfinished character at the end becomes U+FFFD */
}

char *tokenizer_decode(Tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                       size_t *len_out) {
    TokStream s;
    tok_stream_init(&s, t, skip_special);
    char *buf = NULL;
    size_t len = 0, cap = 0;
    OutBuf o = {&buf, &len, &cap};
    out_append(&o, "", 0);
    for (size_t i = 0; i < n; i++) tok_stream_push(&s, ids[i], &buf, &len, &cap);
    tok_stream_flush(&s, &buf, &len, &cap);
    if (len_out) *len_out = len;
    return buf;
}

/* ---------------------------------------------------------------- benchmark */

double tokenizer_bench_mbps(Tokenizer *t, const char *text, size_t len, int repeats) {
    TokIds ids = {0};
    double best = 0;
    if (repeats < 1) repeats = 1;
    for (int r = 0; r < repeats; r++) {
        double t0 = now_seconds();
        size_t start = 0;
        for (size_t i = 0; i <= len; i++) {
            if (i < len && text[i] != '\n') continue;
            ids.n = 0;
            tokenizer_encode(t, text + start, i - start, 0, &ids, NULL);
            start = i + 1;
        }
        double dt = now_seconds() - t0;
        double mbps = dt > 0 ? (double)len / 1e6 / dt : 0;
        if (mbps > best) best = mbps;
    }
    tok_ids_free(&ids);
    return best;
}
