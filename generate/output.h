/* output.h — the output file of `tandem generate`: one jsonl line per input line, in input order,
 * each written whole as soon as every earlier one is; --resume.
 * Owns: the output line's format, the write order, the pending side file OUTPUT.pending (lines
 * finished ahead of an earlier unfinished one, so a kill loses only the prompts still generating),
 * and reading both files back for --resume.
 * Does not own: what a line asks for (request.c), when a line finishes (the engine), moving lines
 * between data-parallel groups (generate.c). Only the root rank writes; every rank scans. */
#ifndef TANDEM_OUTPUT_H
#define TANDEM_OUTPUT_H
#include "generate/request.h"

enum { SKIP_WRITTEN = 1, SKIP_PENDING = 2 };

/* One input line's place in the output. */
typedef struct {
    const char *id_json;  /* its request's id (the key --resume matches on) */
    int skip;             /* --resume: SKIP_WRITTEN in the output file, SKIP_PENDING in its side file */
    int done;             /* finished (here or in another group) */
    char *line;           /* the finished output line, newline included, waiting its turn (root) */
} OutSlot;

typedef struct {
    OutSlot *slots;       /* (n) in input order */
    int n;
    int is_root;          /* this rank writes */
    int next_write;       /* first input index not yet written */
    int fd;               /* output file (root), O_APPEND */
    const char *path;
    long resume_keep;     /* --resume: bytes of the output kept (a partial last line dropped); -1: all */
    char *pending_path;   /* OUTPUT.pending (NULL: the output is not a regular file) */
    int pending_fd;       /* -1: none open */
} Output;

void output_init(Output *o, const char *path, const Request *reqs, int n, int is_root);
/* --resume: marks the ids already in the output file (SKIP_WRITTEN), then those finished ahead of
 * their turn in its side file (SKIP_PENDING, their lines kept to be written in their turn). The
 * root prints what it found. */
void output_resume_scan(Output *o);
/* Root, after every input check: creates or truncates the output (with resume: keeps it, less a
 * partial last line), and drops a stale side file. */
void output_open(Output *o, int resume);
/* Slot idx is finished (idx -1: none new): writes every line now in turn; if idx must still wait
 * for an earlier one, keeps a copy of its line in the side file meanwhile. */
void output_ready(Output *o, int idx);
/* Every line written: closes the output (a deferred write error is a user_error, and the side file
 * then stays for --resume), removes the side file, frees o. */
void output_close(Output *o);

/* The output line of a finished request (its decoded completion `text`), newline included. */
char *format_line(const Request *r, const char *text);
#endif
