/* bench.c — `tandem bench --model DIR`: prefill throughput (forward over B sequences of T tokens,
 * logits included) and peak resident memory, on any tp x pp layout; --generate decode, --train a
 * training step (LM cross-entropy, or with --score a reward model's Bradley–Terry loss), --tokenizer
 * encode speed. Reports the median of --iters timed runs after one warm-up. Random token ids: speed
 * does not depend on the text. */
#include "bench/bench.h"
#include "bench/probe.h"
#include "runtime/lora.h"
#include "rlhf/pref_loss.h"
#include "generate/engine.h"
#include "train/grad.h"
#include "train/learner.h"
#include "kernels/cpu/cpu.h"   /* on purpose: times cpu_matmul and the FMA peak directly */
#include "runtime/args.h"
#include "runtime/comm.h"
#include "runtime/device.h"
#include "runtime/mesh.h"
#include "runtime/model.h"
#include "runtime/session.h"
#include "runtime/util.h"
#include "tokenizer/tokenizer.h"
#include <omp.h>
#include <stdlib.h>
#include <string.h>

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

/* Copy bandwidth (bytes copied per second, counted once) over a buffer far larger than the L3,
 * with the run's threads: the yardstick for batch-1 decode, which must stream every weight once
 * per token. Best of 5. */
static double copy_bandwidth_gbs(void) {
    size_t n = (size_t)256 << 20;
    char *a = xmalloc(n), *b = xmalloc(n);
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_seconds();
#pragma omp parallel
        {
            int nt = omp_get_num_threads(), id = omp_get_thread_num();
            size_t chunk = n / nt;
            memcpy(b + id * chunk, a + id * chunk, id == nt - 1 ? n - id * chunk : chunk);
        }
        double gbs = n / (now_seconds() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    free(a);
    free(b);
    return best;
}

/* Adds B random prompts of P tokens asking for T greedy tokens (EOS ignored) and runs them. */
static void decode_batch(Engine *e, const Model *m, Seq *seqs, int B, int P, int T, unsigned *rng) {
    for (int b = 0; b < B; b++) {
        Seq *s = &seqs[b];
        memset(s, 0, sizeof(*s));
        s->index = b;
        s->n_prompt = P;
        s->prompt = xmalloc(sizeof(int) * P);
        for (int i = 0; i < P; i++) { *rng = *rng * 1103515245u + 12345u; s->prompt[i] = (int)((*rng >> 8) % (unsigned)m->cfg.vocab_size); }
        sampling_params_default(&s->sp);
        s->sp.temperature = 0.0f;
        s->max_new = T;
        seq_alloc_results(s);
        char err[256];
        if (engine_add(e, s, err, sizeof err)) user_error("bench: %s", err);
    }
    engine_run(e);
    for (int b = 0; b < B; b++) { free(seqs[b].prompt); seq_free(&seqs[b]); }
}

/* Decode throughput at batch B, steady state: a warm-up batch of the same length first touches
 * every KV block and activation buffer the measured one will use (page faults are not decode: a
 * first touch of a 2 MiB page cost this VM up to 1 ms of a 9 ms batch-32 step, and the freed
 * blocks go back to the top of the free stack, so the measured batch gets the same ones), then the
 * measured batch on the same engine; decode and prefill tokens/s come from the engine's step
 * timers, warm-up subtracted. */
static EngineStats bench_decode(Model *m, int B, int P, int T) {
    size_t blocks = (size_t)B * ((P + T + 15) / 16 + 1);
    EngineConfig ec = {B, 4096, 0, 16, m->cfg.max_pos, 1, 0, NULL, NULL, NULL, NULL, (int)blocks, 0, 0};
    Engine *e = engine_new(m, &ec, P + T);
    Seq *seqs = xcalloc(B, sizeof(Seq));
    unsigned rng = 777;
    decode_batch(e, m, seqs, B, P, T, &rng);
    EngineStats w = engine_stats(e);
    decode_batch(e, m, seqs, B, P, T, &rng);
    EngineStats st = engine_stats(e);
    st.prefill_tokens -= w.prefill_tokens; st.prefill_s -= w.prefill_s;
    st.decode_tokens -= w.decode_tokens; st.decode_s -= w.decode_s;
    st.steps -= w.steps;
    free(seqs);
    engine_free(e);
    return st;
}

/* The matmul kernel's FLOP/s at batch N with its weights hot in L2 (n_out rows of K = dim, shared by
 * the threads): the most that batched decode can reach, so batch-B decode is also reported against
 * peak / (2 flops x matmul weight per token). Best of 5 sweeps of 64 calls. */
static double matmul_peak_gflops(const Backend *be, int N, int K) {
    int O = 256;
    float *w = xmalloc(sizeof(float) * O * K), *x = xmalloc(sizeof(float) * N * K);
    for (size_t i = 0; i < (size_t)O * K; i++) w[i] = (float)(i % 13) * 0.01f;
    for (size_t i = 0; i < (size_t)N * K; i++) x[i] = (float)(i % 7) * 0.01f;
    float *dw = be->alloc(sizeof(float) * O * K), *dx = be->alloc(sizeof(float) * N * K), *dy = be->alloc(sizeof(float) * N * O);
    be->to_device(dw, w, sizeof(float) * O * K);
    be->to_device(dx, x, sizeof(float) * N * K);
    double best = 0;
    for (int rep = 0; rep < 6; rep++) {
        be->sync();
        double t0 = now_seconds();
        for (int it = 0; it < 64; it++) be->matmul(dy, dx, dw, NULL, DTYPE_F32, N, K, O, 1);
        be->sync();
        double gf = 64 * 2.0 * N * K * O / (now_seconds() - t0) / 1e9;
        if (rep > 0 && gf > best) best = gf;   /* rep 0 warms the caches */
    }
    be->free(dw); be->free(dx); be->free(dy);
    free(w); free(x);
    return best;
}

/* The fp32 FMA peak with the run's threads: 2 flops per FMA of cpu_fma_chains. Best of 3. */
static double fma_peak_gflops(void) {
    const long iters = 20 * 1000 * 1000;
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now_seconds();
        float sink;
        int fmas = cpu_fma_chains(iters, &sink);
        double gf = 2.0 * fmas * iters * omp_get_max_threads() / (now_seconds() - t0) / 1e9;
        if (gf > best) best = gf;
    }
    return best;
}

