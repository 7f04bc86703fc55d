/* episode.c — see episode.h. */
#include "rlhf/episode.h"
#include "runtime/util.h"
#include <stdlib.h>
#include <string.h>

/* The episodes of one rollout, the same on every actor rank. Per episode s: its prompt ids (from
 * x->prompts), then n[s] tokens after it in after[s * E ...], each the model's (model 1, its logprob
 * in lp) or the environment's (model 0, lp 0), with its turn. */
typedef struct {
    int S, E, M;              /* episodes, tokens after a prompt at most, tokens of one turn at most */
    int *after;               /* (S, E) the ids after the prompt */
    int *model, *turn;        /* (S, E) the model's token?; the turn it belongs to or answers */
    float *lp;                /* (S, E) the model's tokens' logprobs at the temperature */
    double *rw;               /* (S, E) the environment's reward of a turn at its last model token */
    int *n, *fin, *turns, *fault, *live;   /* (S) */
} Episodes;

/* the episodes' arrays in shared buffers: ints (S * (3 E + 4)), lp (S E), rw (S E) */
static void episodes_view(Episodes *ep, int *ints, float *lp, double *rw) {
    size_t SE = (size_t)ep->S * ep->E;
    ep->after = ints; ep->model = ints + SE; ep->turn = ints + 2 * SE;
    ep->n = ints + 3 * SE; ep->fin = ep->n + ep->S; ep->turns = ep->fin + ep->S; ep->fault = ep->turns + ep->S;
    ep->lp = lp; ep->rw = rw;
}

static void ep_push(Episodes *ep, int s, int id, int model, int turn, float lp) {
    size_t k = (size_t)s * ep->E + ep->n[s]++;
    CHECK(ep->n[s] <= ep->E);
    ep->after[k] = id; ep->model[k] = model; ep->turn[k] = turn; ep->lp[k] = lp;
}

int episode_id(const ExperienceMaker *x, int step, int s) {
    int draws = x->dynamic_sampling ? x->max_draws : 1, S = x->B * x->G;
    return (step * draws + x->draw) * S + s;
}

void episode_env_open(ExperienceMaker *x, const Roles *rs, int chat, const char *chat_template) {
    const Role *a = &rs->role[R_ACTOR];
    char err[1024];
    if (!(x->env_cmd || x->env_url)) return;
    if (chat && (x->env_chat = chat_format_resolve(x->tok, chat_template, err, sizeof err)) < 0)
        user_error("--env-chat-template: %s (the feedback is rendered as a user message of the actor's chat template)", err);
    if (!a->member || !mesh_is_root(&a->mesh)) return;
    x->env = env_open(x->env_cmd, x->env_url, x->env_timeout, err, sizeof err);
    if (!x->env) rank_error("%s", err);
}

/* ---- the environment's text as ids (the actor's root) ------------------------------------------ */

/* text tokenised once on its own (no BOS), or with --env-chat-template as a user message closing
 * the model's turn: what the template puts after an assistant turn's end-of-turn token (ChatML's
 * "\n"), the user message, the generation prompt; the turns before are never re-rendered. */
static void env_ids(ExperienceMaker *x, const char *text, int chat, TokIds *out) {
    out->n = 0;
    if (!chat || x->env_chat < 0) { tokenizer_encode(x->tok, text, strlen(text), 0, out, NULL); return; }
    ChatMessage m[3] = {{"user", "u"}, {"assistant", "a"}, {"user", text}};
    unsigned char *bm0 = NULL, *bm1 = NULL;
    size_t n0 = 0, n1 = 0, e = 0;
    char err[256];
    char *t0 = chat_render_text(x->tok, (ChatFormat)x->env_chat, m, 2, 0, &bm0, &n0, err, sizeof err);
    char *t1 = t0 ? chat_render_text(x->tok, (ChatFormat)x->env_chat, m, 3, 1, &bm1, &n1, err, sizeof err) : NULL;
    if (!t1) rank_error("--env-chat-template %s: %s", chat_format_name((ChatFormat)x->env_chat), err);
    if (n1 < n0 || memcmp(t0, t1, n0))
        rank_error("--env-chat-template %s: the template renders a conversation's earlier turns differently once a "
                   "message follows, so feedback cannot be appended without re-rendering", chat_format_name((ChatFormat)x->env_chat));
    for (size_t i = 0; i < n0; i++) if (bm0[i]) e = i + 1;   /* just after the assistant's end-of-turn token */
    size_t len = (n0 - e) + (n1 - n0);
    char *s = xmalloc(len + 1);
    memcpy(s, t0 + e, n0 - e);
    memcpy(s + (n0 - e), t1 + n0, n1 - n0);
    tokenizer_encode(x->tok, s, len, 0, out, NULL);
    free(s); free(t0); free(t1); free(bm0); free(bm1);
}

