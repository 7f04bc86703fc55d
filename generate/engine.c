/* engine.c — see engine.h. One step:
 *   1. every running sequence gets KV slots for the tokens it feeds this step: one while decoding,
 *      the rest of its context while that goes in chunks (preempting the latest admitted sequence
 *      when the pool is empty: its blocks are freed and it is recomputed later);
 *   2. waiting sequences are admitted while blocks, --max-batch and the token budget allow: with
 *      others, their whole context at once; alone, as much as fits, the rest in later steps (a
 *      prompt over the budget, or a recompute under a sliding window that outgrew the pool);
 *   3. one packed forward: new tokens of every running sequence, logits only for each sequence's
 *      last token (a sequence part-way through its context chooses nothing this step);
 *   4. the last pp stage chooses tokens (greedy without gathering the vocab, or a full-row gather
 *      and the sampler), broadcasts them over the pp group, and every rank applies them.
 * Memory: the block tables live on the host (each Seq's) and go to the backend once per step, in
 * one copy; what the sampler, the stops and the output read (chosen ids, logprobs, a sampled
 * row's logits) comes back through to_host. Per step: two uploads (tables; the forward's
 * positions, tokens and logit rows) and one download (the argmax ids); with logprobs one more
 * upload (the pairs' tokens) and two downloads (lse, logprobs); each sampled row one download. */
#include "generate/engine.h"
#include "generate/kv_cache.h"
#include "runtime/util.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct Engine {
    Model *m;
    EngineConfig cfg;
    RunState rs;          /* this engine's activations (not the model's: several engines may share it) */
    KVCache kv;
    Seq **waiting;        /* FIFO; preempted sequences go back to the front */
    int n_waiting, cap_waiting;
    Seq **running;        /* in admission order: the last one is the latest admitted */
    int n_running;
    int max_table, window;  /* window: every layer windowed -> W, else 0 */
    int K;                  /* most logprobs alternatives any added sequence asks for */
    /* step buffers on the host, sized for max_batch (B) sequences and max_tokens tokens */
    int *tokens, *start, *pos0, *rows;
    int *table_host;        /* (B, max_table) this step's tables, staged for the upload */
    float *lse, *full;      /* (B) log-sum-exps; (V) one sampled row's logits */
    float *proc;            /* (V) truncated_lp: the processed row sampler_truncate makes (the draw's) */
    int *amax;              /* (B) each row's argmax */
    int *res_i;             /* (max_batch, 1 + K) per sequence: chosen id, top-K ids */
    float *res_f;           /* (max_batch, 2 + K) per sequence: chosen lp, appended lp, top-K lps */
    int *lp_rows, *lp_toks; /* (2 * max_batch) the (row, token) pairs whose logprobs are wanted */
    float *lp_vals;         /* (2 * max_batch) their logprobs */
    void *scratch;
    /* the same steps' buffers in the backend's memory: one block of ints, one of floats */
    int *dev_tables, *dev_amax, *dev_toks;               /* (B, max_table), (B), (2B) */
    float *dev_lse, *dev_sum, *dev_amax_val, *dev_pick, *dev_lp;  /* (B) x 3, (2B) x 2 */
    EngineStats st;
};

static int ctx_len(const Seq *s) { return s->n_prompt + s->n_out; }
static int ctx_tok(const Seq *s, int p) { return p < s->n_prompt ? s->prompt[p] : s->out[p - s->n_prompt]; }
static int blocks_for(const Engine *e, int n_tokens) { return (n_tokens + e->kv.block - 1) / e->kv.block; }

void seq_alloc_results(Seq *s) {
    int n = s->max_new > 0 ? s->max_new : 1, k = s->logprobs_n > 0 ? s->logprobs_n : 1;
    s->out = xcalloc(n, sizeof(int));
    s->lp = xcalloc(n, sizeof(float));
    s->chosen = xcalloc(n, sizeof(int));
    s->chosen_lp = xcalloc(n, sizeof(float));
    s->top_ids = xcalloc((size_t)n * k, sizeof(int));
    s->top_lp = xcalloc((size_t)n * k, sizeof(float));
}
void seq_free(Seq *s) {
    free(s->out); free(s->lp); free(s->chosen); free(s->chosen_lp); free(s->top_ids); free(s->top_lp);
    free(s->table);
    s->out = s->chosen = s->top_ids = s->table = NULL;
    s->lp = s->chosen_lp = s->top_lp = NULL;
}

