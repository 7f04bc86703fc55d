/* bench.h — `tandem bench`: throughput and peak memory (never timed tests). */
#ifndef TANDEM_BENCH_H
#define TANDEM_BENCH_H
int bench_main(int argc, char **argv);
#endif