/* Batch 1 and batch `big`, alternated for `rounds` rounds so that both see the same machine (this
 * one's memory bandwidth drifts between about 33 and 60 GB/s from minute to minute). Each round
 * measures the read bandwidth right before its batch-1 run, so batch 1 is compared with the bound
 * of its own round; medians are reported, and the range of the per-round speedups. */
static int bench_generate(Model *m, int threads, int P, int T, int big, int rounds) {
    /* On a device the roofline is its copy bandwidth (read + write), and the hardware FMA peak is
     * not measured (fma_peak_gflops times host cores) */
    int host = !m->be->owns;   /* host memory */
    double copy = host ? copy_bandwidth_gbs() : bench_device_copy_gbs(m->be);
    /* bytes of weights streamed per decode token: every matrix and norm; an untied embedding table
     * is only looked up (one row), a tied one is read whole as the lm head */
    double es = (double)dtype_size(m->dtype), n_read = m->n_params - (m->cfg.tie_embeddings ? 0.0 : (double)m->vocab_local * m->cfg.dim);
    double bytes = es * n_read;
    double peak = matmul_peak_gflops(m->be, big, m->cfg.dim), ceiling = peak * 1e9 / (2.0 * n_read);
    /* and the hardware's: the fp32 FMA peak over the same multiply-adds, whatever the kernel */
    double fma = host ? fma_peak_gflops() : 0, fma_ceiling = fma * 1e9 / (2.0 * n_read);
    double *bw = xmalloc(sizeof(double) * rounds), *d1 = xmalloc(sizeof(double) * rounds);
    double *db = xmalloc(sizeof(double) * rounds), *pf = xmalloc(sizeof(double) * rounds);
    double *ratio = xmalloc(sizeof(double) * rounds), *frac = xmalloc(sizeof(double) * rounds);
    double *hw = xmalloc(sizeof(double) * rounds);   /* per round: fma_ceiling / batch 1 */
    for (int r = 0; r < rounds; r++) {
        bw[r] = host ? bench_read_bandwidth_gbs() : bench_device_copy_gbs(m->be);
        EngineStats s1 = bench_decode(m, 1, P, T), sb = bench_decode(m, big, P, T);
        d1[r] = s1.decode_tokens / s1.decode_s;
        db[r] = sb.decode_tokens / sb.decode_s;
        pf[r] = sb.prefill_tokens / sb.prefill_s;
        ratio[r] = db[r] / d1[r];
        frac[r] = d1[r] / (bw[r] * 1e9 / bytes);
        hw[r] = fma_ceiling / d1[r];
    }
    double mbw = bench_median(bw, rounds), bound = mbw * 1e9 / bytes, m1 = bench_median(d1, rounds), mb = bench_median(db, rounds);
    double mpf = bench_median(pf, rounds), mfrac = bench_median(frac, rounds);
    bench_median(ratio, rounds);   /* sorted: ratio[0] and ratio[rounds - 1] are the extremes */
    bench_median(hw, rounds);
    if (mesh_is_root(m->mesh)) {
        printf("%s bandwidth %.1f-%.1f GB/s, median %.1f (copy %.1f); weights %.1f MB per token -> batch-1 bound %.1f tokens/s\n",
               host ? "read" : "device copy (read + write)", bw[0], bw[rounds - 1], mbw, copy, bytes / 1e6, bound);
        printf("median of %d rounds: decode batch 1: %.1f tokens/s (%.0f%% of its round's bound); batch %d: %.1f tokens/s "
               "(%.2fx batch 1; per round %.2f-%.2fx); prefill %.1f tokens/s\n",
               rounds, m1, 100 * mfrac, big, mb, mb / m1, ratio[0], ratio[rounds - 1], mpf);
        printf("compute ceiling: matmul %.1f GFLOP/s hot at batch %d -> %.1f tokens/s (%.2fx batch 1); batch %d reaches %.0f%% of it\n",
               peak, big, ceiling, ceiling / m1, big, 100 * mb / ceiling);
        if (host) printf("hardware ceiling: fp32 FMA peak %.1f GFLOP/s -> %.1f tokens/s at any batch (%.2fx batch 1; per round "
               "%.2f-%.2fx); batch %d reaches %.0f%% of it\n",
               fma, fma_ceiling, fma_ceiling / m1, hw[0], hw[rounds - 1], big, 100 * mb / fma_ceiling);
        printf("{\"bench\": \"generate\", \"device\": \"%s\", \"dtype\": \"%s\", \"threads\": %d, \"prompt\": %d, \"new_tokens\": %d, \"rounds\": %d, "
               "\"read_gb_s\": %.2f, \"copy_gb_s\": %.2f, \"weight_mb_per_token\": %.6g, \"bound_tokens_per_s\": %.1f, "
               "\"decode_b1_tokens_per_s\": %.1f, \"fraction_of_bound\": %.3f, \"decode_b%d_tokens_per_s\": %.1f, "
               "\"batch_speedup\": %.2f, \"batch_speedup_min\": %.2f, \"batch_speedup_max\": %.2f, "
               "\"matmul_peak_gflops\": %.6g, \"compute_ceiling_tokens_per_s\": %.1f, "
               "\"fma_peak_gflops\": %.6g, \"fma_ceiling_tokens_per_s\": %.1f, \"fma_ceiling_speedup_min\": %.2f, "
               "\"fma_ceiling_speedup_max\": %.2f, "
               "\"prefill_tokens_per_s\": %.1f, \"peak_rss_mib\": %.1f}\n",
               m->be->name, dtype_name(m->dtype), threads, P, T, rounds, mbw, copy, bytes / 1e6, bound, m1, mfrac, big, mb, mb / m1, ratio[0],
               ratio[rounds - 1], peak, ceiling, fma, fma_ceiling, hw[0], hw[rounds - 1], mpf, peak_rss_mib());
    }
    free(bw); free(d1); free(db); free(pf); free(ratio); free(frac); free(hw);
    return 0;
}

