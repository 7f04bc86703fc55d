/* hub.c — see hub.h. The Hub protocol and the cache: the file list, the cache layout and the checks
 * follow huggingface_hub (file_download.py, hf_api.py) so that the two share one cache. The transfers
 * themselves (one GET with retries, Range resumes, the progress bar, the failure line) are
 * runtime/http.c's; this file gives each one the Hub's curl handle, token and limits, and the advice
 * its failure line ends with (HF_TOKEN, HF_ENDPOINT, --revision, ...). */
#include "runtime/hub.h"
#include "runtime/comm.h"
#include "runtime/http.h"
#include "runtime/util.h"
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

/* ---- the Hub and its transfers ---- */

typedef struct {
    char endpoint[512];    /* HF_ENDPOINT without a trailing '/' */
    char shown[512];       /* endpoint as messages show it: without a user:password (http_url_shown) */
    char cache[4096];      /* the hub cache directory */
    char *auth;            /* "Authorization: Bearer ..." or NULL */
    int offline;           /* HF_HUB_OFFLINE: the cache only */
    int timeout;           /* s a connection may take to open or stall */
    int retries;           /* attempts after the first that moved no bytes */
    int bar;               /* progress bar on stderr (a terminal) */
    int say;               /* a line per fetched file on stderr (not a terminal) */
    CURL *curl;            /* the one handle (made on first use): reused, so keep-alive connections are too */
} Hub;

/* What a failed Hub request's line ends with (http_fail): what to do about it. */
static const char *hub_advice(const HttpXfer *x, CURLcode rc) {
    const Hub *h = x->ctx;
    static char net[640];
    if (rc == CURLE_WRITE_ERROR && x->werr)
        return x->werr == ENOSPC ? " (disk full: free space or point HF_HOME / --dir elsewhere)" : "";
    if (rc == CURLE_OPERATION_TIMEDOUT) return " (--timeout)";
    if (rc != CURLE_OK) {
        snprintf(net, sizeof net, " (no network? HF_ENDPOINT is %s; HF_HUB_OFFLINE=1 uses the cache only)", h->shown);
        return net;
    }
    if (x->status == 401)
        return x->auth ? ": HF_TOKEN was sent and refused: a token with read access to this repository is needed"
                       : ": the repository is private or gated, or does not exist: set HF_TOKEN to a token that can read it";
    if (x->status == 403)
        return !strcmp(x->ecode, "GatedRepo") || !x->auth
                   ? ": a gated repository: accept its terms on the Hub, then set HF_TOKEN to that account's token"
                   : ": HF_TOKEN has no access to this repository";
    if (x->status == 404)
        return !strcmp(x->ecode, "RevisionNotFound") ? ": no such revision (check --revision)"
               : !strcmp(x->ecode, "EntryNotFound")  ? ": no such file in this revision"
                                                     : ": no such repository or revision (check the id and --revision)";
    return "";
}

/* A GET of url through the Hub's handle with its token, limits and advice; into memory until the
 * caller sets fd. */
static HttpXfer hub_xfer(Hub *h, const char *url) {
    if (!h->curl) {
        curl_global_init(CURL_GLOBAL_DEFAULT);
        h->curl = curl_easy_init();
        CHECK(h->curl != NULL);
    }
    return (HttpXfer){.curl = h->curl, .url = url, .auth = h->auth, .agent = "tandem/1 (huggingface_hub-compatible)",
                      .timeout = h->timeout, .retries = h->retries, .bar = h->bar, .fd = -1, .total = -1,
                      .advice = hub_advice, .ctx = h};
}

/* ---- checks ---- */

/* lowercase hex digest of a file (prefix hashed first: git's "blob N\0"), or -1 with errno */
static int file_digest(const char *path, const EVP_MD *md, const char *prefix, size_t plen, char *hex) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    CHECK(ctx && EVP_DigestInit_ex(ctx, md, NULL));
    if (plen) EVP_DigestUpdate(ctx, prefix, plen);
    static unsigned char buf[1 << 20];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) EVP_DigestUpdate(ctx, buf, (size_t)n);
    int e = n < 0 ? errno : 0;
    close(fd);
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned dl = 0;
    EVP_DigestFinal_ex(ctx, d, &dl);
    EVP_MD_CTX_free(ctx);
    if (e) { errno = e; return -1; }
    for (unsigned i = 0; i < dl; i++) sprintf(hex + 2 * i, "%02x", d[i]);
    return 0;
}

