/* comm_mpi.c — comm.h's calls on host memory over MPI, and the deadline's watchdog (private API:
 * comm_mpi.h). comm.c hands a call here once it is known to be on host memory and over more than one
 * rank; comm_device.c stages a device buffer through here. Every MPI call is checked (an MPI failure
 * aborts the job) and runs under the deadline (comm_set_timeout, defined here with the watchdog): a
 * watchdog thread stops the process when one call has waited too long, and the watcher the
 * stopping rank leaves ends its Open MPI daemon when that cannot deliver. Owns: whether MPI runs,
 * the deadline, the communicator handles and the fixed sums' scratch. Does not own the one-rank
 * cases, device buffers or the byte counts (comm.c). */
#include "runtime/comm_mpi.h"
#include "kernels/kernels.h"
#include "runtime/util.h"
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The deadline. MPI has none: a collective whose peer is gone (a host down, the link cut) waits
 * forever, and with TCP a cut link is silent (no reset arrives). So each MPI call is stamped: the
 * calling (main) thread stores the call's text and the time it began, and clears the time when the
 * call returns; a watchdog thread, started with MPI, looks at the stamp a few times per deadline and,
 * when one call has been waiting longer than the deadline, prints one line, gives the launcher time
 * to end the job (stalled, below) and else ends the process itself (_exit(1)). The watchdog
 * calls no MPI (the job runs MPI_THREAD_SINGLE), and a stamp is two relaxed atomic stores and a
 * vDSO clock read per call, so the step loops do not notice it. Compute never counts: only a rank
 * waiting inside a call, which is also why a peer that computes longer than the deadline while
 * this rank waits trips it (the trade-off in README). */
static _Atomic int64_t wait_since_ns;           /* CLOCK_MONOTONIC at the start of the current call; 0: none */
static const char *_Atomic wait_call;           /* its text, "MPI_Allreduce(MPI_IN_PLACE, ...)" */
static _Atomic int64_t deadline_ns = COMM_TIMEOUT_DEFAULT * 1000000000LL;   /* 0: no deadline */

static int64_t clock_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
static void wait_begin(const char *call) {
    atomic_store_explicit(&wait_call, call, memory_order_relaxed);
    atomic_store_explicit(&wait_since_ns, clock_ns(), memory_order_release);
}
static void wait_end(void) { atomic_store_explicit(&wait_since_ns, 0, memory_order_relaxed); }

