/* backend.c — the CPU backend: kernels/kernels.h's operation table filled with the cpu_ kernels
 * (ops.c forward, backward.c backward), and the seam's two functions that pick it (backend_default)
 * and set its threads (backend_set_threads). Host memory is the backend's memory, so the transfers
 * are plain copies. Owns nothing else. */
#include "kernels/cpu/cpu.h"
#include <stdlib.h>
#include <string.h>

static void host_copy(void *dst, const void *src, size_t bytes) {
    if (dst != src) memcpy(dst, src, bytes);
}
/* runtime/util.c's: prints "tandem: [rank r] ..." and stops the job (kernels do not include runtime/) */
_Noreturn void rank_error(const char *fmt, ...);
static void *host_alloc(size_t bytes) {
    void *p = calloc(bytes ? bytes : 1, 1);
    if (!p) rank_error("out of memory allocating %zu bytes", bytes);
    return p;
}
static void host_zero(void *p, size_t bytes) { memset(p, 0, bytes); }

static const char *host_open(int local_rank) {
    (void)local_rank;
    return NULL;
}

const Backend cpu_backend = {
    .name = "cpu",
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
    .swiglu = cpu_swiglu,
    .add_to = cpu_add_to,
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
    .alloc = host_alloc,
    .free = free,
    .zero = host_zero,
    .to_host = host_copy,
    .to_device = host_copy,
};

const Backend *backend_default(void) { return &cpu_backend; }
/* kernels/cuda/backend.cu defines it when the build has CUDA; weak: NULL otherwise */
extern const Backend cuda_backend __attribute__((weak));
const Backend *backend_named(const char *name) {
    if (!strcmp(name, "cpu")) return &cpu_backend;
    if (!strcmp(name, "cuda")) return &cuda_backend ? &cuda_backend : NULL;
    return NULL;
}
int backend_set_threads(int n) { return cpu_set_threads(n); }
