/* grad.c — see grad.h. train_forward runs runtime/forward.c's functions (model_stage_input,
 * model_layer_forward, model_head) with one buffer per kept activation instead of one reused
 * buffer, so its logits carry the same bits as generation's; train_loss_backward mirrors it in
 * reverse, one backward kernel (kernels/cpu/backward.h, through m->be) per forward kernel.
 *
 * Tensor parallel: Megatron's conjugate pair of collectives (tensor_parallel/mappings.py). With
 * tp ranks r and a replicated input x (N, D):
 *   column-parallel  y_r = x W_r^T      (q/k/v, gate/up, lm_head: W split by output rows)
 *       forward  "copy":   x is used as is on every rank                         (identity)
 *       backward          dx = sum_r dy_r W_r: each rank holds one term          (tp all-reduce)
 *   row-parallel     y = sum_r h_r W_r^T  (o_proj, down: W split by input columns, h_r local)
 *       forward  "reduce": y = all-reduce of the partial products                 (tp all-reduce)
 *       backward          dh_r = dy W_r with dy the same on every rank            (identity)
 * So each layer has exactly two all-reduces forward (after o_proj and down) and two backward (the
 * input gradients of q/k/v and of gate/up), at the two norms' outputs. The vocab-parallel
 * embedding is a "reduce" (each rank looks up its rows, zeros elsewhere, then all-reduce), so its
 * backward is the identity: each rank adds dx into its own rows. Every dx on the residual stream
 * is therefore identical on all tp ranks, and so are the gradients of the replicated norms.
 *
 * Replicated kv heads (tp > Hkv): kv_rep = tp / Hkv ranks hold the same k/v head, each for a
 * different subset of the query heads that read it. Each computes a partial dk, dv (N, Dh) from its
 * query heads; the head's true gradient is their sum. We all-reduce dk and dv over the ranks
 * sharing the head (kv_comm) before the k/v matmul backward, so every replica accumulates the full
 * dWk, dbk, dWv, dbv (identical on all replicas, as the optimizer needs to keep them identical).
 * The input gradient dk W_k must then enter the tp all-reduce of dxb once, not kv_rep times: only
 * the first rank of kv_comm adds it. */
#include "train/grad.h"
#include "runtime/lora.h"
#include "runtime/util.h"
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* "copy" backward: the partial input-gradients of a column-parallel layer become the full sum. */
static void tp_copy_backward(const Model *m, float *dx, size_t n) { comm_all_reduce_sum(&m->mesh->tp_comm, dx, n); }

/* ---- the arena ---------------------------------------------------------------------------- */

