/* comm.c — comm.h's API: a Comm's life (world, dup, split, free; alone when no launcher started the
 * process), each call's dispatch and the byte counts. A call over one rank is done here (nothing, or
 * a copy); a buffer in the memory of the group's device backend (Comm.be) goes to comm_device.c,
 * any other to comm_mpi.c (MPI, under the deadline). Calls into comm_mpi.c and comm_device.c, never
 * the reverse; neither of them calls back into this file. Does not own MPI or the deadline
 * (comm_mpi.c), nor how device memory moves (comm_device.c). */
#include "runtime/comm.h"
#include "runtime/comm_device.h"
#include "runtime/comm_mpi.h"
#include "kernels/kernels.h"
#include "runtime/util.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static int initialized;

void comm_init(int *argc, char ***argv) {
    initialized = 1;
    comm_mpi_start(argc, argv);
}
void comm_finalize(void) { comm_mpi_finalize(); }
int comm_initialized(void) { return initialized; }

/* ---- the device backend ---------------------------------------------------------------------------
 * Each Comm carries the backend whose memory its calls may be given (Comm.be): comm_world()'s is the
 * one comm_use_backend named last, and a group cut from a Comm carries its parent's (or the world's,
 * when the parent carries none: it was made before comm_use_backend, as PPO's world is, made before
 * its device opens). Only a backend with memory of its own (Backend.owns) is carried: the CPU's is
 * host memory. */
static const Backend *world_backend;

void comm_use_backend(const Backend *be) { world_backend = be && be->owns ? be : NULL; }
static const Backend *inherited(const Comm *parent) { return parent->be ? parent->be : world_backend; }

/* 1: p is memory of c's device backend */
static int on_device(const Comm *c, const void *p) { return c->be && p && c->be->owns(p); }

/* a one-rank collective's copy between distinct buffers (not overlapping), wherever they are */
static void local_copy(const Comm *c, void *dst, const void *src, size_t bytes) {
    if (on_device(c, dst) || on_device(c, src)) c->be->copy_bytes(dst, src, bytes);
    else memmove(dst, src, bytes);
}

/* ---- traffic: the bytes this rank sends, per communicator --------------------------------------
 * Counted from each call's size by the bandwidth-optimal algorithms' volumes (the ZeRO paper's
 * accounting): an all-reduce of n values sends 2 n (P-1) / P, an all-gather or a reduce-scatter of n
 * values in all n (P-1) / P, an all-to-all the other ranks' parts, a send or a broadcast's root its
 * bytes. (MPI picks its algorithm by message size; a latency-optimal one sends more.) The same on
 * every path (MPI, staged, the device's link), but for the fixed sum, whose algorithm says. */
enum { TRAFFIC_SLOTS = 64 };
static struct { const void *handle; double bytes; } traffic[TRAFFIC_SLOTS];
static pthread_mutex_t traffic_lock = PTHREAD_MUTEX_INITIALIZER;
static void sent(const Comm *c, double bytes) {
    if (c->size < 2 || !c->handle) return;
    pthread_mutex_lock(&traffic_lock);
    for (int i = 0; i < TRAFFIC_SLOTS; i++)
        if (traffic[i].handle == c->handle || !traffic[i].handle) {
            traffic[i].handle = c->handle;
            traffic[i].bytes += bytes;
            break;
        }
    pthread_mutex_unlock(&traffic_lock);
}
double comm_bytes_sent(const Comm *c) {
    double b = 0.0;
    pthread_mutex_lock(&traffic_lock);
    for (int i = 0; i < TRAFFIC_SLOTS && traffic[i].handle; i++)
        if (traffic[i].handle == c->handle) b = traffic[i].bytes;
    pthread_mutex_unlock(&traffic_lock);
    return b;
}
/* ---- a Comm's life --------------------------------------------------------------------------------
 * A process that no launcher started runs alone, without MPI (comm_mpi.c says why): every Comm is
 * then the one-rank world {0, 1, NULL}, a collective is the identity, or a copy where the input and
 * output buffers differ, and no message is ever sent. */
static Comm alone(const Backend *be) { return (Comm){.rank = 0, .size = 1, .handle = NULL, .be = be}; }

/* 1 when c is the one-rank world of a process without MPI */
static int is_alone(const Comm *c) {
    if (comm_mpi_running()) return 0;
    CHECK(c->size == 1);
    return 1;
}