#define MPI_CHECK(call)                                                                  \
    do {                                                                                 \
        wait_begin(#call);                                                               \
        int mpi_rc_ = (call);                                                            \
        wait_end();                                                                      \
        if (mpi_rc_ != MPI_SUCCESS) check_failed("(" #call ") == MPI_SUCCESS", __FILE__, __LINE__); \
    } while (0)
#define HANDLE(c) (*(MPI_Comm *)(c)->handle)

/* A process that no launcher started runs alone, without MPI (mpi_on 0): Open MPI's singleton start
 * spawns its own runtime and writes a shared-memory segment and a PMIx store first, so it fails
 * (PMIx banners) or hangs under a small `ulimit -f`, before any Tandem code runs (comm.c: alone). */
static int mpi_on;

/* Started by a launcher: Open MPI's mpirun sets OMPI_COMM_WORLD_SIZE/RANK and PMIX_RANK (also
 * Slurm's srun with PMIx), MPICH's hydra and Slurm's PMI-2 set PMI_RANK. */
static int launched(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

/* What the watchdog's line names: the world rank and this host (cached at start: the watchdog thread
 * calls no MPI), and the call without its arguments. */
static int world_rank_cached;
static char host_name[64];

/* This rank's place among its host's ranks (the launcher's local rank: Open MPI, Slurm, MPICH; 0
 * when none is set). When a link dies, every rank of a host waits in the same collective and meets
 * the deadline at once: the host's first rank speaks at once, the others only later and one at a
 * time (stalled), so that what reaches the user is one line. */
static int local_rank(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v) return atoi(v);
    }
    return 0;
}

static void sleep_s(double s) {
    nanosleep(&(struct timespec){.tv_sec = (time_t)s, .tv_nsec = (long)((s - (time_t)s) * 1e9)}, NULL);
}

/* Past the deadline the rank says so and then leaves the ending to the launcher for a while (half
 * the deadline, at least 10 s) before it exits 1 itself. Why not exit at once: Open MPI's mpirun,
 * told of a rank's exit, orders the remote daemon to stop and waits for it, and a remote daemon
 * told of its rank's exit reports to mpirun; over a dead link those messages are never
 * acknowledged, Linux's TCP keepalive does not probe a connection with unacknowledged data, and
 * both wait for TCP's retransmissions to give up (about 15 minutes; measured: mpirun and the remote
 * daemon outlived the ranks by minutes). While the ranks stay, the daemons' connections may stay
 * idle, their keepalive (README "Across hosts": its settings) find the link dead, and the daemons
 * end every process on both sides. A peer that hangs over a live link, or a launcher without that
 * lifeline (Slurm ends a step when a task exits 1), meets the exit. The host's other ranks keep
 * quiet until 3 s x their local rank past that exit, when the launcher has normally ended them; one
 * still alive then (its host's first rank was not waiting) says it and exits, which ends the rest;
 * one whose parent (its daemon) has gone meanwhile exits at once. A rank's exit ends a stuck daemon
 * too (leave_watcher, below). */
static double linger_s(double deadline_s) { return deadline_s / 2 > 10 ? deadline_s / 2 : 10; }
#define OTHERS_LATER_S 3

static pid_t parent_at_start;   /* the rank's parent when MPI started: Open MPI's daemon under mpirun */

/* sleeps s seconds, or less when the parent has gone (the rank was reparented): returns 0 then */
static int linger(double s) {
    for (double t = 0; t < s; t += 0.25) {
        if (getppid() != parent_at_start) return 0;
        sleep_s(s - t < 0.25 ? s - t : 0.25);
    }
    return getppid() == parent_at_start;
}

/* ---- a daemon that cannot deliver ----------------------------------------------------------------
 * Keepalive cannot save a daemon that holds a message its peer never acknowledges (the remote
 * rank's line forwarded to mpirun, the rank's end reported, mpirun's order to stop), and the rank's
 * own exit makes such a message. So a rank ending itself leaves a watcher: a child that closes
 * every descriptor (the daemon sees the rank's output end and its exit as usual), watches the
 * daemon's TCP connections (/proc/PID/net/tcp, tcp6) for up to WATCH_S and ends the daemon
 * (SIGKILL) when one holds data through STUCK_TRIES retransmissions or unanswered probes (about
 * 1.4 s at TCP's least timeout; a live link acknowledges in milliseconds), then its own work done;
 * it ends as soon as the daemon has. The daemon's other ranks, their parent gone, end at once
 * (linger). Only Open MPI's daemons are watched: orted, or mpirun itself for the ranks on its host. */
#define WATCH_S 10
#define STUCK_TRIES 3

static int proc_read(const char *path, char *buf, size_t cap) {   /* bytes read, NUL-ended; -1: none */
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t n = 0;
    ssize_t k;
    while (n + 1 < cap && (k = read(fd, buf + n, cap - 1 - n)) > 0) n += (size_t)k;
    close(fd);
    buf[n] = 0;
    return (int)n;
}

static int is_daemon(pid_t pid) {
    static const char *const names[] = {"orted", "mpirun", "mpiexec", "orterun", "prted", "prterun"};
    char path[64], comm[64];
    snprintf(path, sizeof path, "/proc/%d/comm", (int)pid);
    if (proc_read(path, comm, sizeof comm) <= 0) return 0;
    comm[strcspn(comm, "\n")] = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(comm, names[i])) return 1;
    return 0;
}

