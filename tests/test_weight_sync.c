/* test_weight_sync.c — --rollout-ranks' weight transfer alone (rlhf/async.h), without a training
 * step: the bytes and seconds of copying the actor's shards to the rollout ranks, at any model size
 * (bench/async.sh measures the 110M and 1.1B shapes with it), and that the copy is exact. Usage, under
 * mpirun -np 2K (actor ranks 0 .. K-1 at tp K, rollout ranks K .. 2K-1 at tp K):
 *   test_weight_sync MODEL_DIR ROUNDS [DTYPE]
 * Each rank loads MODEL_DIR at DTYPE (default fp32) on TANDEM_DEVICE (default cpu); the actor's ranks change one weight of theirs
 * (so the rollout's copy starts different), then ROUNDS transfers run, each checked on the rollout
 * ranks (their arena's checksum against the actor's: a mismatch is an error line). World rank 0
 * prints one JSON line: {"bench": "weight_sync", "params": ..., "bytes": per transfer (every shard),
 * "s_median": ..., "gbit_per_s": ...}. */
#include "rlhf/async.h"
#include "runtime/device.h"
#include "runtime/util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    if (argc < 3) user_error("usage: test_weight_sync MODEL_DIR ROUNDS [DTYPE] (under mpirun -np 2K)");
    int rounds = atoi(argv[2]);
    DType dt = dtype_parse("DTYPE", argc > 3 ? argv[3] : "fp32");
    Roles rs;
    memset(&rs, 0, sizeof rs);
    Comm w = comm_world();
    int k = w.size / 2;
    comm_free(&w);
    if (k < 1 || rounds < 1) user_error("test_weight_sync: needs an even number of ranks and ROUNDS >= 1");
    rs.role[R_ACTOR].dir = argv[1];
    rs.role[R_ACTOR].count = rs.role[R_ROLLOUT].count = k;
    rs.role[R_ACTOR].tp = k;
    rs.role[R_ACTOR].pp = 1;
    rs.device = getenv("TANDEM_DEVICE") ? getenv("TANDEM_DEVICE") : "cpu";   /* the device a GPU run measures */
    roles_open(&rs, 0, NULL);
    const char *dirs[N_ROLES] = {argv[1], NULL, NULL, NULL, NULL, argv[1]};
    DType dts[N_ROLES] = {dt, dt, dt, dt, dt, dt};
    roles_load(&rs, dirs, dts);
    Role *A = &rs.role[R_ACTOR];
    if (A->member) {   /* one element changed: the first transfer must carry it */
        unsigned char b[4];
        A->m.be->to_host(b, A->m.params, sizeof b);
        b[1] ^= 0x40;
        A->m.be->to_device(A->m.params, b, sizeof b);
    }
    AsyncPipe a;
    async_open(&a, &rs, 0, 1, 1, 0, 1, 1, NULL);
    double *s = xmalloc(sizeof(double) * rounds), bytes = 0;
    for (int r = 0; r < rounds; r++) {
        async_initial_sync(&a, &rs);
        s[r] = a.st.sync_s;
        bytes = a.st.sync_bytes;
    }
    qsort(s, rounds, sizeof(double), cmp_double);
    if (rs.world_rank == 0)
        printf("{\"bench\": \"weight_sync\", \"ranks\": %d, \"dtype\": \"%s\", \"params\": %.0f, \"bytes\": %.0f, \"rounds\": %d, "
               "\"s_median\": %.6f, \"gbit_per_s\": %.3f}\n", 2 * k, dt == DTYPE_BF16 ? "bf16" : "fp32",
               bytes / dtype_size(dt), bytes, rounds, s[rounds / 2], bytes * 8 / 1e9 / s[rounds / 2]);
    comm_barrier(&rs.job);
    free(s);
    async_close(&a);
    roles_free(&rs);
    comm_finalize();
    return 0;
}
