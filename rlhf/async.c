/* async.c — see async.h. */
#include "rlhf/async.h"
#include "runtime/util.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK ((size_t)1 << 30)   /* bytes per MPI message at most (counts are ints) */
#define INFLIGHT_MAGIC "TDMINFL1"

/* ---- a packed batch: header, then the arrays at full capacity (S sequences of max_len) ---------- */

typedef struct { int S, N, step, env_dropped; double gen_s, idle_s; } BlobHead;   /* env_dropped: the batch's dropped replies */

static size_t blob_size(int S, int max_len) {
    size_t cap = (size_t)S * max_len;
    return sizeof(BlobHead) + sizeof(int) * ((size_t)S + 1 + 7 * (size_t)S + 5 * cap) + sizeof(double) * cap;
}

/* the arrays' places in a blob, in order */
static void blob_layout(char *blob, int S, int max_len, int **ss, int **per, int **tok, int **tgt, float **mask, float **lp,
                        int **turn, double **turn_r) {
    size_t cap = (size_t)S * max_len;
    *turn_r = (double *)(blob + sizeof(BlobHead));   /* first: aligned */
    int *p = (int *)(*turn_r + cap);
    *ss = p; p += S + 1;
    *per = p; p += 7 * (size_t)S;   /* prompt_len, resp_len, finish, draw, version, turns, fault */
    *tok = p; p += cap;
    *tgt = p; p += cap;
    *turn = p; p += cap;            /* the episode fields (rlhf/episode.h; 0 without an environment) */
    *mask = (float *)p; p += cap;
    *lp = (float *)p;
}

static void pack(const Experience *b, int max_len, int step, int env_dropped, double gen_s, double idle_s, char *blob) {
    int *ss, *per, *tok, *tgt, *turn, S = b->S;
    float *mask, *lp;
    double *turn_r;
    memset(blob, 0, blob_size(S, max_len));
    *(BlobHead *)blob = (BlobHead){S, b->N, step, env_dropped, gen_s, idle_s};
    blob_layout(blob, S, max_len, &ss, &per, &tok, &tgt, &mask, &lp, &turn, &turn_r);
    memcpy(ss, b->seq_start, sizeof(int) * (S + 1));
    memcpy(per, b->prompt_len, sizeof(int) * S); memcpy(per + S, b->resp_len, sizeof(int) * S);
    memcpy(per + 2 * S, b->finish, sizeof(int) * S); memcpy(per + 3 * S, b->draw, sizeof(int) * S);
    memcpy(per + 4 * S, b->version, sizeof(int) * S);
    memcpy(per + 5 * S, b->turns, sizeof(int) * S); memcpy(per + 6 * S, b->fault, sizeof(int) * S);
    memcpy(turn, b->turn, sizeof(int) * b->N); memcpy(turn_r, b->turn_r, sizeof(double) * b->N);
    memcpy(tok, b->tokens, sizeof(int) * b->N); memcpy(tgt, b->targets, sizeof(int) * b->N);
    memcpy(mask, b->mask, sizeof(float) * b->N); memcpy(lp, b->old_lp, sizeof(float) * b->N);
}

static void unpack(char *blob, int max_len, Experience *b) {
    const BlobHead *h = (const BlobHead *)blob;
    int *ss, *per, *tok, *tgt, *turn, S = h->S;
    float *mask, *lp;
    double *turn_r;
    blob_layout(blob, S, max_len, &ss, &per, &tok, &tgt, &mask, &lp, &turn, &turn_r);
    b->S = S;
    b->N = h->N;
    memcpy(b->seq_start, ss, sizeof(int) * (S + 1));
    memcpy(b->prompt_len, per, sizeof(int) * S); memcpy(b->resp_len, per + S, sizeof(int) * S);
    memcpy(b->finish, per + 2 * S, sizeof(int) * S); memcpy(b->draw, per + 3 * S, sizeof(int) * S);
    memcpy(b->version, per + 4 * S, sizeof(int) * S);
    memcpy(b->turns, per + 5 * S, sizeof(int) * S); memcpy(b->fault, per + 6 * S, sizeof(int) * S);
    memcpy(b->turn, turn, sizeof(int) * b->N); memcpy(b->turn_r, turn_r, sizeof(double) * b->N);
    memcpy(b->tokens, tok, sizeof(int) * b->N); memcpy(b->targets, tgt, sizeof(int) * b->N);
    memcpy(b->mask, mask, sizeof(float) * b->N); memcpy(b->old_lp, lp, sizeof(float) * b->N);
}

