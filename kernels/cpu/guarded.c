/* guarded.c — the cpu-guarded backend (`--device cpu-guarded`): the CPU kernels behind "device"
 * memory that the host cannot touch. A TESTING AID, not a way to run models: it makes the Backend
 * contract (kernels/kernels.h: every pointer an entry takes is the backend's memory, and host code
 * reads and writes that memory only through to_host / to_device) checkable without a GPU, so code
 * that would fail on the CUDA backend fails here, in CI, on any machine.
 *   - alloc returns its own anonymous mapping (zero), kept PROT_NONE except while an entry or a
 *     transfer handed a pointer into it runs, with a PROT_NONE page after it: a host read or write
 *     of backend memory, or a kernel running past the end of a buffer, is a segfault (one line
 *     from the SIGSEGV handler when the address is in an allocation).
 *   - every entry first checks that each pointer argument (the int arrays too, MatmulOut's out / w /
 *     bias, KVLayout.table, the scratch) lies in a live allocation with the bytes its contract reads
 *     or writes there (an (N, n_out) out: N * n_out floats; paged caches and block tables: their
 *     first bytes); a host pointer (or a freed one, or a buffer too small) is one line "internal
 *     error: ... ENTRY: argument ARG ... is not the backend's memory ...", then abort. The oracle
 *     harness (tests/cuda/cuda_vs_cpu.c --self) counts these instead (cpu_guarded_count_faults) and
 *     reads the count and the live allocations at the end (cpu_guarded_stats).
 *   - then it opens the allocations its arguments lie in, runs the cpu_ kernel, and closes them
 *     again: the arithmetic is the CPU backend's, so results are `--device cpu`'s bit for bit.
 * Entries that run on several threads at once (the forward's attention, one call per sequence)
 * share allocations: each counts the calls inside it and is closed when the last one leaves.
 * Slow (mprotect per allocation per call): for tests on small models.
 * Owns: cpu_guarded_backend, its allocations and the checks (the only guard: the harness uses it). */
#include "kernels/cpu/cpu.h"
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct {
    char *p;
    size_t n;       /* mapped bytes (whole pages); a closed guard page follows */
    size_t bytes;   /* the bytes alloc was asked for: what an entry may read or write */
    int users;      /* entries running with it open */
} Region;
static Region *regions;
static int n_regions, cap_regions;
static long n_allocs, n_faults;
static int counting;   /* cpu_guarded_count_faults: a misuse is counted, not an abort */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* one pointer argument of an entry, by name, with the bytes the entry reads or writes from it;
 * opt: may be NULL */
typedef struct {
    const char *name;
    const void *p;
    size_t bytes;
    int opt;
} Arg;

/* the region whose allocation holds [p, p + bytes), or -1; the lock is held */
static int find(const void *p, size_t bytes) {
    const char *c = p;
    for (int i = 0; i < n_regions; i++)
        if (c >= regions[i].p && c <= regions[i].p + regions[i].bytes &&
            bytes <= (size_t)(regions[i].p + regions[i].bytes - c))
            return i;
    return -1;
}
/* the region whose mapping p points into (or just past), or -1; the lock is held */
static int find_mapped(const void *p) {
    const char *c = p;
    for (int i = 0; i < n_regions; i++)
        if (c >= regions[i].p && c <= regions[i].p + regions[i].n) return i;
    return -1;
}

/* One line on stderr, then abort; counting: the line, and the run goes on. The lock is held. */
static void misuse(const char *entry, const Arg *a) {
    int r = a->p && a->bytes ? find_mapped(a->p) : -1;
    if (r >= 0)
        fprintf(stderr, "tandem: internal error: --device cpu-guarded: %s: argument %s (%p) is not the backend's "
                "memory for the %zu bytes the entry reads or writes there (its allocation ends %zu bytes after it)\n",
                entry, a->name, a->p, a->bytes, (size_t)(regions[r].p + regions[r].bytes - (const char *)a->p));
    else
        fprintf(stderr, "tandem: internal error: --device cpu-guarded: %s: argument %s (%p) is not the backend's "
                "memory (a host pointer, or freed)\n", entry, a->name, a->p);
    if (!counting) abort();
    n_faults++;
}

