/* ppo.c — `tandem ppo`: PPO / GRPO / RLOO with actor, critic, reference and reward as role groups of
 * one job. The actor generates with its own training shards (generate/engine.c on the live
 * weights: no copy, no second model), so its rollout logprobs ARE its training logprobs: the first
 * mini-batch of every step asserts it bit for bit (rollout_logprob_diff_max, always 0).
 *
 * Placement: the world is cut into role groups (runtime/mesh.h group_split) of --ROLE-ranks
 * consecutive ranks in the order actor, critic, ref, reward; --colocate puts roles in one group,
 * where they take turns, and a role given no count shares the actor's. With no counts every role
 * shares every rank (one process works without mpirun). Each role has its own tp x pp x dp mesh over its group.
 * One step, every rank running the same control flow:
 *   1. rollout    actor: each dp replica samples its share of the batch; results to every rank
 *   2. experience ref: logprobs at the temperature; reward: the score at each sequence's last token
 *                 (reward model) or --reward-cmd (world rank 0); critic: values. Each role's root
 *                 broadcasts its results over the world.
 *   3. advantages every rank, identically (rlhf/ppo_loss.c): KL-penalised token rewards + GAE and
 *                 whitening, or GRPO / RLOO group advantages
 *   4. update     actor and critic on their own meshes (loss hooks; schedule_1f1b; AdamW)
 * Owns: options, placement, the exchange between roles, metrics (verl's names). */
#include "rlhf/ppo.h"
#include "generate/engine.h"
#include "generate/request.h"
#include "kernels/kernels.h"
#include "rlhf/ppo_loss.h"
#include "rlhf/reward_cmd.h"
#include "rlhf/reward_http.h"
#include "runtime/args.h"
#include "runtime/jsonl.h"
#include "runtime/util.h"
#include "tokenizer/tokenizer.h"
#include "train/checkpoint.h"
#include "train/optim.h"
#include "train/schedule.h"
#include "train/trainer.h"
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { R_ACTOR, R_CRITIC, R_REF, R_REWARD, N_ROLES };
static const char *const ROLE_NAMES[N_ROLES] = {"actor", "critic", "ref", "reward"};

typedef struct {
    int active, member;        /* in this run; held by this rank */
    int group, root;           /* its role group, and that group's first world rank */
    int count, tp, pp;         /* --ROLE-ranks, --ROLE-tp, --ROLE-pp */
    const char *dir;
    Mesh mesh;
    Model m;
} Role;

/* The batch of one step, the same on every rank: S sequences packed back to back. */
typedef struct {
    int S, N;
    int *tokens, *seq_start, *targets;   /* (N), (S + 1), (N): targets[n] = tokens[n + 1] at actions */
    int *prompt_len, *resp_len, *finish; /* (S) */
    float *mask;                         /* (N) 1 at actions */
    float *old_lp, *ref_lp, *values;     /* (N) at actions */
    double *score;                       /* (S) the reward (after clipping / penalty) */
    double *rewards, *kl, *adv, *ret;    /* (N) */
    float *adv_f, *ret_f;                /* (N) float copies for the hooks */
} Experience;

typedef struct {
    Role role[N_ROLES];
    Comm world;
    int world_rank;
    /* prompts, tokenized on every rank */
    int n_prompts;
    TokIds *prompts;
    char **prompt_text, **labels;        /* decoded prompt; label JSON text or NULL */
    Tokenizer *tok;
    /* rollout */
    int B, G, max_new, max_len;
    int *stop_ids, n_stop_ids;           /* EOS and --stop-token-ids: a response ends at any of them */
    char **stops;                        /* --stop strings: a response ends with the token that completes one */
    int n_stops;
    TokStream *ts;                       /* (S) per sequence: its response decoded so far */
    char **txt;
    size_t *tlen, *tcap;
    SamplingParams sp;
    uint64_t seed;
    Engine *engine;
    /* experience */
    KlEstimator kl_est;
    double kl_coef, kl_target, kl_horizon, reward_clip, eos_penalty, gamma, lambda;
    AdvantageKind adv_kind;
    int std_norm, normalize_reward;
    RewardCmd *rcmd;
    const char *reward_cmd;
    char **urls;                         /* --reward-url: OpenRLHF-style reward servers */
    int n_urls, reward_retries;
    int save_limit;                      /* --save-total-limit */
    double reward_timeout;
    /* update */
    int ppo_epochs, mini, micro;
    PpoHook actor_hook, critic_hook;
    Optim *opt[N_ROLES];
    float *grads[N_ROLES];
    ModelWeights gw[N_ROLES];
    LayerWeights *gl[N_ROLES];
    TrainActs *slots[N_ROLES];
    int n_slots[N_ROLES];
    int fwd_tokens;                      /* tokens per forward-only chunk */
    double entropy_coef, entropy[2];     /* the actor's entropy bonus; the step's entropy sum and count */
    const char *load_dir[N_ROLES];       /* where each role's weights were read (--resume: the checkpoint's) */
    char placement[512];                 /* the layout, as saved: a resume at another one restarts the optimizers */
    char group_name[32];                 /* this rank's role group ("" with one group), for error lines */
    int group_root;                      /* this rank is its group's root */
} Ppo;

/* ---- placement ------------------------------------------------------------------------------ */

static int role_of(const char *name, const char *spec) {
    for (int r = 0; r < N_ROLES; r++) if (!strcmp(name, ROLE_NAMES[r])) return r;
    user_error("--colocate %s: unknown role \"%s\" (actor, critic, ref, reward)", spec, name);
}

/* Role groups from the counts and --colocate ("all", or sets like "actor,ref:critic,reward"). */
static void place(Ppo *p, const char *colocate) {
    Role *R = p->role;
    int set_of[N_ROLES], n_sets = 0, any_count = 0;
    for (int r = 0; r < N_ROLES; r++) { set_of[r] = -1; any_count |= R[r].active && R[r].count > 0; }
    if (!colocate && !any_count) colocate = "all";
    if (colocate && !strcmp(colocate, "all")) {
        for (int r = 0; r < N_ROLES; r++) if (R[r].active) set_of[r] = 0;
        n_sets = 1;
    } else if (colocate) {
        char *spec = xstrdup(colocate), *save1 = NULL;
        for (char *set = strtok_r(spec, ":", &save1); set; set = strtok_r(NULL, ":", &save1), n_sets++) {
            char *save2 = NULL;
            for (char *nm = strtok_r(set, ",", &save2); nm; nm = strtok_r(NULL, ",", &save2)) {
                int r = role_of(nm, colocate);
                if (set_of[r] >= 0) user_error("--colocate %s: role %s named twice", colocate, nm);
                set_of[r] = n_sets;
            }
        }
        free(spec);
    }
    /* the rest: a group each, except that a role given no rank count shares the actor's */
    if (set_of[R_ACTOR] < 0) set_of[R_ACTOR] = n_sets++;
    for (int r = 0; r < N_ROLES; r++)
        if (R[r].active && set_of[r] < 0) set_of[r] = R[r].count > 0 ? n_sets++ : set_of[R_ACTOR];
    /* groups in role order (actor first: world rank 0 is the actor's root) */
    int order[N_ROLES], n_groups = 0, counts[N_ROLES], first_role[N_ROLES];
    const char *names[N_ROLES];
    static char name_buf[N_ROLES][32];
    for (int r = 0; r < N_ROLES; r++) {
        if (!R[r].active) continue;
        int g = -1;
        for (int k = 0; k < n_groups; k++) if (order[k] == set_of[r]) g = k;
        if (g < 0) {
            g = n_groups++;
            order[g] = set_of[r];
            counts[g] = 0;
            first_role[g] = r;
            name_buf[g][0] = 0;
        }
        R[r].group = g;
        if (name_buf[g][0]) strncat(name_buf[g], "+", sizeof name_buf[g] - strlen(name_buf[g]) - 1);
        strncat(name_buf[g], ROLE_NAMES[r], sizeof name_buf[g] - strlen(name_buf[g]) - 1);
        if (R[r].count > 0) {
            if (counts[g] > 0 && counts[g] != R[r].count)
                user_error("--%s-ranks %d: colocated roles (%s) must have the same rank count (%d)", ROLE_NAMES[r],
                           R[r].count, name_buf[g], counts[g]);
            counts[g] = R[r].count;
        }
    }
    for (int g = 0; g < n_groups; g++) {
        names[g] = name_buf[g];
        if (counts[g] == 0) {
            if (n_groups > 1) user_error("role group %s: give its rank count (--%s-ranks)", names[g], ROLE_NAMES[first_role[g]]);
            counts[g] = p->world.size;
        }
    }
    RoleGroup mine;
    group_split(&p->world, n_groups, names, counts, "--actor-ranks/--critic-ranks/--ref-ranks/--reward-ranks", &mine);
    int first = 0;
    for (int g = 0; g < n_groups; g++) {
        for (int r = 0; r < N_ROLES; r++)
            if (R[r].active && R[r].group == g) { R[r].root = first; R[r].member = g == mine.index; }
        first += counts[g];
    }
    for (int r = 0; r < N_ROLES; r++)
        if (R[r].member) mesh_init(&R[r].mesh, &mine.comm, R[r].tp, R[r].pp);
    for (int r = 0; r < N_ROLES; r++)
        if (R[r].active)
            snprintf(p->placement + strlen(p->placement), sizeof p->placement - strlen(p->placement), "%s%s@%d+%d:tp%d:pp%d",
                     p->placement[0] ? "," : "", ROLE_NAMES[r], R[r].root, counts[R[r].group], R[r].tp, R[r].pp);
    if (p->world_rank == 0) {
        fprintf(stderr, "placement (%d ranks):", p->world.size);
        for (int r = 0; r < N_ROLES; r++)
            if (R[r].active)
                fprintf(stderr, " %s ranks %d-%d (group %s, tp %d pp %d dp %d)%s", ROLE_NAMES[r], R[r].root,
                        R[r].root + counts[R[r].group] - 1, names[R[r].group], R[r].tp, R[r].pp,
                        counts[R[r].group] / (R[r].tp * R[r].pp), r + 1 < N_ROLES ? ";" : "");
        fprintf(stderr, "\n");
    }
    p->group_root = mine.comm.rank == 0;
    snprintf(p->group_name, sizeof p->group_name, "%s", n_groups > 1 ? mine.name : "");
    group_free(&mine);
}

