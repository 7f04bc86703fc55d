/* env.c — see env.h. The messages (built and parsed with cJSON), the two transports, and the rules
 * that give each reply to its episode:
 *   a program (rlhf/subproc.c runs it): one poll loop writes the call's request lines while reading
 *   replies as they come; a reply is given to the episode it names (a bad one ends it:
 *   ENV_BAD_REPLY). A line that names no episode (not JSON, not an object, no integer "episode":
 *   ENV_BAD_REPLY) or one never asked about (ENV_WRONG_EPISODE) is some waiting episode's reply,
 *   which one unknown: once such lines are as many as the episodes still waiting, those episodes
 *   end, in the call's order, with the lines' faults in the order they came (so a program that
 *   answers every request once has each fault on its own episode, whatever the order); at the
 *   timeout, waiting episodes take the lines' faults first, then ENV_TIMEOUT. When no episode
 *   waits, such a line is dropped. A reply naming an episode asked about earlier and not waiting
 *   now (a late reply after a timeout, a second reply) or echoing another "turn" than the one
 *   asked is dropped. Dropped lines are counted (env_dropped). Bytes not yet written when a call
 *   times out are written first by the next call, so the program never sees a torn line.
 *   a server: one POST per episode, all at once (curl multi), each bounded by the timeout.
 * Owns: the requests' bytes, the replies' checks, the Env's bookkeeping. Does not own the child's
 * life (rlhf/subproc.c), nor episodes (the caller). */
#include "rlhf/env.h"
#include "rlhf/reward_cmd.h"
#include "rlhf/subproc.h"
#include "runtime/http.h"
#include "runtime/jsonl.h"
#include "runtime/util.h"
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ENV_MAX_LINE (16 << 20)   /* a reply line longer than this is an error of the call */
#define ENV_WHAT "environment command"

const char *const ENV_FAULT_NAMES[ENV_N_FAULTS] = {"ok", "bad_reply", "wrong_episode", "timeout"};

struct Env {
    int is_cmd;
    Subproc p;                /* a program */
    char *url, *url_shown;    /* a server: the base (no trailing '/'); as messages show it */
    CURLM *multi;             /* kept across calls: its connections are reused */
    double timeout_s;
    char *w;                  /* request bytes w[woff..wlen) not yet written (a program) */
    size_t wlen, wcap, woff;
    unsigned char *asked;     /* bit per episode id asked about so far (a program) */
    size_t asked_bytes;
    long dropped;
    char detail[4 * SUBPROC_SHOWN + 80];       /* the last call's first fault, one line ("" none) */
    int failed;               /* an error was reported: only env_close is allowed */
};