void train_acts_init(TrainActs *a, const Model *m, int max_tokens, int max_seq, int flags) {
    memset(a, 0, sizeof(*a));
    const ModelConfig *c = &m->cfg;
    int recompute = flags & TRAIN_RECOMPUTE, tp = m->mesh->tp;
    if (c->moe != MOE_NONE && (flags & TRAIN_SEQ_PARALLEL) && tp > 1)   /* runtime/moe.c reads every row */
        user_error("--sequence-parallel: not supported with a Mixture-of-Experts model (model_type %s) yet", c->model_type);
    size_t N = (size_t)max_tokens, D = c->dim, Dh = c->head_dim, Ll = (size_t)m->n_layers_local;
    size_t qd = (size_t)m->n_heads_local * Dh, kvd = (size_t)m->n_heads_kv_local * Dh, F = m->hidden_local;
    size_t V = !m->is_last ? 0 : m->head == HEAD_SCORE ? 1 : (size_t)m->vocab_local, Dl = m->is_last ? D : 0;
    a->sp = (flags & TRAIN_SEQ_PARALLEL) && tp > 1;
    size_t R = a->sp ? (N + tp - 1) / tp : N;   /* the residual stream's rows here (sequence parallel: a share) */
    a->max_tokens = max_tokens;
    a->max_seq = max_seq;
    a->scratch_stride = (size_t)(m->n_heads_local > 2 ? m->n_heads_local : 2) * max_seq;
    a->recompute = recompute;
    a->layers = xcalloc(Ll ? Ll : 1, sizeof(LayerActs));

    /* per layer, in LayerActs' field order */
    size_t qkn = c->qk_norm ? 1 : 0;   /* qwen3: q and k before their norms */
    size_t layer_sizes[] = {R * D, R * D, N * qd, N * kvd, N * kvd, N * qd, R * D, R * D, N * F, N * F, N * F,
                            qkn * N * qd, qkn * N * kvd};
    enum { N_LAYER = sizeof(layer_sizes) / sizeof(layer_sizes[0]) };
    static const int PACKED[4] = {1, 5, 7, 10};   /* xb1, att, xb2, act: the matmul inputs */
    int packed = m->dtype == DTYPE_BF16 && !recompute;
    size_t per_layer = 0, packed_floats = 0;       /* packed: bf16 elements, two per float of the arena */
    for (int i = 0; i < N_LAYER; i++) per_layer += layer_sizes[i];
    for (int j = 0; j < 4; j++) packed_floats += (layer_sizes[PACKED[j]] + 1) / 2;
    /* the rest, in TrainActs' field order */
    float **slots[] = {&a->x_final, &a->xb_final, &a->logits, &a->dx, &a->dxb, &a->dtmp, &a->dq, &a->datt,
                       &a->dk, &a->dv, &a->dgate, &a->dup, &a->dact, &a->dqk_norm, &a->out, &a->dout, &a->lse, &a->pick, &a->rope,
                       &a->scratch, &a->ent, &a->dent, &a->sp_x, &a->sp_xb};
    size_t NDs = a->sp ? N * D : 0;
    size_t sizes[] = {R * D, N * Dl, N * V, N * D, N * D, N * D, N * qd, N * qd, N * kvd, N * kvd, N * F, N * F,
                      N * F, qkn * 2 * Dh, N, N, N, N, N * Dh, (size_t)backend_scratch_rows(m->be) * a->scratch_stride, N, N, NDs,
                      NDs};
    enum { N_REST = sizeof(sizes) / sizeof(sizes[0]) };
    /* recompute: every layer keeps its input x_in; the other ten buffers are one shared set.
     * packed: the four matmul inputs are one shared fp32 set plus each layer's bf16 copies */
    size_t shared4 = 0;
    for (int j = 0; j < 4; j++) shared4 += layer_sizes[PACKED[j]];
    size_t total = recompute ? layer_sizes[0] * Ll + (per_layer - layer_sizes[0])
                 : packed    ? (per_layer - shared4) * Ll + shared4 + packed_floats * Ll
                             : per_layer * Ll;
    for (int i = 0; i < N_REST; i++) total += sizes[i];

    a->be = m->be;
    a->arena = m->be->alloc(sizeof(float) * (total ? total : 1));
    a->host_out = xmalloc(sizeof(float) * (N ? N : 1));
    a->host_dout = xmalloc(sizeof(float) * (N ? N : 1));
    a->n_arena = total;
    float *p = a->arena;
    if (packed) a->packed = xmalloc(sizeof(uint16_t *) * 4 * (Ll ? Ll : 1));
    for (size_t l = 0; l < Ll; l++) {
        LayerActs *la = &a->layers[l];
        float **lslots[] = {&la->x_in, &la->xb1, &la->q, &la->k, &la->v, &la->att, &la->x_mid, &la->xb2,
                            &la->gate, &la->up, &la->act, &la->q_pre, &la->k_pre};
        for (int i = 0; i < N_LAYER; i++) {
            int is_packed = i == 1 || i == 5 || i == 7 || i == 10;
            if (l > 0 && ((recompute && i > 0) || (packed && is_packed))) {   /* layer 0's: shared */
                *lslots[i] = *(&a->layers[0].x_in + i);
                continue;
            }
            *lslots[i] = layer_sizes[i] ? p : NULL;
            p += layer_sizes[i];
        }
        for (int j = 0; packed && j < 4; j++) {
            a->packed[4 * l + j] = (uint16_t *)p;
            p += (layer_sizes[PACKED[j]] + 1) / 2;
        }
    }
    for (int i = 0; i < N_REST; i++) { *slots[i] = p; p += sizes[i]; }
    if (!a->sp) a->sp_x = a->sp_xb = NULL;
    a->dlogits = a->logits;   /* the cross-entropy backward overwrites the logits in place */

    if (m->lora) {   /* each layer's u, then the scratch */
        size_t r = (size_t)m->lora_r, w = m->lora_width;
        size_t n = Ll * LORA_TARGETS * N * r + N * w + N * r + N * w;
        a->lora_arena = m->be->alloc(sizeof(float) * n);
        a->n_arena += n;   /* the memory plan's activations */
        float *q = a->lora_arena;
        for (size_t l = 0; l < Ll; l++, q += LORA_TARGETS * N * r) a->layers[l].lora_u = q;
        a->lora_tmp = q;
        a->lora_du = q + N * w;
        a->lora_dx = a->lora_du + N * r;
    }
    if (c->moe != MOE_NONE) {
        a->moe_stats = xcalloc(2 * (size_t)c->n_experts, sizeof(double));
        a->moe_aux_dp = xcalloc((size_t)c->n_experts, sizeof(float));
        a->moe_load = xcalloc(2 * (size_t)c->n_experts, sizeof(double));
    }
    a->ids = m->be->alloc(sizeof(int) * (N ? 3 * N : 1));
    a->iarena = xmalloc(sizeof(int) * (3 * N + 1));
    a->seq_start = a->iarena;
    a->ids_host = a->seq_start + N + 1;

    int Hkv = c->n_heads_kv;
    a->kv_rep = tp > Hkv ? tp / Hkv : 1;
    a->kv_comm = (Comm){.rank = 0, .size = 1};
    if (a->kv_rep > 1)   /* the ranks holding kv head tp_rank / kv_rep (model.c SHARD_KV_ROWS) */
        a->kv_comm = comm_split(&m->mesh->tp_comm, m->mesh->tp_rank / a->kv_rep, m->mesh->tp_rank);
    a->emb_comm = (Comm){.rank = 0, .size = 1};
    if (c->tie_embeddings && m->mesh->pp > 1)   /* color 0: first and last stage; 1: the middle ones */
        a->emb_comm = comm_split(&m->mesh->pp_comm, !(m->is_first || m->is_last), m->mesh->pp_rank);

    if (m->mesh->rank == 0)
        fprintf(stderr, "train activations: %.2f MiB (rank 0: %d tokens, %zu layers, %.2f MiB per layer%s%s)\n",
                total * 4.0 / (1 << 20), max_tokens, Ll,
                (packed ? per_layer - shared4 + packed_floats : per_layer) * 4.0 / (1 << 20),
                recompute ? "; recompute: only layer inputs kept" : packed ? "; matmul inputs kept as bf16" : "",
                a->sp ? "; sequence parallel: the residual stream's rows shared over tp" : "");
}

