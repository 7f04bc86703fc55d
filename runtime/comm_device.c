/* comm_device.c — comm.h's calls on a backend's memory (Backend.owns: CUDA's device memory,
 * cpu-guarded's regions), which MPI cannot be handed: comm.c hands a call here when its buffer is
 * memory of the group's backend (Comm.be). Two ways, chosen per group when it is made:
 *   link    the backend's own transport (NCCL on CUDA: kernels.h DeviceLink) when every rank of the
 *           group has a device of its own. Rank 0 makes the bootstrap id, MPI broadcasts it, every
 *           member opens the link (comm_link_attach, from comm_world / comm_dup / comm_split:
 *           collective).
 *   staged  copied to host memory, through comm_mpi.c's calls, and back: ranks that share a device
 *           (NCCL refuses them), a backend without a link (cpu-guarded: CI runs this path), or no
 *           libnccl (said once on stderr).
 * The fixed sums keep comm.h's tree either way: the link only moves data (all-gather, or sends and
 * receives grouped as an all-to-all) and the backend's tree_sum adds the ranks' partials in
 * kernels.h's order, so every layout keeps the one-rank bits on the device too. A link send posted
 * by comm_isend waits in `posted` and is issued with the next receive on its link (in one group,
 * so two stages sending to each other at once cannot deadlock) or at comm_wait.
 * Owns: the staging buffers, the link scratch and the posted sends. Calls comm_mpi.c, never comm.c
 * (comm.c counts the bytes). */
#include "runtime/comm_device.h"
#include "runtime/comm_mpi.h"
#include "kernels/kernels.h"
#include "runtime/util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
static void *stage_in(const Comm *c, int slot, const void *p, size_t bytes) {
    void *h = staged(slot, bytes);
    if (bytes) c->be->to_host(h, p, bytes);
    return h;
}
static void stage_out(const Comm *c, void *p, const void *h, size_t bytes) {
    if (bytes) c->be->to_device(p, h, bytes);
}
static size_t fb(size_t n) { return n * sizeof(float); }

/* ---- the link ------------------------------------------------------------------------------------ */
enum { KEY = 128 };
static int said_staged;

double comm_link_attach(Comm *c) {
    c->link = NULL;
    const Backend *be = c->be;
    if (!be || !be->link || c->size < 2 || getenv("TANDEM_NO_LINK")) return 0.0;
    const DeviceLink *L = be->link;
    /* every rank's device key, gathered by broadcasts (a group is a few ranks; this runs once) */
    char *keys = xcalloc((size_t)c->size, KEY);
    L->device_key(keys + (size_t)c->rank * KEY, KEY - 1);
    for (int r = 0; r < c->size; r++) comm_mpi_broadcast(c, keys + (size_t)r * KEY, KEY, r);
    double bytes = KEY;   /* this rank's key */
    int shared = 0;
    for (int a = 0; a < c->size; a++)
        for (int b = a + 1; b < c->size; b++) shared |= !strcmp(keys + (size_t)a * KEY, keys + (size_t)b * KEY);
    free(keys);
    if (shared) return bytes;   /* ranks on one device: staged */
    char why[256] = "";
    void *id = xcalloc(1, L->id_bytes);
    if (c->rank == 0) {
        const char *w = L->make_id(id);
        if (w) snprintf(why, sizeof why, "%s", w);
    }
    comm_mpi_broadcast(c, why, sizeof why, 0);
    if (c->rank == 0) bytes += sizeof why;
    if (!why[0]) {
        comm_mpi_broadcast(c, id, L->id_bytes, 0);
        if (c->rank == 0) bytes += (double)L->id_bytes;
        const char *w = L->open(&c->link, id, c->rank, c->size);
        if (w) rank_error("%s: %s (rank 0 of this group has it)", L->name, w);
    } else if (!said_staged++ && c->rank == 0) {
        fprintf(stderr, "tandem: %s; device buffers go between ranks through host memory\n", why);
    }
    free(id);
    return bytes;
}
void comm_link_detach(Comm *c) {
    if (c->link) c->be->link->close(c->link);
    c->link = NULL;
}

/* backend memory for the link's partials, grown on demand (the backend's calls come from one thread;
 * a group on another backend gets its own) */
static float *link_scratch(const Backend *be, size_t n) {
    static const Backend *owner;
    static float *p;
    static size_t cap;
    if (be != owner || n > cap) {
        if (owner) owner->free(p);
        p = be->alloc(fb(n));
        cap = n;
        owner = be;
    }
    return p;
}

