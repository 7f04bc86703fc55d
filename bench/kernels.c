/* kernels.c — `tandem bench --kernels`: each forward kernel alone on the model's backend (below).
 * Owns the kernel cases and their report; the bandwidth probes and the median are probe.c's. */
#include "bench/bench.h"
#include "bench/probe.h"
#include "runtime/mesh.h"
#include "runtime/model.h"
#include "runtime/util.h"
#include "kernels/cpu/cpu.h"   /* cpu_bf16_dot_native: the report names the matmul's arithmetic */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --kernels: the forward's kernels alone at the model's shapes and weights (layer 0, the lm head),
 * on the model's backend: microseconds per call (REPS back-to-back calls between syncs, median of
 * `iters`), the weight bytes streamed per second and FLOP/s. Shows where a decode step (N = 1, 32)
 * or a prefill (N = 512) spends its time, and how far each kernel is from the device's copy
 * bandwidth (printed first). Random activations; the numbers do not depend on values. On CUDA in
 * bf16 each matmul is timed twice: the tensor cores ("q_proj"), then the fp32 SIMT kernel they
 * replaced ("q_proj (simt)"). */
enum { REPS = 20 };
typedef enum { K_MATMUL, K_RMSNORM, K_SWIGLU, K_ADD, K_ATTN_DECODE, K_ATTN_PREFILL } KernelOp;
typedef struct {
    const char *name;
    KernelOp op;
    const void *w;   /* matmul weight */
    int n_in, n_out; /* matmul shape; attention: context length in n_in */
    int leaves;      /* matmul: the forward's leaves (forward.c) */
} KernelCase;

static double time_kernel(const Model *m, const KernelCase *k, int N, float *x, float *y, float *kc, float *vc,
                          const void *kcache, const void *vcache, const PagedBatch *pb, float *scratch, int iters) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    int Hl = m->n_heads_local, Hkvl = m->n_heads_kv_local, Dh = c->head_dim, D = c->dim;
    double *t = xmalloc(sizeof(double) * iters);
    for (int it = -1; it < iters; it++) {
        be->sync();
        double t0 = now_seconds();
        for (int r = 0; r < REPS; r++) switch (k->op) {
            case K_MATMUL: be->matmul(y, x, k->w, NULL, m->dtype, N, k->n_in, k->n_out, k->leaves); break;
            case K_RMSNORM: be->rmsnorm(y, x, m->w.layers[0].attn_norm, m->dtype, N, D, c->norm_eps); break;
            case K_SWIGLU: be->swiglu(y, x, x, (size_t)N * m->hidden_local); break;
            case K_ADD: be->add_to(y, x, x, 1); break;
            case K_ATTN_DECODE: {   /* N sequences of n_in cached keys, one query each: one call (as the forward) */
                PagedBatch b = *pb;
                b.N = b.n_seqs = N;
                be->attention_batch(y, x, kcache, vcache, &b, Hl, Hkvl, Dh, 0, scratch, (size_t)Hl * (k->n_in > 512 ? k->n_in : 512));
                break;
            }
            case K_ATTN_PREFILL: {  /* one sequence of N tokens, its own keys */
                KVLayout kv = kv_rows(N, Hkvl, Dh);
                be->attention(y, x, kc, vc, &kv, N, 0, Hl, Hkvl, Dh, 0, scratch);
                break;
            }
            }
        be->sync();
        if (it >= 0) t[it] = (now_seconds() - t0) / REPS;
    }
    double med = bench_median(t, iters);
    free(t);
    return med;
}

/* kernels/cuda/matmul_tc.cu when the build has CUDA (weak: NULL otherwise): bf16 matmuls on the
 * tensor cores, timed beside the SIMT kernel, whatever TANDEM_CUDA_MATMUL says; the process's choice
 * is restored after */
extern void cuda_matmul_set_simt_bf16(int on) __attribute__((weak));
extern int cuda_matmul_simt_bf16(void) __attribute__((weak));

