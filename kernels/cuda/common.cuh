/* common.cuh — what the CUDA kernel files share (private to kernels/cuda): the error checks, the
 * bf16 helpers (the device twins of kernels.h's), warp reductions, the launch size helper, the
 * internal scratch, and the cuda_* prototypes that backend.cu puts in the table. Every cuda_ kernel
 * launcher has its cpu_ twin's contract (kernels/cpu/cpu.h, backward.h) on device pointers and
 * queues its work on the legacy default stream (one stream per process: calls run in order). */
#ifndef TANDEM_CUDA_COMMON_CUH
#define TANDEM_CUDA_COMMON_CUH
#include "kernels/cuda/cuda.h"
#include <cuda_runtime.h>
#include <stdint.h>

/* Every fallible CUDA call goes through this (STYLE.md 3): the message names the statement, file
 * and line; backend_fatal (kernels.h: the runtime's rank_error) adds the rank and stops the job. */
#define CUDA_CHECK(call)                                                                                  \
    do {                                                                                                  \
        cudaError_t err_ = (call);                                                                        \
        if (err_ != cudaSuccess)                                                                          \
            backend_fatal("internal error %s:%d: %s failed: %s", __FILE__, __LINE__, #call,                  \
                       cudaGetErrorString(err_));                                                         \
    } while (0)
/* After every <<<...>>>: a bad launch configuration is reported at once, not at the next sync. */
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

constexpr int WARP = 32, THREADS = 256;

/* Blocks for n elements at THREADS per block, grid-stride loops covering the rest */
static inline unsigned blocks_for(size_t n) {
    size_t b = (n + THREADS - 1) / THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65535 * 8 ? 65535 * 8 : b);
}
#define GRID_STRIDE(i, n) \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

/* bf16 <-> fp32, bit for bit kernels.h's bf16_to_f32 / f32_to_bf16 (round to nearest even; a NaN
 * stays a NaN with its quiet bit set) */
