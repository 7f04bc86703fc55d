/* moe_ep.c — expert parallelism (--ep, runtime/mesh.h) for the MoE block: the all-to-all that takes
 * each rank's routed rows to the ranks holding their experts and brings the outputs home
 * (runtime/moe.c's forward, train/moe_grad.c's backward), the lockstep that keeps an ep group's
 * ranks making the same calls (moe_drain), and the per-source expert gradients of training.
 * Does not own: routing, the experts' arithmetic, the combine (runtime/moe.c).
 *
 * Layout (Megatron's: EP inside DP): ep rank q holds experts [q E/ep, (q+1) E/ep), every rank of the
 * ep group routes its own tokens (the router is replicated) and groups its N k choices by expert,
 * tokens in order (MoeRun.start). The plan (moe_ep_plan) is one all-to-all of counts: rank s tells
 * each q how many rows it has for each of q's experts, and whether it is idle (moe_drain). The
 * dispatch (moe_ep_dispatch) is one MPI_Alltoallv in that order: by source rank, then expert, tokens
 * in order; the receiver reorders the rows expert-major (expert, then source, then token) so each
 * local expert runs one grouped GEMM over its rows from every source. The return (moe_ep_return) is
 * the reverse: home gets its rows back in its own grouped order, and combines them as at ep 1.
 * A matmul's rows are independent, so every output row has ep 1's bits. The experts' down outputs are
 * summed over tp on the expert's side, before the return (the tp peers of a rank hold the same rows
 * in the same order: their sources are tp peers, which route identically), so the return carries
 * whole rows and the home rank's combine reads what ep 1's reads.
 * At ep 1 the plan is each expert's count, the dispatch and return are copies.
 *
 * Lockstep: every rank of an ep group must make the same sequence of exchanges. Training steps are
 * in step by construction (every dp rank runs the same micro-batches, forward and backward, through
 * the same layers). Inference is not: generate's dp ranks decode their own prompts and finish at
 * different steps, eval's and a rollout's dp ranks run different numbers of batches. A rank whose
 * work is done calls moe_drain before anything else collective: it joins every exchange with 0 rows
 * (and computes its experts for the others' rows), a pass over its stage's layers at a time, saying
 * "idle" in the plan; once every rank of the group says idle in one plan (necessarily a pass's first
 * layer: a working rank goes idle only between passes), all leave together. */
#include "runtime/moe.h"
#include "kernels/kernels.h"
#include "runtime/util.h"
#include <stdlib.h>
#include <string.h>

int moe_ep_plan(const Model *m, MoeRun *r, int idle) {
    const Mesh *mesh = m->mesh;
    int P = mesh->ep, El = m->n_experts_local, all_idle = 1;
    int *snd = xmalloc(sizeof(int) * 2 * P * (El + 1)), *rcv = snd + P * (El + 1);   /* (P, El + 1) each */
    for (int q = 0; q < P; q++) {
        for (int j = 0; j < El; j++) snd[q * (El + 1) + j] = r->start[q * El + j + 1] - r->start[q * El + j];
        snd[q * (El + 1) + El] = idle;
    }
    comm_all_to_all_int(&mesh->ep_comm, snd, rcv, El + 1);
    r->cnt = xmalloc(sizeof(int) * P * El);
    r->loff = xmalloc(sizeof(int) * (P * El + 1));
    for (int s = 0; s < P; s++) {
        for (int j = 0; j < El; j++) r->cnt[s * El + j] = rcv[s * (El + 1) + j];
        all_idle &= rcv[s * (El + 1) + El];
    }
    r->loff[0] = 0;
    for (int j = 0; j < El; j++)
        for (int s = 0; s < P; s++) r->loff[j * P + s + 1] = r->loff[j * P + s] + r->cnt[s * El + j];
    r->R = r->loff[P * El];
    free(snd);
    return all_idle;
}

/* the all-to-all of (rows, w) arrays between home's grouped order and the experts' expert-major
 * order; back: home <- local */