Engine *engine_new(Model *m, const EngineConfig *cfg, int max_len) {
    Engine *e = xcalloc(1, sizeof(Engine));
    e->m = m;
    e->cfg = *cfg;
    size_t kv_bytes = cfg->kv_bytes;
    if (cfg->kv_blocks > 0) kv_bytes = (size_t)cfg->kv_blocks * kv_block_bytes(m, cfg->block);
    kv_init(&e->kv, m, kv_bytes, cfg->block);
    const ModelConfig *c = &m->cfg;
    int all = c->sliding_window > 0 && c->window_from_layer == 0;
    e->window = all ? c->sliding_window : 0;
    e->max_table = blocks_for(e, max_len) + 1;
    int B = cfg->max_batch, T = cfg->max_batch_tokens > max_len ? cfg->max_batch_tokens : max_len;
    run_state_init(&e->rs, m, T + B, max_len);
    e->tokens = xmalloc(sizeof(int) * (T + B));
    e->start = xmalloc(sizeof(int) * (B + 1));
    e->pos0 = xmalloc(sizeof(int) * B);
    e->rows = xmalloc(sizeof(int) * B);
    e->table_host = xcalloc((size_t)B * e->max_table, sizeof(int));
    e->running = xmalloc(sizeof(Seq *) * B);
    e->lse = xmalloc(sizeof(float) * B);
    e->amax = xmalloc(sizeof(int) * B);
    e->full = xmalloc(sizeof(float) * m->vocab_padded);
    e->proc = cfg->truncated_lp ? xmalloc(sizeof(float) * m->vocab_padded) : NULL;
    e->lp_rows = xmalloc(sizeof(int) * 2 * B);
    e->lp_toks = xmalloc(sizeof(int) * 2 * B);
    e->lp_vals = xmalloc(sizeof(float) * 2 * B);
    e->dev_tables = m->be->alloc(sizeof(int) * ((size_t)B * e->max_table + 3 * B));
    e->dev_amax = e->dev_tables + (size_t)B * e->max_table;
    e->dev_toks = e->dev_amax + B;
    e->dev_lse = m->be->alloc(sizeof(float) * 7 * B);
    e->dev_sum = e->dev_lse + B;
    e->dev_amax_val = e->dev_sum + B;
    e->dev_pick = e->dev_amax_val + B;
    e->dev_lp = e->dev_pick + 2 * B;
    e->res_i = xmalloc(sizeof(int) * B);
    e->res_f = xmalloc(sizeof(float) * 2 * B);
    e->scratch = xmalloc(sampler_scratch_bytes(m->vocab_padded));
    e->st.kv_blocks = e->kv.n_blocks;
    e->st.kv_block_tokens = e->kv.block;
    e->st.kv_bytes = 2.0 * dtype_size(e->kv.dtype) * e->kv.layer_stride * m->n_layers_local;
    e->st.act_bytes = sizeof(float) * (double)e->rs.n_floats;
    return e;
}

void engine_free(Engine *e) {
    kv_free(&e->kv);
    run_state_free(&e->rs);
    free(e->waiting); free(e->running); free(e->tokens); free(e->start); free(e->pos0); free(e->rows);
    free(e->table_host); free(e->lse); free(e->amax);
    free(e->full); free(e->proc); free(e->scratch); free(e->res_f); free(e->res_i);
    free(e->lp_rows); free(e->lp_toks); free(e->lp_vals);
    e->m->be->free(e->dev_tables);
    e->m->be->free(e->dev_lse);
    free(e);
}

EngineStats engine_stats(const Engine *e) { return e->st; }

