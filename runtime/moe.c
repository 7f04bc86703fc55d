/* moe.c — the Mixture-of-Experts MLP block of the one forward (runtime/forward.c calls moe_forward
 * in place of the dense MLP when cfg.moe is set): Mixtral's block_sparse_moe, Qwen2-MoE's and
 * Qwen3-MoE's mlp (experts + router; qwen2_moe's sigmoid-gated shared expert).
 * Owns: routing (router logits, softmax and top-k in fp32, ties to the lower expert id, the top-k
 * renormalised when norm_topk), grouping the tokens by expert, the experts' grouped GEMMs and the
 * fixed-order combine. Does not own: the weights' layout (runtime/model.c's spec table), the
 * backward (not written yet: training refuses a MoE model, train/grad.c).
 *
 * Dropless and batch invariant: every token goes to its k experts, no capacity; an expert's rows are
 * its tokens gathered in token order and multiplied by one GEMM per expert (be->matmul's rows are
 * independent: a row's bits do not depend on the other rows), and each token's output is
 * sum_j w_j y_j added in the rank order j = 0 .. k-1 of its choices. So a token's output depends on
 * that token only: the same bits alone, in any batch, in generation and in scoring.
 * Tensor parallel: each expert (and the shared expert) is split over tp like the dense MLP (gate/up
 * column-parallel, down row-parallel with moe_leaves leaves); the router is replicated, so every tp
 * rank routes identically. The experts' (N k, D) down outputs are tp-summed BEFORE the weighted
 * combine (model_tp_sum, the fixed tree over leaves shared by every tp dividing TP_LEAVES): the
 * combine then reads 1x1's bits, and the block's output is the same at every tp. That costs k
 * times the dense MLP's tp sum; summing the combined partials instead would not be tp invariant.
 * Precision: as forward.c (bf16: the matmuls' inputs rounded, everything else fp32, the routing
 * weights included: HF casts them to the model's dtype, autocast's function does not).
 * Memory: host code on the run's buffers (the CPU backend: model_load refuses a device for MoE);
 * its scratch is allocated per call. */
#include "runtime/model.h"
#include "runtime/util.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Routes one token: p (E) = softmax(logits) in fp32, then the k largest (ties: lower id first, in
 * descending order: rank 0 is the largest), their weights renormalised to sum 1 when norm. */
static void route(const float *logits, int E, int k, int norm, float *p, int *sel, float *w) {
    float mx = logits[0], sum = 0.0f;
    for (int e = 1; e < E; e++) mx = logits[e] > mx ? logits[e] : mx;
    for (int e = 0; e < E; e++) sum += p[e] = expf(logits[e] - mx);
    for (int e = 0; e < E; e++) p[e] /= sum;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++) taken |= sel[i] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;   /* strict: a tie keeps the lower id */
        }
        sel[j] = best;
        w[j] = p[best];
    }
    if (!norm) return;
    float s = 0.0f;
    for (int j = 0; j < k; j++) s += w[j];
    for (int j = 0; j < k; j++) w[j] /= s;
}

/* The shared expert (qwen2_moe), added to out (N, D): out += sigmoid(xb s_router^T) * down(silu(gate) * up). */
static void shared_expert(const Model *m, const LayerWeights *w, const float *xb, int N, float *out) {
    const Backend *be = m->be;
    int D = m->cfg.dim, Fs = m->shared_dim_local;
    DType wt = m->dtype;
    float *g = xmalloc(sizeof(float) * N * Fs), *u = xmalloc(sizeof(float) * N * Fs);   /* (N, Fs_local) */
    float *y = xmalloc(sizeof(float) * N * D), *gl = xmalloc(sizeof(float) * N);        /* (N, D), (N) */
    be->matmuls(xb, N, D, (MatmulOut[]){{g, w->s_gate, NULL, Fs}, {u, w->s_up, NULL, Fs}}, 2, wt);
    be->swiglu(g, g, u, (size_t)N * Fs);
    be->round_to(g, (size_t)N * Fs, wt);                                               /* matmul input */
    be->matmul(y, g, w->s_down, NULL, wt, N, Fs, D, m->shared_leaves);                 /* row-parallel: partial */
    model_tp_sum(m, y, (size_t)N * D);
    be->matmul(gl, xb, w->s_router, NULL, wt, N, D, 1, 1);                             /* replicated */
    for (int t = 0; t < N; t++) {
        float s = 1.0f / (1.0f + expf(-gl[t]));
        for (int d = 0; d < D; d++) out[(size_t)t * D + d] += s * y[(size_t)t * D + d];
    }
    free(g); free(u); free(y); free(gl);
}

