/* output.c — see output.h. */
#include "generate/output.h"
#include "runtime/util.h"
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void output_init(Output *o, const char *path, const Request *reqs, int n, int is_root) {
    memset(o, 0, sizeof(*o));
    o->slots = xcalloc(n, sizeof(OutSlot));
    for (int i = 0; i < n; i++) o->slots[i].id_json = reqs[i].id_json;
    o->n = n;
    o->is_root = is_root;
    o->path = path;
    o->resume_keep = -1;   /* keep the whole file (--resume may say less); 0 would truncate a pipe */
    o->pending_path = xmalloc(strlen(path) + sizeof ".pending");
    sprintf(o->pending_path, "%s.pending", path);
    o->pending_fd = -1;
}

/* ---- --resume ---------------------------------------------------------------------------- */

static int cmp_by_id(const void *a, const void *b, void *slots) {
    const OutSlot *g = slots;
    int i = *(const int *)a, j = *(const int *)b, c = strcmp(g[i].id_json, g[j].id_json);
    return c ? c : (i > j) - (i < j);
}

/* --resume, one file: each complete line marks the first input line with its id not yet marked
 * (ids sorted once: n log n, not n x m) with `mark`; SKIP_PENDING keeps the line to be written in
 * its place. A last line cut off by a kill (no newline) is ignored, and its start returned in *keep
 * unless keep is NULL (-1: the file ends with a whole line); blank lines are passed over; any other malformed line is
 * an error. Returns the number of input lines marked. */
static int resume_scan_file(Output *o, const int *order, const char *path, int mark, long *keep) {
    size_t len;
    if (keep) *keep = -1;
    char *data = read_file(path, &len);
    if (!data) {
        if (errno != ENOENT) user_error("%s: cannot read for --resume: %s", path, strerror(errno));
        return 0;                                    /* nothing yet */
    }
    size_t good = 0, pos = 0;
    int line = 0, skipped = 0;
    while (pos < len) {
        char *nl = memchr(data + pos, '\n', len - pos);
        line++;
        if (!nl) break;                              /* partial tail */
        *nl = 0;
        if (strspn(data + pos, " \t\r") == (size_t)(nl - data - pos)) {   /* blank */
            pos = good = (size_t)(nl - data) + 1;
            continue;
        }
        cJSON *j = cJSON_ParseWithOpts(data + pos, NULL, 1);
        cJSON *id = j ? cJSON_GetObjectItemCaseSensitive(j, "id") : NULL;
        if (!j || !id || !cJSON_GetObjectItemCaseSensitive(j, "completion_ids"))
            user_error("%s:%d: not a complete output line; cannot --resume from this file", path, line);
        char where[600];
        snprintf(where, sizeof where, "%s:%d", path, line);
        char *key = id_text(id, where);
        int lo = 0, hi = o->n;                     /* first sorted position with id >= key */
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (strcmp(o->slots[order[mid]].id_json, key) < 0) lo = mid + 1; else hi = mid;
        }
        for (; lo < o->n && !strcmp(o->slots[order[lo]].id_json, key); lo++) {
            OutSlot *g = &o->slots[order[lo]];
            if (g->skip) continue;
            g->skip = mark;
            if (mark == SKIP_PENDING) {   /* the line, newline included, to be written in its turn */
                size_t n = (size_t)(nl - data - pos);
                g->line = xmalloc(n + 2);
                memcpy(g->line, data + pos, n);
                memcpy(g->line + n, "\n", 2);
            }
            skipped++;
            break;
        }
        free(key);
        cJSON_Delete(j);
        pos = (size_t)(nl - data) + 1;
        good = pos;
    }
    if (keep && good < len) *keep = (long)good;
    free(data);
    return skipped;
}

/* See output.h. The output's partial tail is dropped when it is opened (o->resume_keep), after
 * every check. */
void output_resume_scan(Output *o) {
    int *order = xmalloc(sizeof(int) * o->n);
    for (int i = 0; i < o->n; i++) order[i] = i;
    qsort_r(order, o->n, sizeof(int), cmp_by_id, o->slots);
    int written = resume_scan_file(o, order, o->path, SKIP_WRITTEN, &o->resume_keep);
    int pending = resume_scan_file(o, order, o->pending_path, SKIP_PENDING, NULL);   /* its tail: ignored */
    if (o->is_root)
        fprintf(stderr, "resume: %d of %d prompts already in %s, %d more in %s\n", written, o->n, o->path, pending,
                o->pending_path);
    free(order);
}

/* ---- writing ----------------------------------------------------------------------------- */

