/* test_exact.c — rollout logprobs == training logprobs, bit for bit, at any layout. Usage:
 *   test_exact MODEL_DIR [TP PP]     (under mpirun with TP * PP * dp ranks)
 * Each dp group generates from its share of 8 random prompts on the generation engine (paged KV
 * cache, continuous batching of at most 3 sequences with prefill and decode mixed, sampling at
 * temperature 1 from per-prompt seeds), keeping every sampled token's logprob. Then the training
 * step runs the same sequences (prompt + completion) through schedule_1f1b in another batch
 * composition (two sequences per micro-batch, in reverse order, M micro-batches in 1F1B order),
 * with a loss hook that records the per-token logprobs it is given: the forward the optimizer's
 * gradients come from. Every generated token's logprob must have the same bits on both sides.
 * Run by tests/exact.bats under Open MPI's ring and Rabenseifner all-reduce algorithms: the
 * tensor-parallel sums must not depend on the collective's order.
 * Prints one "ok: exact ..." line per last-stage rank, or the mismatches, and exits 0 or 1. */
#include "generate/engine.h"
#include "kernels/kernels.h"
#include "runtime/mesh.h"
#include "runtime/model.h"
#include "runtime/util.h"
#include "train/grad.h"
#include "train/schedule.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N_PROMPTS = 8, MAX_NEW = 10 };

/* The hook: copy the logprobs into the micro-batch's slot (ctx); no loss, no gradient. */
static double record(const MicroBatch *mb, int N, const float *out, float *dout, void *user) {
    (void)user;
    memcpy((float *)mb->ctx, out, sizeof(float) * N);
    memset(dout, 0, sizeof(float) * N);
    return 0.0;
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    if (argc < 2) { fprintf(stderr, "usage: test_exact MODEL_DIR [TP PP]\n"); return 2; }
    int tp = argc > 3 ? atoi(argv[2]) : 1, pp = argc > 3 ? atoi(argv[3]) : 1;
    cpu_set_threads(1);
    Mesh mesh;
    mesh_init(&mesh, tp, pp);
    Model m;
    model_load(&m, argv[1], &mesh);
    int V = m.cfg.vocab_size;

    /* this dp group's prompts: i % dp == dp_rank */
    Seq seqs[N_PROMPTS];
    int n = 0;
    uint64_t rng = 12345;
    for (int i = 0; i < N_PROMPTS; i++) {
        int len = 3 + i % 7;
        int *prompt = xmalloc(sizeof(int) * len);
        for (int t = 0; t < len; t++) prompt[t] = 1 + (int)(splitmix64_next(&rng) % (uint64_t)(V - 1));
        if (i % mesh.dp != mesh.dp_rank) { free(prompt); continue; }
        Seq *s = &seqs[n++];
        memset(s, 0, sizeof(*s));
        s->index = i;
        s->prompt = prompt;
        s->n_prompt = len;
        sampling_params_default(&s->sp);
        s->sp.temperature = 1.0f;
        s->sp.seed = 1000 + (uint64_t)i;
        s->max_new = MAX_NEW;
        seq_alloc_results(s);
    }
    int max_len = 9 + MAX_NEW;
    EngineConfig ec = {3, 64, (size_t)1 << 22, 4, m.cfg.max_pos, pp, 1, NULL, NULL, NULL, NULL};
    Engine *e = engine_new(&m, &ec, max_len);
    char err[256];
    for (int i = 0; i < n; i++) CHECK(engine_add(e, &seqs[i], err, sizeof err) == 0);
    engine_run(e);

    /* the training side: sequences in reverse order, two per micro-batch */
    int M = (n + 1) / 2, cap = 2 * max_len;
    MicroBatch *mbs = xcalloc(M, sizeof(MicroBatch));
    int *tokens = xmalloc(sizeof(int) * M * cap), *targets = xmalloc(sizeof(int) * M * cap);
    int *starts = xmalloc(sizeof(int) * M * 3), *which = xmalloc(sizeof(int) * M * 2);
    float *lps = xmalloc(sizeof(float) * M * cap);
    for (int b = 0; b < M; b++) {
        int *tok = tokens + b * cap, *tg = targets + b * cap, *st = starts + b * 3, k = 0, T = 0;
        st[0] = 0;
        for (int j = 0; j < 2; j++) {
            int i = n - 1 - (2 * b + j);
            which[2 * b + j] = i;
            if (i < 0) continue;
            const Seq *s = &seqs[i];
            int L = s->n_prompt + s->n_out;
            for (int p = 0; p < L; p++) {
                tok[T + p] = p < s->n_prompt ? s->prompt[p] : s->out[p - s->n_prompt];
                /* position p predicts token p + 1: a generated one from the prompt's last position on */
                tg[T + p] = p + 1 >= s->n_prompt && p + 1 < L ? s->out[p + 1 - s->n_prompt] : -1;
            }
            T += L;
            st[++k] = T;
        }
        mbs[b] = (MicroBatch){tok, st, k, tg, NULL, lps + b * cap};
    }
    int n_slots = pp < M ? pp : M;
    TrainActs *slots = xcalloc(n_slots, sizeof(TrainActs));
    for (int i = 0; i < n_slots; i++) train_acts_init(&slots[i], &m, cap, max_len, 0);
    float *garena = xcalloc(m.n_params, sizeof(float));
    ModelWeights gw;
    LayerWeights *gl = xcalloc(m.n_layers_local, sizeof(LayerWeights));
    model_weights_place(&m, garena, &gw, gl);
    LossHook hook = {record, NULL, 1.0f};
    schedule_1f1b(&m, slots, n_slots, mbs, M, &hook, &gw);

    int fail = 0, compared = 0;
    double worst = 0.0;
    if (m.is_last) {
        for (int b = 0; b < M; b++) {
            int T = 0;
            for (int j = 0; j < 2; j++) {
                int i = which[2 * b + j];
                if (i < 0) continue;
                const Seq *s = &seqs[i];
                for (int g = 0; g < s->n_out; g++) {
                    float train = lps[b * cap + T + s->n_prompt - 1 + g], gen = s->lp[g];
                    compared++;
                    if (memcmp(&train, &gen, sizeof(float))) {
                        fail = 1;
                        double d = fabs((double)train - gen);
                        if (d > worst) worst = d;
                        if (fail < 4) printf("prompt %d token %d: generation %a training %a\n", s->index, g, gen, train);
                    }
                }
                T += s->n_prompt + s->n_out;
            }
        }
        printf("[tp %d/%d pp %d dp %d/%d] %d generated tokens: training logprobs %s generation's%s",
               mesh.tp_rank, tp, pp, mesh.dp_rank, mesh.dp, compared, fail ? "DIFFER from" : "bit-identical to",
               fail ? "" : "\n");
        if (fail) printf(" (max |diff| %.3g)  FAIL\n", worst);
        else if (compared) printf("ok: exact tp=%d pp=%d dp=%d\n", tp, pp, mesh.dp);
    }
    fflush(stdout);
    int any = fail || (m.is_last && compared == 0);
    comm_all_reduce_sum_int(&mesh.world, &any, 1);
    engine_free(e);
    for (int i = 0; i < n; i++) { free(seqs[i].prompt); seq_free(&seqs[i]); }
    for (int i = 0; i < n_slots; i++) train_acts_free(&slots[i]);
    free(slots); free(mbs); free(tokens); free(targets); free(starts); free(which); free(lps); free(garena); free(gl);
    model_free(&m);
    mesh_free(&mesh);
    comm_finalize();
    return any ? 1 : 0;
}
