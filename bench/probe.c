/* probe.c — the bench's yardsticks, shared by bench.c and kernels.c: the median of timed runs, the
 * host's read bandwidth and a device backend's copy bandwidth. Owns nothing it times against. */
#include "bench/probe.h"
#include "runtime/util.h"
#include <stdlib.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(double *v, int n) {
    qsort(v, n, sizeof(double), cmp_double);
    return v[n / 2];
}

/* Read bandwidth: a vectorised sum over a buffer far larger than the L3, with the run's threads.
 * Batch-1 decode only reads weights, so this (not copy) is its ceiling. Best of 5. */
double bench_read_bandwidth_gbs(void) {
    size_t n = (size_t)64 << 20;   /* floats: 256 MiB */
    float *a = xmalloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) a[i] = (float)(i & 7);
    double best = 0;
    volatile float sink = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_seconds();
        float total = 0;
#pragma omp parallel for reduction(+ : total) schedule(static)
        for (size_t blk = 0; blk < n / 1024; blk++) {
            float s[16] = {0};
            const float *p = a + blk * 1024;
            for (int i = 0; i < 1024; i += 16)
                for (int l = 0; l < 16; l++) s[l] += p[i + l];
            for (int l = 0; l < 16; l++) total += s[l];
        }
        sink = total;
        double gbs = sizeof(float) * n / (now_seconds() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    (void)sink;
    free(a);
    return best;
}

/* A device backend's copy bandwidth, bytes read plus bytes written per second (the HBM roofline's
 * figure: nvidia-smi's and CUDA's bandwidthTest count both): be->copy of 512 MiB, timed between
 * syncs. Best of 5 after one warm-up. */
double bench_device_copy_gbs(const Backend *be) {
    size_t n = (size_t)128 << 20;   /* floats */
    float *a = be->alloc(sizeof(float) * n), *b = be->alloc(sizeof(float) * n);
    double best = 0;
    for (int rep = -1; rep < 5; rep++) {
        be->sync();
        double t0 = now_seconds();
        be->copy(b, a, n);
        be->sync();
        double gbs = 2.0 * sizeof(float) * n / (now_seconds() - t0) / 1e9;
        if (rep >= 0 && gbs > best) best = gbs;
    }
    be->free(a);
    be->free(b);
    return best;
}