/* The load's memory (stderr, rank 0, once the run goes ahead): the peak RSS right after loading against
 * the weights held. Each tensor is read from the mapped file into the arena, converted, and its mapped
 * pages released, so the two are about equal. */
static void print_load(const Model *m, double load_rss) {
    double w_mib = (double)m->n_params * dtype_size(m->dtype) / 1048576.0;
    if (m->mesh->rank == 0)
        fprintf(stderr, "{\"bench\": \"load\", \"dtype\": \"%s\", \"weights_mib\": %.1f, \"peak_rss_mib\": %.1f, "
                "\"peak_over_weights\": %.3f}\n", dtype_name(m->dtype), w_mib, load_rss, load_rss / w_mib);
}

/* Training step throughput: B random sequences of T tokens, forward + backward + AdamW, median of
 * iters steps after one warm-up; the activation arena and the peak RSS (run --recompute full and
 * none in separate processes to compare peaks). The loss is the hook's: LOSS_XENT (next-token loss
 * on every position, LM head) or loss_bt (score head, sequences 2i / 2i+1 a pair, as `tandem rm`
 * trains). targets and weight are the LM's; a score head ignores them. */
/* A MoE model's grouped GEMMs, counted: one training step through a copy of the backend whose
 * matmul, matmuls and matmul_backward count their calls. runtime/moe.c and train/moe_grad.c call
 * them per expert (over all its tokens), so the count per layer is bounded by a few calls per
 * expert whatever the batch; one GEMM per token would be N k per projection. */
