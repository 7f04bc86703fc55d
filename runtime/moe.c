/* moe.c — the Mixture-of-Experts MLP block of the one forward (runtime/forward.c calls moe_forward
 * in place of the dense MLP when cfg.moe is set): Mixtral's block_sparse_moe, Qwen2-MoE's and
 * Qwen3-MoE's mlp (experts + router; qwen2_moe's sigmoid-gated shared expert).
 * Owns: routing (router logits, softmax and top-k in fp32, ties to the lower expert id, the top-k
 * renormalised when norm_topk), grouping the tokens by expert, the experts' grouped GEMMs and the
 * fixed-order combine, and what a block's forward keeps for its backward (MoeRun, runtime/moe.h).
 * Does not own: the weights' layout (runtime/model.c's spec table), the backward (train/moe_grad.c).
 *
 * Dropless and batch invariant: every token goes to its k experts, no capacity; an expert's rows are
 * its tokens gathered in token order and multiplied by one GEMM per expert (be->matmul's rows are
 * independent: a row's bits do not depend on the other rows), and each token's output is
 * sum_j w_j y_j added in the rank order j = 0 .. k-1 of its choices. So a token's output depends on
 * that token only: the same bits alone, in any batch, in generation and in scoring.
 * Expert parallelism (--ep): each rank holds E / ep experts; the rows go to their experts' ranks and
 * back by all-to-all (runtime/moe_ep.c, where the tp sum of the down outputs happens and why), the
 * same rows through the same GEMMs: ep 1's bits.
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
#include "runtime/moe.h"
#include "runtime/util.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Routes one token: p (E) = softmax(logits) in fp32, then the k largest (ties: lower id first, in
 * descending order: rank 0 is the largest), their weights renormalised to sum 1 when norm.
 * Returns logsumexp(logits) = max + log(sum exp(logits - max)). */
static float route(const float *logits, int E, int k, int norm, float *p, int *sel, float *w) {
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
    float s = 0.0f;
    for (int j = 0; norm && j < k; j++) s += w[j];
    for (int j = 0; norm && j < k; j++) w[j] /= s;
    return mx + logf(sum);
}

/* The shared expert (qwen2_moe), added to out (N, D): out += sigmoid(xb s_router^T) * down(silu(gate) * up). */
static void shared_expert(const Model *m, const LayerWeights *w, const float *xb, MoeRun *r, float *out) {
    const Backend *be = m->be;
    int N = r->N, D = m->cfg.dim, Fs = m->shared_dim_local;
    DType wt = m->dtype;
    be->matmuls(xb, N, D, (MatmulOut[]){{r->s_gate, w->s_gate, NULL, Fs}, {r->s_up, w->s_up, NULL, Fs}}, 2, wt);
    be->swiglu(r->s_act, r->s_gate, r->s_up, (size_t)N * Fs);
    be->round_to(r->s_act, (size_t)N * Fs, wt);                                       /* matmul input */
    be->matmul(r->s_y, r->s_act, w->s_down, NULL, wt, N, Fs, D, m->shared_leaves);    /* row-parallel: partial */
    model_tp_sum(m, r->s_y, (size_t)N * D);
    be->matmul(r->s_logit, xb, w->s_router, NULL, wt, N, D, 1, 1);                    /* replicated */
    for (int t = 0; t < N; t++) {
        float s = 1.0f / (1.0f + expf(-r->s_logit[t]));
        for (int d = 0; d < D; d++) out[(size_t)t * D + d] += s * r->s_y[(size_t)t * D + d];
    }
}

/* The routing of every token and the grouping by expert (r's routing fields) from xb. */
static void route_all(const Model *m, const LayerWeights *w, const float *xb, MoeRun *r) {
    const ModelConfig *c = &m->cfg;
    int N = r->N, E = c->n_experts, k = c->n_experts_tok, NK = N * k;
    float *logits = xmalloc(sizeof(float) * ((size_t)N * E + 1));                        /* (N, E) */
    if (N) m->be->matmul(logits, xb, w->router, NULL, m->dtype, N, c->dim, E, 1);      /* replicated router */
    for (int t = 0; t < N; t++)
        r->lse[t] = route(logits + (size_t)t * E, E, k, c->norm_topk, r->p + (size_t)t * E, r->sel + t * k, r->w + t * k);
    free(logits);
    /* group by expert, tokens in order within each: expert e's rows are [start[e], start[e + 1]) */
    memset(r->start, 0, sizeof(int) * (E + 1));
    for (int i = 0; i < NK; i++) r->start[r->sel[i] + 1]++;
    for (int e = 0; e < E; e++) r->start[e + 1] += r->start[e];
    int *fill = xmalloc(sizeof(int) * E);
    memcpy(fill, r->start, sizeof(int) * E);
    for (int i = 0; i < NK; i++) { r->slot[i] = fill[r->sel[i]]++; r->rows[r->slot[i]] = i / k; }
    free(fill);
}