/* ---- setup ------------------------------------------------------------------------------------- */

static char *slot(const AsyncPipe *a, int j) { return a->q[j % (a->lag + 1)]; }

/* A resumed checkpoint's in-flight batches (inflight.bin): into the queue on the trainer ranks
 * (load), counted on the rollout ranks; those it lacks (a checkpoint of another lag, or of a run that
 * ended there) are generated again, from the resumed weights. Returns how many it has. */
static int load_inflight(AsyncPipe *a, const char *resume, int load, int say) {
    char *path = path_join(resume, "inflight.bin");
    size_t len = 0;
    char *text = read_file(path, &len);
    int want = a->limit - a->step0 < a->lag ? a->limit - a->step0 : a->lag, hdr[3] = {0, 0, 0}, n = 0;
    if (text && (len < 8 + sizeof hdr || memcmp(text, INFLIGHT_MAGIC, 8))) user_error("%s: not a tandem in-flight batch file", path);
    if (text) memcpy(hdr, text + 8, sizeof hdr);
    if (text && hdr[1] == a->step0 && len == 8 + sizeof hdr + (size_t)hdr[2] * a->blob_bytes) n = hdr[2] < want ? hdr[2] : want;
    else if (text) user_error("%s: in-flight batches from step %d of another size than this run's", path, hdr[1] + 1);
    /* the lag does not matter: batch j of a lag-L run came from version max(0, j - L) <= step0 */
    for (int i = 0; load && i < n; i++) memcpy(slot(a, a->step0 + i), text + 8 + sizeof hdr + (size_t)i * a->blob_bytes, a->blob_bytes);
    if (say && n < want)
        fprintf(stderr, "resuming: %d of the %d batches in flight at step %d are in %s; the others are generated again from "
                "the resumed weights\n", n, want, a->step0, path);
    free(text);
    free(path);
    return n;
}

void async_open(AsyncPipe *a, const Roles *rs, int lag, int S, int max_len, int step0, int last, int steps,
                const char *resume) {
    memset(a, 0, sizeof *a);
    a->on = rs->role[R_ROLLOUT].active;
    if (!a->on) return;
    a->lag = lag;
    a->S = S;
    a->max_len = max_len;
    a->step0 = step0;
    a->last = last;
    a->limit = last + lag < steps ? last + lag : steps;
    a->blob_bytes = blob_size(S, max_len);
    a->next = step0;
    const Model *m = rs->role[R_ACTOR].member ? &rs->role[R_ACTOR].m : rs->role[R_ROLLOUT].member ? &rs->role[R_ROLLOUT].m : NULL;
    if (m) a->wbytes = m->n_params * dtype_size(m->dtype);
    int rollout = rs->role[R_ROLLOUT].member;
    if (!rollout) {
        a->q = xmalloc(sizeof(char *) * (lag + 1));
        for (int i = 0; i <= lag; i++) a->q[i] = xcalloc(1, a->blob_bytes);
    }
    /* the trainer holds the checkpoint's in-flight batches; the rollout ranks go on after them */
    if (resume && lag > 0 && step0 < a->limit) a->next = step0 + load_inflight(a, resume, !rollout, rs->world_rank == 0);
}

void async_close(AsyncPipe *a) {
    for (int i = 0; a->q && i <= a->lag; i++) free(a->q[i]);
    free(a->q);
}

char *async_inflight(const AsyncPipe *a, int step, int *n, size_t *bytes) {
    *n = 0;
    if (!a->on || a->lag == 0) return NULL;
    int hdr[3] = {a->lag, step, 0};
    for (int j = step; j < step + a->lag && j < a->next; j++) hdr[2]++;
    *n = hdr[2];
    *bytes = 8 + sizeof hdr + (size_t)hdr[2] * a->blob_bytes;
    char *buf = xmalloc(*bytes);
    memcpy(buf, INFLIGHT_MAGIC, 8);
    memcpy(buf + 8, hdr, sizeof hdr);
    for (int i = 0; i < hdr[2]; i++) memcpy(buf + 8 + sizeof hdr + (size_t)i * a->blob_bytes, slot(a, step + i), a->blob_bytes);
    return buf;
}

/* ---- weights ------------------------------------------------------------------------------------ */