/* The replies of the live episodes (reset: all) as the actor's ranks need them, from the root over
 * mesh.group: per episode its ids' count, done, fault and reward, then the ids. On the root, reply
 * (S) and chat say what to send. ids: (S, E) each episode's ids (first cnt[s]). */
static void share_replies(ExperienceMaker *x, const Role *a, const Episodes *ep, const EnvReply *reply, int chat,
                          int *hdr, double *rew, int *ids) {
    int S = ep->S, E = ep->E;
    if (reply) {
        TokIds t = {0};
        for (int s = 0; s < S; s++) {
            hdr[3 * s] = hdr[3 * s + 1] = hdr[3 * s + 2] = 0;
            rew[s] = 0;
            if (!ep->live[s]) continue;
            env_ids(x, reply[s].text ? reply[s].text : "", chat, &t);
            hdr[3 * s] = t.n < (size_t)E ? (int)t.n : E;   /* more than E ends the episode anyway */
            memcpy(ids + (size_t)s * E, t.ids, sizeof(int) * hdr[3 * s]);
            hdr[3 * s + 1] = reply[s].done;
            hdr[3 * s + 2] = (int)reply[s].fault;
            rew[s] = reply[s].reward;
        }
        tok_ids_free(&t);
    }
    comm_broadcast(&a->mesh.group, hdr, sizeof(int) * 3 * S, 0);
    comm_broadcast(&a->mesh.group, rew, sizeof(double) * S, 0);
    comm_broadcast(&a->mesh.group, ids, sizeof(int) * (size_t)S * E, 0);
}

/* ---- the loop (the actor's ranks) ----------------------------------------------------------------- */

static uint64_t turn_seed(const ExperienceMaker *x, int step, int s, int turn) {
    uint64_t S = (uint64_t)x->B * x->G;
    return splitmix64_mix(splitmix64_mix(x->seed + 0x9E3779B97F4A7C15ull * (uint64_t)(step + 1) + (uint64_t)s +
                                         (uint64_t)x->draw * S) + 0xD1B54A32D192ED03ull * (uint64_t)turn);
}

/* Turn t of every live episode: this dp replica's through the engine, then every replica's tokens
 * to every actor rank (summed over dp: zeros elsewhere). out (S, M), n_out (S), lp (S, M). */
static void generate_turn(ExperienceMaker *x, const Role *a, const Episodes *ep, const int *pidx, int step, int t,
                          int *out, int *n_out, float *lp) {
    int S = ep->S, M = ep->M;
    memset(out, 0, sizeof(int) * (size_t)S * M); memset(lp, 0, sizeof(float) * (size_t)S * M);
    memset(n_out, 0, sizeof(int) * S);
    Seq *seqs = xcalloc(S, sizeof(Seq));
    char err[512];
    for (int s = 0; s < S; s++) {
        if (!ep->live[s] || s % a->mesh.dp != a->mesh.dp_rank) continue;
        const TokIds *pr = &x->prompts[pidx[s / x->G]];
        Seq *q = &seqs[s];
        int P = (int)pr->n, room = ep->E - ep->n[s];
        q->index = s;
        q->n_prompt = P + ep->n[s];
        q->prompt = xmalloc(sizeof(int) * q->n_prompt);
        for (int i = 0; i < P; i++) q->prompt[i] = pr->ids[i];
        memcpy(q->prompt + P, ep->after + (size_t)s * ep->E, sizeof(int) * ep->n[s]);
        q->sp = x->sp;
        q->sp.seed = turn_seed(x, step, s, t);
        q->max_new = x->max_new < room ? x->max_new : room;
        q->stop_ids = xmalloc(sizeof(int) * (x->n_stop_ids + 1));
        for (int k = 0; k < x->n_stop_ids; k++) q->stop_ids[q->n_stop_ids++] = x->stop_ids[k];
        seq_alloc_results(q);
        if (x->n_stops) { tok_stream_init(&x->ts[s], x->tok, 1); x->tlen[s] = 0; }   /* this turn's text only */
        if (engine_add(x->engine, q, err, sizeof err)) user_error("rollout: %s", err);
    }
    engine_run(x->engine);
    for (int s = 0; s < S; s++) {
        Seq *q = &seqs[s];
        if (!q->prompt) continue;
        n_out[s] = q->n_out;
        memcpy(out + (size_t)s * M, q->out, sizeof(int) * q->n_out);
        memcpy(lp + (size_t)s * M, q->lp, sizeof(float) * q->n_out);
        free(q->prompt); free(q->stop_ids);
        seq_free(q);
    }
    free(seqs);
    comm_all_reduce_sum_int(&a->mesh.dp_comm, out, (size_t)S * M);
    comm_all_reduce_sum_int(&a->mesh.dp_comm, n_out, S);
    comm_all_reduce_sum(&a->mesh.dp_comm, lp, (size_t)S * M);
}