void train_acts_free(TrainActs *a) {
    comm_wait(&a->send_req);
    comm_free(&a->kv_comm);
    comm_free(&a->emb_comm);
    if (a->be) {
        a->be->free(a->arena);
        a->be->free(a->ids);
        a->be->free(a->lora_arena);
    }
    free(a->host_out);
    free(a->host_dout);
    free(a->iarena);
    free(a->moe_stats);
    free(a->moe_aux_dp);
    free(a->moe_load);
    free(a->layers);
    free(a->packed);
    memset(a, 0, sizeof(*a));
}

/* ---- forward ------------------------------------------------------------------------------ */

/* Packed (see TrainActs.packed): layer l's four matmul inputs from the shared fp32 set into its bf16
 * copies (after its forward), or back (before its backward, unpack = 1). Exact both ways: the
 * values are bf16 already (runtime/forward.c rounds them). */
static void layer_pack(const Model *m, TrainActs *a, int l, int unpack) {
    const LayerActs *la = &a->layers[l];
    size_t N = (size_t)a->N, D = m->cfg.dim, qd = (size_t)m->n_heads_local * m->cfg.head_dim, F = m->hidden_local;
    size_t R = a->sp ? (size_t)(a->lb.sp_hi - a->lb.sp_lo) : N;   /* xb1, xb2: the residual's rows */
    float *buf[4] = {la->xb1, la->att, la->xb2, la->act};
    size_t n[4] = {R * D, N * qd, R * D, N * F};
    for (int j = 0; j < 4; j++) {
        if (unpack) m->be->unpack(buf[j], a->packed[4 * l + j], DTYPE_BF16, n[j]);
        else m->be->pack(a->packed[4 * l + j], DTYPE_BF16, buf[j], n[j]);
    }
}

/* Layer l of this stage: x_out (N, D) = layer(x_in), keeping what backward needs in a->layers[l]
 * (with recompute, one shared set of buffers that backward refills by calling this again). */
static void layer_forward(Model *m, TrainActs *a, int l, float *x_out) {
    model_layer_forward(m, l, &a->lb, &a->layers[l], x_out);
    if (a->packed) layer_pack(m, a, l, 0);
}