/* FNV-1a over 8-byte words (then the tail) of an arena in the backend's memory, read in 64 MiB pieces */
static uint64_t checksum(const Model *m, size_t n) {
    size_t piece = (size_t)64 << 20;
    unsigned char *c = xmalloc(n < piece ? n + 1 : piece);
    uint64_t h = 0xcbf29ce484222325ull, w;
    for (size_t o = 0; o < n; o += piece) {
        size_t k = n - o < piece ? n - o : piece, i = 0;
        m->be->to_host(c, (const char *)m->params + o, k);
        for (; i + 8 <= k; i += 8) { memcpy(&w, c + i, 8); h = (h ^ w) * 0x100000001b3ull; }
        for (; i < k; i++) h = (h ^ c[i]) * 0x100000001b3ull;
    }
    free(c);
    return h;
}

/* point to point and broadcast in pieces of at most CHUNK bytes (MPI counts are ints); buffers may be
 * the backend's memory (runtime/comm.h) */
static void send_big(const Comm *c, const void *buf, size_t n, int dst) {
    size_t o = 0;
    do { size_t k = n - o < CHUNK ? n - o : CHUNK; comm_send(c, (const char *)buf + o, k, dst); o += k; } while (o < n);
}
static void recv_big(const Comm *c, void *buf, size_t n, int src) {
    size_t o = 0;
    do { size_t k = n - o < CHUNK ? n - o : CHUNK; comm_recv(c, (char *)buf + o, k, src); o += k; } while (o < n);
}
static void bcast_big(const Comm *c, void *buf, size_t n, int root) {
    for (size_t o = 0; o < n; o += CHUNK) comm_broadcast(c, (char *)buf + o, n - o < CHUNK ? n - o : CHUNK, root);
}

/* Weights version v from the actor's dp-rank-0 ranks to the rollout ranks (both sides call it): the
 * arena straight from the backend's memory into the other's, its checksum beside it. */
static void sync_weights(AsyncPipe *a, Roles *rs, int v) {
    Role *A = &rs->role[R_ACTOR], *R = &rs->role[R_ROLLOUT];
    double t0 = now_seconds(), bytes = 0;
    if (A->member && A->mesh.dp_rank == 0) {   /* to the rollout rank of the same tp and pp, dp rank 0 */
        const Mesh *me = &A->mesh;
        int ro_dp = R->count / (me->tp * me->pp), dst = R->root + me->tp_rank + me->tp * ro_dp * me->pp_rank;
        uint64_t h[2] = {checksum(&A->m, a->wbytes), (uint64_t)a->wbytes};
        t0 = now_seconds();   /* the transfer's time, without the checksum's pass */
        comm_send(&rs->job, h, sizeof h, dst);
        send_big(&rs->job, A->m.params, a->wbytes, dst);
        bytes = (double)a->wbytes;
    }
    if (R->member) {
        const Mesh *me = &R->mesh;
        uint64_t h[2] = {0, 0};
        if (me->dp_rank == 0) {   /* from the actor rank of the same tp and pp, dp rank 0 */
            int a_dp = A->count / (me->tp * me->pp), src = A->root + me->tp_rank + me->tp * a_dp * me->pp_rank;
            comm_recv(&rs->job, h, sizeof h, src);
            if (h[1] != a->wbytes)
                rank_error("rollout: the actor's shard has %llu bytes, this rank's %zu: not the same layout or dtype",
                           (unsigned long long)h[1], a->wbytes);
            recv_big(&rs->job, R->m.params, a->wbytes, src);
        }
        comm_broadcast(&me->dp_comm, h, sizeof h, 0);
        bcast_big(&me->dp_comm, R->m.params, a->wbytes, 0);
        double t1 = now_seconds();
        uint64_t mine = checksum(&R->m, a->wbytes);   /* the arena itself, as the forward reads it */
        if (mine != h[0])
            rank_error("rollout: weights version %d: checksum %016llx of this rank's copy, the actor's %016llx: the copy is "
                       "not exact", v, (unsigned long long)mine, (unsigned long long)h[0]);
        if (mesh_is_root(me))
            fprintf(stderr, "rollout: weights version %d: %zu bytes, checksum %016llx (the actor's %016llx), %.3f s\n", v,
                    a->wbytes, (unsigned long long)mine, (unsigned long long)h[0], t1 - t0);
    }
    if (!R->member) {   /* the step's report: bytes of every sender, the slowest one's seconds */
        double s = now_seconds() - t0;
        comm_all_reduce_sum_f64(&rs->world, &bytes, 1);
        float fs = (float)s;
        comm_all_reduce_max(&rs->world, &fs, 1);
        a->st.sync_bytes = bytes;
        a->st.sync_s = fs;
    }
}

