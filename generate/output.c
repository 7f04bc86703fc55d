/* output.c — see output.h. */
#include "generate/output.h"
#include "runtime/util.h"
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void output_init(Output *o, const char *path, int is_root) {
    memset(o, 0, sizeof(*o));
    o->is_root = is_root;
    o->path = path;
    o->resume_keep = -1;   /* keep the whole file (--resume may say less); 0 would truncate a pipe */
    o->pending_path = xmalloc(strlen(path) + sizeof ".pending");
    sprintf(o->pending_path, "%s.pending", path);
    o->pending_fd = -1;
}

static OutSlot *slot(Output *o, int i) { return &o->ring[i % o->cap]; }

/* ---- --resume ---------------------------------------------------------------------------- */

static int cmp_written(const void *a, const void *b) {
    return strcmp(((const ResumeId *)a)->id, ((const ResumeId *)b)->id);
}
static int cmp_pend(const void *a, const void *b) {
    const ResumeLine *x = a, *y = b;
    int c = strcmp(x->id, y->id);
    return c ? c : (x->order > y->order) - (x->order < y->order);
}

/* --resume, one file, a line at a time: each complete line's id (with the line itself, newline
 * included, for the side file: pend). A last line cut off by a kill (no newline) is ignored, and
 * its start returned in *keep unless keep is NULL (-1: the file ends with a whole line); blank
 * lines are passed over; any other malformed line is an error. */
static void resume_scan_file(Output *o, const char *path, int pend, long *keep) {
    if (keep) *keep = -1;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno != ENOENT) user_error("%s: cannot read for --resume: %s", path, strerror(errno));
        return;                                      /* nothing yet */
    }
    char *buf = NULL;
    size_t cap = 0;
    long good = 0;
    int line = 0;
    for (ssize_t len; (len = getline(&buf, &cap, f)) > 0;) {
        line++;
        if (buf[len - 1] != '\n') break;             /* partial tail */
        buf[len - 1] = 0;
        if (strspn(buf, " \t\r") == (size_t)len - 1) { good += len; continue; }   /* blank */
        cJSON *j = cJSON_ParseWithOpts(buf, NULL, 1);
        cJSON *id = j ? cJSON_GetObjectItemCaseSensitive(j, "id") : NULL;
        if (!j || !id || !cJSON_GetObjectItemCaseSensitive(j, "completion_ids"))
            user_error("%s:%d: not a complete output line; cannot --resume from this file", path, line);
        char where[600];
        snprintf(where, sizeof where, "%s:%d", path, line);
        char *key = id_text(id, where);
        cJSON_Delete(j);
        if (pend) {
            o->pend = xrealloc(o->pend, sizeof(ResumeLine) * (o->n_pend + 1));
            buf[len - 1] = '\n';
            o->pend[o->n_pend] = (ResumeLine){key, xstrdup(buf), o->n_pend, 0};
            o->n_pend++;
        } else {
            o->written = xrealloc(o->written, sizeof(ResumeId) * (o->n_written + 1));
            o->written[o->n_written++] = (ResumeId){key, 1};
        }
        good += len;
    }
    long end = ftell(f);
    if (keep && good < end) *keep = good;
    free(buf);
    fclose(f);
}

/* See output.h. The output's partial tail is dropped when it is opened (o->resume_keep), after
 * the checks. Ids of the output file are counted (one entry per id); side-file lines keep their
 * file order within an id. */
void output_resume_scan(Output *o) {
    resume_scan_file(o, o->path, 0, &o->resume_keep);
    resume_scan_file(o, o->pending_path, 1, NULL);   /* its tail: ignored */
    qsort(o->written, o->n_written, sizeof(ResumeId), cmp_written);
    int k = 0;
    for (int i = 0; i < o->n_written; i++) {
        if (k > 0 && !strcmp(o->written[k - 1].id, o->written[i].id)) { o->written[k - 1].n++; free(o->written[i].id); }
        else o->written[k++] = o->written[i];
    }
    o->n_written = k;
    qsort(o->pend, o->n_pend, sizeof(ResumeLine), cmp_pend);
}

/* --resume: takes one of id's lines of the output file (SKIP_WRITTEN), else of its side file
 * (SKIP_PENDING, the line into *line), else 0. */
