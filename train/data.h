/* data.h — SFT data: jsonl / JSON-array files -> token ids + loss masks -> shuffled, packed
 * micro-batches (tokens, seq_start, targets) for the train loop, with a resumable cursor.
 * Owns: record parsing and format detection, tokenization of each record (once, at open),
 * over-long policy, bad-record policy, per-epoch shuffle, packing, batching, the cursor.
 * Does not own: the tokenizer (the caller opens and frees it; Data does not keep it), the model,
 * the loss, nor splitting batches over data-parallel ranks.
 * Implemented in data.c (Data, order, packing, batches, cursor) and records.c (files and records
 * -> samples, behind the internal train/records.h).
 *
 * ---- Files ----
 * The first non-blank character decides: '[' -> one JSON array of objects (Alpaca / LLaMA-Factory
 * .json files); anything else -> JSON lines (one object per non-blank line). Errors name the line
 * where the record (the array element) begins. The whole file is read into memory at open.
 *
 * ---- Records (detected per record, first match wins; key names are DataConfig fields) ----
 *   1. prompt/response  {"prompt": str, "response": str}
 *   2. Alpaca           {"instruction": str, "input": str (optional, null = ""), "output": str}
 *                       becomes prompt/response with
 *                           prompt   = instruction                    when input is ""
 *                           prompt   = instruction + "\n\n" + input   otherwise
 *                           response = output
 *                       (the one Alpaca template, used everywhere; other keys are ignored)
 *   3. chat             {"messages": [{"role": "system"|"user"|"assistant", "content": str}, ...]}
 *   4. ShareGPT         {"conversations": [{"from": str, "value": str}, ...], "system": str (opt.)}
 *                       from human|user -> user, gpt|assistant -> assistant, system -> system;
 *                       a top-level "system" string becomes a leading system message.
 *
 * ---- Sample = ids + mask (mask 1 = the model is trained to produce this token) ----
 *   prompt/response: ids  = [BOS] + encode(prompt) + encode(response) + [EOS]
 *                    mask = 0 on BOS and prompt, 1 on response and EOS.
 *                    BOS is added when the tokenizer has one (encode never adds it itself; each
 *                    encode() is a separate call, so SentencePiece gives each part its dummy "▁").
 *                    With pairs_as_chat the pair is rendered instead as the chat
 *                    [user: prompt, assistant: response] (below).
 *   chat / ShareGPT: ids and mask from chat_render(tokenizer, chat format, messages, no generation
 *                    prompt): mask 1 on assistant content and its end-of-turn token — exactly the
 *                    ids and mask `tandem tokenize --jsonl` prints for {"messages": ...}.
 *   train_on_prompt: mask = 1 on every token but the first (which is never a target anyway).
 *
 * Targets (what data_next_batch returns): within one sample of n tokens
 *     target[t] = mask[t+1] ? ids[t+1] : -1   for t < n-1,      target[n-1] = -1
 * so a sample never predicts across its end, and the loss counts exactly the mask-1 tokens
 * after the first (n_loss = number of targets >= 0).
 *
 * ---- Bad records (skip_bad_records = 0: user_error "FILE:LINE: what", exit 1;
 *                   skip_bad_records = 1: skipped, counted in stats.n_bad; the first 5 are printed
 *                   as warnings) ----
 *   checked first, from the record's bytes alone (the rules of every text input, runtime/jsonl.h):
 *   a record (a line, an array element) longer than jsonl_max_bytes(seq_len) = max(64 * seq_len,
 *   1 MiB) bytes ("a record of N bytes, over the limit of L bytes for seq_len S ..."), refused
 *   without tokenizing it; text that is not UTF-8 ("not valid UTF-8 (byte K)", FILE:LINE naming
 *   the line of the bad byte and K its byte in that line; never replaced by U+FFFD);
 *   then: invalid JSON; not an object; none of the four formats' keys; a field missing or not a string
 *   (null "input" / "content" count as ""; an empty prompt / instruction is allowed);
 *   messages / conversations not an array or empty, an entry not an object; unknown role / "from";
 *   no assistant turn; an empty response / output / assistant content (it would train only the end
 *   token: a data bug, not a sample); a role order the chat format rejects. A JSON array that never closes is always an error (file truncated).
 *   A missing chat format (chat records, no chat_template name, none recognised in the tokenizer)
 *   and a prompt/response record with a tokenizer without EOS are configuration errors: always
 *   user_error.
 *
 * ---- Over-long samples (more than seq_len tokens) ----
 *   OVERLONG_TRUNCATE: keep the first seq_len tokens (stats.n_truncated); if no mask-1 token is
 *                      left after the first, drop it (stats.n_dropped_no_loss).
 *   OVERLONG_DROP:     drop it (stats.n_dropped_long).
 *
 * ---- Preference pairs (preference = 1; records detected per record, first match wins) ----
 *   1. text with a prompt  {"prompt": str, "chosen": str, "rejected": str, "margin": num (opt.)}
 *   2. ShareGPT (LLaMA-Factory dpo)  {"conversations": [...], "chosen": {"from","value"},
 *                       "rejected": {...}, "system": str (opt.)}: conversations + the answer
 *   3. conversational   {"chosen": [messages], "rejected": [messages], "prompt": [messages] (opt.)}:
 *                       prompt (if any) + the list, whose last message must be the assistant's
 *   4. full texts       {"chosen": str, "rejected": str} (hh-rlhf): the prompt is their common
 *                       prefix, cut after its last "\n\nAssistant:" (else before the word where they
 *                       part); the rest of each text is its response
 *   Text pairs are tokenized as one text, [BOS] + encode(prompt + response) + [EOS], so the ids are
 *   those the concatenated text gets (a separate encode of the response would add SentencePiece's
 *   "▁" at its start, a token the model never sees there at generation time); the response begins
 *   at the token holding the first response byte. Chat pairs are chat_render's ids; the loss mask
 *   is the last assistant turn's (its content and end-of-turn token). mask 1 = response + EOS.
 *   Bad pair records: a field missing or of the wrong type, an empty response, chosen identical to
 *   rejected, no common prompt text (full texts), a conversation not ending with an assistant turn.
 *   Over-long: a sample over seq_len loses prompt tokens from the left (after BOS, which stays)
 *   (stats.n_truncated counts pairs); a pair whose response does not fit with one token before it
 *   is dropped (stats.n_dropped_long). The order, batches and cursor count pairs: a micro-batch is
 *   up to batch_size pairs, sequences 2i and 2i+1 the chosen and rejected of pair i; pack is off.
 *
 * ---- Epochs, shuffle, packing, batches ----
 *   Epoch e visits every sample once in order[e]: the identity without shuffle, else a Fisher-Yates
 *   shuffle of the identity driven by splitmix64 (Steele, Lea, Flood 2014; Vigna's constants):
 *       s = seed ^ (first splitmix64 output from state e)
 *       for i = n-1 down to 1: j = splitmix64(&s) % (i + 1); swap(order[i], order[j])
 *   so order[e] depends on (seed, e) only (the modulo bias, < n / 2^64, is ignored).
 *   A row is one sample (pack = 0) or, with pack = 1, as many consecutive samples of the order as
 *   fit in seq_len tokens together (greedy: a sample that does not fit starts the next row).
 *   A micro-batch is up to batch_size rows, so n_tokens <= batch_size * seq_len
 *   (data_max_batch_tokens). Each SAMPLE is its own sequence in seq_start (positions restart,
 *   attention never crosses samples); rows only decide how many samples a batch takes. Batches do
 *   not cross epochs: an epoch's last batch may be smaller.
 *   The cursor (epoch, position in that epoch's order) is all the iteration state: the batches
 *   after a restored cursor are the batches the saved run would have seen next. */