static int gone(pid_t pid) {   /* ended, or a zombie its parent has yet to reap */
    char path[64], st[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    if (proc_read(path, st, sizeof st) <= 0) return 1;
    const char *p = strrchr(st, ')');
    return !p || p[1] == 0 || p[2] == 'Z' || p[2] == 'X';
}

/* 1 when one of pid's TCP sockets has data or probes unanswered STUCK_TRIES times */
static int stuck(pid_t pid) {
    enum { MAX_SOCKETS = 256 };
    unsigned long ino[MAX_SOCKETS];
    int n_ino = 0;
    char path[64], link[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    if (!d) return 0;
    for (struct dirent *e; (e = readdir(d)) && n_ino < MAX_SOCKETS;) {
        char fd_path[320];
        snprintf(fd_path, sizeof fd_path, "%s/%s", path, e->d_name);
        ssize_t k = readlink(fd_path, link, sizeof link - 1);
        if (k <= 0) continue;
        link[k] = 0;
        if (sscanf(link, "socket:[%lu]", &ino[n_ino]) == 1) n_ino++;
    }
    closedir(d);
    static char table[1 << 18];   /* the watcher's alone: it is the only thread of its process */
    for (int v6 = 0; v6 < 2; v6++) {
        snprintf(path, sizeof path, "/proc/%d/net/%s", (int)pid, v6 ? "tcp6" : "tcp");
        if (proc_read(path, table, sizeof table) <= 0) continue;
        for (char *line = strchr(table, '\n'); line && line[1]; line = strchr(line + 1, '\n')) {
            unsigned long tx, inode;
            unsigned retrans, probes;
            /* sl local rem st tx_queue:rx_queue tr:when retrnsmt uid timeout(probes) inode */
            if (sscanf(line + 1, "%*d: %*[0-9A-Fa-f]:%*x %*[0-9A-Fa-f]:%*x %*x %lx:%*x %*x:%*x %x %*u %u %lu", &tx,
                       &retrans, &probes, &inode) != 4)
                continue;
            if (!((tx && retrans >= STUCK_TRIES) || probes >= STUCK_TRIES)) continue;
            for (int i = 0; i < n_ino; i++)
                if (ino[i] == inode) return 1;
        }
    }
    return 0;
}

static void leave_watcher(void) {
    pid_t daemon = getppid();
    if (daemon != parent_at_start || !is_daemon(daemon) || fork() != 0) return;   /* the rank, or no watcher */
    int null = open("/dev/null", O_RDWR);
    for (int fd = 0; fd < 3; fd++) dup2(null, fd);
    if (close_range(3, ~0u, 0) != 0)   /* the rank's sockets and pipes: the daemon's to see end */
        for (int fd = 3; fd < 65536; fd++) close(fd);
    for (int i = 0; i < WATCH_S * 5 && !gone(daemon); i++) {
        sleep_s(0.2);
        if (stuck(daemon)) {
            kill(daemon, SIGKILL);
            break;
        }
    }
    _exit(0);
}

_Noreturn static void stalled(const char *call, double deadline_s, int local) {
    if (local > 0 && !linger(linger_s(deadline_s) + OTHERS_LATER_S * local)) _exit(1);   /* the daemon ended */
    char msg[256];
    int n = (int)strcspn(call, "(");
    int len = snprintf(msg, sizeof msg,
                       "tandem: rank %d on host %s: no progress in %.*s for %.0f s (a peer or the network is gone; "
                       "--comm-timeout sets the deadline); stopping\n",
                       world_rank_cached, host_name, n, call, deadline_s);
    if (len > (int)sizeof msg - 1) len = (int)sizeof msg - 1;
    if (write(2, msg, (size_t)len) < 0) { /* nothing left to tell */ }
    if (local == 0 && !linger(linger_s(deadline_s))) _exit(1);
    leave_watcher();
    _exit(1);
}

static void *watchdog(void *arg) {
    (void)arg;
    int local = local_rank();
    for (;;) {
        int64_t limit = atomic_load_explicit(&deadline_ns, memory_order_relaxed);
        /* a look every eighth of the deadline (at most 1 s apart): the line comes at most 1/8 late */
        int64_t nap = limit > 0 && limit / 8 < 1000000000LL ? limit / 8 : 1000000000LL;
        if (nap < 10000000LL) nap = 10000000LL;
        nanosleep(&(struct timespec){.tv_sec = nap / 1000000000LL, .tv_nsec = nap % 1000000000LL}, NULL);
        int64_t since = atomic_load_explicit(&wait_since_ns, memory_order_acquire);
        const char *call = atomic_load_explicit(&wait_call, memory_order_relaxed);
        if (since == 0 || limit == 0 || clock_ns() - since <= limit) continue;
        if (atomic_load_explicit(&wait_since_ns, memory_order_acquire) != since) continue;   /* it returned meanwhile */
        stalled(call, (double)limit / 1e9, local);
    }
    return NULL;
}

const char *comm_timeout_default(void) {
    const char *v = getenv("TANDEM_COMM_TIMEOUT");
    return v && *v ? v : COMM_TIMEOUT_DEFAULT_TEXT;
}

void comm_set_timeout(double seconds) {
    if (!(seconds >= 0) || seconds > 1e9)
        user_error("--comm-timeout %g: expected seconds, 0 (no deadline) to 1e9", seconds);
    atomic_store_explicit(&deadline_ns, (int64_t)(seconds * 1e9), memory_order_relaxed);
}
double comm_timeout(void) { return (double)atomic_load_explicit(&deadline_ns, memory_order_relaxed) / 1e9; }

/* The deadline until the command's --comm-timeout (whose default this also is) says: checked here,
 * so that a bad TANDEM_COMM_TIMEOUT is named as such */
static void timeout_from_env(void) {
    const char *env = comm_timeout_default();
    char *end = NULL;
    double t = strtod(env, &end);
    if (end == env || *end || !(t >= 0) || t > 1e9)
        user_error("TANDEM_COMM_TIMEOUT=%s: expected seconds, 0 (no deadline) to 1e9", env);
    comm_set_timeout(t);
}

int comm_mpi_start(int *argc, char ***argv) {
    int init = 0;
    MPI_Initialized(&init);
    mpi_on = init || launched();
    if (!mpi_on) {
        util_set_reporter(1, NULL);
        timeout_from_env();
        return 0;
    }
    if (!init) MPI_CHECK(MPI_Init(argc, argv));
    int r = 0, n = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    util_set_reporter(r == 0, NULL);   /* until a role group says otherwise */
    timeout_from_env();
    if (n == 1) return 1;   /* one rank waits for no one */
    world_rank_cached = r;
    parent_at_start = getppid();
    if (gethostname(host_name, sizeof host_name) != 0) snprintf(host_name, sizeof host_name, "?");
    host_name[sizeof host_name - 1] = 0;
    pthread_t tid;
    CHECK(pthread_create(&tid, NULL, watchdog, NULL) == 0);
    CHECK(pthread_detach(tid) == 0);
    return 1;
}
int comm_mpi_running(void) { return mpi_on; }

/* The job ends together: a rank whose group is done waits here for every other group, so an error
 * raised later in another group (MPI_Abort) still finds it alive; for as long as they take, so
 * without the deadline (a plain MPI_Barrier, not MPI_CHECK). Open MPI's mpirun hangs when one
 * rank aborts after others have left through MPI_Finalize (seen with role groups). */
void comm_mpi_finalize(void) {
    if (!mpi_on) return;   /* alone, or convert and fetch, which never start comm */
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin) return;
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
}

/* ---- communicators ----------------------------------------------------------------------------- */
static MPI_Comm of(const void *h) { return h ? *(const MPI_Comm *)h : MPI_COMM_WORLD; }
static void *placed(MPI_Comm *h, int *rank, int *size) {
    MPI_Comm_rank(*h, rank);
    MPI_Comm_size(*h, size);
    return h;
}
void *comm_mpi_dup(const void *h, int *rank, int *size) {
    MPI_Comm *n = xmalloc(sizeof(MPI_Comm));
    MPI_CHECK(MPI_Comm_dup(of(h), n));
    return placed(n, rank, size);
}
void *comm_mpi_split(const void *h, int color, int key, int *rank, int *size) {
    MPI_Comm *n = xmalloc(sizeof(MPI_Comm));
    MPI_CHECK(MPI_Comm_split(of(h), color, key, n));
    return placed(n, rank, size);
}
void *comm_mpi_split_node(const void *h, int *rank, int *size) {
    MPI_Comm *n = xmalloc(sizeof(MPI_Comm));
    MPI_CHECK(MPI_Comm_split_type(of(h), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, n));
    return placed(n, rank, size);
}
void comm_mpi_free(void *h) {
    MPI_Comm_free((MPI_Comm *)h);
    free(h);
}

static int count(size_t n) {
    CHECK(n <= INT_MAX);
    return (int)n;
}

/* ---- collectives ------------------------------------------------------------------------------- */
void comm_mpi_all_reduce(const Comm *c, void *buf, size_t n, CommMpiOp op) {
    switch (op) {
    case COMM_MPI_SUM_F32: MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, count(n), MPI_FLOAT, MPI_SUM, HANDLE(c))); break;
    case COMM_MPI_SUM_F64: MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, count(n), MPI_DOUBLE, MPI_SUM, HANDLE(c))); break;
    case COMM_MPI_MAX_F32: MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, count(n), MPI_FLOAT, MPI_MAX, HANDLE(c))); break;
    case COMM_MPI_SUM_I32: MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, count(n), MPI_INT, MPI_SUM, HANDLE(c))); break;
    }
}

