/* test_link.c — runtime/comm_device.c without a GPU: how comm.h's calls move a device backend's
 * buffers, over its link (NCCL on CUDA) or staged through host memory. Under mpirun:
 *   test_link link     every rank has a device of its own: each group opens the link
 *   test_link shared   the ranks share one device: no link opens, every call is staged
 * A fake backend plays the device: its memory is host memory it tracks (owns), and its DeviceLink
 * does what NCCL does with MPI point-to-point on MPI_COMM_WORLD (sends and receives queued between
 * group_begin and group_end are posted together at group_end; the group's members find each other
 * from the bootstrap id, as NCCL's ranks do). Checks:
 *   - the bootstrap order: make_id on the group's rank 0 only, once per group; every member opens
 *     with that id, its group rank and the group size; in shared mode nothing is made or opened;
 *   - every call on device buffers gives the bits of the same call on host copies (comm.c's MPI
 *     code): the fixed sums (small, and a reduce-scatter past one chunk, in place), max, maxloc,
 *     all-gather (in place and not), the row split's gather and reduce-scatter with unequal rows,
 *     broadcast, send / recv, and two ranks sending to each other at once (comm_isend, then
 *     comm_recv: the posted send goes out in the receive's group, or it would deadlock with NCCL);
 *   - the link carried the data in link mode (its calls counted) and nothing in shared mode;
 *   - a device call counts the bytes its host twin counts (comm_bytes_sent; the fixed sum past one
 *     gather excepted: there the link's algorithm is not MPI's);
 *   - each Comm carries its device backend: comm_world()'s is comm_use_backend's, a group cut from
 *     a Comm keeps its parent's (the world's when the parent is older than comm_use_backend).
 * Prints "ok: MODE, N link calls" on rank 0; exits 1 with a line per failed check. */
#include "kernels/kernels.h"
#include "runtime/comm.h"
#include "runtime/util.h"
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int world_rank, world_size, shared_mode, failures;
static long link_calls, ids_made, links_opened;

/* ---- the fake device: tracked host memory ------------------------------------------------------ */
enum { MAX_BUFS = 256 };
static struct { char *p; size_t n; } bufs[MAX_BUFS];
static int n_bufs;
static int fake_owns(const void *p) {
    for (int i = 0; i < n_bufs; i++)
        if ((const char *)p >= bufs[i].p && (const char *)p < bufs[i].p + bufs[i].n) return 1;
    return 0;
}
static void *fake_alloc(size_t bytes) {
    CHECK(n_bufs < MAX_BUFS);
    bufs[n_bufs].p = xcalloc(1, bytes ? bytes : 1), bufs[n_bufs].n = bytes ? bytes : 1;
    return bufs[n_bufs++].p;
}
static void fake_free(void *p) { (void)p; }   /* kept to the end: the process is short */
static void fake_copy_bytes(void *dst, const void *src, size_t bytes) { memmove(dst, src, bytes); }
static void fake_copy(float *dst, const float *src, size_t n) { memmove(dst, src, n * sizeof(float)); }
static void fake_tree_sum(float *v, int P, size_t n) { tree_sum(v, P, n); }

/* ---- the fake link: NCCL's calls over MPI_COMM_WORLD ------------------------------------------- */
typedef struct { int creator, serial; } FakeId;   /* who made it, and its number there */
typedef struct {
    int rank, size, *world;   /* world[r]: the world rank of group rank r */
    int tag;                  /* this link's messages (per creator and serial) */
} FakeLink;
enum { MAX_OPS = 64 };
static MPI_Request ops[MAX_OPS];
static int n_ops, in_group;
static void flush(void) {
    MPI_Waitall(n_ops, ops, MPI_STATUSES_IGNORE);
    n_ops = 0;
}
static void post_send(FakeLink *l, const void *buf, size_t bytes, int peer) {
    CHECK(n_ops < MAX_OPS);
    MPI_Isend(buf, (int)bytes, MPI_BYTE, l->world[peer], l->tag, MPI_COMM_WORLD, &ops[n_ops++]);
    if (!in_group) flush();
}
static void post_recv(FakeLink *l, void *buf, size_t bytes, int peer) {
    CHECK(n_ops < MAX_OPS);
    MPI_Irecv(buf, (int)bytes, MPI_BYTE, l->world[peer], l->tag, MPI_COMM_WORLD, &ops[n_ops++]);
    if (!in_group) flush();
}