void train_forward(Model *m, TrainActs *a, const int *tokens, const int *seq_start, int n_seqs) {
    const ModelConfig *c = &m->cfg;
    const Comm *pp = &m->mesh->pp_comm;
    int D = c->dim;
    int N = seq_start[n_seqs];
    CHECK(N <= a->max_tokens && n_seqs <= a->max_tokens);
    comm_wait(&a->send_req);   /* this slot's previous send must be done before its buffers change */
    a->N = N;
    a->n_seqs = n_seqs;
    memcpy(a->seq_start, seq_start, sizeof(int) * (n_seqs + 1));
    /* tokens (N) and positions (N), staged on the host, then one copy to the backend */
    a->tokens = a->ids;
    a->pos = a->ids + N;
    a->targets = a->ids + 2 * N;
    a->pos_host = a->ids_host + N;
    memcpy(a->ids_host, tokens, sizeof(int) * N);
    for (int i = 0; i < n_seqs; i++) {
        CHECK(seq_start[i + 1] - seq_start[i] <= a->max_seq);
        for (int t = seq_start[i]; t < seq_start[i + 1]; t++) a->pos_host[t] = t - seq_start[i];
    }
    m->be->to_device(a->ids, a->ids_host, sizeof(int) * 2 * N);
    /* keys and values: each sequence's own rows (no cache); a block's output goes to dtmp
     * (backward scratch, free during the forward); sequence parallel: this tp rank's rows */
    size_t lo = 0, hi = N;
    if (a->sp) comm_rows((size_t)N, m->mesh->tp, m->mesh->tp_rank, &lo, &hi);
    a->lb = (LayerBatch){N, n_seqs, a->seq_start, a->pos, a->rope, NULL, {0}, a->dtmp, a->scratch, a->scratch_stride,
                         a->sp_xb, (int)lo, (int)hi, a->lora_tmp, a->lora_key, a->lora_dx, a->moe_stats};
    if (a->moe_stats) memset(a->moe_stats, 0, sizeof(double) * 2 * c->n_experts);
    m->be->rope_table(a->rope, a->pos, m->inv_freq, N, c->head_dim);
    float *x0 = m->n_layers_local ? a->layers[0].x_in : a->x_final;
    model_end_weights(m, 0, 1);                                   /* ZeRO-3: the embedding for the lookup */
    model_stage_input(m, &a->lb, a->tokens, x0);
    model_end_weights(m, 0, 0);
    for (int l = 0; l < m->n_layers_local; l++) {
        model_layer_weights(m, l, l + 1 < m->n_layers_local ? l + 1 : -1);   /* ZeRO-3: all-gathered */
        layer_forward(m, a, l, l + 1 < m->n_layers_local ? a->layers[l + 1].x_in : a->x_final);
    }
    a->lb.moe_stats = NULL;   /* counted once: not again by recompute's layer forwards */
    for (int e = 0; a->moe_stats && e < 2 * c->n_experts; e++) a->moe_load[e] += a->moe_stats[e];

    if (!m->is_last) {
        comm_isend(pp, a->x_final, sizeof(float) * (hi - lo) * D, pp->rank + 1, &a->send_req);  /* to stage s+1 */
        return;
    }
    model_end_weights(m, 1, 1);                       /* ZeRO-3: the head, whole until its backward is done */
    model_head(m, &a->lb, a->logits, a->xb_final, a->x_final, N);
}

/* Sequence parallel: an activation kept as this rank's rows, gathered into full (N, D) for the
 * backward; without it the activation itself (every row) */
static const float *all_rows(const Model *m, const TrainActs *a, const float *mine, float *full) {
    if (!a->sp) return mine;
    comm_all_gather_rows(&m->mesh->tp_comm, mine, full, (size_t)a->N, (size_t)m->cfg.dim);
    return full;
}

/* ---- the hook's inputs: per-token logprobs or values ---------------------------------------- */

const float *train_outputs(Model *m, TrainActs *a, const int *targets, float temperature) {
    if (!m->is_last) return NULL;
    int N = a->N;
    if (m->head == HEAD_SCORE) {              /* the values are the head's output, (N, 1) */
        m->be->copy(a->out, a->logits, N);
        m->be->to_host(a->host_out, a->out, sizeof(float) * N);
    } else {   /* the logprob of generation; a->lse and a->targets stay for the backward */
        LogprobBufs w = {a->lse, a->pick, a->out, a->targets, N};
        model_target_logprobs(m, &w, a->logits, N, N, NULL, targets, temperature, a->host_out);
    }
    return a->host_out;
}

double loss_xent(const MicroBatch *mb, int N, const float *out, float *dout, void *user) {
    (void)user;
    double loss = 0.0;
    for (int n = 0; n < N; n++) {
        int on = mb->targets[n] >= 0;
        if (on) loss -= (double)mb->weight[n] * (double)out[n];
        dout[n] = on ? -mb->weight[n] : 0.0f;
    }
    return loss;
}
const LossHook LOSS_XENT = {loss_xent, NULL, 1.0f, 0.0f, NULL, NULL};

/* hook->truncate (see LossHook), before train_outputs: every row with a target is gathered over tp to
 * the host (as generate/engine.c gathers a row to sample from it), sampler_truncate drops what the
 * sampler dropped, and this rank's shard of the masked row goes back into a->logits: -inf outside
 * the kept set, the logits' own bits inside, so the log-sum-exp is the rollout's, bit for bit.
 * Every tp rank of the last stage calls it, for the same rows in the same order. */