static const Backend *count_be;
static long count_calls;
static void count_matmul(float *out, const float *x, const void *w, const void *bias, DType wt, int N, int n_in, int n_out,
                         int leaves) {
    count_calls++;
    count_be->matmul(out, x, w, bias, wt, N, n_in, n_out, leaves);
}
static void count_matmuls(const float *x, int N, int n_in, const MatmulOut *outs, int n, DType wt) {
    count_calls++;
    count_be->matmuls(x, N, n_in, outs, n, wt);
}
static void count_matmul_backward(float *dx, float *dw, float *db, const float *dout, const float *x, const void *w,
                                  DType wt, int N, int n_in, int n_out) {
    count_calls++;
    count_be->matmul_backward(dx, dw, db, dout, x, w, wt, N, n_in, n_out);
}
static double moe_matmul_calls_per_layer(Learner *L, Model *m, const MicroBatch *mb, const LossHook *hook) {
    Backend counting = *m->be;
    counting.matmul = count_matmul;
    counting.matmuls = count_matmuls;
    counting.matmul_backward = count_matmul_backward;
    count_be = m->be;
    count_calls = 0;
    m->be = &counting;
    learner_step(L, mb, 1, hook);
    m->be = count_be;
    return m->n_layers_local ? (double)count_calls / m->n_layers_local : 0.0;
}

