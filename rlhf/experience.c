/* experience.c — see experience.h. */
#include "rlhf/experience.h"
#include "rlhf/distill.h"
#include "rlhf/episode.h"
#include "runtime/lora.h"
#include "generate/request.h"
#include "rlhf/reward_http.h"
#include "runtime/jsonl.h"
#include "runtime/util.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the batch -------------------------------------------------------------------------------- */

void experience_alloc(Experience *b, int S, int max_len, int with_ref) {
    size_t maxN = (size_t)S * max_len;
    memset(b, 0, sizeof *b);
    b->tokens = xmalloc(sizeof(int) * maxN); b->targets = xmalloc(sizeof(int) * maxN);
    b->seq_start = xmalloc(sizeof(int) * (S + 1));
    b->prompt_len = xmalloc(sizeof(int) * S); b->resp_len = xmalloc(sizeof(int) * S); b->finish = xmalloc(sizeof(int) * S);
    b->mask = xmalloc(sizeof(float) * maxN); b->old_lp = xmalloc(sizeof(float) * maxN);
    b->ref_lp = with_ref ? xmalloc(sizeof(float) * maxN) : NULL;
    b->values = xmalloc(sizeof(float) * maxN);
    b->score = xmalloc(sizeof(double) * S); b->raw = xcalloc(S, sizeof(double)); b->draw = xcalloc(S, sizeof(int));
    b->version = xcalloc(S, sizeof(int));
    b->rewards = xmalloc(sizeof(double) * maxN); b->kl = xmalloc(sizeof(double) * maxN);
    b->adv = xmalloc(sizeof(double) * maxN); b->ret = xmalloc(sizeof(double) * maxN);
    b->adv_f = xmalloc(sizeof(float) * maxN); b->ret_f = xmalloc(sizeof(float) * maxN);
    b->turn = xcalloc(maxN, sizeof(int)); b->turn_r = xcalloc(maxN, sizeof(double));
    b->turns = xcalloc(S, sizeof(int)); b->fault = xcalloc(S, sizeof(int));
}

void experience_free(Experience *b) {
    free(b->tokens); free(b->targets); free(b->seq_start); free(b->prompt_len); free(b->resp_len); free(b->finish);
    free(b->mask); free(b->old_lp); free(b->ref_lp); free(b->values); free(b->score); free(b->raw); free(b->draw); free(b->version); free(b->prox_lp); free(b->rewards); free(b->kl);
    free(b->adv); free(b->ret); free(b->adv_f); free(b->ret_f); free(b->teacher_lp);
    free(b->turn); free(b->turn_r); free(b->turns); free(b->fault);
}

void experience_append(Experience *dst, const Experience *src, int s) {
    int t0 = src->seq_start[s], L = src->seq_start[s + 1] - t0, d = dst->S, n0 = dst->N;
    if (d == 0) dst->seq_start[0] = 0;
    memcpy(dst->tokens + n0, src->tokens + t0, sizeof(int) * L);
    memcpy(dst->targets + n0, src->targets + t0, sizeof(int) * L);
    memcpy(dst->mask + n0, src->mask + t0, sizeof(float) * L);
    memcpy(dst->old_lp + n0, src->old_lp + t0, sizeof(float) * L);
    memcpy(dst->turn + n0, src->turn + t0, sizeof(int) * L);
    memcpy(dst->turn_r + n0, src->turn_r + t0, sizeof(double) * L);
    dst->turns[d] = src->turns[s]; dst->fault[d] = src->fault[s];
    dst->prompt_len[d] = src->prompt_len[s]; dst->resp_len[d] = src->resp_len[s]; dst->finish[d] = src->finish[s];
    dst->score[d] = src->score[s]; dst->draw[d] = src->draw[s]; dst->version[d] = src->version[s];
    dst->N += L;
    dst->seq_start[++dst->S] = dst->N;
}

/* ---- prompts ---------------------------------------------------------------------------------- */

