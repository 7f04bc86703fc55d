/* bpe.c — Hugging Face tokenizer.json byte-level BPE (GPT-2, Llama-3, Qwen2, MiniMind) in C.
 *
 * Pipeline for one stretch of text without added tokens (tokenizer.c matches those first):
 *   pre-tokenizer regex splits (PCRE2, UTF + UCP: \p{L} \p{N} \s are Unicode) -> each piece's bytes
 *   -> byte-to-unicode characters (GPT-2's table) -> ranked merges -> ids.
 * Supported: model BPE (merges as "a b" strings or ["a", "b"] pairs, ignore_merges), normalizer
 * null or NFC (Qwen2; libutf8proc, applied to text outside added tokens as HF does), pre_tokenizer ByteLevel or Sequence of Split(Regex, Isolated) + ByteLevel, decoder
 * ByteLevel (or null), post_processor ByteLevel / TemplateProcessing (its leading special token is
 * the BOS). Anything else is refused with an error naming the type. JSON is read with cJSON. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/tok_internal.h"
#include "runtime/util.h"
#include <cjson/cJSON.h>
#include <pcre2.h>
#include <utf8proc.h>
#include <stdlib.h>
#include <string.h>

/* GPT-2's split pattern (HF ByteLevel with use_regex). */
static const char *GPT2_PATTERN =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

#define MAX_SPLITS 4
#define CACHE_MAX_ENTRIES (1 << 20)
#define CACHE_MAX_WORD 128

typedef struct {
    uint64_t key;   /* (left id << 32) | right id, + 1 so 0 means empty */
    int32_t rank, merged;
} PairSlot;

struct Bpe {
    Tokenizer *t;
    char byte_str[256][3];  /* byte -> its stand-in character (UTF-8, NUL-terminated) */
    int32_t byte_tok[256];  /* byte -> id of the one-character token, -1 if absent */
    PairSlot *pairs;        /* merge table, open addressing */
    size_t pairs_cap;
    int ignore_merges;
    int add_prefix_space;
    int nfc;                /* normalizer NFC: compose the text before splitting */
    pcre2_code *splits[MAX_SPLITS];
    int n_splits;
    pcre2_match_data *md;
    StrMap cache;           /* raw word bytes -> offset in cache_pool (count, ids...) */
    TokIds cache_pool;
    /* scratch for one word: symbols as a linked list, merge candidates as a heap */
    int32_t *sym, *next, *prev;
    size_t sym_cap;
    struct Cand *heap;
    size_t heap_n, heap_cap;
    char *mapped;
    size_t mapped_cap;
};

/* GPT-2 bytes_to_unicode: printable bytes stand for themselves, the other 68 map to U+0100.. */
static void byte_map_init(Bpe *b, int cp_to_byte[512]) {
    int n = 0;
    for (int i = 0; i < 512; i++) cp_to_byte[i] = -1;
    for (int byte = 0; byte < 256; byte++) {
        int printable = (byte >= 33 && byte <= 126) || (byte >= 161 && byte <= 172) || byte >= 174;
        int cp = printable ? byte : 256 + n++;
        cp_to_byte[cp] = byte;
        if (cp < 0x80) { b->byte_str[byte][0] = (char)cp; b->byte_str[byte][1] = 0; }
        else {
            b->byte_str[byte][0] = (char)(0xC0 | (cp >> 6));
            b->byte_str[byte][1] = (char)(0x80 | (cp & 0x3F));
            b->byte_str[byte][2] = 0;
        }
    }
}

static size_t pair_slot(const Bpe *b, uint64_t key) {
    size_t i = (size_t)(key * 0x9E3779B97F4A7C15ULL >> 20) & (b->pairs_cap - 1);
    while (b->pairs[i].key && b->pairs[i].key != key) i = (i + 1) & (b->pairs_cap - 1);
    return i;
}

static inline uint64_t pair_key(int32_t a, int32_t c) {
    return (((uint64_t)(uint32_t)a << 32) | (uint32_t)c) + 1;
}

/* Decoded bytes of a vocabulary piece: each stand-in character back to its byte; characters
 * outside the table (only in odd vocabularies) are kept as UTF-8. */
