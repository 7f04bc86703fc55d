/* http.c — see http.h. */
#include "runtime/http.h"
#include "runtime/util.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

int http_should_retry(CURLcode rc, long status) {
    if (rc != CURLE_OK)
        return rc != CURLE_WRITE_ERROR && rc != CURLE_URL_MALFORMAT && rc != CURLE_UNSUPPORTED_PROTOCOL &&
               rc != CURLE_COULDNT_RESOLVE_HOST && rc != CURLE_ABORTED_BY_CALLBACK;
    return status == 429 || status >= 500;
}

void http_backoff(int attempt) {
    if (attempt < 1) return;
    usleep((useconds_t)(0.5e6 * (1 << (attempt - 1 < 4 ? attempt - 1 : 4))));
}

/* ---- one GET with retries, to memory or resuming into a file ---- */

static void trim_copy(char *dst, size_t cap, const char *v, size_t n) {
    while (n && (*v == ' ' || *v == '\t')) v++, n--;
    while (n && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' ')) n--;
    snprintf(dst, cap, "%.*s", (int)n, v);
}

static size_t on_header(char *p, size_t size, size_t nmemb, void *u) {
    HttpXfer *x = u;
    size_t n = size * nmemb;
    if (n >= 5 && !strncmp(p, "HTTP/", 5)) x->ecode[0] = x->emsg[0] = 0;   /* a new response (redirects) */
    else if (n > 13 && !strncasecmp(p, "x-error-code:", 13)) trim_copy(x->ecode, sizeof x->ecode, p + 13, n - 13);
    else if (n > 16 && !strncasecmp(p, "x-error-message:", 16)) trim_copy(x->emsg, sizeof x->emsg, p + 16, n - 16);
    return n;
}

static size_t on_body(char *p, size_t size, size_t nmemb, void *u) {
    HttpXfer *x = u;
    size_t n = size * nmemb;
    if (!x->status) curl_easy_getinfo(x->curl, CURLINFO_RESPONSE_CODE, &x->status);
    if (x->fd >= 0 && x->status == 200 && x->have > 0) { x->range_ignored = 1; return 0; }   /* (curl may say it first) */
    if (x->fd >= 0 && (x->status == 200 || x->status == 206)) {
        for (size_t done = 0; done < n;) {
            ssize_t w = write(x->fd, p + done, n - done);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) { x->werr = w < 0 ? errno : EIO; return 0; }
            done += (size_t)w;
        }
        return n;
    }
    size_t keep = x->len + n > x->max ? x->max - x->len : n;   /* an error page: its first bytes */
    if (x->fd < 0 && keep < n) { x->werr = EFBIG; return 0; }
    x->mem = xrealloc(x->mem, x->len + keep + 1);
    memcpy(x->mem + x->len, p, keep);
    x->len += keep;
    x->mem[x->len] = 0;
    return n;
}

char *http_one_line(char *s) {
    for (char *c = s; *c; c++) if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = ' ';
    return s;
}

char *http_url_shown(const char *url) {
    const char *host = strstr(url, "://");   /* a scheme, if "://" comes before the path */
    if (!host || strcspn(url, "/?#") < (size_t)(host - url)) host = url;
    else host += 3;
    const char *at = NULL;   /* the last '@' of the authority ends the user:password */
    for (const char *p = host; *p && !strchr("/?#", *p); p++) if (*p == '@') at = p;
    if (!at) return xstrdup(url);
    size_t pre = (size_t)(host - url), n = pre + strlen(at + 1);
    char *s = xmalloc(n + 1);
    memcpy(s, url, pre);
    strcpy(s + pre, at + 1);
    return s;
}

const char *http_human_bytes(double b, char *buf, size_t cap) {
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) b /= 1024, u++;
    snprintf(buf, cap, u ? "%.1f %s" : "%.0f %s", b, unit[u]);
    return buf;
}

void http_draw_bar(HttpXfer *x, int64_t now_bytes, int final) {
    double t = now_seconds(), dt = t - x->t0;
    double rate = dt > 0 ? (double)(now_bytes - x->base) / dt : 0;
    int pct = x->total > 0 ? (int)(100.0 * (double)now_bytes / (double)x->total) : 0;
    char eta[32] = "-", a[32], b[32], r[32];
    if (final) snprintf(eta, sizeof eta, "%.1fs", dt);
    else if (rate > 0 && x->total > 0) {
        long s = (long)((double)(x->total - now_bytes) / rate);
        snprintf(eta, sizeof eta, "%ld:%02ld", s / 60, s % 60);
    }
    char bar[21];
    for (int i = 0; i < 20; i++) bar[i] = i < pct / 5 ? '#' : ' ';
    bar[20] = 0;
    fprintf(stderr, "\r%-28.28s [%s] %3d%% %10s/%-10s %10s/s %s %s\033[K%s", x->label, bar, pct,
            http_human_bytes((double)now_bytes, a, sizeof a), http_human_bytes((double)x->total, b, sizeof b),
            http_human_bytes(rate, r, sizeof r),
            final ? "in" : "ETA", eta, final ? "\n" : "");
    x->drawn = t;
}