int moe_run_ep(const Model *m, int l, const float *xb, int N, MoeRun *r, float *out, int idle) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    const LayerWeights *w = &m->w.layers[l];
    DType wt = m->dtype;
    int D = c->dim, E = c->n_experts, k = c->n_experts_tok, Fe = m->moe_dim_local, Fs = m->shared_dim_local;
    int P = m->mesh->ep, El = m->n_experts_local;
    size_t NK = (size_t)N * k, ws = dtype_size(wt);
    r->N = N;
    r->sel = xmalloc(sizeof(int) * (NK + 1));
    r->slot = xmalloc(sizeof(int) * (NK + 1));
    r->rows = xmalloc(sizeof(int) * (NK + 1));
    r->start = xmalloc(sizeof(int) * (E + 1));
    r->p = xmalloc(sizeof(float) * ((size_t)N * E + 1));
    r->lse = xmalloc(sizeof(float) * ((size_t)N + 1));
    r->w = xmalloc(sizeof(float) * (NK + 1));
    route_all(m, w, xb, r);
    float *home = xmalloc(sizeof(float) * (NK * D + 1));                               /* (NK, D) grouped */
    if (N) be->gather_rows(home, xb, r->rows, (int)NK, D);
    int all_idle = moe_ep_plan(m, r, idle);   /* runtime/moe_ep.c: every source's rows for my experts */
    size_t R = (size_t)r->R;
    float **f[] = {&r->xg, &r->gate, &r->up, &r->act, &r->yl, &r->y, &r->s_gate, &r->s_up, &r->s_act, &r->s_y,
                   &r->s_logit};
    size_t n[] = {R * D, R * Fe, R * Fe, R * Fe, R * D, NK * D, (size_t)N * Fs, (size_t)N * Fs, (size_t)N * Fs,
                  Fs ? (size_t)N * D : 0, Fs ? (size_t)N : 0};
    for (size_t i = 0; i < sizeof n / sizeof n[0]; i++) *f[i] = xmalloc(sizeof(float) * (n[i] ? n[i] : 1));
    moe_ep_dispatch(m, r, home, r->xg, D);
    free(home);
    for (int e = 0; e < El; e++) {   /* one grouped GEMM per local expert over its rows from every source */
        int r0 = r->loff[e * P], ne = r->loff[(e + 1) * P] - r0;
        if (!ne) continue;
        size_t we = (size_t)e * Fe * D * ws;   /* bytes to local expert e's (Fe_local, D) / (D, Fe_local) */
        be->matmuls(r->xg + (size_t)r0 * D, ne, D,
                    (MatmulOut[]){{r->gate + (size_t)r0 * Fe, (char *)w->e_gate + we, NULL, Fe},
                                  {r->up + (size_t)r0 * Fe, (char *)w->e_up + we, NULL, Fe}}, 2, wt);   /* column-parallel */
    }
    be->swiglu(r->act, r->gate, r->up, R * Fe);
    be->round_to(r->act, R * Fe, wt);                                                  /* matmul input */
    for (int e = 0; e < El; e++) {
        int r0 = r->loff[e * P], ne = r->loff[(e + 1) * P] - r0;
        if (ne) be->matmul(r->yl + (size_t)r0 * D, r->act + (size_t)r0 * Fe, (char *)w->e_down + (size_t)e * D * Fe * ws,
                           NULL, wt, ne, Fe, D, m->moe_leaves);                          /* row-parallel: partial */
    }
    model_tp_sum(m, r->yl, R * D);   /* on the experts' side, before the combine: tp invariant (see the top) */
    moe_ep_return(m, r, r->yl, r->y, D);
    for (int t = 0; out && t < N; t++) {    /* each token's choices in rank order */
        float *o = out + (size_t)t * D;
        for (int d = 0; d < D; d++) o[d] = 0.0f;
        for (int j = 0; j < k; j++) {
            const float *yj = r->y + (size_t)r->slot[t * k + j] * D, wj = r->w[t * k + j];
            for (int d = 0; d < D; d++) o[d] += wj * yj[d];
        }
    }
    if (Fs && N) shared_expert(m, w, xb, r, out);   /* N 0: every tp peer idle too, no tp sum to join */
    return all_idle;
}

void moe_run(const Model *m, int l, const float *xb, int N, MoeRun *r, float *out) {
    moe_run_ep(m, l, xb, N, r, out, 0);
}

void moe_run_free(MoeRun *r) {
    void *p[] = {r->p, r->lse, r->w, r->xg, r->gate, r->up, r->act, r->yl, r->y, r->s_gate, r->s_up, r->s_act, r->s_y,
                 r->s_logit, r->sel, r->slot, r->rows, r->start, r->cnt, r->loff};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
    memset(r, 0, sizeof *r);
}

void moe_forward(const Model *m, int l, const float *xb, int N, float *out, double *stats) {
    MoeRun r = {0};
    moe_run(m, l, xb, N, &r, out);
    int E = m->cfg.n_experts, k = m->cfg.n_experts_tok;
    for (int i = 0; stats && i < N * k; i++) stats[r.sel[i]] += 1.0;
    for (int t = 0; stats && t < N; t++)
        for (int e = 0; e < E; e++) stats[E + e] += r.p[(size_t)t * E + e];
    moe_run_free(&r);
}