static void truncate_rows(Model *m, TrainActs *a, const int *targets, const SamplingParams *sp) {
    int Vl = m->vocab_local, r0 = m->mesh->tp_rank * Vl;
    float *full = xmalloc(sizeof(float) * m->vocab_padded), *proc = xmalloc(sizeof(float) * m->vocab_padded);   /* (V) each */
    void *scratch = xmalloc(sampler_scratch_bytes(m->vocab_padded));
    for (int n = 0; n < a->N; n++) {
        if (targets[n] < 0) continue;
        float *row = a->logits + (size_t)n * Vl;   /* (V_local) */
        m->be->to_host(full + r0, row, sizeof(float) * Vl);
        comm_all_gather(&m->mesh->tp_comm, full + r0, full, Vl);
        sampler_truncate(full, m->cfg.vocab_size, sp, proc, scratch);
        m->be->to_device(row, full + r0, sizeof(float) * Vl);
    }
    free(full); free(proc); free(scratch);
}

/* The entropy bonus of hook (see LossHook), after train_outputs: a->ent (N) = each row's entropy
 * at the temperature (lse minus the tp sum of the shards' expected logits), a->dent (N) = d loss /
 * d H; returns the bonus's loss. Host loop over N scalars, as the hook. */
static double entropy_term(Model *m, TrainActs *a, const MicroBatch *mb, const LossHook *hook) {
    int N = a->N;
    float *part = a->dent, *H = xmalloc(sizeof(float) * (N ? N : 1)), *dH = xmalloc(sizeof(float) * (N ? N : 1));
    m->be->row_entropy_part(part, a->logits, a->lse, N, m->vocab_local, hook->temperature, m->vocab_leaves);
    model_tp_sum(m, part, (size_t)N);
    m->be->sub_at(a->ent, a->lse, part, NULL, N);
    m->be->to_host(H, a->ent, sizeof(float) * N);
    double loss = 0.0, sum = 0.0, cnt = 0.0;
    for (int n = 0; n < N; n++) {
        dH[n] = 0.0f;
        float w = mb->weight ? mb->weight[n] : 1.0f;
        if (mb->targets[n] < 0 || w == 0) continue;   /* weight 0: out of the loss, and of actor/entropy */
        dH[n] = -hook->entropy_coef * w;
        loss += (double)dH[n] * H[n];
        sum += H[n];
        cnt += 1;
    }
    if (hook->entropy) { hook->entropy[0] += sum; hook->entropy[1] += cnt; }
    m->be->to_device(a->dent, dH, sizeof(float) * N);
    free(H);
    free(dH);
    return loss;
}

double train_eval_loss_sum(Model *m, TrainActs *a, const int *targets) {
    double loss = 0.0;
    const float *lp = train_outputs(m, a, targets, 1.0f);
    if (!lp) return loss;
    for (int n = 0; n < a->N; n++)
        if (targets[n] >= 0) loss -= (double)lp[n];
    return loss;
}

/* LoRA's backward on projection t of layer l (runtime/forward.c lora_add): dy (N, n_out) the
 * projection output's gradient, x (N, n_in) its input, u = scale * x A^T as the forward kept it:
 *   dB += dy^T u,   du = scale * dy B,   dA += du^T x,   dx_in (N, n_in) += du A.
 * Column-parallel (q k v gate up): dy holds this rank's output columns, so du is the tp sum of the
 * ranks' parts (the fixed tree; A then gets the same gradient on every rank, as a replicated weight
 * must), and tp rank 0 alone adds du A to dx_in, whose tp sum follows. Row-parallel (o down): dy is
 * whole on every rank, x and A hold this rank's input columns. */
static void lora_backward(Model *m, TrainActs *a, GradSink *g, int l, int t, const float *dy, int n_out, const float *x,
                          int n_in, float *dx_in) {
    const Lora *lo = m->lora;
    if (!lo || !lo->enabled || !lo->A[l * LORA_TARGETS + t]) return;
    const Backend *be = m->be;
    int N = a->N, r = lo->r, rowp = t == LORA_O || t == LORA_DOWN;
    const float *A = lo->A[l * LORA_TARGETS + t], *B = lo->B[l * LORA_TARGETS + t];
    const float *u = a->layers[l].lora_u + (size_t)t * N * r;
    float *dA = g->lora + (A - lo->arena), *dB = g->lora + (B - lo->arena);
    be->matmul_backward(a->lora_du, dB, NULL, dy, u, B, DTYPE_F32, N, r, n_out);
    /* a kv head replicated over tp ranks (tp > num_key_value_heads): its rows once in the tp sum */
    if ((t == LORA_K || t == LORA_V) && a->kv_comm.rank != 0) be->zero(a->lora_du, sizeof(float) * N * r);
    if (!rowp) model_tp_sum(m, a->lora_du, (size_t)N * r);
    be->scale(a->lora_du, lo->scale, (size_t)N * r);
    int col0 = rowp ? m->mesh->tp_rank * n_in : 0, cg = rowp ? n_in * m->mesh->tp : n_in;
    uint64_t key = a->lora_key ? lora_target_key(a->lora_key, m->layer_start + l, t, cg) : 0;
    if (key) {   /* the forward's dropped-out input, again (the same mask) */
        be->dropout(a->lora_tmp, x, N, n_in, col0, cg, lo->dropout, key);
        x = a->lora_tmp;
    }
    be->matmul_backward(a->lora_dx, dA, NULL, a->lora_du, x, A, DTYPE_F32, N, n_in, r);
    if (key) be->dropout(a->lora_dx, a->lora_dx, N, n_in, col0, cg, lo->dropout, key);   /* d x' / d x: mask / (1 - p) */
    if (rowp || m->mesh->tp_rank == 0) be->add_to(dx_in, dx_in, a->lora_dx, (size_t)N * n_in);
}