static char *piece_to_bytes(const char *p, const int cp_to_byte[512], uint32_t *len) {
    size_t n = strlen(p), o = 0;
    char *r = xmalloc(n + 1);
    const unsigned char *u = (const unsigned char *)p;
    for (size_t i = 0; i < n;) {
        int cp = -1, k = 1;
        if (u[i] < 0x80) cp = u[i];
        else if ((u[i] & 0xE0) == 0xC0 && i + 1 < n) { cp = ((u[i] & 0x1F) << 6) | (u[i + 1] & 0x3F); k = 2; }
        if (cp >= 0 && cp < 512 && cp_to_byte[cp] >= 0) { r[o++] = (char)cp_to_byte[cp]; i += (size_t)k; }
        else { r[o++] = p[i++]; }
    }
    r[o] = 0;
    *len = (uint32_t)o;
    return r;
}

static pcre2_code *compile_regex(const char *pat, const char *path, char *err, size_t errlen) {
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                   &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof(msg));
        snprintf(err, errlen, "%s: pre_tokenizer regex does not compile at offset %zu: %s", path,
                 (size_t)eo, (char *)msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter if JIT is absent */
    return re;
}

static const char *type_of(const cJSON *o) {
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(ty) ? ty->valuestring : "?";
}

/* One pre-tokenizer entry (top level or inside a Sequence). 0 on success. */
static int parse_pretok(Bpe *b, const cJSON *p, const char *path, char *err, size_t errlen) {
    const char *ty = type_of(p);
    if (!strcmp(ty, "ByteLevel")) {
        const cJSON *ur = cJSON_GetObjectItemCaseSensitive(p, "use_regex");
        const cJSON *ap = cJSON_GetObjectItemCaseSensitive(p, "add_prefix_space");
        b->add_prefix_space = cJSON_IsTrue(ap);
        if (!cJSON_IsFalse(ur)) {
            if (b->n_splits == MAX_SPLITS) goto too_many;
            if (!(b->splits[b->n_splits++] = compile_regex(GPT2_PATTERN, path, err, errlen))) return -1;
        }
        return 0;
    }
    if (!strcmp(ty, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
        const cJSON *inv = cJSON_GetObjectItemCaseSensitive(p, "invert");
        if (!cJSON_IsString(re)) {
            snprintf(err, errlen, "%s: pre_tokenizer Split: only {\"Regex\": ...} patterns are supported", path);
            return -1;
        }
        if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated") || cJSON_IsTrue(inv)) {
            snprintf(err, errlen, "%s: pre_tokenizer Split behavior \"%s\"%s is not supported (supported: Isolated)",
                     path, cJSON_IsString(beh) ? beh->valuestring : "?", cJSON_IsTrue(inv) ? " with invert" : "");
            return -1;
        }
        if (b->n_splits == MAX_SPLITS) goto too_many;
        if (!(b->splits[b->n_splits++] = compile_regex(re->valuestring, path, err, errlen))) return -1;
        return 0;
    }
    if (!strcmp(ty, "Sequence")) {
        const cJSON *e, *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        cJSON_ArrayForEach(e, list) if (parse_pretok(b, e, path, err, errlen)) return -1;
        return 0;
    }
    snprintf(err, errlen, "%s: pre_tokenizer type \"%s\" is not supported (supported: ByteLevel, "
             "Split, Sequence)", path, ty);
    return -1;
too_many:
    snprintf(err, errlen, "%s: more than %d pre_tokenizer splits", path, MAX_SPLITS);
    return -1;
}

void bpe_free(Bpe *b) {
    if (!b) return;
    for (int i = 0; i < b->n_splits; i++) pcre2_code_free(b->splits[i]);
    if (b->md) pcre2_match_data_free(b->md);
    free(b->pairs);
    strmap_free(&b->cache);
    tok_ids_free(&b->cache_pool);
    free(b->sym);
    free(b->next);
    free(b->prev);
    free(b->heap);
    free(b->mapped);
    free(b);
}

/* The five sections of a tokenizer.json, read in this order (the first error is the one
 * reported). Each returns 0, or -1 with err. */

/* normalizer: none, or NFC (composed before splitting). */
static int bpe_read_normalizer(Bpe *b, const cJSON *j, const char *path, char *err, size_t errlen) {
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(j, "normalizer");
    if (norm && !cJSON_IsNull(norm)) {
        if (strcmp(type_of(norm), "NFC")) {
            snprintf(err, errlen, "%s: normalizer type \"%s\" is not supported (supported: none, NFC)", path,
                     type_of(norm));
            return -1;
        }
        b->nfc = 1;
    }
    return 0;
}

