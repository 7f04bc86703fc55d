/* safetensors.c — see safetensors.h. Format: u64 little-endian header length, JSON header
 * {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the data. */
#include "runtime/safetensors.h"
#include "runtime/util.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static size_t dtype_size_st(StDtype d) { return d == ST_F32 ? 4 : 2; }

static void add_file(SafeTensors *st, const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) user_error("%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    CHECK(fstat(fd, &sb) == 0);
    size_t size = (size_t)sb.st_size;
    if (size < 8) user_error("%s: file is %zu bytes, too short for a safetensors header (truncated?)", path, size);
    uint8_t *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) user_error("%s: cannot mmap: %s", path, strerror(errno));
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | map[i];
    if (hlen > size - 8) user_error("%s: header length %llu runs past the end of the %zu-byte file (truncated?)",
                                    path, (unsigned long long)hlen, size);
    char *hjson = xmalloc(hlen + 1);
    memcpy(hjson, map + 8, hlen);
    hjson[hlen] = 0;
    cJSON *h = cJSON_Parse(hjson);
    free(hjson);
    if (!h || !cJSON_IsObject(h)) user_error("%s: safetensors header is not valid JSON", path);
    const uint8_t *base = map + 8 + hlen;
    size_t data_size = size - 8 - hlen;

    int fi = st->n_files++;
    st->files = xrealloc(st->files, sizeof(StFile) * st->n_files);
    st->files[fi] = (StFile){xstrdup(path), map, size};

    cJSON *e;
    cJSON_ArrayForEach(e, h) {
        if (!strcmp(e->string, "__metadata__")) continue;
        cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
        cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        if (!cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
            user_error("%s: tensor %s: malformed header entry", path, e->string);
        StTensor t = {0};
        t.name = xstrdup(e->string);
        t.file = fi;
        if (!strcmp(dt->valuestring, "F32")) t.dtype = ST_F32;
        else if (!strcmp(dt->valuestring, "BF16")) t.dtype = ST_BF16;
        else if (!strcmp(dt->valuestring, "F16")) t.dtype = ST_F16;
        else user_error("%s: tensor %s has dtype %s; supported: F32, BF16, F16", path, t.name, dt->valuestring);
        t.ndim = cJSON_GetArraySize(shape);
        if (t.ndim > 4) user_error("%s: tensor %s has %d dimensions", path, t.name, t.ndim);
        uint64_t numel = 1;
        for (int d = 0; d < t.ndim; d++) {
            cJSON *s = cJSON_GetArrayItem(shape, d);
            if (!cJSON_IsNumber(s) || s->valuedouble < 0) user_error("%s: tensor %s: bad shape", path, t.name);
            t.shape[d] = (int64_t)s->valuedouble;
            numel *= (uint64_t)t.shape[d];
        }
        double b = cJSON_GetArrayItem(offs, 0)->valuedouble, en = cJSON_GetArrayItem(offs, 1)->valuedouble;
        if (b < 0 || en < b) user_error("%s: tensor %s: bad data_offsets", path, t.name);
        if ((size_t)en > data_size)
            user_error("%s: tensor %s ends past end of file (truncated download?)", path, t.name);
        if ((uint64_t)(en - b) != numel * dtype_size_st(t.dtype))
            user_error("%s: tensor %s: %llu bytes for %llu elements of its dtype", path, t.name,
                       (unsigned long long)(en - b), (unsigned long long)numel);
        t.data = base + (size_t)b;
        st->tensors = xrealloc(st->tensors, sizeof(StTensor) * (st->n_tensors + 1));
        st->tensors[st->n_tensors++] = t;
    }
    cJSON_Delete(h);
}

