/* metrics.c — see metrics.h. */
#include "train/metrics.h"
#include "runtime/util.h"
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void metrics_open(MetricsLog *ml, const char *out, int append, int writer) {
    ml->f = NULL;
    ml->path = NULL;
    if (!writer) return;
    ml->path = path_join(out, "metrics.jsonl");
    ml->f = fopen(ml->path, append ? "a" : "w");
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