static int is_hex(const char *s, size_t n) {
    if (!s || strlen(s) != n) return 0;
    for (size_t i = 0; i < n; i++) if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

/* A name from the server becomes a path under our directories: relative, no "..", no empty parts. */
int hub_safe_rel_path(const char *f) {
    if (!*f || *f == '/' || strchr(f, '\\')) return 0;
    for (const char *c = f; *c; c++) if ((unsigned char)*c < 0x20 || *c == 0x7f) return 0;
    for (const char *p = f; *p;) {
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.')) return 0;
        p += n + (e != NULL);
        if (e && !*p) return 0;
    }
    return 1;
}

/* "'c' is not allowed", or "byte 0xNN" for what does not print, into a static buffer */
static const char *bad_char(unsigned char c, const char *allowed) {
    static char why[160];
    if (c >= 0x20 && c < 0x7f) snprintf(why, sizeof why, "'%c' is not allowed (%s)", c, allowed);
    else snprintf(why, sizeof why, "byte 0x%02x is not allowed (%s)", c, allowed);
    return why;
}

static int is_word_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* huggingface_hub's validate_repo_id (utils/_validators.py) with the ORG required and ASCII only:
 * ^(\b[\w\-.]+\b/)?\b[\w\-.]{1,96}\b$, no "--" or "..", no ".git" at the end. */
const char *hub_repo_id_error(const char *id) {
    const char *slash = strchr(id, '/');
    if (!slash) return "no '/' between ORG and NAME";
    if (strchr(slash + 1, '/')) return "more than one '/'";
    const char *name = slash + 1;
    size_t len = strlen(id), name_len = strlen(name);
    if (slash == id || !name_len) return "ORG and NAME cannot be empty";
    for (const char *p = id; *p; p++)
        if (p != slash && !is_word_char(*p) && *p != '-' && *p != '.')
            return bad_char((unsigned char)*p, "letters, digits, '-', '_' and '.' only");
    if (!is_word_char(id[0]) || !is_word_char(slash[-1]) || !is_word_char(name[0]) || !is_word_char(id[len - 1]))
        return "ORG and NAME must start and end with a letter, a digit or '_'";
    if (strstr(id, "--") || strstr(id, "..")) return "'--' and '..' are not allowed";
    if (name_len > 96) return "NAME is longer than 96 characters";
    if (name_len >= 4 && !strcmp(id + len - 4, ".git")) return "NAME cannot end in \".git\"";
    return NULL;
}

/* git check-ref-format's rules for a branch or tag (a 40-hex commit passes them too), printable ASCII
 * only, and none of the URL's '#', '%'; at most 255 bytes (refs/REV is a file of the cache). */
const char *hub_revision_error(const char *rev) {
    size_t n = strlen(rev);
    if (!n) return "it is empty";
    if (n > 255) return "longer than 255 characters";
    for (const char *p = rev; *p; p++)
        if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f || strchr("~^:?*[\\#%", *p))
            return bad_char((unsigned char)*p, "a branch, a tag or a commit");
    if (strstr(rev, "..")) return "'..' is not allowed";
    if (rev[0] == '/' || rev[n - 1] == '/' || strstr(rev, "//")) return "an empty part between '/'";
    if (rev[n - 1] == '.') return "it cannot end in '.'";
    if (!strcmp(rev, "@") || strstr(rev, "@{")) return "'@' alone and '@{' are not allowed";
    for (const char *p = rev; *p;) {   /* each part between '/' */
        size_t k = strcspn(p, "/");
        if (p[0] == '.') return "a part cannot start with '.'";
        if (k >= 5 && !strncmp(p + k - 5, ".lock", 5)) return "a part cannot end in \".lock\"";
        p += k + (p[k] == '/');
    }
    return NULL;
}

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *f, ...) {
    va_list ap, aq;
    va_start(ap, f);
    va_copy(aq, ap);
    int n = vsnprintf(NULL, 0, f, ap);
    va_end(ap);
    char *s = xmalloc((size_t)n + 1);
    vsnprintf(s, (size_t)n + 1, f, aq);
    va_end(aq);
    return s;
}

static void make_parents(const char *path) {
    if (mkdir_parents(path)) user_error("cannot create the directories of %s: %s", path, strerror(errno));
}

/* ---- one file ---- */