SafeTensors *st_open_dir(const char *dir) {
    SafeTensors *st = xcalloc(1, sizeof(SafeTensors));
    char *single = path_join(dir, "model.safetensors");
    char *index = path_join(dir, "model.safetensors.index.json");
    if (file_exists(index)) {
        char *text = read_file(index, NULL);
        cJSON *j = text ? cJSON_Parse(text) : NULL;
        cJSON *wm = j ? cJSON_GetObjectItemCaseSensitive(j, "weight_map") : NULL;
        if (!cJSON_IsObject(wm)) user_error("%s: no \"weight_map\" object", index);
        /* open each distinct file once, in order of first appearance */
        char **seen = NULL;
        int n_seen = 0;
        cJSON *e;
        cJSON_ArrayForEach(e, wm) {
            if (!cJSON_IsString(e)) user_error("%s: weight_map[\"%s\"] is not a file name", index, e->string);
            int dup = 0;
            for (int i = 0; i < n_seen; i++) dup |= !strcmp(seen[i], e->valuestring);
            if (dup) continue;
            seen = xrealloc(seen, sizeof(char *) * (n_seen + 1));
            seen[n_seen++] = e->valuestring;
            char *p = path_join(dir, e->valuestring);
            if (!file_exists(p)) user_error("%s: names %s, which does not exist", index, e->valuestring);
            add_file(st, p);
            free(p);
        }
        /* every tensor the index names must be in the file it names */
        cJSON_ArrayForEach(e, wm) {
            const StTensor *t = st_find(st, e->string);
            if (!t) user_error("%s: tensor %s is not in %s", index, e->string, e->valuestring);
        }
        free(seen);
        cJSON_Delete(j);
        free(text);
    } else if (file_exists(single)) {
        add_file(st, single);
    } else {
        user_error("%s: no model.safetensors or model.safetensors.index.json", dir);
    }
    free(single);
    free(index);
    return st;
}

SafeTensors *st_open_file(const char *path) {
    SafeTensors *st = xcalloc(1, sizeof(SafeTensors));
    add_file(st, path);
    return st;
}

void st_close(SafeTensors *st) {
    if (!st) return;
    for (int i = 0; i < st->n_files; i++) {
        munmap(st->files[i].map, st->files[i].size);
        free(st->files[i].path);
    }
    for (int i = 0; i < st->n_tensors; i++) free(st->tensors[i].name);
    free(st->files);
    free(st->tensors);
    free(st);
}

const StTensor *st_find(const SafeTensors *st, const char *name) {
    for (int i = 0; i < st->n_tensors; i++)
        if (!strcmp(st->tensors[i].name, name)) return &st->tensors[i];
    return NULL;
}

static float load_elem(const StTensor *t, size_t i) {
    switch (t->dtype) {
    case ST_F32: { float f; memcpy(&f, t->data + 4 * i, 4); return f; }
    case ST_BF16: { uint16_t h; memcpy(&h, t->data + 2 * i, 2); return bf16_to_f32(h); }
    default: { uint16_t h; memcpy(&h, t->data + 2 * i, 2); return f16_to_f32(h); }
    }
}

/* Drops the mapped pages wholly inside [p, p + bytes) from this process's resident set: the file
 * stays in the page cache, but the mapping no longer counts once its bytes are in the arena, so a
 * load peaks at about the weights, not weights + file (MAP_PRIVATE and read-only: nothing to write
 * back; a later read would fault the pages in again). */
static void release_pages(const uint8_t *p, size_t bytes) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo = ((uintptr_t)p + page - 1) / page * page,
              hi = ((uintptr_t)p + bytes) / page * page;
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

void st_read_block(const SafeTensors *st, const char *name, int64_t rows, int64_t cols, int64_t r0,
                   int64_t nr, int64_t c0, int64_t nc, void *dst, DType dt) {
    const StTensor *t = st_find(st, name);
    if (!t) user_error("%s: tensor %s not found", st->files[0].path, name);
    const char *file = st->files[t->file].path;
    int want_ndim = cols ? 2 : 1;
    int ok = t->ndim == want_ndim && t->shape[0] == rows && (!cols || t->shape[1] == cols);
    if (!ok) {
        char got[96] = "", *p = got;
        for (int d = 0; d < t->ndim; d++) p += snprintf(p, 20, d ? ", %lld" : "%lld", (long long)t->shape[d]);
        if (cols) user_error("%s: tensor %s has shape [%s], expected [%lld, %lld] from config.json", file, name,
                             got, (long long)rows, (long long)cols);
        user_error("%s: tensor %s has shape [%s], expected [%lld] from config.json", file, name, got, (long long)rows);
    }
    int64_t ncols = cols ? cols : 1;
    CHECK(c0 >= 0 && c0 + nc <= ncols && r0 >= 0);
    size_t es = dtype_size(dt), ss = dtype_size_st(t->dtype);
    int same = (t->dtype == ST_F32 && dt == DTYPE_F32) || (t->dtype == ST_BF16 && dt == DTYPE_BF16);
    for (int64_t r = 0; r < nr; r++) {
        char *o = (char *)dst + (size_t)(r * nc) * es;
        if (r0 + r >= rows) { memset(o, 0, es * nc); continue; }
        size_t base = (size_t)(r0 + r) * ncols + c0;
        if (same) memcpy(o, t->data + ss * base, es * nc);
        else if (dt == DTYPE_F32) for (int64_t c = 0; c < nc; c++) ((float *)o)[c] = load_elem(t, base + c);
        else for (int64_t c = 0; c < nc; c++) ((uint16_t *)o)[c] = f32_to_bf16(load_elem(t, base + c));
    }
    int64_t r1 = r0 + nr < rows ? r0 + nr : rows;
    if (nr > 0 && r1 > r0) release_pages(t->data + ss * (size_t)(r0 * ncols), ss * (size_t)((r1 - r0) * ncols));
}