void experience_read_prompts(ExperienceMaker *x, const char *path, const char *key, const char *chat_template, int truncate, int vocab,
                         int max_pos) {
    JsonlReader r;
    jsonl_open(&r, path);
    r.max_positions = max_pos;
    int cap = 0;
    for (cJSON *o; (o = jsonl_next(&r)); cJSON_Delete(o)) {
        if (x->n_prompts == cap) {
            cap = 2 * cap + 64;
            x->prompts = xrealloc(x->prompts, sizeof(TokIds) * cap);
            x->prompt_text = xrealloc(x->prompt_text, sizeof(char *) * cap);
            x->labels = xrealloc(x->labels, sizeof(char *) * cap);
            x->prompt_line = xrealloc(x->prompt_line, sizeof(int) * cap);
            x->prompt_id = xrealloc(x->prompt_id, sizeof(char *) * cap);
            if (x->env_cmd || x->env_url) x->lines = xrealloc(x->lines, sizeof(char *) * cap);
        }
        x->prompt_line[x->n_prompts] = r.line;
        TokIds *t = &x->prompts[x->n_prompts];
        *t = (TokIds){0};
        free(prompt_tokens(x->tok, o, key, chat_template, 0, vocab, path, r.line, t));
        char where[600];
        snprintf(where, sizeof where, "%s:%d", path, r.line);
        prompt_fit(t, experience_resp_max(x), max_pos, truncate, where);
        if (x->lines) x->lines[x->n_prompts] = xstrdup(r.buf);   /* the line's own bytes (rlhf/env.c sends them) */
        x->prompt_text[x->n_prompts] = x->tok ? tokenizer_decode(x->tok, t->ids, t->n, 1, NULL) : xstrdup("");
        if (x->reward_fn) {   /* the verifier's reference: the line itself ("answer" / "tests") */
            char err[300];
            if (verify_ref_check(x->verify_kind, o, err, sizeof err))
                user_error("%s:%d: --reward-fn %s: %s", path, r.line, verify_kind_name(x->verify_kind), err);
            x->refs = xrealloc(x->refs, sizeof(cJSON *) * cap);
            x->refs[x->n_prompts] = cJSON_Duplicate(o, 1);
        }
        const cJSON *label = cJSON_GetObjectItemCaseSensitive(o, "label");
        x->labels[x->n_prompts] = label ? cJSON_PrintUnformatted(label) : NULL;
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "id");
        x->prompt_id[x->n_prompts] = id ? cJSON_PrintUnformatted(id) : NULL;
        x->n_prompts++;
    }
    jsonl_close(&r);
    x->prompts_path = path;
    if (x->n_prompts < x->B)
        user_error("%s: %d prompts, fewer than --rollout-batch-size %d", path, x->n_prompts, x->B);
}

/* The prompts of step `step` (0-based): a fresh shuffle (seeded) per pass over the file. */
void experience_step_prompts(const ExperienceMaker *x, int step, int *out) {
    int per = x->n_prompts / x->B;   /* whole batches per pass; the tail of a pass is not used */
    int pass = step / per, k0 = (step % per) * x->B;
    int *perm = xmalloc(sizeof(int) * x->n_prompts);
    for (int i = 0; i < x->n_prompts; i++) perm[i] = i;
    uint64_t st = splitmix64_mix(x->seed ^ 0x70726f6d707473ull) + (uint64_t)pass;
    shuffle_ints(perm, x->n_prompts, &st);
    memcpy(out, perm + k0, sizeof(int) * x->B);
    free(perm);
}

void experience_prompt_lines(const ExperienceMaker *x, const int *pidx, char *buf, size_t len) {
    int n = 0, shown = x->B < 16 ? x->B : 16;
    buf[0] = 0;
    for (int i = 0; i < shown && n < (int)len; i++)
        n += snprintf(buf + n, len - n, "%s%d", i ? ", " : "", x->prompt_line[pidx[i]]);
    if (shown < x->B && n < (int)len) snprintf(buf + n, len - n, ", ... (%d prompts)", x->B);
}

/* ---- stops ------------------------------------------------------------------------------------- */