/* Queues s at the back, or at the front (a preempted sequence goes first). */
static void waiting_push(Engine *e, Seq *s, int front) {
    if (e->n_waiting == e->cap_waiting) {
        e->cap_waiting = e->cap_waiting ? 2 * e->cap_waiting : 64;
        e->waiting = xrealloc(e->waiting, sizeof(Seq *) * e->cap_waiting);
    }
    if (front) memmove(e->waiting + 1, e->waiting, sizeof(Seq *) * e->n_waiting);
    e->waiting[front ? 0 : e->n_waiting] = s;
    e->n_waiting++;
}

int engine_check(const Engine *e, const Seq *s, char *err, size_t errlen) {
    /* the last token is appended, never fed: n_prompt + max_new - 1 positions are cached at most;
     * under a sliding window a query sees W positions, which span at most ceil((W - 1) / block) + 1
     * blocks, and a context that outgrows the pool is fed in chunks when it runs alone */
    int need = blocks_for(e, s->n_prompt + s->max_new - 1);
    if (e->window) {
        int w = (e->window - 1 + e->kv.block - 1) / e->kv.block + 1;
        if (w < need) need = w;
    }
    if (need > e->kv.n_blocks) {
        snprintf(err, errlen, "%d prompt + %d new tokens need %d KV blocks of %d tokens, the cache holds %d "
                 "(raise --kv-cache-mem)", s->n_prompt, s->max_new, need, e->kv.block, e->kv.n_blocks);
        return -1;
    }
    return 0;
}

int engine_add(Engine *e, Seq *s, char *err, size_t errlen) {
    if (engine_check(e, s, err, errlen)) return -1;
    CHECK(!(s->logprobs_n > 0 && e->cfg.lp_temperature > 0 && e->cfg.lp_temperature != 1.0f));
    CHECK(!e->cfg.truncated_lp || (s->logprobs_n == 0 && s->min_new == 0 && !s->forced && !sampler_is_greedy(&s->sp) &&
                                   s->sp.repetition_penalty == 1.0f && s->sp.presence_penalty == 0.0f &&
                                   s->sp.frequency_penalty == 0.0f));
    s->table = xmalloc(sizeof(int) * e->max_table);
    for (int i = 0; i < e->max_table; i++) s->table[i] = -1;
    s->n_table = 0;
    s->n_cached = 0;
    s->n_out = 0;
    s->finish = FINISH_NONE;
    if (s->logprobs_n > e->K) {   /* widen the per-step result rows once, here, not per step */
        e->K = s->logprobs_n;
        e->res_i = xrealloc(e->res_i, sizeof(int) * e->cfg.max_batch * (1 + e->K));
        e->res_f = xrealloc(e->res_f, sizeof(float) * e->cfg.max_batch * (2 + e->K));
    }
    waiting_push(e, s, 0);
    return 0;
}

static void release_blocks(Engine *e, Seq *s) {
    for (int i = 0; i < s->n_table; i++)
        if (s->table[i] >= 0) { kv_block_release(&e->kv, s->table[i]); s->table[i] = -1; }
    s->n_table = 0;
}

/* Blocks so that positions [0, n_tokens) have slots; 0 if the pool ran dry (nothing taken back). */
static int grow_table(Engine *e, Seq *s, int n_tokens) {
    int need = blocks_for(e, n_tokens);
    if (need - s->n_table > e->kv.n_free) return 0;
    for (; s->n_table < need; s->n_table++) s->table[s->n_table] = kv_block_alloc(&e->kv);
    return 1;
}

static void preempt(Engine *e, int r) {
    Seq *s = e->running[r];
    release_blocks(e, s);
    s->n_cached = 0;
    memmove(e->running + r, e->running + r + 1, sizeof(Seq *) * (e->n_running - r - 1));
    e->n_running--;
    waiting_push(e, s, 1);
    e->st.preemptions++;
}

/* Frees blocks that no future query can see: the next query is at position n_cached (the first
 * token not yet fed), and it sees keys from n_cached - (W - 1) on. */
static void drop_out_of_window(Engine *e, Seq *s) {
    if (!e->window) return;
    int lowest = s->n_cached - e->window + 1;
    for (int b = 0; b < s->n_table && (b + 1) * e->kv.block <= lowest; b++)
        if (s->table[b] >= 0) { kv_block_release(&e->kv, s->table[b]); s->table[b] = -1; }
}