/* Another role's model must read the actor's token ids. */
static void check_same_vocab(const Ppo *p) {
    ModelConfig a;
    config_load(&a, p->role[R_ACTOR].dir);
    for (int r = R_CRITIC; r < N_ROLES; r++) {
        if (!p->role[r].active) continue;
        ModelConfig c;
        config_load(&c, p->role[r].dir);
        if (c.vocab_size != a.vocab_size)
            user_error("--%s %s: vocabulary of %d tokens, the actor's has %d: the roles must share the actor's tokenizer",
                       ROLE_NAMES[r], p->role[r].dir, c.vocab_size, a.vocab_size);
        if (r == R_REWARD && !c.score_head)
            user_error("--reward %s: a causal LM, not a reward model (*ForSequenceClassification, e.g. from `tandem rm`)",
                       p->role[r].dir);
        if (r == R_REF && c.score_head) user_error("--ref %s: a score-head model; the reference is a causal LM", p->role[r].dir);
        for (const char *const *f = (const char *const[]){"tokenizer.model", "tokenizer.json", NULL}; *f; f++) {
            char *pa = path_join(p->role[R_ACTOR].dir, *f), *pc = path_join(p->role[r].dir, *f);
            size_t la = 0, lc = 0;
            char *ta = read_file(pa, &la), *tc = read_file(pc, &lc);
            int differ = ta && tc && (la != lc || memcmp(ta, tc, la));
            free(ta); free(tc); free(pa); free(pc);
            if (differ) user_error("--%s %s: its %s differs from the actor's: the roles must share the actor's tokenizer",
                                   ROLE_NAMES[r], p->role[r].dir, *f);
        }
    }
}

/* ---- moving results between roles ------------------------------------------------------------ */

/* A role's per-item results, computed by its dp replicas (each filled its own items, zeros
 * elsewhere) and its pp stages (the last computes, broadcast already done): summed over dp, then
 * from the role's root to every rank of the world. */
static void share_f(Ppo *p, const Role *r, float *x, size_t n) {
    if (r->member) comm_all_reduce_sum(&r->mesh.dp_comm, x, n);
    comm_broadcast(&p->world, x, sizeof(float) * n, r->root);
}
static void share_d(Ppo *p, const Role *r, double *x, size_t n) {
    if (r->member) comm_all_reduce_sum_f64(&r->mesh.dp_comm, x, n);
    comm_broadcast(&p->world, x, sizeof(double) * n, r->root);
}
static void share_i(Ppo *p, const Role *r, int *x, size_t n) {
    if (r->member) comm_all_reduce_sum_int(&r->mesh.dp_comm, x, n);
    comm_broadcast(&p->world, x, sizeof(int) * n, r->root);
}

/* ---- prompts ---------------------------------------------------------------------------------- */

static void read_prompts(Ppo *p, const char *path, const char *key, const char *chat_template, int truncate, int vocab,
                         int max_pos) {
    JsonlReader r;
    jsonl_open(&r, path);
    int cap = 0;
    for (cJSON *o; (o = jsonl_next(&r)); cJSON_Delete(o)) {
        if (p->n_prompts == cap) {
            cap = 2 * cap + 64;
            p->prompts = xrealloc(p->prompts, sizeof(TokIds) * cap);
            p->prompt_text = xrealloc(p->prompt_text, sizeof(char *) * cap);
            p->labels = xrealloc(p->labels, sizeof(char *) * cap);
        }
        TokIds *t = &p->prompts[p->n_prompts];
        *t = (TokIds){0};
        free(prompt_tokens(p->tok, o, key, chat_template, 0, vocab, path, r.line, t));
        char where[600];
        snprintf(where, sizeof where, "%s:%d", path, r.line);
        prompt_fit(t, p->max_new, max_pos, truncate, where);
        p->prompt_text[p->n_prompts] = p->tok ? tokenizer_decode(p->tok, t->ids, t->n, 1, NULL) : xstrdup("");
        const cJSON *label = cJSON_GetObjectItemCaseSensitive(o, "label");
        p->labels[p->n_prompts] = label ? cJSON_PrintUnformatted(label) : NULL;
        p->n_prompts++;
    }
    jsonl_close(&r);
    if (p->n_prompts < p->B)
        user_error("%s: %d prompts, fewer than --rollout-batch-size %d", path, p->n_prompts, p->B);
}

/* The prompts of step `step` (0-based): a fresh shuffle (seeded) per pass over the file. */
static void step_prompts(const Ppo *p, int step, int *out) {
    int per = p->n_prompts / p->B;   /* whole batches per pass; the tail of a pass is not used */
    int pass = step / per, k0 = (step % per) * p->B;
    int *perm = xmalloc(sizeof(int) * p->n_prompts);
    for (int i = 0; i < p->n_prompts; i++) perm[i] = i;
    uint64_t st = splitmix64_mix(p->seed ^ 0x70726f6d707473ull) + (uint64_t)pass;
    shuffle_ints(perm, p->n_prompts, &st);
    memcpy(out, perm + k0, sizeof(int) * p->B);
    free(perm);
}

/* ---- 1. rollout --------------------------------------------------------------------------- */

/* The engine's per-token callback (every actor rank): does the response now contain a stop string?
 * A stop may straddle tokens, so the search starts where it could have begun. */
static int stop_on_token(void *ctx, Seq *q) {
    Ppo *p = ctx;
    int i = q->index;
    size_t before = p->tlen[i];
    tok_stream_push(&p->ts[i], q->out[q->n_out - 1], &p->txt[i], &p->tlen[i], &p->tcap[i]);
    return stop_find(p->stops, p->n_stops, p->txt[i], p->tlen[i], before) != NULL;
}

