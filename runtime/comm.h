/* comm.h — the one communication API (ARCHITECTURE.md): all_reduce, all_gather, reduce_scatter,
 * broadcast, send/recv, over a Comm (a group of ranks). MPI on host buffers under a launcher
 * (mpirun); a buffer in the memory of the group's device backend goes over its link (NCCL) or
 * through host memory. A process started without a launcher never initialises MPI: its world is one
 * rank, every Comm has size 1, a collective is the identity (or a copy between distinct buffers) and
 * send/recv never happen. Three files, no circle: runtime/comm.c (this API: a Comm's life and
 * backend, the one-rank cases, each call's dispatch, the byte counts) calls comm_mpi.c (MPI and the
 * deadline's watchdog) and comm_device.c (device buffers: link or staged), and comm_device.c stages
 * through comm_mpi.c. mpi.h is included by comm_mpi.c alone here; the one other file that calls MPI
 * is runtime/util.c, whose error path asks for the world rank and aborts the job.
 * Does not own the rank algebra (runtime/mesh.c) or who fetches a model on each node (runtime/hub.c,
 * through comm_split_node). */
#ifndef TANDEM_COMM_H
#define TANDEM_COMM_H
#include <stddef.h>

struct Backend;
typedef struct {
    int rank;      /* rank within this group */
    int size;      /* ranks in this group */
    void *handle;  /* MPI's communicator (runtime/comm_mpi.c), NULL alone */
    void *link;    /* the device backend's own (NCCL) for this group, or NULL (runtime/comm_device.c) */
    const struct Backend *be;   /* the device backend whose memory its calls may be given, or NULL */
} Comm;

/* The world's device backend, whose memory buffers may be (kernels.h Backend.owns): comm_world()
 * from now on carries it (Comm.be), and a group cut by comm_dup / comm_split / comm_split_node
 * carries its parent's (the world's when the parent carries none, being older than this call). A
 * call given such a buffer moves it over the backend's link (NCCL) when its group has one, else
 * through host memory (runtime/comm_device.c). Called by device_open before the meshes and role
 * groups are cut: groups made after it get their link. NULL or the CPU: every buffer is host memory. */
void comm_use_backend(const struct Backend *be);

/* MPI_Init when a launcher started the process (OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_RANK,
 * PMIX_RANK or PMI_RANK set), else nothing: alone. World rank 0 reports errors until groups exist. */
void comm_init(int *argc, char ***argv);
void comm_finalize(void);
/* The deadline of a rank waiting inside one communication call (README "Across hosts"; kept by
 * runtime/comm_mpi.c, which defines the three below): past it the rank prints one line, "tandem:
 * rank R on host H: no progress in MPI_X for S s (...); stopping", leaves the launcher half the
 * deadline (at least 10 s) to end the job, then exits 1, ending its Open MPI daemon too when that
 * can no longer deliver (comm_mpi.c says why it waits, and why the daemon). comm_finalize's closing
 * barrier has no deadline. Only waiting counts, never compute: a peer that legitimately works
 * longer than the deadline while this rank waits for it (a checkpoint write, a slow reward program,
 * a rollout of a large model, generate's rank 0 waiting for another dp group's last lines) trips it
 * too, so the deadline must exceed the longest such imbalance. Seconds, 0 = none; from comm_init
 * on, TANDEM_COMM_TIMEOUT or else COMM_TIMEOUT_DEFAULT; each command's --comm-timeout
 * (COMM_TIMEOUT_OPTION, whose default is comm_timeout_default()) sets it after parsing (a user
 * error past 0 .. 1e9). */
#define COMM_TIMEOUT_DEFAULT 60
#define COMM_TIMEOUT_DEFAULT_TEXT "60"
const char *comm_timeout_default(void);   /* TANDEM_COMM_TIMEOUT if set, else "60" */
void comm_set_timeout(double seconds);
double comm_timeout(void);
/* 1 once comm_init has run in this process: commands without ranks (fetch, convert, tokenize) parse a
 * --model without it, and then there is no world to ask. */
int comm_initialized(void);
/* A new communicator over every rank of the job: what a command cuts its meshes or role groups
 * from (the only place the world is named outside the error path). */
Comm comm_world(void);
Comm comm_dup(const Comm *c);
Comm comm_split(const Comm *parent, int color, int key);
/* The ranks of parent that share this node's memory, in parent's order (collective over parent). */
Comm comm_split_node(const Comm *parent);
void comm_free(Comm *c);

void comm_all_reduce_sum(const Comm *c, float *buf, size_t n);     /* in place */
/* In place, every element the sum of the ranks' values added by one fixed pairwise tree
 * (tree_sum, kernels/kernels.h), (v_0 + v_1) + (v_2 + v_3) for 4 ranks, ((v_0 + v_1) + v_2) for 3,
 * whatever the collective algorithm, the message size or n: the bits depend only on the inputs.
 * comm_all_reduce_sum's MPI_Allreduce adds in an order the algorithm picks (ring, Rabenseifner,
 * recursive doubling, ... by message size), so the same partials can give other bits at another
 * batch size. Every tensor-parallel sum that feeds a logprob, a value or a loss uses this one.
 * The collectives move data only (all-gather, or all-to-all then all-gather: no MPI arithmetic);
 * the additions are ours. Small n: one all-gather, every rank sums all; large n: each rank sums
 * one slice (all-to-all), then the slices are all-gathered (the traffic of a ring all-reduce). */