void experience_stops(ExperienceMaker *x, const char *model_dir, const ModelConfig *cfg, const char *stop_json,
                      const char *stop_ids) {
    if (stop_json) {   /* one string, or a JSON list of strings (as generate's --stop) */
        x->stops = xcalloc(MAX_STOPS, sizeof(char *));
        x->n_stops = stops_parse_flag(stop_json, x->stops);
        x->ts = xcalloc(x->B * x->G, sizeof(TokStream));
        x->txt = xcalloc(x->B * x->G, sizeof(char *));
        x->tlen = xcalloc(x->B * x->G, sizeof(size_t));
        x->tcap = xcalloc(x->B * x->G, sizeof(size_t));
    }
    /* a response ends at an EOS id, by generate's rule (config.json, generation_config.json, the
     * tokenizer), or at one of --stop-token-ids */
    x->stop_ids = xmalloc(sizeof(int) * EOS_IDS_CAP);
    x->n_stop_ids = eos_ids_load(model_dir, cfg, x->tok, x->stop_ids);
    if (stop_ids) stop_ids_parse_flag(stop_ids, cfg->vocab_size, &x->stop_ids, &x->n_stop_ids);
}

void experience_maker_free(ExperienceMaker *x) {
    reward_cmd_stop(x->rcmd);
    env_close(x->env);
    for (int i = 0; x->lines && i < x->n_prompts; i++) free(x->lines[i]);
    free(x->lines);
    if (x->engine) engine_free(x->engine);
    for (int i = 0; i < x->n_prompts; i++) { tok_ids_free(&x->prompts[i]); free(x->prompt_text[i]); free(x->labels[i]); free(x->prompt_id[i]); }
    for (int i = 0; x->refs && i < x->n_prompts; i++) cJSON_Delete(x->refs[i]);
    free(x->refs);
    free(x->prompts); free(x->prompt_text); free(x->labels); free(x->prompt_line); free(x->prompt_id);
    tokenizer_free(x->tok);
    free(x->stop_ids);
    for (int i = 0; i < x->n_stops; i++) free(x->stops[i]);
    for (int i = 0; x->txt && i < x->B * x->G; i++) free(x->txt[i]);
    for (int i = 0; i < x->n_urls; i++) free(x->urls[i]);
    free(x->urls); free(x->stops); free(x->ts); free(x->txt); free(x->tlen); free(x->tcap);
}

/* ---- 1. rollout ----------------------------------------------------------------------------------- */

/* The engine's per-token callback (every actor rank): does the response now contain a stop string?
 * A stop may straddle tokens, so the search starts where it could have begun. */
int experience_stop_on_token(void *ctx, Seq *q) {
    ExperienceMaker *x = ctx;
    int i = q->index;
    size_t before = x->tlen[i];
    tok_stream_push(&x->ts[i], q->out[q->n_out - 1], &x->txt[i], &x->tlen[i], &x->tcap[i]);
    return stop_find(x->stops, x->n_stops, x->txt[i], x->tlen[i], before) != NULL;
}