static int on_progress(void *u, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ult, curl_off_t uln) {
    (void)dltotal, (void)ult, (void)uln;
    HttpXfer *x = u;
    if (x->bar && x->label && now_seconds() - x->drawn >= 0.1) http_draw_bar(x, x->have + dlnow, 0);
    return 0;
}

_Noreturn void http_fail(HttpXfer *x, CURLcode rc, int attempts) {
    if (x->bar && x->drawn > 0) fputc('\n', stderr);   /* the bar's line stays; the error gets its own */
    const char *advice = x->advice ? x->advice(x, rc) : "";
    char *url = http_url_shown(x->url);   /* (not freed: user_error ends the process) */
    char tries[48] = "";
    if (attempts > 1) snprintf(tries, sizeof tries, " (after %d attempts)", attempts);
    if (rc == CURLE_WRITE_ERROR && x->werr)
        user_error("%s: writing %s: %s%s", url, x->path ? x->path : "memory", strerror(x->werr), advice);
    if (rc == CURLE_OPERATION_TIMEDOUT)
        user_error("%s: %s%s: the server stalled for %d s%s", url, curl_easy_strerror(rc), tries, x->timeout, advice);
    if (rc != CURLE_OK) user_error("%s: %s%s%s", url, curl_easy_strerror(rc), tries, advice);
    char why[256] = "";
    if (x->emsg[0]) snprintf(why, sizeof why, " (%s)", x->emsg);
    else if (x->len) snprintf(why, sizeof why, " (%.200s)", x->mem);
    http_one_line(why);
    user_error("%s: HTTP %ld%s%s%s", url, x->status, tries, why, advice);
}

void http_get(HttpXfer *x) {
    struct curl_slist *hdr = x->auth ? curl_slist_append(NULL, x->auth) : NULL;
    for (int attempt = 0, idle = 0;; attempt++) {
        if (idle) http_backoff(idle);
        CURL *c = x->curl;
        curl_easy_reset(c);
        x->status = 0;
        x->len = 0;
        x->werr = x->range_ignored = 0;
        x->ecode[0] = x->emsg[0] = 0;
        if (x->fd >= 0) {
            off_t end = lseek(x->fd, 0, SEEK_END);
            if (end < 0) { x->werr = errno; http_fail(x, CURLE_WRITE_ERROR, 1); }
            x->have = end;
            if (x->total >= 0 && x->have > x->total) {   /* longer than the file: not ours, start over */
                if (ftruncate(x->fd, 0) || lseek(x->fd, 0, SEEK_SET) < 0) { x->werr = errno; http_fail(x, CURLE_WRITE_ERROR, 1); }
                x->have = 0;
            }
            if (attempt == 0) x->base = x->have, x->t0 = now_seconds();
            if (x->total >= 0 && x->have == x->total) { x->status = 206; break; }
            if (x->have > 0) curl_easy_setopt(c, CURLOPT_RESUME_FROM_LARGE, (curl_off_t)x->have);
        }
        curl_easy_setopt(c, CURLOPT_URL, x->url);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
        curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);   /* LFS files redirect to a CDN; Authorization stays with the first host */
        curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
        curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
        curl_easy_setopt(c, CURLOPT_USERAGENT, x->agent);
        curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(c, CURLOPT_HEADERDATA, x);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, x);
        curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
        curl_easy_setopt(c, CURLOPT_XFERINFODATA, x);
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, (long)x->timeout);
        curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);            /* a stall of timeout s ends the attempt */
        curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, (long)x->timeout);
        int64_t before = x->fd >= 0 ? x->have : 0;
        CURLcode rc = curl_easy_perform(c);
        if (!x->status) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &x->status);
        if (rc == CURLE_OK && (x->status == 200 || x->status == 206)) break;
        if (x->fd >= 0 && x->have > 0 && (rc == CURLE_RANGE_ERROR || x->range_ignored || x->status == 416)) {
            /* the server ignores Range, or our partial file and it disagree: from byte 0 at once (no
             * Range is sent then, so this happens once) */
            if (ftruncate(x->fd, 0)) { x->werr = errno; http_fail(x, CURLE_WRITE_ERROR, attempt + 1); }
            x->base = 0;
            continue;
        }
        if (!http_should_retry(rc, x->status)) http_fail(x, rc, attempt + 1);
        off_t now = x->fd >= 0 ? lseek(x->fd, 0, SEEK_END) : 0;
        idle = now > before ? 1 : idle + 1;   /* bytes moved: the count starts again */
        if (idle > x->retries) http_fail(x, rc, attempt + 1);
    }
    curl_slist_free_all(hdr);
}

size_t http_text_write(char *d, size_t size, size_t nmemb, void *user) {
    HttpText *q = user;
    size_t k = size * nmemb;
    if (q->len + k + 1 > q->cap) q->ans = xrealloc(q->ans, q->cap = 2 * (q->len + k) + 1024);
    memcpy(q->ans + q->len, d, k);
    q->len += k;
    q->ans[q->len] = 0;
    return k;
}