void comm_all_reduce_sum_fixed(const Comm *c, float *buf, size_t n);
void comm_all_reduce_sum_f64(const Comm *c, double *buf, size_t n);
void comm_all_reduce_max(const Comm *c, float *buf, size_t n);
void comm_all_reduce_sum_int(const Comm *c, int *buf, size_t n);
/* Per element: the max over ranks of val[i], and idx[i] from that rank (lowest rank on ties). */
void comm_all_reduce_maxloc(const Comm *c, float *val, int *idx, size_t n);
void comm_all_gather(const Comm *c, const float *in, float *out, size_t n_each);   /* in may be out + rank * n_each */
/* in (P * n_each): every rank's partials; out (n_each): block `rank` of their sum, each element added
 * by comm_all_reduce_sum_fixed's tree (all-to-all, then our additions): the data-parallel gradient
 * reduction of plain dp and every ZeRO stage, so that each gives the same bits. out may be in + rank *
 * n_each (in place); the scratch is P chunks of 256K floats, whatever n_each. */
void comm_reduce_scatter_sum_fixed(const Comm *c, const float *in, float *out, size_t n_each);
/* Sequence parallelism's row split: rank r of P holds rows [lo, hi) = [n r / P, n (r + 1) / P) of an
 * (n, unit) array (a row: unit floats). */
static inline void comm_rows(size_t n, int P, int r, size_t *lo, size_t *hi) {
    *lo = n * r / P;
    *hi = n * (r + 1) / P;
}
/* all (n, unit) = every rank's rows, each from its `mine` (its rows; mine may be all + lo * unit) */
void comm_all_gather_rows(const Comm *c, const float *mine, float *all, size_t n, size_t unit);
/* buf (n, unit): each rank's partial sums in; its own rows' sums out in buf's first rows, each element
 * comm_all_reduce_sum_fixed's (the same tree): the reduce-scatter of Megatron's sequence parallelism */
void comm_reduce_scatter_rows_fixed(const Comm *c, float *buf, size_t n, size_t unit);
/* The all-to-all of variable sizes (MPI_Alltoallv) of host buffers of rows of w floats, counts and
 * offsets in rows (one MPI datatype of w floats, so a count stays an int however wide the rows:
 * 65k rows of 4096 floats are 2^28 floats past INT_MAX): send_n[q] rows from send + send_off[q] w go
 * to rank q, which receives them at its recv + recv_off[r] w (recv_n[r] rows). Expert parallelism's
 * dispatch and return (runtime/moe_ep.c); a group of one copies its own block.
 * comm_all_to_all_int: n_each ints to every rank, recv (P n_each). */
void comm_all_to_allv(const Comm *c, const float *send, const int *send_n, const int *send_off, float *recv,
                      const int *recv_n, const int *recv_off, size_t w);
void comm_all_to_all_int(const Comm *c, const int *send, int *recv, int n_each);
/* Bytes this rank has sent on c so far, counted from the calls' sizes by the bandwidth-optimal
 * algorithms' volumes (all-reduce 2 n (P-1)/P, all-gather / reduce-scatter n (P-1)/P of n in all):
 * what the ZeRO paper's 2 Psi per step counts. */
double comm_bytes_sent(const Comm *c);
void comm_broadcast(const Comm *c, void *buf, size_t bytes, int root);
void comm_send(const Comm *c, const void *buf, size_t bytes, int dst);
/* Non-blocking send: buf must stay untouched until comm_wait(req). A pipeline schedule posts its
 * sends this way so neighbours sending to each other at once cannot deadlock. */
typedef struct {
    void *handle;
    void *host;   /* a device buffer's host copy that a staged send reads (comm_device.c), freed by comm_wait */
} CommRequest;
void comm_isend(const Comm *c, const void *buf, size_t bytes, int dst, CommRequest *req);
void comm_wait(CommRequest *req);   /* no-op when nothing is pending */
/* comm_all_gather started (MPI_Iallgather): in and out untouched until comm_wait(req). ZeRO-3
 * gathers the next layer's weights with it while this one computes. */
void comm_iall_gather(const Comm *c, const float *in, float *out, size_t n_each, CommRequest *req);
/* Tagged messages of sizes the receiver does not know in advance (e.g. finished output lines sent
 * to the writing rank). comm_probe: 1 and the sender and size when a message with this tag is
 * waiting (blocking: waits for one), else 0. */
void comm_isend_tag(const Comm *c, const void *buf, size_t bytes, int dst, int tag, CommRequest *req);
int comm_probe(const Comm *c, int tag, int blocking, int *src, size_t *bytes);
void comm_recv_tag(const Comm *c, void *buf, size_t bytes, int src, int tag);
void comm_recv(const Comm *c, void *buf, size_t bytes, int src);
void comm_barrier(const Comm *c);
/* A failure some ranks may have met (msg: this rank's error line, "" when it did fine; cap bytes on
 * every rank). Returns 1 on every rank when any failed, msg then holding the lowest failing rank's
 * line everywhere; else 0. Collective. */
int comm_first_error(const Comm *c, char *msg, size_t cap);
#endif
