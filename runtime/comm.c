/* comm.c — MPI backend of comm.h, and a process alone without it. Every MPI call is checked; an
 * MPI failure aborts the job. */
#include "runtime/comm.h"
#include "kernels/kernels.h"
#include "runtime/util.h"
#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#define MPI_CHECK(call) CHECK((call) == MPI_SUCCESS)
#define HANDLE(c) (*(MPI_Comm *)(c)->handle)

/* A process that no launcher started runs alone, without MPI (mpi_on 0): Open MPI's singleton start
 * spawns its own runtime and writes a shared-memory segment and a PMIx store first, so it fails
 * (PMIx banners) or hangs under a small `ulimit -f`, before any Tandem code runs. Alone, every
 * Comm is the one-rank world {0, 1, NULL}: a collective is the identity, or a copy where the input
 * and output buffers differ, and no message is ever sent. */
static int initialized, mpi_on;

/* Started by a launcher: Open MPI's mpirun sets OMPI_COMM_WORLD_SIZE/RANK and PMIX_RANK (also
 * Slurm's srun with PMIx), MPICH's hydra and Slurm's PMI-2 set PMI_RANK. */
static int launched(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

static Comm alone(void) { return (Comm){.rank = 0, .size = 1, .handle = NULL}; }

/* 1 when c is the one-rank world of a process without MPI */
static int is_alone(const Comm *c) {
    if (mpi_on) return 0;
    CHECK(c->size == 1);
    return 1;
}

void comm_init(int *argc, char ***argv) {
    int init = 0;
    MPI_Initialized(&init);
    initialized = 1;
    mpi_on = init || launched();
    if (!mpi_on) {
        util_set_reporter(1, NULL);
        return;
    }
    if (!init) MPI_CHECK(MPI_Init(argc, argv));
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    util_set_reporter(r == 0, NULL);   /* until a role group says otherwise */
}

/* The job ends together: a rank whose group is done waits here for every other group, so an error
 * raised later in another group (MPI_Abort) still finds it alive. Open MPI's mpirun hangs when one
 * rank aborts after others have left through MPI_Finalize (seen with role groups). */
void comm_finalize(void) {
    if (!mpi_on) return;   /* alone, or convert and fetch, which never start comm */
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin) return;
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
}

int comm_initialized(void) { return initialized; }

static Comm dup_of(MPI_Comm parent) {
    Comm c;
    MPI_Comm *h = xmalloc(sizeof(MPI_Comm));
    MPI_CHECK(MPI_Comm_dup(parent, h));
    c.handle = h;
    MPI_Comm_rank(*h, &c.rank);
    MPI_Comm_size(*h, &c.size);
    return c;
}
Comm comm_world(void) { return mpi_on ? dup_of(MPI_COMM_WORLD) : alone(); }
Comm comm_dup(const Comm *c) { return is_alone(c) ? alone() : dup_of(HANDLE(c)); }

Comm comm_split(const Comm *parent, int color, int key) {
    if (is_alone(parent)) return alone();
    Comm c;
    MPI_Comm *h = xmalloc(sizeof(MPI_Comm));
    MPI_CHECK(MPI_Comm_split(HANDLE(parent), color, key, h));
    c.handle = h;
    MPI_Comm_rank(*h, &c.rank);
    MPI_Comm_size(*h, &c.size);
    return c;
}

Comm comm_split_node(const Comm *parent) {
    if (is_alone(parent)) return alone();
    Comm c;
    MPI_Comm *h = xmalloc(sizeof(MPI_Comm));
    MPI_CHECK(MPI_Comm_split_type(HANDLE(parent), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, h));
    c.handle = h;
    MPI_Comm_rank(*h, &c.rank);
    MPI_Comm_size(*h, &c.size);
    return c;
}

void comm_free(Comm *c) {
    if (!c->handle) return;
    MPI_Comm_free((MPI_Comm *)c->handle);
    free(c->handle);
    c->handle = NULL;
}

static int count(size_t n) {
    CHECK(n <= INT_MAX);
    return (int)n;
}

void comm_all_reduce_sum(const Comm *c, float *buf, size_t n) {
    if (c->size > 1) MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, count(n), MPI_FLOAT, MPI_SUM, HANDLE(c)));
}
/* Scratch for comm_all_reduce_sum_fixed, grown on demand and kept for the process: the steps that
 * call it reuse one buffer instead of allocating per call (one per thread that calls it). */
static _Thread_local float *fixed_buf;
static _Thread_local size_t fixed_cap;
static float *fixed_scratch(size_t n) {
    if (n > fixed_cap) {
        free(fixed_buf);
        fixed_buf = xmalloc(sizeof(float) * n);
        fixed_cap = n;
    }
    return fixed_buf;
}

/* Below this many floats per rank one all-gather (latency) beats all-to-all + all-gather (traffic). */
#define FIXED_GATHER_MAX 65536

