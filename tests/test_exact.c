/* test_exact.c — rollout logprobs == training logprobs, bit for bit, at any layout. Usage:
 *   test_exact MODEL_DIR [TP PP]     (under mpirun with TP * PP * dp ranks)
 * Each dp group generates from its share of 8 random prompts on the generation engine (paged KV
 * cache, continuous batching of at most 3 sequences with prefill and decode mixed, sampling at
 * temperature 1 (or TANDEM_TEST_TEMPERATURE: then every logprob on both sides is of logits / T, PPO's
 * policy) from per-prompt seeds), keeping every sampled token's logprob. TANDEM_TEST_TRUNCATE="K,P,M"
 * samples with top-k K, top-p P, min-p M and makes every logprob on both sides the truncated policy's
 * (EngineConfig.truncated_lp, LossHook.truncate: PPO's with those options); the ok line then counts the
 * tokens whose logprob is exactly 0 (all of them with K = 1). Then the training
 * step runs the same sequences (prompt + completion) through schedule_1f1b in another batch
 * composition (two sequences per micro-batch, in reverse order, M micro-batches in 1F1B order),
 * with a loss hook that records the per-token logprobs it is given: the forward the optimizer's
 * gradients come from. Every generated token's logprob must have the same bits on both sides.
 * Then one optimizer step (a REINFORCE-style hook raising the sampled tokens' logprobs) changes the
 * weights in place and the SAME engine generates round 2: its tokens and logprob bits must equal a
 * fresh engine's on the new weights (nothing stale survives a step) and the training step's again.
 * Run by tests/exact.bats under Open MPI's ring and Rabenseifner all-reduce algorithms: the
 * tensor-parallel sums must not depend on the collective's order.
 * Prints one "ok: exact ..." line per last-stage rank, or the mismatches, and exits 0 or 1. */
#include "generate/engine.h"
#include "kernels/kernels.h"
#include "runtime/mesh.h"
#include "runtime/model.h"
#include "runtime/util.h"
#include "train/grad.h"
#include "train/optim.h"
#include "train/schedule.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N_PROMPTS = 8, MAX_NEW = 10 };
static float g_T = 1.0f;   /* the sampling temperature, and the logprobs' on both sides */
static SamplingParams g_sp; /* temperature g_T and TANDEM_TEST_TRUNCATE's top-k, top-p, min-p */
static int g_trunc;         /* TANDEM_TEST_TRUNCATE given */

/* The hook: copy the logprobs into the micro-batch's slot (ctx); no loss, no gradient. */
static double record(const MicroBatch *mb, int N, const float *out, float *dout, void *user) {
    (void)user;
    memcpy((float *)mb->ctx, out, sizeof(float) * N);
    memset(dout, 0, sizeof(float) * N);
    return 0.0;
}

/* REINFORCE with advantage 1: loss = -sum of the sampled tokens' logprobs / their count */
static double reinforce(const MicroBatch *mb, int N, const float *out, float *dout, void *user) {
    double loss = 0.0, w = 1.0 / *(int *)user;
    for (int n = 0; n < N; n++) {
        dout[n] = mb->targets[n] >= 0 ? (float)-w : 0.0f;
        if (mb->targets[n] >= 0) loss -= w * out[n];
    }
    return loss;
}

typedef struct {
    Model *m;
    Seq seqs[N_PROMPTS];
    int n, max_len, M, cap, n_targets;
    MicroBatch *mbs;
    int *tokens, *targets, *starts, *which;
    float *lps;
    TrainActs *slots;
    int n_slots;
    float *grads;           /* optim_grad_floats */
    GradSink gs;
    LayerWeights *gl;
} Run;

/* this dp group's prompts (i % dp == dp_rank), results cleared */
static void seqs_reset(Run *r, const Mesh *mesh) {
    int V = r->m->cfg.vocab_size;
    uint64_t rng = 12345;
    r->n = 0;
    for (int i = 0; i < N_PROMPTS; i++) {
        int len = 3 + i % 7;
        int *prompt = xmalloc(sizeof(int) * len);
        for (int t = 0; t < len; t++) prompt[t] = 1 + (int)(splitmix64_next(&rng) % (uint64_t)(V - 1));
        if (i % mesh->dp != mesh->dp_rank) { free(prompt); continue; }
        Seq *s = &r->seqs[r->n++];
        free(s->prompt);
        seq_free(s);
        memset(s, 0, sizeof(*s));
        s->index = i;
        s->prompt = prompt;
        s->n_prompt = len;
        s->sp = g_sp;
        s->sp.seed = 1000 + (uint64_t)i;
        s->max_new = MAX_NEW;
        seq_alloc_results(s);
    }
}

static void generate(Run *r, Engine *e) {
    char err[256];
    for (int i = 0; i < r->n; i++) CHECK(engine_add(e, &r->seqs[i], err, sizeof err) == 0);
    engine_run(e);
}