/* Tokens s could feed next from the blocks it holds and the free pool. */
static int fit_tokens(const Engine *e, const Seq *s) {
    return (s->n_table + e->kv.n_free) * e->kv.block - s->n_cached;
}

static void schedule(Engine *e) {
    /* 1. running sequences first: slots for what each feeds this step (s->n_step: one token, or as
     * much of an unfinished context as fits), preempting the latest admitted when none fits */
    int budget = e->cfg.max_batch_tokens;
    for (int r = 0; r < e->n_running;) {
        Seq *s = e->running[r];
        int left = ctx_len(s) - s->n_cached, fit = fit_tokens(e, s), c = left < fit ? left : fit;
        if (c >= 1 && grow_table(e, s, s->n_cached + c)) { s->n_step = c; budget -= c; r++; continue; }
        preempt(e, e->n_running - 1);   /* the latest admitted (possibly s itself) */
    }
    /* 2. admit from the queue: beside others, a whole context within the budget; alone, as much as
     * fits (all of the pool is free then, and engine_add made sure that one token always fits) */
    while (e->n_waiting && e->n_running < e->cfg.max_batch) {
        Seq *s = e->waiting[0];
        int n = ctx_len(s), c = n;
        if (e->n_running > 0) {
            if (n > budget || !grow_table(e, s, n)) break;
        } else {
            if (c > fit_tokens(e, s)) c = fit_tokens(e, s);
            CHECK(c >= 1 && grow_table(e, s, c));
        }
        s->n_step = c;
        memmove(e->waiting, e->waiting + 1, sizeof(Seq *) * (e->n_waiting - 1));
        e->n_waiting--;
        e->running[e->n_running++] = s;
        budget -= c;
    }
    CHECK(e->n_running > 0);
}

/* min_new_tokens: no stop id may be drawn before it */
static int held_back(const Seq *s) { return s->n_out < s->min_new && s->n_stop_ids > 0; }
/* The step feeds only part of s's context (chunked): s chooses no token this step. */
static int feeds_part(const Seq *s) { return s->n_cached + s->n_step < ctx_len(s); }

/* Chooses the next token of every running sequence (last pp stage; collectives over tp in the same
 * order on every tp rank). Results go to res_i / res_f for the pp broadcast. With truncated_lp the
 * log-sum-exp comes after the draws, over rows whose dropped entries are then -inf: each sampled
 * row's masked shard goes back to the device (one upload per row). */
