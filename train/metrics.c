/* metrics.c — see metrics.h. */
#include "train/metrics.h"
#include "runtime/util.h"
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

void metrics_open(MetricsLog *ml, const char *out, int resume_step, int writer) {
    ml->f = NULL;
    ml->path = NULL;
    if (!writer) return;
    ml->path = path_join(out, "metrics.jsonl");
    if (resume_step >= 0) trim_past(ml->path, resume_step);
    ml->f = fopen(ml->path, resume_step >= 0 ? "a" : "w");
    if (!ml->f) user_error("%s: cannot open for writing: %s", ml->path, strerror(errno));
}

void metrics_close(MetricsLog *ml) {
    if (ml->f && fclose(ml->f) != 0) user_error("%s: cannot write: %s", ml->path, strerror(errno));
    free(ml->path);
    ml->f = NULL;
    ml->path = NULL;
}

void metrics_begin(MetricsLog *ml, int step) {
    if (ml->f) fprintf(ml->f, "{\"step\": %d", step);
}

void metrics_num(MetricsLog *ml, const char *key, double v) { metrics_fmt(ml, key, "%.9g", v); }

void metrics_fmt(MetricsLog *ml, const char *key, const char *fmt, double v) {
    if (!ml->f) return;
    fprintf(ml->f, ", \"%s\": ", key);
    if (isfinite(v)) fprintf(ml->f, fmt, v);
    else fputs("null", ml->f);   /* JSON has no NaN or inf: printf's "nan" / "-inf" would break the line */
}

void metrics_end(MetricsLog *ml) {
    if (!ml->f) return;
    fputs("}\n", ml->f);
    /* fprintf's failures are sticky (ferror); fflush reports those still in the buffer */
    if (fflush(ml->f) != 0 || ferror(ml->f)) user_error("%s: cannot write: %s", ml->path, strerror(errno));
}
