/* test_grad.c — checks behind tests/grad.bats and tests/hook.bats for train/grad.c. Usage:
 *   test_grad MODEL_DIR FIXTURE.json [TP PP]      (under mpirun with TP*PP ranks when > 1)
 * FIXTURE.json is written by tests/fixtures/grad/make_grad_fixtures.py (cross-entropy) or
 * tests/fixtures/hook/make_hook_fixtures.py ("kind": "reinforce": -w A logprob at a temperature;
 * "value_mse": w 0.5 (value - R)^2 on a score head) or make_pref_fixtures.py ("bt": Bradley–Terry
 * on a score model, "dpo": DPO sigmoid / IPO on a causal LM, through rlhf/pref_loss.c's hooks; two
 * pairs, and with 1f1b each pair its own micro-batch): a packed batch of sequences, the loss's inputs, and PyTorch autograd's loss and every parameter gradient (HF names) of HF transformers'
 * model in fp32. Each loss runs through the training step's loss hook. A reinforce fixture with
 * "truncate": {"top_k", "top_p", "min_p"} (make_truncated_fixture.py) runs it under PPO's truncated
 * policy (LossHook.truncate): logprobs, entropy and gradients of the kept sets' renormalised softmax.
 * Every rank:
 *   1. on the last pp stage: train_forward's logits are bit-identical (memcmp) to model_forward's;
 *   2. the loss (train_loss_backward, shared by train_loss_share) matches torch's on every rank, and
 *      the hook's inputs (per-token logprobs or values) match torch's on the last stage; a score
 *      model's last-token values match transformers' pooled *ForSequenceClassification scores;
 *   3. every gradient shard it owns (model_param_infos) matches the same slice of torch's gradient,
 *      cut by the sharding rules of runtime/model.c (padded vocab rows must have zero gradient);
 *   4. replicated gradients (norms on every tp rank; k/v of a replicated kv head) are bit-identical
 *      across the ranks that hold them.
 * Prints one line per tensor with the measured max |diff|, then "ok: grad ..." per rank and exits
 * 0, or names what failed and exits 1. */
#include "runtime/mesh.h"
#include "runtime/model.h"
#include "runtime/adapter.h"
#include "runtime/lora.h"
#include "runtime/util.h"
#include "train/grad.h"
#include "train/schedule.h"
#include "rlhf/pref_loss.h"
#include "kernels/kernels.h"
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tolerance vs torch: |C - torch| <= 1e-5 * max(1, max |ref|) per tensor (and for the loss).
 * Both sides are fp32 from the same fp32 weights and inputs; they differ in summation order
 * (OpenBLAS vs torch's GEMMs, our fixed-lane forward matmul, per-row loops, the order of the tp
 * all-reduce's partial sums) and in libm's expf/cosf vs torch's vectorised ones. Each forward value
 * carries a few ulps (~1e-7 relative); through 2 layers, the lm_head, a softmax over the vocab and
 * the backward chain those errors grow with the network's gain, to ~1e-6 absolute on gradients of
 * size ~0.01..0.6. Measured maxima over the five fixtures and every layout in grad.bats: 1.6e-6
 * (llama_odd_vocab tp=4), loss 5e-7. 1e-5 leaves a 6x margin and still fails any wrong term: a
 * missing or doubled contribution (a skipped all-reduce, a replicated kv head counted twice, a tied
 * use dropped) is of the size of the gradient itself (a dropped tied lm_head use: 0.21). */
#define TOL 1e-5

static int g_fail;
static char g_tag[64];

static const cJSON *item(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v) { fprintf(stderr, "fixture: field %s missing\n", k); exit(1); }
    return v;
}

static int *json_ints(const cJSON *arr, int *n) {
    *n = cJSON_GetArraySize(arr);
    int *x = xmalloc(sizeof(int) * (*n ? *n : 1)), i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) x[i++] = v->valueint;
    return x;
}