/* pre_tokenizer (the regex splits) and its mirror, the decoder: both byte-level. */
static int bpe_read_pretokenizer(Bpe *b, const cJSON *j, const char *path, char *err, size_t errlen) {
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(j, "pre_tokenizer");
    if (!cJSON_IsObject(pre)) {
        snprintf(err, errlen, "%s: pre_tokenizer missing (only byte-level BPE is supported)", path);
        return -1;
    }
    if (parse_pretok(b, pre, path, err, errlen)) return -1;
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(j, "decoder");
    if (dec && !cJSON_IsNull(dec) && strcmp(type_of(dec), "ByteLevel")) {
        snprintf(err, errlen, "%s: decoder type \"%s\" is not supported (supported: ByteLevel)", path, type_of(dec));
        return -1;
    }
    return 0;
}

/* Vocabulary: model.vocab plus added_tokens (ids may leave gaps, filled with ""); each piece's
 * bytes, the specials, and the one-byte tokens of the byte map. */
static int bpe_read_vocab(Bpe *b, const cJSON *j, const cJSON *model, const int cp_to_byte[512], const char *path,
                          char *err, size_t errlen) {
    Tokenizer *t = b->t;
    const cJSON *sfx = cJSON_GetObjectItemCaseSensitive(model, "end_of_word_suffix");
    const cJSON *pfx = cJSON_GetObjectItemCaseSensitive(model, "continuing_subword_prefix");
    if ((cJSON_IsString(sfx) && sfx->valuestring[0]) || (cJSON_IsString(pfx) && pfx->valuestring[0])) {
        snprintf(err, errlen, "%s: BPE with continuing_subword_prefix/end_of_word_suffix is not supported", path);
        return -1;
    }
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(j, "added_tokens");
    if (!cJSON_IsObject(vocab)) { snprintf(err, errlen, "%s: field \"model.vocab\" missing", path); return -1; }
    int V = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        if (!cJSON_IsNumber(e) || e->valueint < 0) {
            snprintf(err, errlen, "%s: model.vocab[\"%s\"] is not a non-negative id", path, e->string);
            return -1;
        }
        if (e->valueint + 1 > V) V = e->valueint + 1;
    }
    cJSON_ArrayForEach(e, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!cJSON_IsNumber(id) || id->valueint < 0 || !cJSON_IsString(c)) {
            snprintf(err, errlen, "%s: added_tokens entry without \"id\"/\"content\"", path);
            return -1;
        }
        if (id->valueint + 1 > V) V = id->valueint + 1;
    }
    tok_alloc_vocab(t, V);
    cJSON_ArrayForEach(e, vocab) {
        int id = e->valueint;
        free(t->pieces[id]);
        free(t->tok_bytes[id]);
        t->pieces[id] = xstrdup(e->string);
        t->tok_bytes[id] = piece_to_bytes(e->string, cp_to_byte, &t->tok_len[id]);
        strmap_put(&t->piece_ids, e->string, strlen(e->string), id);
    }
    cJSON_ArrayForEach(e, added) {
        int id = cJSON_GetObjectItemCaseSensitive(e, "id")->valueint;
        const char *c = cJSON_GetObjectItemCaseSensitive(e, "content")->valuestring;
        free(t->pieces[id]);
        free(t->tok_bytes[id]);
        t->pieces[id] = xstrdup(c);
        t->tok_bytes[id] = xstrdup(c);
        t->tok_len[id] = (uint32_t)strlen(c);
        strmap_put(&t->piece_ids, c, strlen(c), id);
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "special"))) t->flags[id] |= TOKF_SPECIAL;
        tok_add_special(t, c, id);
    }
    for (int id = 0; id < V; id++)
        if (!t->pieces[id]) { t->pieces[id] = xstrdup(""); t->tok_bytes[id] = xstrdup(""); }
    for (int byte = 0; byte < 256; byte++)
        b->byte_tok[byte] = strmap_get(&t->piece_ids, b->byte_str[byte], strlen(b->byte_str[byte]));
    return 0;
}