/* posted link sends: issued with the next receive on their link, or at comm_wait */
enum { MAX_POSTED = 16 };
static struct { const Backend *be; void *link; const void *buf; size_t bytes; int peer; } posted[MAX_POSTED];
static int n_posted;
static char posted_marker;   /* a request's handle while its send is posted or issued on a link */
static void issue_posted(const Backend *be) {   /* be's, inside be's group_begin / group_end */
    int kept = 0;
    for (int i = 0; i < n_posted; i++)
        if (posted[i].be == be) be->link->send(posted[i].link, posted[i].buf, posted[i].bytes, posted[i].peer);
        else posted[kept++] = posted[i];
    n_posted = kept;
}
static void flush_posted(void) {   /* every posted send, each backend's in one group */
    while (n_posted) {
        const Backend *be = posted[0].be;
        be->link->group_begin();
        issue_posted(be);
        be->link->group_end();
    }
}

/* ---- the calls ----------------------------------------------------------------------------------- */
/* returns the bytes this rank sent: the link's all-gather, or comm_mpi.c's algorithm's */
double comm_dev_all_reduce_sum_fixed(const Comm *c, float *buf, size_t n) {
    const Backend *be = c->be;
    int P = c->size;
    if (c->link) {   /* every partial to every rank, then the tree: the bits of the host path */
        float *all = link_scratch(be, (size_t)P * n);   /* (P, n) */
        be->link->all_gather(c->link, buf, all, n);
        be->tree_sum(all, P, n);
        be->copy(buf, all, n);
        return (double)fb(n) * (P - 1);
    }
    float *h = stage_in(c, 0, buf, fb(n));
    double bytes = comm_mpi_all_reduce_sum_fixed(c, h, n);
    stage_out(c, buf, h, fb(n));
    return bytes;
}

void comm_dev_all_reduce_max(const Comm *c, float *buf, size_t n) {
    if (c->link) {
        c->be->link->max(c->link, buf, n);
        return;
    }
    float *h = stage_in(c, 0, buf, fb(n));
    comm_mpi_all_reduce(c, h, n, COMM_MPI_MAX_F32);
    stage_out(c, buf, h, fb(n));
}

/* no link call for these (small: argmax values, counts, double sums): staged on either path */
void comm_dev_all_reduce_maxloc(const Comm *c, float *val, int *idx, size_t n) {
    float *hv = stage_in(c, 0, val, fb(n));
    int *hi = stage_in(c, 1, idx, sizeof(int) * n);
    comm_mpi_all_reduce_maxloc(c, hv, hi, n);
    stage_out(c, val, hv, fb(n));
    stage_out(c, idx, hi, sizeof(int) * n);
}
void comm_dev_all_reduce_sum_int(const Comm *c, int *buf, size_t n) {
    int *h = stage_in(c, 0, buf, sizeof(int) * n);
    comm_mpi_all_reduce(c, h, n, COMM_MPI_SUM_I32);
    stage_out(c, buf, h, sizeof(int) * n);
}
void comm_dev_all_reduce_sum_f64(const Comm *c, double *buf, size_t n) {
    double *h = stage_in(c, 0, buf, sizeof(double) * n);
    comm_mpi_all_reduce(c, h, n, COMM_MPI_SUM_F64);
    stage_out(c, buf, h, sizeof(double) * n);
}

void comm_dev_all_gather(const Comm *c, const float *in, float *out, size_t n_each) {
    size_t all = (size_t)c->size * n_each, mine = (size_t)c->rank * n_each;
    if (c->link) {
        c->be->link->all_gather(c->link, in, out, n_each);
        return;
    }
    float *h = staged(0, fb(all));
    c->be->to_host(h + mine, in, fb(n_each));
    comm_mpi_all_gather(c, h + mine, h, n_each);
    stage_out(c, out, h, fb(all));
}

/* in (P, n_each) -> out (n_each) = block `rank` of the tree sum; out may be in + rank * n_each */
void comm_dev_reduce_scatter_sum_fixed(const Comm *c, const float *in, float *out, size_t n_each) {
    const Backend *be = c->be;
    int P = c->size, r = c->rank;
    if (c->link) {
        enum { CHUNK = 1 << 20 };   /* floats per rank per round: the scratch is P of them */
        size_t chunk = n_each < CHUNK ? n_each : CHUNK;
        float *parts = link_scratch(be, (size_t)P * chunk);   /* (P, k): rank s's partial of my block's chunk */
        for (size_t off = 0; off < n_each; off += chunk) {
            size_t k = n_each - off < chunk ? n_each - off : chunk;
            be->copy(parts + (size_t)r * k, in + (size_t)r * n_each + off, k);
            be->link->group_begin();
            for (int s = 0; s < P; s++)
                if (s != r) {
                    be->link->send(c->link, in + (size_t)s * n_each + off, fb(k), s);
                    be->link->recv(c->link, parts + (size_t)s * k, fb(k), s);
                }
            be->link->group_end();
            be->tree_sum(parts, P, k);
            be->copy(out + off, parts, k);
        }
        return;
    }
    float *h = stage_in(c, 0, in, fb((size_t)P * n_each));
    float *ho = out == in + (size_t)r * n_each ? h + (size_t)r * n_each : staged(1, fb(n_each));
    comm_mpi_reduce_scatter_sum_fixed(c, h, ho, n_each);
    stage_out(c, out, ho, fb(n_each));
}

