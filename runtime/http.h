/* http.h — HTTP for every client of the project: Hub downloads (runtime/hub.c) and reward servers
 * (rlhf/reward_http.c).
 * Owns: the retry policy (which failures are worth another attempt and how long to wait before it),
 * and one GET with libcurl's easy interface and retries, into memory or resuming into a file with
 * Range, with its progress bar and its one-line failure messages (used by hub.c).
 * Does not own a curl handle, a server's URLs, tokens or file names, nor the advice a failure line
 * ends with: each client keeps its own handles and passes what a transfer needs in an HttpXfer. */
#ifndef TANDEM_HTTP_H
#define TANDEM_HTTP_H
#include <curl/curl.h>
#include <stddef.h>
#include <stdint.h>

int http_should_retry(CURLcode rc, long status); /* connection trouble, timeouts, 429, 5xx */
void http_backoff(int attempt);                 /* sleeps 0.5, 1, 2, 4, 8, 8, ... s before attempt 1, 2, ... */

/* One GET. The caller sets the first group (zero what it does not use); http_get fills the rest. */
typedef struct HttpXfer HttpXfer;
struct HttpXfer {
    CURL *curl;            /* the caller's handle: reused, so keep-alive connections are too */
    const char *url;
    const char *auth;      /* an "Authorization: ..." header line, or NULL */
    const char *agent;     /* User-Agent */
    int timeout;           /* s a connection may take to open or stall */
    int retries;           /* attempts after the first that moved no bytes */
    int bar;               /* draw a progress bar on stderr (a terminal) while label is set */
    int fd;                /* the download's partial file; -1: the answer goes to mem */
    const char *path;      /* fd's path (messages) */
    int64_t total;         /* the file's size, -1 unknown */
    size_t max;            /* most bytes kept in mem: the answer (fd < 0) or an error page's first bytes */
    const char *label;     /* progress bar: the file's name */
    /* what http_fail's line ends with for this failure ("" for nothing): the caller's advice */
    const char *(*advice)(const HttpXfer *x, CURLcode rc);
    const void *ctx;       /* advice's */

    int64_t have;          /* bytes the file held when this request started (the Range start) */
    long status;           /* of the final response */
    int werr;              /* errno of a failed write */
    int range_ignored;     /* a 200 to our Range request: the partial file starts over */
    char *mem;             /* the answer (fd < 0) or the first bytes of an error page; the caller frees it */
    size_t len;
    char ecode[64], emsg[200];   /* X-Error-Code / X-Error-Message */
    double t0, drawn;      /* progress bar: start time, last draw */
    int64_t base;          /* progress bar: the first byte of this run */
};

/* GET x->url. fd >= 0: appends to the partial file from its current size (Range), restarting from
 * byte 0 if the server ignores Range or refuses it; fd < 0: the answer lands in x->mem. Retries
 * what http_should_retry says, counting only attempts that moved no bytes. Returns when the whole
 * body is in; anything else stops the job (http_fail). */
void http_get(HttpXfer *x);

/* The one line for a failed request (user_error): URL, status or curl's error, attempts, the
 * server's X-Error-Message (else an error page's first bytes), then x->advice's words. rc
 * CURLE_WRITE_ERROR with x->werr set: writing x->path failed with that errno. */
_Noreturn void http_fail(HttpXfer *x, CURLcode rc, int attempts);

/* "name [#####     ]  45%  1.2 MiB/2.7 MiB  5.3 MiB/s  ETA 0:03" on one terminal line; final: the
 * time taken instead of the ETA, and a newline. */
void http_draw_bar(HttpXfer *x, int64_t now_bytes, int final);

const char *http_human_bytes(double b, char *buf, size_t cap);   /* "535 B", "7.3 KiB", "1.0 MiB", "2.1 GiB" into buf */
char *http_one_line(char *s);   /* control bytes (newlines of an error page, escapes) become spaces, in place */
/* url as a message may show it: without the user:password of its authority ("http://u:p@host/x" ->
 * "http://host/x"), malloc'd. Every line that names a URL shows this, never the URL itself. */
char *http_url_shown(const char *url);
/* A response body gathered in memory (the reward servers' and the environments' POSTs): ans grows,
 * NUL-terminated; http_text_write is its CURLOPT_WRITEFUNCTION (CURLOPT_WRITEDATA: the HttpText). */
typedef struct { char *ans; size_t len, cap; } HttpText;
size_t http_text_write(char *d, size_t size, size_t nmemb, void *user);
#endif
