/* util.c — see util.h. Owns error exits and small system helpers; knows nothing of models. */
#include "runtime/util.h"
#include "kernels/kernels.h"   /* backend_set_fatal */
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The error path is the one place that asks MPI about the whole world (ARCHITECTURE.md: an error
 * stops the whole job). Who speaks for a user_error is the root of this process's group, set by
 * whoever makes the group (util_set_reporter); until then, world rank 0 (set by comm_init). */
static int s_reporter = 1;
static char s_group[32];

void util_set_reporter(int is_reporter, const char *group_name) {
    s_reporter = is_reporter;
    snprintf(s_group, sizeof s_group, "%s", group_name ? group_name : "");
}
int util_is_reporter(void) { return s_reporter; }

/* 0 in a process alone (comm.c never initialises MPI without a launcher): rank 0 of 1, plain exit */
static int mpi_up(void) {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    return init && !fin;
}
static int world_rank(void) {
    int r = 0;
    if (mpi_up()) MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}
static int world_size(void) {
    int n = 1;
    if (mpi_up()) MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

/* util_on_error's cleanups (a fixed few) */
static void (*s_on_error[4])(void);
void util_on_error(void (*fn)(void)) {
    size_t i = 0;
    while (i < sizeof s_on_error / sizeof s_on_error[0] && s_on_error[i]) i++;
    CHECK(i < sizeof s_on_error / sizeof s_on_error[0]);
    s_on_error[i] = fn;
}

_Noreturn static void stop_job(void) {
    for (size_t i = 0; i < sizeof s_on_error / sizeof s_on_error[0] && s_on_error[i]; i++) s_on_error[i]();
    fflush(stdout);
    fflush(stderr);
    if (world_size() > 1 && mpi_up()) {
        usleep(300 * 1000); /* let mpirun forward our last line before the abort tears the job down */
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    exit(1);
}

/* The message of fmt, ap (malloc'd) as one line: control bytes (a newline or a terminal escape in a
 * quoted value from the input) become spaces, so an error is always the one `tandem: ...` line. */
static char *one_line(const char *fmt, va_list ap) {
    va_list aq;
    va_copy(aq, ap);
    int n = vsnprintf(NULL, 0, fmt, aq);
    va_end(aq);
    char *msg = malloc(n > 0 ? (size_t)n + 1 : 1);
    if (!msg) return NULL;
    vsnprintf(msg, (size_t)(n > 0 ? n + 1 : 1), fmt, ap);
    for (char *c = msg; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = ' ';
    return msg;
}

/* "tandem: [group] [rank N] message": the one line every error exit prints (the group's name only
 * when the world has several role groups) */
static void report(int with_rank, const char *msg) {
    /* formatted whole, then one write: a line split over several writes can be cut by another
     * rank's output where mpirun merges the ranks' streams */
    char head[96] = "tandem: ";
    if (s_group[0]) snprintf(head + strlen(head), sizeof head - strlen(head), "[%.40s] ", s_group);
    if (with_rank) snprintf(head + strlen(head), sizeof head - strlen(head), "[rank %d] ", world_rank());
    const char *body = msg ? msg : "(out of memory formatting the message)";
    size_t n = strlen(head) + strlen(body) + 2;
    char *line = malloc(n);
    if (!line) { fputs(head, stderr); fputs(body, stderr); fputc('\n', stderr); return; }
    snprintf(line, n, "%s%s\n", head, body);
    fwrite(line, 1, n - 1, stderr);
    free(line);
}

void (*util_user_error_hook)(const char *msg);

_Noreturn void user_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *msg = one_line(fmt, ap);
    va_end(ap);
    if (util_user_error_hook) util_user_error_hook(msg ? msg : "");   /* tests only (util.h): does not return */
    /* The other ranks of the group saw the same input; its root reports and aborts the whole job
     * (every group). Should the root not get here (a problem only this rank sees), this rank is
     * still alive after a while: it says it itself rather than let the job end without a word. */
    if (!s_reporter) sleep(10);
    report(!s_reporter, msg);
    stop_job();
}

_Noreturn void rank_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *msg = one_line(fmt, ap);
    va_end(ap);
    report(world_size() > 1, msg);
    stop_job();
}

/* the kernels' fatal errors are rank_error lines (kernels/kernels.h backend_fatal): registered before
 * main in every binary that links this file, so kernels/ need not call up into runtime/ */
static void kernels_fatal(const char *msg) { rank_error("%s", msg); }
__attribute__((constructor)) static void register_kernels_fatal(void) { backend_set_fatal(kernels_fatal); }

_Noreturn void job_error(int speaker, const char *fmt, ...) {
    va_list ap;
    if (!speaker) {
        sleep(10);   /* the speaker's line and abort come first; this is only a backstop */
        stop_job();
    }
    va_start(ap, fmt);
    char *msg = one_line(fmt, ap);
    va_end(ap);
    report(0, msg);
    stop_job();
}

_Noreturn void check_failed(const char *expr, const char *file, int line) {
    fprintf(stderr, "tandem: internal error [rank %d] %s:%d: CHECK(%s) failed%s%s\n", world_rank(), file,
            line, expr, errno ? ": " : "", errno ? strerror(errno) : "");
    stop_job();
}

void shuffle_ints(int *x, int n, uint64_t *state) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(splitmix64_next(state) % (uint64_t)(i + 1)), t = x[i];
        x[i] = x[j];
        x[j] = t;
    }
}

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) rank_error("out of memory allocating %zu bytes", n);
    return p;
}
void *xcalloc(size_t n, size_t sz) {
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) rank_error("out of memory allocating %zu x %zu bytes", n, sz);
    return p;
}
void *xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) rank_error("out of memory allocating %zu bytes", n);
    return p;
}
char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    return memcpy(xmalloc(n), s, n);
}

