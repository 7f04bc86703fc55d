/* jsonl.c — see jsonl.h. */
#include "runtime/jsonl.h"
#include "runtime/util.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

void jsonl_open(JsonlReader *r, const char *path) {
    memset(r, 0, sizeof(*r));
    r->path = path;
    r->f = fopen(path, "r");
    if (!r->f) user_error("%s: cannot open: %s", path, strerror(errno));
}

void jsonl_attach(JsonlReader *r, FILE *f, const char *name) {
    memset(r, 0, sizeof(*r));
    r->path = name;
    r->f = f;
    r->borrowed = 1;
}

size_t jsonl_max_bytes(int64_t n_positions) {
    size_t floor = (size_t)1 << 20;
    return n_positions > (int64_t)(floor / 64) ? (size_t)n_positions * 64 : floor;
}

size_t utf8_valid_prefix(const char *s, size_t n) {
    for (size_t at = 0; at < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + at, (utf8proc_ssize_t)(n - at), &cp);
        if (k < 0) return at;
        at += (size_t)k;
    }
    return n;
}

cJSON *jsonl_next(JsonlReader *r) {
    ssize_t len;
    while ((len = getline(&r->buf, &r->cap, r->f)) != -1) {
        r->line++;
        if (strlen(r->buf) != (size_t)len) user_error("%s:%d: a NUL byte in the line", r->path, r->line);
        while (len > 0 && (r->buf[len - 1] == '\n' || r->buf[len - 1] == '\r' || r->buf[len - 1] == ' ')) r->buf[--len] = 0;
        if (len == 0) continue;
        if (r->max_positions && (size_t)len > jsonl_max_bytes(r->max_positions))
            user_error("%s:%d: a line of %zd bytes, over the limit of %zu bytes for %lld positions (64 bytes "
                       "per position, at least 1 MiB)", r->path, r->line, len, jsonl_max_bytes(r->max_positions),
                       (long long)r->max_positions);
        /* JSON text is UTF-8 (RFC 8259): a stray byte would be echoed into the output's "prompt" and
         * make the whole output file unreadable to strict readers */
        size_t valid = utf8_valid_prefix(r->buf, (size_t)len);
        if (valid < (size_t)len) user_error("%s:%d: not valid UTF-8 (byte %zu)", r->path, r->line, valid + 1);
        const char *end = NULL;
        cJSON *j = cJSON_ParseWithOpts(r->buf, &end, 0);
        if (!j) user_error("%s:%d: not a JSON object (invalid JSON near column %d)", r->path, r->line, (int)(end - r->buf) + 1);
        if (!cJSON_IsObject(j)) user_error("%s:%d: not a JSON object", r->path, r->line);
        /* C strings end at NUL: an escaped \u0000 would silently cut a string short */
        for (const char *u = strstr(r->buf, "\\u0000"); u; u = strstr(u + 1, "\\u0000")) {
            size_t at = (size_t)(u - r->buf), slashes = 1;   /* the backslashes ending at u */
            while (slashes <= at && r->buf[at - slashes] == '\\') slashes++;
            if (slashes % 2) user_error("%s:%d: a string holds \\u0000 (NUL), which is not supported", r->path, r->line);
        }
        end += strspn(end, " \t\r");
        if (*end) user_error("%s:%d: text after the JSON object (one object per line)", r->path, r->line);
        return j;
    }
    if (ferror(r->f)) user_error("%s: cannot read after line %d: %s", r->path, r->line, strerror(errno));
    return NULL;
}

void jsonl_close(JsonlReader *r) {
    if (r->f && !r->borrowed) fclose(r->f);
    free(r->buf);
    memset(r, 0, sizeof(*r));
}

void jsonl_append(char **buf, size_t *len, size_t *cap, const cJSON *o) {
    char *line = cJSON_PrintUnformatted(o);
    size_t l = strlen(line);
    while (*len + l + 2 > *cap) *buf = xrealloc(*buf, *cap = 2 * *cap + 4096);
    memcpy(*buf + *len, line, l);
    *len += l;
    (*buf)[(*len)++] = '\n';
    free(line);
}