int bench_kernels(Model *m, int iters, int context) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    const LayerWeights *w = &m->w.layers[0];
    int D = c->dim, F = m->hidden_local, Dh = c->head_dim, qd = m->n_heads_local * Dh, kvd = m->n_heads_kv_local * Dh;
    int ctx = context < c->max_pos ? context : c->max_pos, Ns[] = {1, 32, 512};
    size_t widest = (size_t)(F > m->vocab_local ? F : m->vocab_local) + D + qd;
    size_t n_buf = 512 * widest;
    size_t n_kv = (size_t)((ctx / 16 + 1) * 16 > 512 ? (ctx / 16 + 1) * 16 : 512) * kvd;   /* whole 16-position blocks */
    float *h = xmalloc(sizeof(float) * n_buf);
    unsigned rng = 99;
    for (size_t i = 0; i < n_buf; i++) { rng = rng * 1103515245u + 12345u; h[i] = (float)((rng >> 9) & 1023) / 1024.0f - 0.5f; }
    float *x = be->alloc(sizeof(float) * n_buf), *y = be->alloc(sizeof(float) * n_buf);
    float *kc = be->alloc(sizeof(float) * n_kv), *vc = be->alloc(sizeof(float) * n_kv);
    void *kcache = be->alloc(dtype_size(m->kv_dtype) * n_kv), *vcache = be->alloc(dtype_size(m->kv_dtype) * n_kv);   /* --kv-dtype */
    be->to_device(x, h, sizeof(float) * n_buf);
    be->to_device(kc, h, sizeof(float) * n_kv);
    be->to_device(vc, h, sizeof(float) * n_kv);
    be->pack(kcache, m->kv_dtype, kc, n_kv);
    be->pack(vcache, m->kv_dtype, vc, n_kv);
    be->round_to(x, n_buf, m->dtype);   /* what every matmul reads in this dtype */
    /* decode: 32 sequences whose caches are one and the same (table stride 0), each at position ctx - 1 */
    int nt = ctx / 16 + 1, *ht = xmalloc(sizeof(int) * (nt + 2 * 32 + 33)), *table = be->alloc(sizeof(int) * (nt + 2 * 32));
    for (int i = 0; i < nt; i++) ht[i] = i;
    for (int r = 0; r < 32; r++) ht[nt + r] = r, ht[nt + 32 + r] = ctx - 1, ht[nt + 64 + r] = r;
    ht[nt + 96] = 32;
    be->to_device(table, ht, sizeof(int) * (nt + 2 * 32));
    PagedBatch pb = {table, 0, 16, table + nt, table + nt + 32, 32, 32, 0, ht + nt + 64, ht + nt + 32, m->kv_dtype};
    /* the CPU attention's scratch: a thread's scores for every head and key */
    float *scratch = be->alloc(sizeof(float) * omp_get_max_threads() * m->n_heads_local * (ctx > 512 ? ctx : 512));
    double bw = be->owns ? bench_device_copy_gbs(be) : bench_read_bandwidth_gbs();   /* owns NULL: host memory */
    KernelCase cases[] = {
        {"q_proj", K_MATMUL, w->wq, D, qd, 1}, {"k_proj", K_MATMUL, w->wk, D, kvd, 1}, {"o_proj", K_MATMUL, w->wo, qd, D, m->o_leaves},
        {"gate_proj", K_MATMUL, w->w_gate, D, F, 1}, {"down_proj", K_MATMUL, w->w_down, F, D, m->down_leaves},
        {"lm_head", K_MATMUL, m->w.lm_head, D, m->vocab_local, 1}, {"rmsnorm", K_RMSNORM, NULL, 0, 0, 1},
        {"swiglu", K_SWIGLU, NULL, 0, 0, 1}, {"attention_decode", K_ATTN_DECODE, NULL, ctx, 0, 1},
        {"attention_prefill", K_ATTN_PREFILL, NULL, 0, 0, 1}, {"launch (add 1 float)", K_ADD, NULL, 0, 0, 1},
    };
    if (mesh_is_root(m->mesh))
        printf("{\"bench\": \"kernels\", \"device\": \"%s\", \"dtype\": \"%s\", \"kv_dtype\": \"%s\", \"bf16_dot\": \"%s\", "
               "\"bandwidth_gb_s\": %.1f, \"context\": %d}\n", be->name, dtype_name(m->dtype), dtype_name(m->kv_dtype),
               cpu_bf16_dot_native() ? "native" : "exact", bw, ctx);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int j = 0; j < 3; j++) {
            const KernelCase *k = &cases[i];
            int N = Ns[j];
            if ((k->op == K_ADD && N > 1) || (k->op == K_ATTN_PREFILL && N < 512) || (k->op == K_ATTN_DECODE && N > 32) ||
                (k->op == K_MATMUL && !k->w))
                continue;
            /* a bf16 matmul on CUDA: the tensor cores, then the old SIMT kernel as the baseline */
            int cuda_bf16 = k->op == K_MATMUL && !strcmp(be->name, "cuda") && m->dtype == DTYPE_BF16;
            int both = cuda_bf16 && cuda_matmul_set_simt_bf16 && cuda_matmul_simt_bf16;
            int was = both ? cuda_matmul_simt_bf16() : 0;
            for (int simt = 0; simt <= both; simt++) {
                if (both) cuda_matmul_set_simt_bf16(simt);
                double us = time_kernel(m, k, N, x, y, kc, vc, kcache, vcache, &pb, scratch, iters) * 1e6;
                if (both) cuda_matmul_set_simt_bf16(was);
                double wbytes = k->op == K_MATMUL ? (double)k->n_in * k->n_out * dtype_size(m->dtype) : 0;
                double flops = k->op == K_MATMUL ? 2.0 * N * k->n_in * k->n_out : 0;
                if (k->op == K_ATTN_DECODE) {
                    wbytes = 2.0 * N * ctx * kvd * dtype_size(m->kv_dtype);       /* the keys and values read */
                    flops = 4.0 * N * ctx * qd;
                }
                if (k->op == K_ATTN_PREFILL) flops = 2.0 * N * N * qd;           /* causal: half of 4 N^2 qd */
                if (mesh_is_root(m->mesh))
                    printf("{\"kernel\": \"%s%s\", \"N\": %d, \"us\": %.4g, \"gb_s\": %.4g, \"of_bandwidth\": %.3g, \"tflop_s\": %.4g}\n",
                           k->name, simt ? " (simt)" : "", N, us, wbytes / us / 1e3, wbytes / us / 1e3 / bw, flops / us / 1e6);
            }
        }
    be->free(x); be->free(y); be->free(kc); be->free(vc); be->free(kcache); be->free(vcache); be->free(table); be->free(scratch);
    free(h); free(ht);
    return 0;
}
