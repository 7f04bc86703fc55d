/* backend.c — the CPU backend: kernels/kernels.h's operation table filled with the cpu_ kernels
 * (ops.c forward, backward.c backward, optim.c the optimizer), and the seam's functions that pick a
 * backend (backend_default, backend_named), check a table's completeness (backend_check), stop on a
 * kernel's fatal error (backend_fatal) and set the CPU threads (backend_set_threads). Host memory is the
 * backend's memory, so the transfers are plain copies; buffers of 2 MiB and more (the weights, the
 * KV pool) are 2 MiB-aligned anonymous mappings with huge pages advised (THP in madvise mode): each
 * streams with 1/512 of the TLB misses, and is zero and not resident until written, so a large KV
 * pool costs memory only where it is used. Owns nothing else. */
#include "kernels/cpu/cpu.h"
#include <omp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static void host_copy(void *dst, const void *src, size_t bytes) {
    if (dst != src) memcpy(dst, src, bytes);
}
/* ---- the kernels' error exit (kernels.h): the runtime's, once it registers it ---------------------- */
static void (*fatal_hook)(const char *msg);
void backend_set_fatal(void (*fatal)(const char *msg)) { fatal_hook = fatal; }
void backend_fatal(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (fatal_hook) fatal_hook(msg);
    fprintf(stderr, "tandem: %s\n", msg);
    exit(1);
}

/* the mappings handed out, for free(); a handful live at once */
enum { HUGE_PAGE = 2 << 20 };
static struct Map { void *p; size_t n; } *maps;
static int n_maps, cap_maps;
static pthread_mutex_t maps_lock = PTHREAD_MUTEX_INITIALIZER;

