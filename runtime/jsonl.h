/* jsonl.h — reading JSON-lines input (one object per non-blank line, errors name file:line), and
 * building JSON-lines output in memory; the two rules every text input obeys (train/records.c
 * applies them to sft / rm / dpo data too): the text is UTF-8, and a line (a record) is at most
 * jsonl_max_bytes long. */
#ifndef TANDEM_JSONL_H
#define TANDEM_JSONL_H
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>

typedef struct {
    const char *path;
    FILE *f;
    int line;        /* 1-based number of the line last returned */
    char *buf;
    size_t cap;
    int borrowed;    /* jsonl_attach: the caller owns f */
    int64_t max_positions; /* 0, or a line over jsonl_max_bytes(max_positions) is a user_error; set after open */
} JsonlReader;

/* The byte limit of one record (a data record, a prompt line) whose tokens must fit n_positions
 * (--seq-len, or the model's max_position_embeddings): 64 bytes per position, at least 1 MiB.
 * Text runs 3 to 5 bytes per token, so a longer record would lose over nine tenths of its text to
 * truncation; refusing it from its length alone saves tokenizing it all (about 1 s per MB). */
size_t jsonl_max_bytes(int64_t n_positions);

/* s[0..n) is UTF-8 (RFC 3629, utf8proc's rule: no overlong forms, surrogates or values past
 * U+10FFFF): returns n, else the offset of the first byte that does not start a valid character.
 * The one check of every text input: JSON text is UTF-8 (RFC 8259). */
size_t utf8_valid_prefix(const char *s, size_t n);

/* user_error if the file cannot be opened */
void jsonl_open(JsonlReader *r, const char *path);
/* Reads an already open stream (e.g. stdin), naming it `name` in errors; jsonl_close does not close it. */
void jsonl_attach(JsonlReader *r, FILE *f, const char *name);
/* The next line's object (caller cJSON_Deletes it), NULL at the end. Blank lines are skipped; a
 * line that is not a JSON object, or holds more than one, or is not UTF-8
 * ("path:line: not valid UTF-8 (byte K)"), or is longer than jsonl_max_bytes(r->max_positions), is a user_error naming
 * path:line. */
cJSON *jsonl_next(JsonlReader *r);
void jsonl_close(JsonlReader *r);
/* Appends o as one line (compact JSON + '\n') to the growing buffer *buf (len used, cap allocated;
 * *buf may start NULL with cap 0). */
void jsonl_append(char **buf, size_t *len, size_t *cap, const cJSON *o);
#endif