static int resume_take(Output *o, const char *id, char **line) {
    ResumeId key = {(char *)id, 0};
    ResumeId *w = o->n_written ? bsearch(&key, o->written, o->n_written, sizeof(ResumeId), cmp_written) : NULL;
    if (w && w->n > 0) {
        w->n--;
        return SKIP_WRITTEN;
    }
    int lo = 0, hi = o->n_pend;                      /* first side-file line with id >= id */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (strcmp(o->pend[mid].id, id) < 0) lo = mid + 1; else hi = mid;
    }
    for (; lo < o->n_pend && !strcmp(o->pend[lo].id, id); lo++) {
        if (o->pend[lo].taken) continue;
        o->pend[lo].taken = 1;
        *line = o->pend[lo].line;
        o->pend[lo].line = NULL;
        return SKIP_PENDING;
    }
    return 0;
}

/* See output.h. */
int output_add(Output *o, const char *id_json) {
    char *line = NULL;
    int skip = resume_take(o, id_json, &line);
    o->skipped_written += skip == SKIP_WRITTEN;
    o->skipped_pending += skip == SKIP_PENDING;
    if (o->is_root) {
        if (o->n - o->next_write == o->cap) {        /* full: twice the room, the same slots */
            int cap = o->cap ? 2 * o->cap : 256;
            OutSlot *ring = xcalloc(cap, sizeof(OutSlot));
            for (int i = o->next_write; i < o->n; i++) ring[i % cap] = *slot(o, i);
            free(o->ring);
            o->ring = ring;
            o->cap = cap;
        }
        *slot(o, o->n) = (OutSlot){skip, 0, line};
    } else {
        free(line);
    }
    o->n++;
    return skip;
}

/* ---- writing ----------------------------------------------------------------------------- */

/* An error exit removes the output this run created, and the side file (output_open), when neither
 * holds a line: whole lines written before the error stay, for --resume (a full disk after hours of
 * generation must not cost the lines already made). */
static char *s_remove[2];
static int holds_bytes(const char *path) {
    struct stat st;
    return path && stat(path, &st) == 0 && st.st_size > 0;
}
static void remove_output(void) {
    if (holds_bytes(s_remove[0]) || holds_bytes(s_remove[1])) return;
    for (int i = 0; i < 2; i++)
        if (s_remove[i]) unlink(s_remove[i]);
}

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
void output_ready(Output *o, int idx, char *line) {
    if (!o->is_root) return;
    if (idx >= 0) {
        CHECK(idx >= o->next_write && idx < o->n && !slot(o, idx)->done);
        slot(o, idx)->done = 1;
        slot(o, idx)->line = line;
    }
    while (o->next_write < o->n && (slot(o, o->next_write)->done || slot(o, o->next_write)->skip)) {
        OutSlot *g = slot(o, o->next_write++);
        if (g->skip != SKIP_WRITTEN) write_line(o->fd, o->path, g->line);
        free(g->line);
        g->line = NULL;
    }
    if (idx < o->next_write || !o->pending_path) return;
    if (o->pending_fd < 0) {
        o->pending_fd = open(o->pending_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (o->pending_fd < 0) user_error("%s: cannot open for writing: %s", o->pending_path, strerror(errno));
    }
    write_line(o->pending_fd, o->pending_path, slot(o, idx)->line);
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
        return;
    }
    if (!resume && unlink(o->pending_path) != 0 && errno != ENOENT)   /* a stale one: not this output's */
        user_error("%s: cannot remove: %s", o->pending_path, strerror(errno));
    if (resume) return;
    s_remove[0] = (char *)o->path;
    s_remove[1] = o->pending_path;
    static int hooked;
    if (!hooked) util_on_error(remove_output);
    hooked = 1;
}

/* See output.h. */
void output_close(Output *o, int resume) {
    if (o->is_root) {
        CHECK(o->next_write == o->n);
        s_remove[0] = s_remove[1] = NULL;
        /* a deferred write error (NFS, quota) surfaces at close: the pending file then stays for --resume */
        if (close(o->fd) != 0) user_error("%s: write failed at close: %s", o->path, strerror(errno));
        if (o->pending_path) {   /* every line is in the output now */
            if (o->pending_fd >= 0) close(o->pending_fd);
            if (unlink(o->pending_path) != 0 && errno != ENOENT) user_error("%s: cannot remove: %s", o->pending_path, strerror(errno));
        }
        if (resume)
            fprintf(stderr, "resume: %d of %d prompts already in %s, %d more in %s.pending\n", o->skipped_written, o->n,
                    o->path, o->skipped_pending, o->path);
    }
    free(o->pending_path);
    free(o->ring);
    for (int i = 0; i < o->n_written; i++) free(o->written[i].id);
    for (int i = 0; i < o->n_pend; i++) { free(o->pend[i].id); free(o->pend[i].line); }
    free(o->written);
    free(o->pend);
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
