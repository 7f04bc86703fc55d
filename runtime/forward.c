/* forward.c — THE forward pass (see model.h): one per-layer forward, the stage input (embedding or
 * the previous stage's activations), the heads, and the vocab-parallel log-softmax. Generation,
 * eval, scoring and training all run these functions; training (train/grad.c) only chooses where
 * each layer's activations are kept, generation where keys and values live (the paged cache).
 * Kernels are reached through m->be; the collectives are the visible model_tp_sum / comm_ calls.
 * Memory: every buffer a kernel gets is the backend's (the run state, the weights, the KV pool and
 * the callers' scratch); host control flow (sequence starts, each sequence's first position) reads
 * host copies, and a forward uploads its positions, tokens and logit rows in one copy.
 *
 * Tensor parallel (Megatron's column / row split, ARCHITECTURE.md): q/k/v and gate/up are
 * column-parallel (each rank computes its heads / its slice of F from the replicated input), o_proj
 * and down_proj row-parallel (each rank holds a partial sum of the (N, D) output), so each layer has
 * two tp sums. They are model_tp_sum: the ranks' partials added by one fixed tree, never in the order
 * an all-reduce algorithm picks, so the same tokens give the same bits at every batch size, in
 * generation and in training, at any tp. And the same bits at every tp that divides TP_LEAVES
 * (kernels.h): the row-parallel matmuls and the vocabulary's sums run as m->*_leaves leaves, each
 * rank's partial is a subtree of 1x1's pairwise tree, and the tp sum adds the subtrees by that tree.
 *
 * Precision (m->dtype = BF16; every round_to below is a no-op in F32): the weights are bf16 and
 * every matmul's input is rounded to bf16 just before the matmul (the norms' outputs xb1, xb2 and
 * the final xb, the attention output, silu(gate) * up), so each product of a matmul is a product of
 * two bf16 values, exact in fp32, summed in fp32: the function torch.autocast(bfloat16) computes,
 * and the one a bf16 GEMM on a GPU computes. Everything else stays fp32: the residual stream (x_in,
 * x_mid, the embedding's rows), RMSNorm's statistics, q/k/v, Qwen3's per-head q/k norms and RoPE,
 * attention scores, softmax and the KV cache, the matmuls' outputs and their tp sums, logits,
 * log-softmax, logprobs, values.
 * Training keeps the rounded values (they are what each matmul read), so its gradients are those
 * of exactly this function; the rounding's own gradient is the identity (autocast's cast). */
#include "runtime/model.h"
#include "runtime/lora.h"
#include "runtime/util.h"
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

void model_tp_sum(const Model *m, float *buf, size_t n) { comm_all_reduce_sum_fixed(&m->mesh->tp_comm, buf, n); }

/* Sequence parallelism (LayerBatch.sp_full): the norm output xb (this rank's rows) gathered into
 * sp_full, which the column-parallel matmuls then read; without it xb itself (every row). */
static const float *sp_gather(const Model *m, const LayerBatch *b, const float *xb) {
    if (!b->sp_full) return xb;
    comm_all_gather_rows(&m->mesh->tp_comm, xb, b->sp_full, (size_t)b->N, (size_t)m->cfg.dim);
    return b->sp_full;
}
/* A row-parallel output's tp sum, xo (N, D) partial in: every row (model_tp_sum), or with sequence
 * parallelism this rank's rows in xo's first rows (the reduce-scatter: the same tree, the same bits) */
static void sp_tp_sum(const Model *m, const LayerBatch *b, float *xo) {
    if (b->sp_full) comm_reduce_scatter_rows_fixed(&m->mesh->tp_comm, xo, (size_t)b->N, (size_t)m->cfg.dim);
    else model_tp_sum(m, xo, (size_t)b->N * m->cfg.dim);
}

void model_stage_input(const Model *m, const LayerBatch *b, const int *tokens, float *x) {
    const Comm *pp = &m->mesh->pp_comm;
    int D = m->cfg.dim, N = b->N, rows = b->sp_full ? b->sp_hi - b->sp_lo : N;
    if (m->is_first) {
        float *e = b->sp_full ? b->sp_full : x;                                          /* (N, D) */
        m->be->embedding(e, m->w.embed, m->dtype, tokens, N, D, m->vocab_start, m->vocab_local); /* rows this rank owns */
        sp_tp_sum(m, b, e);                                                               /* vocab-parallel lookup */
        if (b->sp_full) m->be->copy(x, e, (size_t)rows * D);
    } else {
        comm_recv(pp, x, sizeof(float) * rows * D, pp->rank - 1);                       /* activations from stage s-1 */
    }
}