static void rollout(Ppo *p, int step, const int *pidx, Experience *b) {
    Role *a = &p->role[R_ACTOR];
    int S = p->B * p->G, M = p->max_new;
    int *out = xcalloc((size_t)S * M, sizeof(int)), *n_out = xcalloc(S, sizeof(int)), *fin = xcalloc(S, sizeof(int));
    float *lp = xcalloc((size_t)S * M, sizeof(float));
    if (a->member) {
        Seq *seqs = xcalloc(S, sizeof(Seq));
        char err[512];
        for (int s = 0; s < S; s++) {
            if (s % a->mesh.dp != a->mesh.dp_rank) continue;
            const TokIds *t = &p->prompts[pidx[s / p->G]];
            Seq *q = &seqs[s];
            q->index = s;
            q->prompt = xmalloc(sizeof(int) * t->n);
            for (size_t i = 0; i < t->n; i++) q->prompt[i] = t->ids[i];
            q->n_prompt = (int)t->n;
            q->sp = p->sp;
            q->sp.seed = splitmix64_mix(p->seed + 0x9E3779B97F4A7C15ull * (uint64_t)(step + 1) + (uint64_t)s);
            q->max_new = M;
            q->stop_ids = xmalloc(sizeof(int) * (p->n_stop_ids + 1));
            for (int k = 0; k < p->n_stop_ids; k++) q->stop_ids[q->n_stop_ids++] = p->stop_ids[k];
            seq_alloc_results(q);
            if (p->n_stops) { tok_stream_init(&p->ts[s], p->tok, 1); p->tlen[s] = 0; }
            if (engine_add(p->engine, q, err, sizeof err)) user_error("rollout: %s", err);
        }
        engine_run(p->engine);
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
    share_i(p, a, out, (size_t)S * M);
    share_i(p, a, n_out, S);
    share_i(p, a, fin, S);
    share_f(p, a, lp, (size_t)S * M);

    /* pack prompt ++ response; actions: the positions before each response token */
    b->S = S;
    b->N = 0;
    b->seq_start[0] = 0;
    for (int s = 0; s < S; s++) {
        const TokIds *t = &p->prompts[pidx[s / p->G]];
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
        b->N += L;
        b->seq_start[s + 1] = b->N;
    }
    free(out); free(n_out); free(fin); free(lp);
}

/* ---- 2. experience: forward-only passes of ref, reward and critic -------------------------- */

/* Sequences [s0, s1) of b as one forward chunk at most fwd_tokens long, taken by the dp replicas
 * in turn: calls fn for this replica's chunks. */
typedef void (*ChunkFn)(Ppo *p, Role *r, Experience *b, int s0, int s1, void *out);
static void chunks(Ppo *p, Role *r, Experience *b, ChunkFn fn, void *out) {
    for (int s0 = 0, k = 0; s0 < b->S; k++) {
        int s1 = s0 + 1;
        while (s1 < b->S && b->seq_start[s1 + 1] - b->seq_start[s0] <= p->fwd_tokens) s1++;
        if (k % r->mesh.dp == r->mesh.dp_rank) fn(p, r, b, s0, s1, out);
        s0 = s1;
    }
}

static int *g_rows;   /* (max tokens) 0, 1, 2, ... */

/* model_forward of sequences [s0, s1) of b, from their own positions 0 */
static void chunk_forward(Model *m, const Experience *b, int s0, int s1) {
    int t0 = b->seq_start[s0], *st = xmalloc(sizeof(int) * (s1 - s0 + 1));
    for (int s = s0; s <= s1; s++) st[s - s0] = b->seq_start[s] - t0;
    model_forward(m, b->tokens + t0, st, s1 - s0);
    free(st);
}

/* ref logprobs at the temperature, at the chunk's actions */
static void ref_chunk(Ppo *p, Role *r, Experience *b, int s0, int s1, void *outp) {
    float *out = outp;
    Model *m = &r->m;
    int t0 = b->seq_start[s0], N = b->seq_start[s1] - t0;
    chunk_forward(m, b, s0, s1);
    if (m->is_last) {
        float *lse = xmalloc(sizeof(float) * N), *pick = xmalloc(sizeof(float) * N);
        model_logits_lse(m, m->s.logits, N, p->sp.temperature, lse);
        model_pair_logprobs(m, m->s.logits, lse, N, g_rows, b->targets + t0, p->sp.temperature, pick, out + t0);
        for (int n = 0; n < N; n++) if (b->targets[t0 + n] < 0) out[t0 + n] = 0.0f;
        free(lse); free(pick);
    }
    comm_broadcast(&m->mesh->pp_comm, out + t0, sizeof(float) * N, m->mesh->pp_comm.size - 1);
}

/* score-head values at every position of the chunk (critic), or at each sequence's last (reward) */
static void value_chunk(Ppo *p, Role *r, Experience *b, int s0, int s1, void *outp) {
    (void)p;
    Model *m = &r->m;
    int t0 = b->seq_start[s0], N = b->seq_start[s1] - t0;
    float *v = xmalloc(sizeof(float) * N);
    chunk_forward(m, b, s0, s1);
    if (m->is_last) m->be->to_host(v, m->s.logits, sizeof(float) * N);
    comm_broadcast(&m->mesh->pp_comm, v, sizeof(float) * N, m->mesh->pp_comm.size - 1);
    if (r == &p->role[R_REWARD]) {
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
static void reward_from_program(Ppo *p, Experience *b, const int *pidx) {
    if (p->world_rank == 0) {
        const char **pr = xmalloc(sizeof(char *) * b->S), **rs = xmalloc(sizeof(char *) * b->S);
        const char **lb = xmalloc(sizeof(char *) * b->S);
        for (int s = 0; s < b->S; s++) {
            pr[s] = p->prompt_text[pidx[s / p->G]];
            lb[s] = p->labels[pidx[s / p->G]];
            const int *resp = b->tokens + b->seq_start[s] + b->prompt_len[s];
            rs[s] = tokenizer_decode(p->tok, (const int32_t *)resp, (size_t)b->resp_len[s], 1, NULL);
        }
        char err[1024];
        if (p->n_urls) {   /* OpenRLHF's "query": the prompt and response as one text */
            char **qs = xmalloc(sizeof(char *) * b->S);
            for (int s = 0; s < b->S; s++) {
                size_t a = strlen(pr[s]), c = strlen(rs[s]);
                qs[s] = xmalloc(a + c + 1);
                memcpy(qs[s], pr[s], a);
                memcpy(qs[s] + a, rs[s], c + 1);
            }
            int rc = reward_http_score((const char *const *)p->urls, p->n_urls, b->S, (const char *const *)qs, pr, lb,
                                       b->score, p->reward_timeout, p->reward_retries, err, sizeof err);
            for (int s = 0; s < b->S; s++) free(qs[s]);
            free(qs);
            if (rc) rank_error("%s", err);
        } else if (reward_cmd_score(p->rcmd, b->S, pr, rs, lb, b->score, p->reward_timeout, err, sizeof err)) {
            reward_cmd_stop(p->rcmd);
            p->rcmd = NULL;
            rank_error("%s", err);
        }
        for (int s = 0; s < b->S; s++) free((char *)rs[s]);
        free(pr); free(rs); free(lb);
    }
    comm_broadcast(&p->world, b->score, sizeof(double) * b->S, 0);
}

/* The three experience passes, each leaving its result on every rank (a role's dp replicas fill
 * their own chunks of a zeroed buffer, which share_* sums). */
static void phase_ref(Ppo *p, Experience *b) {
    Role *r = &p->role[R_REF];
    if (!r->active) return;
    memset(b->ref_lp, 0, sizeof(float) * b->N);
    if (r->member) chunks(p, r, b, ref_chunk, b->ref_lp);
    share_f(p, r, b->ref_lp, b->N);
}
static void phase_reward(Ppo *p, Experience *b, const int *pidx) {
    Role *r = &p->role[R_REWARD];
    memset(b->score, 0, sizeof(double) * b->S);
    if (p->reward_cmd || p->n_urls) { reward_from_program(p, b, pidx); return; }
    if (r->member) chunks(p, r, b, value_chunk, b->score);
    share_d(p, r, b->score, b->S);
}
static void phase_values(Ppo *p, Experience *b) {
    Role *r = &p->role[R_CRITIC];
    memset(b->values, 0, sizeof(float) * b->N);
    if (!r->active) return;
    if (r->member) chunks(p, r, b, value_chunk, b->values);
    share_f(p, r, b->values, b->N);
}

/* ---- 4. update ----------------------------------------------------------------------------- */

/* sequences per micro-batch: --micro-batch-size, at most (and by default) a dp rank's share */
static int micro_size(const Ppo *p, const Role *r) {
    int share = p->mini / r->mesh.dp;
    return p->micro > 0 && p->micro < share ? p->micro : share;
}

/* One role's update: --ppo-epochs passes over shuffled mini-batches of the batch's sequences, each
 * an optimizer step; a dp replica takes every dp-th sequence of a mini-batch, in micro-batches of
 * --micro-batch-size sequences through 1F1B. Each action weighs dp / (actions in the mini-batch)
 * (token-mean; optim_step averages over dp). Returns the mean gradient norm. */
static double update(Ppo *p, int ri, int step, Experience *b) {
    Role *r = &p->role[ri];
    Model *m = &r->m;
    int dp = r->mesh.dp, S = b->S, actor = ri == R_ACTOR;
    PpoHook *h = actor ? &p->actor_hook : &p->critic_hook;
    LossHook lh = {actor ? loss_ppo_actor : loss_ppo_critic, h, actor ? p->sp.temperature : 1.0f,
                   actor ? (float)p->entropy_coef : 0.0f, actor ? p->entropy : NULL};
    int micro = micro_size(p, r), max_mb = (p->mini / dp + micro - 1) / micro, cap = micro * p->max_len;
    MicroBatch *mbs = xcalloc(max_mb, sizeof(MicroBatch));
    PpoCtx *ctx = xcalloc(max_mb, sizeof(PpoCtx));
    int *tok = xmalloc(sizeof(int) * max_mb * cap), *tgt = xmalloc(sizeof(int) * max_mb * cap);
    int *st = xmalloc(sizeof(int) * max_mb * (micro + 1));
    float *fl = xmalloc(sizeof(float) * max_mb * cap * 5);   /* weight, old_lp, ref_lp / old values, adv / returns */
    int *perm = xmalloc(sizeof(int) * S);
    double gsum = 0;
    int n_steps = 0;
    for (int e = 0; e < p->ppo_epochs; e++) {
        for (int i = 0; i < S; i++) perm[i] = i;
        uint64_t rs = splitmix64_mix(p->seed ^ (0xC0FFEEull + (uint64_t)ri)) + (uint64_t)step * 131 + (uint64_t)e;
        shuffle_ints(perm, S, &rs);
        for (int k0 = 0; k0 < S; k0 += p->mini) {
            long actions = 0;
            for (int k = k0; k < k0 + p->mini; k++) actions += b->resp_len[perm[k]];
            float w = actions ? (float)dp / (float)actions : 0.0f;
            int n_mb = 0, fill = 0;
            for (int k = k0 + r->mesh.dp_rank; k < k0 + p->mini; k += dp) {
                int s = perm[k], i = n_mb - (fill ? 1 : 0);
                if (!fill) {   /* a new micro-batch */
                    i = n_mb++;
                    mbs[i] = (MicroBatch){tok + (size_t)i * cap, st + (size_t)i * (micro + 1), 0,
                                          tgt + (size_t)i * cap, fl + (size_t)i * cap * 5, &ctx[i]};
                    ((int *)mbs[i].seq_start)[0] = 0;
                    float *f = fl + (size_t)i * cap * 5;
                    if (actor) ctx[i] = (PpoCtx){f + cap, f + 2 * cap, f + 3 * cap, NULL, NULL, e == 0 && k0 == 0};
                    else ctx[i] = (PpoCtx){NULL, NULL, NULL, f + cap, f + 2 * cap, 0};
                }
                MicroBatch *mb = &mbs[i];
                int *sst = (int *)mb->seq_start, n0 = sst[mb->n_seqs], t0 = b->seq_start[s];
                int L = b->seq_start[s + 1] - t0;
                float *f = (float *)mb->weight;
                memcpy((int *)mb->tokens + n0, b->tokens + t0, sizeof(int) * L);
                memcpy((int *)mb->targets + n0, b->targets + t0, sizeof(int) * L);
                for (int n = 0; n < L; n++) {
                    f[n0 + n] = b->mask[t0 + n] * w;
                    if (actor) {
                        f[cap + n0 + n] = b->old_lp[t0 + n];
                        f[2 * cap + n0 + n] = b->ref_lp ? b->ref_lp[t0 + n] : 0.0f;
                        f[3 * cap + n0 + n] = b->adv_f[t0 + n];
                    } else {
                        f[cap + n0 + n] = b->values[t0 + n];
                        f[2 * cap + n0 + n] = b->ret_f[t0 + n];
                    }
                }
                sst[++mb->n_seqs] = n0 + L;
                fill = mb->n_seqs < micro;
            }
            optim_zero_grad(p->opt[ri], p->grads[ri]);
            schedule_1f1b(m, p->slots[ri], p->n_slots[ri], mbs, n_mb, &lh, &p->gw[ri]);
            gsum += optim_step(p->opt[ri], m, p->grads[ri]);
            n_steps++;
        }
    }
    free(mbs); free(ctx); free(tok); free(tgt); free(st); free(fl); free(perm);
    return n_steps ? gsum / n_steps : 0.0;
}

/* A hook's sums over the role's mesh (dp sum; max for the logprob check), then to every rank. */
static void share_stats(Ppo *p, const Role *r, PpoStats *s) {
    if (r->member) {
        double mx = s->logprob_diff_max;
        comm_all_reduce_sum_f64(&r->mesh.dp_comm, (double *)s, PPO_STATS_N);
        float fm = (float)mx;   /* a max of differences of floats: exact in float */
        comm_all_reduce_max(&r->mesh.dp_comm, &fm, 1);
        s->logprob_diff_max = fm;
        comm_broadcast(&r->mesh.pp_comm, s, sizeof *s, r->mesh.pp_comm.size - 1);
    }
    comm_broadcast(&p->world, s, sizeof *s, r->root);
}

/* ---- --bench-alone ----------------------------------------------------------------------------- */

static int cmp_float(const void *a, const void *b) { float x = *(const float *)a, y = *(const float *)b; return (x > y) - (x < y); }
static float median(float *x, int n) { qsort(x, n, sizeof(float), cmp_float); return x[n / 2]; }

/* Each phase of a step run by itself, `rounds` times on the last step's shapes (a world barrier
 * before each, so nothing overlaps it), against the run's median step: what a step costs beyond
 * its parts. The updates change the weights: run it only after the real steps. */
static void bench_phases_alone(Ppo *p, int step, const int *pidx, Experience *b, int rounds, float *steps, int n_steps) {
    enum { K = 6 };
    static const char *names[K] = {"gen", "ref", "reward", "values", "update_actor", "update_critic"};
    Role *R = p->role;
    float *t = xcalloc((size_t)K * rounds, sizeof(float));
    for (int k = 0; k < rounds; k++) {
        for (int ph = 0; ph < K; ph++) {
            comm_barrier(&p->world);
            double t0 = now_seconds();
            if (ph == 0) rollout(p, step, pidx, b);
            else if (ph == 1) phase_ref(p, b);
            else if (ph == 2) phase_reward(p, b, pidx);
            else if (ph == 3) phase_values(p, b);
            else if (ph == 4 && R[R_ACTOR].member) update(p, R_ACTOR, step, b);
            else if (ph == 5 && R[R_CRITIC].member) update(p, R_CRITIC, step, b);
            comm_barrier(&p->world);
            t[(size_t)ph * rounds + k] = (float)(now_seconds() - t0);
        }
    }
    comm_all_reduce_max(&p->world, t, (size_t)K * rounds);
    if (p->world_rank == 0) {
        double sum = 0;
        fprintf(stdout, "{\"bench\": \"ppo_phases_alone\", \"rounds\": %d, \"median_s\": {", rounds);
        for (int ph = 0; ph < K; ph++) {
            float m = median(t + (size_t)ph * rounds, rounds);
            sum += m;
            fprintf(stdout, "%s\"%s\": %.6f", ph ? ", " : "", names[ph], m);
        }
        float st = median(steps, n_steps);
        fprintf(stdout, "}, \"sum_alone_s\": %.6f, \"step_median_s\": %.6f, \"step_over_sum_alone\": %.4f}\n", sum, st, st / sum);
        fflush(stdout);
    }
    free(t);
    memset(&p->actor_hook.stats, 0, sizeof(PpoStats));
    memset(&p->critic_hook.stats, 0, sizeof(PpoStats));
}

/* ---- checkpoints ------------------------------------------------------------------------------- */

/* out/checkpoint-STEP: actor/ (causal LM) and critic/ (sequence classification), each an HF
 * directory with its mesh's optim.rankR.bin, then ppo_state.json (world rank 0, atomic, written
 * last: a checkpoint without it is incomplete). Prompt order, samples and mini-batch shuffles are
 * pure functions of (seed, step), so the step is the whole data and RNG position. */
static void save_checkpoint(Ppo *p, const char *out, int step) {
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/checkpoint-%d", out, step);
    if (p->world_rank == 0) mkdir_p(dir);
    comm_barrier(&p->world);
    int failed = 0;
    for (int r = R_ACTOR; r <= R_CRITIC; r++) {
        Role *R = &p->role[r];
        if (!R->member) continue;
        snprintf(path, sizeof path, "%s/%s", dir, ROLE_NAMES[r]);
        if (checkpoint_save_model(&R->m, p->load_dir[r], path, 1)) { failed = 1; continue; }
        snprintf(path, sizeof path, "%s/%s/optim.rank%d.bin", dir, ROLE_NAMES[r], R->mesh.rank);
        if (optim_save(p->opt[r], path)) rank_error("%s: cannot write: %s", path, strerror(errno));
    }
    comm_all_reduce_sum_int(&p->world, &failed, 1);
    if (failed || p->world_rank != 0) return;   /* a failed write was reported; the run goes on */
    char json[1024];
    int n = snprintf(json, sizeof json, "{\"format\": \"tandem-ppo-state\", \"version\": 1, \"step\": %d, \"kl_coef\": %.17g, "
                     "\"seed\": %llu, \"placement\": \"%s\"}\n", step, p->kl_coef, (unsigned long long)p->seed, p->placement);
    snprintf(path, sizeof path, "%s/ppo_state.json", dir);
    if (write_file_atomic(path, json, (size_t)n)) user_error("%s: cannot write: %s", path, strerror(errno));
    fprintf(stderr, "saved %s\n", dir);
    trainer_rotate_checkpoints(out, p->save_limit);
}

typedef struct { int step; double kl_coef; char placement[512]; } PpoState;
static void load_state(const char *dir, PpoState *st) {
    char *path = path_join(dir, "ppo_state.json");
    char *text = read_file(path, NULL);
    if (!text) user_error("%s: missing: not a complete ppo checkpoint (was the run killed while saving?)", path);
    cJSON *o = cJSON_Parse(text);
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, "format"), *v = cJSON_GetObjectItemCaseSensitive(o, "version");
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "step"), *k = cJSON_GetObjectItemCaseSensitive(o, "kl_coef");
    const cJSON *pl = cJSON_GetObjectItemCaseSensitive(o, "placement");
    if (!cJSON_IsString(f) || strcmp(f->valuestring, "tandem-ppo-state") || !cJSON_IsNumber(v) || v->valueint != 1 ||
        !cJSON_IsNumber(s) || !cJSON_IsNumber(k) || !cJSON_IsString(pl))
        user_error("%s: not a tandem ppo state of version 1", path);
    st->step = s->valueint;
    st->kl_coef = k->valuedouble;
    snprintf(st->placement, sizeof st->placement, "%s", pl->valuestring);
    cJSON_Delete(o);
    free(text);
    free(path);
}

/* ---- the command ------------------------------------------------------------------------------ */

static double masked_mean(const double *x, const float *mask, int N) {
    double s = 0, n = 0;
    for (int i = 0; i < N; i++) if (mask[i] > 0) { s += x[i]; n += 1; }
    return n ? s / n : 0.0;
}

int ppo_main(int argc, char **argv) {
    Ppo p;
    memset(&p, 0, sizeof p);
    Role *R = p.role;
    const char *stop_ids = NULL, *critic_sched_name, *stop_json, *reward_urls;
    int bench_alone;
    const char *prompts_path, *out, *resume, *key, *chat_template, *colocate, *kl_est, *adv_name, *sched_name;
    int steps, threads, truncate, no_std_norm, top_k, seed, log_every, save_every, stop_after, overwrite, no_whiten;
    float temperature, top_p, kl_coef, kl_target, kl_horizon, reward_clip, eos_penalty, gamma, lambda, clip_eps,
        clip_high, dual_clip, entropy_coef, kl_loss_coef, value_clip, actor_lr, critic_lr, wd, clip, timeout;
    Option opts[] = {
        {"--actor", OPT_MODEL, &R[R_ACTOR].dir, NULL, "the policy to train (HF causal LM, e.g. an SFT checkpoint)"},
        {"--critic", OPT_MODEL, &R[R_CRITIC].dir, NULL, "value model: a reward-model or causal-LM directory (gae only)"},
        {"--reward", OPT_MODEL, &R[R_REWARD].dir, NULL, "reward model directory (*ForSequenceClassification)"},
        {"--reward-cmd", OPT_STR, &p.reward_cmd, NULL, "instead of --reward: a program speaking jsonl (rlhf/reward_cmd.h)"},
        {"--reward-url", OPT_STR, &reward_urls, NULL, "instead: reward servers URL[,URL...] (OpenRLHF's remote RM protocol)"},
        {"--reward-timeout", OPT_FLOAT, &timeout, "600", "--reward-cmd / --reward-url: seconds to wait for a batch's replies (0 = no limit)"},
        {"--reward-retries", OPT_INT, &p.reward_retries, "3", "--reward-url: retries (with backoff) on connection errors, 429, 5xx"},
        {"--ref", OPT_MODEL, &R[R_REF].dir, NULL, "reference for the KL (default: the actor's starting weights, frozen)"},
        {"--prompts", OPT_STR, &prompts_path, NULL, "jsonl: \"prompt\" | \"messages\" | \"input_ids\", optional \"label\""},
        {"--input-key", OPT_STR, &key, "prompt", "the text prompt's field"},
        {"--chat-template", OPT_STR, &chat_template, NULL, "chat format for messages (default: the tokenizer's)"},
        {"--truncate", OPT_FLAG, &truncate, NULL, "keep the last tokens of prompts too long for the positions"},
        {"--out", OPT_STR, &out, NULL, "output directory: actor/ and critic/ at the end, metrics.jsonl"},
        {"--overwrite", OPT_FLAG, &overwrite, NULL, "allow an existing --out"},
        {"--resume", OPT_STR, &resume, NULL, "continue from out/checkpoint-STEP (bit for bit at the same placement)"},
        {"--steps", OPT_INT, &steps, "10", "PPO steps (each: rollout, experience, update)"},
        {"--stop-after", OPT_INT, &stop_after, "0", "stop after this step (0 = off)"},
        {"--save-every", OPT_INT, &save_every, "0", "steps between saved models (0 = only at the end)"},
        {"--save-total-limit", OPT_INT, &p.save_limit, "0", "keep only the newest N complete checkpoints (0 = all)"},
        {"--log-every", OPT_INT, &log_every, "1", "steps between progress lines"},
        {"--rollout-batch-size", OPT_INT, &p.B, "8", "prompts per step"},
        {"--n-samples-per-prompt", OPT_INT, &p.G, "1", "responses per prompt (the group of grpo / rloo)"},
        {"--max-new-tokens", OPT_INT, &p.max_new, "32", "response length at most"},
        {"--stop", OPT_STR, &stop_json, NULL, "stop string, or a JSON list of them: the response ends with the token completing one"},
        {"--stop-token-ids", OPT_STR, &stop_ids, NULL, "comma-separated ids that also end a response (besides EOS)"},
        {"--bench-alone", OPT_INT, &bench_alone, "0", "after the run: each phase alone this many times on the last step's shapes (a JSON line)"},
        {"--temperature", OPT_FLOAT, &temperature, "1.0", "sampling temperature (> 0); the policy is softmax(logits / T)"},
        {"--top-k", OPT_INT, &top_k, "0", "sampling top-k (0 = off)"},
        {"--top-p", OPT_FLOAT, &top_p, "1.0", "sampling top-p"},
        {"--seed", OPT_INT, &seed, "1234", "prompt order, sampling and mini-batch shuffles"},
        {"--advantage", OPT_STR, &adv_name, "gae", "gae | grpo | rloo"},
        {"--no-std-norm", OPT_FLAG, &no_std_norm, NULL, "grpo: do not divide by the group's std (Dr. GRPO)"},
        {"--no-whiten", OPT_FLAG, &no_whiten, NULL, "gae: do not whiten the advantages over the batch"},
        {"--kl-coef", OPT_FLOAT, &kl_coef, "0.001", "KL penalty in the reward (0 = off)"},
        {"--kl-estimator", OPT_STR, &kl_est, "k1", "k1 | k2 | k3"},
        {"--kl-target", OPT_FLOAT, &kl_target, "0", "adaptive KL controller's target (0 = fixed --kl-coef)"},
        {"--kl-horizon", OPT_FLOAT, &kl_horizon, "10000", "adaptive KL controller's horizon"},
        {"--kl-loss-coef", OPT_FLOAT, &kl_loss_coef, "0", "KL (k3) to the reference in the actor's loss (GRPO)"},
        {"--reward-clip", OPT_FLOAT, &reward_clip, "0", "clip scores to [-x, x] (0 = off)"},
        {"--missing-eos-penalty", OPT_FLOAT, &eos_penalty, "0", "subtracted from the score of a response cut off without EOS"},
        {"--normalize-reward", OPT_FLAG, &p.normalize_reward, NULL, "(score - mean) / std by the reward model's saved stats"},
        {"--gamma", OPT_FLOAT, &gamma, "1.0", "GAE discount"},
        {"--lambda", OPT_FLOAT, &lambda, "0.95", "GAE lambda"},
        {"--ppo-epochs", OPT_INT, &p.ppo_epochs, "1", "passes over each step's batch"},
        {"--mini-batch-size", OPT_INT, &p.mini, "0", "sequences per optimizer step (0 = the whole batch)"},
        {"--micro-batch-size", OPT_INT, &p.micro, "0", "sequences per micro-batch (0 = a dp rank's whole share)"},
        {"--clip-eps", OPT_FLOAT, &clip_eps, "0.2", "policy ratio clip"},
        {"--clip-eps-high", OPT_FLOAT, &clip_high, "0", "upper ratio clip (DAPO clip-higher; 0 = --clip-eps)"},
        {"--dual-clip", OPT_FLOAT, &dual_clip, "0", "dual-clip constant c > 1 for negative advantages (0 = off)"},
        {"--entropy-coef", OPT_FLOAT, &entropy_coef, "0", "entropy bonus in the actor's loss (token-mean, at the temperature)"},
        {"--value-clip", OPT_FLOAT, &value_clip, "0.2", "value clip around the rollout's values"},
        {"--actor-lr", OPT_FLOAT, &actor_lr, "1e-6", "actor learning rate"},
        {"--critic-lr", OPT_FLOAT, &critic_lr, "1e-5", "critic learning rate"},
        {"--lr-schedule", OPT_STR, &sched_name, "constant", "the actor's: cosine | linear | constant"},
        {"--critic-lr-schedule", OPT_STR, &critic_sched_name, NULL, "the critic's (default: --lr-schedule)"},
        {"--weight-decay", OPT_FLOAT, &wd, "0.0", "AdamW weight decay"},
        {"--clip", OPT_FLOAT, &clip, "1.0", "gradient-norm clipping (0 = off)"},
        {"--colocate", OPT_STR, &colocate, NULL, "roles sharing ranks: all, or sets like actor,ref:critic,reward"},
        {"--actor-ranks", OPT_INT, &R[R_ACTOR].count, "0", "ranks of the actor's group"},
        {"--critic-ranks", OPT_INT, &R[R_CRITIC].count, "0", "ranks of the critic's group"},
        {"--ref-ranks", OPT_INT, &R[R_REF].count, "0", "ranks of the reference's group"},
        {"--reward-ranks", OPT_INT, &R[R_REWARD].count, "0", "ranks of the reward model's group"},
        {"--actor-tp", OPT_INT, &R[R_ACTOR].tp, "1", ""}, {"--actor-pp", OPT_INT, &R[R_ACTOR].pp, "1", ""},
        {"--critic-tp", OPT_INT, &R[R_CRITIC].tp, "1", ""}, {"--critic-pp", OPT_INT, &R[R_CRITIC].pp, "1", ""},
        {"--ref-tp", OPT_INT, &R[R_REF].tp, "1", ""}, {"--ref-pp", OPT_INT, &R[R_REF].pp, "1", ""},
        {"--reward-tp", OPT_INT, &R[R_REWARD].tp, "1", ""}, {"--reward-pp", OPT_INT, &R[R_REWARD].pp, "1", ""},
        {"--threads", OPT_INT, &threads, "0", "CPU threads per rank (0 = the cores available to this rank)"},
    };
    int n_opts = sizeof(opts) / sizeof(opts[0]);
    comm_init(&argc, &argv);
    args_parse("usage: tandem ppo --actor DIR [--critic DIR] (--reward DIR | --reward-cmd CMD) [--ref DIR] --prompts FILE --out DIR [options]",
               opts, n_opts, argc, argv);
    /* options */
    if (!R[R_ACTOR].dir || !prompts_path || !out) user_error("ppo: --actor, --prompts and --out are required");
    if ((R[R_REWARD].dir != NULL) + (p.reward_cmd != NULL) + (reward_urls != NULL) != 1)
        user_error("ppo: give exactly one of --reward DIR, --reward-cmd CMD and --reward-url URL[,URL...]");
    if (p.save_limit < 0) user_error("--save-total-limit %d: must be >= 0", p.save_limit);
    if (p.reward_retries < 0) user_error("--reward-retries %d: must be >= 0", p.reward_retries);
    if (reward_urls) {
        char *list = xstrdup(reward_urls), *save = NULL;
        for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (strncmp(t, "http://", 7) && strncmp(t, "https://", 8)) user_error("--reward-url %s: \"%s\" is not an http(s) URL", reward_urls, t);
            p.urls = xrealloc(p.urls, sizeof(char *) * (p.n_urls + 1));
            p.urls[p.n_urls++] = xstrdup(t);
        }
        free(list);
        if (!p.n_urls) user_error("--reward-url: no URL given");
    }
    p.adv_kind = !strcmp(adv_name, "gae") ? ADV_GAE : !strcmp(adv_name, "grpo") ? ADV_GRPO : !strcmp(adv_name, "rloo") ? ADV_RLOO : (AdvantageKind)-1;
    if ((int)p.adv_kind < 0) user_error("--advantage %s: expected gae, grpo or rloo", adv_name);
    if (p.adv_kind == ADV_GAE && !R[R_CRITIC].dir) user_error("--advantage gae needs --critic (or use grpo / rloo)");
    if (p.adv_kind != ADV_GAE && R[R_CRITIC].dir) user_error("--critic: --advantage %s uses no critic", adv_name);
    if (p.adv_kind == ADV_RLOO && p.G < 2) user_error("--advantage rloo needs --n-samples-per-prompt >= 2");
    p.kl_est = !strcmp(kl_est, "k1") ? KL_K1 : !strcmp(kl_est, "k2") ? KL_K2 : !strcmp(kl_est, "k3") ? KL_K3 : (KlEstimator)-1;
    if ((int)p.kl_est < 0) user_error("--kl-estimator %s: expected k1, k2 or k3", kl_est);
    if (!(temperature > 0)) user_error("--temperature %g: must be > 0 (the policy is softmax(logits / T))", temperature);
    if (p.B < 1 || p.G < 1 || p.max_new < 1 || steps < 1 || p.ppo_epochs < 1 || threads < 0)
        user_error("ppo: --rollout-batch-size, --n-samples-per-prompt, --max-new-tokens, --steps, --ppo-epochs, --threads must be >= 1");
    if (!(kl_coef >= 0) || !(kl_loss_coef >= 0) || !(reward_clip >= 0) || !(kl_target >= 0) || !(kl_horizon > 0))
        user_error("ppo: --kl-coef, --kl-loss-coef, --reward-clip, --kl-target must be >= 0, --kl-horizon > 0");
    if (!(gamma >= 0 && gamma <= 1) || !(lambda >= 0 && lambda <= 1)) user_error("ppo: --gamma and --lambda must be in [0, 1]");
    if (!(clip_eps > 0 && clip_eps < 1) || clip_high < 0 || !(value_clip > 0)) user_error("ppo: --clip-eps in (0, 1), --clip-eps-high >= 0, --value-clip > 0");
    if (dual_clip != 0 && !(dual_clip > 1)) user_error("--dual-clip %g: must be > 1 (or 0 = off)", dual_clip);
    if (!(actor_lr > 0) || !(critic_lr > 0)) user_error("ppo: --actor-lr and --critic-lr must be > 0");
    LrSchedule sched = lr_schedule_parse("--lr-schedule", sched_name);
    LrSchedule critic_sched = critic_sched_name ? lr_schedule_parse("--critic-lr-schedule", critic_sched_name) : sched;
    int S = p.B * p.G;
    if (p.mini == 0) p.mini = S;
    if (p.mini < 1 || S % p.mini) user_error("--mini-batch-size %d: must divide the batch's %d sequences", p.mini, S);
    if (dir_exists(out) && !overwrite && !resume) user_error("%s: already exists (use --resume DIR to continue a run, or --overwrite)", out);
    PpoState rs = {0};
    if (resume) {
        load_state(resume, &rs);
        char *ad = path_join(resume, "actor");
        trainer_check_same_model(R[R_ACTOR].dir, ad);
        free(ad);
    }
    sampling_params_default(&p.sp);
    p.sp.temperature = temperature; p.sp.top_k = top_k; p.sp.top_p = top_p;
    const char *bad = sampling_params_check(&p.sp);
    if (bad) user_error("ppo: %s", bad);
    p.seed = (uint64_t)seed;
    p.kl_coef = kl_coef; p.kl_target = kl_target; p.kl_horizon = kl_horizon; p.reward_clip = reward_clip;
    p.eos_penalty = eos_penalty; p.gamma = gamma; p.lambda = lambda; p.std_norm = !no_std_norm;
    p.reward_timeout = timeout;
    if (!(entropy_coef >= 0)) user_error("--entropy-coef %g: must be >= 0", entropy_coef);
    p.entropy_coef = entropy_coef;
    p.actor_hook = (PpoHook){.clip_low = clip_eps, .clip_high = clip_high > 0 ? clip_high : clip_eps, .clip_c = dual_clip,
                             .kl_loss_coef = kl_loss_coef};
    p.critic_hook = (PpoHook){.value_clip = value_clip};
    threads = cpu_set_threads(threads);

    /* roles and placement */
    R[R_ACTOR].active = 1;
    R[R_CRITIC].active = R[R_CRITIC].dir != NULL;
    R[R_REWARD].active = R[R_REWARD].dir != NULL;
    R[R_REF].active = kl_coef > 0 || kl_loss_coef > 0;
    if (R[R_REF].active && !R[R_REF].dir) R[R_REF].dir = R[R_ACTOR].dir;
    for (int r = 0; r < N_ROLES; r++) {
        if (R[r].active && !dir_exists(R[r].dir)) user_error("--%s %s: not a directory", ROLE_NAMES[r], R[r].dir);
        if (!R[r].active && R[r].count > 0) user_error("--%s-ranks %d: this run has no %s", ROLE_NAMES[r], R[r].count, ROLE_NAMES[r]);
    }
    check_same_vocab(&p);
    p.world = comm_world();
    p.world_rank = p.world.rank;
    place(&p, colocate);
    for (int r = 0; r < N_ROLES; r++) {   /* the reference stays the starting weights on resume */
        p.load_dir[r] = R[r].dir;
        if (resume && (r == R_ACTOR || r == R_CRITIC) && R[r].active) p.load_dir[r] = path_join(resume, ROLE_NAMES[r]);
    }
    for (int r = 0; r < N_ROLES; r++) {
        if (!R[r].member) continue;
        util_set_reporter(R[r].mesh.rank == 0, ROLE_NAMES[r]);   /* a role's model errors name the role */
        if (r == R_CRITIC) model_load_score(&R[r].m, p.load_dir[r], &R[r].mesh, 42);
        else model_load(&R[r].m, p.load_dir[r], &R[r].mesh);
        if (r == R_ACTOR && R[r].m.head != HEAD_LM) user_error("--actor %s: a score-head model; the actor is a causal LM", R[r].dir);
    }
    util_set_reporter(p.group_root, p.group_name[0] ? p.group_name : NULL);
    char err[1024];
    p.tok = tokenizer_open(R[R_ACTOR].dir, err, sizeof err);
    if (!p.tok) user_error("%s", err);
    ModelConfig acfg;
    config_load(&acfg, R[R_ACTOR].dir);
    read_prompts(&p, prompts_path, key, chat_template, truncate, acfg.vocab_size, acfg.max_pos);
    if (stop_json) {   /* one string, or a JSON list of strings (as generate's --stop) */
        p.stops = xcalloc(MAX_STOPS, sizeof(char *));
        p.n_stops = stops_parse_flag(stop_json, p.stops);
        p.ts = xcalloc(S, sizeof(TokStream));
        p.txt = xcalloc(S, sizeof(char *));
        p.tlen = xcalloc(S, sizeof(size_t));
        p.tcap = xcalloc(S, sizeof(size_t));
    }
    /* a response ends at an EOS id, by generate's rule (config.json, generation_config.json, the
     * tokenizer), or at one of --stop-token-ids */
    p.stop_ids = xmalloc(sizeof(int) * EOS_IDS_CAP);
    p.n_stop_ids = eos_ids_load(R[R_ACTOR].dir, &acfg, p.tok, p.stop_ids);
    if (stop_ids) stop_ids_parse_flag(stop_ids, acfg.vocab_size, &p.stop_ids, &p.n_stop_ids);
    p.max_len = 0;
    for (int i = 0; i < p.n_prompts; i++) if ((int)p.prompts[i].n + p.max_new > p.max_len) p.max_len = (int)p.prompts[i].n + p.max_new;
    if (p.reward_cmd && p.world_rank == 0) {
        p.rcmd = reward_cmd_start(p.reward_cmd, err, sizeof err);
        if (!p.rcmd) rank_error("%s", err);
    }
    int maxN = S * p.max_len;
    p.fwd_tokens = 8 * p.max_len > 2048 ? 8 * p.max_len : 2048;
    if (p.fwd_tokens > maxN) p.fwd_tokens = maxN;
    g_rows = xmalloc(sizeof(int) * maxN);
    for (int i = 0; i < maxN; i++) g_rows[i] = i;

    /* per role: run state, optimizer, training slots */
    OptimConfig oc = optim_config_default();
    oc.schedule = sched; oc.weight_decay = wd; oc.clip = clip; oc.warmup = 0; oc.total_steps = steps;
    for (int r = 0; r < N_ROLES; r++) {
        if (!R[r].member) continue;
        Model *m = &R[r].m;
        if (r != R_ACTOR) model_alloc_state(m, p.fwd_tokens, p.max_len);
        if (r == R_ACTOR || r == R_CRITIC) {
            if (p.mini % R[r].mesh.dp) user_error("--mini-batch-size %d: must be a multiple of the %s's dp %d", p.mini, ROLE_NAMES[r], R[r].mesh.dp);
            oc.lr = r == R_ACTOR ? actor_lr : critic_lr;
            oc.schedule = r == R_ACTOR ? sched : critic_sched;
            p.opt[r] = optim_new(m, &R[r].mesh, oc);
            p.grads[r] = xcalloc(optim_grad_floats(p.opt[r]), sizeof(float));
            p.gl[r] = xcalloc(m->n_layers_local, sizeof(LayerWeights));
            model_weights_place(m, p.grads[r], &p.gw[r], p.gl[r]);
        }
    }
    int step0 = 0;
    if (resume) {
        step0 = rs.step;
        p.kl_coef = rs.kl_coef;
        int same = !strcmp(rs.placement, p.placement);
        for (int r = R_ACTOR; r <= R_CRITIC; r++) {
            if (!R[r].member) continue;
            char path[4200];
            snprintf(path, sizeof path, "%s/%s/optim.rank%d.bin", resume, ROLE_NAMES[r], R[r].mesh.rank);
            if (!same) p.opt[r]->step = step0;
            else if (optim_load(p.opt[r], path)) rank_error("%s: cannot read", path);
        }
        if (p.world_rank == 0)
            fprintf(stderr, "resuming at step %d from %s%s\n", step0, resume,
                    same ? "" : ": another placement, so the weights and the step continue and the optimizer state restarts");
    }
    for (int r = R_ACTOR; r <= R_CRITIC; r++) {
        if (!R[r].member) continue;
        int share = p.mini / R[r].mesh.dp, micro = micro_size(&p, &R[r]), n_mb = (share + micro - 1) / micro;
        p.n_slots[r] = R[r].pp < n_mb ? R[r].pp : n_mb;
        p.slots[r] = xcalloc(p.n_slots[r], sizeof(TrainActs));
        for (int i = 0; i < p.n_slots[r]; i++) train_acts_init(&p.slots[r][i], &R[r].m, micro * p.max_len, p.max_len, 0);
    }
    if (R[R_ACTOR].member) {
        int share = (S + R[R_ACTOR].mesh.dp - 1) / R[R_ACTOR].mesh.dp;
        EngineConfig ec = {share, 4096, 0, 16, acfg.max_pos, R[R_ACTOR].pp, 1, p.n_stops ? stop_on_token : NULL, NULL, &p,
                           NULL, share * ((p.max_len + 15) / 16 + 1), temperature};
        p.engine = engine_new(&R[R_ACTOR].m, &ec, p.max_len);
    }
    for (int r = 0; r < N_ROLES; r++) {   /* memory plan per role */
        if (!R[r].member) continue;
        MemPlan plan = model_mem_plan(&R[r].m);
        if (p.opt[r]) { plan.grads = sizeof(float) * (double)optim_grad_floats(p.opt[r]); plan.moments = 2.0 * sizeof(float) * p.opt[r]->n_state; }
        for (int i = 0; i < p.n_slots[r]; i++) plan.acts += sizeof(float) * (double)p.slots[r][i].n_arena;
        plan.acts += sizeof(float) * (double)R[r].m.s.n_floats;
        if (r == R_ACTOR) { EngineStats es = engine_stats(p.engine); plan.kv = es.kv_bytes; plan.acts += es.act_bytes; }
        if (mesh_is_root(&R[r].mesh)) fprintf(stderr, "%s: ", ROLE_NAMES[r]);
        model_print_memory_plan(&R[r].m, &plan);
    }
    if (p.world_rank == 0) {
        args_print(opts, n_opts);
        fprintf(stderr, "%d prompts; %d steps of %d prompts x %d samples, %d mini-batch(es) x %d epoch(s)\n", p.n_prompts,
                steps, p.B, p.G, S / p.mini, p.ppo_epochs);
    }

    /* the batch */
    Experience b = {0};
    b.tokens = xmalloc(sizeof(int) * maxN); b.targets = xmalloc(sizeof(int) * maxN);
    b.seq_start = xmalloc(sizeof(int) * (S + 1));
    b.prompt_len = xmalloc(sizeof(int) * S); b.resp_len = xmalloc(sizeof(int) * S); b.finish = xmalloc(sizeof(int) * S);
    b.mask = xmalloc(sizeof(float) * maxN); b.old_lp = xmalloc(sizeof(float) * maxN);
    b.ref_lp = R[R_REF].active ? xmalloc(sizeof(float) * maxN) : NULL;
    b.values = xmalloc(sizeof(float) * maxN);
    b.score = xmalloc(sizeof(double) * S);
    b.rewards = xmalloc(sizeof(double) * maxN); b.kl = xmalloc(sizeof(double) * maxN);
    b.adv = xmalloc(sizeof(double) * maxN); b.ret = xmalloc(sizeof(double) * maxN);
    b.adv_f = xmalloc(sizeof(float) * maxN); b.ret_f = xmalloc(sizeof(float) * maxN);
    int *pidx = xmalloc(sizeof(int) * p.B);
    double *gadv = xmalloc(sizeof(double) * S);

    FILE *metrics = NULL;
    if (p.world_rank == 0) {
        mkdir_p(out);
        char *mp = path_join(out, "metrics.jsonl");
        metrics = fopen(mp, resume ? "a" : "w");
        if (!metrics) user_error("%s: cannot open for writing: %s", mp, strerror(errno));
        free(mp);
    }
    ModelConfig norm = {0};   /* --normalize-reward: the reward model's saved eval mean / std */
    if (p.normalize_reward && R[R_REWARD].active) config_load(&norm, R[R_REWARD].dir);
    int last = stop_after > 0 && stop_after < steps ? stop_after : steps;
    double t_run = now_seconds();
    float *step_s = xcalloc(last + 1, sizeof(float));
    for (int step = step0; step < last; step++) {
        enum { T_GEN, T_REF, T_REWARD, T_VALUES, T_ADV, T_ACTOR, T_CRITIC, T_STEP, N_T };
        float tm[N_T] = {0};
        double t0 = now_seconds(), t = t0;
#define LAP(k) do { double t_ = now_seconds(); tm[k] = (float)(t_ - t); t = t_; } while (0)
        step_prompts(&p, step, pidx);
        rollout(&p, step, pidx, &b);
        LAP(T_GEN);
        int N = b.N;
        phase_ref(&p, &b);
        LAP(T_REF);
        phase_reward(&p, &b, pidx);
        LAP(T_REWARD);
        phase_values(&p, &b);
        LAP(T_VALUES);

        /* 3. advantages (every rank, the same arithmetic on the same numbers) */
        double score_raw = 0;
        for (int s = 0; s < S; s++) {
            double x = b.score[s];
            score_raw += x;
            if (norm.has_reward_stats) x = (x - norm.reward_mean) / norm.reward_std;
            if (p.eos_penalty != 0 && b.finish[s] != FINISH_STOP) x -= p.eos_penalty;
            if (p.reward_clip > 0) x = x < -p.reward_clip ? -p.reward_clip : x > p.reward_clip ? p.reward_clip : x;
            b.score[s] = x;
        }
        double kl_pen = p.adv_kind == ADV_GAE ? p.kl_coef : 0.0;   /* grpo / rloo: outcome rewards, KL in the loss */
        ppo_token_rewards(b.seq_start, S, b.mask, b.old_lp, b.ref_lp ? b.ref_lp : b.old_lp, b.score, p.kl_est,
                          b.ref_lp ? kl_pen : 0.0, b.rewards, b.kl);
        if (p.adv_kind == ADV_GAE) {
            ppo_gae(b.seq_start, S, b.mask, b.rewards, b.values, p.gamma, p.lambda, b.adv, b.ret);
            if (!no_whiten) ppo_whiten(b.adv, b.mask, N);
        } else {
            group_advantages(p.adv_kind, b.score, S, p.G, p.std_norm, 1e-6, gadv);
            for (int s = 0; s < S; s++)
                for (int n = b.seq_start[s]; n < b.seq_start[s + 1]; n++) b.adv[n] = b.mask[n] > 0 ? gadv[s] : 0.0, b.ret[n] = 0.0;
        }
        for (int n = 0; n < N; n++) { b.adv_f[n] = (float)b.adv[n]; b.ret_f[n] = (float)b.ret[n]; }
        LAP(T_ADV);

        /* 4. update */
        memset(&p.actor_hook.stats, 0, sizeof(PpoStats));
        p.entropy[0] = p.entropy[1] = 0;
        memset(&p.critic_hook.stats, 0, sizeof(PpoStats));
        double gn[2] = {0, 0};
        if (R[R_ACTOR].member) gn[0] = update(&p, R_ACTOR, step, &b);
        LAP(T_ACTOR);
        if (R[R_CRITIC].member) gn[1] = update(&p, R_CRITIC, step, &b);
        LAP(T_CRITIC);
        PpoStats as = p.actor_hook.stats, cs = p.critic_hook.stats;
        if (R[R_ACTOR].member) {   /* the entropy (last stage; dp sum) to every rank */
            comm_all_reduce_sum_f64(&R[R_ACTOR].mesh.dp_comm, p.entropy, 2);
            comm_broadcast(&R[R_ACTOR].mesh.pp_comm, p.entropy, sizeof p.entropy, R[R_ACTOR].mesh.pp_comm.size - 1);
        }
        comm_broadcast(&p.world, p.entropy, sizeof p.entropy, R[R_ACTOR].root);
        share_stats(&p, &R[R_ACTOR], &as);
        comm_broadcast(&p.world, &gn[0], sizeof(double), R[R_ACTOR].root);
        if (R[R_CRITIC].active) { share_stats(&p, &R[R_CRITIC], &cs); comm_broadcast(&p.world, &gn[1], sizeof(double), R[R_CRITIC].root); }
        tm[T_STEP] = (float)(now_seconds() - t0);
        comm_all_reduce_max(&p.world, tm, N_T);   /* a role's phase as long as its slowest rank */
        step_s[step] = tm[T_STEP];
        if (as.logprob_diff_max != 0 || as.n_checked == 0)
            user_error("step %d: the actor's training logprobs differ from its rollout logprobs (max |diff| %.3g over %.0f "
                       "tokens): the one-engine guarantee is broken", step + 1, as.logprob_diff_max, as.n_checked);

        /* adaptive KL (Ziegler et al.): the batch's mean per-sequence KL against the target */
        double seq_kl = 0, resp_len = 0, clipped = 0, rew_sum = 0;
        for (int s = 0; s < S; s++) {
            double k = 0, r = 0;
            for (int n = b.seq_start[s]; n < b.seq_start[s + 1]; n++) if (b.mask[n] > 0) { k += b.kl[n]; r += b.rewards[n]; }
            seq_kl += b.resp_len[s] ? k / b.resp_len[s] : 0;
            rew_sum += p.adv_kind == ADV_GAE ? r : b.score[s];
            resp_len += b.resp_len[s];
            clipped += b.finish[s] == FINISH_LENGTH;
        }
        seq_kl /= S;
        double kl_used = p.kl_coef;
        if (p.kl_target > 0 && R[R_REF].active) {
            double e = seq_kl / p.kl_target - 1;
            e = e < -0.2 ? -0.2 : e > 0.2 ? 0.2 : e;
            p.kl_coef *= 1 + e * S / p.kl_horizon;
        }
        if (p.world_rank == 0) {
            double na = as.n_tokens > 0 ? as.n_tokens : 1, nc = cs.n_tokens > 0 ? cs.n_tokens : 1;
            double vmean = masked_mean(b.ret, b.mask, N), ev = 0;
            if (R[R_CRITIC].active) {   /* explained variance of the returns by the values */
                double *d = xmalloc(sizeof(double) * N), *vv = xmalloc(sizeof(double) * N);
                for (int n = 0; n < N; n++) { d[n] = b.ret[n] - b.values[n]; vv[n] = b.values[n]; }
                double md = masked_mean(d, b.mask, N), vd = 0, vr = 0, cnt = 0;
                for (int n = 0; n < N; n++)
                    if (b.mask[n] > 0) { vd += (d[n] - md) * (d[n] - md); vr += (b.ret[n] - vmean) * (b.ret[n] - vmean); cnt++; }
                ev = vr > 0 ? 1 - vd / vr : 0;
                vmean = masked_mean(vv, b.mask, N);
                free(d); free(vv);
            }
            fprintf(metrics, "{\"step\": %d, \"critic/score/mean\": %.9g, \"critic/rewards/mean\": %.9g, "
                             "\"critic/advantages/mean\": %.9g, \"critic/returns/mean\": %.9g, \"critic/values/mean\": %.9g, "
                             "\"actor/pg_loss\": %.9g, \"actor/pg_clipfrac\": %.9g, \"actor/pg_clipfrac_lower\": %.9g, "
                             "\"actor/ppo_kl\": %.9g, \"actor/entropy\": %.9g, \"actor/kl\": %.9g, \"actor/kl_loss\": %.9g, \"actor/kl_coef\": %.9g, "
                             "\"actor/grad_norm\": %.9g, \"critic/vf_loss\": %.9g, \"critic/vf_clipfrac\": %.9g, "
                             "\"critic/vf_explained_var\": %.9g, \"critic/grad_norm\": %.9g, \"response_length/mean\": %.9g, "
                             "\"response_length/clip_ratio\": %.9g, \"rollout_logprob_diff_max\": %.9g",
                    step + 1, score_raw / S, rew_sum / S, masked_mean(b.adv, b.mask, N), masked_mean(b.ret, b.mask, N),
                    R[R_CRITIC].active ? vmean : 0.0, as.pg_loss / na, as.pg_clipfrac / na, as.pg_clipfrac_lower / na,
                    as.ppo_kl / na, p.entropy[1] > 0 ? p.entropy[0] / p.entropy[1] : 0.0, R[R_REF].active ? seq_kl : 0.0, as.kl_loss / na, kl_used, gn[0], cs.vf_loss / nc,
                    cs.vf_clipfrac / nc, ev, gn[1], resp_len / S, clipped / S, as.logprob_diff_max);
            static const char *tn[N_T] = {"gen", "ref", "reward", "values", "adv", "update_actor", "update_critic", "step"};
            for (int k = 0; k < N_T; k++) fprintf(metrics, ", \"timing_s/%s\": %.6f", tn[k], tm[k]);
            fprintf(metrics, ", \"samples_per_s\": %.3f}\n", S / (tm[T_STEP] > 0 ? tm[T_STEP] : 1e-9));
            fflush(metrics);
            if ((step + 1) % log_every == 0 || step + 1 == last)
                fprintf(stderr, "step %d/%d | score %.4f | pg_loss %.4f | clipfrac %.3f | kl %.4f | vf_loss %.4f | len %.1f | "
                                "logprob diff %g | %.2f s (gen %.2f, update %.2f)\n",
                        step + 1, steps, score_raw / S, as.pg_loss / na, as.pg_clipfrac / na, seq_kl, cs.vf_loss / nc,
                        resp_len / S, as.logprob_diff_max, tm[T_STEP], tm[T_GEN], tm[T_ACTOR] + tm[T_CRITIC]);
        }
        if (save_every > 0 && (step + 1) % save_every == 0 && step + 1 != last) save_checkpoint(&p, out, step + 1);
    }
    if (bench_alone > 0 && last > step0) bench_phases_alone(&p, last - 1, pidx, &b, bench_alone, step_s + step0, last - step0);
    free(step_s);
    save_checkpoint(&p, out, last);
    comm_barrier(&p.world);
    if (p.world_rank == 0) {
        fprintf(stderr, "ppo: %d steps in %.1f s; actor%s in %s/checkpoint-%d; peak RSS %.1f MiB\n", last - step0,
                now_seconds() - t_run, R[R_CRITIC].active ? " and critic" : "", out, last, peak_rss_mib());
        fclose(metrics);
    }
    reward_cmd_stop(p.rcmd);
    if (p.engine) engine_free(p.engine);
    for (int r = 0; r < N_ROLES; r++) {
        for (int i = 0; i < p.n_slots[r]; i++) train_acts_free(&p.slots[r][i]);
        free(p.slots[r]);
        if (p.opt[r]) optim_free(p.opt[r]);
        free(p.grads[r]); free(p.gl[r]);
        if (R[r].member) { model_free(&R[r].m); mesh_free(&R[r].mesh); }
    }
    for (int i = 0; i < p.n_prompts; i++) { tok_ids_free(&p.prompts[i]); free(p.prompt_text[i]); free(p.labels[i]); }
    free(p.prompts); free(p.prompt_text); free(p.labels);
    tokenizer_free(p.tok);
    free(b.tokens); free(b.targets); free(b.seq_start); free(b.prompt_len); free(b.resp_len); free(b.finish);
    free(b.mask); free(b.old_lp); free(b.ref_lp); free(b.values); free(b.score); free(b.rewards); free(b.kl);
    free(b.adv); free(b.ret); free(b.adv_f); free(b.ret_f); free(pidx); free(gadv); free(g_rows); free(p.stop_ids);
    for (int i = 0; i < p.n_stops; i++) free(p.stops[i]);
    for (int i = 0; p.txt && i < S; i++) free(p.txt[i]);
    for (int i = 0; i < p.n_urls; i++) free(p.urls[i]);
    free(p.urls); free(p.stops); free(p.ts); free(p.txt); free(p.tlen); free(p.tcap);
    comm_free(&p.world);
    comm_finalize();
    return 0;
}