void experience_rollout(ExperienceMaker *x, const Roles *rs, int step, const int *pidx, Experience *b) {
    if (x->env_cmd || x->env_url) { episode_rollout(x, rs, step, pidx, b); return; }
    const Role *a = &rs->role[rollout_role(rs)];
    int S = x->B * x->G, M = x->max_new;
    int *out = xcalloc((size_t)S * M, sizeof(int)), *n_out = xcalloc(S, sizeof(int)), *fin = xcalloc(S, sizeof(int));
    float *lp = xcalloc((size_t)S * M, sizeof(float));
    if (a->member) {
        Seq *seqs = xcalloc(S, sizeof(Seq));
        char err[512];
        for (int s = 0; s < S; s++) {
            if (s % a->mesh.dp != a->mesh.dp_rank) continue;
            const TokIds *t = &x->prompts[pidx[s / x->G]];
            Seq *q = &seqs[s];
            q->index = s;
            q->prompt = xmalloc(sizeof(int) * t->n);
            for (size_t i = 0; i < t->n; i++) q->prompt[i] = t->ids[i];
            q->n_prompt = (int)t->n;
            q->sp = x->sp;
            q->sp.seed = splitmix64_mix(x->seed + 0x9E3779B97F4A7C15ull * (uint64_t)(step + 1) + (uint64_t)s + (uint64_t)x->draw * S);
            q->max_new = M;
            q->stop_ids = xmalloc(sizeof(int) * (x->n_stop_ids + 1));
            for (int k = 0; k < x->n_stop_ids; k++) q->stop_ids[q->n_stop_ids++] = x->stop_ids[k];
            seq_alloc_results(q);
            if (x->n_stops) { tok_stream_init(&x->ts[s], x->tok, 1); x->tlen[s] = 0; }
            if (engine_add(x->engine, q, err, sizeof err)) user_error("rollout: %s", err);
        }
        engine_run(x->engine);
        moe_drain(&a->m);   /* --actor-ep > 1: dp ranks finish their rollouts at different steps (runtime/moe_ep.c) */
        for (int s = 0; s < S; s++) {
            if (s % a->mesh.dp != a->mesh.dp_rank) continue;
            Seq *q = &seqs[s];
            n_out[s] = q->n_out;
            fin[s] = q->finish;
            memcpy(out + (size_t)s * M, q->out, sizeof(int) * q->n_out);
            memcpy(lp + (size_t)s * M, q->lp, sizeof(float) * q->n_out);
            free(q->prompt);
            free(q->stop_ids);
            seq_free(q);
        }
        free(seqs);
    }
    roles_share_i(rs, a, out, (size_t)S * M);
    roles_share_i(rs, a, n_out, S);
    roles_share_i(rs, a, fin, S);
    roles_share_f(rs, a, lp, (size_t)S * M);

    /* pack prompt ++ response; actions: the positions before each response token */
    b->S = S;
    b->N = 0;
    b->seq_start[0] = 0;
    for (int s = 0; s < S; s++) {
        const TokIds *t = &x->prompts[pidx[s / x->G]];
        int P = (int)t->n, L = P + n_out[s], n0 = b->N;
        for (int i = 0; i < P; i++) b->tokens[n0 + i] = t->ids[i];
        for (int i = 0; i < n_out[s]; i++) b->tokens[n0 + P + i] = out[(size_t)s * M + i];
        for (int i = 0; i < L; i++) {
            int act = i >= P - 1 && i < L - 1;
            b->targets[n0 + i] = act ? b->tokens[n0 + i + 1] : -1;
            b->mask[n0 + i] = (float)act;
            b->old_lp[n0 + i] = act ? lp[(size_t)s * M + (i - (P - 1))] : 0.0f;
        }
        b->prompt_len[s] = P;
        b->resp_len[s] = n_out[s];
        b->finish[s] = fin[s];
        b->draw[s] = x->draw;
        b->version[s] = step;   /* --async-lag: rlhf/async.c sets the version that sampled it */
        b->N += L;
        b->seq_start[s + 1] = b->N;
    }
    free(out); free(n_out); free(fin); free(lp);
}

/* ---- 2. the passes: forward-only ref, reward and critic, or the reward program ---------------- */

/* Sequences [s0, s1) of b as one forward chunk at most fwd_tokens long, taken by the dp replicas
 * in turn: calls fn for this replica's chunks. */
typedef void (*ChunkFn)(ExperienceMaker *x, Roles *rs, Role *r, Experience *b, int s0, int s1, void *out);
static void chunks(ExperienceMaker *x, Roles *rs, Role *r, Experience *b, ChunkFn fn, void *out) {
    int k = 0;
    for (int s0 = 0; s0 < b->S; k++) {
        int s1 = s0 + 1;
        while (s1 < b->S && b->seq_start[s1 + 1] - b->seq_start[s0] <= x->fwd_tokens) s1++;
        if (k % r->mesh.dp == r->mesh.dp_rank) fn(x, rs, r, b, s0, s1, out);
        s0 = s1;
    }
    if (k % r->mesh.dp && r->mesh.dp_rank >= k % r->mesh.dp) moe_idle_pass(&r->m);   /* ep > 1: the last round's */
}

/* model_forward of sequences [s0, s1) of b, from their own positions 0 */
static void chunk_forward(Model *m, const Experience *b, int s0, int s1) {
    int t0 = b->seq_start[s0], *st = xmalloc(sizeof(int) * (s1 - s0 + 1));
    for (int s = s0; s <= s1; s++) st[s - s0] = b->seq_start[s] - t0;
    model_forward(m, b->tokens + t0, st, s1 - s0);
    free(st);
}

