/* kernels.h — the kernel interface: pure math on pointers (STYLE.md 7).
 * No communication, no allocation, no model knowledge. Row-major everywhere.
 * CPU versions (kernels/cpu/) take host pointers and are the oracle; CUDA versions
 * (kernels/cuda/, built by `make cuda`) have the same names with a cuda_ prefix, the same
 * argument order, device pointers, and a trailing stream argument.
 * Shape vocabulary: N tokens (packed over sequences), D model dim, F mlp dim, H / Hkv heads,
 * Dh head dim, V vocab; `_local` = this TP rank's share. */
#ifndef TANDEM_KERNELS_H
#define TANDEM_KERNELS_H
#include <stddef.h>

/* Threads for the kernels and OpenBLAS; n <= 0: cpu_default_threads(). Returns the count set. */
int cpu_set_threads(int n);
/* The cores this rank may use (llama.cpp's default): its CPU affinity, shared among the node's ranks
 * (Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE) unless the launcher already bound it to fewer than all
 * online cores; at least 1. */
int cpu_default_threads(void);

/* iters x 12 x 16 fused multiply-adds on every OpenMP thread, nothing else (no loads): timed by the
 * bench, the fp32 FMA peak no kernel here can pass. Returns a value that keeps the work live. */
int cpu_fma_chains(long iters, float *sink); /* FMAs per thread and iteration */

/* out (N, n_out) = x (N, n_in) @ w (n_out, n_in)^T [+ bias (n_out)]; bias may be NULL.
 * Batch-invariant: each element's bits depend only on its x row, w row and bias, never on N, the
 * tiling or the threads (fixed 16-lane FMA order, fixed lane tree). Used by every forward pass. */
void cpu_matmul(float *out, const float *x, const float *w, const float *bias, int N, int n_in, int n_out);

/* cpu_matmul for several weights that read the same x (q, k, v; gate, up), in one parallel region:
 * one wake-up and one barrier instead of one each. Every out gets exactly cpu_matmul's bits. */
typedef struct {
    float *out;          /* (N, n_out) */
    const float *w;      /* (n_out, n_in) */
    const float *bias;   /* (n_out) or NULL */
    int n_out;
} MatmulOut;
void cpu_matmuls(const float *x, int N, int n_in, const MatmulOut *outs, int n);

/* out (N, D) = x / sqrt(mean(x^2) + eps) * w, normalised in fp32 then multiplied (HF order). */
void cpu_rmsnorm(float *out, const float *x, const float *w, int N, int D, float eps);

/* RoPE's cos and sin of N rows: cs (N, Dh) = cos(pos[n] * inv_freq[i]) for i < Dh/2, then the sines,
 * the angle in fp32. inv_freq (Dh/2). Made once per forward, used by q and k of every layer. */
void cpu_rope_table(float *cs, const int *pos, const float *inv_freq, int N, int Dh);
/* In place on x (N, n_heads * Dh): HF rotate_half RoPE, pairs (i, i + Dh/2), cs from cpu_rope_table. */
void cpu_rope(float *x, const float *cs, int N, int n_heads, int Dh);

/* Where key / value j of kv head hk lives in k, v:
 *   table[j / block] * block * Hkv * Dh  +  (j % block) * row  +  hk * head.
 * A contiguous (T, Hkv*Dh) sequence: kv_rows(). The paged cache keeps each block head-major,
 * (Hkv, block, Dh), so one head's keys in a block are one run of memory: kv_paged(). */
typedef struct {
    const int *table;   /* block ids by position / block */
    int block;          /* positions per block */
    size_t row, head;   /* floats between consecutive positions / kv heads */
} KVLayout;
static inline KVLayout kv_rows(int T, int Hkv, int Dh) {
    static const int whole[1] = {0};
    return (KVLayout){whole, T, (size_t)Hkv * Dh, (size_t)Dh};
}
static inline KVLayout kv_paged(const int *table, int block, int Dh) {
    return (KVLayout){table, block, (size_t)Dh, (size_t)block * Dh};
}
/* Offset of position j's kv head 0 in k or v (head hk: + hk * kv->head); kvd = Hkv * Dh */
static inline size_t kv_offset(const KVLayout *kv, size_t kvd, int j) {
    return (size_t)kv->table[j / kv->block] * kv->block * kvd + (size_t)(j % kv->block) * kv->row;
}

