/* reward_http.c — see reward_http.h. curl's multi interface runs one request per URL at once; each
 * failed part is retried by itself. */
#include "rlhf/reward_http.h"
#include "rlhf/reward_cmd.h"
#include "runtime/http.h"
#include "runtime/util.h"
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    HttpText t;                /* the answer so far */
    const char *url;
    char *url_shown;       /* url as messages show it (no user:password) */
    int first, n;              /* the part of the batch: items first .. first + n - 1 */
    char *body;                /* the request */
    CURL *h;
    long status;
    CURLcode rc;
    int done;                  /* 1: rewards in place */
} Part;

static char *request_body(int first, int n, const char *const *queries, const char *const *prompts,
                          const char *const *labels) {
    cJSON *o = cJSON_CreateObject(), *qs = cJSON_AddArrayToObject(o, "query"), *ps = cJSON_AddArrayToObject(o, "prompts");
    cJSON *ls = cJSON_AddArrayToObject(o, "labels");
    for (int i = first; i < first + n; i++) {
        cJSON_AddItemToArray(qs, cJSON_CreateString(queries[i]));
        cJSON_AddItemToArray(ps, cJSON_CreateString(prompts[i]));
        cJSON *l = labels && labels[i] ? cJSON_Parse(labels[i]) : cJSON_CreateNull();
        CHECK(l != NULL);
        cJSON_AddItemToArray(ls, l);
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static void start(CURLM *multi, Part *q, double timeout_s, struct curl_slist *hdr) {
    q->t.len = 0;
    q->status = 0;
    q->h = curl_easy_init();
    CHECK(q->h != NULL);
    curl_easy_setopt(q->h, CURLOPT_URL, q->url);
    curl_easy_setopt(q->h, CURLOPT_POSTFIELDS, q->body);
    curl_easy_setopt(q->h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(q->h, CURLOPT_WRITEFUNCTION, http_text_write);
    curl_easy_setopt(q->h, CURLOPT_WRITEDATA, &q->t);
    curl_easy_setopt(q->h, CURLOPT_NOSIGNAL, 1L);
    if (timeout_s > 0) curl_easy_setopt(q->h, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1000));
    curl_multi_add_handle(multi, q->h);
}

/* The answer as a message quotes it: its first 200 bytes, made one line (an error page's newlines
 * would otherwise break the one-line error) */
static const char *shown(const char *ans, char *buf, size_t len) {
    snprintf(buf, len, "%.200s", ans ? ans : "");
    return http_one_line(buf);
}

/* 0: rewards written; 1: worth retrying (connection, timeout, 429, 5xx); -1: an error now */
static int finish(Part *q, double *rewards, char *err, size_t errlen) {
    if (q->rc != CURLE_OK) {
        snprintf(err, errlen, "reward server %s: %s", q->url_shown, curl_easy_strerror(q->rc));
        return http_should_retry(q->rc, 0) ? 1 : -1;
    }
    if (q->status != 200) {
        char buf[256];
        snprintf(err, errlen, "reward server %s: HTTP %ld: %s", q->url_shown, q->status, shown(q->t.ans, buf, sizeof buf));
        return http_should_retry(CURLE_OK, q->status) ? 1 : -1;
    }
    return reward_http_parse_answer(q->url_shown, q->t.ans, q->n, rewards + q->first, err, errlen);
}

int reward_http_parse_urls(const char *list, char ***urls) {
    char *copy = xstrdup(list), *save = NULL;
    int n = 0;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (strncmp(t, "http://", 7) && strncmp(t, "https://", 8)) user_error("--reward-url %s: \"%s\" is not an http(s) URL", list, t);
        *urls = xrealloc(*urls, sizeof(char *) * (n + 1));
        (*urls)[n++] = xstrdup(t);
    }
    free(copy);
    if (!n) user_error("--reward-url: no URL given");
    return n;
}

/* See reward_http.h. */
int reward_http_parse_answer(const char *url, const char *ans, int n, double *rewards, char *err, size_t errlen) {
    cJSON *o = cJSON_Parse(ans ? ans : "");
    const cJSON *r = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, "rewards") : NULL;
    int ok = cJSON_IsArray(r) && cJSON_GetArraySize(r) == n, i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, r) ok &= cJSON_IsNumber(v) && isfinite(v->valuedouble);
    if (!ok) {
        if (cJSON_IsArray(r) && cJSON_GetArraySize(r) != n) {
            snprintf(err, errlen, "reward server %s: %d rewards for %d responses", url, cJSON_GetArraySize(r), n);
        } else {
            char buf[256];
            snprintf(err, errlen, "reward server %s: the answer is not {\"rewards\": [numbers]}: %s", url,
                     shown(ans, buf, sizeof buf));
        }
        cJSON_Delete(o);
        return -1;
    }
    cJSON_ArrayForEach(v, r) {
        if (!(fabs(v->valuedouble) <= REWARD_ABS_MAX)) {
            snprintf(err, errlen, "reward server %s: reward %d of %d is %.9g, outside [-%g, %g]", url, i + 1, n,
                     v->valuedouble, REWARD_ABS_MAX, REWARD_ABS_MAX);
            cJSON_Delete(o);
            return -1;
        }
        rewards[i++] = v->valuedouble;
    }
    cJSON_Delete(o);
    return 0;
}