/* ref logprobs at the temperature, at the chunk's actions */
static void ref_chunk(ExperienceMaker *x, Roles *rs, Role *r, Experience *b, int s0, int s1, void *outp) {
    (void)rs;
    float *out = outp;
    Model *m = &r->m;
    int t0 = b->seq_start[s0], N = b->seq_start[s1] - t0;
    chunk_forward(m, b, s0, s1);
    if (m->is_last)
        model_target_logprobs(m, &m->s.lp, m->s.logits, N, N, NULL, b->targets + t0, x->sp.temperature, out + t0);
    comm_broadcast(&m->mesh->pp_comm, out + t0, sizeof(float) * N, m->mesh->pp_comm.size - 1);
}

/* score-head values at every position of the chunk (critic), or at each sequence's last (reward) */
static void value_chunk(ExperienceMaker *x, Roles *rs, Role *r, Experience *b, int s0, int s1, void *outp) {
    (void)x;
    Model *m = &r->m;
    int t0 = b->seq_start[s0], N = b->seq_start[s1] - t0;
    float *v = xmalloc(sizeof(float) * N);
    chunk_forward(m, b, s0, s1);
    if (m->is_last) m->be->to_host(v, m->s.logits, sizeof(float) * N);
    comm_broadcast(&m->mesh->pp_comm, v, sizeof(float) * N, m->mesh->pp_comm.size - 1);
    if (r == &rs->role[R_REWARD]) {
        double *score = outp;
        for (int s = s0; s < s1; s++) score[s] = v[b->seq_start[s + 1] - 1 - t0];
    } else {
        float *out = outp;
        for (int n = 0; n < N; n++) out[t0 + n] = b->mask[t0 + n] > 0 ? v[n] : 0.0f;
    }
    free(v);
}

/* Rewards from the command or the servers, asked by world rank 0 and broadcast. A failure stops
 * the run (rank_error): the last checkpoint stays as it was. */
static void reward_from_program(ExperienceMaker *x, Roles *rs, Experience *b, const int *pidx) {
    if (rs->world_rank == 0) {
        const char **pr = xmalloc(sizeof(char *) * b->S), **rs = xmalloc(sizeof(char *) * b->S);
        const char **lb = xmalloc(sizeof(char *) * b->S);
        for (int s = 0; s < b->S; s++) {
            pr[s] = x->prompt_text[pidx[s / x->G]];
            lb[s] = x->labels[pidx[s / x->G]];
            const int *resp = b->tokens + b->seq_start[s] + b->prompt_len[s];
            rs[s] = tokenizer_decode(x->tok, (const int32_t *)resp, (size_t)b->resp_len[s], 1, NULL);
        }
        char err[1024];
        b->n_timed_out = 0;
        if (x->reward_fn) {   /* a built-in verifier: response against the prompt line's reference */
            const cJSON **refs = xmalloc(sizeof(cJSON *) * b->S);
            VerifyResult *vr = xmalloc(sizeof(VerifyResult) * b->S);
            for (int s = 0; s < b->S; s++) refs[s] = x->refs[pidx[s / x->G]];
            if (verify_batch(x->verify_kind, b->S, rs, refs, x->reward_workers, x->fn_timeout, vr, err, sizeof err))
                rank_error("--reward-fn %s: %s", verify_kind_name(x->verify_kind), err);
            for (int s = 0; s < b->S; s++) { b->score[s] = vr[s].reward; b->n_timed_out += vr[s].timed_out; }
            free(refs); free(vr);
        } else if (x->n_urls) {   /* OpenRLHF's "query": the prompt and response as one text */
            char **qs = xmalloc(sizeof(char *) * b->S);
            for (int s = 0; s < b->S; s++) {
                size_t a = strlen(pr[s]), c = strlen(rs[s]);
                qs[s] = xmalloc(a + c + 1);
                memcpy(qs[s], pr[s], a);
                memcpy(qs[s] + a, rs[s], c + 1);
            }
            int rc = reward_http_score((const char *const *)x->urls, x->n_urls, b->S, (const char *const *)qs, pr, lb,
                                       b->score, x->reward_timeout, x->reward_retries, err, sizeof err);
            for (int s = 0; s < b->S; s++) free(qs[s]);
            free(qs);
            if (rc) rank_error("%s", err);
        } else if (reward_cmd_score(x->rcmd, b->S, pr, rs, lb, b->score, x->reward_timeout, err, sizeof err)) {
            reward_cmd_stop(x->rcmd);
            x->rcmd = NULL;
            rank_error("%s", err);
        }
        for (int s = 0; s < b->S; s++) free((char *)rs[s]);
        free(pr); free(rs); free(lb);
    }
    comm_broadcast(&rs->world, b->score, sizeof(double) * b->S, 0);
    comm_broadcast(&rs->world, &b->n_timed_out, sizeof(int), 0);
}