void comm_dev_all_gather_rows(const Comm *c, const float *mine, float *all, size_t n, size_t unit) {
    const Backend *be = c->be;
    size_t lo, hi;
    comm_rows(n, c->size, c->rank, &lo, &hi);
    if (c->link) {
        if (mine != all + lo * unit) be->copy(all + lo * unit, mine, (hi - lo) * unit);
        be->link->group_begin();
        for (int s = 0; s < c->size; s++) {
            size_t a, b;
            comm_rows(n, c->size, s, &a, &b);
            if (s == c->rank) continue;
            if (hi > lo) be->link->send(c->link, mine, fb((hi - lo) * unit), s);
            if (b > a) be->link->recv(c->link, all + a * unit, fb((b - a) * unit), s);
        }
        be->link->group_end();
        return;
    }
    float *h = staged(0, fb(n * unit));
    be->to_host(h + lo * unit, mine, fb((hi - lo) * unit));
    comm_mpi_all_gather_rows(c, h + lo * unit, h, n, unit);
    stage_out(c, all, h, fb(n * unit));
}

void comm_dev_reduce_scatter_rows_fixed(const Comm *c, float *buf, size_t n, size_t unit) {
    const Backend *be = c->be;
    int P = c->size, r = c->rank;
    size_t lo, hi;
    comm_rows(n, P, r, &lo, &hi);
    size_t mine = (hi - lo) * unit;
    if (c->link) {
        float *parts = link_scratch(be, (size_t)P * mine);   /* (P, mine): rank s's partial of my rows */
        be->copy(parts + (size_t)r * mine, buf + lo * unit, mine);
        be->link->group_begin();
        for (int s = 0; s < P; s++) {
            size_t a, b;
            comm_rows(n, P, s, &a, &b);
            if (s == r) continue;
            if (b > a) be->link->send(c->link, buf + a * unit, fb((b - a) * unit), s);
            if (mine) be->link->recv(c->link, parts + (size_t)s * mine, fb(mine), s);
        }
        be->link->group_end();
        be->tree_sum(parts, P, mine);
        be->copy(buf, parts, mine);
        return;
    }
    float *h = stage_in(c, 0, buf, fb(n * unit));
    comm_mpi_reduce_scatter_rows_fixed(c, h, n, unit);
    stage_out(c, buf, h, fb(mine));
}

void comm_dev_broadcast(const Comm *c, void *buf, size_t bytes, int root) {
    if (c->link) {
        c->be->link->broadcast(c->link, buf, bytes, root);
        return;
    }
    void *h = c->rank == root ? stage_in(c, 0, buf, bytes) : staged(0, bytes);
    comm_mpi_broadcast(c, h, bytes, root);
    if (c->rank != root) stage_out(c, buf, h, bytes);
}

void comm_dev_send(const Comm *c, const void *buf, size_t bytes, int dst) {
    const Backend *be = c->be;
    if (c->link) {
        be->link->group_begin();
        issue_posted(be);
        be->link->send(c->link, buf, bytes, dst);
        be->link->group_end();
        return;
    }
    comm_mpi_send(c, stage_in(c, 0, buf, bytes), bytes, dst);
}

void comm_dev_isend(const Comm *c, const void *buf, size_t bytes, int dst, CommRequest *req) {
    if (c->link) {
        if (n_posted == MAX_POSTED) flush_posted();   /* never in today's schedules (one per pipeline slot) */
        posted[n_posted].be = c->be, posted[n_posted].link = c->link, posted[n_posted].buf = buf;
        posted[n_posted].bytes = bytes, posted[n_posted++].peer = dst;
        req->handle = &posted_marker;
        return;
    }
    void *h = xmalloc(bytes ? bytes : 1);   /* the request's own copy: freed by comm_wait */
    if (bytes) c->be->to_host(h, buf, bytes);
    comm_mpi_isend(c, h, bytes, dst, 0, req);
    req->host = h;
}

void comm_dev_recv(const Comm *c, void *buf, size_t bytes, int src) {
    const Backend *be = c->be;
    if (c->link) {
        be->link->group_begin();
        issue_posted(be);
        be->link->recv(c->link, buf, bytes, src);
        be->link->group_end();
        return;
    }
    void *h = staged(0, bytes);
    comm_mpi_recv(c, h, bytes, src, 0);
    stage_out(c, buf, h, bytes);
}

int comm_dev_wait(CommRequest *req) {
    if (req->handle != &posted_marker) return 0;
    flush_posted();   /* issued now; the stream orders it before anything that later writes its buffer */
    req->handle = NULL;
    return 1;
}