void moe_forward(const Model *m, int l, const float *xb, int N, float *out) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    const LayerWeights *w = &m->w.layers[l];
    DType wt = m->dtype;
    int D = c->dim, E = c->n_experts, k = c->n_experts_tok, Fe = m->moe_dim_local, NK = N * k;
    size_t ws = dtype_size(wt);
    float *logits = xmalloc(sizeof(float) * N * E), *p = xmalloc(sizeof(float) * E);  /* (N, E), (E) */
    float *wk = xmalloc(sizeof(float) * NK);                                             /* (N, k) routing weights */
    int *sel = xmalloc(sizeof(int) * NK), *slot = xmalloc(sizeof(int) * NK);            /* (N, k) expert, grouped row */
    int *rows = xmalloc(sizeof(int) * (NK + 1)), *start = xcalloc(E + 1, sizeof(int));   /* (N k) token; (E + 1) */
    be->matmul(logits, xb, w->router, NULL, wt, N, D, E, 1);                           /* replicated router */
    for (int t = 0; t < N; t++) route(logits + (size_t)t * E, E, k, c->norm_topk, p, sel + t * k, wk + t * k);
    /* group by expert, tokens in order within each: expert e's rows are [start[e], start[e + 1]) */
    for (int i = 0; i < NK; i++) start[sel[i] + 1]++;
    for (int e = 0; e < E; e++) start[e + 1] += start[e];
    int *fill = xmalloc(sizeof(int) * E);
    memcpy(fill, start, sizeof(int) * E);
    for (int i = 0; i < NK; i++) { slot[i] = fill[sel[i]]++; rows[slot[i]] = i / k; }
    float *xg = xmalloc(sizeof(float) * NK * D), *y = xmalloc(sizeof(float) * NK * D);  /* (N k, D) each */
    float *g = xmalloc(sizeof(float) * NK * Fe), *u = xmalloc(sizeof(float) * NK * Fe);  /* (N k, Fe_local) each */
    be->gather_rows(xg, xb, rows, NK, D);
    for (int e = 0; e < E; e++) {   /* one grouped GEMM per expert over its tokens */
        int r0 = start[e], n = start[e + 1] - r0;
        if (!n) continue;
        size_t we = (size_t)e * Fe * D * ws;   /* bytes to expert e's (Fe_local, D) / (D, Fe_local) */
        be->matmuls(xg + (size_t)r0 * D, n, D,
                    (MatmulOut[]){{g + (size_t)r0 * Fe, (char *)w->e_gate + we, NULL, Fe},
                                  {u + (size_t)r0 * Fe, (char *)w->e_up + we, NULL, Fe}}, 2, wt);   /* column-parallel */
    }
    be->swiglu(g, g, u, (size_t)NK * Fe);
    be->round_to(g, (size_t)NK * Fe, wt);                                              /* matmul input */
    for (int e = 0; e < E; e++) {
        int r0 = start[e], n = start[e + 1] - r0;
        if (n) be->matmul(y + (size_t)r0 * D, g + (size_t)r0 * Fe, (char *)w->e_down + (size_t)e * D * Fe * ws, NULL,
                          wt, n, Fe, D, m->moe_leaves);                                  /* row-parallel: partial */
    }
    model_tp_sum(m, y, (size_t)NK * D);   /* before the combine: tp invariant (see the top) */
    for (int t = 0; t < N; t++) {         /* each token's choices in rank order */
        float *o = out + (size_t)t * D;
        for (int d = 0; d < D; d++) o[d] = 0.0f;
        for (int j = 0; j < k; j++) {
            const float *yj = y + (size_t)slot[t * k + j] * D, wj = wk[t * k + j];
            for (int d = 0; d < D; d++) o[d] += wj * yj[d];
        }
    }
    if (c->shared_dim) shared_expert(m, w, xb, N, out);
    free(logits); free(p); free(wk); free(sel); free(slot); free(rows); free(start); free(fill);
    free(xg); free(y); free(g); free(u);
}