/* The three experience passes, each leaving its result on every rank (a role's dp replicas fill
 * their own chunks of a zeroed buffer, which share_* sums). */
void experience_ref(ExperienceMaker *x, Roles *rs, Experience *b) {
    Role *r = &rs->role[x->lora_ref ? R_ACTOR : R_REF];   /* LoRA: the actor's base, adapters off */
    if (!x->lora_ref && !r->active) return;
    memset(b->ref_lp, 0, sizeof(float) * b->N);
    if (r->member && x->lora_ref) r->m.lora->enabled = 0;
    if (r->member) chunks(x, rs, r, b, ref_chunk, b->ref_lp);
    if (r->member && x->lora_ref) r->m.lora->enabled = 1;
    roles_share_f(rs, r, b->ref_lp, b->N);
}
void experience_teacher(ExperienceMaker *x, Roles *rs, Experience *b) {
    Role *r = &rs->role[R_TEACHER];
    if (!r->active) return;
    memset(b->teacher_lp, 0, sizeof(float) * b->N);
    if (r->member) chunks(x, rs, r, b, ref_chunk, b->teacher_lp);
    roles_share_f(rs, r, b->teacher_lp, b->N);
}
void experience_prox(ExperienceMaker *x, Roles *rs, Experience *b) {
    Role *r = &rs->role[R_ACTOR];
    memset(b->prox_lp, 0, sizeof(float) * b->N);
    if (r->member) chunks(x, rs, r, b, ref_chunk, b->prox_lp);
    roles_share_f(rs, r, b->prox_lp, b->N);
}
void experience_reward(ExperienceMaker *x, Roles *rs, Experience *b, const int *pidx) {
    Role *r = &rs->role[R_REWARD];
    memset(b->score, 0, sizeof(double) * b->S);
    if (x->env_cmd || x->env_url) {   /* the episode's: the sum of its turns' rewards (every rank has them) */
        for (int s = 0; s < b->S; s++)
            for (int n = b->seq_start[s]; n < b->seq_start[s + 1]; n++) b->score[s] += b->turn_r[n];
        return;
    }
    if (x->reward_cmd || x->n_urls || x->reward_fn) { reward_from_program(x, rs, b, pidx); return; }
    if (!r->active) return;   /* --teacher alone: no reward, the scores stay 0 */
    if (r->member) chunks(x, rs, r, b, value_chunk, b->score);
    roles_share_d(rs, r, b->score, b->S);
    /* the bound of a program's rewards (reward_cmd.h) holds for the model's scores too; every rank
     * has the same scores */
    for (int s = 0; s < b->S; s++)
        if (!(fabs(b->score[s]) <= REWARD_ABS_MAX))
            user_error("reward model %s: score %.9g of sample %d (prompt %d) is outside [-%g, %g]", r->dir, b->score[s],
                       s + 1, pidx[s / x->G] + 1, REWARD_ABS_MAX, REWARD_ABS_MAX);
}
void experience_values(ExperienceMaker *x, Roles *rs, Experience *b) {
    Role *r = &rs->role[R_CRITIC];
    memset(b->values, 0, sizeof(float) * b->N);
    if (!r->active) return;
    if (r->member) chunks(x, rs, r, b, value_chunk, b->values);
    roles_share_f(rs, r, b->values, b->N);
}

/* ---- 3. advantages ---------------------------------------------------------------------------- */