/* model.merges into the pair table: rank = position; "a b" or ["a", "b"]. Needs the vocabulary. */
static int bpe_read_merges(Bpe *b, const cJSON *model, const char *path, char *err, size_t errlen) {
    const Tokenizer *t = b->t;
    b->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));
    const cJSON *e, *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    int n_merges = cJSON_GetArraySize(merges);
    b->pairs_cap = 16;
    while (b->pairs_cap < (size_t)n_merges * 2) b->pairs_cap *= 2;
    b->pairs = xcalloc(b->pairs_cap, sizeof(PairSlot));
    int rank = 0;
    char *buf = NULL;
    size_t buf_cap = 0;
    cJSON_ArrayForEach(e, merges) {
        const char *l, *r;
        size_t ll, rl;
        if (cJSON_IsString(e)) {
            const char *sp = strchr(e->valuestring, ' ');
            if (!sp) { snprintf(err, errlen, "%s: model.merges[%d] \"%s\" has no space", path, rank, e->valuestring); free(buf); return -1; }
            l = e->valuestring; ll = (size_t)(sp - l);
            r = sp + 1; rl = strlen(r);
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(e->child) &&
                   cJSON_IsString(e->child->next)) {
            l = e->child->valuestring; ll = strlen(l);
            r = e->child->next->valuestring; rl = strlen(r);
        } else {
            snprintf(err, errlen, "%s: model.merges[%d] is neither \"a b\" nor [\"a\", \"b\"]", path, rank);
            free(buf);
            return -1;
        }
        if (ll + rl + 1 > buf_cap) { buf_cap = (ll + rl + 1) * 2; buf = xrealloc(buf, buf_cap); }
        memcpy(buf, l, ll);
        memcpy(buf + ll, r, rl);
        int32_t a = strmap_get(&t->piece_ids, l, ll), c = strmap_get(&t->piece_ids, r, rl);
        int32_t m = strmap_get(&t->piece_ids, buf, ll + rl);
        if (a >= 0 && c >= 0 && m >= 0) { /* merges naming unknown tokens can never apply */
            size_t s = pair_slot(b, pair_key(a, c));
            if (!b->pairs[s].key) b->pairs[s] = (PairSlot){pair_key(a, c), rank, m};
        }
        rank++;
    }
    free(buf);
    return 0;
}

/* post_processor TemplateProcessing whose single template starts with a special token: that
 * token is the BOS, added by default. Anything else adds nothing; never an error. */
static void bpe_read_post(Tokenizer *t, const cJSON *j) {
    const cJSON *post = cJSON_GetObjectItemCaseSensitive(j, "post_processor");
    if (cJSON_IsObject(post) && !strcmp(type_of(post), "Sequence")) { /* Llama-3: [ByteLevel, Template] */
        const cJSON *pp;
        cJSON_ArrayForEach(pp, cJSON_GetObjectItemCaseSensitive(post, "processors"))
            if (!strcmp(type_of(pp), "TemplateProcessing")) post = pp;
    }
    if (cJSON_IsObject(post) && !strcmp(type_of(post), "TemplateProcessing")) {
        const cJSON *first = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(post, "single"), 0);
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(first, "SpecialToken");
        const cJSON *sid = cJSON_GetObjectItemCaseSensitive(st, "id");
        if (cJSON_IsString(sid) && (t->bos_id = tokenizer_piece_to_id(t, sid->valuestring)) >= 0)
            t->add_bos = 1;
    }
}