static int bench_train(Model *m, const Mesh *mesh, double load_rss, int B, int T, int iters, const char *recompute,
                       int sp, int zero, int threads, int plan_only, int lora_r) {
    if (strcmp(recompute, "none") && strcmp(recompute, "full")) user_error("--recompute: none or full");
    if (sp && mesh->tp < 2) user_error("--sequence-parallel: needs --tp > 1 (it shares the tp ranks' rows)");
    if (zero < 0 || zero > 3) user_error("--zero %d: must be 0, 1, 2 or 3", zero);
    if (lora_r < 0) user_error("--lora-r %d: must be >= 0", lora_r);
    if (m->head == HEAD_SCORE && B % 2)   /* --score, or a *ForSequenceClassification directory */
        user_error("bench --train --score: --batch %d is odd (sequences 2i and 2i+1 are a chosen/rejected pair)", B);
    int flags = (!strcmp(recompute, "full") ? TRAIN_RECOMPUTE : 0) | (sp ? TRAIN_SEQ_PARALLEL : 0);
    /* each pair weighs 1 / (B / 2): the step's loss is the mean over this rank's pairs, as
     * LOSS_XENT's weights give the mean over its tokens (optim_step averages over dp) */
    PrefHook ph = {.pair_weight = 2.0 / B};
    LossHook bt = {loss_bt, &ph, 1.0f, 0.0f, NULL, NULL};
    const LossHook *hook = m->head == HEAD_SCORE ? &bt : &LOSS_XENT;
    print_load(m, load_rss);
    int N = B * T;
    OptimConfig oc = optim_config_default();
    oc.lr = 1e-4;
    oc.zero = zero;
    if (lora_r) {   /* LoRA on every projection, alpha 2 r */
        int all[LORA_TARGETS] = {1, 1, 1, 1, 1, 1, 1};
        lora_new(m, lora_r, 2.0 * lora_r, 0, all, 1);
    }
    Learner L;
    learner_init(&L, m, oc, N, T, 1, flags);
    model_print_summary(m);   /* names the device */
    MemPlan plan = model_mem_plan(m);
    learner_mem_plan(&L, &plan);
    model_print_memory_plan(m, &plan);
    if (plan_only) {   /* nothing of the optimizer, the gradients or the activations was touched yet */
        float mine[6] = {(float)plan.weights, (float)plan.master, (float)plan.grads, (float)plan.moments, (float)plan.acts, 0};
        for (int k = 0; k < 5; k++) mine[5] += mine[k];
        comm_all_reduce_max(&mesh->group, mine, 6);   /* each kind's largest rank */
        float pk = (float)peak_rss_mib();
        comm_all_reduce_max(&mesh->group, &pk, 1);
        if (mesh_is_root(mesh))
            printf("{\"bench\": \"train_plan\", \"lora_r\": %d, \"dtype\": \"%s\", \"tp\": %d, \"pp\": %d, \"dp\": %d, \"zero\": %d, "
                   "\"sequence_parallel\": %s, \"batch\": %d, \"seq\": %d, \"weights_mib\": %.1f, \"master_mib\": %.1f, "
                   "\"grads_mib\": %.1f, \"moments_mib\": %.1f, \"activations_mib\": %.1f, \"total_mib\": %.1f, "
                   "\"peak_rss_mib\": %.1f}\n", lora_r, dtype_name(m->dtype), mesh->tp, mesh->pp, mesh->dp, zero,
                   L.slots[0].sp ? "true" : "false", B, T, mine[0] / 1048576, mine[1] / 1048576, mine[2] / 1048576,
                   mine[3] / 1048576, mine[4] / 1048576, mine[5] / 1048576, pk);
        learner_free(&L);
        return 0;
    }
    int *tokens = xmalloc(sizeof(int) * N), *start = xmalloc(sizeof(int) * (B + 1)), *targets = xmalloc(sizeof(int) * N);
    float *weight = xmalloc(sizeof(float) * N);
    unsigned rng = 4242;
    for (int i = 0; i < N; i++) { rng = rng * 1103515245u + 12345u; tokens[i] = (int)((rng >> 8) % (unsigned)m->cfg.vocab_size); }
    for (int b = 0; b <= B; b++) start[b] = b * T;
    for (int i = 0; i < N; i++) {
        targets[i] = (i + 1) % T ? tokens[i + 1] : -1;
        weight[i] = 1.0f / (float)(B * (T - 1));
    }
    float pk_before = (float)peak_rss_mib();   /* the load's (and ZeRO-3's slicing) */
    peak_rss_reset();                          /* steps_peak_rss_mib: the steps' own peak */
    double *times = xmalloc(sizeof(double) * iters), loss = 0;
    MicroBatch mb = {tokens, start, B, targets, weight, NULL};
    double dp0 = 0, tp0 = 0, ep0 = 0, edp0 = 0;   /* bytes sent before the timed steps */
    for (int it = -1; it < iters; it++) {
        comm_barrier(&mesh->group);
        if (it == 0) dp0 = comm_bytes_sent(&mesh->dp_comm), tp0 = comm_bytes_sent(&mesh->tp_comm);
        if (it == 0) ep0 = comm_bytes_sent(&mesh->ep_comm), edp0 = comm_bytes_sent(&mesh->edp_comm);
        double t0 = now_seconds();
        loss = learner_step(&L, &mb, 1, hook).loss;
        m->be->sync();   /* the update is queued after the norm came back */
        comm_barrier(&mesh->group);
        if (it >= 0) times[it] = now_seconds() - t0;
    }
    double med = bench_median(times, iters);
    /* bytes a rank sends per step over dp and tp, against Psi = this replica's parameters in fp32
     * bytes (the ZeRO paper: plain DP and ZeRO-1/2 send 2 Psi (P-1)/P, ZeRO-3 3 Psi (P-1)/P) */
    double dp_b = (comm_bytes_sent(&mesh->dp_comm) - dp0) / iters, tp_b = (comm_bytes_sent(&mesh->tp_comm) - tp0) / iters;
    double psi = 4.0 * (double)m->n_params;
    /* --ep > 1: the all-to-alls' bytes (the tokens out and back, forward and backward) and the
     * experts' gradient reduction over the expert-data-parallel group, printed after the line's keys */
    double ep_b = (comm_bytes_sent(&mesh->ep_comm) - ep0) / iters, edp_b = (comm_bytes_sent(&mesh->edp_comm) - edp0) / iters;
    char ep_keys[160] = "";
    if (mesh->ep > 1)
        snprintf(ep_keys, sizeof ep_keys, ", \"ep\": %d, \"ep_mib_sent_per_step\": %.3f, \"edp_mib_sent_per_step\": %.3f",
                 mesh->ep, ep_b / (1 << 20), edp_b / (1 << 20));
    float pk[2] = {(float)peak_rss_mib(), 0};
    pk[1] = pk[0];
    if (pk_before > pk[0]) pk[0] = pk_before;
    comm_all_reduce_max(&mesh->group, pk, 2);
    /* after the timing, the bytes and the peaks: one more step, counted */
    double calls = m->cfg.moe != MOE_NONE ? moe_matmul_calls_per_layer(&L, m, &mb, hook) : 0.0;
    if (mesh_is_root(mesh))
        printf("{\"bench\": \"train\", \"batch\": %d, \"seq\": %d, \"threads\": %d, \"recompute\": \"%s\", \"sequence_parallel\": %s, "
               "\"tokens_per_s\": %.1f, \"step_s\": %.4f, \"activations_mib\": %.1f, \"peak_rss_mib\": %.1f, \"steps_peak_rss_mib\": %.1f, "
               "\"last_loss\": %.9g, \"tp\": %d, \"pp\": %d, \"dp\": %d, \"head\": \"%s\", \"zero\": %d, "
               "\"dp_mib_sent_per_step\": %.3f, \"tp_mib_sent_per_step\": %.3f, \"psi_mib\": %.3f, \"dp_sent_per_psi\": %.4f%s}\n",
               B, T, threads, flags & TRAIN_RECOMPUTE ? "full" : "none", L.slots[0].sp ? "true" : "false", N * mesh->dp / med, med, L.slots[0].n_arena * 4.0 / (1 << 20), pk[0], pk[1], loss,
               mesh->tp, mesh->pp, mesh->dp, m->head == HEAD_SCORE ? "score" : "lm", zero, dp_b / (1 << 20),
               tp_b / (1 << 20), psi / (1 << 20), dp_b / psi, ep_keys);
    if (mesh_is_root(mesh) && m->cfg.moe != MOE_NONE)   /* rank 0's layers: one step's matmul calls each, and N k */
        printf("{\"bench\": \"moe_gemms\", \"experts\": %d, \"top_k\": %d, \"tokens_x_k\": %d, "
               "\"matmul_calls_per_layer\": %.1f}\n", m->cfg.n_experts, m->cfg.n_experts_tok, N * m->cfg.n_experts_tok, calls);
    learner_free(&L);
    free(tokens); free(start); free(targets); free(weight); free(times);
    return 0;
}