double experience_shape_score(const ExperienceMaker *x, const Experience *b, int s, double raw, double *overlong, double *eos) {
    double v = raw, ol = 0.0, ep = 0.0;
    if (x->has_norm) v = (v - x->norm_mean) / x->norm_std;
    if (x->overlong_buffer > 0) {   /* verl's DAPORewardManager: expected_len = Lmax - L; exceed_len = n - expected_len */
        double exceed = (double)b->resp_len[s] - (double)(x->max_new - x->overlong_buffer);
        ol = -exceed / x->overlong_buffer * x->overlong_factor;
        if (!(ol < 0.0)) ol = 0.0;
        v += ol;
    }
    if (x->eos_penalty != 0 && b->finish[s] != FINISH_STOP) ep = -x->eos_penalty, v -= x->eos_penalty;
    if (x->reward_clip > 0) v = v < -x->reward_clip ? -x->reward_clip : v > x->reward_clip ? x->reward_clip : v;
    if (overlong) *overlong = ol;
    if (eos) *eos = ep;
    return v;
}

void experience_mask_truncated(Experience *b) {
    for (int s = 0; s < b->S; s++)
        if (b->finish[s] != FINISH_STOP)
            for (int n = b->seq_start[s]; n < b->seq_start[s + 1]; n++) b->mask[n] = 0.0f;
}

double experience_advantages(const ExperienceMaker *x, Experience *b, double kl_coef, int step, const int *pidx) {
    int S = b->S, N = b->N;
    double score_raw = 0, *raw = b->raw;   /* kept: the dump and the metrics take the shaping's parts from it */
    for (int s = 0; s < S; s++) {   /* the score: normalised, overlong and missing-EOS penalties, clipped */
        raw[s] = b->score[s];
        score_raw += raw[s];
        b->score[s] = experience_shape_score(x, b, s, raw[s], NULL, NULL);
    }
    /* grpo / rloo / reinforce++-baseline: outcome rewards, KL in the loss */
    double kl_pen = advantage_kl_in_reward(x->adv_kind) ? kl_coef : 0.0;
    /* episodes: each turn's reward at its last action, and the shaping (shaped - raw) at the last */
    double *last = b->score;
    if (x->env_cmd || x->env_url) {
        last = xmalloc(sizeof(double) * S);
        for (int s = 0; s < S; s++) last[s] = b->score[s] - raw[s];
    }
    ppo_token_rewards(b->seq_start, S, b->mask, b->old_lp, b->ref_lp ? b->ref_lp : b->old_lp, last, x->kl_est,
                      b->ref_lp ? kl_pen : 0.0, b->rewards, b->kl);
    if (last != b->score) {
        for (int n = 0; n < N; n++) if (b->mask[n] > 0) b->rewards[n] += b->turn_r[n];
        free(last);
    }
    if (x->adv_kind == ADV_GAE) {
        ppo_gae(b->seq_start, S, b->mask, b->rewards, b->values, x->gamma, x->lambda, b->adv, b->ret);
        if (x->whiten) ppo_whiten(b->adv, b->mask, N);
    } else if (x->adv_kind == ADV_RPP) {   /* discounted returns of the token rewards, whitened */
        ppo_discounted_returns(b->seq_start, S, b->mask, b->rewards, x->gamma, b->ret);
        memcpy(b->adv, b->ret, sizeof(double) * N);
        ppo_whiten(b->adv, b->mask, N);
    } else {
        outcome_advantages(x->adv_kind, b->seq_start, S, b->mask, b->score, x->G, x->std_norm, 1e-6, b->adv);
        memset(b->ret, 0, sizeof(double) * N);
    }
    if (b->teacher_lp) b->teacher_kl = distill_advantages(b->mask, b->old_lp, b->teacher_lp, N, x->distill_coef, b->adv);
    for (int n = 0; n < N; n++) { b->adv_f[n] = (float)b->adv[n]; b->ret_f[n] = (float)b->ret[n]; }
    /* bounded rewards give finite advantages, but shaping (--normalize-reward's std,
     * --missing-eos-penalty) and the critic's values can still overflow: an update on them would
     * make every weight NaN. Every rank computed the same numbers. */
    for (int s = 0; s < S; s++)
        for (int n = b->seq_start[s]; n < b->seq_start[s + 1]; n++)
            if (!isfinite(b->adv_f[n]) || !isfinite(b->ret_f[n]))
                user_error("step %d: sample %d (prompt %d, reward %.9g, %.9g after shaping) gives a non-finite advantage or "
                           "return; the step is not applied", step + 1, s + 1, pidx[s / x->G] + 1, raw[s], b->score[s]);
    return score_raw;
}