/* Downloads url into dest through part (resumed if present) under the flock on lock; checks the size
 * and the hash, then renames part over dest. With keep, nothing to do when dest exists (a blob:
 * another process got there first). */
static void download(Hub *h, const char *url, const HubFile *f, const char *part, const char *dest, const char *lock,
                     int keep) {
    make_parents(lock);
    int lfd = open(lock, O_CREAT | O_RDWR, 0644);
    if (lfd < 0) user_error("%s: %s", lock, strerror(errno));
    while (flock(lfd, LOCK_EX))
        if (errno != EINTR) user_error("%s: cannot lock: %s (a file system without locks? point HF_HOME elsewhere)", lock, strerror(errno));
    if (keep && access(dest, F_OK) == 0) { close(lfd); return; }
    make_parents(part);
    int fd = open(part, O_CREAT | O_RDWR, 0644);
    if (fd < 0) user_error("%s: %s", part, strerror(errno));
    struct stat st;
    struct statvfs vfs;
    char *dir = xstrdup(part);
    *strrchr(dir, '/') = 0;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && statvfs(dir, &vfs) == 0 &&
        (double)vfs.f_bavail * (double)vfs.f_frsize < (double)(f->size - st.st_size))
        user_error("%s: disk full: %s needs %.1f MiB more, %s has %.1f MiB free (free space or point HF_HOME / --dir elsewhere)",
                   http_url_shown(url), f->name, (double)(f->size - st.st_size) / 1048576.0, dir,
                   (double)vfs.f_bavail * (double)vfs.f_frsize / 1048576.0);
    free(dir);
    HttpXfer x = hub_xfer(h, url);
    x.fd = fd, x.path = part, x.total = f->size, x.max = 4096, x.label = f->name;
    http_get(&x);
    if (h->bar) http_draw_bar(&x, f->size, 1);
    else if (h->say) {
        char a[32];
        fprintf(stderr, "tandem: fetched %s (%s in %.2f s)\n", f->name, http_human_bytes((double)f->size, a, sizeof a),
                now_seconds() - x.t0);
    }
    if (fsync(fd) && errno != EINVAL) { x.werr = errno; http_fail(&x, CURLE_WRITE_ERROR, 1); }
    if (close(fd)) { x.werr = errno; http_fail(&x, CURLE_WRITE_ERROR, 1); }
    free(x.mem);
    if (stat(part, &st) || st.st_size != f->size) {
        unlink(part);
        user_error("%s: %lld bytes arrived, the Hub API says %lld; the partial file is removed, run again", http_url_shown(url),
                   (long long)st.st_size, (long long)f->size);
    }
    char got[2 * EVP_MAX_MD_SIZE + 1], pre[64];
    int plen = f->lfs ? 0 : snprintf(pre, sizeof pre, "blob %lld", (long long)f->size) + 1;   /* git hashes "blob N\0" + bytes */
    if (file_digest(part, f->lfs ? EVP_sha256() : EVP_sha1(), pre, (size_t)plen, got))
        user_error("%s: %s", part, strerror(errno));
    if (strcmp(got, f->blob)) {
        unlink(part);
        user_error("%s: %s %s, the Hub API says %s: a corrupt download (removed; run again)", http_url_shown(url),
                   f->lfs ? "sha256" : "git blob sha1", got, f->blob);
    }
    make_parents(dest);
    if (rename(part, dest)) user_error("%s -> %s: %s", part, dest, strerror(errno));
    close(lfd);
}

/* ---- the cache ---- */