__device__ __forceinline__ float bf16_up(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
__device__ __forceinline__ uint16_t bf16_round(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
/* element i of a weight of dtype wt, as fp32 (exact) */
__device__ __forceinline__ float weight_at_dev(const void *w, DType wt, size_t i) {
    return wt == DTYPE_BF16 ? bf16_up(((const uint16_t *)w)[i]) : ((const float *)w)[i];
}

/* Warp-wide sum / max by a fixed xor tree: every lane ends with the same bits, and the bits depend
 * only on the 32 inputs by lane, never on timing. */
__device__ __forceinline__ float warp_sum(float v) {
    for (int off = WARP / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int off = WARP / 2; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}
/* Block-wide sum of THREADS threads' values (fixed tree: warps, then the warps' sums); every thread
 * gets the result. sh: THREADS / WARP slots of shared memory. */
template <typename T>
__device__ __forceinline__ T block_sum(T v, T *sh) {
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    for (int off = WARP / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    __syncthreads();   /* sh may still be read by a previous call */
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = 0;
    for (int w = 0; w < THREADS / WARP; w++) v += sh[w];
    return v;
}

/* Device scratch this backend keeps for itself (the CPU kernels' scratch arguments are host-sized
 * and ignored here): grows, never shrinks; stream order makes reuse safe. Slot s is independent. */
void *cuda_scratch(int slot, size_t bytes);

/* ---- the table's entries (forward: ops.cu, backward: backward.cu, the optimizer: optim.cu, communication: link.cu) ---- */
extern "C" {
void cuda_matmul(float *out, const float *x, const void *w, const void *bias, DType wt, int N, int n_in, int n_out,
                 int leaves);
void cuda_matmuls(const float *x, int N, int n_in, const MatmulOut *outs, int n, DType wt);
void cuda_rmsnorm(float *out, const float *x, const void *w, DType wt, int N, int D, float eps);
void cuda_round_to(float *x, size_t n, DType t);
void cuda_pack(void *dst, DType t, const float *src, size_t n);
void cuda_unpack(float *dst, const void *src, DType t, size_t n);
void cuda_rope_table(float *cs, const int *pos, const float *inv_freq, int N, int Dh);
void cuda_rope(float *x, const float *cs, int N, int n_heads, int Dh);
void cuda_kv_store(float *kc, float *vc, const float *k, const float *v, const KVLayout *kv, const int *pos, int T,
                   int Hkv, int Dh);
void cuda_attention(float *out, const float *q, const float *k, const float *v, const KVLayout *kv, int Tq,
                    int q_pos0, int H, int Hkv, int Dh, int window, float *scratch);
void cuda_kv_store_batch(void *kc, void *vc, const float *k, const float *v, const PagedBatch *pb, int Hkv, int Dh);
void cuda_attention_batch(float *out, const float *q, const void *kc, const void *vc, const PagedBatch *pb, int H,
                          int Hkv, int Dh, int window, float *scratch, size_t scratch_stride);
void cuda_swiglu(float *out, const float *gate, const float *up, size_t n);
void cuda_add_to(float *out, const float *a, const float *b, size_t n);
void cuda_scale(float *x, float s, size_t n);
void cuda_dropout(float *out, const float *x, int N, int cols, int col0, int cols_global, float p, uint64_t key);
void cuda_copy(float *dst, const float *src, size_t n);
void cuda_gather_rows(float *out, const float *x, const int *rows, int R, int D);
void cuda_embedding(float *out, const void *table, DType wt, const int *ids, int N, int D, int v0, int V_local);
void cuda_mask_cols(float *x, int N, int V, int from);
void cuda_argmax_rows(int *ids, float *vals, const float *x, int N, int V, int v0);
void cuda_row_max(float *mx, const float *x, int N, int V, float T);
void cuda_row_sumexp(float *sum, const float *x, const float *mx, int N, int V, float T, int leaves);
void cuda_pick_logits(float *z, const float *x, const int *targets, int N, int V, int v0, float T);
void cuda_log_add(float *lse, const float *sum, int N);
void cuda_row_entropy_part(float *s, const float *x, const float *lse, int N, int V, float T, int leaves);
void cuda_sub_at(float *out, const float *a, const float *b, const int *idx, int n);
void cuda_matmul_backward(float *dx, float *dw, float *db, const float *dout, const float *x, const void *w, DType wt,
                          int N, int n_in, int n_out);
void cuda_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const void *w, DType wt, int N,
                           int D, float eps);
void cuda_rope_backward(float *dx, const float *cs, int N, int n_heads, int Dh);
void cuda_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                             const float *v, int T, int H, int Hkv, int Dh, int window, float *scratch);
void cuda_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n);
void cuda_embedding_backward(float *dtable, const float *dout, const int *ids, int N, int D, int v0, int V_local);
void cuda_logprob_backward(float *dlogits, const float *logits, const float *lse, const int *targets,
                           const float *dlogprob, const float *H, const float *dH, int N, int V_local, int v0, float T);
void cuda_adamw(float *p, const float *g, float *m, float *v, size_t n, float grad_scale, double lr, double beta1,
                double beta2, double eps, double weight_decay, int t);
void cuda_sum_squares(double *out, const float *x, size_t n, double *partials);
/* communication's side (link.cu) */
int cuda_owns(const void *p);
void cuda_tree_sum(float *v, int P, size_t n);
extern const DeviceLink cuda_link;
}

/* cuda_matmul's path for bf16 weights (matmul_tc.cu): the batch-invariant tensor-core matmul;
 * leaves a power of two up to 64 dividing K (checked by cuda_matmul) */
void matmul_tc(float *out, const float *x, const uint16_t *w, const uint16_t *bias, int N, int K, int n_out,
               int leaves);

/* RoPE's rotation (ops.cu): sign 1 the forward, -1 the inverse (the backward) */
void rope_launch(float *x, const float *cs, int N, int n_heads, int Dh, float sign);

/* The attention tile: keys are taken 32 at a time by ABSOLUTE position (tile t holds positions
 * [32t, 32t + 32)), whatever the layout, the query count or the first query's position, so a row's
 * online-softmax steps, and so its bits, are the same in a prefill, a decode step and training. */
constexpr int ATT_TILE = WARP, ATT_MAX_DH = 256, ATT_WARPS = 4, ATT_SPLIT = 8;

/* Offset of position j's kv head 0 (kv_offset of kernels.h on a device table) */
__device__ __forceinline__ size_t kv_offset_dev(const int *table, int block, size_t row, size_t kvd, int j) {
    size_t b = table ? (size_t)table[j / block] : 0;
    return b * (size_t)block * kvd + (size_t)(j % block) * row;
}

/* One query row's attention for one head over the key tiles t in [j0 / 32, i / 32] with
 * t % step == first (ops.cu's attention spreads a row's tiles over `step` warps; the backward's
 * recomputation takes them all, step 1): qs (Dh) the query in shared memory, keys j0..i of kv head
 * hk through the layout. Leaves the running max *m, the sum *l of exp(s - m) and acc (lane l:
 * columns l + 32c) = sum_j exp(s_j - m) v_j, accumulated tile by tile in increasing position; a
 * warp with no tile leaves m = -inf, l = 0, acc = 0. vec4: keys 16-byte aligned (Dh % 4 == 0), read
 * as float4 (the same products in the same order). */
constexpr int ATT_PER_LANE = ATT_MAX_DH / WARP;
__device__ __forceinline__ void attention_row_dev(const float *qs, const float *k, const float *v, const int *table,
                                                  int block, size_t row, size_t head, size_t kvd, int hk, int j0,
                                                  int i, int Dh, float scale, int first, int step, int vec4, float *acc,
                                                  float *m_out, float *l_out) {
    int lane = threadIdx.x % WARP;
    float m = -INFINITY, l = 0.0f;
#pragma unroll
    for (int c = 0; c < ATT_PER_LANE; c++) acc[c] = 0.0f;
    int t0 = j0 / ATT_TILE;
    t0 += ((first - t0) % step + step) % step;   /* the first tile of this warp's residue */
    for (int tile = t0; tile <= i / ATT_TILE; tile += step) {
        int j = tile * ATT_TILE + lane;
        int live = j >= j0 && j <= i;
        float s = -INFINITY;
        if (live) {
            const float *kj = k + kv_offset_dev(table, block, row, kvd, j) + (size_t)hk * head;
            float dot = 0.0f;
            if (vec4) {
#pragma unroll 8
                for (int d = 0; d < Dh; d += 4) {
                    float4 k4 = __ldg((const float4 *)(kj + d));
                    dot = fmaf(qs[d], k4.x, dot);
                    dot = fmaf(qs[d + 1], k4.y, dot);
                    dot = fmaf(qs[d + 2], k4.z, dot);
                    dot = fmaf(qs[d + 3], k4.w, dot);
                }
            } else {
                for (int d = 0; d < Dh; d++) dot = fmaf(qs[d], kj[d], dot);
            }
            s = dot * scale;
        }
        float m_new = fmaxf(m, warp_max(s));               /* finite: every tile has a live key */
        float p = live ? expf(s - m_new) : 0.0f;
        float corr = expf(m - m_new);                       /* 0 on the first tile (m = -inf) */
        l = l * corr + warp_sum(p);
        m = m_new;
#pragma unroll
        for (int c = 0; c < ATT_PER_LANE; c++) acc[c] *= corr;
        int ja = max(j0, tile * ATT_TILE), jb = min(i, tile * ATT_TILE + ATT_TILE - 1);
        for (int jj = ja; jj <= jb; jj++) {
            float pj = __shfl_sync(0xffffffffu, p, jj - tile * ATT_TILE);
            const float *vj = v + kv_offset_dev(table, block, row, kvd, jj) + (size_t)hk * head;
#pragma unroll
            for (int c = 0; c < ATT_PER_LANE; c++) {
                int d = lane + c * WARP;
                if (d < Dh) acc[c] = fmaf(pj, vj[d], acc[c]);
            }
        }
    }
    *m_out = m;
    *l_out = l;
}
#endif
