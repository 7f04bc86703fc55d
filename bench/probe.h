/* probe.h — the bench's yardsticks (bench/probe.c), used by bench.c and kernels.c. */
#ifndef TANDEM_BENCH_PROBE_H
#define TANDEM_BENCH_PROBE_H
#include "kernels/kernels.h"
double bench_median(double *v, int n);             /* sorts v */
double bench_device_copy_gbs(const Backend *be);   /* a device's copy: bytes read + written per second */
double bench_read_bandwidth_gbs(void);             /* the host's read bandwidth */
#endif