void cpu_guarded_count_faults(int on) { counting = on; }
GuardedStats cpu_guarded_stats(void) {
    pthread_mutex_lock(&lock);
    GuardedStats s = {n_allocs, n_regions, n_faults};
    pthread_mutex_unlock(&lock);
    return s;
}

static void open_region(Region *r) {
    if (r->users++ == 0 && mprotect(r->p, r->n, PROT_READ | PROT_WRITE)) abort();
}
static void close_region(Region *r) {
    if (--r->users == 0 && mprotect(r->p, r->n, PROT_NONE)) abort();
}

/* Checks every argument and opens the regions they lie in (counting: a misused one that lies in a
 * region still opens it, so the kernel runs as the unguarded one would). */
static void enter(const char *entry, const Arg *a, int n) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n; i++) {
        if (!a[i].p && a[i].opt) continue;
        if ((a[i].p ? find(a[i].p, a[i].bytes) : -1) < 0) misuse(entry, &a[i]);
        int r = a[i].p ? find_mapped(a[i].p) : -1;
        if (r >= 0) open_region(&regions[r]);
    }
    pthread_mutex_unlock(&lock);
}
static void leave(const Arg *a, int n) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n; i++) {
        int r = a[i].p ? find_mapped(a[i].p) : -1;
        if (r >= 0) close_region(&regions[r]);
    }
    pthread_mutex_unlock(&lock);
}

#define P(x, bytes) {#x, (const void *)(x), (bytes), 0}
#define OPT(x, bytes) {#x, (const void *)(x), (bytes), 1}
/* checks and opens the ARGS, runs CALL, closes them */
#define GUARDED(entry, call, ...)                          \
    do {                                                   \
        const Arg a_[] = {__VA_ARGS__};                    \
        int n_ = (int)(sizeof(a_) / sizeof(a_[0]));        \
        enter(entry, a_, n_);                              \
        call;                                              \
        leave(a_, n_);                                     \
    } while (0)

/* The bytes an entry reads or writes from an argument (its contract, kernels/cpu/cpu.h): an (a, b)
 * fp32 array, n ints, an (a, b) weight of dtype wt; paged caches and block tables: their first
 * bytes. Scratch: a row per thread the kernel's parallel region runs on (one inside a region of the
 * caller's, where each thread hands its own row). */
static size_t nf(size_t a, size_t b) { return a * b * sizeof(float); }
static size_t ni(size_t n) { return n * sizeof(int); }
static size_t nw(DType wt, size_t a, size_t b) { return dtype_size(wt) * a * b; }
static size_t scratch_rows(void) { return omp_in_parallel() ? 1 : (size_t)omp_get_max_threads(); }

/* ---- memory -------------------------------------------------------------------------------- */

static size_t page_bytes;
static void on_segv(int sig, siginfo_t *si, void *ctx) {
    (void)sig; (void)ctx;
    static const char msg[] = "tandem: internal error: --device cpu-guarded: the host touched the backend's memory "
                              "(a read or write not through to_host / to_device, or past a buffer's end)\n";
    const char *c = si->si_addr;
    for (int i = 0; i < n_regions; i++)   /* no lock: the process is going down */
        if (c >= regions[i].p && c < regions[i].p + regions[i].n + page_bytes) {
            ssize_t w = write(2, msg, sizeof msg - 1);
            (void)w;
            break;
        }
    /* SA_RESETHAND: returning re-runs the access under the default action */
}

static const char *guarded_open(int local_rank) {
    (void)local_rank;
    page_bytes = (size_t)sysconf(_SC_PAGESIZE);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
    sigaction(SIGSEGV, &sa, NULL);
    return NULL;
}

static void *guarded_alloc(size_t bytes) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE), n = (bytes + page - 1) / page * page;
    if (!n) n = page;
    char *p = mmap(NULL, n + page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) backend_fatal("out of memory allocating %zu bytes", bytes);
    pthread_mutex_lock(&lock);
    if (n_regions == cap_regions) {
        cap_regions = cap_regions ? 2 * cap_regions : 16;
        regions = realloc(regions, sizeof(Region) * cap_regions);
        if (!regions) abort();
    }
    regions[n_regions++] = (Region){p, n, bytes, 0};
    n_allocs++;
    pthread_mutex_unlock(&lock);
    return p;
}