Env *env_open(const char *cmd, const char *url, double timeout_s, char *err, size_t errlen) {
    CHECK((cmd != NULL) != (url != NULL));
    if (!(timeout_s >= 0) || !isfinite(timeout_s)) {
        snprintf(err, errlen, "environment: timeout %g s: expected a finite number >= 0", timeout_s);
        return NULL;
    }
    Env *e = xcalloc(1, sizeof(Env));
    e->timeout_s = timeout_s;
    e->p = (Subproc){.pid = -1, .to = -1, .from = -1};
    if (cmd) {
        e->is_cmd = 1;
        if (subproc_start(&e->p, cmd, ENV_WHAT, err, errlen)) { free(e); return NULL; }
        return e;
    }
    if (strncmp(url, "http://", 7) && strncmp(url, "https://", 8)) {
        snprintf(err, errlen, "--env-url %s: not an http(s) URL", url);
        free(e);
        return NULL;
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    e->url = xstrdup(url);
    for (size_t l = strlen(e->url); l > 0 && e->url[l - 1] == '/'; l--) e->url[l - 1] = 0;
    e->url_shown = http_url_shown(e->url);
    e->multi = curl_multi_init();
    CHECK(e->multi != NULL);
    return e;
}

long env_dropped(const Env *e) { return e->dropped; }
const char *env_fault_detail(const Env *e) { return e->detail; }

/* ---- the messages ---- */

/* The request bodies (malloc'd, one JSON object each, no newline). turn NULL: resets, whose
 * "prompt" is the line's own bytes (checked to be one JSON object; never re-serialised, so a number
 * past 2^53 or a key's spelling reaches the program as the file has it). */
static char **requests(int n, const int *episode, const char *const *prompt_line, const int *turn,
                       const char *const *action, const int *const *action_ids, const int *n_ids) {
    char **b = xmalloc(sizeof(char *) * (size_t)n);
    for (int i = 0; i < n; i++) {
        CHECK(episode[i] >= 0);
        if (!turn) {
            cJSON *pl = cJSON_ParseWithOpts(prompt_line[i], NULL, 1);
            CHECK(cJSON_IsObject(pl));   /* the caller's prompt lines are JSON objects */
            cJSON_Delete(pl);
            b[i] = xmalloc(strlen(prompt_line[i]) + 64);
            sprintf(b[i], "{\"type\":\"reset\",\"episode\":%d,\"prompt\":%s}", episode[i], prompt_line[i]);
            continue;
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "type", "step");
        cJSON_AddNumberToObject(o, "episode", episode[i]);
        cJSON_AddNumberToObject(o, "turn", turn[i]);
        cJSON_AddStringToObject(o, "action", action[i]);
        cJSON *ids = cJSON_AddArrayToObject(o, "action_ids");
        for (int k = 0; k < n_ids[i]; k++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(action_ids[i][k]));
        b[i] = cJSON_PrintUnformatted(o);
        CHECK(b[i] != NULL);
        cJSON_Delete(o);
    }
    return b;
}

/* An integer in [0, INT_MAX] or -1 */
static int int_field(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
    return d >= 0 && d <= INT_MAX && d == floor(d) ? (int)d : -1;
}

/* One reply (NUL-terminated): *episode the id it names (-1: none: not a JSON object, or no integer
 * "episode"), *turn its echoed "turn" (-1 none), and r filled: the fields, or ENV_BAD_REPLY. */
static void parse_reply(const char *s, int step, int *episode, int *turn, EnvReply *r) {
    cJSON *o = cJSON_ParseWithOpts(s, NULL, 1);   /* `{...} junk` is not a reply */
    int obj = cJSON_IsObject(o);
    *episode = obj ? int_field(o, "episode") : -1;
    *turn = obj ? int_field(o, "turn") : -1;
    const cJSON *t = obj ? cJSON_GetObjectItemCaseSensitive(o, step ? "environment_feedback" : "observation") : NULL;
    const cJSON *rw = obj && step ? cJSON_GetObjectItemCaseSensitive(o, "reward") : NULL;
    const cJSON *d = obj && step ? cJSON_GetObjectItemCaseSensitive(o, "done") : NULL;
    int ok = obj && *episode >= 0 && (!t || cJSON_IsString(t)) && (!step || cJSON_IsBool(d)) &&
             (!rw || (cJSON_IsNumber(rw) && fabs(rw->valuedouble) <= REWARD_ABS_MAX));   /* NaN fails too */
    *r = (EnvReply){.fault = ok ? ENV_OK : ENV_BAD_REPLY, .done = ok ? step && cJSON_IsTrue(d) : 1};
    if (ok && rw) r->reward = rw->valuedouble;
    r->text = xstrdup(ok && t ? t->valuestring : "");
    cJSON_Delete(o);
}

/* Ends episode i of the call by a fault; its first one of the call is noted in e->detail. */
static void fault(Env *e, EnvReply *r, EnvFault f, int ep, const char *line, size_t len) {
    free(r->text);
    *r = (EnvReply){.text = xstrdup(""), .done = 1, .fault = f};
    if (e->detail[0]) return;
    char shown[4 * SUBPROC_SHOWN + 8];
    subproc_shown(shown, sizeof shown, line ? line : "", line ? len : 0);
    snprintf(e->detail, sizeof e->detail, "episode %d: %s%s%s", ep, ENV_FAULT_NAMES[f], line ? ": " : "", shown);
}

/* ---- a program ---- */

static int asked(const Env *e, int ep) { return (size_t)ep / 8 < e->asked_bytes && (e->asked[ep / 8] >> (ep % 8) & 1); }
static void mark_asked(Env *e, int ep) {
    if ((size_t)ep / 8 >= e->asked_bytes) {
        size_t nb = (size_t)ep / 8 + 1 > 2 * e->asked_bytes ? (size_t)ep / 8 + 1 : 2 * e->asked_bytes;
        e->asked = xrealloc(e->asked, nb);
        memset(e->asked + e->asked_bytes, 0, nb - e->asked_bytes);
        e->asked_bytes = nb;
    }
    e->asked[ep / 8] |= (unsigned char)(1u << (ep % 8));
}

/* The state of one call to a program */
typedef struct {
    int n, step, waiting;     /* episodes still without a reply */
    const int *episode, *turn;
    EnvReply *reply;
    char *got;                /* (n) 1: answered (or ended by a fault) */
    EnvFault *blamed;         /* (n) the faults of the lines no episode could be named for, in order */
    int n_blamed;
    char first[4 * SUBPROC_SHOWN + 8];   /* the first such line, shown */
} Call;

/* The episodes still waiting, in the call's order, take the blamed lines' faults in order; those
 * left over (at the timeout) end by `rest`. */
static void settle(Env *e, Call *c, EnvFault rest) {
    for (int i = 0, k = 0; i < c->n; i++) {
        if (c->got[i]) continue;
        EnvFault f = k < c->n_blamed ? c->blamed[k++] : rest;
        fault(e, &c->reply[i], f, c->episode[i], f == ENV_TIMEOUT ? NULL : c->first, strlen(c->first));
        c->got[i] = 1;
    }
    c->waiting = 0;
}

/* Gives one reply line (NUL-terminated, len bytes) to its episode, by the rules at the top. */
static void take_line(Env *e, Call *c, const char *line, size_t len) {
    int ep, turn, i = 0;
    EnvReply r;
    parse_reply(line, c->step, &ep, &turn, &r);
    if (ep >= 0) for (i = 0; i < c->n && c->episode[i] != ep; i++) {}
    if (ep >= 0 && i < c->n && !c->got[i] && (!c->step || turn < 0 || turn == c->turn[i])) {
        c->reply[i] = r;   /* its own reply, good or bad */
        if (r.fault) fault(e, &c->reply[i], r.fault, ep, line, len);
        c->got[i] = 1;
        c->waiting--;
    } else {
        free(r.text);
        if ((ep >= 0 && (i < c->n || asked(e, ep))) || c->waiting == 0) {
            e->dropped++;   /* late, a second reply, another turn's, or nobody's to blame */
            return;
        }
        if (c->n_blamed == 0) subproc_shown(c->first, sizeof c->first, line, len);
        c->blamed[c->n_blamed++] = ep >= 0 ? ENV_WRONG_EPISODE : ENV_BAD_REPLY;
    }
    if (c->n_blamed > 0 && c->n_blamed >= c->waiting) settle(e, c, ENV_TIMEOUT);
}

/* Consumes the whole lines in rbuf (and, at_eof, a last one without a newline). -1 with err on a
 * line past ENV_MAX_LINE. */
static int take_lines(Env *e, Call *c, int at_eof, char *err, size_t errlen) {
    size_t pos = 0;
    Subproc *p = &e->p;
    for (;;) {
        char *line = p->rbuf + pos, *nl = memchr(line, '\n', p->rlen - pos);
        if (!nl && (!at_eof || pos == p->rlen)) break;
        size_t len = nl ? (size_t)(nl - line) : p->rlen - pos;
        line[len] = 0;
        take_line(e, c, line, len);
        pos += len + (nl != NULL);
    }
    memmove(p->rbuf, p->rbuf + pos, p->rlen - pos);
    p->rlen -= pos;
    p->rbuf[p->rlen] = 0;
    if (p->rlen > ENV_MAX_LINE) {
        char bad[4 * SUBPROC_SHOWN + 8];
        subproc_shown(bad, sizeof bad, p->rbuf, p->rlen);
        snprintf(err, errlen, ENV_WHAT " `%s`: a line with no newline in its first %d MiB: %s", p->name,
                 ENV_MAX_LINE >> 20, bad);
        return -1;
    }
    return 0;
}

/* The program is gone (its output ended, or its input closed): what it wrote before still counts;
 * then the error, unless every episode has its reply (the next call will see the end). */
static int gone(Env *e, Call *c, const char *closed, char *err, size_t errlen) {
    ssize_t k = 0;
    size_t got = 0;   /* read here: a program that keeps writing is cut at ENV_MAX_LINE */
    while (got <= ENV_MAX_LINE && (k = subproc_read(&e->p)) > 0) {
        got += (size_t)k;
        if (take_lines(e, c, 0, err, errlen)) return -1;
    }
    if (take_lines(e, c, k == 0, err, errlen)) return -1;
    if (got > ENV_MAX_LINE) {
        snprintf(err, errlen, ENV_WHAT " `%s`: its %s closed, it went on writing (over %d MiB read after)", e->p.name,
                 closed, ENV_MAX_LINE >> 20);
        return -1;
    }
    if (c->waiting == 0) return 0;
    char why[256];
    subproc_describe_gone(&e->p, closed, why, sizeof why);
    snprintf(err, errlen, ENV_WHAT " `%s`: %s with %d of %d replies of a %s call outstanding", e->p.name, why,
             c->waiting, c->n, c->step ? "step" : "reset");
    return -1;
}

static int cmd_call(Env *e, Call *c, char **bodies, char *err, size_t errlen) {
    /* the requests after what is left of earlier calls' */
    if (e->woff) memmove(e->w, e->w + e->woff, e->wlen - e->woff);
    e->wlen -= e->woff;
    e->woff = 0;
    for (int i = 0; i < c->n; i++) {
        size_t l = strlen(bodies[i]);
        if (e->wlen + l + 2 > e->wcap) e->w = xrealloc(e->w, e->wcap = 2 * (e->wlen + l) + 4096);
        memcpy(e->w + e->wlen, bodies[i], l);
        e->w[e->wlen + l] = '\n';
        e->wlen += l + 1;
    }
    /* lines that came between calls answer nobody: dropped, before any episode of this call waits */
    int waiting = c->waiting;
    c->waiting = 0;
    memset(c->got, 1, (size_t)c->n);
    if (take_lines(e, c, 0, err, errlen)) return -1;
    memset(c->got, 0, (size_t)c->n);
    c->waiting = waiting;
    for (int i = 0; i < c->n; i++) {
        CHECK(!asked(e, c->episode[i]) || c->step);   /* a reset is an episode's first message */
        mark_asked(e, c->episode[i]);
    }
    double t_end = e->timeout_s > 0 ? now_seconds() + e->timeout_s : 0;
    while (c->waiting > 0) {
        int r = subproc_pump(&e->p, e->w, e->wlen, &e->woff, t_end, ENV_WHAT, err, errlen);
        if (r < 0) return -1;
        if (r & SUBPROC_TIMEOUT) {
            settle(e, c, ENV_TIMEOUT);
            break;
        }
        if (r & SUBPROC_EOF) return gone(e, c, "output", err, errlen);
        if ((r & SUBPROC_READ) && take_lines(e, c, 0, err, errlen)) return -1;
        if (r & SUBPROC_EPIPE) return gone(e, c, "input", err, errlen);
    }
    return 0;
}

/* ---- a server ---- */

typedef struct {
    HttpText t;               /* the answer so far */
    CURL *h;
    CURLcode rc;
} Post;

/* Episode i's reply from its POST's outcome: curl's failure (a timeout: ENV_TIMEOUT; any other:
 * ENV_BAD_REPLY), an HTTP status other than 200 (ENV_BAD_REPLY), or the body: a reply naming
 * another episode (ENV_WRONG_EPISODE), echoing another turn or no episode, or bad (ENV_BAD_REPLY). */
static void take_answer(Env *e, Call *c, int i, const Post *q, long status) {
    char why[160];
    const char *ans = q->t.ans ? q->t.ans : "";
    int ep = -1, turn = -1;
    if (q->rc != CURLE_OK) {
        snprintf(why, sizeof why, "%s", curl_easy_strerror(q->rc));
        fault(e, &c->reply[i], q->rc == CURLE_OPERATION_TIMEDOUT ? ENV_TIMEOUT : ENV_BAD_REPLY, c->episode[i], why,
              strlen(why));
        return;
    }
    if (status != 200) {
        snprintf(why, sizeof why, "HTTP %ld: %.100s", status, ans);
        fault(e, &c->reply[i], ENV_BAD_REPLY, c->episode[i], why, strlen(why));
        return;
    }
    parse_reply(ans, c->step, &ep, &turn, &c->reply[i]);
    EnvFault f = c->reply[i].fault;
    if (!f && ep != c->episode[i]) f = ep >= 0 ? ENV_WRONG_EPISODE : ENV_BAD_REPLY;
    if (!f && c->step && turn >= 0 && turn != c->turn[i]) f = ENV_BAD_REPLY;
    if (f) fault(e, &c->reply[i], f, c->episode[i], ans, q->t.len);
}

/* One POST per episode to URL/reset or URL/step, all at once; each reply checked by itself. */
static int url_call(Env *e, Call *c, char **bodies, char *err, size_t errlen) {
    char *url = xmalloc(strlen(e->url) + 8);
    sprintf(url, "%s/%s", e->url, c->step ? "step" : "reset");
    struct curl_slist *hdr = curl_slist_append(NULL, "Content-Type: application/json");
    Post *q = xcalloc((size_t)c->n, sizeof(Post));
    for (int i = 0; i < c->n; i++) {
        q[i].h = curl_easy_init();
        CHECK(q[i].h != NULL);
        curl_easy_setopt(q[i].h, CURLOPT_URL, url);
        curl_easy_setopt(q[i].h, CURLOPT_POSTFIELDS, bodies[i]);
        curl_easy_setopt(q[i].h, CURLOPT_HTTPHEADER, hdr);
        curl_easy_setopt(q[i].h, CURLOPT_WRITEFUNCTION, http_text_write);
        curl_easy_setopt(q[i].h, CURLOPT_WRITEDATA, &q[i].t);
        curl_easy_setopt(q[i].h, CURLOPT_NOSIGNAL, 1L);
        if (e->timeout_s > 0) curl_easy_setopt(q[i].h, CURLOPT_TIMEOUT_MS, (long)ceil(e->timeout_s * 1000));
        curl_multi_add_handle(e->multi, q[i].h);
    }
    for (int running = 1; running;) {
        curl_multi_perform(e->multi, &running);
        if (running) curl_multi_poll(e->multi, NULL, 0, 1000, NULL);
    }
    CURLMsg *msg;
    int left, unreachable = 0;
    CURLcode first = CURLE_OK;
    while ((msg = curl_multi_info_read(e->multi, &left)))
        for (int i = 0; i < c->n; i++)
            if (q[i].h == msg->easy_handle) q[i].rc = msg->data.result;
    for (int i = 0; i < c->n; i++) {
        long status = 0;
        curl_easy_getinfo(q[i].h, CURLINFO_RESPONSE_CODE, &status);
        curl_multi_remove_handle(e->multi, q[i].h);
        curl_easy_cleanup(q[i].h);
        if (q[i].rc == CURLE_COULDNT_CONNECT || q[i].rc == CURLE_COULDNT_RESOLVE_HOST ||
            q[i].rc == CURLE_COULDNT_RESOLVE_PROXY) unreachable++;
        if (q[i].rc != CURLE_OK && first == CURLE_OK) first = q[i].rc;
        take_answer(e, c, i, &q[i], status);
        free(q[i].t.ans);
    }
    free(q);
    free(url);
    curl_slist_free_all(hdr);
    if (c->n > 0 && unreachable == c->n) {
        snprintf(err, errlen, "environment server %s: %s (all %d %s requests)", e->url_shown, curl_easy_strerror(first),
                 c->n, c->step ? "step" : "reset");
        return -1;
    }
    return 0;
}

/* ---- the calls ---- */

static int call(Env *e, int n, const int *episode, const int *turn, char **bodies, EnvReply *reply, char *err,
                size_t errlen) {
    CHECK(!e->failed);   /* the caller must close an Env after an error */
    Call c = {.n = n, .step = turn != NULL, .waiting = n, .episode = episode, .turn = turn, .reply = reply};
    c.got = xcalloc((size_t)(n ? n : 1), 1);
    c.blamed = xcalloc((size_t)(n ? n : 1), sizeof(EnvFault));
    e->detail[0] = 0;
    for (int i = 0; i < n; i++) {
        reply[i] = (EnvReply){0};
        for (int j = 0; j < i; j++) CHECK(episode[j] != episode[i]);   /* one request per episode and call */
    }
    int rv = n == 0 ? 0 : e->is_cmd ? cmd_call(e, &c, bodies, err, errlen) : url_call(e, &c, bodies, err, errlen);
    for (int i = 0; i < n; i++) {
        if (rv) { free(reply[i].text); reply[i] = (EnvReply){.text = xstrdup(""), .done = 1}; }
        free(bodies[i]);
    }
    if (rv) e->failed = 1;
    free(bodies);
    free(c.got);
    free(c.blamed);
    return rv;
}

int env_reset(Env *e, int n, const int *episode, const char *const *prompt_line, EnvReply *reply, char *err,
              size_t errlen) {
    return call(e, n, episode, NULL, requests(n, episode, prompt_line, NULL, NULL, NULL, NULL), reply, err, errlen);
}

int env_step(Env *e, int n, const int *episode, const int *turn, const char *const *action,
             const int *const *action_ids, const int *n_ids, EnvReply *reply, char *err, size_t errlen) {
    return call(e, n, episode, turn, requests(n, episode, NULL, turn, action, action_ids, n_ids), reply, err, errlen);
}

void env_close(Env *e) {
    if (!e) return;
    if (e->is_cmd) subproc_stop(&e->p);
    if (e->multi) curl_multi_cleanup(e->multi);
    free(e->url);
    free(e->url_shown);
    free(e->w);
    free(e->asked);
    free(e);
}