void comm_all_reduce_sum_fixed(const Comm *c, float *buf, size_t n) {
    int P = c->size, r = c->rank;
    if (P == 1 || n == 0) return;
    if (n <= FIXED_GATHER_MAX) {                        /* every rank gets every partial, adds them by the tree */
        float *all = fixed_scratch((size_t)P * n);      /* (P, n) */
        MPI_CHECK(MPI_Allgather(buf, count(n), MPI_FLOAT, all, count(n), MPI_FLOAT, HANDLE(c)));
        tree_sum(all, P, n);
        memcpy(buf, all, sizeof(float) * n);
        return;
    }
    /* slice s = [lo(s), lo(s+1)) belongs to rank s: all-to-all gives rank r every rank's slice r */
    int *cnt = xmalloc(sizeof(int) * 4 * P), *dsp = cnt + P, *rcnt = cnt + 2 * P, *rdsp = cnt + 3 * P;
    for (int s = 0; s < P; s++) {
        size_t lo = n * s / P, hi = n * (s + 1) / P;
        cnt[s] = count(hi - lo);
        dsp[s] = count(lo);
    }
    size_t mine = (size_t)cnt[r];
    for (int s = 0; s < P; s++) { rcnt[s] = (int)mine; rdsp[s] = count(mine * s); }
    float *parts = fixed_scratch((size_t)P * mine);    /* (P, mine): rank s's partial of my slice */
    MPI_CHECK(MPI_Alltoallv(buf, cnt, dsp, MPI_FLOAT, parts, rcnt, rdsp, MPI_FLOAT, HANDLE(c)));
    tree_sum(parts, P, mine);
    memcpy(buf + dsp[r], parts, sizeof(float) * mine);
    MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, cnt, dsp, MPI_FLOAT, HANDLE(c)));
    free(cnt);
}
void comm_all_reduce_sum_f64(const Comm *c, double *buf, size_t n) {
    if (c->size > 1) MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, count(n), MPI_DOUBLE, MPI_SUM, HANDLE(c)));
}
void comm_all_reduce_max(const Comm *c, float *buf, size_t n) {
    if (c->size > 1) MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, count(n), MPI_FLOAT, MPI_MAX, HANDLE(c)));
}
void comm_all_reduce_sum_int(const Comm *c, int *buf, size_t n) {
    if (c->size > 1) MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, count(n), MPI_INT, MPI_SUM, HANDLE(c)));
}
void comm_all_reduce_maxloc(const Comm *c, float *val, int *idx, size_t n) {
    if (c->size == 1) return;
    struct { float v; int i; } *pair = xmalloc(sizeof(*pair) * n);
    for (size_t k = 0; k < n; k++) { pair[k].v = val[k]; pair[k].i = idx[k]; }
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, pair, count(n), MPI_FLOAT_INT, MPI_MAXLOC, HANDLE(c)));
    for (size_t k = 0; k < n; k++) { val[k] = pair[k].v; idx[k] = pair[k].i; }
    free(pair);
}
void comm_all_gather(const Comm *c, const float *in, float *out, size_t n_each) {
    if (is_alone(c)) {
        if (in != out) memcpy(out, in, sizeof(float) * n_each);
        return;
    }
    if (in == out + (size_t)c->rank * n_each) {   /* already in its place */
        MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, count(n_each), MPI_FLOAT, HANDLE(c)));
        return;
    }
    MPI_CHECK(MPI_Allgather(in, count(n_each), MPI_FLOAT, out, count(n_each), MPI_FLOAT, HANDLE(c)));
}
void comm_reduce_scatter_sum(const Comm *c, const float *in, float *out, size_t n_each) {
    if (is_alone(c)) {
        if (in != out) memcpy(out, in, sizeof(float) * n_each);
        return;
    }
    MPI_CHECK(MPI_Reduce_scatter_block(in, out, count(n_each), MPI_FLOAT, MPI_SUM, HANDLE(c)));
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

void comm_broadcast(const Comm *c, void *buf, size_t bytes, int root) {
    if (c->size > 1) MPI_CHECK(MPI_Bcast(buf, count(bytes), MPI_BYTE, root, HANDLE(c)));
}
void comm_send(const Comm *c, const void *buf, size_t bytes, int dst) {
    CHECK(mpi_on);   /* alone, nothing is ever sent or received */
    MPI_CHECK(MPI_Send(buf, count(bytes), MPI_BYTE, dst, 0, HANDLE(c)));
}
void comm_isend(const Comm *c, const void *buf, size_t bytes, int dst, CommRequest *req) {
    comm_isend_tag(c, buf, bytes, dst, 0, req);
}
void comm_isend_tag(const Comm *c, const void *buf, size_t bytes, int dst, int tag, CommRequest *req) {
    CHECK(mpi_on);
    comm_wait(req);
    MPI_Request *r = xmalloc(sizeof(MPI_Request));
    MPI_CHECK(MPI_Isend(buf, count(bytes), MPI_BYTE, dst, tag, HANDLE(c), r));
    req->handle = r;
}
int comm_probe(const Comm *c, int tag, int blocking, int *src, size_t *bytes) {
    CHECK(mpi_on);
    MPI_Status st;
    int flag = 1, n = 0;
    if (blocking) MPI_CHECK(MPI_Probe(MPI_ANY_SOURCE, tag, HANDLE(c), &st));
    else MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, tag, HANDLE(c), &flag, &st));
    if (!flag) return 0;
    MPI_Get_count(&st, MPI_BYTE, &n);
    *src = st.MPI_SOURCE;
    *bytes = (size_t)n;
    return 1;
}
void comm_recv_tag(const Comm *c, void *buf, size_t bytes, int src, int tag) {
    CHECK(mpi_on);
    MPI_CHECK(MPI_Recv(buf, count(bytes), MPI_BYTE, src, tag, HANDLE(c), MPI_STATUS_IGNORE));
}
void comm_wait(CommRequest *req) {
    if (!req->handle) return;
    MPI_CHECK(MPI_Wait((MPI_Request *)req->handle, MPI_STATUS_IGNORE));
    free(req->handle);
    req->handle = NULL;
}
void comm_recv(const Comm *c, void *buf, size_t bytes, int src) { comm_recv_tag(c, buf, bytes, src, 0); }
void comm_barrier(const Comm *c) {
    if (!is_alone(c)) MPI_CHECK(MPI_Barrier(HANDLE(c)));
}