static void guarded_free(void *p) {
    if (!p) return;
    pthread_mutex_lock(&lock);
    int r = find_mapped(p);
    if (r < 0 || regions[r].p != p || regions[r].users) {
        misuse("free", &(Arg)P(p, 0));
    } else {
        munmap(p, regions[r].n + (size_t)sysconf(_SC_PAGESIZE));
        regions[r] = regions[--n_regions];
    }
    pthread_mutex_unlock(&lock);
}

static void guarded_zero(void *p, size_t bytes) { GUARDED("zero", memset(p, 0, bytes), P(p, bytes)); }
static void guarded_sync(void) {}   /* the kernels ran when called */
/* runtime/comm.c stages these regions through host memory, as it does CUDA's without a link */
static int guarded_owns(const void *p) {
    pthread_mutex_lock(&lock);
    int r = find_mapped(p);
    pthread_mutex_unlock(&lock);
    return r >= 0;
}
static void g_tree_sum(float *v, int planes, size_t n) {
    GUARDED("tree_sum", tree_sum(v, planes, n), P(v, nf((size_t)planes, n)));
}
static void guarded_to_host(void *dst, const void *src, size_t bytes) {
    GUARDED("to_host", memcpy(dst, src, bytes), P(src, bytes));
}
static void guarded_copy_bytes(void *dst, const void *src, size_t bytes) {
    GUARDED("copy_bytes", memcpy(dst, src, bytes), P(dst, bytes), P(src, bytes));
}
static void guarded_to_device(void *dst, const void *src, size_t bytes) {
    GUARDED("to_device", memcpy(dst, src, bytes), P(dst, bytes));
}

/* ---- the entries: cpu_ kernels, checked ------------------------------------------------------ */