/* qwen3's per-head norms (runtime/forward.c): q = rmsnorm(q_pre) * q_norm over each head's Dh, k
 * likewise. dq, dk (after RoPE's backward) become the gradients of q_pre, k_pre in place. The
 * weights (Dh) are replicated over tp but each rank holds other heads, so a rank's d q_norm is a
 * partial: the ranks' partials are added by the fixed tree (identical on every rank, as a replicated
 * weight's gradient must be), a kv head shared by several ranks (tp > Hkv: dk already their sum)
 * counted once, by the first of them. */
static void qk_norm_backward(Model *m, TrainActs *a, const LayerActs *la, const LayerWeights *w, LayerWeights *g) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    int N = a->N, Dh = c->head_dim, frozen = !g->q_norm;   /* LoRA: the base's norms are frozen too */
    float *dw = a->dqk_norm;                                /* (2 Dh) */
    if (!frozen) be->zero(dw, sizeof(float) * 2 * Dh);
    be->rmsnorm_backward(a->dq, frozen ? NULL : dw, a->dq, la->q_pre, w->q_norm, m->dtype, N * m->n_heads_local, Dh,
                         c->norm_eps);
    be->rmsnorm_backward(a->dk, frozen || a->kv_comm.rank ? NULL : dw + Dh, a->dk, la->k_pre, w->k_norm, m->dtype,
                         N * m->n_heads_kv_local, Dh, c->norm_eps);
    if (frozen) return;
    model_tp_sum(m, dw, 2 * (size_t)Dh);
    be->add_to(g->q_norm, g->q_norm, dw, Dh);
    be->add_to(g->k_norm, g->k_norm, dw + Dh, Dh);
}

/* The load-balancing loss of the micro-batch of the last train_forward (TrainActs.moe_aux_coef), HF's
 * E sum_e f_e P_e with f_e = choices of e / (L N), P_e = summed p_e / (L N) over every layer (pp 1:
 * all local); leaves d (coef aux) / d p_e = coef E f_e / (L N) in a->moe_aux_dp and adds
 * aux to a->moe_aux_sum. */
static double moe_aux(const Model *m, TrainActs *a, float coef) {
    const ModelConfig *c = &m->cfg;
    CHECK(c->moe != MOE_NONE && m->mesh->pp == 1);
    int E = c->n_experts;
    double LN = (double)c->n_layers * a->N, aux = 0.0;
    for (int e = 0; e < E; e++) {
        double f = a->moe_stats[e] / LN, P = a->moe_stats[E + e] / LN;
        aux += f * P;
        a->moe_aux_dp[e] = (float)(coef * E * f / LN);
    }
    aux *= E;
    a->moe_aux_sum += aux;
    return aux;
}