#ifndef TANDEM_DATA_H
#define TANDEM_DATA_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "tokenizer/tokenizer.h"

typedef enum { OVERLONG_TRUNCATE, OVERLONG_DROP } OverlongPolicy;

typedef struct {
    int seq_len;              /* max tokens per sample and per packed row (>= 2) */
    int batch_size;           /* rows per micro-batch (>= 1) */
    int pack;                 /* 1: pack samples into rows of <= seq_len tokens */
    int shuffle;              /* 1: shuffle each epoch by seed (eval: 0) */
    uint64_t seed;
    int n_epochs;             /* data_next_batch returns 0 after this many; 0 = never ends */
    OverlongPolicy overlong;
    int train_on_prompt;      /* 1: mask 1 on every token but the first */
    int skip_bad_records;     /* 1: skip and count bad records instead of stopping */
    int pairs_as_chat;        /* 1: prompt/response and Alpaca records go through the chat template */
    int preference;           /* 1: preference records (see "Preference pairs" above): two samples each */
    const char *chat_template; /* chat format name (chat_format_from_name); NULL = the tokenizer's */
    /* record keys; NULL = the default in quotes */
    const char *prompt_key, *response_key;                 /* "prompt", "response" */
    const char *instruction_key, *input_key, *output_key;  /* "instruction", "input", "output" */
    const char *messages_key, *role_key, *content_key;     /* "messages", "role", "content" */
    const char *conversations_key, *from_key, *value_key;  /* "conversations", "from", "value" */
    const char *system_key;                                /* "system" (ShareGPT top level) */
} DataConfig;