static void choose_tokens(Engine *e, int R) {
    Model *m = e->m;
    int Vl = m->vocab_local, V = m->cfg.vocab_size, K = e->K;
    /* log-sum-exp of the raw distribution, for logprobs: skipped when nobody reports them (plain
     * greedy or sampling without --logprobs), which saves a pass of exp over the vocabulary */
    int want_lp = e->cfg.want_logprobs;
    for (int r = 0; r < R && !want_lp; r++) want_lp = e->running[r]->logprobs_n > 0 || e->running[r]->forced;
    float T = e->cfg.lp_temperature > 0 ? e->cfg.lp_temperature : 1.0f;
    int trunc = e->cfg.truncated_lp;
    if (want_lp && !trunc) {
        model_logits_lse(m, e->rs.logits, R, T, e->dev_lse, e->dev_sum);
        m->be->to_host(e->lse, e->dev_lse, sizeof(float) * R);
    } else {
        for (int r = 0; r < R; r++) e->lse[r] = NAN;
    }
    model_argmax(m, e->rs.logits, R, e->dev_amax, e->dev_amax_val);           /* greedy without gathering the vocab */
    m->be->to_host(e->amax, e->dev_amax, sizeof(int) * R);
    for (int r = 0; r < R; r++) {
        Seq *s = e->running[r];
        const SamplingParams *p = &s->sp;
        int plain_greedy = sampler_is_greedy(p) && p->repetition_penalty == 1.0f && p->presence_penalty == 0.0f &&
                           p->frequency_penalty == 0.0f && s->logprobs_n == 0 && !held_back(s);
        int *ri = e->res_i + (size_t)r * (1 + K);
        float *rf = e->res_f + (size_t)r * (2 + K);
        if (feeds_part(s)) { ri[0] = 0; continue; }           /* no token this step */
        if (plain_greedy) { ri[0] = e->amax[r]; continue; }
        /* the full row to the host, where the sampler runs (one named transfer; the identity copy of
         * the CPU backend), gathered over tp */
        m->be->to_host(e->full + (size_t)m->mesh->tp_rank * Vl, e->rs.logits + (size_t)r * Vl, sizeof(float) * Vl);
        comm_all_gather(&m->mesh->tp_comm, e->full + (size_t)m->mesh->tp_rank * Vl, e->full, Vl);
        int nt = 0, *top = ri + 1;                               /* top-N of the model's distribution: */
        for (int v = 0; v < V && s->logprobs_n > 0; v++) {     /* one pass, insertion into a sorted list */
            if (!isfinite(e->full[v])) continue;
            if (nt == s->logprobs_n && e->full[v] <= e->full[top[nt - 1]]) continue;
            int j = nt < s->logprobs_n ? nt++ : nt - 1;         /* lowest id first among equals */
            for (; j > 0 && e->full[top[j - 1]] < e->full[v]; j--) top[j] = top[j - 1];
            top[j] = v;
        }
        for (int k = 0; k < s->logprobs_n; k++) {
            if (k >= nt) top[k] = -1;
            rf[2 + k] = k < nt ? e->full[top[k]] - e->lse[r] : -INFINITY;
        }
        for (int k = 0; k < s->n_stop_ids && held_back(s); k++)   /* after the top-N: logprobs stay raw */
            if (s->stop_ids[k] >= 0 && s->stop_ids[k] < V) e->full[s->stop_ids[k]] = -INFINITY;
        if (trunc) {   /* the kept set, then this rank's shard of the masked raw row back to the device */
            sampler_truncate(e->full, V, p, e->proc, e->scratch);
            m->be->to_device(e->rs.logits + (size_t)r * Vl, e->full + (size_t)m->mesh->tp_rank * Vl, sizeof(float) * Vl);
            ri[0] = sampler_draw(e->proc, V, p, s->n_out);
        } else {
            sampler_process(e->full, V, p, s->prompt, s->n_prompt, s->out, s->n_out, e->scratch);
            ri[0] = sampler_draw(e->full, V, p, s->n_out);
        }
        if (ri[0] < 0) rank_error("prompt %d of the input: the model's logits are not finite (NaN or inf) at output token %d", s->index + 1, s->n_out + 1);
    }
    if (want_lp && trunc) {   /* the kept sets' log-normalisers */
        model_logits_lse(m, e->rs.logits, R, T, e->dev_lse, e->dev_sum);
        m->be->to_host(e->lse, e->dev_lse, sizeof(float) * R);
    }
    /* logprobs (raw or truncated distribution) of each chosen token and each appended (chosen or forced) one */
    int *rows = e->lp_rows, *toks = e->lp_toks;
    float *lp = e->lp_vals;
    for (int r = 0; r < R; r++) {
        const Seq *s = e->running[r];
        rows[2 * r] = rows[2 * r + 1] = r;
        toks[2 * r] = e->res_i[(size_t)r * (1 + K)];
        toks[2 * r + 1] = s->forced ? s->forced[s->n_out] : toks[2 * r];
    }
    if (want_lp) {
        m->be->to_device(e->dev_toks, toks, sizeof(int) * 2 * R);
        model_pair_logprobs(m, e->rs.logits, e->dev_lse, 2 * R, rows, e->dev_toks, T, e->dev_pick, e->dev_lp);
        m->be->to_host(lp, e->dev_lp, sizeof(float) * 2 * R);
    } else {
        for (int i = 0; i < 2 * R; i++) lp[i] = NAN;
    }
    for (int r = 0; r < R; r++) {
        e->res_f[(size_t)r * (2 + K)] = lp[2 * r];
        e->res_f[(size_t)r * (2 + K) + 1] = lp[2 * r + 1];
    }
}

static int is_stop_id(const Seq *s, int tok) {
    for (int k = 0; k < s->n_stop_ids; k++) if (s->stop_ids[k] == tok) return 1;
    return 0;
}

