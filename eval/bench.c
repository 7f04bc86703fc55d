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
#include "tokenizer/tokenizer.h"
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* --tokenizer A[,B...]: encode MB/s of each tokenizer on the same text (line by line, no BOS, as
 * spm_encode does; bench/tokenizer.sh times spm_encode on the same file for the ratio). */
static int bench_tokenizers(const char *list, const char *text_path, int iters) {
    size_t len;
    char *text = read_file(text_path, &len);
    if (!text) user_error("%s: cannot read (--text)", text_path);
    char *paths = xstrdup(list), *save = NULL;
    for (char *p = strtok_r(paths, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
        char err[512];
        Tokenizer *t = tokenizer_open(p, err, sizeof err);
        if (!t) user_error("%s", err);
        double mbps = tokenizer_bench_mbps(t, text, len, iters);
        printf("{\"bench\": \"tokenizer\", \"tokenizer\": \"%s\", \"kind\": \"%s\", \"text_bytes\": %zu, \"encode_mb_per_s\": %.3f}\n",
               p, tokenizer_kind(t) == TOK_KIND_SPM ? "sentencepiece" : "bpe", len, mbps);
        tokenizer_free(t);
    }
    free(paths);
    free(text);
    return 0;
}

int bench_main(int argc, char **argv) {
    const char *model_dir, *tok_list, *text_path;
    int tp, pp, threads, batch, seq, iters;
    Option opts[] = {
        {"--model", OPT_STR, &model_dir, NULL, "Hugging Face model directory"},
        {"--tokenizer", OPT_STR, &tok_list, NULL, "tokenizer files/dirs, comma-separated: encode MB/s instead"},
        {"--text", OPT_STR, &text_path, "../shared/assets/data/pretrain/tinyshakespeare.txt", "text for --tokenizer"},
        {"--batch", OPT_INT, &batch, "4", "sequences per forward"},
        {"--seq", OPT_INT, &seq, "128", "tokens per sequence"},
        {"--iters", OPT_INT, &iters, "5", "timed forwards (median reported)"},
        {"--tp", OPT_INT, &tp, "1", "tensor-parallel size"},
        {"--pp", OPT_INT, &pp, "1", "pipeline-parallel size"},
        {"--threads", OPT_INT, &threads, "1", "CPU threads per rank (OpenBLAS)"},
    };
    int n_opts = sizeof(opts) / sizeof(opts[0]);
    comm_init(&argc, &argv);
    args_parse("usage: tandem bench --model DIR [--batch B --seq T --iters N --tp T --pp P --threads N]\n"
               "       tandem bench --tokenizer FILE[,FILE...] [--text FILE]", opts,
               n_opts, argc, argv);
    if (tok_list) {
        int rc = bench_tokenizers(tok_list, text_path, iters);
        comm_finalize();
        return rc;
    }
    if (!model_dir) user_error("bench: --model DIR or --tokenizer FILE is required");
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
