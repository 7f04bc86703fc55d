/* backend.cu — the CUDA backend's table (cuda_backend: kernels/kernels.h's entries filled with the
 * kernels of ops.cu, backward.cu and optim.cu) and its memory: device selection (open), cudaMalloc'd
 * buffers, host <-> device copies, the kernels' internal scratch. One stream per process (the
 * legacy default stream): every entry and copy is queued in call order, and to_host returns once
 * the data (and everything queued before it) is done.
 * Owns: the device choice, the scratch slots. */
#include "kernels/cuda/common.cuh"
#include <stdio.h>

static int device_id = -1;     /* chosen by open */

static const char *cuda_open(int local_rank) {
    static char why[256];
    if (device_id >= 0) return NULL;
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n == 0) {
        (void)cudaGetLastError();   /* clear it: a later launch check must not report it */
        snprintf(why, sizeof why, "no usable CUDA device (%s)",
                 err != cudaSuccess ? cudaGetErrorString(err) : "the driver reports none");
        return why;
    }
    int dev = (local_rank < 0 ? 0 : local_rank) % n, major = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    if (major < 8) {   /* the build holds sm_90 code and compute_80 PTX (Makefile NVFLAGS) */
        snprintf(why, sizeof why, "CUDA device %d has compute capability %d.x; this build needs 8.0 or newer", dev, major);
        return why;
    }
    device_id = dev;
    CUDA_CHECK(cudaSetDevice(device_id));
    CUDA_CHECK(cudaFree(0));        /* make the context now, not inside the first timed call */
    return NULL;
}

extern "C" void cuda_sync(void) { CUDA_CHECK(cudaDeviceSynchronize()); }

/* zeroed, as the contract says; 0 bytes still gives a distinct pointer */
static void *cuda_alloc(size_t bytes) {
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes ? bytes : 1);
    if (err != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        (void)cudaGetLastError();
        cudaMemGetInfo(&free_b, &total_b);
        backend_fatal("out of GPU memory: %zu bytes asked, %zu of %zu free (%s)", bytes, free_b, total_b,
                   cudaGetErrorString(err));
    }
    CUDA_CHECK(cudaMemset(p, 0, bytes ? bytes : 1));
    return p;
}
static void cuda_free_mem(void *p) {
    if (p) CUDA_CHECK(cudaFree(p));
}
static void cuda_zero(void *p, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemsetAsync(p, 0, bytes));
}
static void cuda_to_host(void *dst, const void *src, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}
static void cuda_to_device(void *dst, const void *src, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}
static void cuda_copy_bytes(void *dst, const void *src, size_t bytes) {   /* queued on the stream */
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0));
}

void *cuda_scratch(int slot, size_t bytes) {
    enum { SLOTS = 2 };   /* 0: attention_backward's row statistics, 1: rmsnorm_backward's row scales */
    static void *buf[SLOTS];
    static size_t cap[SLOTS];
    if (slot < 0 || slot >= SLOTS) backend_fatal("internal error: cuda_scratch slot %d", slot);
    if (bytes > cap[slot]) {
        cuda_free_mem(buf[slot]);   /* cudaFree waits for the work that may still read it */
        buf[slot] = cuda_alloc(bytes);
        cap[slot] = bytes;
    }
    return buf[slot];
}

extern "C" const Backend cuda_backend = {
    .name = "cuda",
    .parallel_calls = 0,
    .open = cuda_open,
    .matmul = cuda_matmul,
    .matmuls = cuda_matmuls,
    .rmsnorm = cuda_rmsnorm,
    .round_to = cuda_round_to,
    .pack = cuda_pack,
    .unpack = cuda_unpack,
    .rope_table = cuda_rope_table,
    .rope = cuda_rope,
    .kv_store = cuda_kv_store,
    .attention = cuda_attention,
    .kv_store_batch = cuda_kv_store_batch,
    .attention_batch = cuda_attention_batch,
    .swiglu = cuda_swiglu,
    .add_to = cuda_add_to,
    .scale = cuda_scale,
    .dropout = cuda_dropout,
    .copy = cuda_copy,
    .gather_rows = cuda_gather_rows,
    .embedding = cuda_embedding,
    .mask_cols = cuda_mask_cols,
    .argmax_rows = cuda_argmax_rows,
    .row_max = cuda_row_max,
    .row_sumexp = cuda_row_sumexp,
    .pick_logits = cuda_pick_logits,
    .log_add = cuda_log_add,
    .row_entropy_part = cuda_row_entropy_part,
    .sub_at = cuda_sub_at,
    .matmul_backward = cuda_matmul_backward,
    .rmsnorm_backward = cuda_rmsnorm_backward,
    .rope_backward = cuda_rope_backward,
    .attention_backward = cuda_attention_backward,
    .swiglu_backward = cuda_swiglu_backward,
    .embedding_backward = cuda_embedding_backward,
    .logprob_backward = cuda_logprob_backward,
    .adamw = cuda_adamw,
    .sum_squares = cuda_sum_squares,
    .alloc = cuda_alloc,
    .free = cuda_free_mem,
    .zero = cuda_zero,
    .to_host = cuda_to_host,
    .to_device = cuda_to_device,
    .copy_bytes = cuda_copy_bytes,
    .sync = cuda_sync,
    .owns = cuda_owns,
    .tree_sum = cuda_tree_sum,
    .link = &cuda_link,
};
