/* comm_device.c — comm.h's calls on a backend's memory (Backend.owns: CUDA's device memory,
 * cpu-guarded's regions), which MPI cannot be handed. Two ways, chosen per group when it is made:
 *   link    the backend's own transport (NCCL on CUDA: kernels.h DeviceLink) when every rank of the
 *           group has a device of its own. Rank 0 makes the bootstrap id, MPI broadcasts it, every
 *           member opens the link (comm_link_attach, from comm_dup / comm_split: collective).
 *   staged  copied to host memory, through comm.c's MPI calls, and back: ranks that share a device
 *           (NCCL refuses them), a backend without a link (cpu-guarded: CI runs this path), or no
 *           libnccl (said once on stderr).
 * The fixed sums keep comm.h's tree either way: the link only moves data (all-gather, or sends and
 * receives grouped as an all-to-all) and the backend's tree_sum adds the ranks' partials in
 * kernels.h's order, so every layout keeps the one-rank bits on the device too. A link send posted
 * by comm_isend waits in `posted` and is issued with the next receive on its link (in one group,
 * so two stages sending to each other at once cannot deadlock) or at comm_wait.
 * Owns: the backend comm uses, the staging buffers, the link scratch and the posted sends. */
#include "runtime/comm_device.h"
#include "kernels/kernels.h"
#include "runtime/util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const Backend *dev;   /* comm_use_backend's, when it has memory MPI cannot take */

void comm_use_backend(const Backend *be) { dev = be && be->owns ? be : NULL; }
int comm_on_device(const void *p) { return dev && p && dev->owns(p); }
void comm_local_copy(void *dst, const void *src, size_t bytes) {
    if (comm_on_device(dst) || comm_on_device(src)) dev->copy_bytes(dst, src, bytes);
    else memmove(dst, src, bytes);
}

/* ---- staging: host copies, grown on demand, one per slot (a call uses at most two) ------------ */
static void *stage_buf[2];
static size_t stage_cap[2];
static void *staged(int slot, size_t bytes) {
    if (bytes > stage_cap[slot]) {
        free(stage_buf[slot]);
        stage_buf[slot] = xmalloc(bytes);
        stage_cap[slot] = bytes;
    }
    return stage_buf[slot];
}
static void *stage_in(int slot, const void *p, size_t bytes) {
    void *h = staged(slot, bytes);
    if (bytes) dev->to_host(h, p, bytes);
    return h;
}
static void stage_out(void *p, const void *h, size_t bytes) {
    if (bytes) dev->to_device(p, h, bytes);
}
static size_t fb(size_t n) { return n * sizeof(float); }

/* ---- the link ------------------------------------------------------------------------------------ */
enum { KEY = 128 };
static int said_staged;

void comm_link_attach(Comm *c) {
    c->link = NULL;
    if (!dev || !dev->link || c->size < 2 || getenv("TANDEM_NO_LINK")) return;
    const DeviceLink *L = dev->link;
    /* every rank's device key, gathered by broadcasts (a group is a few ranks; this runs once) */
    char *keys = xcalloc((size_t)c->size, KEY);
    L->device_key(keys + (size_t)c->rank * KEY, KEY - 1);
    for (int r = 0; r < c->size; r++) comm_broadcast(c, keys + (size_t)r * KEY, KEY, r);
    int shared = 0;
    for (int a = 0; a < c->size; a++)
        for (int b = a + 1; b < c->size; b++) shared |= !strcmp(keys + (size_t)a * KEY, keys + (size_t)b * KEY);
    free(keys);
    if (shared) return;   /* ranks on one device: staged */
    char why[256] = "";
    void *id = xcalloc(1, L->id_bytes);
    if (c->rank == 0) {
        const char *w = L->make_id(id);
        if (w) snprintf(why, sizeof why, "%s", w);
    }
    comm_broadcast(c, why, sizeof why, 0);
    if (!why[0]) {
        comm_broadcast(c, id, L->id_bytes, 0);
        const char *w = L->open(&c->link, id, c->rank, c->size);
        if (w) rank_error("%s: %s (rank 0 of this group has it)", L->name, w);
    } else if (!said_staged++ && c->rank == 0) {
        fprintf(stderr, "tandem: %s; device buffers go between ranks through host memory\n", why);
    }
    free(id);
}
void comm_link_detach(Comm *c) {
    if (c->link) dev->link->close(c->link);
    c->link = NULL;
}

/* backend memory for the link's partials, grown on demand (the backend's calls come from one thread) */
static float *link_scratch(size_t n) {
    static float *p;
    static size_t cap;
    if (n > cap) {
        dev->free(p);
        p = dev->alloc(fb(n));
        cap = n;
    }
    return p;
}