char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = xmalloc(cap);
    for (;;) {
        if (n + 1 >= cap) buf = xrealloc(buf, cap *= 2);
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        if (got == 0) break;
        n += got;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) { free(buf); return NULL; }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}
int dir_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}
char *path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = xmalloc(a + b + 2);
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}
int mkdir_parents(const char *path) {
    char *p = xstrdup(path);
    int rc = 0;
    for (char *s = p + 1; *s && rc == 0; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) rc = -1;
        *s = '/';
    }
    free(p);
    return rc;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(path);
}
int remove_tree(const char *path) { return nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) ? -1 : 0; }

void mkdir_p(const char *path) {
    if (mkdir_parents(path) != 0 || (mkdir(path, 0755) != 0 && errno != EEXIST))
        user_error("%s: cannot create directory: %s", path, strerror(errno));
}

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
double peak_rss_mib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024.0; /* ru_maxrss is KiB on Linux */
}

void peak_rss_reset(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");   /* "5": the peak RSS restarts from the current RSS */
    if (!f) return;
    fputs("5", f);
    fclose(f);
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        float f = ldexpf((float)man, -24); /* zero or subnormal */
        return sign ? -f : f;
    } else if (exp == 31) {
        u = sign | 0x7f800000 | (man << 13);
    } else {
        u = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

int write_file_atomic_with(const char *path, int (*fill)(FILE *f, void *ctx), void *ctx) {
    size_t n = strlen(path) + 32;
    char *tmp = xmalloc(n);
    snprintf(tmp, n, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        int err = errno;
        free(tmp);
        errno = err;
        return -1;
    }
    int err = 0;   /* the first failure's errno: the one that says why */
    errno = 0;
    if (fill(f, ctx) != 0) err = errno ? errno : EIO;
    if (fflush(f) != 0 && !err) err = errno;
    if (fsync(fileno(f)) != 0 && !err) err = errno;
    if (fclose(f) != 0 && !err) err = errno;
    if (!err && rename(tmp, path) != 0) err = errno;
    if (err) unlink(tmp);
    free(tmp);
    errno = err;
    return err ? -1 : 0;
}

typedef struct { const void *data; size_t len; } Bytes;
static int write_bytes(FILE *f, void *ctx) {
    const Bytes *b = ctx;
    return fwrite(b->data, 1, b->len, f) == b->len ? 0 : -1;
}
int write_file_atomic(const char *path, const void *data, size_t len) {
    Bytes b = {data, len};
    return write_file_atomic_with(path, write_bytes, &b);
}