/* Appends a whole line or nothing: a failed or short write (disk full) is cut back off the file. */
static void write_line(int fd, const char *path, const char *line) {
    size_t n = strlen(line), put = 0;
    off_t end = lseek(fd, 0, SEEK_END);
    while (put < n) {
        ssize_t w = write(fd, line + put, n - put);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int err = w < 0 ? errno : ENOSPC;
            if (ftruncate(fd, end) != 0) { /* nothing more to do: the error below names the file */ }
            user_error("%s: write failed: %s", path, strerror(err));
        }
        put += (size_t)w;
    }
}

/* See output.h. */
void output_ready(Output *o, int idx) {
    while (o->next_write < o->n && (o->slots[o->next_write].done || o->slots[o->next_write].skip)) {
        OutSlot *g = &o->slots[o->next_write++];
        if (g->skip == SKIP_WRITTEN || !o->is_root) continue;
        write_line(o->fd, o->path, g->line);
        free(g->line);
        g->line = NULL;
    }
    if (!o->is_root || idx < o->next_write || !o->pending_path) return;
    if (o->pending_fd < 0) {
        o->pending_fd = open(o->pending_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (o->pending_fd < 0) user_error("%s: cannot open for writing: %s", o->pending_path, strerror(errno));
    }
    write_line(o->pending_fd, o->pending_path, o->slots[idx].line);
}

/* See output.h. */
void output_open(Output *o, int resume) {
    o->fd = open(o->path, O_WRONLY | O_CREAT | O_APPEND | (resume ? 0 : O_TRUNC), 0644);
    if (o->fd < 0) user_error("%s: cannot open for writing: %s", o->path, strerror(errno));
    if (o->resume_keep >= 0 && ftruncate(o->fd, (off_t)o->resume_keep) != 0)
        user_error("%s: cannot drop the partial last line: %s", o->path, strerror(errno));
    struct stat st;
    if (fstat(o->fd, &st) != 0 || !S_ISREG(st.st_mode)) {   /* a pipe or device: nothing to resume */
        free(o->pending_path);
        o->pending_path = NULL;
    } else if (!resume && unlink(o->pending_path) != 0 && errno != ENOENT) {   /* a stale one: not this output's */
        user_error("%s: cannot remove: %s", o->pending_path, strerror(errno));
    }
}

/* See output.h. */
void output_close(Output *o) {
    CHECK(!o->is_root || o->next_write == o->n);
    /* a deferred write error (NFS, quota) surfaces at close: the pending file then stays for --resume */
    if (o->is_root && close(o->fd) != 0) user_error("%s: write failed at close: %s", o->path, strerror(errno));
    if (o->is_root && o->pending_path) {   /* every line is in the output now */
        if (o->pending_fd >= 0) close(o->pending_fd);
        if (unlink(o->pending_path) != 0 && errno != ENOENT) user_error("%s: cannot remove: %s", o->pending_path, strerror(errno));
    }
    free(o->pending_path);
    for (int i = 0; i < o->n; i++) free(o->slots[i].line);
    free(o->slots);
    memset(o, 0, sizeof(*o));
}

/* ---- the line ---------------------------------------------------------------------------- */

/* See output.h. */
char *format_line(const Request *g, const char *text) {
    const Seq *s = &g->seq;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "id", cJSON_CreateRaw(g->id_json));   /* as id_text printed it */
    cJSON_AddItemToObject(o, "prompt", cJSON_Parse(g->prompt_json));
    cJSON_AddStringToObject(o, "completion", text ? text : "");
    cJSON *ids = cJSON_AddArrayToObject(o, "completion_ids");
    for (int k = 0; k < s->n_out; k++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(s->out[k]));
    cJSON_AddStringToObject(o, "finish_reason", s->finish == FINISH_STOP ? "stop" : "length");
    cJSON_AddNumberToObject(o, "prompt_tokens", s->n_prompt);
    cJSON_AddNumberToObject(o, "completion_tokens", s->n_out);
    if (s->logprobs_n > 0) {
        cJSON *lps = cJSON_AddArrayToObject(o, "logprobs");
        for (int k = 0; k < s->n_out; k++) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "token", s->out[k]);
            cJSON_AddNumberToObject(e, "logprob", s->lp[k]);
            cJSON *top = cJSON_AddArrayToObject(e, "top");
            for (int j = 0; j < s->logprobs_n; j++) {
                int t = s->top_ids[(size_t)k * s->logprobs_n + j];
                if (t < 0) break;
                cJSON *pair = cJSON_CreateArray();
                cJSON_AddItemToArray(pair, cJSON_CreateNumber(t));
                cJSON_AddItemToArray(pair, cJSON_CreateNumber(s->top_lp[(size_t)k * s->logprobs_n + j]));
                cJSON_AddItemToArray(top, pair);
            }
            cJSON_AddItemToArray(lps, e);
        }
    }
    char *txt = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    size_t n = strlen(txt);
    txt = xrealloc(txt, n + 2);
    txt[n] = '\n';
    txt[n + 1] = 0;
    return txt;
}