Bpe *bpe_load(Tokenizer *t, const char *path, const char *json_text, char *err, size_t errlen) {
    cJSON *j = cJSON_Parse(json_text);
    Bpe *b = xcalloc(1, sizeof(Bpe));
    int cp_to_byte[512];
    b->t = t;
    byte_map_init(b, cp_to_byte);
    if (!j) {
        snprintf(err, errlen, "%s: not valid JSON (near byte %zu)", path,
                 cJSON_GetErrorPtr() ? (size_t)(cJSON_GetErrorPtr() - json_text) : (size_t)0);
        goto fail;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model");
    if (!cJSON_IsObject(model)) { snprintf(err, errlen, "%s: field \"model\" missing", path); goto fail; }
    const char *mty = type_of(model);
    if (strcmp(mty, "BPE")) {
        snprintf(err, errlen, "%s: tokenizer model type \"%s\" is not supported (supported: BPE)", path, mty);
        goto fail;
    }
    if (bpe_read_normalizer(b, j, path, err, errlen) || bpe_read_pretokenizer(b, j, path, err, errlen) ||
        bpe_read_vocab(b, j, model, cp_to_byte, path, err, errlen) || bpe_read_merges(b, model, path, err, errlen))
        goto fail;
    bpe_read_post(t, j);
    b->md = pcre2_match_data_create(1, NULL);
    strmap_init(&b->cache, 1024);
    cJSON_Delete(j);
    return b;
fail:
    cJSON_Delete(j);
    bpe_free(b);
    return NULL;
}

/* ---------------------------------------------------------------- encode */

typedef struct Cand {
    int32_t rank, pos, left, right, merged;
} Cand;

static int cand_less(const Cand *a, const Cand *c) {
    return a->rank < c->rank || (a->rank == c->rank && a->pos < c->pos);
}

static void heap_push_pair(Bpe *b, int32_t pos, int32_t left, int32_t right) {
    const PairSlot *p = &b->pairs[pair_slot(b, pair_key(left, right))];
    if (!p->key) return;
    if (b->heap_n == b->heap_cap) {
        b->heap_cap = b->heap_cap ? b->heap_cap * 2 : 64;
        b->heap = xrealloc(b->heap, b->heap_cap * sizeof(Cand));
    }
    Cand c = {p->rank, pos, left, right, p->merged};
    size_t i = b->heap_n++;
    while (i && cand_less(&c, &b->heap[(i - 1) / 2])) { b->heap[i] = b->heap[(i - 1) / 2]; i = (i - 1) / 2; }
    b->heap[i] = c;
}

static Cand heap_pop(Bpe *b) {
    Cand top = b->heap[0], last = b->heap[--b->heap_n];
    size_t i = 0;
    for (;;) {
        size_t k = 2 * i + 1;
        if (k >= b->heap_n) break;
        if (k + 1 < b->heap_n && cand_less(&b->heap[k + 1], &b->heap[k])) k++;
        if (!cand_less(&b->heap[k], &last)) break;
        b->heap[i] = b->heap[k];
        i = k;
    }
    if (b->heap_n) b->heap[i] = last;
    return top;
}

static void emit_ids(Bpe *b, const int32_t *ids, size_t n, size_t base, TokIds *out, TokIds *starts) {
    for (size_t i = 0; i < n; i++) {
        tok_ids_push(out, ids[i]);
        if (starts) {
            tok_ids_push(starts, (int32_t)base);
            base += b->t->tok_len[ids[i]];
        }
    }
}

/* BPE on one pre-tokenized word: start from one token per byte, merge the lowest-ranked adjacent
 * pair until none applies. Results of short words are cached. */
static void bpe_word(Bpe *b, const char *w, size_t len, size_t base, TokIds *out, TokIds *starts) {
    int32_t c = len <= CACHE_MAX_WORD ? strmap_get(&b->cache, w, len) : -1;
    if (c >= 0) {
        emit_ids(b, b->cache_pool.ids + c + 1, (size_t)b->cache_pool.ids[c], base, out, starts);
        return;
    }
    if (b->ignore_merges) { /* the whole word is a token: take it (Llama-3) */
        if (len * 2 + 1 > b->mapped_cap) { b->mapped_cap = len * 2 + 1; b->mapped = xrealloc(b->mapped, b->mapped_cap); }
        size_t m = 0;
        for (size_t i = 0; i < len; i++) {
            const char *s = b->byte_str[(unsigned char)w[i]];
            while (*s) b->mapped[m++] = *s++;
        }
        int32_t id = strmap_get(&b->t->piece_ids, b->mapped, m);
        if (id >= 0 && !(b->t->flags[id] & TOKF_SPECIAL)) {
            emit_ids(b, &id, 1, base, out, starts);
            return;
        }
    }
    if (len > b->sym_cap) {
        b->sym_cap = len * 2;
        b->sym = xrealloc(b->sym, b->sym_cap * sizeof(int32_t));
        b->next = xrealloc(b->next, b->sym_cap * sizeof(int32_t));
        b->prev = xrealloc(b->prev, b->sym_cap * sizeof(int32_t));
    }
    int32_t *sym = b->sym, *next = b->next, *prev = b->prev;
    int32_t n = 0;
    for (size_t i = 0; i < len; i++) {
        int32_t id = b->byte_tok[(unsigned char)w[i]];
        if (id >= 0) sym[n++] = id; /* a byte without a token cannot be encoded: dropped */
    }
    for (int32_t i = 0; i < n; i++) { prev[i] = i - 1; next[i] = i + 1 < n ? i + 1 : -1; }
    /* Merge candidates in a min-heap ordered by (rank, position): the same order as merging the
     * lowest-ranked, leftmost pair each time (HF's word.merge_all), in O(n log n). */
    b->heap_n = 0;
    for (int32_t i = 0; i + 1 < n; i++) heap_push_pair(b, i, sym[i], sym[i + 1]);
    while (b->heap_n) {
        Cand c = heap_pop(b);
        int32_t r = next[c.pos];
        if (sym[c.pos] != c.left || r < 0 || sym[r] != c.right) continue; /* stale */
        sym[c.pos] = c.merged;
        sym[r] = -1;
        next[c.pos] = next[r];
        if (next[r] >= 0) prev[next[r]] = c.pos;
        if (prev[c.pos] >= 0) heap_push_pair(b, prev[c.pos], sym[prev[c.pos]], sym[c.pos]);
        if (next[c.pos] >= 0) heap_push_pair(b, c.pos, sym[c.pos], sym[next[c.pos]]);
    }
    int32_t m = 0;
    for (int32_t i = n ? 0 : -1; i >= 0; i = next[i]) sym[m++] = sym[i];
    n = m;
    if (len <= CACHE_MAX_WORD && b->cache.n < CACHE_MAX_ENTRIES) {
        strmap_put(&b->cache, w, len, (int32_t)b->cache_pool.n);
        tok_ids_push(&b->cache_pool, (int32_t)n);
        for (int32_t i = 0; i < n; i++) tok_ids_push(&b->cache_pool, sym[i]);
    }
    emit_ids(b, sym, (size_t)n, base, out, starts);
}

/* Split s by regex number `level` (matches and the gaps between them are pieces, HF "Isolated"),
 * then by the next level, then BPE. */
static void split_level(Bpe *b, int level, const char *s, size_t len, size_t base, TokIds *out,
                        TokIds *starts) {
    if (!len) return;
    if (level == b->n_splits) { bpe_word(b, s, len, base, out, starts); return; }
    pcre2_code *re = b->splits[level];
    size_t pos = 0, gap = 0;
    while (pos < len) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, len, pos, PCRE2_NO_UTF_CHECK, b->md, NULL);
        if (rc < 0) break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(b->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* empty match: step one character */
            pos = ms + 1;
            while (pos < len && ((unsigned char)s[pos] & 0xC0) == 0x80) pos++;
            continue;
        }
        if (ms > gap) split_level(b, level + 1, s + gap, ms - gap, base + gap, out, starts);
        split_level(b, level + 1, s + ms, me - ms, base + ms, out, starts);
        pos = gap = me;
    }
    if (gap < len) split_level(b, level + 1, s + gap, len - gap, base + gap, out, starts);
}