/* The sequences in reverse order, two per micro-batch, targets on the generated tokens. */
static void train_batches(Run *r) {
    int cap = r->cap;
    r->M = (r->n + 1) / 2;
    r->n_targets = 0;
    for (int b = 0; b < r->M; b++) {
        int *tok = r->tokens + b * cap, *tg = r->targets + b * cap, *st = r->starts + b * 3, k = 0, T = 0;
        st[0] = 0;
        for (int j = 0; j < 2; j++) {
            int i = r->n - 1 - (2 * b + j);
            r->which[2 * b + j] = i;
            if (i < 0) continue;
            const Seq *s = &r->seqs[i];
            int L = s->n_prompt + s->n_out;
            for (int p = 0; p < L; p++) {
                tok[T + p] = p < s->n_prompt ? s->prompt[p] : s->out[p - s->n_prompt];
                /* position p predicts token p + 1: a generated one from the prompt's last position on */
                tg[T + p] = p + 1 >= s->n_prompt && p + 1 < L ? s->out[p + 1 - s->n_prompt] : -1;
                r->n_targets += tg[T + p] >= 0;
            }
            T += L;
            st[++k] = T;
        }
        r->mbs[b] = (MicroBatch){tok, st, k, tg, NULL, r->lps + b * cap};
    }
}
/* one 1F1B step over them with the hook, gradients from zero */
static void train_step(Run *r, const LossHook *hook) {
    memset(r->grads, 0, sizeof(float) * r->m->n_params);
    schedule_1f1b(r->m, r->slots, r->n_slots, r->mbs, r->M, hook, &r->gs);
}