static void g_matmul(float *out, const float *x, const void *w, const void *bias, DType wt, int N, int n_in, int n_out,
                     int leaves) {
    GUARDED("matmul", cpu_matmul(out, x, w, bias, wt, N, n_in, n_out, leaves), P(out, nf(N, n_out)), P(x, nf(N, n_in)),
            P(w, nw(wt, n_out, n_in)), OPT(bias, nw(wt, n_out, 1)));
}
static void g_matmuls(const float *x, int N, int n_in, const MatmulOut *outs, int n, DType wt) {
    enum { MAX = 8 };
    Arg a[1 + 3 * MAX] = {P(x, nf(N, n_in))};
    if (n > MAX) abort();
    for (int i = 0; i < n; i++) {
        a[1 + 3 * i] = (Arg){"outs[i].out", outs[i].out, nf(N, outs[i].n_out), 0};
        a[2 + 3 * i] = (Arg){"outs[i].w", outs[i].w, nw(wt, outs[i].n_out, n_in), 0};
        a[3 + 3 * i] = (Arg){"outs[i].bias", outs[i].bias, nw(wt, outs[i].n_out, 1), 1};
    }
    enter("matmuls", a, 1 + 3 * n);
    cpu_matmuls(x, N, n_in, outs, n, wt);
    leave(a, 1 + 3 * n);
}
static void g_rmsnorm(float *out, const float *x, const void *w, DType wt, int N, int D, float eps) {
    GUARDED("rmsnorm", cpu_rmsnorm(out, x, w, wt, N, D, eps), P(out, nf(N, D)), P(x, nf(N, D)), P(w, nw(wt, D, 1)));
}
static void g_round_to(float *x, size_t n, DType t) { GUARDED("round_to", cpu_round_to(x, n, t), P(x, nf(n, 1))); }
static void g_pack(void *dst, DType t, const float *src, size_t n) {
    GUARDED("pack", cpu_pack(dst, t, src, n), P(dst, nw(t, n, 1)), P(src, nf(n, 1)));
}
static void g_unpack(float *dst, const void *src, DType t, size_t n) {
    GUARDED("unpack", cpu_unpack(dst, src, t, n), P(dst, nf(n, 1)), P(src, nw(t, n, 1)));
}
static void g_rope_table(float *cs, const int *pos, const float *inv_freq, int N, int Dh) {
    GUARDED("rope_table", cpu_rope_table(cs, pos, inv_freq, N, Dh), P(cs, nf(N, Dh)), P(pos, ni(N)),
            P(inv_freq, nf(Dh / 2, 1)));
}
static void g_rope(float *x, const float *cs, int N, int n_heads, int Dh) {
    GUARDED("rope", cpu_rope(x, cs, N, n_heads, Dh), P(x, nf(N, (size_t)n_heads * Dh)), P(cs, nf(N, Dh)));
}
static void g_kv_store(float *kc, float *vc, const float *k, const float *v, const KVLayout *kv, const int *pos, int T,
                       int Hkv, int Dh) {
    GUARDED("kv_store", cpu_kv_store(kc, vc, k, v, kv, pos, T, Hkv, Dh), P(kc, 4), P(vc, 4), P(k, nf(T, Hkv * Dh)),
            P(v, nf(T, Hkv * Dh)), OPT(kv->table, ni(1)), P(pos, ni(T)));
}
/* the keys of positions [0, n) in k or v: a paged cache's first bytes, else up to the last head's row */
static size_t kv_bytes(const KVLayout *kv, int n, int Hkv, int Dh) {
    return kv->table || n < 1 ? 4 : nf((size_t)(n - 1) * kv->row + (size_t)(Hkv - 1) * kv->head + Dh, 1);
}
static void g_attention(float *out, const float *q, const float *k, const float *v, const KVLayout *kv, int Tq,
                        int q_pos0, int H, int Hkv, int Dh, int window, float *scratch) {
    int n = q_pos0 + Tq;
    GUARDED("attention", cpu_attention(out, q, k, v, kv, Tq, q_pos0, H, Hkv, Dh, window, scratch),
            P(out, nf(Tq, H * Dh)), P(q, nf(Tq, H * Dh)), P(k, kv_bytes(kv, n, Hkv, Dh)), P(v, kv_bytes(kv, n, Hkv, Dh)),
            OPT(kv->table, ni(n > 0 ? (n - 1) / kv->block + 1 : 0)), P(scratch, nf(scratch_rows() * H, n)));
}
static void g_kv_store_batch(void *kc, void *vc, const float *k, const float *v, const PagedBatch *pb, int Hkv,
                             int Dh) {
    GUARDED("kv_store_batch", cpu_kv_store_batch(kc, vc, k, v, pb, Hkv, Dh), P(kc, 4), P(vc, 4),
            P(k, nf(pb->N, Hkv * Dh)), P(v, nf(pb->N, Hkv * Dh)), P(pb->tables, ni(1)), P(pb->seq, ni(pb->N)),
            P(pb->pos, ni(pb->N)));
}
static void g_attention_batch(float *out, const float *q, const void *kc, const void *vc, const PagedBatch *pb, int H,
                              int Hkv, int Dh, int window, float *scratch, size_t scratch_stride) {
    GUARDED("attention_batch", cpu_attention_batch(out, q, kc, vc, pb, H, Hkv, Dh, window, scratch, scratch_stride),
            P(out, nf(pb->N, H * Dh)), P(q, nf(pb->N, H * Dh)), P(kc, 4), P(vc, 4), P(pb->tables, ni(1)),
            P(pb->seq, ni(pb->N)), P(pb->pos, ni(pb->N)), P(scratch, nf(scratch_rows(), scratch_stride)));
}
static void g_swiglu(float *out, const float *gate, const float *up, size_t n) {
    GUARDED("swiglu", cpu_swiglu(out, gate, up, n), P(out, nf(n, 1)), P(gate, nf(n, 1)), P(up, nf(n, 1)));
}
static void g_scale(float *x, float s, size_t n) { GUARDED("scale", cpu_scale(x, s, n), P(x, nf(n, 1))); }
static void g_dropout(float *out, const float *x, int N, int cols, int col0, int cols_global, float p, uint64_t key) {
    GUARDED("dropout", cpu_dropout(out, x, N, cols, col0, cols_global, p, key), P(out, nf(N, cols)), P(x, nf(N, cols)));
}
static void g_add_to(float *out, const float *a, const float *b, size_t n) {
    GUARDED("add_to", cpu_add_to(out, a, b, n), P(out, nf(n, 1)), P(a, nf(n, 1)), P(b, nf(n, 1)));
}
static void g_copy(float *dst, const float *src, size_t n) {
    GUARDED("copy", cpu_copy(dst, src, n), P(dst, nf(n, 1)), P(src, nf(n, 1)));
}
static void g_gather_rows(float *out, const float *x, const int *rows, int R, int D) {
    GUARDED("gather_rows", cpu_gather_rows(out, x, rows, R, D), P(out, nf(R, D)), P(x, nf(1, D)), P(rows, ni(R)));
}
static void g_embedding(float *out, const void *table, DType wt, const int *ids, int N, int D, int v0, int V_local) {
    GUARDED("embedding", cpu_embedding(out, table, wt, ids, N, D, v0, V_local), P(out, nf(N, D)),
            P(table, nw(wt, V_local, D)), P(ids, ni(N)));
}
static void g_mask_cols(float *x, int N, int V, int from) {
    GUARDED("mask_cols", cpu_mask_cols(x, N, V, from), P(x, nf(N, V)));
}
static void g_argmax_rows(int *ids, float *vals, const float *x, int N, int V, int v0) {
    GUARDED("argmax_rows", cpu_argmax_rows(ids, vals, x, N, V, v0), P(ids, ni(N)), P(vals, nf(N, 1)), P(x, nf(N, V)));
}
static void g_row_max(float *mx, const float *x, int N, int V, float T) {
    GUARDED("row_max", cpu_row_max(mx, x, N, V, T), P(mx, nf(N, 1)), P(x, nf(N, V)));
}
static void g_row_sumexp(float *sum, const float *x, const float *mx, int N, int V, float T, int leaves) {
    GUARDED("row_sumexp", cpu_row_sumexp(sum, x, mx, N, V, T, leaves), P(sum, nf(N, 1)), P(x, nf(N, V)),
            P(mx, nf(N, 1)));
}
static void g_pick_logits(float *z, const float *x, const int *targets, int N, int V, int v0, float T) {
    GUARDED("pick_logits", cpu_pick_logits(z, x, targets, N, V, v0, T), P(z, nf(N, 1)), P(x, nf(N, V)),
            P(targets, ni(N)));
}
static void g_log_add(float *lse, const float *sum, int N) {
    GUARDED("log_add", cpu_log_add(lse, sum, N), P(lse, nf(N, 1)), P(sum, nf(N, 1)));
}
static void g_row_entropy_part(float *s, const float *x, const float *lse, int N, int V, float T, int leaves) {
    GUARDED("row_entropy_part", cpu_row_entropy_part(s, x, lse, N, V, T, leaves), P(s, nf(N, 1)), P(x, nf(N, V)),
            P(lse, nf(N, 1)));
}
static void g_sub_at(float *out, const float *a, const float *b, const int *idx, int n) {
    GUARDED("sub_at", cpu_sub_at(out, a, b, idx, n), P(out, nf(n, 1)), P(a, nf(n, 1)), P(b, idx ? 4 : nf(n, 1)),
            OPT(idx, ni(n)));
}
static void g_matmul_backward(float *dx, float *dw, float *db, const float *dout, const float *x, const void *w,
                              DType wt, int N, int n_in, int n_out) {
    GUARDED("matmul_backward", cpu_matmul_backward(dx, dw, db, dout, x, w, wt, N, n_in, n_out), OPT(dx, nf(N, n_in)),
            OPT(dw, nf(n_out, n_in)), OPT(db, nf(n_out, 1)), P(dout, nf(N, n_out)), P(x, nf(N, n_in)),
            P(w, nw(wt, n_out, n_in)));
}
static void g_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const void *w, DType wt, int N,
                               int D, float eps) {
    GUARDED("rmsnorm_backward", cpu_rmsnorm_backward(dx, dw, dout, x, w, wt, N, D, eps), P(dx, nf(N, D)),
            OPT(dw, nf(D, 1)), P(dout, nf(N, D)), P(x, nf(N, D)), P(w, nw(wt, D, 1)));
}
static void g_rope_backward(float *dx, const float *cs, int N, int n_heads, int Dh) {
    GUARDED("rope_backward", cpu_rope_backward(dx, cs, N, n_heads, Dh), P(dx, nf(N, (size_t)n_heads * Dh)),
            P(cs, nf(N, Dh)));
}
static void g_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                                 const float *v, int T, int H, int Hkv, int Dh, int window, float *scratch) {
    GUARDED("attention_backward", cpu_attention_backward(dq, dk, dv, dout, q, k, v, T, H, Hkv, Dh, window, scratch),
            P(dq, nf(T, H * Dh)), P(dk, nf(T, Hkv * Dh)), P(dv, nf(T, Hkv * Dh)), P(dout, nf(T, H * Dh)),
            P(q, nf(T, H * Dh)), P(k, nf(T, Hkv * Dh)), P(v, nf(T, Hkv * Dh)), P(scratch, nf(scratch_rows() * 2, T)));
}
static void g_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n) {
    GUARDED("swiglu_backward", cpu_swiglu_backward(dgate, dup, dout, gate, up, n), P(dgate, nf(n, 1)), P(dup, nf(n, 1)),
            P(dout, nf(n, 1)), P(gate, nf(n, 1)), P(up, nf(n, 1)));
}
static void g_embedding_backward(float *dtable, const float *dout, const int *ids, int N, int D, int v0, int V_local) {
    GUARDED("embedding_backward", cpu_embedding_backward(dtable, dout, ids, N, D, v0, V_local),
            P(dtable, nf(V_local, D)), P(dout, nf(N, D)), P(ids, ni(N)));
}
static void g_logprob_backward(float *dlogits, const float *logits, const float *lse, const int *targets,
                               const float *dlogprob, const float *H, const float *dH, int N, int V_local, int v0,
                               float T) {
    GUARDED("logprob_backward",
            cpu_logprob_backward(dlogits, logits, lse, targets, dlogprob, H, dH, N, V_local, v0, T),
            P(dlogits, nf(N, V_local)), P(logits, nf(N, V_local)), P(lse, nf(N, 1)), P(targets, ni(N)),
            P(dlogprob, nf(N, 1)), OPT(H, nf(N, 1)), OPT(dH, nf(N, 1)));
}
static void g_adamw(float *p, const float *g, float *m, float *v, size_t n, float grad_scale, double lr, double beta1,
                    double beta2, double eps, double weight_decay, int t) {
    GUARDED("adamw", cpu_adamw(p, g, m, v, n, grad_scale, lr, beta1, beta2, eps, weight_decay, t), P(p, nf(n, 1)),
            P(g, nf(n, 1)), P(m, nf(n, 1)), P(v, nf(n, 1)));
}
static void g_sum_squares(double *out, const float *x, size_t n, double *partials) {
    GUARDED("sum_squares", cpu_sum_squares(out, x, n, partials), P(out, sizeof(double)), P(x, nf(n, 1)),
            P(partials, (n + CPU_NORM_CHUNK - 1) / CPU_NORM_CHUNK * sizeof(double)));
}