int reward_http_score(const char *const *urls, int n_urls, int n, const char *const *queries,
                      const char *const *prompts, const char *const *labels, double *rewards, double timeout_s,
                      int retries, char *err, size_t errlen) {
    static int inited;
    if (!inited) { curl_global_init(CURL_GLOBAL_DEFAULT); inited = 1; }
    int k = n_urls < n ? n_urls : n, rv = 0;
    Part *parts = xcalloc(k ? k : 1, sizeof(Part));
    for (int u = 0, first = 0; u < k; u++) {   /* contiguous parts, sizes differing by at most one */
        int m = n / k + (u < n % k);
        parts[u] = (Part){.url = urls[u], .url_shown = http_url_shown(urls[u]), .first = first, .n = m};
        parts[u].body = request_body(first, m, queries, prompts, labels);
        first += m;
    }
    struct curl_slist *hdr = curl_slist_append(NULL, "Content-Type: application/json");
    CURLM *multi = curl_multi_init();
    for (int attempt = 0, pending = k; pending > 0; attempt++) {
        http_backoff(attempt);
        for (int u = 0; u < k; u++) if (!parts[u].done) start(multi, &parts[u], timeout_s, hdr);
        int running = 1;
        while (running) {
            curl_multi_perform(multi, &running);
            if (running) curl_multi_poll(multi, NULL, 0, 1000, NULL);
        }
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(multi, &left)))
            for (int u = 0; u < k; u++)
                if (parts[u].h == msg->easy_handle) parts[u].rc = msg->data.result;
        int retry = 0;
        for (int u = 0; u < k; u++) {
            Part *q = &parts[u];
            if (q->done) continue;
            curl_easy_getinfo(q->h, CURLINFO_RESPONSE_CODE, &q->status);
            curl_multi_remove_handle(multi, q->h);
            curl_easy_cleanup(q->h);
            q->h = NULL;
            int f = finish(q, rewards, err, errlen);
            if (f == 0) { q->done = 1; pending--; }
            else if (f < 0) { rv = -1; pending = 0; break; }
            else retry = 1;
        }
        if (rv == 0 && retry && attempt >= retries) {
            size_t l = strlen(err);
            snprintf(err + l, errlen > l ? errlen - l : 0, " (after %d attempts)", attempt + 1);
            rv = -1;
            break;
        }
    }
    for (int u = 0; u < k; u++) {
        if (parts[u].h) { curl_multi_remove_handle(multi, parts[u].h); curl_easy_cleanup(parts[u].h); }
        free(parts[u].body);
        free(parts[u].t.ans);
        free(parts[u].url_shown);
    }
    curl_multi_cleanup(multi);
    curl_slist_free_all(hdr);
    free(parts);
    return rv;
}
