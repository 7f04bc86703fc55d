/* ppo_dump.c — see ppo_dump.h. */
#include "rlhf/ppo_dump.h"
#include "runtime/util.h"
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Keeps the lines of steps <= step (the resumed run writes the later ones again); a cut last line
 * goes. One rename. */
static void trim_after(const char *path, int step) {
    size_t len, n = 0;
    char *text = read_file(path, &len);
    if (!text) return;
    char *kept = xmalloc(len + 1);
    for (const char *line = text, *nl; line < text + len && (nl = memchr(line, '\n', (size_t)(text + len - line))); line = nl + 1) {
        int s;
        if (sscanf(line, "{\"step\": %d", &s) == 1 && s > step) continue;
        memcpy(kept + n, line, (size_t)(nl + 1 - line));
        n += (size_t)(nl + 1 - line);
    }
    if (n != len && write_file_atomic(path, kept, n)) rank_error("--dump-rollouts %s: cannot write: %s", path, strerror(errno));
    free(kept);
    free(text);
}

void rollout_dump_open(RolloutDump *d, const char *path, int resume_step, int writer, PpoHook *hook, int S, int max_len) {
    memset(d, 0, sizeof *d);
    d->path = path;
    d->hook = hook;
    d->train_lp = xcalloc((size_t)S * max_len, sizeof(float));
    if (!writer) return;
    if (resume_step >= 0) trim_after(path, resume_step);
    d->f = fopen(path, resume_step >= 0 ? "a" : "w");
    if (!d->f) rank_error("--dump-rollouts %s: cannot open: %s", path, strerror(errno));
}

void rollout_dump_close(RolloutDump *d) {
    if (d->f && fclose(d->f)) rank_error("--dump-rollouts %s: cannot write: %s", d->path, strerror(errno));
    free(d->pos);
    free(d->train_lp);
}

void rollout_dump_map(RolloutDump *d, const Experience *b, const int *perm, int k0, int mini, int dp, int dp_rank,
                      const Minibatch *mb, int n_mb) {
    d->mbs = mb->mbs;
    d->cap = mb->cap;
    d->pos = xrealloc(d->pos, sizeof(int) * (size_t)(n_mb > 0 ? n_mb : 1) * mb->cap);
    int i = 0, j = 0;   /* micro-batch i, its sequence j */
    for (int k = k0 + dp_rank; k < k0 + mini; k += dp) {
        int s = perm[k], t0 = b->seq_start[s], L = b->seq_start[s + 1] - t0;
        const MicroBatch *m = &mb->mbs[i];
        int n0 = m->seq_start[j];
        CHECK(i < n_mb && m->seq_start[j + 1] - n0 == L);
        for (int n = 0; n < L; n++) d->pos[(size_t)i * d->cap + n0 + n] = t0 + n;
        if (++j == m->n_seqs) i++, j = 0;
    }
    CHECK(i == n_mb && j == 0);
}

double rollout_dump_hook(const MicroBatch *mb, int N, const float *out, float *dout, void *user) {
    RolloutDump *d = user;
    size_t i = (size_t)(mb - d->mbs);
    for (int n = 0; n < N; n++)
        if (mb->targets[n] >= 0) d->train_lp[d->pos[i * d->cap + n]] = out[n];
    return loss_ppo_actor(mb, N, out, dout, d->hook);
}

void rollout_dump_share(RolloutDump *d, const Roles *rs, const Experience *b) {
    const Role *a = &rs->role[R_ACTOR];
    if (a->member)   /* the last stage caught them: to its pp stages, then as a role's result */
        comm_broadcast(&a->mesh.pp_comm, d->train_lp, sizeof(float) * b->N, a->mesh.pp_comm.size - 1);
    roles_share_f(rs, a, d->train_lp, b->N);
}

/* "key": [v, ...] over the response's tokens: v at each action (fmt 'f': a float array, 'd': a
 * double array, 'i': the tokens after the actions, 'e': 1 where the token is the environment's
 * (the position before it is no action), 't': the int array v at the tokens) */
static void put_array(FILE *f, const char *key, const Experience *b, int s, char fmt, const void *v) {
    int a0 = b->seq_start[s] + b->prompt_len[s] - 1;
    fprintf(f, ", \"%s\": [", key);
    for (int i = 0; i < b->resp_len[s]; i++) {
        double x = fmt == 'f' ? ((const float *)v)[a0 + i] : fmt == 'd' ? ((const double *)v)[a0 + i] : 0.0;
        if (i) fputs(", ", f);
        if (fmt == 'i') fprintf(f, "%d", b->tokens[a0 + 1 + i]);
        else if (fmt == 'e') fputc(b->targets[a0 + i] < 0 ? '1' : '0', f);
        else if (fmt == 't') fprintf(f, "%d", ((const int *)v)[a0 + 1 + i]);
        else if (!isfinite(x)) fputs("null", f);
        else fprintf(f, fmt == 'f' ? "%.9g" : "%.17g", x);
    }
    fputc(']', f);
}

void rollout_dump_write(RolloutDump *d, const ExperienceMaker *x, const Experience *b, int step, const int *pidx) {
    FILE *f = d->f;
    if (!f) return;
    for (int s = 0; s < b->S; s++) {
        int p = pidx[s / x->G], t0 = b->seq_start[s];
        double ol, eos;
        experience_shape_score(x, b, s, b->raw[s], &ol, &eos);   /* the parts of b->score[s] */
        fprintf(f, "{\"step\": %d, \"sample\": %d, \"draw\": %d, \"prompt_line\": %d, \"prompt_id\": %s, \"prompt_ids\": [",
                step + 1, s, b->draw[s], x->prompt_line[p], x->prompt_id[p] ? x->prompt_id[p] : "null");
        for (int i = 0; i < b->prompt_len[s]; i++) fprintf(f, "%s%d", i ? ", " : "", b->tokens[t0 + i]);
        fputc(']', f);
        put_array(f, "response_ids", b, s, 'i', NULL);
        fprintf(f, ", \"finish\": \"%s\"", b->finish[s] == FINISH_STOP ? "stop" : "length");
        put_array(f, "behaviour_logprobs", b, s, 'f', b->old_lp);
        put_array(f, "training_logprobs", b, s, 'f', d->train_lp);
        if (b->ref_lp) put_array(f, "ref_logprobs", b, s, 'f', b->ref_lp);
        if (b->teacher_lp) put_array(f, "teacher_logprobs", b, s, 'f', b->teacher_lp);
        put_array(f, "loss_mask", b, s, 'f', b->mask);
        put_array(f, "advantages", b, s, 'd', b->adv);
        if (x->env_cmd || x->env_url) {   /* the episode: whose each token is, its turn, each turn's reward */
            put_array(f, "env_token", b, s, 'e', NULL);
            put_array(f, "turn", b, s, 't', b->turn);
            put_array(f, "turn_rewards", b, s, 'd', b->turn_r);
            fprintf(f, ", \"turns\": %d, \"env_fault\": \"%s\"", b->turns[s], ENV_FAULT_NAMES[b->fault[s]]);
        }
        fprintf(f, ", \"score_raw\": %.17g, \"overlong_penalty\": %.17g, \"missing_eos_penalty\": %.17g, \"reward\": %.17g}\n",
                b->raw[s], ol, eos, b->score[s]);
    }
    if (fflush(f)) rank_error("--dump-rollouts %s: cannot write: %s", d->path, strerror(errno));
}
