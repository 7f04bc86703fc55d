/* request.h — what one prompt line asks for: its prompt as token ids, its id, its sampling and
 * length settings (a line's fields override the command's options), its stop ids and stop strings;
 * the one reading of --stop / --stop-token-ids, the one stop-string matcher, the one fit of a
 * prompt to the model's positions, and the one EOS rule. Shared by `tandem generate` and the
 * rollouts of `tandem ppo`.
 * Owns: the input line's fields and their checks (user_error naming FILE:LINE).
 * Does not own: scheduling and the KV cache (engine.c), the output file (output.c), decoding text
 * as tokens arrive (tokenizer/). */
#ifndef TANDEM_REQUEST_H
#define TANDEM_REQUEST_H
#include "generate/engine.h"
#include "runtime/config.h"
#include "runtime/jsonl.h"
#include "tokenizer/tokenizer.h"
#include <cjson/cJSON.h>

enum { MAX_STOPS = 16 };               /* stop strings per line (or per --stop) */
enum { EOS_IDS_CAP = 3 * MAX_EOS_IDS + 1 };

/* One input line. */
typedef struct {
    Seq seq;              /* prompt, sampling, lengths, logprobs, stop ids (EOS ids first) */
    char *id_json;        /* the "id" value as JSON text (given, or the 1-based line number) */
    int in_line;          /* its line in the input file */
    char *prompt_json;    /* the prompt field as given, JSON text */
    char *stops[MAX_STOPS];
    int n_stops;
} Request;

/* What a line does not say: the command's options. */
typedef struct {
    SamplingParams sp;
    int max_new, min_new, logprobs, truncate, no_bos, ignore_eos;
    const char *key, *chat_template;
    char *stops[MAX_STOPS];   /* --stop (a line's "stop" replaces them) */
    int n_stops;
    int *stop_ids;            /* (n_stop_ids) --stop-token-ids (a line's "stop_token_ids" replaces them) */
    int n_stop_ids;
} RequestDefaults;

/* One jsonl line's prompt ids into t: "input_ids" (ids in [0, vocab)), "messages" (read by
 * chat_messages_parse, then the chat template with the generation prompt), or the text field `key`
 * (BOS per the tokenizer unless no_bos). Bad or missing fields are a user_error naming FILE:LINE.
 * Returns the field as given, as JSON text (malloc'd). tok may be NULL (then only input_ids work). */
char *prompt_tokens(Tokenizer *tok, const cJSON *j, const char *key, const char *chat_template, int no_bos, int vocab,
                    const char *file, int line, TokIds *t);

/* The jsonl file `path` a line at a time (`tandem generate` streams its input: memory for the lines
 * in flight only): requests_next fills r with the next line (index rr->n before the call) and
 * returns 1, or returns 0 at the end (user_error for a file with no prompt); a bad line is a
 * user_error naming FILE:LINE when it is read. Each line's stop ids are the EOS ids eos[n_eos]
 * (none with d->ignore_eos), then its "stop_token_ids" or --stop-token-ids. A prompt too long for
 * cfg->max_pos: see prompt_fit; a line longer than jsonl_max_bytes(cfg->max_pos) is refused before
 * it is tokenized. tok may be NULL. */
typedef struct {
    JsonlReader rd;
    const char *path;
    const RequestDefaults *d;
    Tokenizer *tok;
    const ModelConfig *cfg;
    const int *eos;
    int n_eos;
    int n;                /* lines read */
    int eof;
} RequestReader;
void requests_open(RequestReader *rr, const char *path, const RequestDefaults *d, Tokenizer *tok,
                   const ModelConfig *cfg, const int *eos, int n_eos);
int requests_next(RequestReader *rr, Request *r);
void requests_close(RequestReader *rr);
void request_free(Request *r);

/* An "id" as JSON text, the key --resume matches on. Numbers are printed exactly; a numeric id
 * must be an integer a double holds exactly (user_error naming `where` otherwise). malloc'd. */
char *id_text(const cJSON *id, const char *where);

/* --stop TEXT: a JSON list of strings, else TEXT itself (so "[END]" is one stop string). Each must
 * be non-empty, at most MAX_STOPS (user_error naming --stop). Returns how many, into stops
 * (malloc'd strings). */
int stops_parse_flag(const char *text, char *stops[MAX_STOPS]);
/* --stop-token-ids TEXT: comma-separated token ids in [0, vocab), appended to *ids (*n of them,
 * realloc'd). user_error naming the bad entry. */
void stop_ids_parse_flag(const char *text, int vocab, int **ids, int *n);

/* The stop string the newest token completed in text[0, len), which was `before` bytes long
 * before it: a stop may straddle tokens, so each is searched from where it could have begun. Of
 * several found, the one that begins first in the text wins. Returns where it begins, or NULL. */
char *stop_find(char *const *stops, int n_stops, char *text, size_t len, size_t before);

/* A prompt of t->n tokens plus max_new new ones must fit the model's max_pos positions. A longer
 * one is a user_error naming `where`, unless truncate: then it keeps its last max_pos - max_new
 * tokens (a user_error if that leaves none). */
void prompt_fit(TokIds *t, int max_new, int max_pos, int truncate, const char *where);

/* The ids that end a sequence, HF's rule: config.json's eos_token_id (cfg->eos_ids, an integer or
 * a list), then generation_config.json's in model_dir (an integer or a list; null or no file:
 * none) and the tokenizer's EOS (tok may be NULL), each when not already there. Returns how many, into
 * eos[EOS_IDS_CAP]. user_error on a malformed generation_config.json. */
int eos_ids_load(const char *model_dir, const ModelConfig *cfg, const Tokenizer *tok, int *eos);
#endif