/* Writes T new tokens' k, v (T, Hkv*Dh) rows into their cache slots: position pos[t] goes where kv
 * (kv_paged) puts it, every head of the row. kc, vc: one layer's pool, (n_blocks, Hkv, block, Dh). */
void cpu_kv_store(float *kc, float *vc, const float *k, const float *v, const KVLayout *kv, const int *pos, int T,
                  int Hkv, int Dh);

/* Causal attention for ONE sequence, keys and values found through `kv` (above).
 * q (Tq, H*Dh): queries at positions q_pos0 .. q_pos0+Tq-1; out (Tq, H*Dh).
 * Query head h uses kv head h / (H / Hkv). window > 0: key j visible to query i iff
 * 0 <= i - j < window; window == 0: full causal. scratch: at least omp_get_max_threads() * H *
 * (q_pos0 + Tq) floats (rows, or a lone row's heads, run in parallel; each element's arithmetic is
 * the same either way).
 * Scores are reduced over keys in increasing position order whatever the batch, paging or
 * layout, so the same tokens give the same bits in training forward and in generation. */
void cpu_attention(float *out, const float *q, const float *k, const float *v, const KVLayout *kv, int Tq,
                   int q_pos0, int H, int Hkv, int Dh, int window, float *scratch);

/* out (n) = silu(gate) * up */
void cpu_swiglu(float *out, const float *gate, const float *up, size_t n);

/* x += y, n floats */
void cpu_add(float *x, const float *y, size_t n);
/* out = a + b, n floats; out may be a (then cpu_add's bits) */
void cpu_add_to(float *out, const float *a, const float *b, size_t n);
void cpu_copy(float *dst, const float *src, size_t n);
/* out (R, D) = rows rows[0..R) of x (., D) */
void cpu_gather_rows(float *out, const float *x, const int *rows, int R, int D);
/* x (N, V): columns [from, V) set to -inf (vocab padding); nothing when from >= V */
void cpu_mask_cols(float *x, int N, int V, int from);
int cpu_argmax(const float *x, int n);   /* index of the largest of x[0..n), the first among equals; NaN never wins */
/* ids, vals (N): each row's cpu_argmax over x (N, V) and its value; ids offset by v0 (the shard's first id) */
void cpu_argmax_rows(int *ids, float *vals, const float *x, int N, int V, int v0);

/* Pieces of a vocab-parallel log-sum-exp of x / T (the caller all-reduces between them):
 *   cpu_row_max:    mx (N) = max over the shard's columns of x (N, V), divided by T (division is
 *                   monotonic, so this is the max of x / T exactly)
 *   cpu_row_sumexp: sum (N) = sum over the columns of exp(x / T - mx), in double, rounded once
 * lse = mx + log(sum of the ranks' sums). T == 1 divides by 1, which changes no bit. */
void cpu_row_max(float *mx, const float *x, int N, int V, float T);
void cpu_row_sumexp(float *sum, const float *x, const float *mx, int N, int V, float T);
/* z (N) = x[n, targets[n] - v0] / T where this shard owns targets[n], else 0 (targets -1 too) */
void cpu_pick_logits(float *z, const float *x, const int *targets, int N, int V, int v0, float T);
/* s (N) = sum over the columns of p * x / T with p = exp(x / T - lse), in double, rounded once: one
 * shard's part of the expected logit; the entropy is lse - (the tp sum of the parts) */
void cpu_row_entropy_part(float *s, const float *x, const float *lse, int N, int V, float T);
/* lse (N) += log(sum) (N): finishes cpu_row_max + cpu_row_sumexp once the sums are all-reduced */
void cpu_log_add(float *lse, const float *sum, int N);
/* out (n) = a - b[idx[i]] (b[i] when idx is NULL): a logit minus its row's log-sum-exp */
void cpu_sub_at(float *out, const float *a, const float *b, const int *idx, int n);

/* Vocab-parallel lookup: out (N, D) = table rows for ids in [v0, v0 + V_local), zero elsewhere.
 * table (V_local, D). */
void cpu_embedding(float *out, const float *table, const int *ids, int N, int D, int v0, int V_local);

#include "kernels/backward.h"