/* The environment's step of every live episode (the root asks; errors of the environment stop the
 * run), into reply (S). */
static void step_env(ExperienceMaker *x, const Episodes *ep, int step, int t, const int *out, const int *n_out,
                     EnvReply *reply) {
    int S = ep->S, n = 0;
    int *id = xmalloc(sizeof(int) * S), *turn = xmalloc(sizeof(int) * S), *nid = xmalloc(sizeof(int) * S), *who = xmalloc(sizeof(int) * S);
    const char **act = xmalloc(sizeof(char *) * S);
    const int **aid = xmalloc(sizeof(int *) * S);
    for (int s = 0; s < S; s++) {
        if (!ep->live[s]) continue;
        const int *o = out + (size_t)s * ep->M;
        who[n] = s; id[n] = episode_id(x, step, s); turn[n] = t; aid[n] = o; nid[n] = n_out[s];
        act[n] = tokenizer_decode(x->tok, (const int32_t *)o, (size_t)n_out[s], 1, NULL);
        n++;
    }
    EnvReply *r = xcalloc(n > 0 ? n : 1, sizeof(EnvReply));
    char err[1024];
    if (n && env_step(x->env, n, id, turn, act, aid, nid, r, err, sizeof err)) rank_error("%s", err);
    for (int i = 0; i < n; i++) { reply[who[i]] = r[i]; free((char *)act[i]); }
    free(r); free(id); free(turn); free(nid); free(who); free(act); free(aid);
}

/* The resets of every episode (the root asks), into reply (S). */
static void reset_env(ExperienceMaker *x, int S, int step, const int *pidx, EnvReply *reply) {
    int *id = xmalloc(sizeof(int) * S);
    const char **line = xmalloc(sizeof(char *) * S);
    char **own = xcalloc(S, sizeof(char *));
    for (int s = 0; s < S; s++) {
        int p = pidx[s / x->G];
        id[s] = episode_id(x, step, s);
        line[s] = x->lines ? x->lines[p] : (own[s] = xstrdup("{}"));
    }
    char err[1024];
    if (env_reset(x->env, S, id, line, reply, err, sizeof err)) rank_error("%s", err);
    for (int s = 0; s < S; s++) free(own[s]);
    free(id); free(line); free(own);
}

/* Applies the shared replies: an episode's end (done, a fault, --max-turns, no room left), the
 * reward of turn t at its last token (t > 0), the ids appended otherwise. */
static void apply_replies(const ExperienceMaker *x, Episodes *ep, int t, const int *hdr, const double *rew, const int *ids) {
    for (int s = 0; s < ep->S; s++) {
        if (!ep->live[s]) continue;
        int cnt = hdr[3 * s], done = hdr[3 * s + 1], fault = hdr[3 * s + 2];
        if (fault) {   /* the episode ends, scoring 0 at every turn */
            ep->fault[s] = fault;
            for (int i = 0; i < ep->n[s]; i++) ep->rw[(size_t)s * ep->E + i] = 0;
            ep->live[s] = 0;
            ep->fin[s] = FINISH_STOP;
            continue;
        }
        if (t > 0) ep->rw[(size_t)s * ep->E + ep->n[s] - 1] = rew[s];
        if (done) { ep->live[s] = 0; ep->fin[s] = FINISH_STOP; continue; }
        if (t == x->max_turns || ep->n[s] + cnt >= ep->E) { ep->live[s] = 0; ep->fin[s] = FINISH_LENGTH; continue; }
        for (int i = 0; i < cnt; i++) ep_push(ep, s, ids[(size_t)s * ep->E + i], 0, t, 0.0f);
    }
}