static void hub_init(Hub *h, int timeout, int retries) {
    memset(h, 0, sizeof *h);
    const char *e = getenv("HF_ENDPOINT");
    snprintf(h->endpoint, sizeof h->endpoint, "%s", e && *e ? e : "https://huggingface.co");
    for (size_t n = strlen(h->endpoint); n && h->endpoint[n - 1] == '/';) h->endpoint[--n] = 0;
    char *shown = http_url_shown(h->endpoint);
    snprintf(h->shown, sizeof h->shown, "%s", shown);
    free(shown);
    const char *c = getenv("HF_HUB_CACHE"), *home = getenv("HF_HOME"), *xdg = getenv("XDG_CACHE_HOME"), *u = getenv("HOME");
    char hf_home[4000];
    if (home && *home) snprintf(hf_home, sizeof hf_home, "%s", home);
    else if (xdg && *xdg) snprintf(hf_home, sizeof hf_home, "%s/huggingface", xdg);
    else snprintf(hf_home, sizeof hf_home, "%s/.cache/huggingface", u && *u ? u : ".");
    if (c && *c) snprintf(h->cache, sizeof h->cache, "%s", c);
    else snprintf(h->cache, sizeof h->cache, "%s/hub", hf_home);
    const char *env = getenv("HF_TOKEN");
    if (!env || !*env) env = getenv("HUGGING_FACE_HUB_TOKEN");
    char *tok = env && *env ? xstrdup(env) : NULL;
    if (!tok) {   /* `huggingface-cli login` stores it here */
        const char *tp = getenv("HF_TOKEN_PATH");
        char *p = tp && *tp ? xstrdup(tp) : path_join(hf_home, "token");
        tok = read_file(p, NULL);
        free(p);
    }
    if (tok) {   /* without the whitespace around it (a pasted newline) */
        char *t = tok + strspn(tok, " \t\r\n");
        t[strcspn(t, " \t\r\n")] = 0;
        if (*t) h->auth = fmt("Authorization: Bearer %s", t);
    }
    free(tok);
    const char *off = getenv("HF_HUB_OFFLINE");
    if (!off || !*off) off = getenv("TRANSFORMERS_OFFLINE");
    h->offline = off && (!strcmp(off, "1") || !strcasecmp(off, "true") || !strcasecmp(off, "yes") || !strcasecmp(off, "on"));
    h->timeout = timeout;
    h->retries = retries;
}

/* "models--ORG--NAME": the repository's folder in the cache (and under .locks) */
static char *folder_name(const char *repo) {
    const char *slash = strchr(repo, '/');
    return fmt("models--%.*s--%s", (int)(slash - repo), repo, slash + 1);
}
static char *repo_folder(const Hub *h, const char *repo) {
    char *name = folder_name(repo), *s = path_join(h->cache, name);
    free(name);
    return s;
}

/* config.json and the weights (model.safetensors, or the index and every shard it names) */
static int snapshot_usable(const char *dir) {
    char *p = path_join(dir, "config.json");
    int ok = file_exists(p);
    free(p);
    if (!ok) return 0;
    p = path_join(dir, "model.safetensors");
    ok = file_exists(p);
    free(p);
    if (ok) return 1;
    p = path_join(dir, "model.safetensors.index.json");
    char *txt = read_file(p, NULL);
    free(p);
    cJSON *o = txt ? cJSON_Parse(txt) : NULL, *map = cJSON_GetObjectItemCaseSensitive(o, "weight_map"), *v;
    ok = cJSON_IsObject(map) && cJSON_GetArraySize(map) > 0;
    cJSON_ArrayForEach(v, map) {
        if (!ok) break;
        char *s = cJSON_IsString(v) ? path_join(dir, v->valuestring) : NULL;
        ok = s && file_exists(s);
        free(s);
    }
    cJSON_Delete(o);
    free(txt);
    return ok;
}

/* The cached snapshot of repo at rev (a commit, or a ref resolved through refs/), or NULL. */
static char *cached_snapshot(const Hub *h, const char *repo, const char *rev) {
    char *folder = repo_folder(h, repo), *commit = NULL;
    if (is_hex(rev, 40)) commit = xstrdup(rev);
    else {
        char *ref = fmt("%s/refs/%s", folder, rev);
        commit = read_file(ref, NULL);
        free(ref);
    }
    char *snap = commit && is_hex(commit, 40) ? fmt("%s/snapshots/%s", folder, commit) : NULL;
    free(commit);
    free(folder);
    if (snap && !dir_exists(snap)) { free(snap); snap = NULL; }
    return snap;
}

static char *url_escape(const char *s, int keep_slash) {
    CURL *c = curl_easy_init();
    CHECK(c != NULL);
    char *out = xstrdup("");
    for (const char *p = s; *p;) {
        size_t n = keep_slash ? strcspn(p, "/") : strlen(p);
        char *e = curl_easy_escape(c, p, (int)n);
        CHECK(e != NULL);
        char *t = fmt("%s%s%s", out, e, p[n] == '/' ? "/" : "");
        curl_free(e);
        free(out);
        out = t;
        p += n + (p[n] == '/');
    }
    curl_easy_cleanup(c);
    return out;
}