/* Scratch for the fixed sums, grown on demand and kept for the process: the steps that call them
 * reuse one buffer instead of allocating per call (one per thread that calls them). */
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

double comm_mpi_all_reduce_sum_fixed(const Comm *c, float *buf, size_t n) {
    int P = c->size, r = c->rank;
    if (P == 1 || n == 0) return 0.0;
    if (n <= FIXED_GATHER_MAX) {                        /* every rank gets every partial, adds them by the tree */
        float *all = fixed_scratch((size_t)P * n);      /* (P, n) */
        MPI_CHECK(MPI_Allgather(buf, count(n), MPI_FLOAT, all, count(n), MPI_FLOAT, HANDLE(c)));
        tree_sum(all, P, n);
        memcpy(buf, all, sizeof(float) * n);
        return (double)n * sizeof(float) * (P - 1);
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
    return 2.0 * (n - mine) * sizeof(float);   /* the other ranks' slices out, then the ring's (P-1)/P */
}

void comm_mpi_all_reduce_maxloc(const Comm *c, float *val, int *idx, size_t n) {
    struct { float v; int i; } *pair = xmalloc(sizeof(*pair) * n);
    for (size_t k = 0; k < n; k++) { pair[k].v = val[k]; pair[k].i = idx[k]; }
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, pair, count(n), MPI_FLOAT_INT, MPI_MAXLOC, HANDLE(c)));
    for (size_t k = 0; k < n; k++) { val[k] = pair[k].v; idx[k] = pair[k].i; }
    free(pair);
}

