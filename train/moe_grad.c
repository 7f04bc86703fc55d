/* moe_grad.c — the backward of a Mixture-of-Experts MLP block (runtime/moe.c): gradients through the
 * routed experts, the router (the routing weights are differentiable, the top-k selection is not:
 * a constant of the gradient, as in every framework) and qwen2_moe's shared expert and its sigmoid
 * gate. train/grad.c calls moe_backward in place of the dense MLP's backward.
 * Does not own: the forward (runtime/moe.c, rerun here from the block's input: the same bits, so
 * nothing of the block is kept per layer; one more block forward per backward), the residual and
 * the norm around the block (train/grad.c).
 *
 * Per token t, choices j = 0 .. k-1 of experts e_j with weights w_j and expert outputs y_j (summed
 * over tp), out_t = sum_j w_j y_j (+ sigmoid(s_t) ys_t). Given dout_t (the same on every tp rank):
 *   d y_j = w_j dout_t                  -> each expert's down / swiglu / gate / up backward over its
 *                                          grouped rows (one GEMM per expert), d x_g scattered back
 *                                          to the tokens in choice order
 *   d w_j = dout_t . y_j                -> d p_e (the chosen e; 0 for the others): w_j = p_ej, or with
 *                                          norm_topk w_j = p_ej / S, S = sum_i p_ei, so
 *                                          d p_ej = (d w_j - sum_i d w_i w_i) / S
 *   d logits = p * (d p - sum_e p_e d p_e)   (softmax), router: d R += d logits^T xb
 * and the load-balancing loss (TrainActs.moe_aux_coef) adds its d p_e (aux_dp) for every token and e;
 * the router z-loss (ST-MoE; TrainActs.moe_z_coef) c mean_t lse_t^2 adds c 2 lse_t p_te / N to each
 * d logit (d lse / d logits = p).
 * Tensor parallel: each expert's slice gets its gradient from d y_j (whole on every rank: the tp
 * sum's backward is the identity) and gives this rank's partial of d xb, which the caller sums over
 * tp (the "copy" backward). The router and the shared gate are replicated and their d logits are
 * the same on every rank, so their weight gradients are too, and their term of d xb is added by tp
 * rank 0 alone (the caller's tp sum then counts it once).
 * Expert parallelism: d y goes to the experts' ranks and d x_g comes back by the forward's all-to-alls
 * (runtime/moe_ep.c); experts_backward says how the expert weights' gradients keep ep 1's bits.
 * LoRA (adapters on the attention only, runtime/lora.c): the base is frozen, g's expert, router and
 * shared-expert tensors are NULL, and every weight-gradient GEMM is skipped (matmul_backward's NULL
 * dW): what remains is d xb through the experts, router and shared expert, which the adapters of the
 * layers below need; no per-source buffer is made and moe_ep_fold_grads has nothing to fold. */
#include "train/grad.h"
#include "runtime/moe.h"
#include "runtime/util.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* d logits (N, E) of the router from d w (N, k) (see the top) */
static void router_dlogits(const ModelConfig *c, const MoeRun *r, const float *dw, const float *aux_dp, float *dlog) {
    int E = c->n_experts, k = c->n_experts_tok;
    for (int t = 0; t < r->N; t++) {
        const float *p = r->p + (size_t)t * E, *w = r->w + t * k, *dwt = dw + t * k;
        const int *sel = r->sel + t * k;
        float *dl = dlog + (size_t)t * E, dot = 0.0f;
        for (int e = 0; e < E; e++) dl[e] = 0.0f;   /* d p, then d logits in place */
        if (c->norm_topk) {
            float S = 0.0f, wdw = 0.0f;
            for (int j = 0; j < k; j++) { S += p[sel[j]]; wdw += dwt[j] * w[j]; }
            for (int j = 0; j < k; j++) dl[sel[j]] = (dwt[j] - wdw) / S;
        } else {
            for (int j = 0; j < k; j++) dl[sel[j]] = dwt[j];
        }
        for (int e = 0; aux_dp && e < E; e++) dl[e] += aux_dp[e];   /* the load-balancing loss's, every e */
        for (int e = 0; e < E; e++) dot += p[e] * dl[e];
        for (int e = 0; e < E; e++) dl[e] = p[e] * (dl[e] - dot);
    }
}

