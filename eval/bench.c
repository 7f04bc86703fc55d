/* bench.c — `tandem bench --model DIR`: prefill throughput (forward over B sequences of T tokens,
 * logits included) and peak resident memory, on any tp x pp layout. Reports the median of
 * --iters timed runs after one warm-up. Random token ids: speed does not depend on the text. */
#include "eval/bench.h"
#include "kernels/kernels.h"
#include "runtime/args.h"
#include "runtime/comm.h"
#include "runtime/mesh.h"
#include "runtime/model.h"
#include "runtime/util.h"
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int bench_main(int argc, char **argv) {
    const char *model_dir;
    int tp, pp, threads, batch, seq, iters;
    Option opts[] = {
        {"--model", OPT_STR, &model_dir, NULL, "Hugging Face model directory"},
        {"--batch", OPT_INT, &batch, "4", "sequences per forward"},
        {"--seq", OPT_INT, &seq, "128", "tokens per sequence"},
        {"--iters", OPT_INT, &iters, "5", "timed forwards (median reported)"},
        {"--tp", OPT_INT, &tp, "1", "tensor-parallel size"},
        {"--pp", OPT_INT, &pp, "1", "pipeline-parallel size"},
        {"--threads", OPT_INT, &threads, "1", "CPU threads per rank (OpenBLAS)"},
    };
    int n_opts = sizeof(opts) / sizeof(opts[0]);
    comm_init(&argc, &argv);
    args_parse("usage: tandem bench --model DIR [--batch B --seq T --iters N --tp T --pp P --threads N]", opts,
               n_opts, argc, argv);
    if (!model_dir) user_error("bench: --model DIR is required");
    if (batch < 1 || seq < 1 || iters < 1 || threads < 1) user_error("bench: --batch, --seq, --iters, --threads must be >= 1");
    cpu_set_threads(threads);
    Mesh mesh;
    mesh_init(&mesh, tp, pp);
    Model m;
    model_load(&m, model_dir, &mesh);
    int N = batch * seq;
    model_alloc_state(&m, N, seq);
    if (g_rank == 0) {
        fprintf(stderr, "+------------------------+--------------------------------+\n");
        args_print(opts, n_opts);
        model_print_summary(&m);
    }
    int *tokens = xmalloc(sizeof(int) * N), *start = xmalloc(sizeof(int) * (batch + 1));
    unsigned rng = 12345;
    for (int i = 0; i < N; i++) { rng = rng * 1103515245u + 12345u; tokens[i] = (int)((rng >> 8) % (unsigned)m.cfg.vocab_size); }
    for (int b = 0; b <= batch; b++) start[b] = b * seq;
    double *times = xmalloc(sizeof(double) * iters);
    for (int it = -1; it < iters; it++) {
        comm_barrier(&mesh.world);
        double t0 = now_seconds();
        model_forward(&m, tokens, start, batch);
        comm_barrier(&mesh.world);
        if (it >= 0) times[it] = now_seconds() - t0;
    }
    qsort(times, iters, sizeof(double), cmp_double);
    double med = times[iters / 2];
    double peak = peak_rss_mib(), peak_max = peak;
    comm_all_reduce_sum_f64(&mesh.world, &peak, 1);
    float pm = (float)peak_max;
    comm_all_reduce_max(&mesh.world, &pm, 1);
    if (g_rank == 0) {
        printf("prefill: batch %d x seq %d = %d tokens, median %.4f s over %d runs -> %.1f tokens/s\n", batch, seq, N, med,
               iters, N / med);
        printf("peak memory: %.1f MiB max per rank, %.1f MiB all %d ranks\n", pm, peak, mesh.world_size);
        printf("{\"bench\": \"prefill\", \"batch\": %d, \"seq\": %d, \"tokens_per_s\": %.2f, \"median_s\": %.6f, "
               "\"peak_rss_mib_max_rank\": %.1f, \"peak_rss_mib_total\": %.1f, \"tp\": %d, \"pp\": %d, \"threads\": %d}\n",
               batch, seq, N / med, med, pm, peak, tp, pp, threads);
    }
    free(tokens); free(start); free(times);
    model_free(&m);
    mesh_free(&mesh);
    comm_finalize();
    return 0;
}