struct StWriter {
    FILE *f;
    char *tmp, *path;
    StDtype dtype;
    size_t *numel;   /* (n) expected size of each tensor, in order */
    int n, next, ok;
};

StWriter *st_writer_open(const char *path, const StWriteTensor *t, int n, StDtype dtype) {
    cJSON *h = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(h, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    StWriter *w = xcalloc(1, sizeof(StWriter));
    w->numel = xmalloc(sizeof(size_t) * (n ? n : 1));
    size_t off = 0, ds = dtype_size_st(dtype);
    for (int i = 0; i < n; i++) {
        cJSON *e = cJSON_AddObjectToObject(h, t[i].name);
        cJSON_AddStringToObject(e, "dtype", dtype == ST_F32 ? "F32" : dtype == ST_BF16 ? "BF16" : "F16");
        cJSON *s = cJSON_AddArrayToObject(e, "shape");
        size_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++) {
            cJSON_AddItemToArray(s, cJSON_CreateNumber((double)t[i].shape[d]));
            numel *= (size_t)t[i].shape[d];
        }
        w->numel[i] = numel;
        cJSON *o = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
        off += numel * ds;
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
    }
    char *hj = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    size_t hlen = strlen(hj), padded = (hlen + 7) / 8 * 8, plen = strlen(path) + 32;
    w->n = n;
    w->dtype = dtype;
    w->path = xstrdup(path);
    w->tmp = xmalloc(plen);
    snprintf(w->tmp, plen, "%s.tmp.%d", path, (int)getpid());
    w->f = fopen(w->tmp, "wb");
    int ok = w->f != NULL;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    ok = ok && fwrite(len8, 1, 8, w->f) == 8 && fwrite(hj, 1, hlen, w->f) == hlen;
    for (size_t i = hlen; i < padded && ok; i++) ok = fputc(' ', w->f) != EOF;   /* data 8-byte aligned */
    free(hj);
    w->ok = ok;
    if (!ok) {
        int e = errno;
        if (w->f) { fclose(w->f); unlink(w->tmp); }
        free(w->tmp); free(w->path); free(w->numel); free(w);
        errno = e;
        return NULL;
    }
    return w;
}

int st_writer_put(StWriter *w, const float *data, size_t numel) {
    CHECK(w->next < w->n && numel == w->numel[w->next]);
    w->next++;
    if (!w->ok) return -1;
    if (w->dtype == ST_F32) {
        w->ok = fwrite(data, sizeof(float), numel, w->f) == numel;
    } else {
        for (size_t j = 0; j < numel && w->ok; j++) {
            uint16_t b = f32_to_bf16(data[j]);
            w->ok = fwrite(&b, 2, 1, w->f) == 1;
        }
    }
    return w->ok ? 0 : -1;
}

int st_writer_close(StWriter *w) {
    int ok = w->ok && w->next == w->n;
    ok = fflush(w->f) == 0 && ok;
    ok = fsync(fileno(w->f)) == 0 && ok;
    ok = fclose(w->f) == 0 && ok;
    if (ok) ok = rename(w->tmp, w->path) == 0;
    int e = errno;
    if (!ok) unlink(w->tmp);
    free(w->tmp); free(w->path); free(w->numel); free(w);
    errno = e;
    return ok ? 0 : -1;
}

int st_write(const char *path, const StWriteTensor *t, int n, StDtype dtype) {
    StWriter *w = st_writer_open(path, t, n, dtype);
    if (!w) return -1;
    for (int i = 0; i < n; i++) st_writer_put(w, t[i].data, w->numel[i]);
    return st_writer_close(w);
}