/* What a model needs (huggingface_hub would take everything; tandem reads these) */
static const char *default_files[] = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer.model",
                                      "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                                      "vocab.json", "merges.txt", "model.safetensors.index.json", "*.safetensors"};

static int wanted(const char *name, char **inc, int n_inc) {
    if (n_inc) {
        for (int i = 0; i < n_inc; i++) if (!fnmatch(inc[i], name, 0)) return 1;
        return 0;
    }
    if (strchr(name, '/')) return 0;   /* the defaults are the repository's top level */
    for (size_t i = 0; i < sizeof default_files / sizeof *default_files; i++)
        if (!fnmatch(default_files[i], name, 0)) return 1;
    return 0;
}

/* See hub.h. */
char *hub_parse_files(char *answer, const char *url, const char *repo, const char *rev, char **inc, int n_inc,
                      HubFile **out, int *n_out) {
    cJSON *o = cJSON_Parse(answer ? answer : "");
    const cJSON *sha = cJSON_GetObjectItemCaseSensitive(o, "sha"), *sib = cJSON_GetObjectItemCaseSensitive(o, "siblings"), *s;
    if (!cJSON_IsString(sha) || !is_hex(sha->valuestring, 40) || !cJSON_IsArray(sib))
        user_error("%s: not a Hub model answer (no \"sha\" commit or \"siblings\" list): %.200s", http_url_shown(url), answer ? http_one_line(answer) : "");
    char *commit = xstrdup(sha->valuestring);
    HubFile *files = xcalloc((size_t)cJSON_GetArraySize(sib) + 1, sizeof(HubFile));
    int n = 0, n_all = 0, weights = 0;
    char listed[512] = "";
    cJSON_ArrayForEach(s, sib) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(s, "rfilename");
        if (!cJSON_IsString(name)) user_error("%s: a sibling without \"rfilename\"", http_url_shown(url));
        const char *nm = name->valuestring;
        if (!hub_safe_rel_path(nm)) user_error("%s: refusing the file name \"%.100s\" (not a plain relative path)", http_url_shown(url), nm);
        size_t l = strlen(listed);
        if (l < sizeof listed - 1) snprintf(listed + l, sizeof listed - l, "%s%s", n_all ? ", " : "", nm);
        n_all++;
        size_t nl = strlen(nm);
        weights |= nl > 12 && !strcmp(nm + nl - 12, ".safetensors") && !strchr(nm, '/');
        if (!wanted(nm, inc, n_inc)) continue;
        const cJSON *lfs = cJSON_GetObjectItemCaseSensitive(s, "lfs");
        const cJSON *hash = lfs ? cJSON_GetObjectItemCaseSensitive(lfs, "sha256") : cJSON_GetObjectItemCaseSensitive(s, "blobId");
        const cJSON *size = cJSON_GetObjectItemCaseSensitive(lfs ? lfs : s, "size");
        if (!cJSON_IsString(hash) || !is_hex(hash->valuestring, lfs ? 64 : 40) || !cJSON_IsNumber(size) ||
            !(size->valuedouble >= 0 && size->valuedouble < 0x1p53))   /* (int64_t) of 1e300 is undefined */
            user_error("%s: no %s and size for %s (the API answer lacks blob metadata)", http_url_shown(url), lfs ? "lfs.sha256" : "blobId", nm);
        files[n++] = (HubFile){xstrdup(nm), xstrdup(hash->valuestring), (int64_t)size->valuedouble, lfs != NULL};
    }
    if (!n_inc && !weights)
        user_error("%s@%s has no .safetensors weights at its top level (files: %s); tandem reads safetensors only "
                   "(--include GLOB fetches other files)", repo, rev, listed);
    if (!n) user_error("%s@%s: no file matches --include (files: %s)", repo, rev, listed);
    cJSON_Delete(o);
    *out = files;
    *n_out = n;
    return commit;
}

void hub_files_free(HubFile *files, int n) {
    for (int i = 0; i < n; i++) free(files[i].name), free(files[i].blob);
    free(files);
}

/* The repository at rev: the commit and the wanted files with their blob names and sizes. */
static char *repo_files(Hub *h, const char *repo, const char *rev, char **inc, int n_inc, HubFile **out, int *n_out) {
    char *erepo = url_escape(repo, 1), *erev = url_escape(rev, 0);   /* "refs/pr/1" is one part: %2F */
    char *url = fmt("%s/api/models/%s/revision/%s?blobs=true", h->endpoint, erepo, erev);
    free(erepo), free(erev);
    HttpXfer x = hub_xfer(h, url);
    x.max = 64u << 20;
    http_get(&x);
    char *commit = hub_parse_files(x.mem, url, repo, rev, inc, n_inc, out, n_out);
    free(x.mem);
    free(url);
    return commit;
}

