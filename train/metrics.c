/* metrics.c — see metrics.h. */
#include "train/metrics.h"
#include "runtime/util.h"
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void metrics_open(MetricsLog *ml, const char *out, int append, int writer) {
    ml->f = NULL;
    if (!writer) return;
    char *path = path_join(out, "metrics.jsonl");
    ml->f = fopen(path, append ? "a" : "w");
    if (!ml->f) user_error("%s: cannot open for writing: %s", path, strerror(errno));
    free(path);
}

void metrics_close(MetricsLog *ml) {
    if (ml->f) fclose(ml->f);
    ml->f = NULL;
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
    fflush(ml->f);
}
