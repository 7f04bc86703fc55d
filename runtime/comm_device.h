/* comm_device.h — private to runtime/comm.c and runtime/comm_device.c: the collectives of comm.h
 * on the memory of a group's device backend (Comm.be; comm_device.c says how they move). comm.c's
 * entry points hand a call here when its buffer is such memory and the group has more than one
 * rank; everything here ends in comm_mpi.c's host calls or in the backend's link. Byte counts are
 * comm.c's: where they depend on the path, a call returns the bytes this rank sent. */
#ifndef TANDEM_COMM_DEVICE_H
#define TANDEM_COMM_DEVICE_H
#include "runtime/comm.h"
#include <stddef.h>

/* collective over c (c->be set): opens its link when it can have one; returns the bytes this rank
 * broadcast to decide it (0 when no link was tried) */
double comm_link_attach(Comm *c);
void comm_link_detach(Comm *c);

double comm_dev_all_reduce_sum_fixed(const Comm *c, float *buf, size_t n);   /* returns bytes sent */
void comm_dev_all_reduce_max(const Comm *c, float *buf, size_t n);
void comm_dev_all_reduce_maxloc(const Comm *c, float *val, int *idx, size_t n);
void comm_dev_all_reduce_sum_int(const Comm *c, int *buf, size_t n);
void comm_dev_all_reduce_sum_f64(const Comm *c, double *buf, size_t n);
void comm_dev_all_gather(const Comm *c, const float *in, float *out, size_t n_each);
void comm_dev_reduce_scatter_sum_fixed(const Comm *c, const float *in, float *out, size_t n_each);
void comm_dev_all_gather_rows(const Comm *c, const float *mine, float *all, size_t n, size_t unit);
void comm_dev_reduce_scatter_rows_fixed(const Comm *c, float *buf, size_t n, size_t unit);
void comm_dev_broadcast(const Comm *c, void *buf, size_t bytes, int root);
void comm_dev_send(const Comm *c, const void *buf, size_t bytes, int dst);
/* req has nothing pending (comm.c waits first) */
void comm_dev_isend(const Comm *c, const void *buf, size_t bytes, int dst, CommRequest *req);
void comm_dev_recv(const Comm *c, void *buf, size_t bytes, int src);
/* comm_wait of a request comm_dev_isend made: 1 when it was one (and is now done), else 0 */
int comm_dev_wait(CommRequest *req);
#endif