/* every turn of every episode, on the actor's ranks */
static void run_episodes(ExperienceMaker *x, const Role *a, Episodes *ep, int step, const int *pidx) {
    int S = ep->S, M = ep->M, root = mesh_is_root(&a->mesh);
    int *hdr = xmalloc(sizeof(int) * 3 * S), *ids = xmalloc(sizeof(int) * (size_t)S * ep->E);
    int *out = xmalloc(sizeof(int) * (size_t)S * M), *n_out = xmalloc(sizeof(int) * S);
    float *lp = xmalloc(sizeof(float) * (size_t)S * M);
    double *rew = xmalloc(sizeof(double) * S);
    EnvReply *reply = root ? xcalloc(S, sizeof(EnvReply)) : NULL;
    for (int s = 0; s < S; s++) ep->live[s] = 1;
    if (root) reset_env(x, S, step, pidx, reply);
    share_replies(x, a, ep, reply, 0, hdr, rew, ids);   /* the observations: a done at reset is ignored */
    for (int s = 0; s < S; s++) hdr[3 * s + 1] = 0;
    apply_replies(x, ep, 0, hdr, rew, ids);
    for (int t = 1; t <= x->max_turns; t++) {
        int any = 0;
        for (int s = 0; s < S; s++) any |= ep->live[s];
        if (!any) break;
        generate_turn(x, a, ep, pidx, step, t, out, n_out, lp);
        for (int s = 0; s < S; s++) {
            if (!ep->live[s]) continue;
            for (int i = 0; i < n_out[s]; i++) ep_push(ep, s, out[(size_t)s * M + i], 1, t, lp[(size_t)s * M + i]);
            ep->turns[s] = t;
        }
        for (int s = 0; root && s < S; s++) free(reply[s].text), reply[s].text = NULL;
        if (root) step_env(x, ep, step, t, out, n_out, reply);
        share_replies(x, a, ep, reply, 1, hdr, rew, ids);
        apply_replies(x, ep, t, hdr, rew, ids);
    }
    for (int s = 0; root && s < S; s++) free(reply[s].text);
    free(hdr); free(ids); free(out); free(n_out); free(lp); free(rew); free(reply);
}

/* ---- packing ------------------------------------------------------------------------------------ */

/* prompt ++ episode into b: actions are the positions before the model's tokens */
static void pack(const ExperienceMaker *x, const Episodes *ep, const int *pidx, Experience *b) {
    b->S = ep->S;
    b->N = 0;
    b->seq_start[0] = 0;
    for (int s = 0; s < ep->S; s++) {
        const TokIds *t = &x->prompts[pidx[s / x->G]];
        size_t e0 = (size_t)s * ep->E;
        int P = (int)t->n, L = P + ep->n[s], n0 = b->N;
        for (int i = 0; i < P; i++) b->tokens[n0 + i] = t->ids[i], b->turn[n0 + i] = 0;
        for (int i = 0; i < ep->n[s]; i++) b->tokens[n0 + P + i] = ep->after[e0 + i], b->turn[n0 + P + i] = ep->turn[e0 + i];
        for (int i = 0; i < L; i++) {
            int k = i + 1 - P;   /* the next token's index after the prompt */
            int act = k >= 0 && i < L - 1 && ep->model[e0 + k];
            b->targets[n0 + i] = act ? b->tokens[n0 + i + 1] : -1;
            b->mask[n0 + i] = (float)act;
            b->old_lp[n0 + i] = act ? ep->lp[e0 + k] : 0.0f;
            b->turn_r[n0 + i] = act ? ep->rw[e0 + k] : 0.0;
        }
        b->prompt_len[s] = P;
        b->resp_len[s] = ep->n[s];
        b->finish[s] = ep->fin[s];
        b->turns[s] = ep->turns[s];
        b->fault[s] = ep->fault[s];
        b->draw[s] = x->draw;
        b->N += L;
        b->seq_start[s + 1] = b->N;
    }
}

void episode_rollout(ExperienceMaker *x, const Roles *rs, int step, const int *pidx, Experience *b) {
    const Role *a = &rs->role[R_ACTOR];
    Episodes ep = {.S = x->B * x->G, .E = x->max_ep_tokens, .M = x->max_new};
    size_t SE = (size_t)ep.S * ep.E;
    int *ints = xcalloc(3 * SE + 4 * (size_t)ep.S, sizeof(int));
    float *lp = xcalloc(SE, sizeof(float));
    double *rw = xcalloc(SE, sizeof(double));
    episodes_view(&ep, ints, lp, rw);
    ep.live = xcalloc(ep.S, sizeof(int));
    if (a->member) {
        run_episodes(x, a, &ep, step, pidx);
        if (a->mesh.dp_rank != 0) {   /* every dp replica has them all: one copy to the sum */
            memset(ints, 0, sizeof(int) * (3 * SE + 4 * (size_t)ep.S));
            memset(lp, 0, sizeof(float) * SE);
            memset(rw, 0, sizeof(double) * SE);
        }
    }
    roles_share_i(rs, a, ints, 3 * SE + 4 * (size_t)ep.S);
    roles_share_f(rs, a, lp, SE);
    roles_share_d(rs, a, rw, SE);
    pack(x, &ep, pidx, b);
    free(ints); free(lp); free(rw); free(ep.live);
}