/* base64 (RFC 4648, '=' padding) -> bytes; returns the byte count */
static size_t b64_decode(const char *s, unsigned char *out) {
    static signed char tab[256];
    if (!tab['B']) {
        memset(tab, -1, sizeof(tab));
        const char *alpha = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        for (int i = 0; i < 64; i++) tab[(unsigned char)alpha[i]] = (signed char)i;
    }
    size_t n = 0;
    unsigned acc = 0;
    int bits = 0;
    for (; *s && *s != '='; s++) {
        int v = tab[(unsigned char)*s];
        if (v < 0) { fprintf(stderr, "fixture: bad base64 character\n"); exit(1); }
        acc = (acc << 6) | (unsigned)v;
        bits += 6;
        if (bits >= 8) { bits -= 8; out[n++] = (unsigned char)(acc >> bits); }
    }
    return n;
}

/* torch's gradient of `name`: (rows, cols) global, cols 1 for 1-D; NULL if absent */
static float *ref_grad(const cJSON *grads, const char *name, int *rows, int *cols) {
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(grads, name);
    if (!g) return NULL;
    const cJSON *shape = item(g, "shape");
    *rows = cJSON_GetArrayItem(shape, 0)->valueint;
    *cols = cJSON_GetArraySize(shape) > 1 ? cJSON_GetArrayItem(shape, 1)->valueint : 1;
    const char *b64 = item(g, "f32")->valuestring;
    size_t want = sizeof(float) * (size_t)*rows * *cols;
    unsigned char *buf = xmalloc(strlen(b64) * 3 / 4 + 4);
    size_t got = b64_decode(b64, buf);
    if (got != want) { fprintf(stderr, "fixture: %s has %zu bytes, expected %zu\n", name, got, want); exit(1); }
    return (float *)buf;   /* little-endian fp32, as this machine */
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* local shard g (rows, cols) vs ref (R, C) at (r0, c0); rows >= R (padded vocab) must be 0 */
static void compare(const char *name, const float *g, int rows, int cols, const float *ref, int R, int C, int r0,
                    int c0, double *worst_rel) {
    double d = 0.0, mref = 0.0;
    int pad_bad = 0;
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            float got = g[(size_t)i * cols + j];
            if (r0 + i >= R) { pad_bad |= got != 0.0f; continue; }
            double want = ref[(size_t)(r0 + i) * C + c0 + j], e = fabs((double)got - want);
            if (!(e <= d)) d = isnan(e) ? INFINITY : e;
            if (fabs(want) > mref) mref = fabs(want);
        }
    double tol = TOL * (mref > 1.0 ? mref : 1.0);
    int ok = d <= tol && !pad_bad;
    if (d / (mref > 1.0 ? mref : 1.0) > *worst_rel) *worst_rel = d / (mref > 1.0 ? mref : 1.0);
    printf("%s %-48s (%4d,%3d)@(%3d,%3d) max|ref| %-9.3g max|diff| %-9.3g tol %.2g%s%s\n", g_tag, name, rows,
           cols ? cols : 1, r0, c0, mref, d, tol, pad_bad ? "  padded vocab rows not zero" : "", ok ? "" : "  FAIL");
    g_fail |= !ok;
}

/* the copy on rank 0 of c, bit for bit */
static void same_across(const Comm *c, const char *name, const float *g, size_t n) {
    if (c->size == 1) return;
    float *b = xmalloc(sizeof(float) * n);
    memcpy(b, g, sizeof(float) * n);
    comm_broadcast(c, b, sizeof(float) * n, 0);
    if (memcmp(b, g, sizeof(float) * n)) {
        printf("%s %s: replicated gradient differs from the copy on the group's first rank  FAIL\n", g_tag, name);
        g_fail = 1;
    }
    free(b);
}

/* The fixtures' losses as hooks. ctx of a micro-batch: its rows of the per-token inputs. */
typedef struct { const float *a, *b; } HookRows;   /* reinforce: advantages; value_mse: R, weights */
static double hook_reinforce(const MicroBatch *mb, int N, const float *out, float *dout, void *user) {
    (void)user;
    const HookRows *r = mb->ctx;
    double loss = 0.0;
    for (int n = 0; n < N; n++) {
        int on = mb->targets[n] >= 0;
        if (on) loss -= (double)mb->weight[n] * r->a[n] * out[n];
        dout[n] = on ? -mb->weight[n] * r->a[n] : 0.0f;
    }
    return loss;
}
static double hook_value_mse(const MicroBatch *mb, int N, const float *out, float *dout, void *user) {
    (void)user;
    const HookRows *r = mb->ctx;
    double loss = 0.0;
    for (int n = 0; n < N; n++) {
        float e = out[n] - r->a[n];
        loss += 0.5 * (double)r->b[n] * e * e;
        dout[n] = r->b[n] * e;
    }
    return loss;
}