/* last stage: every generated token's logprob, generation vs the hook's; returns mismatches */
static int compare(Run *r, const Mesh *mesh, const char *what, int *compared) {
    int fail = 0;
    double worst = 0.0;
    *compared = 0;
    if (!r->m->is_last) return 0;
    for (int b = 0; b < r->M; b++) {
        int T = 0;
        for (int j = 0; j < 2; j++) {
            int i = r->which[2 * b + j];
            if (i < 0) continue;
            const Seq *s = &r->seqs[i];
            for (int g = 0; g < s->n_out; g++) {
                float train = r->lps[b * r->cap + T + s->n_prompt - 1 + g], gen = s->lp[g];
                (*compared)++;
                if (memcmp(&train, &gen, sizeof(float))) {
                    double d = fabs((double)train - gen);
                    if (d > worst) worst = d;
                    if (fail++ < 3) printf("%s: prompt %d token %d: generation %a training %a\n", what, s->index, g, gen, train);
                }
            }
            T += s->n_prompt + s->n_out;
        }
    }
    printf("[tp %d/%d pp %d dp %d/%d] %s: %d generated tokens, training logprobs %s generation's", mesh->tp_rank,
           mesh->tp, mesh->pp, mesh->dp_rank, mesh->dp, what, *compared, fail ? "DIFFER from" : "bit-identical to");
    if (fail) printf(" (max |diff| %.3g)  FAIL", worst);
    printf("\n");
    return fail;
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    if (argc < 2) { fprintf(stderr, "usage: test_exact MODEL_DIR [TP PP]\n"); return 2; }
    int tp = argc > 3 ? atoi(argv[2]) : 1, pp = argc > 3 ? atoi(argv[3]) : 1;
    backend_set_threads(1);
    if (getenv("TANDEM_TEST_TEMPERATURE")) g_T = (float)atof(getenv("TANDEM_TEST_TEMPERATURE"));
    sampling_params_default(&g_sp);
    g_sp.temperature = g_T;
    const char *tr = getenv("TANDEM_TEST_TRUNCATE");
    if (tr && *tr) {
        CHECK(sscanf(tr, "%d,%f,%f", &g_sp.top_k, &g_sp.top_p, &g_sp.min_p) == 3 && !sampling_params_check(&g_sp));
        g_trunc = sampler_truncates(&g_sp);
        CHECK(g_trunc);
    }
    Mesh mesh;
    Comm world = comm_world();   /* this command's meshes span the job */
    mesh_init(&mesh, &world, tp, pp);
    comm_free(&world);
    Model m;
    model_load(&m, argv[1], &mesh, DTYPE_F32, backend_default());
    Run r = {.m = &m, .max_len = 9 + MAX_NEW};
    seqs_reset(&r, &mesh);
    r.cap = 2 * r.max_len;
    int nb = (N_PROMPTS + 1) / 2;
    r.mbs = xcalloc(nb, sizeof(MicroBatch));
    r.tokens = xmalloc(sizeof(int) * nb * r.cap);
    r.targets = xmalloc(sizeof(int) * nb * r.cap);
    r.starts = xmalloc(sizeof(int) * nb * 3);
    r.which = xmalloc(sizeof(int) * nb * 2);
    r.lps = xmalloc(sizeof(float) * nb * r.cap);
    r.n_slots = pp < nb ? pp : nb;
    r.slots = xcalloc(r.n_slots, sizeof(TrainActs));
    for (int i = 0; i < r.n_slots; i++) train_acts_init(&r.slots[i], &m, r.cap, r.max_len, 0);
    OptimConfig oc = optim_config_default();
    oc.lr = 1e-2;
    oc.warmup = 0;
    oc.total_steps = 1;
    Optim *o = optim_new(&m, &mesh, oc);
    r.grads = xcalloc(optim_grad_floats(o), sizeof(float));
    r.gl = xcalloc(m.n_layers_local, sizeof(LayerWeights));
    model_weights_place(&m, r.grads, &r.gs.w, r.gl);

    /* round 1: generate, then the training step's logprobs */
    EngineConfig ec = {3, 64, 0, 4, m.cfg.max_pos, pp, 1, NULL, NULL, NULL, NULL, 64, g_T, g_trunc};
    const SamplingParams *trunc = g_trunc ? &g_sp : NULL;
    Engine *e = engine_new(&m, &ec, r.max_len);
    generate(&r, e);
    LossHook rec = {record, NULL, g_T, 0.0f, NULL, trunc};
    train_batches(&r);
    train_step(&r, &rec);
    int c1, c2, fail = compare(&r, &mesh, "round 1", &c1);
    float first1[N_PROMPTS];
    for (int i = 0; i < r.n; i++) first1[i] = r.seqs[i].lp[0];

    /* one optimizer step: the weights change in place under the engine */
    comm_all_reduce_sum_int(&mesh.dp_comm, &r.n_targets, 1);   /* the step's token mean over dp */
    LossHook rl = {reinforce, &r.n_targets, g_T, 0.0f, NULL, trunc};
    train_step(&r, &rl);
    optim_step(o, &m, r.grads);

    /* round 2 on the same engine, then on a fresh one: the same tokens and bits */
    seqs_reset(&r, &mesh);
    generate(&r, e);
    int *out2 = xmalloc(sizeof(int) * N_PROMPTS * MAX_NEW), moved = 0;
    float *lp2 = xmalloc(sizeof(float) * N_PROMPTS * MAX_NEW);
    int n_out2[N_PROMPTS];
    for (int i = 0; i < r.n; i++) {
        n_out2[i] = r.seqs[i].n_out;
        memcpy(out2 + i * MAX_NEW, r.seqs[i].out, sizeof(int) * r.seqs[i].n_out);
        memcpy(lp2 + i * MAX_NEW, r.seqs[i].lp, sizeof(float) * r.seqs[i].n_out);
        moved += memcmp(&first1[i], &r.seqs[i].lp[0], sizeof(float)) != 0;
    }
    seqs_reset(&r, &mesh);
    Engine *fresh = engine_new(&m, &ec, r.max_len);
    generate(&r, fresh);
    int same = 1;
    for (int i = 0; i < r.n; i++)
        same &= n_out2[i] == r.seqs[i].n_out && !memcmp(out2 + i * MAX_NEW, r.seqs[i].out, sizeof(int) * n_out2[i]) &&
                !memcmp(lp2 + i * MAX_NEW, r.seqs[i].lp, sizeof(float) * n_out2[i]);
    if (m.is_last)
        printf("round 2 after an optimizer step (%d of %d first-token logprobs moved): the reused engine's tokens and "
               "logprobs %s a fresh engine's%s\n", moved, r.n, same ? "equal" : "DIFFER from",
               same && (moved || g_sp.top_k == 1) ? "" : "  FAIL");
    fail += !same || (!moved && g_sp.top_k != 1);   /* top-k 1: every logprob is 0, and so its gradient */
    train_batches(&r);
    train_step(&r, &rec);
    fail += compare(&r, &mesh, "round 2", &c2);
    int zeros = 0, n_gen = 0;   /* logprobs exactly 0 (a kept set of one token) */
    for (int i = 0; i < r.n; i++)
        for (int g = 0; g < r.seqs[i].n_out; g++) zeros += r.seqs[i].lp[g] == 0.0f, n_gen++;
    if (m.is_last && !fail && c1 && c2) {
        printf("ok: exact tp=%d pp=%d dp=%d T=%g", tp, pp, mesh.dp, g_T);
        if (g_trunc) printf(" truncated (top-k %d top-p %g min-p %g): %d of %d logprobs exactly 0", g_sp.top_k, g_sp.top_p, g_sp.min_p, zeros, n_gen);
        printf("\n");
    }
    fflush(stdout);

    int any = fail || (m.is_last && (c1 == 0 || c2 == 0));
    comm_all_reduce_sum_int(&mesh.group, &any, 1);
    engine_free(e);
    engine_free(fresh);
    for (int i = 0; i < r.n; i++) { free(r.seqs[i].prompt); seq_free(&r.seqs[i]); }
    for (int i = 0; i < r.n_slots; i++) train_acts_free(&r.slots[i]);
    free(r.slots); free(r.mbs); free(r.tokens); free(r.targets); free(r.starts); free(r.which); free(r.lps);
    free(r.grads); free(r.gl); free(out2); free(lp2);
    optim_free(o);
    model_free(&m);
    mesh_free(&mesh);
    comm_finalize();
    return any ? 1 : 0;
}