/* LoRA's term on projection t of layer l (runtime/lora.h), x (N, n_in) its input, y (N, n_out) its
 * output: u = scale * x A^T (N, r), kept in a->lora_u for the backward, then y += u B^T. A
 * row-parallel projection's x and A hold this rank's input columns: u is their tp sum (the fixed
 * tree) and tp rank 0 alone adds the term to its partial y, which the layer's tp sum then adds once. */
static void lora_add(const Model *m, const LayerBatch *b, const LayerActs *a, int l, int t, const float *x, int n_in,
                     float *y, int n_out) {
    const Lora *lo = m->lora;
    if (!lo || !lo->enabled || !lo->A[l * LORA_TARGETS + t]) return;
    CHECK(a->lora_u && b->lora_tmp);   /* the run state or the activations were sized with the adapters */
    const Backend *be = m->be;
    int N = b->N, r = lo->r, rowp = t == LORA_O || t == LORA_DOWN;
    float *u = a->lora_u + (size_t)t * N * r;
    if (b->lora_key) {   /* training: PEFT's lora_dropout on the adapter's input (the base reads x itself) */
        int tp = m->mesh->tp, col0 = rowp ? m->mesh->tp_rank * n_in : 0;
        be->dropout(b->lora_xd, x, N, n_in, col0, rowp ? n_in * tp : n_in, lo->dropout,
                    lora_target_key(b->lora_key, m->layer_start + l, t, rowp ? n_in * tp : n_in));
        x = b->lora_xd;
    }
    be->matmul(u, x, lo->A[l * LORA_TARGETS + t], NULL, DTYPE_F32, N, n_in, r, 1);
    if (rowp) model_tp_sum(m, u, (size_t)N * r);
    be->scale(u, lo->scale, (size_t)N * r);
    if (rowp && m->mesh->tp_rank != 0) return;
    be->matmul(b->lora_tmp, u, lo->B[l * LORA_TARGETS + t], NULL, DTYPE_F32, N, r, n_out, 1);
    be->add_to(y, y, b->lora_tmp, (size_t)N * n_out);
}

