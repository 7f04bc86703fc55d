/* cpu.h — the CPU kernels (kernels/cpu/): host pointers, the oracle for every other backend (STYLE.md 8).
 * Pure math on pointers (STYLE.md 7): no communication, no allocation, no model knowledge. Row-major
 * everywhere, the shape vocabulary of kernels/kernels.h. The CUDA versions (kernels/cuda/cuda.h) have
 * the same names with a cuda_ prefix, the same arguments, on device pointers.
 * Owns: the cpu_* prototypes and their contracts (forward here, backward in kernels/cpu/backward.h)
 * and cpu_backend, the table that holds them.
 * Does not own the seam: model, engine and training code call a Backend (kernels/kernels.h), never
 * cpu_*. Only kernels/cpu/, the tests and the bench (which times cpu_matmul and the FMA peak on
 * purpose) include this file. */
#ifndef TANDEM_CPU_H
#define TANDEM_CPU_H
#include "kernels/kernels.h"   /* MatmulOut, KVLayout, Backend */
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

/* out (N, n_out) = x (N, n_in) @ w (n_out, n_in)^T [+ bias (n_out)]; bias may be NULL; w and bias
 * of dtype wt (BF16: read through the exact upcast, so out has the bits of the F32 call on the
 * upcast weights).
 * Batch-invariant: each element's bits depend only on its x row, w row and bias, never on N, the
 * tiling or the threads (fixed 16-lane FMA order, fixed lane tree). Used by every forward pass.
 * leaves: each element is the tree_sum (kernels.h) of the dot products over n_in / leaves consecutive
 * inputs (a power of two dividing n_in; 1: one dot product), then the bias. */
void cpu_matmul(float *out, const float *x, const void *w, const void *bias, DType wt, int N, int n_in, int n_out,
                int leaves);

/* --cpu-bf16-dot (bf16dot.c): native 1 makes cpu_matmul / cpu_matmuls on BF16 weights round x to
 * bf16 and compute each run's dot product with AVX512_BF16's vdpbf16ps arithmetic (pairs of
 * products, each step rounded to nearest even, denormals flushed; 16 lanes over 32-element chunks,
 * zero-padded, then hsum16; runs combined by tree_sum as in the exact path): batch-invariant and
 * tp-leaf-invariant like it, not its bits. The instruction where the CPU has it, else its emulation
 * (cpu_dpbf16_lane), which gives the same bits; cpu_bf16_dot_emulate(1) forces the emulation (the
 * tests). 0 (the default): the exact path. */
void cpu_set_bf16_dot(int native);
int cpu_bf16_dot_native(void);
void cpu_bf16_dot_emulate(int on);
int cpu_has_avx512bf16(void);
/* one fp32 lane of vdpbf16ps: acc + a.hi * b.hi, then + a.lo * b.lo (a, b: two bf16 each, element
 * 2i in the low half), as the Intel SDM states it; cpu_dpbf16_hw: 16 lanes by the instruction itself
 * (only where cpu_has_avx512bf16) */
float cpu_dpbf16_lane(float acc, uint32_t a, uint32_t b);
void cpu_dpbf16_hw(float *acc, const uint32_t *a, const uint32_t *b);
/* matmuls_leaves' native path: every output over `leaves` runs of n_in, weights BF16 */
void cpu_matmul_native(const float *x, int N, int n_in, const MatmulOut *outs, int n, int leaves);

/* cpu_matmul for several weights that read the same x (q, k, v; gate, up), in one parallel region:
 * one wake-up and one barrier instead of one each. Every out gets exactly cpu_matmul's bits. */
void cpu_matmuls(const float *x, int N, int n_in, const MatmulOut *outs, int n, DType wt);

/* dst (n) of dtype t = src (n) rounded to nearest even (F32: a copy); unpack: dst (n) = the exact fp32
 * values of src (n) of dtype t. Training keeps bf16-valued activations this way at half the bytes. */
void cpu_pack(void *dst, DType t, const float *src, size_t n);
void cpu_unpack(float *dst, const void *src, DType t, size_t n);
/* x (n) rounded in place to the nearest value of dtype t (BF16: round to nearest even, what
 * torch's .to(torch.bfloat16) gives, kept in fp32); F32: nothing. */
void cpu_round_to(float *x, size_t n, DType t);

/* out (N, D) = x / sqrt(mean(x^2) + eps) * w, normalised in fp32 then multiplied (HF order). */
void cpu_rmsnorm(float *out, const float *x, const void *w, DType wt, int N, int D, float eps);

/* RoPE's cos and sin of N rows: cs (N, Dh) = cos(pos[n] * inv_freq[i]) for i < Dh/2, then the sines,
 * the angle in fp32. inv_freq (Dh/2). Made once per forward, used by q and k of every layer. */
void cpu_rope_table(float *cs, const int *pos, const float *inv_freq, int N, int Dh);
/* In place on x (N, n_heads * Dh): HF rotate_half RoPE, pairs (i, i + Dh/2), cs from cpu_rope_table. */
void cpu_rope(float *x, const float *cs, int N, int n_heads, int Dh);

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