void comm_mpi_all_gather(const Comm *c, const float *in, float *out, size_t n_each) {
    if (in == out + (size_t)c->rank * n_each)   /* already in its place */
        MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, count(n_each), MPI_FLOAT, HANDLE(c)));
    else
        MPI_CHECK(MPI_Allgather(in, count(n_each), MPI_FLOAT, out, count(n_each), MPI_FLOAT, HANDLE(c)));
}
void comm_mpi_iall_gather(const Comm *c, const float *in, float *out, size_t n_each, CommRequest *req) {
    MPI_Request *r = xmalloc(sizeof(MPI_Request));
    if (in == out + (size_t)c->rank * n_each)
        MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, count(n_each), MPI_FLOAT, HANDLE(c), r));
    else
        MPI_CHECK(MPI_Iallgather(in, count(n_each), MPI_FLOAT, out, count(n_each), MPI_FLOAT, HANDLE(c), r));
    req->handle = r;
}

void comm_mpi_all_to_allv(const Comm *c, const float *send, const int *send_n, const int *send_off, float *recv,
                          const int *recv_n, const int *recv_off, size_t w) {
    MPI_Datatype row;   /* w floats: counts and offsets in rows */
    MPI_CHECK(MPI_Type_contiguous(count(w), MPI_FLOAT, &row));
    MPI_CHECK(MPI_Type_commit(&row));
    MPI_CHECK(MPI_Alltoallv(send, send_n, send_off, row, recv, recv_n, recv_off, row, HANDLE(c)));
    MPI_CHECK(MPI_Type_free(&row));
}
void comm_mpi_all_to_all_int(const Comm *c, const int *send, int *recv, int n_each) {
    MPI_CHECK(MPI_Alltoall(send, n_each, MPI_INT, recv, n_each, MPI_INT, HANDLE(c)));
}

void comm_mpi_all_gather_rows(const Comm *c, const float *mine, float *all, size_t n, size_t unit) {
    int P = c->size;
    size_t lo, hi;
    comm_rows(n, P, c->rank, &lo, &hi);
    int *cnt = xmalloc(sizeof(int) * 2 * P), *dsp = cnt + P;
    for (int s = 0; s < P; s++) {
        size_t a, b;
        comm_rows(n, P, s, &a, &b);
        cnt[s] = count((b - a) * unit);
        dsp[s] = count(a * unit);
    }
    if (mine == all + lo * unit)
        MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, all, cnt, dsp, MPI_FLOAT, HANDLE(c)));
    else
        MPI_CHECK(MPI_Allgatherv(mine, count((hi - lo) * unit), MPI_FLOAT, all, cnt, dsp, MPI_FLOAT, HANDLE(c)));
    free(cnt);
}

/* floats per rank's block that comm_mpi_reduce_scatter_sum_fixed moves per all-to-all: its scratch
 * is P of them, not P whole blocks (a whole gradient) */