void model_layer_forward(const Model *m, int l, const LayerBatch *b, const LayerActs *a, float *x_out) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    const LayerWeights *w = &m->w.layers[l];
    DType wt = m->dtype;
    int N = b->N, D = c->dim, Dh = c->head_dim, Fl = m->hidden_local;
    int Hl = m->n_heads_local, Hkvl = m->n_heads_kv_local, qd = Hl * Dh, kvd = Hkvl * Dh;
    int window = config_layer_window(c, m->layer_start + l) ? c->sliding_window : 0;
    int rows = b->sp_full ? b->sp_hi - b->sp_lo : N;   /* the residual stream's rows here */
    size_t RD = (size_t)rows * D;
    const int *start = b->seq_start;
    int first = start[0];
    float *xo = b->xo;   /* (N, D) */

    /* attention block: x_mid = x_in + o_proj(attn(rope(q), rope(k), v)) */
    be->rmsnorm(a->xb1, a->x_in, w->attn_norm, wt, rows, D, c->norm_eps);
    be->round_to(a->xb1, RD, wt);                                                      /* matmul input */
    const float *xb = sp_gather(m, b, a->xb1);                                         /* (N, D) */
    float *q = c->qk_norm ? a->q_pre : a->q, *k = c->qk_norm ? a->k_pre : a->k;      /* the projections' outputs */
    be->matmuls(xb, N, D, (MatmulOut[]){{q, w->wq, w->bq, qd}, {k, w->wk, w->bk, kvd}, {a->v, w->wv, w->bv, kvd}}, 3,
                wt);                                                                     /* column-parallel */
    lora_add(m, b, a, l, LORA_Q, xb, D, q, qd);
    lora_add(m, b, a, l, LORA_K, xb, D, k, kvd);
    lora_add(m, b, a, l, LORA_V, xb, D, a->v, kvd);
    if (c->qk_norm) {   /* qwen3: every q and k head RMS-normed over its Dh (rows of Dh), then RoPE */
        be->rmsnorm(a->q, q, w->q_norm, wt, N * Hl, Dh, c->norm_eps);
        be->rmsnorm(a->k, k, w->k_norm, wt, N * Hkvl, Dh, c->norm_eps);
    }
    be->rope(a->q, b->rope, N, Hl, Dh);
    be->rope(a->k, b->rope, N, Hkvl, Dh);
    be->round_to(a->k, (size_t)N * kvd, m->kv_dtype);                                 /* --kv-dtype: where produced */
    be->round_to(a->v, (size_t)N * kvd, m->kv_dtype);
    if (b->kv) {   /* keys: the paged cache, this step's rows stored into their slots first; every sequence at once */
        size_t off = dtype_size(b->kv->dtype) * l * b->kv->layer_stride;
        void *kc = (char *)b->kv->k + off, *vc = (char *)b->kv->v + off;   /* (n_blocks, Hkvl, block, Dh) of kv dtype */
        be->kv_store_batch(kc, vc, a->k, a->v, &b->paged, Hkvl, Dh);
        be->attention_batch(a->att, a->q, kc, vc, &b->paged, Hl, Hkvl, Dh, window, b->scratch, b->scratch_stride);
    } else {       /* keys: each sequence's own rows; sequences in parallel where the backend allows it, a lone
                    * one over heads inside the kernel; each thread its own scratch */
#pragma omp parallel for schedule(dynamic) if (b->n_seqs > 1 && be->parallel_calls)
        for (int i = 0; i < b->n_seqs; i++) {
            size_t t0 = start[i] - first;
            int Tq = start[i + 1] - start[i];
            KVLayout rows = kv_rows(Tq, Hkvl, Dh);
            be->attention(a->att + t0 * qd, a->q + t0 * qd, a->k + t0 * kvd, a->v + t0 * kvd, &rows, Tq, 0, Hl, Hkvl, Dh,
                          window, b->scratch + (size_t)omp_get_thread_num() * b->scratch_stride);
        }
    }
    be->round_to(a->att, (size_t)N * qd, wt);                                          /* matmul input */
    be->matmul(xo, a->att, w->wo, NULL, wt, N, qd, D, m->o_leaves);                    /* row-parallel: partial */
    lora_add(m, b, a, l, LORA_O, a->att, qd, xo, D);
    sp_tp_sum(m, b, xo);
    be->add_to(a->x_mid, a->x_in, xo, RD);
    /* MLP block: x_out = x_mid + down(silu(gate(xb2)) * up(xb2)) */
    be->rmsnorm(a->xb2, a->x_mid, w->mlp_norm, wt, rows, D, c->norm_eps);
    be->round_to(a->xb2, RD, wt);                                                      /* matmul input */
    xb = sp_gather(m, b, a->xb2);                                                      /* (N, D) */
    if (c->moe != MOE_NONE) {   /* MoE (runtime/moe.c): the output summed over tp already */
        CHECK(!b->sp_full);   /* refused with MoE: train_acts_init (adapters: the attention's only, lora_new) */
        moe_forward(m, l, xb, N, xo, b->moe_stats);
        be->add_to(x_out, a->x_mid, xo, RD);
        return;
    }
    be->matmuls(xb, N, D, (MatmulOut[]){{a->gate, w->w_gate, NULL, Fl}, {a->up, w->w_up, NULL, Fl}}, 2,
                wt);                                                                     /* column-parallel */
    lora_add(m, b, a, l, LORA_GATE, xb, D, a->gate, Fl);
    lora_add(m, b, a, l, LORA_UP, xb, D, a->up, Fl);
    be->swiglu(a->act, a->gate, a->up, (size_t)N * Fl);
    be->round_to(a->act, (size_t)N * Fl, wt);                                          /* matmul input */
    be->matmul(xo, a->act, w->w_down, NULL, wt, N, Fl, D, m->down_leaves);             /* row-parallel: partial */
    lora_add(m, b, a, l, LORA_DOWN, a->act, Fl, xo, D);
    sp_tp_sum(m, b, xo);
    be->add_to(x_out, a->x_mid, xo, RD);
}