/* posted link sends: issued with the next receive on their link, or at comm_wait */
enum { MAX_POSTED = 16 };
static struct { void *link; const void *buf; size_t bytes; int peer; } posted[MAX_POSTED];
static int n_posted;
static char posted_marker;   /* a request's handle while its send is posted or issued on a link */
static void issue_posted(void) {   /* inside group_begin / group_end */
    for (int i = 0; i < n_posted; i++) dev->link->send(posted[i].link, posted[i].buf, posted[i].bytes, posted[i].peer);
    n_posted = 0;
}

/* ---- the calls ----------------------------------------------------------------------------------- */
void comm_dev_all_reduce_sum_fixed(const Comm *c, float *buf, size_t n) {
    int P = c->size;
    if (c->link) {   /* every partial to every rank, then the tree: the bits of the host path */
        float *all = link_scratch((size_t)P * n);   /* (P, n) */
        dev->link->all_gather(c->link, buf, all, n);
        dev->tree_sum(all, P, n);
        dev->copy(buf, all, n);
        comm_count_sent(c, (double)fb(n) * (P - 1));
        return;
    }
    float *h = stage_in(0, buf, fb(n));
    comm_all_reduce_sum_fixed(c, h, n);
    stage_out(buf, h, fb(n));
}

void comm_dev_all_reduce_max(const Comm *c, float *buf, size_t n) {
    if (c->link) {
        dev->link->max(c->link, buf, n);
        return;
    }
    float *h = stage_in(0, buf, fb(n));
    comm_all_reduce_max(c, h, n);
    stage_out(buf, h, fb(n));
}

/* no link call for these (small: argmax values, counts, double sums): staged on either path */
void comm_dev_all_reduce_maxloc(const Comm *c, float *val, int *idx, size_t n) {
    float *hv = stage_in(0, val, fb(n));
    int *hi = stage_in(1, idx, sizeof(int) * n);
    comm_all_reduce_maxloc(c, hv, hi, n);
    stage_out(val, hv, fb(n));
    stage_out(idx, hi, sizeof(int) * n);
}
void comm_dev_all_reduce_sum_int(const Comm *c, int *buf, size_t n) {
    int *h = stage_in(0, buf, sizeof(int) * n);
    comm_all_reduce_sum_int(c, h, n);
    stage_out(buf, h, sizeof(int) * n);
}
void comm_dev_all_reduce_sum_f64(const Comm *c, double *buf, size_t n) {
    double *h = stage_in(0, buf, sizeof(double) * n);
    comm_all_reduce_sum_f64(c, h, n);
    stage_out(buf, h, sizeof(double) * n);
}

void comm_dev_all_gather(const Comm *c, const float *in, float *out, size_t n_each) {
    size_t all = (size_t)c->size * n_each, mine = (size_t)c->rank * n_each;
    if (c->link) {
        dev->link->all_gather(c->link, in, out, n_each);
        comm_count_sent(c, (double)fb(n_each) * (c->size - 1));
        return;
    }
    float *h = staged(0, fb(all));
    dev->to_host(h + mine, in, fb(n_each));
    comm_all_gather(c, h + mine, h, n_each);
    stage_out(out, h, fb(all));
}

/* in (P, n_each) -> out (n_each) = block `rank` of the tree sum; out may be in + rank * n_each */
void comm_dev_reduce_scatter_sum_fixed(const Comm *c, const float *in, float *out, size_t n_each) {
    int P = c->size, r = c->rank;
    if (c->link) {
        enum { CHUNK = 1 << 20 };   /* floats per rank per round: the scratch is P of them */
        size_t chunk = n_each < CHUNK ? n_each : CHUNK;
        float *parts = link_scratch((size_t)P * chunk);   /* (P, k): rank s's partial of my block's chunk */
        for (size_t off = 0; off < n_each; off += chunk) {
            size_t k = n_each - off < chunk ? n_each - off : chunk;
            dev->copy(parts + (size_t)r * k, in + (size_t)r * n_each + off, k);
            dev->link->group_begin();
            for (int s = 0; s < P; s++)
                if (s != r) {
                    dev->link->send(c->link, in + (size_t)s * n_each + off, fb(k), s);
                    dev->link->recv(c->link, parts + (size_t)s * k, fb(k), s);
                }
            dev->link->group_end();
            dev->tree_sum(parts, P, k);
            dev->copy(out + off, parts, k);
        }
        comm_count_sent(c, (double)fb(n_each) * (P - 1));
        return;
    }
    float *h = stage_in(0, in, fb((size_t)P * n_each));
    float *ho = out == in + (size_t)r * n_each ? h + (size_t)r * n_each : staged(1, fb(n_each));
    comm_reduce_scatter_sum_fixed(c, h, ho, n_each);
    stage_out(out, ho, fb(n_each));
}

