/* tokenizer.h — one C API over two tokenizer families:
 *   - SentencePiece models (tokenizer.model), through libsentencepiece (tokenizer/spm.cpp shim);
 *   - Hugging Face tokenizer.json byte-level BPE (GPT-2, Llama-3, Qwen2, MiniMind), in C (bpe.c).
 * Plus streaming decode (TokStream) and chat templates with SFT loss masks (chat.c).
 *
 * Text conventions:
 *   - Input text is UTF-8. Invalid UTF-8 is never an error: each maximal invalid subsequence is
 *     replaced by U+FFFD before encoding (Python's bytes.decode("utf-8", "replace") rule).
 *   - Special/added tokens written in the text ("<s>", "<|im_start|>") are matched before the model
 *     runs, as HF does; SentencePiece encodes each stretch between them with its own dummy prefix
 *     (Llama-2 "legacy" behaviour).
 *   - Decoded text is always valid UTF-8: bytes that do not form a character become U+FFFD.
 *     SentencePiece: the first token's leading "▁" is dropped (HF / spm decode).
 *
 * Errors: functions that can fail on user input return NULL / -1 and write one line (no prefix,
 * naming the file and field) into err; callers prefix "tandem: ". Nothing here exits the process.
 * This file does not own model loading. */
#ifndef TANDEM_TOKENIZER_H
#define TANDEM_TOKENIZER_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct Tokenizer Tokenizer;

typedef enum { TOK_KIND_SPM, TOK_KIND_BPE } TokKind;

/* Growable id list. Zero-initialise, append with tokenizer_encode*, release with tok_ids_free. */
typedef struct {
    int32_t *ids;
    size_t n, cap;
} TokIds;
void tok_ids_push(TokIds *v, int32_t id);
void tok_ids_free(TokIds *v);

/* Open a tokenizer from a model directory (tokenizer.model preferred, else tokenizer.json; plus
 * tokenizer_config.json / config.json / generation_config.json beside it) or from a file
 * (*.json -> HF tokenizer.json, anything else -> SentencePiece model; config files are then read
 * from the file's directory). Special ids: tokenizer_config.json tokens take precedence over
 * config.json ids, then generation_config.json, then the model's own. Returns NULL and fills err
 * (e.g. "x/tokenizer.json: pre_tokenizer type \"Metaspace\" is not supported") on failure. */
Tokenizer *tokenizer_open(const char *path, char *err, size_t errlen);
void tokenizer_free(Tokenizer *t);

TokKind tokenizer_kind(const Tokenizer *t);
int tokenizer_vocab_size(const Tokenizer *t);
int tokenizer_bos_id(const Tokenizer *t);   /* -1 when the tokenizer has none */
int tokenizer_eos_id(const Tokenizer *t);   /* -1 when none */
int tokenizer_pad_id(const Tokenizer *t);   /* -1 when none */
int tokenizer_add_bos_default(const Tokenizer *t); /* 1 if HF would add BOS by default */
/* Raw chat_template string from tokenizer_config.json, NULL when absent. */
const char *tokenizer_chat_template(const Tokenizer *t);

/* Id of a piece string; -1 when not in the vocabulary. */
int tokenizer_piece_to_id(const Tokenizer *t, const char *piece);

enum { TOK_ADD_BOS = 1, TOK_ADD_EOS = 2 };
/* Append the ids of text[0..len) to out (flags: TOK_ADD_BOS / TOK_ADD_EOS). If starts is not NULL
 * it receives, per appended id, the byte offset in text where that token begins (BOS/EOS get the
 * offset 0 / len); it must be a TokIds used in step with out. */
void tokenizer_encode(Tokenizer *t, const char *text, size_t len, unsigned flags, TokIds *out,
                      TokIds *starts);

/* Decode ids to a malloc'd NUL-terminated UTF-8 string (length in *len_out if not NULL).
 * skip_special drops control/special tokens. */
char *tokenizer_decode(Tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                       size_t *len_out);

/* Streaming decode: feed ids one at a time, get text that is final. Never emits a broken UTF-8
 * sequence: bytes of an unfinished character wait for the next token. Emitted text after k ids,
 * followed by tok_stream_flush, equals tokenizer_decode of those k ids. */
