/* metrics.c — see metrics.h. */
#include "train/metrics.h"
#include "runtime/util.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A resumed run's file keeps what the uninterrupted run has up to the resumed step: the lines of
 * earlier steps and the first line of that step (its training line; an eval line after it, or rm's
 * reward statistics, are written again by the resumed run when the uninterrupted run has them).
 * Lines of later steps and a cut last line (a kill, a full disk) go. A line without a readable
 * step is not ours to judge and stays. The kept lines replace the file in one rename. */
static void trim_past(const char *path, int step) {
    size_t len;
    char *text = read_file(path, &len);
    if (!text) return;   /* none yet: the resumed run starts it */
    char *kept = xmalloc(len + 1);
    size_t n = 0;
    int seen_step = 0;
    for (const char *line = text; line < text + len;) {
        const char *nl = memchr(line, '\n', (size_t)(text + len - line));
        if (!nl) break;   /* a cut last line */
        int s, keep = 1;
        if (sscanf(line, "{\"step\": %d", &s) == 1) {
            if (s == step) keep = !seen_step++;
            else keep = s < step;
        }
        if (keep) {
            memcpy(kept + n, line, (size_t)(nl + 1 - line));
            n += (size_t)(nl + 1 - line);
        }
        line = nl + 1;
    }
    if (n != len && write_file_atomic(path, kept, n))
        user_error("%s: cannot write: %s", path, strerror(errno));
    free(kept);
    free(text);
}

/* The event file of a resumed run starts with a purge at `step`, which drops that step's kept
 * training line too (an event has no line to tell it from the eval line that goes): the trimmed
 * file's lines of `step` are written again, number by number, as metrics_fmt writes them. */
static void replay_step(MetricsLog *ml, int step) {
    size_t len;
    char *text = read_file(ml->path, &len);
    if (!text) return;
    for (char *line = text, *nl; (nl = strchr(line, '\n')); line = nl + 1) {
        int s;
        if (sscanf(line, "{\"step\": %d", &s) != 1 || s != step) continue;
        cJSON *obj = cJSON_ParseWithLength(line, (size_t)(nl - line));
        if (!obj) continue;   /* not ours to judge (as trim_past) */
        for (cJSON *c = obj->child; c; c = c->next)
            if (cJSON_IsNumber(c) && strcmp(c->string, "step"))
                tensorboard_scalar(&ml->tb, step, c->string, (float)c->valuedouble);
        cJSON_Delete(obj);
    }
    tensorboard_flush(&ml->tb);
    free(text);
}

void metrics_open(MetricsLog *ml, const char *out, const char *tensorboard, int resume_step, int writer) {
    memset(ml, 0, sizeof *ml);
    if (!writer) return;
    ml->path = path_join(out, "metrics.jsonl");
    if (resume_step >= 0) trim_past(ml->path, resume_step);
    ml->f = fopen(ml->path, resume_step >= 0 ? "a" : "w");
    if (!ml->f) user_error("%s: cannot open for writing: %s", ml->path, strerror(errno));
    if (tensorboard) {
        tensorboard_open(&ml->tb, tensorboard, resume_step >= 0 ? resume_step : 0);
        if (resume_step >= 0) replay_step(ml, resume_step);
    }
}

void metrics_close(MetricsLog *ml) {
    if (ml->f && fclose(ml->f) != 0) user_error("%s: cannot write: %s", ml->path, strerror(errno));
    tensorboard_close(&ml->tb);
    free(ml->path);
    ml->f = NULL;
    ml->path = NULL;
}

void metrics_begin(MetricsLog *ml, int step) {
    if (!ml->f) return;
    fprintf(ml->f, "{\"step\": %d", step);
    ml->step = step;
}

void metrics_num(MetricsLog *ml, const char *key, double v) { metrics_fmt(ml, key, "%.9g", v); }

void metrics_fmt(MetricsLog *ml, const char *key, const char *fmt, double v) {
    if (!ml->f) return;
    fprintf(ml->f, ", \"%s\": ", key);
    if (!isfinite(v)) {
        fputs("null", ml->f);   /* JSON has no NaN or inf: printf's "nan" / "-inf" would break the line */
        return;
    }
    char text[512];   /* %.0f of the largest double: 309 digits */
    int n = snprintf(text, sizeof text, fmt, v);
    CHECK(n > 0 && n < (int)sizeof text);
    fputs(text, ml->f);
    /* the number as the line has it (what a reader of metrics.jsonl gets), rounded to float32 */
    tensorboard_scalar(&ml->tb, ml->step, key, (float)strtod(text, NULL));
}

void metrics_end(MetricsLog *ml) {
    if (!ml->f) return;
    fputs("}\n", ml->f);
    /* fprintf's failures are sticky (ferror); fflush reports those still in the buffer */
    if (fflush(ml->f) != 0 || ferror(ml->f)) user_error("%s: cannot write: %s", ml->path, strerror(errno));
    tensorboard_flush(&ml->tb);
}