/* The router z-loss of this block (ST-MoE, Zoph et al. 2022; Megatron-Core's z_loss_func):
 * z = mean over the N tokens of lse_t^2, lse_t = logsumexp of token t's router logits. Adds
 * coef d z / d logits = coef 2 lse_t p_te / N to dlog (N, E) and returns z (unscaled). */
static double zloss_dlogits(const MoeRun *r, int E, float coef, float *dlog) {
    double z = 0.0;
    for (int t = 0; t < r->N; t++) {
        float lse = r->lse[t], g = coef * 2.0f * lse / (float)r->N;
        z += (double)lse * lse;
        for (int e = 0; e < E; e++) dlog[(size_t)t * E + e] += g * r->p[(size_t)t * E + e];
    }
    return r->N ? z / r->N : 0.0;
}

/* The shared expert's backward: dxb (N, D) += its partial d xb (+ the gate's term on tp rank 0). */
static void shared_backward(const Model *m, const LayerWeights *w, LayerWeights *g, const MoeRun *r, const float *xb,
                            const float *dout, float *dxb) {
    const Backend *be = m->be;
    int N = r->N, D = m->cfg.dim, Fs = m->shared_dim_local;
    DType wt = m->dtype;
    float *dys = xmalloc(sizeof(float) * N * D), *ds = xmalloc(sizeof(float) * N);          /* (N, D), (N) */
    float *da = xmalloc(sizeof(float) * N * Fs), *dg = xmalloc(sizeof(float) * N * Fs);      /* (N, Fs) */
    float *du = xmalloc(sizeof(float) * N * Fs), *dx = xmalloc(sizeof(float) * N * D);
    for (int t = 0; t < N; t++) {
        float s = 1.0f / (1.0f + expf(-r->s_logit[t])), dot = 0.0f;
        const float *o = dout + (size_t)t * D, *y = r->s_y + (size_t)t * D;
        for (int d = 0; d < D; d++) { dys[(size_t)t * D + d] = s * o[d]; dot += o[d] * y[d]; }
        ds[t] = dot * s * (1.0f - s);
    }
    be->matmul_backward(da, g->s_down, NULL, dys, r->s_act, w->s_down, wt, N, Fs, D);
    be->swiglu_backward(dg, du, da, r->s_gate, r->s_up, (size_t)N * Fs);
    be->matmul_backward(dx, g->s_gate, NULL, dg, xb, w->s_gate, wt, N, D, Fs);
    be->add_to(dxb, dxb, dx, (size_t)N * D);
    be->matmul_backward(dx, g->s_up, NULL, du, xb, w->s_up, wt, N, D, Fs);
    be->add_to(dxb, dxb, dx, (size_t)N * D);
    be->matmul_backward(dx, g->s_router, NULL, ds, xb, w->s_router, wt, N, D, 1);     /* replicated */
    if (m->mesh->tp_rank == 0) be->add_to(dxb, dxb, dx, (size_t)N * D);
    free(dys); free(ds); free(da); free(dg); free(du); free(dx);
}

/* The local experts' backward: dy (NK, D) home's grouped rows to the experts' ranks, each local
 * expert's down / swiglu / gate / up backward over its rows, dxg (NK, D) back home (grouped). The
 * weight gradients: at ep 1 into g, one matmul_backward per expert over its rows; at ep > 1 into
 * each source rank's own buffer (moe_ep_src_grads), one call per (expert, source): the rows rank s
 * would have at ep 1, so moe_ep_fold_grads's tree over the sources adds what dp's tree adds at ep 1. */