typedef struct {
    const Tokenizer *t;
    int skip_special;
    int n_seen;                 /* tokens pushed so far (the first one drops its leading "▁") */
    unsigned char pending[8];   /* bytes of an unfinished UTF-8 character */
    int n_pending;
} TokStream;
void tok_stream_init(TokStream *s, const Tokenizer *t, int skip_special);
/* Appends finished text for id to buf (grown with realloc; *len and *cap updated). */
void tok_stream_push(TokStream *s, int id, char **buf, size_t *len, size_t *cap);
/* End of sequence: pending bytes become U+FFFD. */
void tok_stream_flush(TokStream *s, char **buf, size_t *len, size_t *cap);

/* Encode throughput in MB/s (1e6 bytes of input per second), best of `repeats` runs over text,
 * encoded line by line (as spm_encode does), without BOS. */
double tokenizer_bench_mbps(Tokenizer *t, const char *text, size_t len, int repeats);

/* ---- chat templates (chat.c) ----
 * Jinja is not executed: the chat_template string is recognised as one of the formats below (or a
 * name overrides it) and rendered by C code that reproduces transformers' apply_chat_template. */
typedef enum {
    CHAT_LLAMA2,       /* <s>[INST] <<SYS>>\n..\n<</SYS>>\n\nuser [/INST] answer </s> */
    CHAT_MISTRAL,      /* <s>[INST] user [/INST]answer</s> (no system role) */
    CHAT_CHATML,       /* <|im_start|>role\ncontent<|im_end|>\n (Qwen2, MiniMind 1) */
    CHAT_CHATML_THINK, /* ChatML whose assistant turns carry <think>\n..\n</think>\n\n (MiniMind 2, Qwen3-style) */
    CHAT_LLAMA3,       /* <|begin_of_text|><|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> */
    CHAT_QWEN3,        /* Qwen3's hybrid ChatML: think blocks after the last user query, tool turns; thinking mode */
    CHAT_QWEN3_NOTHINK,/* the same with enable_thinking=False: the generation prompt closes an empty think block */
} ChatFormat;

typedef struct {
    const char *role;    /* "system" | "user" | "assistant" (| "tool": qwen3) */
    const char *content;
} ChatMessage;

/* Name -> format ("llama2", "mistral", "chatml", "chatml-think", "llama3", "qwen3", "qwen3-nothink"); -1 if
 * unknown. */
int chat_format_from_name(const char *name);
const char *chat_format_name(ChatFormat f);
/* Recognise a tokenizer_config.json chat_template string; -1 if it matches no known format. */
int chat_format_detect(const char *template_text);
/* The format for t: name if not NULL, else detected from t's chat_template. -1 + err if neither. */
int chat_format_resolve(const Tokenizer *t, const char *name, char *err, size_t errlen);

/* The entries of a JSON messages array (arr_key names it in errors: "messages", "conversations")
 * as ChatMessage: the role from field role_key, the content from field content_key (a null
 * content is ""), pointers into arr (valid while it lives). m has room for every entry. Every
 * command reads chat messages through this. Returns the count, or -1 with err, one of:
 *   field "<arr_key>" is not an array | <arr_key>[i] is not an object |
 *   <arr_key>[i]: field "<key>" missing | <arr_key>[i]: field "<key>" is not a string
 * (callers prefix the file and line). Role values are not checked here (chat_render does). */
struct cJSON;
int chat_messages_parse(const struct cJSON *arr, const char *arr_key, const char *role_key, const char *content_key,
                        ChatMessage *m, char *err, size_t errlen);

/* Render messages to ids plus a per-id loss mask: 1 for tokens of assistant content and the
 * assistant's end-of-turn token (</s>, <|im_end|>, <|eot_id|>), 0 elsewhere (what SFT trains on,
 * as OpenRLHF / HF's assistant mask). add_generation_prompt appends the assistant header.
 * Returns 0, or -1 with err (role order the format forbids, unknown role). */
int chat_render(Tokenizer *t, ChatFormat f, const ChatMessage *msgs, int n_msgs,
                int add_generation_prompt, TokIds *ids, TokIds *mask, char *err, size_t errlen);
/* Same, text only (malloc'd) with a per-byte mask (malloc'd, *len bytes); for tests and tools. */
char *chat_render_text(const Tokenizer *t, ChatFormat f, const ChatMessage *msgs, int n_msgs,
                       int add_generation_prompt, unsigned char **byte_mask, size_t *len,
                       char *err, size_t errlen);
#ifdef __cplusplus
}
#endif
#endif