/* ---- 4. mini-batches ---------------------------------------------------------------------------- */

void minibatch_alloc(Minibatch *mb, int max_mb, int micro, int max_len) {
    mb->micro = micro;
    mb->cap = micro * max_len;
    mb->agg = AGG_TOKEN_MEAN;
    mb->agg_norm = 0;
    mb->mbs = xcalloc(max_mb, sizeof(MicroBatch));
    mb->ctx = xcalloc(max_mb, sizeof(PpoCtx));
    mb->tok = xmalloc(sizeof(int) * max_mb * mb->cap);
    mb->tgt = xmalloc(sizeof(int) * max_mb * mb->cap);
    mb->st = xmalloc(sizeof(int) * max_mb * (micro + 1));
    mb->fl = xmalloc(sizeof(float) * max_mb * mb->cap * 5);
}

void minibatch_free(Minibatch *mb) {
    free(mb->mbs); free(mb->ctx); free(mb->tok); free(mb->tgt); free(mb->st); free(mb->fl);
}

/* sequence s's actions in the loss */
static int loss_actions(const Experience *b, int s) {
    int a = 0;
    for (int n = b->seq_start[s]; n < b->seq_start[s + 1]; n++) a += b->mask[n] > 0;
    return a;
}

int experience_minibatch(const Experience *b, const int *perm, int k0, int mini, int dp, int dp_rank, int actor,
                         int check_logprobs, Minibatch *mb) {
    int micro = mb->micro, cap = mb->cap;
    long actions = 0;   /* the actions in the loss (--mask-truncated leaves some out) */
    int n_seqs = 0;     /* the sequences with one (verl's seq-mean leaves out the fully masked) */
    for (int k = k0; k < k0 + mini; k++) {
        int a = loss_actions(b, perm[k]);
        actions += a;
        n_seqs += a > 0;
    }
    int n_mb = 0, fill = 0;
    for (int k = k0 + dp_rank; k < k0 + mini; k += dp) {
        int s = perm[k], i = n_mb - (fill ? 1 : 0);
        if (!fill) {   /* a new micro-batch */
            i = n_mb++;
            float *f = mb->fl + (size_t)i * cap * 5;
            mb->mbs[i] = (MicroBatch){mb->tok + (size_t)i * cap, mb->st + (size_t)i * (micro + 1), 0,
                                      mb->tgt + (size_t)i * cap, f, &mb->ctx[i]};
            mb->st[(size_t)i * (micro + 1)] = 0;
            if (actor) mb->ctx[i] = (PpoCtx){f + cap, f + 2 * cap, f + 3 * cap, NULL, NULL, b->prox_lp && !b->prox_self ? f + 4 * cap
                                             : NULL, check_logprobs, b->prox_self};
            else mb->ctx[i] = (PpoCtx){NULL, NULL, NULL, f + cap, f + 2 * cap, NULL, 0, 0};
        }
        MicroBatch *m = &mb->mbs[i];
        int *sst = (int *)m->seq_start, n0 = sst[m->n_seqs], t0 = b->seq_start[s];
        int L = b->seq_start[s + 1] - t0;
        float *f = (float *)m->weight, w = (float)loss_agg_weight(mb->agg, loss_actions(b, s), n_seqs, actions, mb->agg_norm, dp);
        memcpy((int *)m->tokens + n0, b->tokens + t0, sizeof(int) * L);
        memcpy((int *)m->targets + n0, b->targets + t0, sizeof(int) * L);
        for (int n = 0; n < L; n++) {
            f[n0 + n] = b->mask[t0 + n] * w;
            if (actor) {
                f[cap + n0 + n] = b->old_lp[t0 + n];
                f[2 * cap + n0 + n] = b->ref_lp ? b->ref_lp[t0 + n] : 0.0f;
                f[3 * cap + n0 + n] = b->adv_f[t0 + n];
                if (b->prox_lp && !b->prox_self) f[4 * cap + n0 + n] = b->prox_lp[t0 + n];
            } else {
                f[cap + n0 + n] = b->values[t0 + n];
                f[2 * cap + n0 + n] = b->ret_f[t0 + n];
            }
        }
        sst[++m->n_seqs] = n0 + L;
        fill = m->n_seqs < micro;
    }
    return n_mb;
}