void async_initial_sync(AsyncPipe *a, Roles *rs) {
    if (a->on) sync_weights(a, rs, a->step0);
}

/* ---- batches ------------------------------------------------------------------------------------ */

/* Trainer ranks: batches a->next .. upto (below limit) from the rollout root, each to every trainer rank. */
static void receive_upto(AsyncPipe *a, const Roles *rs, int upto) {
    double t0 = now_seconds();
    for (; a->next <= upto && a->next < a->limit; a->next++) {
        char *blob = slot(a, a->next);
        if (rs->world_rank == 0) recv_big(&rs->job, blob, a->blob_bytes, rs->role[R_ROLLOUT].root);
        bcast_big(&rs->world, blob, a->blob_bytes, 0);
        const BlobHead *h = (const BlobHead *)blob;
        CHECK(h->step == a->next);
        a->st.gen_s = h->gen_s;
        a->st.idle_s = h->idle_s;
    }
    a->st.wait_s += now_seconds() - t0;
}

void async_take(AsyncPipe *a, ExperienceMaker *x, const Roles *rs, int step, int *pidx, Experience *b) {
    a->st.wait_s = 0;
    a->st.sync_bytes = a->st.sync_s = 0;
    receive_upto(a, rs, step);
    experience_step_prompts(x, step, pidx);
    unpack(slot(a, step), a->max_len, b);
    x->env_dropped = ((const BlobHead *)slot(a, step))->env_dropped;   /* the rollout root's count */
}

int async_fresh(const Experience *b, int step) {
    int n = 0;
    for (int s = 0; s < b->S; s++) n += b->version[s] == step;
    return n;
}

void async_check(AsyncPipe *a, const Experience *b, int step) {
    double sum = 0, mx = 0, diff = 0;
    int fresh = 0;
    for (int s = 0; s < b->S; s++) {
        int st = step - b->version[s];
        sum += st;
        mx = st > mx ? st : mx;
        if (st != 0 || !b->prox_lp || b->prox_self) continue;
        fresh++;
        for (int n = b->seq_start[s]; n < b->seq_start[s + 1]; n++)
            if (b->targets[n] >= 0) {
                double d = fabs((double)b->prox_lp[n] - (double)b->old_lp[n]);
                if (!(d <= diff)) diff = isnan(d) ? INFINITY : d;
            }
    }
    a->st.stale_mean = sum / b->S;
    a->st.stale_max = mx;
    a->st.diff_max = diff;
    a->st.n_fresh = fresh;
    if (diff != 0)
        user_error("step %d: the rollout ranks' logprobs of weights version %d differ from the actor's (max |diff| %.3g over "
                   "%d sequences): the weight copy is not exact", step + 1, step, diff, fresh);
}

void async_end_step(AsyncPipe *a, Roles *rs, int step) {
    if (!a->on) return;
    if (a->lag > 0) receive_upto(a, rs, step + a->lag);
    if (step + 1 + a->lag <= a->limit - 1) sync_weights(a, rs, step + 1);
}

/* ---- the rollout ranks ---------------------------------------------------------------------------- */

void async_rollout_loop(AsyncPipe *a, ExperienceMaker *x, Roles *rs) {
    Experience b;
    experience_alloc(&b, a->S, a->max_len, 0);
    int *pidx = xmalloc(sizeof(int) * x->B), version = a->step0;
    char *blob = xmalloc(a->blob_bytes);
    for (int j = a->next; j < a->limit; j++) {   /* after a resumed checkpoint's in-flight batches */
        double t0 = now_seconds();
        int need = j - a->lag > a->step0 ? j - a->lag : a->step0;
        while (version < need) sync_weights(a, rs, ++version);
        double t1 = now_seconds();
        experience_step_prompts(x, j, pidx);
        experience_rollout(x, rs, j, pidx, &b);
        for (int s = 0; s < b.S; s++) b.version[s] = version;
        if (rs->group_root) {
            pack(&b, a->max_len, j, x->env_dropped, now_seconds() - t1, t1 - t0, blob);
            send_big(&rs->job, blob, a->blob_bytes, 0);
        }
    }
    free(blob);
    free(pidx);
    experience_free(&b);
}