const Backend cpu_guarded_backend = {
    .name = "cpu-guarded",
    .parallel_calls = 1,
    .open = guarded_open,
    .matmul = g_matmul,
    .matmuls = g_matmuls,
    .rmsnorm = g_rmsnorm,
    .round_to = g_round_to,
    .pack = g_pack,
    .unpack = g_unpack,
    .rope_table = g_rope_table,
    .rope = g_rope,
    .kv_store = g_kv_store,
    .attention = g_attention,
    .kv_store_batch = g_kv_store_batch,
    .attention_batch = g_attention_batch,
    .swiglu = g_swiglu,
    .add_to = g_add_to,
    .scale = g_scale,
    .dropout = g_dropout,
    .copy = g_copy,
    .gather_rows = g_gather_rows,
    .embedding = g_embedding,
    .mask_cols = g_mask_cols,
    .argmax_rows = g_argmax_rows,
    .row_max = g_row_max,
    .row_sumexp = g_row_sumexp,
    .pick_logits = g_pick_logits,
    .log_add = g_log_add,
    .row_entropy_part = g_row_entropy_part,
    .sub_at = g_sub_at,
    .matmul_backward = g_matmul_backward,
    .rmsnorm_backward = g_rmsnorm_backward,
    .rope_backward = g_rope_backward,
    .attention_backward = g_attention_backward,
    .swiglu_backward = g_swiglu_backward,
    .embedding_backward = g_embedding_backward,
    .logprob_backward = g_logprob_backward,
    .adamw = g_adamw,
    .sum_squares = g_sum_squares,
    .alloc = guarded_alloc,
    .free = guarded_free,
    .zero = guarded_zero,
    .to_host = guarded_to_host,
    .to_device = guarded_to_device,
    .copy_bytes = guarded_copy_bytes,
    .sync = guarded_sync,
    .owns = guarded_owns,
    .tree_sum = g_tree_sum,
};
