/* metrics.h — the one writer of OUT/metrics.jsonl, used by every training command (sft, rm, dpo,
 * ppo): one JSON object per line, {"step": N, "key": value, ...}, flushed at the end of each line
 * so a killed run leaves whole lines. Only the writing rank (the command's root) holds the file;
 * on every other rank each call is a no-op, so callers need no rank test around it.
 * With --tensorboard DIR the writer also puts every number of every line in an event file
 * (train/tensorboard.h): tag = the key, step = the line's step, value = the number as written in
 * metrics.jsonl, rounded to float32 (a null, i.e. NaN or inf, is no point); resumed, it reads as the
 * trimmed metrics.jsonl does.
 * Does not own: what the keys mean (each command's names: TRL's for dpo, verl's for ppo). */
#ifndef TANDEM_METRICS_H
#define TANDEM_METRICS_H
#include "train/tensorboard.h"
#include <stdio.h>

typedef struct {
    FILE *f;         /* NULL on ranks that do not write */
    char *path;      /* out/metrics.jsonl (the writer) */
    Tensorboard tb;  /* --tensorboard's event file (closed: none) */
    int step;        /* the line's */
} MetricsLog;

/* Opens out/metrics.jsonl on the writer: a new file when resume_step < 0; else a resumed run's
 * file, continued after dropping what lies past resume_step (TensorBoard's purge_step): lines of
 * later steps, all but the first line of resume_step itself (the step's training line; the run
 * writes that step's eval line again if the uninterrupted run has one) and a cut last line, so the
 * resumed file equals the uninterrupted run's, timings aside. The trim is atomic (a temp file and a
 * rename). A user_error naming the file when it cannot be opened or rewritten. Not collective.
 * tensorboard (NULL: none): a new event file in that directory, starting with a purge at
 * resume_step (0 for a new run: as metrics.jsonl starts afresh), after which the kept line of
 * resume_step is written again from metrics.jsonl, so that the event files read as metrics.jsonl. */
void metrics_open(MetricsLog *ml, const char *out, const char *tensorboard, int resume_step, int writer);
void metrics_close(MetricsLog *ml);
/* A line: metrics_begin, fields, metrics_end (which writes "}\n" and flushes). A value that is not
 * finite (NaN, inf) is written as null, so every line is JSON whatever the numbers. A write that
 * failed (disk full, a file-size limit) is a user_error naming the file, at metrics_end or
 * metrics_close. */
void metrics_begin(MetricsLog *ml, int step);
void metrics_num(MetricsLog *ml, const char *key, double v);                   /* "key": %.9g */
void metrics_fmt(MetricsLog *ml, const char *key, const char *fmt, double v);  /* "key": fmt (one double) */
void metrics_end(MetricsLog *ml);
#endif