static void fake_key(char *key, size_t cap) { snprintf(key, cap, "host/%d", shared_mode ? 0 : world_rank); }
static const char *fake_make_id(void *id) {
    static int serial;
    *(FakeId *)id = (FakeId){world_rank, ++serial};
    ids_made++;
    return NULL;
}
/* the members tell the creator their world rank; it answers with the table */
static const char *fake_open(void **h, const void *id, int rank, int size) {
    FakeId fid = *(const FakeId *)id;
    FakeLink *l = xcalloc(1, sizeof(FakeLink));
    l->rank = rank, l->size = size, l->world = xmalloc(sizeof(int) * size);
    l->tag = 1000 + fid.creator * 64 + fid.serial;
    int me[2] = {rank, world_rank};
    if (rank == 0) {
        if (fid.creator != world_rank) printf("FAIL bootstrap: group rank 0 (world %d) opens an id made by world %d\n",
                                              world_rank, fid.creator), failures++;
        l->world[0] = world_rank;
        for (int i = 1; i < size; i++) {
            MPI_Recv(me, 2, MPI_INT, MPI_ANY_SOURCE, l->tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            l->world[me[0]] = me[1];
        }
        for (int r = 1; r < size; r++) MPI_Send(l->world, size, MPI_INT, l->world[r], l->tag, MPI_COMM_WORLD);
    } else {
        MPI_Send(me, 2, MPI_INT, fid.creator, l->tag, MPI_COMM_WORLD);
        MPI_Recv(l->world, size, MPI_INT, fid.creator, l->tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    links_opened++;
    *h = l;
    return NULL;
}
static void fake_close(void *h) {
    FakeLink *l = h;
    free(l->world), free(l);
}
static void fake_group_begin(void) { in_group = 1; }
static void fake_group_end(void) { in_group = 0, flush(); }
static void fake_send(void *h, const void *buf, size_t bytes, int peer) { link_calls++, post_send(h, buf, bytes, peer); }
static void fake_recv(void *h, void *buf, size_t bytes, int peer) { link_calls++, post_recv(h, buf, bytes, peer); }
static void fake_all_gather(void *h, const float *in, float *out, size_t n_each) {
    FakeLink *l = h;
    link_calls++;
    size_t b = n_each * sizeof(float);
    float *mine = out + (size_t)l->rank * n_each;
    if (in != mine) memmove(mine, in, b);
    int was = in_group;
    in_group = 1;
    for (int r = 0; r < l->size; r++)
        if (r != l->rank) post_send(l, mine, b, r), post_recv(l, out + (size_t)r * n_each, b, r);
    in_group = was;
    if (!was) flush();
}
static void fake_broadcast(void *h, void *buf, size_t bytes, int root) {
    FakeLink *l = h;
    link_calls++;
    if (l->rank == root) {
        for (int r = 0; r < l->size; r++)
            if (r != root) post_send(l, buf, bytes, r);
    } else {
        post_recv(l, buf, bytes, root);
    }
    if (!in_group) flush();
}
static void fake_max(void *h, float *buf, size_t n) {
    FakeLink *l = h;
    float *all = xmalloc(sizeof(float) * n * l->size);
    fake_all_gather(h, buf, all, n);
    for (size_t i = 0; i < n; i++)
        for (int r = 0; r < l->size; r++) buf[i] = all[(size_t)r * n + i] > buf[i] ? all[(size_t)r * n + i] : buf[i];
    free(all);
}

static const DeviceLink fake_link = {"fake NCCL", sizeof(FakeId), fake_key, fake_make_id, fake_open, fake_close,
                                     fake_group_begin, fake_group_end, fake_send, fake_recv, fake_all_gather,
                                     fake_broadcast, fake_max};
static Backend fake = {.name = "fake", .alloc = fake_alloc, .free = fake_free, .to_host = fake_copy_bytes,
                       .to_device = fake_copy_bytes, .copy_bytes = fake_copy_bytes, .copy = fake_copy,
                       .owns = fake_owns, .tree_sum = fake_tree_sum, .link = &fake_link};

/* ---- checks --------------------------------------------------------------------------------------- */
static float *dev_copy(const float *h, size_t n) {
    float *d = fake_alloc(n * sizeof(float));
    memcpy(d, h, n * sizeof(float));
    return d;
}
static float *values(size_t n, int salt) {   /* distinct per rank, not exactly summable in any order */
    float *v = xmalloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++)
        v[i] = (float)((i * 2654435761u + (unsigned)(salt * 97 + world_rank * 31)) % 10007) / 7.0f +
               1e-3f * (float)world_rank;
    return v;
}
static void same(const char *what, const void *dev, const void *host, size_t bytes) {
    if (memcmp(dev, host, bytes))
        printf("FAIL %s: rank %d, the device buffer's bytes differ from the host call's\n", what, world_rank), failures++;
}

/* the host call, then its device twin: the bytes the device call counts (comm_bytes_sent) are the host's */
#define TWIN(s, host_call, dev_call)                                                                          \
    do {                                                                                                      \
        double b0_ = comm_bytes_sent(c);                                                                      \
        host_call;                                                                                            \
        double b1_ = comm_bytes_sent(c);                                                                      \
        dev_call;                                                                                             \
        double b2_ = comm_bytes_sent(c);                                                                      \
        if (b2_ - b1_ != b1_ - b0_)                                                                           \
            printf("FAIL %s: rank %d counted %.0f bytes sent on device buffers, %.0f on host ones\n", W(s),   \
                   world_rank, b2_ - b1_, b1_ - b0_), failures++;                                             \
    } while (0)

static void check_group(const Comm *c, const char *name) {
    char what[128];
#define W(s) (snprintf(what, sizeof what, "%s %s", name, s), what)
    int P = c->size, r = c->rank;
    size_t sizes[] = {5, 70001};
    for (int k = 0; k < 2; k++) {   /* the fixed sum: one gather (small) and the slices' path (large) on the host */
        size_t n = sizes[k];
        float *h = values(n, k), *d = dev_copy(h, n);
        if (k == 0) TWIN("all_reduce_sum_fixed", comm_all_reduce_sum_fixed(c, h, n), comm_all_reduce_sum_fixed(c, d, n));
        else comm_all_reduce_sum_fixed(c, h, n), comm_all_reduce_sum_fixed(c, d, n);   /* the link: one all-gather */
        same(W("all_reduce_sum_fixed"), d, h, n * 4);
        h = values(n, k + 5), d = dev_copy(h, n);
        comm_all_reduce_max(c, h, n), comm_all_reduce_max(c, d, n);
        same(W("all_reduce_max"), d, h, n * 4);
    }
    /* the reduce-scatter past one link chunk (2^20 floats), in place */
    size_t each = (1u << 20) + 7, n = each * P;
    float *h = values(n, 9), *d = dev_copy(h, n);
    TWIN("reduce_scatter_sum_fixed", comm_reduce_scatter_sum_fixed(c, h, h + (size_t)r * each, each),
         comm_reduce_scatter_sum_fixed(c, d, d + (size_t)r * each, each));
    same(W("reduce_scatter_sum_fixed in place"), d + (size_t)r * each, h + (size_t)r * each, each * 4);
    /* all-gather, in place and from another buffer */
    size_t e = 33;
    float *hin = values(e, 3), *din = dev_copy(hin, e), *hout = xcalloc(e * P, 4), *dout = fake_alloc(e * P * 4);
    TWIN("all_gather", comm_all_gather(c, hin, hout, e), comm_all_gather(c, din, dout, e));
    same(W("all_gather"), dout, hout, e * P * 4);
    memcpy(hout + r * e, hin, e * 4), memcpy(dout + r * e, hin, e * 4);
    TWIN("all_gather in place", comm_all_gather(c, hout + r * e, hout, e), comm_all_gather(c, dout + r * e, dout, e));
    same(W("all_gather in place"), dout, hout, e * P * 4);
    /* the row split: 7 rows over P ranks (unequal), rows of 5 */
    size_t rows = 7, unit = 5, lo, hi;
    comm_rows(rows, P, r, &lo, &hi);
    float *hr = values(rows * unit, 4), *dr = dev_copy(hr, rows * unit);
    TWIN("all_gather_rows", comm_all_gather_rows(c, hr + lo * unit, hr, rows, unit),
         comm_all_gather_rows(c, dr + lo * unit, dr, rows, unit));
    same(W("all_gather_rows"), dr, hr, rows * unit * 4);
    hr = values(rows * unit, 6), dr = dev_copy(hr, rows * unit);
    TWIN("reduce_scatter_rows_fixed", comm_reduce_scatter_rows_fixed(c, hr, rows, unit),
         comm_reduce_scatter_rows_fixed(c, dr, rows, unit));
    same(W("reduce_scatter_rows_fixed"), dr, hr, (hi - lo) * unit * 4);
    /* broadcast from the last rank; maxloc */
    float *hb = values(11, 7), *db = dev_copy(hb, 11);
    TWIN("broadcast", comm_broadcast(c, hb, 44, P - 1), comm_broadcast(c, db, 44, P - 1));
    same(W("broadcast"), db, hb, 44);
    float *hv = values(9, 8), *dv = dev_copy(hv, 9);
    int hi_[9], *di = fake_alloc(sizeof hi_);
    for (int i = 0; i < 9; i++) hi_[i] = di[i] = 100 * r + i;
    comm_all_reduce_maxloc(c, hv, hi_, 9), comm_all_reduce_maxloc(c, dv, di, 9);
    same(W("maxloc values"), dv, hv, 36), same(W("maxloc indices"), di, hi_, 36);
    /* ring neighbours send to each other at once: isend, then recv, then wait */
    if (P > 1) {
        int to = (r + 1) % P, from = (r + P - 1) % P;
        float *hs = values(17, 10), *ds = dev_copy(hs, 17), *got = fake_alloc(17 * 4), *want = xmalloc(17 * 4);
        CommRequest hq = {0}, dq = {0};
        TWIN("isend", (comm_isend(c, hs, 68, to, &hq), comm_recv(c, want, 68, from), comm_wait(&hq)),
             (comm_isend(c, ds, 68, to, &dq), comm_recv(c, got, 68, from), comm_wait(&dq)));
        same(W("isend / recv both ways at once"), got, want, 68);
        if (r == 0) TWIN("send", comm_send(c, hs, 68, P - 1), comm_send(c, ds, 68, P - 1));   /* MPI, then the link */
        if (r == P - 1) comm_recv(c, want, 68, 0), comm_recv(c, got, 68, 0), same(W("send / recv"), got, want, 68);
    }
#undef W
}

int main(int argc, char **argv) {
    if (argc != 2 || (strcmp(argv[1], "link") && strcmp(argv[1], "shared"))) {
        fprintf(stderr, "usage: test_link link|shared (under mpirun)\n");
        return 2;
    }
    shared_mode = !strcmp(argv[1], "shared");
    comm_init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    Comm early = comm_world();   /* made before comm_use_backend: it carries no device backend */
    comm_use_backend(&fake);
    Comm world = comm_world();   /* a group over every rank */
    check_group(&world, "world");
    Comm half = comm_split(&world, world.rank % 2, world.rank);   /* and one of two groups */
    check_group(&half, world.rank % 2 ? "odd" : "even");
    long counts[3] = {link_calls, ids_made, links_opened}, sums[3];
    MPI_Allreduce(counts, sums, 3, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    /* the groups of 2 or more ranks: the world, the even ranks (ceil(n / 2)), the odd ones (floor(n / 2)) */
    int sizes[3] = {world_size, (world_size + 1) / 2, world_size / 2};
    long want_ids = 0, want_opened = 0;
    for (int g = 0; g < 3; g++)
        if (sizes[g] > 1 && !shared_mode) want_ids++, want_opened += sizes[g];
    if (world_rank == 0) {
        if (sums[1] != want_ids) printf("FAIL bootstrap: %ld ids made, want %ld\n", sums[1], want_ids), failures++;
        if (sums[2] != want_opened) printf("FAIL bootstrap: %ld link opens, want %ld\n", sums[2], want_opened), failures++;
        if (shared_mode ? sums[0] != 0 : sums[0] == 0)
            printf("FAIL %s mode: %ld link calls\n", argv[1], sums[0]), failures++;
    }
    /* each Comm carries its backend (Comm.be): a group cut from one made before comm_use_backend gets
     * the world's; one cut after the world's changed keeps its parent's, and moves device buffers as
     * such (over its own link in link mode) */
    Comm cut = comm_split(&early, 0, world.rank);
    comm_use_backend(NULL);
    Comm later = comm_world(), kept = comm_dup(&world);
    if (early.be || cut.be != &fake || later.be || kept.be != &fake)
        printf("FAIL backend: rank %d: early %p, cut from it %p, world after NULL %p, dup of the world %p (fake %p)\n",
               world_rank, (void *)early.be, (void *)cut.be, (void *)later.be, (void *)kept.be, (void *)&fake), failures++;
    long calls = link_calls;
    check_group(&kept, "dup");
    if (!shared_mode && world_size > 1 && link_calls == calls)
        printf("FAIL backend: rank %d: the dup's device buffers did not go over its link\n", world_rank), failures++;
    comm_free(&kept), comm_free(&later), comm_free(&cut), comm_free(&early);
    int bad = failures, any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (world_rank == 0 && !any) printf("ok: %s, %ld link calls, %ld ids, %ld opens\n", argv[1], sums[0], sums[1], sums[2]);
    comm_free(&half), comm_free(&world);
    comm_finalize();
    return any ? 1 : 0;
}