/* a group over MPI handle h, with backend be and its link (collective over the group) */
static Comm group(void *h, int rank, int size, const Backend *be) {
    Comm c = {.rank = rank, .size = size, .handle = h, .be = be};
    double bytes = comm_link_attach(&c);   /* its opening's broadcasts, when it has one */
    if (bytes > 0) sent(&c, bytes);
    return c;
}
Comm comm_world(void) {
    if (!comm_mpi_running()) return alone(world_backend);
    int rank, size;
    void *h = comm_mpi_dup(NULL, &rank, &size);
    return group(h, rank, size, world_backend);
}
Comm comm_dup(const Comm *c) {
    if (is_alone(c)) return alone(inherited(c));
    int rank, size;
    void *h = comm_mpi_dup(c->handle, &rank, &size);
    return group(h, rank, size, inherited(c));
}
Comm comm_split(const Comm *parent, int color, int key) {
    if (is_alone(parent)) return alone(inherited(parent));
    int rank, size;
    void *h = comm_mpi_split(parent->handle, color, key, &rank, &size);
    return group(h, rank, size, inherited(parent));
}
Comm comm_split_node(const Comm *parent) {   /* no link: it only tells which ranks share a node */
    if (is_alone(parent)) return alone(inherited(parent));
    Comm c = {.be = inherited(parent)};
    c.handle = comm_mpi_split_node(parent->handle, &c.rank, &c.size);
    return c;
}
void comm_free(Comm *c) {
    comm_link_detach(c);
    if (!c->handle) return;
    comm_mpi_free(c->handle);
    c->handle = NULL;
}

/* an all-reduce's volume: 2 n (P-1) / P values of `size` bytes */
static double ring_all_reduce(const Comm *c, size_t n, size_t size) { return 2.0 * n * size * (c->size - 1) / c->size; }
/* an all-gather's: the other ranks' n_each floats each */
static double gathered(const Comm *c, size_t n_each) { return (double)n_each * sizeof(float) * (c->size - 1); }

/* ---- the calls ------------------------------------------------------------------------------------ */
void comm_all_reduce_sum(const Comm *c, float *buf, size_t n) {
    if (c->size > 1 && on_device(c, buf)) { sent(c, comm_dev_all_reduce_sum_fixed(c, buf, n)); return; }
    if (c->size > 1) comm_mpi_all_reduce(c, buf, n, COMM_MPI_SUM_F32);
    sent(c, ring_all_reduce(c, n, sizeof(float)));
}
void comm_all_reduce_sum_fixed(const Comm *c, float *buf, size_t n) {
    if (c->size == 1 || n == 0) return;
    if (on_device(c, buf)) sent(c, comm_dev_all_reduce_sum_fixed(c, buf, n));
    else sent(c, comm_mpi_all_reduce_sum_fixed(c, buf, n));
}
void comm_all_reduce_sum_f64(const Comm *c, double *buf, size_t n) {
    if (c->size > 1 && on_device(c, buf)) comm_dev_all_reduce_sum_f64(c, buf, n);
    else if (c->size > 1) comm_mpi_all_reduce(c, buf, n, COMM_MPI_SUM_F64);
    sent(c, ring_all_reduce(c, n, sizeof(double)));
}
void comm_all_reduce_max(const Comm *c, float *buf, size_t n) {
    if (c->size > 1 && on_device(c, buf)) comm_dev_all_reduce_max(c, buf, n);
    else if (c->size > 1) comm_mpi_all_reduce(c, buf, n, COMM_MPI_MAX_F32);
}
void comm_all_reduce_sum_int(const Comm *c, int *buf, size_t n) {
    if (c->size > 1 && on_device(c, buf)) comm_dev_all_reduce_sum_int(c, buf, n);
    else if (c->size > 1) comm_mpi_all_reduce(c, buf, n, COMM_MPI_SUM_I32);
}
void comm_all_reduce_maxloc(const Comm *c, float *val, int *idx, size_t n) {
    if (c->size == 1) return;
    if (on_device(c, val)) comm_dev_all_reduce_maxloc(c, val, idx, n);
    else comm_mpi_all_reduce_maxloc(c, val, idx, n);
}

