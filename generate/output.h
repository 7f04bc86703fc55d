/* output.h — the output file of `tandem generate`: one jsonl line per input line, in input order,
 * each written whole as soon as every earlier one is; --resume.
 * Owns: the output line's format, the write order, the pending side file OUTPUT.pending (lines
 * finished ahead of an earlier unfinished one, so a kill loses only the prompts still generating),
 * reading both files back for --resume, and removing the output of a run that stops on an error.
 * Does not own: what a line asks for (request.c), when a line finishes (the engine), moving lines
 * between data-parallel groups (generate.c). Only the root rank writes; every rank scans.
 * The input streams in: an input line gets its slot when it is read (output_add) and gives it up
 * when it is written, so memory holds the lines between the first unwritten one and the last read. */
#ifndef TANDEM_OUTPUT_H
#define TANDEM_OUTPUT_H
#include "generate/request.h"

enum { SKIP_WRITTEN = 1, SKIP_PENDING = 2 };

/* One input line's place in the output (root). */
typedef struct {
    int skip;             /* --resume: SKIP_WRITTEN in the output file, SKIP_PENDING in its side file */
    int done;             /* finished (here or in another group) */
    char *line;           /* the finished output line, newline included, waiting its turn */
} OutSlot;

/* --resume: an id of the output file and how many of its lines have it; a line of the side file. */
typedef struct { char *id; int n; } ResumeId;
typedef struct { char *id; char *line; int order, taken; } ResumeLine;

typedef struct {
    OutSlot *ring;        /* (cap) root: slot of input line i at ring[i % cap], for next_write <= i < n */
    int cap;
    int n;                /* input lines added */
    int is_root;          /* this rank writes */
    int next_write;       /* first input index not yet written */
    int fd;               /* output file (root), O_APPEND */
    const char *path;
    long resume_keep;     /* --resume: bytes of the output kept (a partial last line dropped); -1: all */
    char *pending_path;   /* OUTPUT.pending (NULL: the output is not a regular file) */
    int pending_fd;       /* -1: none open */
    ResumeId *written;    /* (n_written) --resume: ids in the output file, sorted */
    int n_written;
    ResumeLine *pend;     /* (n_pend) --resume: the side file's lines, sorted by id, then file order */
    int n_pend;
    int skipped_written, skipped_pending;
} Output;

void output_init(Output *o, const char *path, int is_root);
/* --resume: reads the ids already in the output file, then the lines finished ahead of their turn
 * in its side file (kept to be written in their turn). */
void output_resume_scan(Output *o);
/* Input line o->n (the next) has id id_json: its slot. Returns 0, or SKIP_WRITTEN / SKIP_PENDING
 * (--resume: the first lines of an id, as many as the output file has, are written; the next ones,
 * as many as the side file has, pending). */
int output_add(Output *o, const char *id_json);
/* Root, after the checks of the lines read so far: creates or truncates the output (with resume:
 * keeps it, less a partial last line), and drops a stale side file. Until output_close, an error
 * exit (util.h util_on_error) removes an output it created, and the side file (with --resume both
 * stay: they hold an earlier run's lines). */
void output_open(Output *o, int resume);
/* Slot idx is finished with `line` (root: taken over; NULL elsewhere), or idx -1: none new. Writes
 * every line now in turn; if idx must still wait for an earlier one, keeps a copy of its line in the
 * side file meanwhile. */
void output_ready(Output *o, int idx, char *line);
/* Every line written: closes the output (a deferred write error is a user_error, and the side file
 * then stays for --resume), removes the side file, says what --resume found, frees o. */
void output_close(Output *o, int resume);

/* The output line of a finished request (its decoded completion `text`), newline included. */
char *format_line(const Request *r, const char *text);
#endif
