/* kernels.h — the seam between model code and the kernels: the Backend operation table that model,
 * engine and training code call, the two types its entries take (MatmulOut, KVLayout), the backend a
 * model gets (backend_default, backend_named; backend_check), the kernels' error exit (backend_fatal,
 * which the runtime sets: backend_set_fatal) and the kernels' thread count (backend_set_threads).
 * Kernels are pure math on pointers (STYLE.md 7): no communication, no allocation, no model
 * knowledge. Row-major everywhere.
 * Shape vocabulary: N tokens (packed over sequences), D model dim, F mlp dim, H / Hkv heads,
 * Dh head dim, V vocab; `_local` = this TP rank's share.
 * Does not own the kernels: the CPU ones, the oracle, are declared in kernels/cpu/cpu.h (included by
 * kernels/cpu/, the tests and the bench only); the CUDA ones (`make cuda`) in kernels/cuda/cuda.h. */
#ifndef TANDEM_KERNELS_H
#define TANDEM_KERNELS_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---- dtypes ----------------------------------------------------------------------------------
 * A weight tensor's storage dtype (Model.dtype): F32, or BF16 (the top 16 bits of an fp32: 8-bit
 * significand, fp32's exponent range). Every kernel computes in fp32; a BF16 weight is read through
 * its exact upcast (bf16_to_f32 is a shift), so a kernel's BF16 result has the bits of its F32
 * result on the upcast weights: on the CPU (every ISA), and on CUDA for every entry but the forward
 * matmul (matmul, matmuls). There a BF16 weight takes the tensor cores (kernels/cuda/matmul_tc.cu:
 * x split exactly into three bf16 pieces, products exact, the mma's fp32 accumulation), another
 * function of the same inputs, batch-invariant like every matmul, within a derived bound of the F32
 * kernel's result but not its bits (tests/cuda/cuda_vs_cpu.c). Activations, gradients, the KV cache and optimizer
 * state are fp32 buffers; in BF16 mode the matmul inputs are rounded to bf16 values in place
 * (Backend.round_to) where runtime/forward.c says so. Two CPU-only choices change that: --kv-dtype
 * bf16 rounds keys and values where they are produced and stores the cache as bf16 (PagedBatch.kv_dtype;
 * read through the exact upcast, so attention keeps its bits on those values), and --cpu-bf16-dot
 * native computes the BF16 forward matmul with vdpbf16ps's arithmetic (backend_set_bf16_dot). DTYPE_AUTO is a request only (--dtype auto:
 * the checkpoint's torch_dtype), never a tensor's dtype. */
typedef enum { DTYPE_AUTO = -1, DTYPE_F32 = 0, DTYPE_BF16 = 1 } DType;
static inline size_t dtype_size(DType t) { return t == DTYPE_BF16 ? 2 : 4; }
static inline const char *dtype_name(DType t) { return t == DTYPE_BF16 ? "bf16" : t == DTYPE_F32 ? "fp32" : "auto"; }
static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* round to nearest, ties to even (torch's .to(torch.bfloat16)); a NaN stays a NaN */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
/* element i of a weight of dtype t, as fp32 (exact) */
static inline float weight_at(const void *w, DType t, size_t i) {
    return t == DTYPE_BF16 ? bf16_to_f32(((const uint16_t *)w)[i]) : ((const float *)w)[i];
}

/* ---- tp-invariant sums -------------------------------------------------------------------------
 * A sum that tensor parallelism splits (a row-parallel matmul's dot products, the vocabulary's sum
 * of exp) is computed as TP_LEAVES fixed leaves combined by one pairwise tree, (l0 + l1) + (l2 + l3)
 * ...: at tp = t each rank computes the subtree of its TP_LEAVES / t leaves (the kernels' `leaves`
 * argument) and the tp sum adds the ranks' subtrees by the same tree (tree_sum over ranks,
 * runtime/comm.c), so every tp dividing TP_LEAVES gives 1x1's bits (runtime/model.c picks the
 * leaves). */
enum { TP_LEAVES = 8 };
/* v[0 .. n) = the pairwise tree over P planes v[p * n .. p * n + n), (v0 + v1) + (v2 + v3) for P = 4
 * (P a power of two; any other P gets one fixed tree, ((v0 + v1) + v2) for 3) */
static inline void tree_sum(float *v, int P, size_t n) {
    for (int s = 1; s < P; s *= 2)
        for (int p = 0; p + s < P; p += 2 * s)
            for (size_t i = 0; i < n; i++) v[(size_t)p * n + i] += v[(size_t)(p + s) * n + i];
}

/* Backend.dropout's mask (LoRA's lora_dropout): element idx of an input laid out (rows, cols_global)
 * is kept when splitmix64's output at key + (idx + 1) * gamma, as a 24-bit fraction, is >= p: the
 * same mask wherever the element sits (any tp split of the columns, any backend) */
static inline int dropout_keep(uint64_t key, uint64_t idx, float p) {
    uint64_t z = key + (idx + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * 0x1.0p-24f >= p;
}

/* One output of Backend.matmuls: a weight that reads the shared x (q, k, v; gate, up). */
typedef struct {
    float *out;          /* (N, n_out) */
    const void *w;       /* (n_out, n_in) in the call's weight dtype */
    const void *bias;    /* (n_out) or NULL, the same dtype */
    int n_out;
} MatmulOut;

/* Where key / value j of kv head hk lives in k, v:
 *   table[j / block] * block * Hkv * Dh  +  (j % block) * row  +  hk * head   (table NULL: block 0).
 * A contiguous (T, Hkv*Dh) sequence: kv_rows() (no table). The paged cache keeps each block
 * head-major, (Hkv, block, Dh), so one head's keys in a block are one run of memory: kv_paged(). */
typedef struct {
    const int *table;   /* block ids by position / block, in the backend's memory; NULL: one block */
    int block;          /* positions per block */
    size_t row, head;   /* floats between consecutive positions / kv heads */
} KVLayout;
static inline KVLayout kv_rows(int T, int Hkv, int Dh) {
    return (KVLayout){NULL, T > 0 ? T : 1, (size_t)Hkv * Dh, (size_t)Dh};
}
static inline KVLayout kv_paged(const int *table, int block, int Dh) {
    return (KVLayout){table, block, (size_t)Dh, (size_t)block * Dh};
}
/* The rows of a batch of sequences in the paged cache (kv_paged layout), for the *_batch entries: row
 * r (of N) is the token of sequence seq[r] at position pos[r]; a sequence's rows are consecutive, in
 * position order; sequence s's block table is tables + s * table_stride. seq, pos, tables are the
 * backend's memory; seq_start and pos_host are host copies for a backend that loops on the host:
 * sequence seq0 + i has rows [seq_start[i], seq_start[i + 1]) - seq_start[0], at positions
 * pos_host[r] (the same as pos). The cache pools kc, vc hold elements of kv_dtype. */
typedef struct {
    const int *tables;      /* (sequences, table_stride) block ids */
    int table_stride, block;
    const int *seq, *pos;   /* (N) each row's sequence (an index into tables) and position */
    int N, n_seqs, seq0;
    const int *seq_start;   /* (n_seqs + 1) host */
    const int *pos_host;    /* (N) host */
    DType kv_dtype;         /* the cache's elements (--kv-dtype): F32, or BF16 (2 bytes; CPU backends only) */
} PagedBatch;

/* Offset of position j's kv head 0 in k or v (head hk: + hk * kv->head); kvd = Hkv * Dh */
static inline size_t kv_offset(const KVLayout *kv, size_t kvd, int j) {
    size_t b = kv->table ? (size_t)kv->table[j / kv->block] : 0;
    return b * kv->block * kvd + (size_t)(j % kv->block) * kv->row;
}

/* ---- the backend: every operation model, engine and training code may call ------------------
 * Model code reaches kernels only through a Backend (Model.be), never cpu_* directly, so another
 * backend (kernels/cuda) slots in without touching model code. Entries have the
 * cpu_ functions' names without the prefix and the same arguments and contracts (kernels/cpu/cpu.h
 * and kernels/cpu/backward.h). Every pointer an entry takes is the backend's memory (alloc below):
 * float buffers, weights, and the int arrays too (ids, pos, rows, targets, idx, KVLayout.table);
 * the structs themselves (KVLayout, MatmulOut) and scalars are host values. Entries that read a
 * weight take its dtype (wt); everything else is fp32. Host-side work (sampling, jsonl, control
 * flow) copies what it reads out explicitly (to_host) and its inputs in (to_device). Scratch
 * arguments are for the CPU kernels (a row per host thread); a backend whose calls come from one
 * thread (parallel_calls 0: CUDA) keeps its own and gets backend_scratch_rows() == 1 row. */
typedef struct Backend {
    const char *name;
    /* 1: entries may run on several host threads at once, each call with its own scratch argument
     * (the CPU: model code runs attention one sequence per thread); 0: one host thread calls at a time
     * (CUDA queues every call on one stream, and its kernels share one internal scratch) */
    int parallel_calls;
    /* Readies the backend for this process (a GPU backend picks device local_rank % devices) and
     * says whether it can run: NULL, or one line saying why not (no device, no driver). */
    const char *(*open)(int local_rank);
    /* forward */
    /* leaves (a power of two dividing n_in): each output is the pairwise tree (tree_sum) of the dot
     * products over n_in / leaves consecutive inputs each, then the bias; 1 for a plain dot product.
     * A backend may cut every leaf into the same power-of-two number of runs, fixed by the leaf's
     * length alone (the CPU's cache blocking): a finer tree of the same kind, so a rank's subtree
     * stays 1x1's */
    void (*matmul)(float *out, const float *x, const void *w, const void *bias, DType wt, int N, int n_in, int n_out,
                   int leaves);
    void (*matmuls)(const float *x, int N, int n_in, const MatmulOut *outs, int n, DType wt);
    void (*rmsnorm)(float *out, const float *x, const void *w, DType wt, int N, int D, float eps);
    void (*round_to)(float *x, size_t n, DType t);
    void (*pack)(void *dst, DType t, const float *src, size_t n);
    void (*unpack)(float *dst, const void *src, DType t, size_t n);
    void (*rope_table)(float *cs, const int *pos, const float *inv_freq, int N, int Dh);
    void (*rope)(float *x, const float *cs, int N, int n_heads, int Dh);
    void (*kv_store)(float *kc, float *vc, const float *k, const float *v, const KVLayout *kv, const int *pos, int T,
                     int Hkv, int Dh);
    void (*attention)(float *out, const float *q, const float *k, const float *v, const KVLayout *kv, int Tq,
                      int q_pos0, int H, int Hkv, int Dh, int window, float *scratch);
    /* every sequence of a batch against the paged cache in one call (PagedBatch below) */
    void (*kv_store_batch)(void *kc, void *vc, const float *k, const float *v, const PagedBatch *pb, int Hkv, int Dh);
    void (*attention_batch)(float *out, const float *q, const void *kc, const void *vc, const PagedBatch *pb, int H,
                            int Hkv, int Dh, int window, float *scratch, size_t scratch_stride);
    void (*swiglu)(float *out, const float *gate, const float *up, size_t n);
    void (*add_to)(float *out, const float *a, const float *b, size_t n);
    void (*scale)(float *x, float s, size_t n);   /* x *= s (LoRA's alpha / r) */
    /* out (N, cols) = x / (1 - p) where dropout_keep(key, n * cols_global + col0 + j, p), else 0: the
     * columns [col0, col0 + cols) of an (N, cols_global) input; out may be x */
    void (*dropout)(float *out, const float *x, int N, int cols, int col0, int cols_global, float p, uint64_t key);
    void (*copy)(float *dst, const float *src, size_t n);
    void (*gather_rows)(float *out, const float *x, const int *rows, int R, int D);
    void (*embedding)(float *out, const void *table, DType wt, const int *ids, int N, int D, int v0, int V_local);
    void (*mask_cols)(float *x, int N, int V, int from);
    void (*argmax_rows)(int *ids, float *vals, const float *x, int N, int V, int v0);
    void (*row_max)(float *mx, const float *x, int N, int V, float T);
    /* row sums over V columns as `leaves` consecutive leaves of ceil(V / leaves) columns (the last ones
     * shorter or empty), each summed in double and rounded, combined by tree_sum */
    void (*row_sumexp)(float *sum, const float *x, const float *mx, int N, int V, float T, int leaves);
    void (*pick_logits)(float *z, const float *x, const int *targets, int N, int V, int v0, float T);
    void (*log_add)(float *lse, const float *sum, int N);
    void (*row_entropy_part)(float *s, const float *x, const float *lse, int N, int V, float T, int leaves);
    void (*sub_at)(float *out, const float *a, const float *b, const int *idx, int n);
    /* backward; a NULL dw is a frozen weight (LoRA's base): its gradient is not computed */
    void (*matmul_backward)(float *dx, float *dw, float *db, const float *dout, const float *x, const void *w, DType wt,
                            int N, int n_in, int n_out);
    void (*rmsnorm_backward)(float *dx, float *dw, const float *dout, const float *x, const void *w, DType wt, int N,
                             int D, float eps);
    void (*rope_backward)(float *dx, const float *cs, int N, int n_heads, int Dh);
    void (*attention_backward)(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                               const float *v, int T, int H, int Hkv, int Dh, int window, float *scratch);
    void (*swiglu_backward)(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n);
    void (*embedding_backward)(float *dtable, const float *dout, const int *ids, int N, int D, int v0, int V_local);
    void (*logprob_backward)(float *dlogits, const float *logits, const float *lse, const int *targets,
                             const float *dlogprob, const float *H, const float *dH, int N, int V_local, int v0, float T);
    /* optimizer (train/optim.c), on fp32 arrays of the parameter arena's layout: AdamW's update of n
     * elements (p, g, m, v; the scalars are host values), and the gradient norm's sum of squares of
     * x (n) into *out, one double of the backend's memory (a step gathers every tensor's sum with
     * one to_host); partials: ceil(n / 65536) doubles of scratch */
    void (*adamw)(float *p, const float *g, float *m, float *v, size_t n, float grad_scale, double lr, double beta1,
                  double beta2, double eps, double weight_decay, int t);
    void (*sum_squares)(double *out, const float *x, size_t n, double *partials);
    /* memory: the backend's own (alloc: zeroed, aborts on failure; free(NULL) is a no-op), and
     * host <-> backend copies (plain copies on the CPU); to_host returns once the data is there */
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
    void (*zero)(void *p, size_t bytes);
    void (*to_host)(void *dst, const void *src, size_t bytes);
    void (*to_device)(void *dst, const void *src, size_t bytes);
    void (*copy_bytes)(void *dst, const void *src, size_t bytes);   /* within the backend's memory, not overlapping */
    /* waits until everything queued before it is done (a no-op on the CPU): for timers */
    void (*sync)(void);
    /* communication on this backend's memory (runtime/comm.c). owns: 1 when p lies in memory the
     * host cannot hand to MPI (CUDA's device memory, cpu-guarded's regions): comm.c then moves it over
     * the link below or stages it through host memory; NULL: every pointer is host memory (the CPU).
     * tree_sum: kernels.h's tree_sum on P planes of n floats of this backend's memory. link: the
     * collectives between ranks that each have their own device (NCCL on CUDA), or NULL. */
    int (*owns)(const void *p);
    void (*tree_sum)(float *v, int P, size_t n);
    const struct DeviceLink *link;
} Backend;

/* A backend's own transport between devices (NCCL), used by runtime/comm.c for a group whose ranks
 * each have a device of their own. A group's rank 0 makes the bootstrap id, comm.c broadcasts it
 * over MPI, and every member opens the link with it (collective over the group). Operations are
 * queued on the backend's stream in call order, like the backend's entries; sends and receives
 * between group_begin and group_end progress together (two ranks sending to each other at once). */
typedef struct DeviceLink {
    const char *name;   /* "NCCL" */
    size_t id_bytes;
    /* where this rank's device is (host and PCI bus id): ranks with equal keys share a device and the
     * link cannot join them (NCCL refuses "duplicate GPU"), so such a group stages through the host */
    void (*device_key)(char *key, size_t cap);
    const char *(*make_id)(void *id);   /* NULL, or one line why the link cannot be used (no library) */
    const char *(*open)(void **h, const void *id, int rank, int size);
    void (*close)(void *h);
    void (*group_begin)(void);
    void (*group_end)(void);
    void (*send)(void *h, const void *buf, size_t bytes, int peer);
    void (*recv)(void *h, void *buf, size_t bytes, int peer);
    void (*all_gather)(void *h, const float *in, float *out, size_t n_each);   /* in may be out + rank * n_each */
    void (*broadcast)(void *h, void *buf, size_t bytes, int root);
    void (*max)(void *h, float *buf, size_t n);   /* in place, element-wise max: exact in any order */
} DeviceLink;

/* NULL when every entry of be is filled (all but owns and link, which may be NULL), else one line
 * naming the table and its first missing entry. backend_named checks each table it hands out; an
 * entry added to Backend without a line in backend.c's list fails to compile there. */
const char *backend_check(const Backend *be);

/* The kernels' fatal errors (out of memory, a failed CUDA call): one line, then the job stops.
 * kernels/ includes nothing above it, so the runtime hands it its error exit at start-up
 * (runtime/util.c registers rank_error's: "tandem: [rank r] ...", MPI_Abort with several ranks);
 * until then, or without the runtime, the line is "tandem: MESSAGE" and exit(1). fatal gets the
 * formatted message and must not return. */
void backend_set_fatal(void (*fatal)(const char *msg));
__attribute__((noreturn, format(printf, 1, 2))) void backend_fatal(const char *fmt, ...);

/* Rows of attention scratch a caller gives be's entries: one per host thread that may call at once */
int backend_scratch_rows(const Backend *be);

/* The backend a model runs on: the CPU table (kernels/cpu/backend.c). */
const Backend *backend_default(void);
/* The backend named by --device: "cpu", "cuda" (kernels/cuda, linked when nvcc built it) or
 * "cpu-guarded" (the CPU kernels behind memory the host cannot touch: a testing aid,
 * kernels/cpu/guarded.c); NULL when that backend is not in this build or the name is unknown. */
const Backend *backend_named(const char *name);
/* Threads for the kernels and OpenBLAS; n <= 0: the cores this rank may use (its CPU affinity, shared
 * among the node's ranks). Returns the count set. */
int backend_set_threads(int n);
/* --cpu-bf16-dot: 1 = native (the CPU's bf16 dot-product arithmetic, kernels/cpu/bf16dot.c), 0 = exact */
void backend_set_bf16_dot(int native);
#endif