void comm_all_gather(const Comm *c, const float *in, float *out, size_t n_each) {
    if (c->size == 1) {
        if (in != out) local_copy(c, out, in, sizeof(float) * n_each);
        return;
    }
    if (on_device(c, out)) comm_dev_all_gather(c, in, out, n_each);
    else comm_mpi_all_gather(c, in, out, n_each);
    sent(c, gathered(c, n_each));
}
void comm_iall_gather(const Comm *c, const float *in, float *out, size_t n_each, CommRequest *req) {
    comm_wait(req);
    if (c->size == 1) {
        if (in != out) local_copy(c, out, in, sizeof(float) * n_each);
        return;
    }
    if (on_device(c, out)) comm_dev_all_gather(c, in, out, n_each);   /* at once: the link queues it */
    else comm_mpi_iall_gather(c, in, out, n_each, req);
    sent(c, gathered(c, n_each));
}
void comm_all_gather_rows(const Comm *c, const float *mine, float *all, size_t n, size_t unit) {
    size_t lo, hi;
    comm_rows(n, c->size, c->rank, &lo, &hi);
    if (c->size == 1 || is_alone(c)) {
        if (mine != all) local_copy(c, all, mine, sizeof(float) * n * unit);
        return;
    }
    if (on_device(c, all)) comm_dev_all_gather_rows(c, mine, all, n, unit);
    else comm_mpi_all_gather_rows(c, mine, all, n, unit);
    sent(c, (double)(n - (hi - lo)) * unit * sizeof(float));
}
void comm_all_to_allv(const Comm *c, const float *send, const int *send_n, const int *send_off, float *recv,
                      const int *recv_n, const int *recv_off, size_t w) {
    if (c->size == 1 || is_alone(c)) {
        CHECK(send_n[0] == recv_n[0]);
        if (send_n[0]) memmove(recv + (size_t)recv_off[0] * w, send + (size_t)send_off[0] * w, sizeof(float) * (size_t)send_n[0] * w);
        return;
    }
    comm_mpi_all_to_allv(c, send, send_n, send_off, recv, recv_n, recv_off, w);
    double out = 0.0;
    for (int q = 0; q < c->size; q++) out += q == c->rank ? 0.0 : (double)send_n[q] * w * sizeof(float);
    sent(c, out);
}
void comm_all_to_all_int(const Comm *c, const int *send, int *recv, int n_each) {
    if (c->size == 1 || is_alone(c)) {
        memmove(recv, send, sizeof(int) * (size_t)n_each);
        return;
    }
    comm_mpi_all_to_all_int(c, send, recv, n_each);
    sent(c, (double)sizeof(int) * n_each * (c->size - 1));
}
void comm_reduce_scatter_sum_fixed(const Comm *c, const float *in, float *out, size_t n_each) {
    if (c->size == 1) {   /* alone, or a group of one: a copy */
        if (in != out) local_copy(c, out, in, sizeof(float) * n_each);
        return;
    }
    if (on_device(c, in)) comm_dev_reduce_scatter_sum_fixed(c, in, out, n_each);
    else comm_mpi_reduce_scatter_sum_fixed(c, in, out, n_each);
    sent(c, gathered(c, n_each));
}
void comm_reduce_scatter_rows_fixed(const Comm *c, float *buf, size_t n, size_t unit) {
    if (c->size == 1 || n == 0) return;
    size_t lo, hi;
    comm_rows(n, c->size, c->rank, &lo, &hi);
    if (on_device(c, buf)) comm_dev_reduce_scatter_rows_fixed(c, buf, n, unit);
    else comm_mpi_reduce_scatter_rows_fixed(c, buf, n, unit);
    sent(c, (double)(n * unit - (hi - lo) * unit) * sizeof(float));
}
void comm_broadcast(const Comm *c, void *buf, size_t bytes, int root) {
    if (c->size > 1 && on_device(c, buf)) comm_dev_broadcast(c, buf, bytes, root);
    else if (c->size > 1) comm_mpi_broadcast(c, buf, bytes, root);
    if (c->rank == root) sent(c, (double)bytes);
}
void comm_barrier(const Comm *c) {
    if (!is_alone(c)) comm_mpi_barrier(c);
}
int comm_first_error(const Comm *c, char *msg, size_t cap) {
    float failed = msg[0] != 0;
    int who = c->rank;
    comm_all_reduce_maxloc(c, &failed, &who, 1);   /* ties: the lowest rank */
    if (failed == 0) return 0;
    comm_broadcast(c, msg, cap, who);
    msg[cap - 1] = 0;
    return 1;
}

/* ---- point to point (alone, nothing is ever sent or received: comm_mpi.c checks) ------------------ */
void comm_send(const Comm *c, const void *buf, size_t bytes, int dst) {
    CHECK(comm_mpi_running());
    if (on_device(c, buf)) comm_dev_send(c, buf, bytes, dst);
    else comm_mpi_send(c, buf, bytes, dst);
    sent(c, (double)bytes);
}
void comm_isend(const Comm *c, const void *buf, size_t bytes, int dst, CommRequest *req) {
    comm_wait(req);
    if (on_device(c, buf)) comm_dev_isend(c, buf, bytes, dst, req);
    else comm_mpi_isend(c, buf, bytes, dst, 0, req);
    sent(c, (double)bytes);
}
void comm_isend_tag(const Comm *c, const void *buf, size_t bytes, int dst, int tag, CommRequest *req) {
    comm_wait(req);
    comm_mpi_isend(c, buf, bytes, dst, tag, req);
    sent(c, (double)bytes);
}
void comm_wait(CommRequest *req) {
    if (!req->handle || comm_dev_wait(req)) return;
    comm_mpi_wait(req);
}
void comm_recv(const Comm *c, void *buf, size_t bytes, int src) {
    if (on_device(c, buf)) comm_dev_recv(c, buf, bytes, src);
    else comm_mpi_recv(c, buf, bytes, src, 0);
}
void comm_recv_tag(const Comm *c, void *buf, size_t bytes, int src, int tag) { comm_mpi_recv(c, buf, bytes, src, tag); }
int comm_probe(const Comm *c, int tag, int blocking, int *src, size_t *bytes) {
    return comm_mpi_probe(c, tag, blocking, src, bytes);
}