void model_head(const Model *m, const LayerBatch *sp, float *out, float *xb, const float *x, int R) {
    const ModelConfig *c = &m->cfg;
    const Backend *be = m->be;
    int lo = sp && sp->sp_full ? sp->sp_lo : 0, rows = sp && sp->sp_full ? sp->sp_hi - lo : R;
    float *mine = xb + (size_t)lo * c->dim;                                              /* (rows, D) */
    be->rmsnorm(mine, x, m->w.final_norm, m->dtype, rows, c->dim, c->norm_eps);
    be->round_to(mine, (size_t)rows * c->dim, m->dtype);                               /* matmul input */
    if (rows < R) comm_all_gather_rows(&m->mesh->tp_comm, mine, xb, (size_t)R, (size_t)c->dim); /* every row */
    if (m->head == HEAD_SCORE) {
        be->matmul(out, xb, m->w.score, NULL, lora_score_dtype(m), R, c->dim, 1, 1);     /* replicated */
        return;
    }
    be->matmul(out, xb, m->w.lm_head, NULL, m->dtype, R, c->dim, m->vocab_local, 1);   /* vocab-parallel logits */
    be->mask_cols(out, R, m->vocab_local, c->vocab_size - m->vocab_start);             /* padded rows -> -inf */
}

/* ---- inference: the run state's one reused set of buffers ------------------------------------ */

/* Layer buffers of RunState for the rows from g0: the residual updated in place, q and k normed in place. */
static LayerActs run_acts(const Model *m, const RunState *s, size_t g0) {
    size_t D = m->cfg.dim, qd = (size_t)m->n_heads_local * m->cfg.head_dim;
    size_t kvd = (size_t)m->n_heads_kv_local * m->cfg.head_dim, F = m->hidden_local;
    float *x = s->x + g0 * D, *xb = s->xb + g0 * D, *hb = s->hb + g0 * F;
    size_t lr = (size_t)m->lora_r;
    float *q = s->q + g0 * qd, *k = s->k + g0 * kvd;   /* qwen3's q/k norms: in place */
    return (LayerActs){x, xb, q, k, s->v + g0 * kvd, s->att + g0 * qd, x, xb, hb, s->hb2 + g0 * F, hb, q, k,
                       s->lora_u + g0 * LORA_TARGETS * lr};
}

/* This stage's part of the forward for sequences [lo, hi) of the batch: receive (or embed), run
 * the local layers, send (or compute logits). Buffers are used at the group's token offset, so
 * several groups can be in flight on different stages. row0: index of the group's first logit row.
 * pos, tokens (N) and rows (the logit rows): the whole batch's, in the backend's memory. */
static void stage_forward(Model *m, RunState *s, KVCache *kv, const Batch *b, int lo, int hi, int row0,
                          const int *pos, const int *tokens, const int *rows, const int *seq) {
    const ModelConfig *c = &m->cfg;
    int D = c->dim, Dh = c->head_dim;
    const int *start = b->seq_start;
    size_t g0 = start[lo];                               /* the group's first token */
    int N = start[hi] - start[lo];
    LayerActs a = run_acts(m, s, g0);
    size_t lw = m->lora_width;
    LayerBatch lb = {N, hi - lo, start + lo, pos + g0, s->rope + g0 * Dh, b->tables ? kv : NULL, {0}, s->xo + g0 * D,
                     s->scratch, (size_t)m->n_heads_local * s->max_seq, NULL, 0, 0, s->lora_tmp + g0 * lw, 0, NULL, NULL};
    if (b->tables)
        lb.paged = (PagedBatch){b->tables, b->table_stride, kv->block, seq + g0, pos + g0, N, hi - lo, lo, start + lo,
                                s->ids_host + g0, kv->dtype};
    m->be->rope_table(s->rope + g0 * Dh, lb.pos, m->inv_freq, N, Dh);
    model_stage_input(m, &lb, tokens + g0, a.x_in);
    for (int l = 0; l < m->n_layers_local; l++) model_layer_forward(m, l, &lb, &a, a.x_in);

    if (!m->is_last) {
        const Comm *pp = &m->mesh->pp_comm;
        comm_send(pp, a.x_in, sizeof(float) * N * D, pp->rank + 1);                     /* to stage s+1 */
        return;
    }
    /* the head only on the rows asked for (all of them when logit_rows is NULL) */
    int R = 0, out_cols = m->head == HEAD_SCORE ? 1 : m->vocab_local;
    const float *hx = a.x_in;
    if (b->logit_rows) {
        while (row0 + R < b->n_logit_rows && b->logit_rows[row0 + R] < start[hi]) R++;
        m->be->gather_rows(lb.xo, s->x, rows + row0, R, D);
        hx = lb.xo;
    } else {
        R = N;
    }
    model_head(m, NULL, s->logits + (size_t)row0 * out_cols, a.xb1, hx, R);
}