void comm_dev_all_gather_rows(const Comm *c, const float *mine, float *all, size_t n, size_t unit) {
    size_t lo, hi;
    comm_rows(n, c->size, c->rank, &lo, &hi);
    if (c->link) {
        if (mine != all + lo * unit) dev->copy(all + lo * unit, mine, (hi - lo) * unit);
        dev->link->group_begin();
        for (int s = 0; s < c->size; s++) {
            size_t a, b;
            comm_rows(n, c->size, s, &a, &b);
            if (s == c->rank) continue;
            if (hi > lo) dev->link->send(c->link, mine, fb((hi - lo) * unit), s);
            if (b > a) dev->link->recv(c->link, all + a * unit, fb((b - a) * unit), s);
        }
        dev->link->group_end();
        comm_count_sent(c, (double)fb((n - (hi - lo)) * unit));
        return;
    }
    float *h = staged(0, fb(n * unit));
    dev->to_host(h + lo * unit, mine, fb((hi - lo) * unit));
    comm_all_gather_rows(c, h + lo * unit, h, n, unit);
    stage_out(all, h, fb(n * unit));
}

void comm_dev_reduce_scatter_rows_fixed(const Comm *c, float *buf, size_t n, size_t unit) {
    int P = c->size, r = c->rank;
    size_t lo, hi;
    comm_rows(n, P, r, &lo, &hi);
    size_t mine = (hi - lo) * unit;
    if (c->link) {
        float *parts = link_scratch((size_t)P * mine);   /* (P, mine): rank s's partial of my rows */
        dev->copy(parts + (size_t)r * mine, buf + lo * unit, mine);
        dev->link->group_begin();
        for (int s = 0; s < P; s++) {
            size_t a, b;
            comm_rows(n, P, s, &a, &b);
            if (s == r) continue;
            if (b > a) dev->link->send(c->link, buf + a * unit, fb((b - a) * unit), s);
            if (mine) dev->link->recv(c->link, parts + (size_t)s * mine, fb(mine), s);
        }
        dev->link->group_end();
        dev->tree_sum(parts, P, mine);
        dev->copy(buf, parts, mine);
        comm_count_sent(c, (double)fb(n * unit - mine));
        return;
    }
    float *h = stage_in(0, buf, fb(n * unit));
    comm_reduce_scatter_rows_fixed(c, h, n, unit);
    stage_out(buf, h, fb(mine));
}

void comm_dev_broadcast(const Comm *c, void *buf, size_t bytes, int root) {
    if (c->link) {
        dev->link->broadcast(c->link, buf, bytes, root);
        if (c->rank == root) comm_count_sent(c, (double)bytes);
        return;
    }
    void *h = c->rank == root ? stage_in(0, buf, bytes) : staged(0, bytes);
    comm_broadcast(c, h, bytes, root);
    if (c->rank != root) stage_out(buf, h, bytes);
}

void comm_dev_send(const Comm *c, const void *buf, size_t bytes, int dst) {
    if (c->link) {
        dev->link->group_begin();
        issue_posted();
        dev->link->send(c->link, buf, bytes, dst);
        dev->link->group_end();
        comm_count_sent(c, (double)bytes);
        return;
    }
    comm_send(c, stage_in(0, buf, bytes), bytes, dst);
}

void comm_dev_isend(const Comm *c, const void *buf, size_t bytes, int dst, CommRequest *req) {
    comm_wait(req);
    if (c->link) {
        if (n_posted == MAX_POSTED) {   /* never in today's schedules (one per pipeline slot) */
            dev->link->group_begin();
            issue_posted();
            dev->link->group_end();
        }
        posted[n_posted].link = c->link, posted[n_posted].buf = buf, posted[n_posted].bytes = bytes;
        posted[n_posted++].peer = dst;
        req->handle = &posted_marker;
        comm_count_sent(c, (double)bytes);
        return;
    }
    void *h = xmalloc(bytes ? bytes : 1);   /* the request's own copy: freed by comm_wait */
    if (bytes) dev->to_host(h, buf, bytes);
    comm_isend(c, h, bytes, dst, req);
    req->host = h;
}

void comm_dev_recv(const Comm *c, void *buf, size_t bytes, int src) {
    if (c->link) {
        dev->link->group_begin();
        issue_posted();
        dev->link->recv(c->link, buf, bytes, src);
        dev->link->group_end();
        return;
    }
    void *h = staged(0, bytes);
    comm_recv(c, h, bytes, src);
    stage_out(buf, h, bytes);
}

int comm_dev_wait(CommRequest *req) {
    if (req->handle != &posted_marker) return 0;
    if (n_posted) {   /* issued now; the stream orders it before anything that later writes its buffer */
        dev->link->group_begin();
        issue_posted();
        dev->link->group_end();
    }
    req->handle = NULL;
    return 1;
}