static void step(Engine *e) {
    Model *m = e->m;
    schedule(e);
    int R = e->n_running, N = 0;
    long prefill_tokens = 0, decode_tokens = 0;
    for (int r = 0; r < R; r++) {
        Seq *s = e->running[r];
        int n = s->n_cached + s->n_step;
        e->start[r] = N;
        e->pos0[r] = s->n_cached;
        memcpy(e->table_host + (size_t)r * e->max_table, s->table, sizeof(int) * e->max_table);   /* -1 past n_table */
        for (int p = s->n_cached; p < n; p++) e->tokens[N++] = ctx_tok(s, p);
        e->rows[r] = N - 1;
        /* prefill: the prompt, or a recompute; decode: one generated token fed */
        if (s->n_out == 0 || s->n_cached < ctx_len(s) - 1) prefill_tokens += s->n_step;
        else decode_tokens++;
    }
    e->start[R] = N;
    int K = e->K;

    double t0 = now_seconds();
    m->be->to_device(e->dev_tables, e->table_host, sizeof(int) * R * e->max_table);   /* the step's tables, at once */
    Batch b = {R, e->tokens, e->start, e->pos0, e->dev_tables, e->max_table, e->rows, R, e->cfg.micro_batches};
    model_forward_batch(m, &e->rs, &e->kv, &b);
    if (m->is_last) choose_tokens(e, R);
    const Comm *pp = &m->mesh->pp_comm;                         /* choices from the last stage to all */
    comm_broadcast(pp, e->res_i, sizeof(int) * R * (1 + K), pp->size - 1);
    comm_broadcast(pp, e->res_f, sizeof(float) * R * (2 + K), pp->size - 1);
    double dt = now_seconds() - t0;
    /* a step with any prefill is a prefill step, all its tokens included: each rate is its steps'
     * tokens over their time */
    if (prefill_tokens) { e->st.prefill_s += dt; e->st.prefill_tokens += prefill_tokens + decode_tokens; }
    else { e->st.decode_s += dt; e->st.decode_tokens += decode_tokens; }
    e->st.steps++;
    int used = e->kv.n_blocks - e->kv.n_free;
    if (used > e->st.peak_blocks_used) e->st.peak_blocks_used = used;

    /* apply on every rank */
    int keep = 0;
    for (int r = 0; r < R; r++) {
        Seq *s = e->running[r];
        int *ri = e->res_i + (size_t)r * (1 + K);
        float *rf = e->res_f + (size_t)r * (2 + K);
        if (feeds_part(s)) {                                   /* fed part of its context */
            s->n_cached += s->n_step;
            drop_out_of_window(e, s);
            e->running[keep++] = s;
            continue;
        }
        s->n_cached = ctx_len(s);
        int k = s->n_out;
        s->chosen[k] = ri[0];
        s->chosen_lp[k] = rf[0];
        for (int j = 0; j < s->logprobs_n; j++) {
            s->top_ids[(size_t)k * s->logprobs_n + j] = ri[1 + j];
            s->top_lp[(size_t)k * s->logprobs_n + j] = rf[2 + j];
        }
        s->out[k] = s->forced ? s->forced[k] : ri[0];
        s->lp[k] = rf[1];
        s->n_out++;
        if (is_stop_id(s, s->out[k]) && s->n_out >= s->min_new) s->finish = FINISH_STOP;
        else if (e->cfg.on_token && e->cfg.on_token(e->cfg.ctx, s)) s->finish = FINISH_STOP;
        if (!s->finish && (s->n_out >= s->max_new || ctx_len(s) >= e->cfg.max_ctx)) s->finish = FINISH_LENGTH;
        if (s->finish) {
            release_blocks(e, s);
            if (e->cfg.on_finish) e->cfg.on_finish(e->cfg.ctx, s);
            continue;
        }
        drop_out_of_window(e, s);
        e->running[keep++] = s;
    }
    e->n_running = keep;
}

void engine_run(Engine *e) {
    while (e->n_running || e->n_waiting) {
        step(e);
        if (e->cfg.on_step) e->cfg.on_step(e->cfg.ctx);
    }
}
