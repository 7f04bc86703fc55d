/* vocab.c — the containers the tokenizer's parts share (tokenizer.c, bpe.c, spm.cpp, chat.c): the
 * growable id list, the string -> id hash map, the UTF-8 helpers, a tokenizer's per-token tables and
 * its list of special tokens. Declared in tok_internal.h (tokenizer_piece_to_id and TokIds in
 * tokenizer.h). Does not know a tokenizer model or a file format: opening, encoding and decoding
 * are tokenizer.c's, the models bpe.c's and spm.cpp's. */
#include "tokenizer/tok_internal.h"
#include "runtime/util.h"
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- small containers */

void tok_ids_push(TokIds *v, int32_t id) {
    if (v->n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 64;
        v->ids = xrealloc(v->ids, v->cap * sizeof(int32_t));
    }
    v->ids[v->n++] = id;
}

void tok_ids_free(TokIds *v) {
    free(v->ids);
    v->ids = NULL;
    v->n = v->cap = 0;
}

uint64_t tok_hash_bytes(const char *s, size_t len) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ULL;
    }
    return h;
}

void strmap_init(StrMap *m, size_t expected) {
    size_t cap = 16;
    while (cap < expected * 2) cap *= 2;
    m->cap = cap;
    m->n = 0;
    m->keys = xcalloc(cap, sizeof(char *));
    m->key_lens = xcalloc(cap, sizeof(uint32_t));
    m->vals = xcalloc(cap, sizeof(int32_t));
}

void strmap_free(StrMap *m) {
    if (!m->keys) return;
    for (size_t i = 0; i < m->cap; i++) free(m->keys[i]);
    free(m->keys);
    free(m->key_lens);
    free(m->vals);
    memset(m, 0, sizeof(*m));
}

static size_t strmap_slot(const StrMap *m, const char *key, size_t len) {
    size_t i = (size_t)tok_hash_bytes(key, len) & (m->cap - 1);
    while (m->keys[i] && !(m->key_lens[i] == len && memcmp(m->keys[i], key, len) == 0))
        i = (i + 1) & (m->cap - 1);
    return i;
}

void strmap_put(StrMap *m, const char *key, size_t len, int32_t val) {
    if ((m->n + 1) * 2 > m->cap) { /* grow: rehash into twice the slots */
        StrMap g;
        strmap_init(&g, m->cap);
        for (size_t i = 0; i < m->cap; i++) {
            if (!m->keys[i]) continue;
            size_t j = strmap_slot(&g, m->keys[i], m->key_lens[i]);
            g.keys[j] = m->keys[i];
            g.key_lens[j] = m->key_lens[i];
            g.vals[j] = m->vals[i];
            g.n++;
        }
        free(m->keys);
        free(m->key_lens);
        free(m->vals);
        *m = g;
    }
    size_t i = strmap_slot(m, key, len);
    if (!m->keys[i]) {
        m->keys[i] = xmalloc(len + 1);
        memcpy(m->keys[i], key, len);
        m->keys[i][len] = 0;
        m->key_lens[i] = (uint32_t)len;
        m->n++;
    }
    m->vals[i] = val;
}

int32_t strmap_get(const StrMap *m, const char *key, size_t len) {
    if (!m->cap) return -1;
    size_t i = strmap_slot(m, key, len);
    return m->keys[i] ? m->vals[i] : -1;
}

/* ---------------------------------------------------------------- UTF-8 */

int utf8_seq_len(const unsigned char *s, size_t n, int *bad) {
    unsigned c = s[0];
    int need;
    unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c < 0x80) return 1;
    else if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) { need = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { need = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else { *bad = 1; return 0; }
    for (int k = 1; k < need; k++) {
        if ((size_t)k >= n) { *bad = k; return 0; } /* truncated */
        unsigned b = s[k];
        unsigned l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (b < l || b > h) { *bad = k; return 0; }
    }
    return need;
}

char *utf8_sanitize(const char *s, size_t len, size_t *out_len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    int bad = 0;
    while (i < len) { /* fast path: valid text is not copied */
        if (u[i] < 0x80) { i++; continue; }
        int k = utf8_seq_len(u + i, len - i, &bad);
        if (!k) break;
        i += (size_t)k;
    }
    if (i == len) return NULL;
    char *o = xmalloc(len * 3 + 1);
    size_t n = 0;
    memcpy(o, s, i);
    n = i;
    while (i < len) {
        int k = utf8_seq_len(u + i, len - i, &bad);
        if (k) {
            memcpy(o + n, s + i, (size_t)k);
            n += (size_t)k;
            i += (size_t)k;
        } else {
            memcpy(o + n, "\xEF\xBF\xBD", 3);
            n += 3;
            i += (size_t)bad;
        }
    }
    o[n] = 0;
    *out_len = n;
    return o;
}

/* ---------------------------------------------------------------- a tokenizer's vocabulary */

static int cmp_special_longest_first(const void *a, const void *b) {
    const SpecialTok *x = a, *y = b;
    if (x->len != y->len) return x->len < y->len ? 1 : -1;
    return memcmp(x->text, y->text, x->len);
}

void tok_add_special(Tokenizer *t, const char *text, int32_t id) {
    size_t len = strlen(text);
    if (!len) return;
    for (int i = 0; i < t->n_specials; i++)
        if (t->specials[i].len == len && !memcmp(t->specials[i].text, text, len)) return;
    t->specials = xrealloc(t->specials, (size_t)(t->n_specials + 1) * sizeof(SpecialTok));
    t->specials[t->n_specials++] = (SpecialTok){xstrdup(text), len, id};
    qsort(t->specials, (size_t)t->n_specials, sizeof(SpecialTok), cmp_special_longest_first);
    t->special_first[(unsigned char)text[0]] = 1;
}

void tok_alloc_vocab(Tokenizer *t, int V) {
    t->n_vocab = V;
    t->pieces = xcalloc((size_t)V, sizeof(char *));
    t->tok_bytes = xcalloc((size_t)V, sizeof(char *));
    t->tok_len = xcalloc((size_t)V, sizeof(uint32_t));
    t->flags = xcalloc((size_t)V, 1);
    strmap_init(&t->piece_ids, (size_t)V);
}

int tokenizer_piece_to_id(const Tokenizer *t, const char *piece) {
    return strmap_get(&t->piece_ids, piece, strlen(piece));
}
