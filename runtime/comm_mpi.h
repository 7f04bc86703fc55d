/* comm_mpi.h — private to runtime/comm.c and runtime/comm_device.c: comm.h's calls on host memory
 * over MPI, each under the deadline (comm_mpi.c: the watchdog), and MPI's part of a Comm's life.
 * comm.c calls these after it has taken out the one-rank cases, the device buffers and the byte
 * counting; comm_device.c stages a device buffer through them. Nothing here calls back into comm.c.
 * Handles are MPI_Comm * (Comm.handle) and MPI_Request * (CommRequest.handle), kept opaque so that
 * mpi.h stays in comm_mpi.c. */
#ifndef TANDEM_COMM_MPI_H
#define TANDEM_COMM_MPI_H
#include "runtime/comm.h"
#include <stddef.h>

/* MPI_Init (with the watchdog when the world has more than one rank) when a launcher started the
 * process or MPI already runs: returns 1; else 0, alone (no MPI at all). Either way the deadline is
 * set from TANDEM_COMM_TIMEOUT and the error reporter is world rank 0. */
int comm_mpi_start(int *argc, char ***argv);
int comm_mpi_running(void);   /* comm_mpi_start returned 1 */
void comm_mpi_finalize(void);

/* New communicators (collective over h's ranks; h NULL: the world), with this rank's place in them */
void *comm_mpi_dup(const void *h, int *rank, int *size);
void *comm_mpi_split(const void *h, int color, int key, int *rank, int *size);
void *comm_mpi_split_node(const void *h, int *rank, int *size);
void comm_mpi_free(void *h);

/* In place, in the order MPI's algorithm picks (comm.h comm_all_reduce_sum); c->size > 1 */
typedef enum { COMM_MPI_SUM_F32, COMM_MPI_SUM_F64, COMM_MPI_MAX_F32, COMM_MPI_SUM_I32 } CommMpiOp;
void comm_mpi_all_reduce(const Comm *c, void *buf, size_t n, CommMpiOp op);
/* comm.h's fixed-tree sum; returns the bytes this rank sent (they depend on n: one all-gather or
 * all-to-all + all-gather). Nothing to do when c->size == 1 or n == 0 (returns 0). */
double comm_mpi_all_reduce_sum_fixed(const Comm *c, float *buf, size_t n);
void comm_mpi_all_reduce_maxloc(const Comm *c, float *val, int *idx, size_t n);
/* The rest as in comm.h, with c->size > 1 */
void comm_mpi_all_gather(const Comm *c, const float *in, float *out, size_t n_each);
void comm_mpi_iall_gather(const Comm *c, const float *in, float *out, size_t n_each, CommRequest *req);
void comm_mpi_all_gather_rows(const Comm *c, const float *mine, float *all, size_t n, size_t unit);
void comm_mpi_reduce_scatter_sum_fixed(const Comm *c, const float *in, float *out, size_t n_each);
void comm_mpi_reduce_scatter_rows_fixed(const Comm *c, float *buf, size_t n, size_t unit);   /* n > 0 */
void comm_mpi_all_to_allv(const Comm *c, const float *send, const int *send_n, const int *send_off, float *recv,
                          const int *recv_n, const int *recv_off, size_t w);
void comm_mpi_all_to_all_int(const Comm *c, const int *send, int *recv, int n_each);
void comm_mpi_broadcast(const Comm *c, void *buf, size_t bytes, int root);
/* Point to point: abort (CHECK) when MPI is not running (alone, nothing is sent or received).
 * comm_mpi_isend's req must have nothing pending (comm.c waits first). */
void comm_mpi_send(const Comm *c, const void *buf, size_t bytes, int dst);
void comm_mpi_isend(const Comm *c, const void *buf, size_t bytes, int dst, int tag, CommRequest *req);
void comm_mpi_recv(const Comm *c, void *buf, size_t bytes, int src, int tag);
int comm_mpi_probe(const Comm *c, int tag, int blocking, int *src, size_t *bytes);
void comm_mpi_wait(CommRequest *req);   /* an MPI request: waits, frees it and req->host */
void comm_mpi_barrier(const Comm *c);
#endif
