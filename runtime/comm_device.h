/* comm_device.h — private to runtime/comm.c and runtime/comm_device.c: the collectives of comm.h
 * on a backend's memory (comm_device.c says how they move). comm.c's entry points hand a call here
 * when comm_on_device says its buffer is such memory; everything here ends in comm.c's host calls
 * or in the backend's link. */
#ifndef TANDEM_COMM_DEVICE_H
#define TANDEM_COMM_DEVICE_H
#include "runtime/comm.h"
#include <stddef.h>

int comm_on_device(const void *p);   /* 1: p is memory of the backend comm_use_backend named */
/* a one-rank collective's copy between distinct buffers (not overlapping), wherever they are */
void comm_local_copy(void *dst, const void *src, size_t bytes);
void comm_link_attach(Comm *c);      /* collective over c: opens its link when it can have one */
void comm_link_detach(Comm *c);

void comm_dev_all_reduce_sum_fixed(const Comm *c, float *buf, size_t n);
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
void comm_dev_isend(const Comm *c, const void *buf, size_t bytes, int dst, CommRequest *req);
void comm_dev_recv(const Comm *c, void *buf, size_t bytes, int src);
/* comm_wait of a request comm_dev_isend made: 1 when it was one (and is now done), else 0 */
int comm_dev_wait(CommRequest *req);
/* comm.c's host traffic counter, for the link's calls */
void comm_count_sent(const Comm *c, double bytes);
#endif
