/* reward_cmd.c — see reward_cmd.h. The program (rlhf/subproc.c: its life, its pipes, one poll
 * round at a time) and a loop that writes a batch's request lines while reading the replies as they
 * come, so neither side can block the other on a full pipe.
 * Owns: the request/reply framing and the one-line error messages. Does not own what a reward
 * means, nor retrying: after any error the RewardCmd is dead.
 * The strings it is given are written as they are: callers pass UTF-8 (the tokenizer's decode
 * always gives valid UTF-8). */
#include "rlhf/reward_cmd.h"
#include "rlhf/subproc.h"
#include "runtime/jsonl.h"
#include "runtime/util.h"
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REWARD_CMD_MAX_LINE (16 << 20)  /* a reply line longer than this is an error, not a reason to grow */

struct RewardCmd {
    Subproc p;             /* the program, its pipes and the bytes read */
    int failed;            /* an error was reported: only reward_cmd_stop is allowed */
};

/* Takes the reward from reply k (1-based; NUL-terminated, newline removed): a finite number within
 * the bound, and an echoed "index", if any, that is k - 1. 0, or -1 with the error. */
static int take_reply(RewardCmd *rc, const char *line, size_t len, int k, double *reward, char *err, size_t errlen) {
    /* require_null_terminated: `{"reward": 1} junk` is not a reply */
    cJSON *o = cJSON_ParseWithOpts(line, NULL, 1);
    const cJSON *r = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, "reward") : NULL;
    const cJSON *ix = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, "index") : NULL;
    int ok = cJSON_IsNumber(r) && isfinite(r->valuedouble);
    double v = ok ? r->valuedouble : 0.0;
    int index_ok = !ix || (cJSON_IsNumber(ix) && ix->valuedouble == k - 1);
    cJSON_Delete(o);
    char bad[4 * SUBPROC_SHOWN + 8];
    subproc_shown(bad, sizeof bad, line, len);
    if (!ok) {
        snprintf(err, errlen, "reward command `%s`: reply %d is not a JSON object with a finite number \"reward\": %s",
                 rc->p.name, k, bad);
        return -1;
    }
    if (!index_ok) {
        snprintf(err, errlen, "reward command `%s`: reply %d echoes an \"index\" other than its request's %d "
                 "(replies out of order, or more replies than requests): %s", rc->p.name, k, k - 1, bad);
        return -1;
    }
    if (!(fabs(v) <= REWARD_ABS_MAX)) {
        snprintf(err, errlen, "reward command `%s`: reply %d: reward %.9g is outside [-%g, %g]: %s", rc->p.name, k, v,
                 REWARD_ABS_MAX, REWARD_ABS_MAX, bad);
        return -1;
    }
    *reward = v;
    return 0;
}

/* Consumes the whole lines in rbuf (and, at_eof, a last line with no newline) as replies got..n-1.
 * sent: the requests written whole before these bytes were read; a reply beyond them answers no
 * request of ours (a surplus line of the program's). */
static int take_lines(RewardCmd *rc, int n, int sent, int *got, double *rewards, int at_eof, char *err, size_t errlen) {
    size_t pos = 0;
    int rv = 0;
    while (*got < n && pos < rc->p.rlen) {
        char *line = rc->p.rbuf + pos, *nl = memchr(line, '\n', rc->p.rlen - pos);
        if (!nl && !at_eof) {
            if (rc->p.rlen - pos > REWARD_CMD_MAX_LINE) {
                char bad[4 * SUBPROC_SHOWN + 8];
                subproc_shown(bad, sizeof bad, line, rc->p.rlen - pos);
                snprintf(err, errlen, "reward command `%s`: reply %d has no newline in its first %d MiB: %s",
                         rc->p.name, *got + 1, REWARD_CMD_MAX_LINE >> 20, bad);
                rv = -1;
            }
            break;
        }
        size_t len = nl ? (size_t)(nl - line) : rc->p.rlen - pos;
        line[len] = 0;
        if ((rv = take_reply(rc, line, len, *got + 1, &rewards[*got], err, errlen))) break;
        if (*got >= sent) {
            char bad[4 * SUBPROC_SHOWN + 8];
            subproc_shown(bad, sizeof bad, line, len);
            snprintf(err, errlen, "reward command `%s`: more replies than requests: reply %d came before request %d "
                     "was written: %s", rc->p.name, *got + 1, *got + 1, bad);
            rv = -1;
            break;
        }
        (*got)++;
        pos += len + (nl != NULL);
    }
    memmove(rc->p.rbuf, rc->p.rbuf + pos, rc->p.rlen - pos);
    rc->p.rlen -= pos;
    rc->p.rbuf[rc->p.rlen] = 0;
    return rv;
}

/* After n replies: anything left in rbuf is a surplus reply. 0, or -1 with the error. */
static int surplus(const RewardCmd *rc, int n, char *err, size_t errlen) {
    if (rc->p.rlen == 0) return 0;
    char *nl = memchr(rc->p.rbuf, '\n', rc->p.rlen), bad[4 * SUBPROC_SHOWN + 8];
    subproc_shown(bad, sizeof bad, rc->p.rbuf, nl ? (size_t)(nl - rc->p.rbuf) : rc->p.rlen);
    snprintf(err, errlen, "reward command `%s`: more replies than requests: a line after reply %d of %d: %s",
             rc->p.name, n, n, bad);
    return -1;
}

