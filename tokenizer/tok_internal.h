/* tok_internal.h — what tokenizer.c, vocab.c, spm.cpp, bpe.c and chat.c share; not part of the public
 * API. Owns the Tokenizer struct layout, the declarations of the shared containers (string->id hash
 * map, UTF-8 helpers, per-token tables and specials; defined in vocab.c) and the model back-end entry
 * points (spm.cpp, bpe.c). */
#ifndef TANDEM_TOK_INTERNAL_H
#define TANDEM_TOK_INTERNAL_H
#include "tokenizer/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- string -> int map, open addressing; keys are copied ---- */
typedef struct {
    char **keys;
    uint32_t *key_lens;
    int32_t *vals;
    size_t cap, n; /* cap is a power of two */
} StrMap;
void strmap_init(StrMap *m, size_t expected);
/* The per-token tables of a V-token vocabulary (pieces, bytes, lengths, flags, piece -> id), zeroed. */
struct Tokenizer;
void tok_alloc_vocab(struct Tokenizer *t, int V);
void strmap_free(StrMap *m);
void strmap_put(StrMap *m, const char *key, size_t len, int32_t val); /* overwrites */
int32_t strmap_get(const StrMap *m, const char *key, size_t len);     /* -1 if absent */
uint64_t tok_hash_bytes(const char *s, size_t len);

/* per-token flags */
enum { TOKF_SPECIAL = 1, TOKF_LEAD_SPACE = 2 };

/* A string matched in the text before the model runs (special / added tokens). */
typedef struct {
    char *text;
    size_t len;
    int32_t id;
} SpecialTok;

typedef struct SpmModel SpmModel;
typedef struct Bpe Bpe;

struct Tokenizer {
    TokKind kind;
    char *path;             /* model file, for messages */
    int n_vocab;
    char **pieces;          /* [V] vocabulary strings */
    char **tok_bytes;       /* [V] bytes each token contributes to decoded text */
    uint32_t *tok_len;      /* [V] */
    unsigned char *flags;   /* [V] TOKF_* */
    StrMap piece_ids;       /* piece -> id */
    int bos_id, eos_id, pad_id;
    int add_bos;            /* default for callers that follow HF (tokenizer(text)) */
    char *chat_template;    /* from tokenizer_config.json, or NULL */
    int chatml_default_system; /* the template adds Qwen2's default system turn (read once at load) */
    SpecialTok *specials;   /* longest first */
    int n_specials;
    unsigned char special_first[256]; /* 1 if some special starts with this byte */
    SpmModel *spm;
    Bpe *bpe;
};

/* Register a special token for matching in text (kept sorted longest first by the caller). */
void tok_add_special(Tokenizer *t, const char *text, int32_t id);

/* ---- SentencePiece shim (spm.cpp) ---- */
SpmModel *spm_load(const char *path, char *err, size_t errlen);
void spm_free(SpmModel *m);
int spm_vocab_size(const SpmModel *m);
/* piece type: 0 normal, 1 control, 2 unknown, 3 byte, 4 unused/user-defined */
int spm_piece_type(const SpmModel *m, int id);
const char *spm_piece(const SpmModel *m, int id); /* valid while m lives */
int spm_bos_id(const SpmModel *m);
int spm_eos_id(const SpmModel *m);
int spm_pad_id(const SpmModel *m);
/* Encode a chunk (no specials inside); starts (may be NULL) gets base + byte offset per id. */
void spm_encode_chunk(SpmModel *m, const char *text, size_t len, size_t base, TokIds *out,
                      TokIds *starts);

/* ---- byte-level BPE (bpe.c) ---- */
/* Parses tokenizer.json text and fills t's vocabulary, specials and add_bos. NULL + err on failure. */
Bpe *bpe_load(Tokenizer *t, const char *path, const char *json_text, char *err, size_t errlen);
void bpe_free(Bpe *b);
void bpe_encode_chunk(Bpe *b, const char *text, size_t len, size_t base, TokIds *out,
                      TokIds *starts);

/* UTF-8 helpers (vocab.c) */
/* Length of the valid UTF-8 sequence at s[0..n) or 0 if it is invalid/truncated; *bad gets the
 * length of the maximal invalid subpart to replace by one U+FFFD. */
int utf8_seq_len(const unsigned char *s, size_t n, int *bad);
/* Copy of s with invalid sequences replaced by U+FFFD, or NULL if s is already valid. */
char *utf8_sanitize(const char *s, size_t len, size_t *out_len);

#ifdef __cplusplus
}
#endif
#endif