/* Fetches repo at rev into the cache (dir NULL) or into dir; returns the snapshot directory (or dir). */
static char *fetch(Hub *h, const char *repo, const char *rev, const char *dir, char **inc, int n_inc) {
    CHECK(!hub_repo_id_error(repo) && !hub_revision_error(rev));   /* the callers check them */
    if (h->offline) {
        char *snap = dir ? NULL : cached_snapshot(h, repo, rev);
        if (snap && (n_inc || snapshot_usable(snap))) return snap;
        user_error("%s@%s is not in the cache %s and HF_HUB_OFFLINE is set (unset it to fetch)", repo, rev, h->cache);
    }
    HubFile *files;
    int n;
    char *commit = repo_files(h, repo, rev, inc, n_inc, &files, &n);
    char *folder = repo_folder(h, repo), *snap = dir ? xstrdup(dir) : fmt("%s/snapshots/%s", folder, commit);
    char *erepo = url_escape(repo, 1);
    for (int i = 0; i < n; i++) {
        HubFile *f = &files[i];
        char *fname = url_escape(f->name, 1);   /* (commit is 40 hex digits: nothing to escape) */
        char *url = fmt("%s/%s/resolve/%s/%s", h->endpoint, erepo, commit, fname);
        char *dest = path_join(snap, f->name);
        if (dir) {   /* huggingface_hub's local-dir layout: metadata "commit\netag\ntime\n" beside */
            char *meta = fmt("%s/.cache/huggingface/download/%s.metadata", dir, f->name);
            char *part = fmt("%s/.cache/huggingface/download/%s.%s.incomplete", dir, f->name, f->blob);
            char *lock = fmt("%s/.cache/huggingface/download/%s.lock", dir, f->name);
            char *m = read_file(meta, NULL);
            int fresh = m && access(dest, F_OK) == 0 && !strncmp(strchr(m, '\n') ? strchr(m, '\n') + 1 : "", f->blob, strlen(f->blob));
            free(m);
            if (!fresh) {
                download(h, url, f, part, dest, lock, 0);
                char *txt = fmt("%s\n%s\n%.6f\n", commit, f->blob, (double)time(NULL));
                if (write_file_atomic(meta, txt, strlen(txt))) user_error("%s: cannot write: %s", meta, strerror(errno));
                free(txt);
            }
            free(meta), free(part), free(lock);
        } else if (access(dest, F_OK) != 0) {   /* the pointer (following the link) is missing */
            char *blob = fmt("%s/blobs/%s", folder, f->blob), *part = fmt("%s.incomplete", blob);
            char *fold = folder_name(repo), *lock = fmt("%s/.locks/%s/%s.lock", h->cache, fold, f->blob);
            download(h, url, f, part, blob, lock, 1);
            char *rel = xstrdup("../../");   /* snapshots/COMMIT/a/b -> ../../../blobs/X */
            for (const char *p = f->name; (p = strchr(p, '/')); p++) { char *t = fmt("%s../", rel); free(rel); rel = t; }
            char *target = fmt("%sblobs/%s", rel, f->blob), *tmp = fmt("%s.tmp.%d", dest, (int)getpid());
            make_parents(dest);
            unlink(tmp);
            if (symlink(target, tmp) || rename(tmp, dest)) user_error("%s: %s", dest, strerror(errno));
            free(blob), free(part), free(lock), free(fold), free(rel), free(target), free(tmp);
        }
        free(fname), free(url), free(dest);
    }
    if (!dir && strcmp(rev, commit)) {   /* refs/REV -> commit, as huggingface_hub writes it */
        char *ref = fmt("%s/refs/%s", folder, rev);
        make_parents(ref);
        if (write_file_atomic(ref, commit, strlen(commit))) user_error("%s: cannot write: %s", ref, strerror(errno));
        free(ref);
    }
    hub_files_free(files, n);
    free(erepo);
    free(folder);
    free(commit);
    return snap;
}

/* ---- --model ORG/NAME ---- */