/* The whole batch against the paged cache (kernels.h PagedBatch): cpu_kv_store, then cpu_attention,
 * per sequence, sequences in parallel (each thread its own scratch_stride floats of scratch; a lone
 * sequence parallelises over heads inside cpu_attention). The bits of per-sequence calls. kc, vc
 * hold elements of pb->kv_dtype: BF16 stores each key and value rounded to nearest even and reads it
 * through the exact upcast, so attention on a bf16 cache has the bits of cpu_attention on fp32 rows
 * holding the same bf16 values (--kv-dtype bf16 rounds them where they are produced). */
void cpu_kv_store_batch(void *kc, void *vc, const float *k, const float *v, const PagedBatch *pb, int Hkv, int Dh);
void cpu_attention_batch(float *out, const float *q, const void *kc, const void *vc, const PagedBatch *pb, int H,
                         int Hkv, int Dh, int window, float *scratch, size_t scratch_stride);

/* out (n) = silu(gate) * up */
void cpu_swiglu(float *out, const float *gate, const float *up, size_t n);

/* x += y, n floats */
void cpu_add(float *x, const float *y, size_t n);
/* out = a + b, n floats; out may be a (then cpu_add's bits) */
void cpu_add_to(float *out, const float *a, const float *b, size_t n);
void cpu_scale(float *x, float s, size_t n);
void cpu_dropout(float *out, const float *x, int N, int cols, int col0, int cols_global, float p, uint64_t key);
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
 *   cpu_row_sumexp: sum (N) = sum over the columns of exp(x / T - mx): `leaves` runs of
 *                   ceil(V / leaves) columns, each in double and rounded once, added by tree_sum
 * lse = mx + log(sum of the ranks' sums). T == 1 divides by 1, which changes no bit. */
void cpu_row_max(float *mx, const float *x, int N, int V, float T);
void cpu_row_sumexp(float *sum, const float *x, const float *mx, int N, int V, float T, int leaves);
/* z (N) = x[n, targets[n] - v0] / T where this shard owns targets[n], else 0 (targets -1 too) */
void cpu_pick_logits(float *z, const float *x, const int *targets, int N, int V, int v0, float T);
/* s (N) = sum over the columns of p * x / T with p = exp(x / T - lse), in leaves as cpu_row_sumexp:
 * one shard's part of the expected logit; the entropy is lse - (the tp sum of the parts) */
void cpu_row_entropy_part(float *s, const float *x, const float *lse, int N, int V, float T, int leaves);
/* lse (N) += log(sum) (N): finishes cpu_row_max + cpu_row_sumexp once the sums are all-reduced */
void cpu_log_add(float *lse, const float *sum, int N);
/* out (n) = a - b[idx[i]] (b[i] when idx is NULL): a logit minus its row's log-sum-exp */
void cpu_sub_at(float *out, const float *a, const float *b, const int *idx, int n);

/* Vocab-parallel lookup: out (N, D) = table rows for ids in [v0, v0 + V_local), zero elsewhere.
 * table (V_local, D) of dtype wt (rows upcast exactly). */
void cpu_embedding(float *out, const void *table, DType wt, const int *ids, int N, int D, int v0, int V_local);

/* ---- the optimizer (optim.c): fp32 arrays of the parameter arena's layout ---- */
/* AdamW on n elements, exactly torch 1.13's _single_tensor_adamw in fp32, step t (1-based):
 *   g = g_in * grad_scale                        (clip_grad_norm_'s in-place grad.mul_)
 *   p = p * (1 - lr * wd)                        (decoupled weight decay, before the moments)
 *   m = fma(g, 1 - beta1, m * beta1)             (exp_avg.mul_(beta1).add_(g, alpha=1 - beta1))
 *   v = fma((1 - beta2) * g, g, v * beta2)       (exp_avg_sq.mul_(beta2).addcmul_(g, g, 1 - beta2))
 *   p = p + (-lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
 * Scalars are computed in double and rounded to fp32 once, as torch does with Python floats; no other
 * product is fused. Each element's bits are independent of n and the threads. */
void cpu_adamw(float *p, const float *g, float *m, float *v, size_t n, float grad_scale, double lr, double beta1,
               double beta2, double eps, double weight_decay, int t);
/* *out (one double) = sum of x[i]^2 (n) in double: chunks of CPU_NORM_CHUNK floats, each summed in 8
 * lanes (lane k: elements lo + k, lo + 8 + k, ... in order; the tail < 8 into lane 0 after them),
 * the lanes as ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)) into partials[c], then the chunks in
 * order from 0.0. The result does not depend on the thread count. partials: ceil(n / CPU_NORM_CHUNK)
 * doubles of scratch (the backend's memory). */
enum { CPU_NORM_CHUNK = 65536 };
void cpu_sum_squares(double *out, const float *x, size_t n, double *partials);

#include "kernels/cpu/backward.h"

/* kernels/kernels.h's table filled with the functions above (backend.c): backend_default() today. */
extern const Backend cpu_backend;
/* The same kernels behind memory the host cannot touch (guarded.c, --device cpu-guarded): a testing
 * aid that makes the "every pointer is the backend's memory" contract checkable without a GPU. */
extern const Backend cpu_guarded_backend;
/* on: a misused argument is its one line on stderr and a count, and the call goes on (the oracle
 * harness); off (the default): the line, then abort */
void cpu_guarded_count_faults(int on);
typedef struct {
    long allocs;   /* allocations made since the process started */
    long live;     /* not freed yet */
    long faults;   /* misused arguments counted (cpu_guarded_count_faults) */
} GuardedStats;
GuardedStats cpu_guarded_stats(void);
#endif