/* Prefill throughput: B random sequences of T tokens, median of iters forwards after one warm-up,
 * and the peak RSS per rank and in all. */
static int bench_prefill(Model *m, const Mesh *mesh, int batch, int seq, int iters, int threads, const Option *opts,
                         int n_opts) {
    int N = batch * seq;
    model_alloc_state(m, N, seq);
    MemPlan plan = model_mem_plan(m);
    model_print_memory_plan(m, &plan);
    if (mesh_is_root(mesh)) {
        fprintf(stderr, "+------------------------+--------------------------------+\n");
        args_print(opts, n_opts);
        model_print_summary(m);
    }
    int *tokens = xmalloc(sizeof(int) * N), *start = xmalloc(sizeof(int) * (batch + 1));
    unsigned rng = 12345;
    for (int i = 0; i < N; i++) { rng = rng * 1103515245u + 12345u; tokens[i] = (int)((rng >> 8) % (unsigned)m->cfg.vocab_size); }
    for (int b = 0; b <= batch; b++) start[b] = b * seq;
    double *times = xmalloc(sizeof(double) * iters);
    for (int it = -1; it < iters; it++) {
        comm_barrier(&mesh->group);
        double t0 = now_seconds();
        model_forward(m, tokens, start, batch);
        m->be->sync();
        comm_barrier(&mesh->group);
        if (it >= 0) times[it] = now_seconds() - t0;
    }
    double med = bench_median(times, iters);
    double peak = peak_rss_mib(), peak_max = peak;
    comm_all_reduce_sum_f64(&mesh->group, &peak, 1);
    float pm = (float)peak_max;
    comm_all_reduce_max(&mesh->group, &pm, 1);
    if (mesh_is_root(mesh)) {
        printf("prefill: batch %d x seq %d = %d tokens, median %.4f s over %d runs -> %.1f tokens/s\n", batch, seq, N, med,
               iters, N / med);
        printf("peak memory: %.1f MiB max per rank, %.1f MiB all %d ranks\n", pm, peak, mesh->size);
        printf("{\"bench\": \"prefill\", \"device\": \"%s\", \"dtype\": \"%s\", \"batch\": %d, \"seq\": %d, \"tokens_per_s\": %.2f, \"median_s\": %.6f, "
               "\"peak_rss_mib_max_rank\": %.1f, \"peak_rss_mib_total\": %.1f, \"tp\": %d, \"pp\": %d, \"threads\": %d}\n",
               m->be->name, dtype_name(m->dtype), batch, seq, N / med, med, pm, peak, mesh->tp, mesh->pp, threads);
    }
    free(tokens); free(start); free(times);
    return 0;
}