static void *host_alloc(size_t bytes) {
    if (bytes < HUGE_PAGE) {
        void *p = calloc(bytes ? bytes : 1, 1);
        if (!p) backend_fatal("out of memory allocating %zu bytes", bytes);
        return p;
    }
    size_t n = (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    char *raw = mmap(NULL, n + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) backend_fatal("out of memory allocating %zu bytes", bytes);
    char *p = raw + (HUGE_PAGE - (uintptr_t)raw % HUGE_PAGE) % HUGE_PAGE;   /* trim to a 2 MiB boundary */
    if (p > raw) munmap(raw, p - raw);
    munmap(p + n, raw + HUGE_PAGE - p);
    madvise(p, n, MADV_HUGEPAGE);   /* advice only: ignored where THP is off */
    pthread_mutex_lock(&maps_lock);
    if (n_maps == cap_maps) {
        cap_maps = cap_maps ? 2 * cap_maps : 16;
        maps = realloc(maps, sizeof(*maps) * cap_maps);
        if (!maps) backend_fatal("out of memory");
    }
    maps[n_maps++] = (struct Map){p, n};
    pthread_mutex_unlock(&maps_lock);
    return p;
}
static void host_free(void *p) {
    pthread_mutex_lock(&maps_lock);
    for (int i = 0; i < n_maps; i++)
        if (maps[i].p == p) {
            munmap(p, maps[i].n);
            maps[i] = maps[--n_maps];
            pthread_mutex_unlock(&maps_lock);
            return;
        }
    pthread_mutex_unlock(&maps_lock);
    free(p);
}
static void host_zero(void *p, size_t bytes) { memset(p, 0, bytes); }

static void host_sync(void) {}
static void host_tree_sum(float *v, int P, size_t n) { tree_sum(v, P, n); }
static const char *host_open(int local_rank) {
    (void)local_rank;
    return NULL;
}

const Backend cpu_backend = {
    .name = "cpu",
    .parallel_calls = 1,
    .open = host_open,
    .matmul = cpu_matmul,
    .matmuls = cpu_matmuls,
    .rmsnorm = cpu_rmsnorm,
    .round_to = cpu_round_to,
    .pack = cpu_pack,
    .unpack = cpu_unpack,
    .rope_table = cpu_rope_table,
    .rope = cpu_rope,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .kv_store_batch = cpu_kv_store_batch,
    .attention_batch = cpu_attention_batch,
    .swiglu = cpu_swiglu,
    .add_to = cpu_add_to,
    .scale = cpu_scale,
    .dropout = cpu_dropout,
    .copy = cpu_copy,
    .gather_rows = cpu_gather_rows,
    .embedding = cpu_embedding,
    .mask_cols = cpu_mask_cols,
    .argmax_rows = cpu_argmax_rows,
    .row_max = cpu_row_max,
    .row_sumexp = cpu_row_sumexp,
    .pick_logits = cpu_pick_logits,
    .log_add = cpu_log_add,
    .row_entropy_part = cpu_row_entropy_part,
    .sub_at = cpu_sub_at,
    .matmul_backward = cpu_matmul_backward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .rope_backward = cpu_rope_backward,
    .attention_backward = cpu_attention_backward,
    .swiglu_backward = cpu_swiglu_backward,
    .embedding_backward = cpu_embedding_backward,
    .logprob_backward = cpu_logprob_backward,
    .adamw = cpu_adamw,
    .sum_squares = cpu_sum_squares,
    .alloc = host_alloc,
    .free = host_free,
    .zero = host_zero,
    .to_host = host_copy,
    .to_device = host_copy,
    .copy_bytes = host_copy,
    .sync = host_sync,
    .tree_sum = host_tree_sum,   /* owns NULL: host memory goes to MPI as it is */
};

const Backend *backend_default(void) { return &cpu_backend; }
int backend_scratch_rows(const Backend *be) { return be->parallel_calls ? omp_get_max_threads() : 1; }
/* kernels/cuda/backend.cu defines it when the build has CUDA; weak: NULL otherwise */
extern const Backend cuda_backend __attribute__((weak));
const Backend *backend_named(const char *name) {
    const Backend *be = !strcmp(name, "cpu")           ? &cpu_backend
                        : !strcmp(name, "cpu-guarded") ? &cpu_guarded_backend   /* a testing aid (guarded.c) */
                        : !strcmp(name, "cuda")        ? (&cuda_backend ? &cuda_backend : NULL)
                                                       : NULL;
    const char *why = be ? backend_check(be) : NULL;
    if (why) backend_fatal("%s", why);
    return be;
}

/* ---- the contract's completeness: every entry of Backend, by offset -------------------------------
 * owns and link may be NULL (host memory; no link of its own). The _Static_assert below counts the
 * list against the struct, so an entry added to kernels.h without its line here does not compile. */
#define ENTRY(e) {#e, offsetof(Backend, e), 0}
#define MAY_BE_NULL(e) {#e, offsetof(Backend, e), 1}
static const struct { const char *name; size_t off; int may_be_null; } entries[] = {
    ENTRY(open), ENTRY(matmul), ENTRY(matmuls), ENTRY(rmsnorm), ENTRY(round_to), ENTRY(pack), ENTRY(unpack),
    ENTRY(rope_table), ENTRY(rope), ENTRY(kv_store), ENTRY(attention), ENTRY(kv_store_batch), ENTRY(attention_batch),
    ENTRY(swiglu), ENTRY(add_to), ENTRY(scale), ENTRY(dropout), ENTRY(copy), ENTRY(gather_rows), ENTRY(embedding),
    ENTRY(mask_cols), ENTRY(argmax_rows), ENTRY(row_max), ENTRY(row_sumexp), ENTRY(pick_logits), ENTRY(log_add),
    ENTRY(row_entropy_part), ENTRY(sub_at), ENTRY(matmul_backward), ENTRY(rmsnorm_backward), ENTRY(rope_backward),
    ENTRY(attention_backward), ENTRY(swiglu_backward), ENTRY(embedding_backward), ENTRY(logprob_backward),
    ENTRY(adamw), ENTRY(sum_squares), ENTRY(alloc), ENTRY(free), ENTRY(zero), ENTRY(to_host), ENTRY(to_device),
    ENTRY(copy_bytes), ENTRY(sync), MAY_BE_NULL(owns), ENTRY(tree_sum), MAY_BE_NULL(link),
};
/* name and parallel_calls, then one pointer per entry */
_Static_assert(offsetof(Backend, open) + sizeof entries / sizeof entries[0] * sizeof(void *) == sizeof(Backend),
               "kernels/cpu/backend.c: the entries list misses a Backend entry");

const char *backend_check(const Backend *be) {
    static char why[160];
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
        void *p;   /* a function pointer or link: the same size as void * on every platform built for */
        memcpy(&p, (const char *)be + entries[i].off, sizeof p);
        if (!p && !entries[i].may_be_null) {
            snprintf(why, sizeof why, "internal error: backend %s: entry %s is NULL in its table", be->name ? be->name : "?",
                     entries[i].name);
            return why;
        }
    }
    return NULL;
}
int backend_set_threads(int n) { return cpu_set_threads(n); }
void backend_set_bf16_dot(int native) { cpu_set_bf16_dot(native); }