/* See reward_cmd.h. The reading half of reward_cmd_score on bytes already in hand: every request
 * written, then the program's whole output up to its end. */
int reward_cmd_parse_replies(const char *name, const char *bytes, size_t len, int n, double *rewards, char *err,
                             size_t errlen) {
    RewardCmd rc = {.p = {.name = (char *)name, .pid = -1, .to = -1, .from = -1, .rlen = len, .rcap = len + 1}};
    rc.p.rbuf = xmalloc(len + 1);
    memcpy(rc.p.rbuf, bytes, len);
    rc.p.rbuf[len] = 0;
    int got = 0, rv = take_lines(&rc, n, n, &got, rewards, 1, err, errlen);
    if (rv == 0 && got < n) {
        snprintf(err, errlen, "reward command `%s`: closed its output after %d of %d replies", name, got, n);
        rv = -1;
    }
    if (rv == 0) rv = surplus(&rc, n, err, errlen);
    free(rc.p.rbuf);
    return rv;
}

int reward_cmd_score(RewardCmd *rc, int n, const char *const *prompts, const char *const *responses,
                     const char *const *labels, double *rewards, double timeout_s, char *err, size_t errlen) {
    CHECK(!rc->failed);   /* the caller must stop a RewardCmd after an error */
    if (n <= 0) return 0;
    /* the request: n lines; line i ends at ends[i] */
    size_t wlen = 0, wcap = 4096, woff = 0, *ends = xmalloc(sizeof(size_t) * n);
    char *w = xmalloc(wcap);
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "prompt", prompts[i]);
        cJSON_AddStringToObject(o, "response", responses[i]);
        if (labels && labels[i]) {
            cJSON *l = cJSON_Parse(labels[i]);
            CHECK(l != NULL);   /* labels are JSON texts the caller printed */
            cJSON_AddItemToObject(o, "label", l);
        }
        cJSON_AddNumberToObject(o, "index", i);
        jsonl_append(&w, &wlen, &wcap, o);
        ends[i] = wlen;
        cJSON_Delete(o);
    }
    /* sent: requests written whole; seen: that count when the bytes in rbuf were read (a reply can
     * only answer a request the program had then) */
    int got = 0, rv = -1, input_closed = 0, sent = 0, seen = 0;
    double t_end = timeout_s > 0 ? now_seconds() + timeout_s : 0;
    char why[256];
    for (;;) {
        if (take_lines(rc, n, seen, &got, rewards, 0, err, errlen)) goto done;
        if (got == n) break;
        if (input_closed) {
            /* EPIPE: it closed its stdin, most likely by exiting. What it wrote before is already in
             * the pipe; a bad line there explains more than the exit does. */
            ssize_t k;
            seen = sent;
            while ((k = subproc_read(&rc->p)) > 0) {
                if (take_lines(rc, n, seen, &got, rewards, 0, err, errlen)) goto done;
            }
            if (take_lines(rc, n, seen, &got, rewards, k == 0, err, errlen)) goto done;
            if (got == n) break;
            subproc_describe_gone(&rc->p, "input", why, sizeof why);
            snprintf(err, errlen, "reward command `%s`: %s after %d of %d replies", rc->p.name, why, got, n);
            goto done;
        }
        int before = sent, r = subproc_pump(&rc->p, w, wlen, &woff, t_end, "reward command", err, errlen);
        if (r < 0) goto done;
        if (r & SUBPROC_TIMEOUT) {
            snprintf(err, errlen, "reward command `%s`: no reply within %g s (%d of %d replies)", rc->p.name,
                     timeout_s, got, n);
            goto done;
        }
        if (r & (SUBPROC_READ | SUBPROC_EOF)) seen = before;
        if (r & SUBPROC_EOF) {   /* end of its output: a last line without a newline still counts */
            if (take_lines(rc, n, seen, &got, rewards, 1, err, errlen)) goto done;
            if (got == n) break;
            subproc_describe_gone(&rc->p, "output", why, sizeof why);
            snprintf(err, errlen, "reward command `%s`: %s after %d of %d replies", rc->p.name, why, got, n);
            goto done;
        }
        while (sent < n && ends[sent] <= woff) sent++;
        if (r & SUBPROC_EPIPE) input_closed = 1;
    }
    /* n replies to n requests: anything more already written (or read with the last reply) is a
     * surplus, which would otherwise become the next batch's first reward */
    while (subproc_read(&rc->p) > 0) {}
    if (surplus(rc, n, err, errlen)) goto done;
    rv = 0;
done:
    if (rv) rc->failed = 1;
    free(w);
    free(ends);
    return rv;
}

RewardCmd *reward_cmd_start(const char *cmd, char *err, size_t errlen) {
    RewardCmd *rc = xcalloc(1, sizeof(RewardCmd));
    if (subproc_start(&rc->p, cmd, "reward command", err, errlen)) { free(rc); return NULL; }
    return rc;
}

void reward_cmd_stop(RewardCmd *rc) {
    if (!rc) return;
    subproc_stop(&rc->p);
    free(rc);
}