float train_loss_backward(Model *m, TrainActs *a, const MicroBatch *mb, const LossHook *hook, GradSink *sink) {
    ModelWeights *grads = &sink->w;
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    const Comm *pp = &m->mesh->pp_comm;
    int D = c->dim, Dh = c->head_dim, Fl = m->hidden_local, Vl = m->vocab_local;
    int Hl = m->n_heads_local, Hkvl = m->n_heads_kv_local, qd = Hl * Dh, kvd = Hkvl * Dh;
    int N = a->N;
    size_t ND = (size_t)N * D;
    const int *start = a->seq_start;
    float *dx = a->dx, *dxb = a->dxb, *dtmp = a->dtmp;   /* (N, D) */
    int kv_lead = a->kv_comm.rank == 0;                  /* adds the k/v input gradient (see the top) */
    DType wt = m->dtype;                                 /* the weights' (the forward's); gradients are fp32 */
    float loss = 0.0f;
    comm_wait(&a->send_req);

    if (m->is_last) {
        CHECK(mb->seq_start[mb->n_seqs] == N);
        if (hook->truncate && m->head != HEAD_SCORE) truncate_rows(m, a, mb->targets, hook->truncate);
        const float *out = train_outputs(m, a, mb->targets, hook->temperature);
        double l = hook->fn(mb, N, out, a->host_dout, hook->user);                      /* the loss hook */
        int ent = m->head != HEAD_SCORE && (hook->entropy_coef != 0.0f || hook->entropy);
        if (ent) l += entropy_term(m, a, mb, hook);
        if (a->moe_aux_coef != 0.0f) l += a->moe_aux_coef * moe_aux(m, a, a->moe_aux_coef);
        loss = (float)l;
        be->to_device(a->dout, a->host_dout, sizeof(float) * N);
        if (m->head == HEAD_SCORE) {
            /* values = xb_final score^T, score replicated: dxb is the same full sum on every rank */
            be->matmul_backward(dxb, grads->score, NULL, a->dout, a->xb_final, m->w.score, lora_score_dtype(m), N, D, 1);
        } else {
            be->logprob_backward(a->dlogits, a->logits, a->lse, a->targets, a->dout, ent ? a->ent : NULL,
                                 ent && hook->entropy_coef != 0.0f ? a->dent : NULL, N, Vl, m->vocab_start, hook->temperature);
            /* logits = xb_final lm_head^T, lm_head split by vocab rows: column-parallel, so dxb is a
             * partial sum on each rank ("copy" backward: all-reduce) */
            be->matmul_backward(dxb, grads->lm_head, NULL, a->dlogits, a->xb_final, m->w.lm_head, wt, N, D, Vl);
            tp_copy_backward(m, dxb, ND);
        }
        be->rmsnorm_backward(dx, grads->final_norm, dxb, all_rows(m, a, a->x_final, a->sp_x), m->w.final_norm, wt, N,
                             D, c->norm_eps);
        model_end_weights(m, 1, 0);
    } else {
        comm_recv(pp, dx, sizeof(float) * ND, pp->rank + 1);                            /* d(x) from stage s+1 */
    }

    for (int l = m->n_layers_local - 1; l >= 0; l--) {
        model_layer_weights(m, l, l - 1);                                 /* ZeRO-3: all-gathered again */
        /* recompute: refill the shared activations from this layer's input (the same bits); the
         * last layer's are still there from the forward */
        if (a->recompute && l + 1 < m->n_layers_local)
            layer_forward(m, a, l, l + 1 < m->n_layers_local ? a->layers[l + 1].x_in : a->x_final);
        if (a->packed) layer_pack(m, a, l, 1);   /* this layer's matmul inputs into the shared set */
        const LayerWeights *w = &m->w.layers[l];
        LayerWeights *g = &grads->layers[l];
        const LayerActs *la = &a->layers[l];
        int window = config_layer_window(c, m->layer_start + l) ? c->sliding_window : 0;
        /* dx enters as d(x_out) and leaves as d(x_in); the residual adds pass it through. */
        /* MLP block: x_out = x_mid + reduce(down(act)); reduce's backward is the identity: d(down's
         * output) is dx on every rank */
        const float *xb2 = all_rows(m, a, la->xb2, a->sp_xb), *x_mid = all_rows(m, a, la->x_mid, a->sp_x);
        if (c->moe != MOE_NONE) {   /* train/moe_grad.c: this rank's partial d xb2 */
            moe_backward(m, l, xb2, N, dx, dxb, g, a->moe_aux_coef != 0.0f ? a->moe_aux_dp : NULL, a->moe_z_coef,
                         &a->moe_z_sum);
        } else {
            be->matmul_backward(a->dact, g->w_down, NULL, dx, la->act, w->w_down, wt, N, Fl, D);
            lora_backward(m, a, sink, l, LORA_DOWN, dx, D, la->act, Fl, a->dact);
            be->swiglu_backward(a->dgate, a->dup, a->dact, la->gate, la->up, (size_t)N * Fl);
            be->matmul_backward(dxb, g->w_gate, NULL, a->dgate, xb2, w->w_gate, wt, N, D, Fl);
            be->matmul_backward(dtmp, g->w_up, NULL, a->dup, xb2, w->w_up, wt, N, D, Fl);
            be->add_to(dxb, dxb, dtmp, ND);
            lora_backward(m, a, sink, l, LORA_GATE, a->dgate, Fl, xb2, D, dxb);
            lora_backward(m, a, sink, l, LORA_UP, a->dup, Fl, xb2, D, dxb);
        }
        tp_copy_backward(m, dxb, ND);                                                    /* "copy" backward */
        be->rmsnorm_backward(dtmp, g->mlp_norm, dxb, x_mid, w->mlp_norm, wt, N, D, c->norm_eps);
        be->add_to(dx, dx, dtmp, ND);                                                           /* now d(x_mid) */
        /* attention block: x_mid = x_in + reduce(o_proj(att)) */
        be->matmul_backward(a->datt, g->wo, NULL, dx, la->att, w->wo, wt, N, qd, D);
        lora_backward(m, a, sink, l, LORA_O, dx, D, la->att, qd, a->datt);
        /* sequences in parallel where the backend allows it (Backend.parallel_calls), own scratch */
#pragma omp parallel for schedule(dynamic) if (a->n_seqs > 1 && be->parallel_calls)
        for (int i = 0; i < a->n_seqs; i++) {
            size_t t0 = start[i];
            be->attention_backward(a->dq + t0 * qd, a->dk + t0 * kvd, a->dv + t0 * kvd, a->datt + t0 * qd,
                                   la->q + t0 * qd, la->k + t0 * kvd, la->v + t0 * kvd, start[i + 1] - start[i], Hl,
                                   Hkvl, Dh, window, a->scratch + (size_t)omp_get_thread_num() * a->scratch_stride);
        }
        be->rope_backward(a->dq, a->rope, N, Hl, Dh);
        be->rope_backward(a->dk, a->rope, N, Hkvl, Dh);
        comm_all_reduce_sum(&a->kv_comm, a->dk, (size_t)N * kvd);                      /* replicated kv head: */
        comm_all_reduce_sum(&a->kv_comm, a->dv, (size_t)N * kvd);                      /* sum the query groups */
        if (c->qk_norm) qk_norm_backward(m, a, la, w, g);                              /* dq, dk: before the norms */
        const float *xb1 = all_rows(m, a, la->xb1, a->sp_xb), *x_in = all_rows(m, a, la->x_in, a->sp_x);
        be->matmul_backward(dxb, g->wq, g->bq, a->dq, xb1, w->wq, wt, N, D, qd);
        be->matmul_backward(kv_lead ? dtmp : NULL, g->wk, g->bk, a->dk, xb1, w->wk, wt, N, D, kvd);
        if (kv_lead) be->add_to(dxb, dxb, dtmp, ND);
        be->matmul_backward(kv_lead ? dtmp : NULL, g->wv, g->bv, a->dv, xb1, w->wv, wt, N, D, kvd);
        if (kv_lead) be->add_to(dxb, dxb, dtmp, ND);
        lora_backward(m, a, sink, l, LORA_Q, a->dq, qd, xb1, D, dxb);
        lora_backward(m, a, sink, l, LORA_K, a->dk, kvd, xb1, D, dxb);
        lora_backward(m, a, sink, l, LORA_V, a->dv, kvd, xb1, D, dxb);
        tp_copy_backward(m, dxb, ND);                                                    /* "copy" backward */
        be->rmsnorm_backward(dtmp, g->attn_norm, dxb, x_in, w->attn_norm, wt, N, D, c->norm_eps);
        be->add_to(dx, dx, dtmp, ND);                                                           /* now d(x_in) */
        if (sink->layer_done) sink->layer_done(sink, l);                            /* ZeRO-2: reduce-scatter g */
    }

    if (m->is_first) {   /* the lookup was a "reduce": each rank adds dx into the rows it owns */
        if (grads->embed) be->embedding_backward(grads->embed, dx, a->tokens, N, D, m->vocab_start, m->vocab_local);
    }
    else
        comm_isend(pp, dx, sizeof(float) * ND, pp->rank - 1, &a->send_req);             /* d(x) to stage s-1 */
    return loss;   /* the last stage's; train_loss_share gives it to every stage once per step */
}

void train_acts_wait(TrainActs *a) { comm_wait(&a->send_req); }

float train_loss_share(const Model *m, float loss) {
    const Comm *pp = &m->mesh->pp_comm;
    comm_broadcast(pp, &loss, sizeof(loss), pp->size - 1);
    return loss;
}

void train_tied_embedding_all_reduce(const Model *m, TrainActs *a, ModelWeights *grads) {
    if (!m->cfg.tie_embeddings || m->mesh->pp == 1 || !(m->is_first || m->is_last)) return;
    /* d(shared table) = d(embed use) + d(lm_head use): the same tp shard of vocab rows on both stages */
    float *g = m->is_first ? grads->embed : grads->lm_head;
    if (!g) return;   /* frozen (LoRA) */
    comm_all_reduce_sum(&a->emb_comm, g, (size_t)m->vocab_local * m->cfg.dim);
}