void model_forward_batch(Model *m, RunState *s, KVCache *kv, const Batch *b) {
    int n_seqs = b->n_seqs, N = b->seq_start[n_seqs], R = b->logit_rows ? b->n_logit_rows : 0;
    CHECK(N <= s->max_tokens && R <= N);
    CHECK(!m->z3 || m->z3->full);   /* ZeRO-3: inference runs between model_shards_gather_all and _release */
    /* positions (N), tokens (N), logit rows (R), each row's sequence (N): staged on the host, then
     * one copy to the backend */
    int *pos = s->ids_host;
    for (int i = 0; i < n_seqs; i++) {
        int p0 = b->pos0 ? b->pos0[i] : 0;
        CHECK(p0 + b->seq_start[i + 1] - b->seq_start[i] <= s->max_seq);
        for (int t = b->seq_start[i]; t < b->seq_start[i + 1]; t++) pos[t] = p0 + t - b->seq_start[i];
    }
    memcpy(pos + N, b->tokens, sizeof(int) * N);
    if (R) memcpy(pos + 2 * N, b->logit_rows, sizeof(int) * R);
    int *seq = pos + 2 * N + R, n_seq = b->tables ? N : 0;   /* the rows' sequences: for the paged cache only */
    for (int i = 0; i < n_seqs && n_seq; i++)
        for (int t = b->seq_start[i]; t < b->seq_start[i + 1]; t++) seq[t] = i;
    m->be->to_device(s->ids, pos, sizeof(int) * (2 * N + R + n_seq));
    const int *pos_d = s->ids, *tokens_d = s->ids + N, *rows_d = s->ids + 2 * N, *seq_d = s->ids + 2 * N + R;
    int pp = m->mesh->pp, G = b->n_micro < n_seqs ? b->n_micro : n_seqs;
    if (pp == 1 || G <= 1) {
        stage_forward(m, s, kv, b, 0, n_seqs, 0, pos_d, tokens_d, rows_d, seq_d);
        return;
    }
    /* Pipelined micro-batches: G contiguous groups of sequences; in slot t stage s runs group
     * t - s, so after pp - 1 slots of fill every stage works at once. */
    int *lo = xmalloc(sizeof(int) * (G + 1)), *row0 = xmalloc(sizeof(int) * (G + 1));
    for (int g = 0; g <= G; g++) lo[g] = (int)((long)n_seqs * g / G);
    for (int g = 0, r = 0; g < G; g++) {
        if (!b->logit_rows) { row0[g] = b->seq_start[lo[g]]; continue; }
        while (r < b->n_logit_rows && b->logit_rows[r] < b->seq_start[lo[g]]) r++;
        row0[g] = r;
    }
    for (int t = 0; t < G + pp - 1; t++) {
        int g = t - m->mesh->pp_rank;
        if (g >= 0 && g < G) stage_forward(m, s, kv, b, lo[g], lo[g + 1], row0[g], pos_d, tokens_d, rows_d, seq_d);
    }
    free(lo);
    free(row0);
}

void model_forward(Model *m, const int *tokens, const int *seq_start, int n_seqs) {
    Batch b = {n_seqs, tokens, seq_start, NULL, NULL, 0, NULL, 0, 1};
    model_forward_batch(m, &m->s, NULL, &b);
}

/* ---- vocab-parallel log-softmax pieces ---------------------------------------------------- */