/* seq_len 1024, batch_size 8, pack 1, shuffle 1, seed 1234, n_epochs 1, truncate, everything else
 * 0 / NULL. */
void data_config_default(DataConfig *c);

typedef struct {
    int n_records;           /* records read (non-blank lines / array elements) */
    int n_bad;               /* bad records skipped (skip_bad_records) */
    int n_truncated;         /* over-long samples cut to seq_len (kept or then dropped) */
    int n_dropped_long;      /* over-long samples dropped (OVERLONG_DROP) */
    int n_dropped_no_loss;   /* truncated samples dropped: no loss token left */
    int n_samples;           /* kept */
    int64_t n_tokens;        /* in kept samples */
    int64_t n_loss_tokens;   /* targets >= 0 over kept samples, once each */
    int n_pairs;             /* preference: pairs kept (n_samples / 2) */
} DataStats;

typedef struct {
    uint64_t epoch;          /* epochs finished */
    uint64_t position;       /* samples of this epoch's order already returned */
} DataCursor;

/* One micro-batch. Pointers are Data's buffers: valid until the next data_next_batch / data_free. */
typedef struct {
    const int *tokens;       /* (N) samples back to back */
    const int *seq_start;    /* (n_seqs + 1) offsets of the samples in tokens; seq_start[n_seqs] = N */
    const int *targets;      /* (N) next token within the sample, -1 = no loss (see top) */
    const int *sample_index; /* (n_seqs) index of each sample in load order (data_sample) */
    const float *margin;     /* preference: (n_seqs / 2) each pair's margin (0 when the record has none) */
    int n_tokens;            /* N */
    int n_seqs;              /* samples */
    int n_rows;              /* rows (== n_seqs without packing) */
    int n_loss;              /* targets >= 0 */
    uint64_t epoch;          /* the epoch the batch belongs to */
} DataBatch;

typedef struct {
    char *path;
    DataConfig cfg;          /* key pointers are not kept: only the numeric settings are valid */
    DataStats stats;
    int n_samples;
    int64_t *sample_off;     /* (n_samples + 1) offsets into ids / mask */
    int32_t *ids;            /* (n_tokens) every sample's ids, back to back */
    uint8_t *mask;           /* (n_tokens) */
    int *sample_line;        /* (n_samples) file line the sample came from */
    int group;               /* samples per unit of the order: 1, or 2 (a preference pair) */
    float *margin;           /* preference: (n_samples / 2) */
    /* iteration */
    DataCursor cur;
    int *order;              /* (n_samples) order of epoch order_epoch */
    uint64_t order_epoch;
    int *b_tokens, *b_seq_start, *b_targets, *b_sample; /* batch buffers */
    float *b_margin;
} Data;

/* Reads and tokenizes every record of path (see top). Bad input: user_error naming path:line and
 * the field (unless cfg->skip_bad_records), or when no sample is left. t is used only here. */
void data_open(Data *d, const char *path, Tokenizer *t, const DataConfig *cfg);
void data_free(Data *d);

/* One line: records, samples, bad / truncated / dropped counts, tokens, loss tokens. */
void data_print_summary(const Data *d, FILE *f);

/* Sample i in load order: returns its length n and points ids / mask (either may be NULL) at its
 * n ids and mask bytes. d->sample_line[i] is the file line it came from. */
int data_sample(const Data *d, int i, const int32_t **ids, const uint8_t **mask);

/* Most tokens a batch can have: batch_size * seq_len, times 2 for preference pairs (size the
 * training activations with it). */
int data_max_batch_tokens(const Data *d);

/* The next micro-batch into b; returns 1, or 0 when n_epochs epochs are done (b untouched). */
int data_next_batch(Data *d, DataBatch *b);

/* The order of epoch e (n_samples sample indices), written into out. */
void data_epoch_order(const Data *d, uint64_t epoch, int *out);

/* ---- cursor ----
 * Saved form, DATA_CURSOR_BYTES little-endian bytes: magic "TDCR", version 1, epoch, position,
 * and what the order depends on (n_samples, n_tokens, seed, shuffle). A cursor fits another
 * batch_size or pack setting (it counts samples, not batches) but not other data or seed. */
#define DATA_CURSOR_BYTES 56
DataCursor data_cursor(const Data *d);
void data_rewind(Data *d);  /* back to epoch 0, position 0 (e.g. before each eval pass) */
void data_cursor_save(const Data *d, uint8_t buf[DATA_CURSOR_BYTES]);
/* Returns 0, or -1 with one line in err (bad magic / version, or saved for other data or seed);
 * d is unchanged then. The caller prefixes the checkpoint file name. */
int data_cursor_restore(Data *d, const uint8_t *buf, size_t len, char *err, size_t errlen);
#endif
