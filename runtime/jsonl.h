/* jsonl.h — reading JSON-lines input (one object per non-blank line, errors name file:line), and
 * building JSON-lines output in memory. */
#ifndef TANDEM_JSONL_H
#define TANDEM_JSONL_H
#include <cjson/cJSON.h>
#include <stdio.h>

typedef struct {
    const char *path;
    FILE *f;
    int line;        /* 1-based number of the line last returned */
    char *buf;
    size_t cap;
    int borrowed;    /* jsonl_attach: the caller owns f */
} JsonlReader;

/* user_error if the file cannot be opened */
void jsonl_open(JsonlReader *r, const char *path);
/* Reads an already open stream (e.g. stdin), naming it `name` in errors; jsonl_close does not close it. */
void jsonl_attach(JsonlReader *r, FILE *f, const char *name);
/* The next line's object (caller cJSON_Deletes it), NULL at the end. Blank lines are skipped; a
 * line that is not a JSON object, or holds more than one, is a user_error naming path:line. */
cJSON *jsonl_next(JsonlReader *r);
void jsonl_close(JsonlReader *r);
/* Appends o as one line (compact JSON + '\n') to the growing buffer *buf (len used, cap allocated;
 * *buf may start NULL with cap 0). */
void jsonl_append(char **buf, size_t *len, size_t *cap, const cJSON *o);
#endif