static void exchange(const Model *m, const MoeRun *r, float *home, float *local, int w, int back) {
    int P = m->mesh->ep, El = m->n_experts_local;
    size_t NK = (size_t)r->N * m->cfg.n_experts_tok;
    if (P == 1) {   /* the same rows in the same order */
        if (back) memcpy(home, local, sizeof(float) * NK * w);
        else memcpy(local, home, sizeof(float) * NK * w);
        return;
    }
    /* counts and offsets in rows (an int: a rank has at most N k rows; in floats they could pass
     * INT_MAX), the floats' offsets in size_t */
    int *hn = xmalloc(sizeof(int) * 4 * P), *ho = hn + P, *ln = hn + 2 * P, *lo = hn + 3 * P;
    for (int q = 0, at = 0; q < P; q++) {
        hn[q] = r->start[(q + 1) * El] - r->start[q * El];
        ho[q] = r->start[q * El];
        ln[q] = 0;
        for (int j = 0; j < El; j++) ln[q] += r->cnt[q * El + j];
        lo[q] = at;
        at += ln[q];
    }
    float *stage = xmalloc(sizeof(float) * ((size_t)r->R * w + 1));   /* (R, w) by source, then expert */
    if (!back) comm_all_to_allv(&m->mesh->ep_comm, home, hn, ho, stage, ln, lo, w);
    for (int s = 0; s < P; s++)
        for (int j = 0, at = lo[s]; j < El; at += r->cnt[s * El + j++]) {
            float *st = stage + (size_t)at * w, *lc = local + (size_t)r->loff[j * P + s] * w;
            size_t bytes = sizeof(float) * (size_t)r->cnt[s * El + j] * w;
            if (back) memcpy(st, lc, bytes);
            else memcpy(lc, st, bytes);
        }
    if (back) comm_all_to_allv(&m->mesh->ep_comm, stage, ln, lo, home, hn, ho, w);
    free(stage);
    free(hn);
}
void moe_ep_dispatch(const Model *m, const MoeRun *r, float *home, float *local, int w) {
    exchange(m, r, home, local, w, 0);
}
void moe_ep_return(const Model *m, const MoeRun *r, float *local, float *home, int w) {
    exchange(m, r, home, local, w, 1);
}

void moe_drain(const Model *m) {
    if (m->cfg.moe == MOE_NONE || m->mesh->ep == 1) return;
    for (;;)
        for (int l = 0; l < m->n_layers_local; l++) {
            MoeRun r = {0};
            int done = moe_run_ep(m, l, NULL, 0, &r, NULL, 1);
            moe_run_free(&r);
            if (done) {
                CHECK(l == 0);
                return;
            }
        }
}

void moe_idle_pass(const Model *m) {
    for (int l = 0; m->cfg.moe != MOE_NONE && m->mesh->ep > 1 && l < m->n_layers_local; l++) {
        MoeRun r = {0};
        moe_run_ep(m, l, NULL, 0, &r, NULL, 0);
        moe_run_free(&r);
    }
}

/* ---- training: the expert gradients of each source rank apart ------------------------------------
 * (sources, L_local, {gate, up, down}, E_local, Fe_local D) floats, host (MoE runs on the CPU) */
static size_t per_source(const Model *m) {
    return (size_t)m->n_layers_local * 3 * m->n_experts_local * m->moe_dim_local * m->cfg.dim;
}
float *moe_ep_src_grads(const Model *m, int l, int t, int s) {
    CHECK(!m->lora);          /* LoRA: frozen experts, no weight gradient (train/moe_grad.c), no buffer */
    Model *mm = (Model *)m;   /* the buffer is the model's optional part, made on first use */
    if (!mm->moe_src_grads) mm->moe_src_grads = xcalloc(per_source(m) * m->mesh->ep, sizeof(float));
    size_t FeD = (size_t)m->moe_dim_local * m->cfg.dim;
    return mm->moe_src_grads + (size_t)s * per_source(m) + ((size_t)l * 3 + t) * m->n_experts_local * FeD;
}

size_t moe_ep_src_bytes(const Model *m) {
    /* LoRA: the experts are frozen (experts_backward computes no weight gradient), nothing is made */
    return m->cfg.moe == MOE_NONE || m->mesh->ep == 1 || m->lora ? 0 : sizeof(float) * per_source(m) * m->mesh->ep;
}

void moe_ep_fold_grads(const Model *m, ModelWeights *grads) {
    if (!m->moe_src_grads) return;
    size_t n = per_source(m), FeD = (size_t)m->moe_dim_local * m->cfg.dim, El = (size_t)m->n_experts_local;
    tree_sum(m->moe_src_grads, m->mesh->ep, n);   /* into source 0's: (s0 + s1) + (s2 + s3), the dp tree's */
    for (int l = 0; l < m->n_layers_local; l++) {
        LayerWeights *g = &grads->layers[l];
        float *dst[3] = {g->e_gate, g->e_up, g->e_down};
        for (int t = 0; t < 3; t++) {
            const float *src = moe_ep_src_grads(m, l, t, 0);
            for (size_t i = 0; i < El * FeD; i++) dst[t][i] += src[i];
        }
    }
    memset(m->moe_src_grads, 0, sizeof(float) * n * m->mesh->ep);
}