/* ---- the backend: every operation model, engine and training code may call ------------------
 * Model code reaches kernels only through a Backend (Model.be), never cpu_* directly, so another
 * backend (kernels/cuda, a later issue) slots in without touching model code. Entries have the
 * cpu_ functions' names without the prefix and the same arguments and contracts (see above and
 * kernels/backward.h); pointers are the backend's memory. Host-side work (sampling, jsonl) copies
 * its rows out explicitly (to_host). */
typedef struct Backend {
    const char *name;
    /* forward */
    void (*matmul)(float *out, const float *x, const float *w, const float *bias, int N, int n_in, int n_out);
    void (*matmuls)(const float *x, int N, int n_in, const MatmulOut *outs, int n);
    void (*rmsnorm)(float *out, const float *x, const float *w, int N, int D, float eps);
    void (*rope_table)(float *cs, const int *pos, const float *inv_freq, int N, int Dh);
    void (*rope)(float *x, const float *cs, int N, int n_heads, int Dh);
    void (*kv_store)(float *kc, float *vc, const float *k, const float *v, const KVLayout *kv, const int *pos, int T,
                     int Hkv, int Dh);
    void (*attention)(float *out, const float *q, const float *k, const float *v, const KVLayout *kv, int Tq,
                      int q_pos0, int H, int Hkv, int Dh, int window, float *scratch);
    void (*swiglu)(float *out, const float *gate, const float *up, size_t n);
    void (*add_to)(float *out, const float *a, const float *b, size_t n);
    void (*copy)(float *dst, const float *src, size_t n);
    void (*gather_rows)(float *out, const float *x, const int *rows, int R, int D);
    void (*embedding)(float *out, const float *table, const int *ids, int N, int D, int v0, int V_local);
    void (*mask_cols)(float *x, int N, int V, int from);
    void (*argmax_rows)(int *ids, float *vals, const float *x, int N, int V, int v0);
    void (*row_max)(float *mx, const float *x, int N, int V, float T);
    void (*row_sumexp)(float *sum, const float *x, const float *mx, int N, int V, float T);
    void (*pick_logits)(float *z, const float *x, const int *targets, int N, int V, int v0, float T);
    void (*log_add)(float *lse, const float *sum, int N);
    void (*row_entropy_part)(float *s, const float *x, const float *lse, int N, int V, float T);
    void (*sub_at)(float *out, const float *a, const float *b, const int *idx, int n);
    /* backward */
    void (*matmul_backward)(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w, int N,
                            int n_in, int n_out);
    void (*rmsnorm_backward)(float *dx, float *dw, const float *dout, const float *x, const float *w, int N, int D,
                             float eps);
    void (*rope_backward)(float *dx, const float *cs, int N, int n_heads, int Dh);
    void (*attention_backward)(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                               const float *v, int T, int H, int Hkv, int Dh, int window, float *scratch);
    void (*swiglu_backward)(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n);
    void (*embedding_backward)(float *dtable, const float *dout, const int *ids, int N, int D, int v0, int V_local);
    void (*logprob_backward)(float *dlogits, const float *logits, const float *lse, const int *targets,
                             const float *dlogprob, const float *H, const float *dH, int N, int V_local, int v0, float T);
    /* memory: host <-> backend (identity copies on the CPU) */
    void (*to_host)(void *dst, const void *src, size_t bytes);
    void (*to_device)(void *dst, const void *src, size_t bytes);
} Backend;
extern const Backend cpu_backend;

#ifdef TANDEM_CUDA
/* Defined in kernels/cuda/ (C++ .cu files), called from C: C linkage. cudaStream_t is spelled as in
 * cuda_runtime.h so C callers need no CUDA headers; NULL is the default stream. */
#ifdef __cplusplus
extern "C" {
#endif
typedef struct CUstream_st *cudaStream_t;
void cuda_matmul(float *out, const float *x, const float *w, const float *bias, int N, int n_in, int n_out,
                 cudaStream_t stream);
void cuda_rmsnorm(float *out, const float *x, const float *w, int N, int D, float eps, cudaStream_t stream);
/* device memory helpers for tests and the runtime; each checks its CUDA call and stops the job on
 * failure, except cuda_available: 1 if a CUDA device can be used, 0 (no abort) without driver or device */
int cuda_available(void);
void *cuda_alloc(size_t bytes);
void cuda_free(void *p);
void cuda_to_device(void *dst, const void *src, size_t bytes);
void cuda_to_host(void *dst, const void *src, size_t bytes);
void cuda_sync(void);
#ifdef __cplusplus
}
#endif
#endif
#endif