static void encode_chunk(Bpe *b, const char *text, size_t len, size_t base, TokIds *out, TokIds *starts);

/* NFC first when the tokenizer asks for it (text here is valid UTF-8: tokenizer.c replaced invalid
 * bytes). Token offsets then refer to the composed text; they are exact whenever the text was
 * already NFC, which composing leaves byte for byte unchanged. */
void bpe_encode_chunk(Bpe *b, const char *text, size_t len, size_t base, TokIds *out, TokIds *starts) {
    if (b->nfc && len) {
        utf8proc_uint8_t *n = NULL;
        utf8proc_ssize_t nl = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, &n,
                                           UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        CHECK(nl >= 0);
        encode_chunk(b, (const char *)n, (size_t)nl, base, out, starts);
        free(n);
        return;
    }
    encode_chunk(b, text, len, base, out, starts);
}

static void encode_chunk(Bpe *b, const char *text, size_t len, size_t base, TokIds *out, TokIds *starts) {
    if (b->add_prefix_space && text[0] != ' ') {
        /* ByteLevel add_prefix_space: the stretch is encoded as " " + text; the extra space
         * belongs to the first token (offset base). */
        char *tmp = xmalloc(len + 1);
        tmp[0] = ' ';
        memcpy(tmp + 1, text, len);
        size_t first = out->n;
        split_level(b, 0, tmp, len + 1, base, out, starts);
        if (starts) /* shift offsets back by the inserted byte */
            for (size_t i = first; i < starts->n; i++)
                if (starts->ids[i] > (int32_t)base) starts->ids[i]--;
        free(tmp);
        return;
    }
    split_level(b, 0, text, len, base, out, starts);
}