/* What a --model value names: a local path; a Hub id; or "ORG/NAME" with an ORG that is no local
 * folder yet against the Hub's rules (refused: neither a directory nor an id, nothing is requested). */
enum { MODEL_PATH, MODEL_REPO_ID, MODEL_BAD_ID };

static int model_kind(const char *s) {
    const char *slash = s ? strchr(s, '/') : NULL;
    if (!slash || dir_exists(s) || slash == s || s[0] == '.' || strchr(slash + 1, '/')) return MODEL_PATH;
    char *org = xstrdup(s);
    org[slash - s] = 0;
    int local = dir_exists(org);   /* "build/x": a local path that is not there */
    free(org);
    if (local) return MODEL_PATH;
    return hub_repo_id_error(s) ? MODEL_BAD_ID : MODEL_REPO_ID;
}

/* The commit a snapshot directory names (its last part), into c[41]. */
static void snap_commit(const char *snap, char c[41]) {
    const char *b = strrchr(snap, '/');
    snprintf(c, 41, "%s", b ? b + 1 : snap);
}

static void hub_free(Hub *h) {
    free(h->auth);
    if (h->curl) curl_easy_cleanup(h->curl);
}

/* Every rank takes the same branches and ends on the same commit: rank 0 decides whether arg is a
 * repository id and which commit of main to use (its cache's, else the one it fetches); then one
 * rank per other node fetches that commit into its node's cache where it is missing. */
const char *hub_model_path(const char *arg) {
    Comm world = {.rank = 0, .size = 1, .handle = NULL};   /* without MPI (fetch, convert, tokenize): one rank */
    if (comm_initialized()) world = comm_world();
    int rank = world.rank, size = world.size;
    int kind = model_kind(arg);
    comm_broadcast(&world, &kind, sizeof kind, 0);
    if (kind == MODEL_BAD_ID)
        user_error("\"%s\" is not a directory, nor a Hub repository id ORG/NAME: %s", http_one_line(xstrdup(arg)),
                   hub_repo_id_error(arg));
    if (kind == MODEL_PATH) {
        comm_free(&world);
        return arg;
    }
    /* rank 0, then one rank per other node, may download for minutes while the rest wait: no
     * communication deadline (runtime/comm.h) until every node has the model (the barrier below) */
    double deadline = comm_timeout();
    comm_set_timeout(0);
    Hub h;
    hub_init(&h, 10, 5);
    char commit[41] = "", *snap = NULL;
    if (rank == 0) {
        snap = cached_snapshot(&h, arg, "main");
        if (snap && snapshot_usable(snap)) snap_commit(snap, commit);
        else {
            if (!h.offline)
                fprintf(stderr, "tandem: %s is not a directory nor in the Hugging Face cache %s; fetching it from %s\n",
                        arg, h.cache, h.shown);
            h.bar = isatty(2);
            h.say = !h.bar;
            free(snap);
            snap = fetch(&h, arg, "main", NULL, NULL, 0);
            snap_commit(snap, commit);
            h.bar = h.say = 0;
        }
    }
    if (size > 1) {
        comm_broadcast(&world, commit, sizeof commit, 0);
        Comm node = comm_split_node(&world);
        int local = node.rank;
        if (rank != 0) {
            snap = cached_snapshot(&h, arg, commit);
            if (local == 0 && !(snap && snapshot_usable(snap))) {   /* another node (or another cache) */
                free(snap);
                snap = fetch(&h, arg, commit, NULL, NULL, 0);
            }
        }
        comm_barrier(&node);   /* the node's other ranks read what its first one fetched */
        comm_free(&node);
        if (local != 0) {
            free(snap);
            snap = cached_snapshot(&h, arg, commit);
            if (!snap || !snapshot_usable(snap))
                rank_error("%s: commit %s was fetched on this node, yet is not in %s", arg, commit, h.cache);
        }
        comm_barrier(&world);   /* every node has it */
    }
    comm_set_timeout(deadline);
    comm_free(&world);
    hub_free(&h);
    return snap;
}

/* ---- tandem fetch (runtime/fetch.c) ---- */

char *hub_fetch(const char *repo, const char *rev, const char *dir, char **include, int n_include, int timeout,
                int retries) {
    Hub h;
    hub_init(&h, timeout, retries);
    h.bar = isatty(2);
    h.say = !h.bar;
    char *snap = fetch(&h, repo, rev, dir, include, n_include);
    hub_free(&h);
    return snap;
}
