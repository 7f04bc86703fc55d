/* bench.h — `tandem bench`: throughput and peak memory (never timed tests). Its shell scripts
 * and PyTorch baselines sit beside it in bench/. Owns the measurements and their report; does not own
 * any of what it times (the engine, the training step, the tokenizers, the CPU kernels it calls
 * directly on purpose). */
#ifndef TANDEM_BENCH_H
#define TANDEM_BENCH_H
int bench_main(int argc, char **argv);

/* inside bench/: kernels.c's --kernels (the probes both use: bench/probe.h) */
#include "runtime/model.h"
int bench_kernels(Model *m, int iters, int context);
#endif