static float *json_floats(const cJSON *arr, int n) {
    float *x = xcalloc(n ? n : 1, sizeof(float));
    int i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) { if (i < n) x[i] = cJSON_IsNumber(v) ? (float)v->valuedouble : NAN; i++; }
    if (i != n) { fprintf(stderr, "fixture: a per-token list has %d entries, expected %d\n", i, n); exit(1); }
    return x;
}

/* the hook's per-token inputs vs torch's (NaN in want: no value there), by the tensors' rule: 1e-5
 * of max(1, max |want|). A logprob is z / T - lse, so its error is that of values of its own size:
 * the reinforce fixtures' logprobs reach -14 at T 0.7 (one fp32 ulp there: 1e-6), where 1.24e-5 was
 * measured (llama_gqa_reinforce_entropy, 2026-11-26, after the forward's sums took the tp-invariant
 * leaves; 1.9e-6 before) while eval's fixtures kept their max |logprob - HF| (4.1e-6 -> 3.3e-6 on
 * llama_gqa); a wrong term (temperature, entropy, a dropped sum) is of the logprob's own size. */
static void compare_outputs(const char *what, const float *got, const float *want, int N) {
    double d = 0.0, mref = 0.0;
    for (int n = 0; n < N; n++) {
        if (isnan(want[n])) continue;
        if (fabs((double)got[n] - want[n]) > d) d = fabs((double)got[n] - want[n]);
        if (fabs(want[n]) > mref) mref = fabs(want[n]);
    }
    double tol = TOL * (mref > 1.0 ? mref : 1.0);
    int ok = d <= tol;
    printf("%s %s (%d) vs torch: max|diff| %.3g tol %.2g%s\n", g_tag, what, N, d, tol, ok ? "" : "  FAIL");
    g_fail |= !ok;
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    if (argc != 3 && argc != 5 && argc != 6) {
        fprintf(stderr, "usage: test_grad MODEL_DIR FIXTURE.json [TP PP [1f1b | epE]]\n");
        return 2;
    }
    int tp = argc >= 5 ? atoi(argv[3]) : 1, pp = argc >= 5 ? atoi(argv[4]) : 1;
    int one_f_one_b = argc == 6 && !strcmp(argv[5], "1f1b");  /* each sequence its own micro-batch, 1F1B */
    /* epE (MoE, cross-entropy without the aux loss): the experts over E of the dp ranks, each of which
     * runs its own block of the fixture's sequences (dp rank d the d-th of dp, n_seqs % dp == 0): an
     * expert's gradient, folded over its sources, is then the union's, the other tensors' and the loss
     * the sum over dp of each rank's (what the optimizer's dp reduction adds). A source's rows sent to
     * or returned from the wrong rank, or paired with another source's in the backward, changes it. */
    int ep = argc == 6 && !strncmp(argv[5], "ep", 2) ? atoi(argv[5] + 2) : 1;
    int recompute = getenv("TANDEM_TEST_RECOMPUTE") != NULL;   /* --recompute full: the same numbers */
    backend_set_threads(getenv("OMPI_COMM_WORLD_SIZE") ? 1 : 2);   /* 1 per rank under mpirun */
    Mesh mesh;
    Comm world = comm_world();   /* this command's meshes span the job */
    mesh_init_ep(&mesh, &world, tp, pp, ep);
    comm_free(&world);
    snprintf(g_tag, sizeof g_tag, "[tp %d/%d pp %d/%d]", mesh.tp_rank, tp, mesh.pp_rank, pp);

    size_t len;
    char *text = read_file(argv[2], &len);
    if (!text) { fprintf(stderr, "%s: cannot read\n", argv[2]); return 1; }
    cJSON *fx = cJSON_Parse(text);
    if (!fx) { fprintf(stderr, "%s: not JSON\n", argv[2]); return 1; }
    int N, n_start, n_tgt;
    int *tokens = json_ints(item(fx, "tokens"), &N), *seq_start = json_ints(item(fx, "seq_start"), &n_start);
    int *targets = json_ints(item(fx, "targets"), &n_tgt);
    int n_seqs = n_start - 1, max_seq = 0;
    CHECK(n_tgt == N && seq_start[n_seqs] == N);
    for (int i = 0; i < n_seqs; i++)
        if (seq_start[i + 1] - seq_start[i] > max_seq) max_seq = seq_start[i + 1] - seq_start[i];
    const cJSON *kind_j = cJSON_GetObjectItemCaseSensitive(fx, "kind");
    const char *kind = cJSON_IsString(kind_j) ? kind_j->valuestring : "xent";
    int reinforce = !strcmp(kind, "reinforce"), value_mse = !strcmp(kind, "value_mse");
    int bt = !strcmp(kind, "bt"), dpo = !strcmp(kind, "dpo"), pref = bt || dpo;
    float *weight = xcalloc(N, sizeof(float)), *ha = NULL, *hb = NULL, *want_out = NULL, *margin = NULL;
    double *ref = NULL;
    PrefHook ph = {0};
    const cJSON *ec = cJSON_GetObjectItemCaseSensitive(fx, "entropy_coef");   /* reinforce: an entropy bonus */
    float entropy_coef = cJSON_IsNumber(ec) ? (float)ec->valuedouble : 0.0f;
    const cJSON *tr = cJSON_GetObjectItemCaseSensitive(fx, "truncate");   /* reinforce: a truncated policy */
    SamplingParams trunc;
    sampling_params_default(&trunc);
    if (tr) {
        trunc.top_k = item(tr, "top_k")->valueint;
        trunc.top_p = (float)item(tr, "top_p")->valuedouble;
        trunc.min_p = (float)item(tr, "min_p")->valuedouble;
    }
    if (!value_mse && !pref)
        for (int n = 0; n < N; n++) weight[n] = (float)item(fx, "weight")->valuedouble;
    if (ep > 1) {   /* this dp rank's block of sequences (the loss is a sum of per-token terms) */
        const cJSON *aux = cJSON_GetObjectItemCaseSensitive(fx, "moe_aux_coef");
        if (strcmp(kind, "xent") || aux || n_seqs % mesh.dp) {
            fprintf(stderr, "test_grad: ep > 1 takes a cross-entropy fixture without moe_aux_coef (the aux loss is "
                            "each rank's, not the union's) and a multiple of dp sequences\n");
            return 1;
        }
        int per = n_seqs / mesh.dp, s0 = mesh.dp_rank * per, t0 = seq_start[s0];
        N = seq_start[s0 + per] - t0;
        memmove(tokens, tokens + t0, sizeof(int) * N);
        memmove(targets, targets + t0, sizeof(int) * N);
        max_seq = 0;
        for (int i = 0; i <= per; i++) seq_start[i] = seq_start[s0 + i] - t0;
        for (int i = 0; i < per; i++)
            if (seq_start[i + 1] - seq_start[i] > max_seq) max_seq = seq_start[i + 1] - seq_start[i];
        n_seqs = per;
    }
    LossHook hook = LOSS_XENT;
    if (reinforce) {
        hook = (LossHook){hook_reinforce, NULL, (float)item(fx, "temperature")->valuedouble, entropy_coef, NULL,
                          tr ? &trunc : NULL};
        trunc.temperature = hook.temperature;
        CHECK(!tr || (!sampling_params_check(&trunc) && sampler_truncates(&trunc)));
        ha = json_floats(item(fx, "advantages"), N);
        want_out = json_floats(item(fx, "logprobs"), N);
    } else if (value_mse) {
        hook = (LossHook){hook_value_mse, NULL, 1.0f, 0.0f, NULL, NULL};
        ha = json_floats(item(fx, "value_targets"), N);
        hb = json_floats(item(fx, "value_weights"), N);
        want_out = json_floats(item(fx, "values"), N);
    } else if (pref) {   /* sequences 2i, 2i+1: pair i; the step's loss is the mean over its pairs */
        CHECK(n_seqs % 2 == 0);
        ph.pair_weight = 1.0 / (n_seqs / 2);
        if (bt) {
            hook = (LossHook){loss_bt, &ph, 1.0f, 0.0f, NULL, NULL};
            ph.center = item(fx, "center")->valuedouble;
            margin = json_floats(item(fx, "margin"), n_seqs / 2);
            want_out = xmalloc(sizeof(float) * N);   /* torch's reward at each sequence's last token */
            const float *r = json_floats(item(fx, "rewards"), n_seqs);
            for (int n = 0; n < N; n++) want_out[n] = NAN;
            for (int i = 0; i < n_seqs; i++) want_out[seq_start[i + 1] - 1] = r[i];
            free((void *)r);
        } else {
            hook = (LossHook){loss_dpo, &ph, 1.0f, 0.0f, NULL, NULL};
            ph.type = !strcmp(item(fx, "loss_type")->valuestring, "ipo") ? DPO_IPO : DPO_SIGMOID;
            ph.beta = item(fx, "beta")->valuedouble;
            ph.label_smoothing = item(fx, "label_smoothing")->valuedouble;
            ref = xmalloc(sizeof(double) * n_seqs);
            for (int i = 0; i < n_seqs; i++) ref[i] = cJSON_GetArrayItem(item(fx, "ref"), i)->valuedouble;
            want_out = json_floats(item(fx, "logprobs"), N);
        }
    }
    double ref_loss = item(fx, "loss")->valuedouble;
    const cJSON *grads_ref = item(fx, "grads");

    Model m;
    model_load(&m, argv[1], &mesh, DTYPE_F32, backend_default());
    /* TANDEM_TEST_LORA=DIR: the fixture's adapter (tests/fixtures/lora) trained on the frozen base; the
     * gradients compared are the adapters' (PEFT's names) */
    const char *lora_dir = getenv("TANDEM_TEST_LORA");
    if (lora_dir) {
        const cJSON *lj = item(fx, "lora");
        int all[LORA_TARGETS] = {1, 1, 1, 1, 1, 1, 1};
        lora_new(&m, item(lj, "r")->valueint, item(lj, "alpha")->valuedouble, 0, all, 1);
        lora_load(&m, lora_dir);
    }
    /* TANDEM_TEST_LORA_DROPOUT="P KEY": the adapters' inputs dropped out with that micro-batch key
     * (tests/fixtures/lora/make_lora_dropout_fixture.py draws the same masks) */
    const char *dropout = getenv("TANDEM_TEST_LORA_DROPOUT");
    unsigned long long dkey = 0;
    if (dropout) CHECK(m.lora && sscanf(dropout, "%f %llu", &m.lora->dropout, &dkey) == 2);
    size_t gn = m.lora ? m.lora->n : m.n_params;
    model_alloc_state(&m, N, max_seq);
    TrainActs a;
    train_acts_init(&a, &m, N, max_seq, recompute ? TRAIN_RECOMPUTE : 0);
    a.lora_key = dkey;
    const cJSON *aux = cJSON_GetObjectItemCaseSensitive(fx, "moe_aux_coef");   /* MoE: + the load-balancing loss */
    if (cJSON_IsNumber(aux)) a.moe_aux_coef = (float)aux->valuedouble;
    const cJSON *zc = cJSON_GetObjectItemCaseSensitive(fx, "moe_z_coef");    /* MoE: + the router z-loss */
    if (cJSON_IsNumber(zc)) a.moe_z_coef = (float)zc->valuedouble;

    /* 1. logits: train_forward vs model_forward, bit for bit */
    model_forward(&m, tokens, seq_start, n_seqs);
    train_forward(&m, &a, tokens, seq_start, n_seqs);
    if (m.is_last && !dkey) {   /* (with dropout the training forward is another function) */
        size_t nl = (size_t)N * (m.head == HEAD_SCORE ? 1 : m.vocab_local);
        int same = memcmp(a.logits, m.s.logits, sizeof(float) * nl) == 0;
        printf("%s logits (%d, %d): train_forward %s model_forward%s\n", g_tag, N, m.vocab_local,
               same ? "bit-identical to" : "DIFFERS from", same ? "" : "  FAIL");
        g_fail |= !same;
    }

    /* 2. loss */
    float *garena = xcalloc(gn, sizeof(float));
    GradSink gs = {0};
    LayerWeights *gl = xcalloc(m.n_layers_local, sizeof(LayerWeights));
    if (m.lora) gs.w.layers = gl, gs.lora = garena;   /* the base frozen */
    else model_weights_place(&m, garena, &gs.w, gl);
    float loss;
    HookRows rows_all = {ha, hb};
    PrefCtx pref_all = {margin, ref};
    MicroBatch mb = {tokens, seq_start, n_seqs, targets, weight, pref ? (void *)&pref_all : (void *)&rows_all};
    if (!one_f_one_b) {
        loss = train_loss_share(&m, train_loss_backward(&m, &a, &mb, &hook, &gs));
        if (want_out && m.is_last) {
            compare_outputs(reinforce ? "logprobs at the temperature" : dpo ? "response logprobs" : bt ? "rewards" : "values",
                            a.out, want_out, N);
            const cJSON *hf = cJSON_GetObjectItemCaseSensitive(fx, "hf_scores");
            for (int i = 0; hf && i < n_seqs; i++) {   /* transformers' pooled score = the last token's value */
                double want = cJSON_GetArrayItem(hf, i)->valuedouble, got = a.out[seq_start[i + 1] - 1];
                int ok = fabs(got - want) <= TOL;
                printf("%s sequence %d: score at its last token %.7f, transformers' pooled score %.7f%s\n", g_tag, i, got,
                       want, ok ? "" : "  FAIL");
                g_fail |= !ok;
            }
        }
        train_tied_embedding_all_reduce(&m, &a, &gs.w);
        moe_ep_fold_grads(&m, &gs.w);   /* ep > 1: the sources' expert gradients (schedule_1f1b's does it) */
    } else {
        /* the same batch as micro-batches of one sequence (of one pair for the preference losses)
         * through schedule_1f1b: same loss and gradients up to summation order */
        int per = pref ? 2 : 1, n_mb = n_seqs / per;
        int n_slots = pp < n_mb ? pp : n_mb;
        TrainActs *slots = xcalloc(n_slots, sizeof(TrainActs));
        for (int i = 0; i < n_slots; i++) train_acts_init(&slots[i], &m, N, max_seq, recompute ? TRAIN_RECOMPUTE : 0);
        MicroBatch *mbs = xcalloc(n_mb, sizeof(MicroBatch));
        HookRows *hr = xcalloc(n_mb, sizeof(HookRows));
        PrefCtx *pc = xcalloc(n_mb, sizeof(PrefCtx));
        int (*starts)[3] = xcalloc(n_mb, sizeof(*starts));
        for (int i = 0; i < n_mb; i++) {
            int s0 = i * per, t0 = seq_start[s0];
            for (int k = 0; k <= per; k++) starts[i][k] = seq_start[s0 + k] - t0;
            hr[i] = (HookRows){ha ? ha + t0 : NULL, hb ? hb + t0 : NULL};
            pc[i] = (PrefCtx){margin ? margin + i : NULL, ref ? ref + s0 : NULL};
            mbs[i] = (MicroBatch){tokens + t0, starts[i], per, targets + t0, weight + t0, pref ? (void *)&pc[i] : (void *)&hr[i]};
        }
        loss = schedule_1f1b(&m, slots, n_slots, mbs, n_mb, &hook, &gs);
        for (int i = 0; i < n_slots; i++) train_acts_free(&slots[i]);
        free(slots); free(mbs); free(starts); free(hr); free(pc);
        strncat(g_tag, " 1f1b", sizeof g_tag - strlen(g_tag) - 1);
    }
    if (recompute && !one_f_one_b) {
        /* recompute promises the same numbers, not just torch's within 1e-5: compare bit for bit
         * with a run that keeps every activation */
        float *g2 = xcalloc(gn, sizeof(float));
        GradSink gs2 = {0};
        LayerWeights *gl2 = xcalloc(m.n_layers_local, sizeof(LayerWeights));
        if (m.lora) gs2.w.layers = gl2, gs2.lora = g2;
        else model_weights_place(&m, g2, &gs2.w, gl2);
        TrainActs full;
        train_acts_init(&full, &m, N, max_seq, 0);
        full.lora_key = dkey;
        train_forward(&m, &full, tokens, seq_start, n_seqs);
        float loss2 = train_loss_share(&m, train_loss_backward(&m, &full, &mb, &hook, &gs2));
        train_tied_embedding_all_reduce(&m, &full, &gs2.w);
        moe_ep_fold_grads(&m, &gs2.w);
        int same = memcmp(garena, g2, sizeof(float) * gn) == 0 && loss2 == loss;
        printf("%s recompute: gradients and loss %s the run that keeps every activation%s\n", g_tag,
               same ? "bit-identical to" : "DIFFER from", same ? "" : "  FAIL");
        g_fail |= !same;
        train_acts_free(&full);
        free(g2); free(gl2);
    }
    if (ep > 1) comm_all_reduce_sum(&mesh.dp_comm, &loss, 1);   /* the union's */
    double dl = fabs(loss - ref_loss), ltol = TOL * (fabs(ref_loss) > 1.0 ? fabs(ref_loss) : 1.0);
    printf("%s loss %.7f torch %.7f |diff| %.3g tol %.2g%s\n", g_tag, loss, ref_loss, dl, ltol, dl <= ltol ? "" : "  FAIL");
    g_fail |= !(dl <= ltol);
    if (cJSON_IsNumber(zc) && !one_f_one_b) {   /* the z-loss's value: each stage's layers, summed over pp */
        double z = a.moe_z_sum, zw = item(fx, "z_loss")->valuedouble, zt = TOL * (fabs(zw) > 1.0 ? fabs(zw) : 1.0);
        comm_all_reduce_sum_f64(&mesh.pp_comm, &z, 1);
        printf("%s z_loss %.7f torch %.7f |diff| %.3g tol %.2g%s\n", g_tag, z, zw, fabs(z - zw), zt,
               fabs(z - zw) <= zt ? "" : "  FAIL");
        g_fail |= !(fabs(z - zw) <= zt);
    }

    /* 3. every gradient shard of this rank vs the slice of torch's; 4. replicas identical */
    int n_info = m.lora ? m.lora->n_infos : model_param_infos(&m, NULL, 0);
    ParamInfo *info = xmalloc(sizeof(ParamInfo) * n_info);
    if (m.lora) memcpy(info, m.lora->infos, sizeof(ParamInfo) * n_info);
    else model_param_infos(&m, info, n_info);
    double worst = 0.0;
    for (int i = 0; i < n_info; i++) {
        const ParamInfo *p = &info[i];
        const char *src = p->name;
        /* a tied lm_head on its own stage is the embedding's second copy */
        if (m.cfg.tie_embeddings && strcmp(src, "lm_head.weight") == 0) src = "model.embed_tokens.weight";
        int R, C, r0, c0;
        float *ref = ref_grad(grads_ref, src, &R, &C);
        if (!ref) {
            printf("%s %s: no torch gradient in the fixture  FAIL\n", g_tag, src);
            g_fail = 1;
            continue;
        }
        r0 = p->row0;
        c0 = p->col0;
        if (ep > 1 && p->expert < 0) comm_all_reduce_sum(&mesh.dp_comm, garena + p->offset, p->numel);   /* the union's */
        compare(p->name, garena + p->offset, p->rows, p->cols ? p->cols : 1, ref, R, C, r0, c0, &worst);
        if (p->tp_replicated) same_across(&mesh.tp_comm, p->name, garena + p->offset, p->numel);
        if (ends_with(p->name, "k_proj.weight") || ends_with(p->name, "v_proj.weight") ||
            ends_with(p->name, "k_proj.bias") || ends_with(p->name, "v_proj.bias") ||
            ends_with(p->name, "k_proj.lora_B.weight") || ends_with(p->name, "v_proj.lora_B.weight"))
            same_across(&a.kv_comm, p->name, garena + p->offset, p->numel);
        free(ref);
    }
    printf("%s worst max|diff| / max(1, max|ref|) over tensors: %.3g\n", g_tag, worst);

    int fail = g_fail;
    comm_all_reduce_sum_int(&mesh.group, &fail, 1);
    if (!g_fail) printf("%s ok: grad loss, %d gradient tensors and logits match (%s)\n", g_tag, n_info, argv[1]);
    fflush(stdout);
    free(info);
    free(garena);
    free(gl);
    train_acts_free(&a);
    model_free(&m);
    cJSON_Delete(fx);
    free(text);
    free(tokens); free(seq_start); free(targets); free(weight); free(ha); free(hb); free(want_out);
    free(margin); free(ref);
    mesh_free(&mesh);
    comm_finalize();
    return fail ? 1 : 0;
}