int bench_main(int argc, char **argv) {
    const char *tok_list, *text_path;
    ModelOpen mo = {0};
    int batch, seq, iters, generate, new_tokens, big, train, score, kernels, sp, zero, plan_only, lora_r;
    const char *recompute;
    Option opts[] = {
        {"--model", OPT_MODEL, &mo.dir, NULL, "Hugging Face model directory or Hub id ORG/NAME"},
        {"--tokenizer", OPT_STR, &tok_list, NULL, "tokenizer files/dirs, comma-separated: encode MB/s instead"},
        {"--text", OPT_STR, &text_path, "../shared/assets/data/pretrain/tinyshakespeare.txt", "text for --tokenizer"},
        {"--generate", OPT_FLAG, &generate, NULL, "decode tokens/s at batch 1 and --big-batch vs the bandwidth bound"},
        {"--new-tokens", OPT_INT, &new_tokens, "128", "--generate: tokens generated per sequence"},
        {"--big-batch", OPT_INT, &big, "32", "--generate: the large batch"},
        {"--kernels", OPT_FLAG, &kernels, NULL, "each forward kernel alone at the model's shapes: us, GB/s, TFLOP/s"},
        {"--train", OPT_FLAG, &train, NULL, "training step tokens/s (forward + backward + AdamW) and memory"},
        {"--recompute", OPT_STR, &recompute, "none", "--train: none | full (activation recomputation)"},
        {"--score", OPT_FLAG, &score, NULL, "--train: a reward model (new score head, Bradley-Terry over B/2 pairs)"},
        SEQ_PARALLEL_OPTION(&sp),
        ZERO_OPTION(&zero),
        {"--plan", OPT_FLAG, &plan_only, NULL, "--train: print the memory plan and stop before the first step (no state touched)"},
        {"--lora-r", OPT_INT, &lora_r, "0", "--train: LoRA adapters of this rank on every projection, the base frozen"},
        {"--batch", OPT_INT, &batch, "4", "sequences per forward"},
        {"--seq", OPT_INT, &seq, "128", "tokens per sequence (--kernels: attention_decode's context, default 1024)"},
        {"--iters", OPT_INT, &iters, "5", "timed forwards, or --generate rounds (median reported)"},
        MODEL_OPEN_OPTIONS(&mo),
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
    if (!mo.dir) user_error("bench: --model DIR or --tokenizer FILE is required");
    if (batch < 1 || seq < 1 || iters < 1 || mo.threads < 0) user_error("bench: --batch, --seq, --iters must be >= 1, --threads >= 0");
    if ((score || plan_only) && !train) user_error("bench: --%s is a --train option", score ? "score" : "plan");
    if (generate && !train && !kernels && (new_tokens < 1 || big < 1)) user_error("--new-tokens and --big-batch must be >= 1");
    Mesh mesh;
    Model m;
    mo.score_head = score;   /* a directory's own score head is kept */
    model_open(&mo, &mesh, &m);
    if ((kernels || generate) && !train && mesh.size != 1) user_error("bench --%s runs on one rank", kernels ? "kernels" : "generate");
    /* the load's peak memory, printed by print_load once the options are known good */
    double load_rss = peak_rss_mib();
    int rc;
    if (train) {
        rc = bench_train(&m, &mesh, load_rss, batch, seq, iters, recompute, sp, zero, mo.threads, plan_only, lora_r);
    } else {
        print_load(&m, load_rss);
        rc = kernels ? bench_kernels(&m, iters, args_given(&seq) ? seq : 1024) : generate ? bench_generate(&m, mo.threads, seq, new_tokens, big, iters)
                                                            : bench_prefill(&m, &mesh, batch, seq, iters, mo.threads, opts, n_opts);
    }
    model_free(&m);
    mesh_free(&mesh);
    comm_finalize();
    return rc;
}