#define FIXED_CHUNK (1u << 18)

void comm_mpi_reduce_scatter_sum_fixed(const Comm *c, const float *in, float *out, size_t n_each) {
    int P = c->size;
    size_t chunk = n_each < FIXED_CHUNK ? n_each : FIXED_CHUNK;
    float *parts = fixed_scratch((size_t)P * chunk);   /* (P, k): rank s's partial of my block's chunk */
    int *cnt = xmalloc(sizeof(int) * 4 * P), *dsp = cnt + P, *rcnt = cnt + 2 * P, *rdsp = cnt + 3 * P;
    /* chunk by chunk: a chunk of my block is sent before its sum overwrites it, so out may be
     * in + rank * n_each */
    for (size_t off = 0; off < n_each; off += chunk) {
        size_t k = n_each - off < chunk ? n_each - off : chunk;
        for (int s = 0; s < P; s++) {
            cnt[s] = count(k);
            dsp[s] = count((size_t)s * n_each + off);
            rcnt[s] = count(k);
            rdsp[s] = count((size_t)s * k);
        }
        MPI_CHECK(MPI_Alltoallv(in, cnt, dsp, MPI_FLOAT, parts, rcnt, rdsp, MPI_FLOAT, HANDLE(c)));
        tree_sum(parts, P, k);
        memcpy(out + off, parts, sizeof(float) * k);
    }
    free(cnt);
}

void comm_mpi_reduce_scatter_rows_fixed(const Comm *c, float *buf, size_t n, size_t unit) {
    int P = c->size;
    int *cnt = xmalloc(sizeof(int) * 4 * P), *dsp = cnt + P, *rcnt = cnt + 2 * P, *rdsp = cnt + 3 * P;
    for (int s = 0; s < P; s++) {
        size_t a, b;
        comm_rows(n, P, s, &a, &b);
        cnt[s] = count((b - a) * unit);
        dsp[s] = count(a * unit);
    }
    size_t mine = (size_t)cnt[c->rank];
    for (int s = 0; s < P; s++) { rcnt[s] = (int)mine; rdsp[s] = count(mine * s); }
    float *parts = fixed_scratch((size_t)P * mine);   /* (P, mine): rank s's partial of my rows */
    MPI_CHECK(MPI_Alltoallv(buf, cnt, dsp, MPI_FLOAT, parts, rcnt, rdsp, MPI_FLOAT, HANDLE(c)));
    tree_sum(parts, P, mine);
    memcpy(buf, parts, sizeof(float) * mine);
    free(cnt);
}

void comm_mpi_broadcast(const Comm *c, void *buf, size_t bytes, int root) {
    MPI_CHECK(MPI_Bcast(buf, count(bytes), MPI_BYTE, root, HANDLE(c)));
}
void comm_mpi_barrier(const Comm *c) { MPI_CHECK(MPI_Barrier(HANDLE(c))); }

/* ---- point to point ---------------------------------------------------------------------------- */
void comm_mpi_send(const Comm *c, const void *buf, size_t bytes, int dst) {
    CHECK(mpi_on);   /* alone, nothing is ever sent or received */
    MPI_CHECK(MPI_Send(buf, count(bytes), MPI_BYTE, dst, 0, HANDLE(c)));
}
void comm_mpi_isend(const Comm *c, const void *buf, size_t bytes, int dst, int tag, CommRequest *req) {
    CHECK(mpi_on);
    MPI_Request *r = xmalloc(sizeof(MPI_Request));
    MPI_CHECK(MPI_Isend(buf, count(bytes), MPI_BYTE, dst, tag, HANDLE(c), r));
    req->handle = r;
}
void comm_mpi_recv(const Comm *c, void *buf, size_t bytes, int src, int tag) {
    CHECK(mpi_on);
    MPI_CHECK(MPI_Recv(buf, count(bytes), MPI_BYTE, src, tag, HANDLE(c), MPI_STATUS_IGNORE));
}
int comm_mpi_probe(const Comm *c, int tag, int blocking, int *src, size_t *bytes) {
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
void comm_mpi_wait(CommRequest *req) {
    MPI_CHECK(MPI_Wait((MPI_Request *)req->handle, MPI_STATUS_IGNORE));
    free(req->handle);
    req->handle = NULL;
    free(req->host);
    req->host = NULL;
}