void model_logits_lse(const Model *m, const float *logits, int N, float T, float *lse, float *sum) {
    const Comm *tp = &m->mesh->tp_comm;
    m->be->row_max(lse, logits, N, m->vocab_local, T);
    comm_all_reduce_max(tp, lse, N);                  /* global row max: exact in any order */
    m->be->row_sumexp(sum, logits, lse, N, m->vocab_local, T, m->vocab_leaves);
    model_tp_sum(m, sum, N);                          /* global sum of exp, by the fixed tree */
    m->be->log_add(lse, sum, N);
}

void model_pair_logprobs(const Model *m, const float *logits, const float *lse, int n_pairs, const int *row,
                         const int *tok, float T, float *pick, float *lp) {
    const Backend *be = m->be;
    int Vl = m->vocab_local;
    /* the owner contributes the logit, the others 0: pair i reads row i, or row[i] (the host's row
     * picks the logits row, so one call per pair) */
    if (!row) be->pick_logits(pick, logits, tok, n_pairs, Vl, m->vocab_start, T);
    else
        for (int i = 0; i < n_pairs; i++)
            be->pick_logits(pick + i, logits + (size_t)row[i] * Vl, tok + i, 1, Vl, m->vocab_start, T);
    model_tp_sum(m, pick, (size_t)n_pairs);
    if (!row) be->sub_at(lp, pick, lse, NULL, n_pairs);
    else
        for (int i = 0; i < n_pairs; i++) be->sub_at(lp + i, pick + i, lse + row[i], NULL, 1);
}

void model_argmax(const Model *m, const float *logits, int N, int *ids, float *vals) {
    m->be->argmax_rows(ids, vals, logits, N, m->vocab_local, m->vocab_start);
    /* ties go to the lowest tp rank, i.e. the lowest vocab id, as torch.argmax */
    comm_all_reduce_maxloc(&m->mesh->tp_comm, vals, ids, N);
}

void model_target_logprobs(const Model *m, const LogprobBufs *w, const float *logits, int N, int n_pairs,
                           const int *row, const int *targets, float T, float *out) {
    CHECK(N <= w->rows && (row || n_pairs == N));
    model_logits_lse(m, logits, N, T, w->lse, w->pick);   /* pick: scratch until below */
    for (int i0 = 0; i0 < n_pairs; i0 += w->rows) {       /* one round when row is NULL */
        int k = n_pairs - i0 < w->rows ? n_pairs - i0 : w->rows;
        m->be->to_device(w->targets, targets + i0, sizeof(int) * k);
        model_pair_logprobs(m, logits, w->lse, k, row ? row + i0 : NULL, w->targets, T, w->pick, w->lp);
        m->be->to_host(out + i0, w->lp, sizeof(float) * k);
    }
    for (int i = 0; i < n_pairs; i++)
        if (targets[i] < 0) out[i] = 0.0f;
}

void model_score(Model *m, const int *tokens, const int *seq_start, int n_seqs, int n_pairs, const int *row,
                 const int *tok, Scores *out) {
    int N = seq_start[n_seqs];
    model_forward(m, tokens, seq_start, n_seqs);
    if (m->is_last) {
        const Backend *be = m->be;
        const LogprobBufs *w = &m->s.lp;
        model_target_logprobs(m, w, m->s.logits, N, n_pairs, row, tok, 1.0f, out->pair_logprob);
        /* the greedy token and its logprob, the max logit - lse, in w's targets and lp (free again) */
        model_argmax(m, m->s.logits, N, w->targets, w->lp);
        be->sub_at(w->lp, w->lp, w->lse, NULL, N);
        be->to_host(out->lse, w->lse, sizeof(float) * N);
        be->to_host(out->argmax, w->targets, sizeof(int) * N);
        be->to_host(out->argmax_logprob, w->lp, sizeof(float) * N);
    }
    const Comm *pp = &m->mesh->pp_comm;                  /* results from the last stage to all */
    comm_broadcast(pp, out->lse, sizeof(float) * N, pp->size - 1);
    comm_broadcast(pp, out->argmax, sizeof(int) * N, pp->size - 1);
    comm_broadcast(pp, out->argmax_logprob, sizeof(float) * N, pp->size - 1);
    if (n_pairs) comm_broadcast(pp, out->pair_logprob, sizeof(float) * n_pairs, pp->size - 1);
}