static void experts_backward(const Model *m, int l, LayerWeights *g, const MoeRun *r, float *dy, float *dxg) {
    const Backend *be = m->be;
    DType wt = m->dtype;
    const LayerWeights *w = &m->w.layers[l];
    int D = m->cfg.dim, Fe = m->moe_dim_local, P = m->mesh->ep, El = m->n_experts_local;
    size_t R = (size_t)r->R, ws = dtype_size(wt), FeD = (size_t)Fe * D;
    float *dyl = xmalloc(sizeof(float) * (R * D + 1)), *dxl = xmalloc(sizeof(float) * (R * D + 1));   /* (R, D) */
    float *tmp = xmalloc(sizeof(float) * (R * D + 1)), *dact = xmalloc(sizeof(float) * (R * Fe + 1)); /* (R, Fe) */
    float *dg = xmalloc(sizeof(float) * (R * Fe + 1)), *du = xmalloc(sizeof(float) * (R * Fe + 1));
    moe_ep_dispatch(m, r, dy, dyl, D);
    for (int e = 0; e < El; e++)
        for (int s = 0; s < P; s++) {   /* at ep 1: each expert over all its rows */
            size_t r0 = (size_t)r->loff[e * P + s];
            int ne = r->loff[e * P + s + 1] - r->loff[e * P + s];
            if (!ne) continue;
            float *gw[3];   /* the gradients of local expert e's gate, up, down (fp32) */
            for (int t = 0; t < 3; t++) {
                float *ge = t == 0 ? g->e_gate : t == 1 ? g->e_up : g->e_down;
                gw[t] = !ge ? NULL : P == 1 ? ge + e * FeD : moe_ep_src_grads(m, l, t, s) + e * FeD;
            }
            size_t we = (size_t)e * FeD * ws;   /* bytes to local expert e's weights */
            be->matmul_backward(dact + r0 * Fe, gw[2], NULL, dyl + r0 * D, r->act + r0 * Fe, (char *)w->e_down + we, wt,
                                ne, Fe, D);
            be->swiglu_backward(dg + r0 * Fe, du + r0 * Fe, dact + r0 * Fe, r->gate + r0 * Fe, r->up + r0 * Fe,
                                (size_t)ne * Fe);
            be->matmul_backward(dxl + r0 * D, gw[0], NULL, dg + r0 * Fe, r->xg + r0 * D, (char *)w->e_gate + we, wt, ne,
                                D, Fe);
            be->matmul_backward(tmp + r0 * D, gw[1], NULL, du + r0 * Fe, r->xg + r0 * D, (char *)w->e_up + we, wt, ne,
                                D, Fe);
        }
    be->add_to(dxl, dxl, tmp, R * D);
    moe_ep_return(m, r, dxl, dxg, D);
    free(dyl); free(dxl); free(tmp); free(dact); free(dg); free(du);
}

void moe_backward(const Model *m, int l, const float *xb, int N, const float *dout, float *dxb, LayerWeights *g,
                  const float *aux_dp, float z_coef, double *z_sum) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    const LayerWeights *w = &m->w.layers[l];
    DType wt = m->dtype;
    int D = c->dim, E = c->n_experts, k = c->n_experts_tok;
    size_t NK = (size_t)N * k, ND = (size_t)N * D;
    MoeRun r = {0};
    float *out = xmalloc(sizeof(float) * ND);   /* (N, D) the block's output again: unused */
    moe_run(m, l, xb, N, &r, out);
    float *dy = xmalloc(sizeof(float) * (NK * D + 1)), *dxg = xmalloc(sizeof(float) * (NK * D + 1)); /* (NK, D) */
    float *tmp = xmalloc(sizeof(float) * (ND + 1));                                                   /* (N, D) */
    float *dw = xmalloc(sizeof(float) * NK), *dlog = xmalloc(sizeof(float) * N * E);      /* (N, k), (N, E) */
    for (int t = 0; t < N; t++)
        for (int j = 0; j < k; j++) {
            int i = t * k + j;
            const float *o = dout + (size_t)t * D, *y = r.y + (size_t)r.slot[i] * D;
            float *d = dy + (size_t)r.slot[i] * D, dot = 0.0f;
            for (int x = 0; x < D; x++) { d[x] = r.w[i] * o[x]; dot += o[x] * y[x]; }
            dw[i] = dot;
        }
    experts_backward(m, l, g, &r, dy, dxg);
    for (int t = 0; t < N; t++) {   /* back to the tokens, choices in rank order */
        float *d = dxb + (size_t)t * D;
        for (int x = 0; x < D; x++) d[x] = 0.0f;
        for (int j = 0; j < k; j++) {
            const float *s = dxg + (size_t)r.slot[t * k + j] * D;
            for (int x = 0; x < D; x++) d[x] += s[x];
        }
    }
    router_dlogits(c, &r, dw, aux_dp, dlog);
    if (z_coef != 0.0f) *z_sum += zloss_dlogits(&r, E, z_coef, dlog);
    be->matmul_backward(tmp, g->router, NULL, dlog, xb, w->router, wt, N, D, E);        /* replicated */
    if (m->mesh->tp_rank == 0) be->add_to(dxb, dxb, tmp, ND);
    if (c->shared_dim) shared_backward(m, w, g, &r, xb, dout, dxb);
    free(out); free(dy); free(dxg); free(tmp); free(dw); free(dlog);
    moe_run_free(&r);
}
