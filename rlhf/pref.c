/* pref.c — `tandem rm` (reward model: backbone + score head, Bradley–Terry) and `tandem dpo`
 * (policy against a frozen reference) on preference pairs. Both are the shared training loop
 * (train/trainer.h: steps of M micro-batches per dp rank, 1F1B, AdamW / ZeRO, checkpoints,
 * resume) with another loss hook (rlhf/pref_loss.h) and per-pair metrics. A micro-batch holds whole pairs (chosen
 * 2i, rejected 2i + 1: train/data.c's preference mode), so both halves of a pair always meet in
 * one hook call. DPO's reference is a second model on its own mesh over the same ranks (the same
 * layout), loaded from --ref or again from --model and never updated; its logprobs come from the
 * same forward as the policy's, so before the first update they are equal bit for bit.
 * Owns: the two commands' options, the metrics (TRL's names for DPO), the RM's reward statistics
 * on the eval set (saved as "normalize_reward", "mean", "std", OpenRLHF's config keys). rm --score
 * is an inference command: rlhf/score.c. */
#include "rlhf/pref.h"
#include "runtime/lora.h"
#include "kernels/kernels.h"
#include "rlhf/pref_loss.h"
#include "rlhf/score.h"
#include "runtime/args.h"
#include "runtime/util.h"
#include "train/schedule.h"
#include "train/trainer.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int dpo;
    Model *m, *ref;            /* ref: DPO only */
    const Mesh *mesh;
    PrefHook hook;
    LossHook lh;
    int max_tokens;
    float *lse, *lp, *amax_lp; /* (max_tokens) the reference's scores */
    int *amax;
    PrefCtx *ctx;              /* (M) each micro-batch's margins and reference logprobs */
    double *refs;              /* (M, max_tokens) */
    char keys[TRAIN_MAX_METRICS][48]; /* metric names with their prefix */
} Pref;

/* ctx->ref (n_seqs) = the reference's response logprob per sequence (sum; mean for IPO) */
static void reference_logps(Pref *p, const MicroBatch *mb, double *ref) {
    int own = p->ref == p->m;   /* LoRA: the reference is the base, the adapters switched off */
    if (own) p->m->lora->enabled = 0;
    int N = mb->seq_start[mb->n_seqs];
    Scores sc = {p->lse, p->amax, p->amax_lp, p->lp};
    model_score(p->ref, mb->tokens, mb->seq_start, mb->n_seqs, N, NULL, mb->targets, &sc);
    pref_seq_logps(mb->seq_start, mb->n_seqs, mb->targets, p->lp, p->hook.type == DPO_IPO, ref);
    if (own) p->m->lora->enabled = 1;
}

/* The hook's sums, added over dp and sent from the last stage to every rank. */
static PrefStats stats_share(const Mesh *mesh, PrefStats s) {
    comm_all_reduce_sum_f64(&mesh->dp_comm, (double *)&s, PREF_STATS_N);
    comm_broadcast(&mesh->pp_comm, &s, sizeof s, mesh->pp_comm.size - 1);
    return s;
}

/* Forward only over a whole eval set: the hook's sums (its gradients are thrown away). */
static PrefStats evaluate(Pref *p, TrainActs *a, Data *d) {
    const Mesh *mesh = p->mesh;
    data_rewind(d);
    DataBatch b;
    PrefStats keep = p->hook.stats;
    memset(&p->hook.stats, 0, sizeof p->hook.stats);
    double *ref = xmalloc(sizeof(double) * p->max_tokens);
    float *dout = xmalloc(sizeof(float) * p->max_tokens);
    int k = 0;
    for (; data_next_batch(d, &b); k++) {
        if (k % mesh->dp != mesh->dp_rank) continue;
        PrefCtx ctx = {b.margin, ref};
        MicroBatch mb = {b.tokens, b.seq_start, b.n_seqs, b.targets, NULL, &ctx};
        if (p->dpo) reference_logps(p, &mb, ref);
        train_forward(p->m, a, b.tokens, b.seq_start, b.n_seqs);
        const float *out = train_outputs(p->m, a, b.targets, 1.0f);
        if (out) p->lh.fn(&mb, b.n_tokens, out, dout, &p->hook);
    }
    if (k % mesh->dp && mesh->dp_rank >= k % mesh->dp) {   /* ep > 1: no batch in the last round: join its */
        if (p->dpo) moe_idle_pass(p->ref);                  /* exchanges, the reference's and then the policy's */
        moe_idle_pass(p->m);
    }
    free(ref);
    free(dout);
    PrefStats s = stats_share(mesh, p->hook.stats);
    p->hook.stats = keep;
    return s;
}

/* The pair metrics (prefix "" for a step, "eval_" for an eval pass): TRL's names for DPO */
static int pref_metrics(const Pref *p, const PrefStats *s, const char *pre, Metric *out, char (*keys)[48]) {
    double n = s->n_pairs > 0 ? s->n_pairs : 1;
    static const char *const dpo[] = {"loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies",
                                      "rewards/margins", "logps/chosen", "logps/rejected"};
    static const char *const rm[] = {"loss", "accuracy", "margin", "reward_chosen", "reward_rejected"};
    double dv[] = {s->loss / n, s->chosen / n, s->rejected / n, s->correct / n, (s->chosen - s->rejected) / n,
                   s->logp_chosen / n, s->logp_rejected / n};
    double rv[] = {s->loss / n, s->correct / n, (s->chosen - s->rejected) / n, s->chosen / n, s->rejected / n};
    /* the progress line: loss, accuracy, margin */
    const char *line_dpo[] = {"loss %.4f", NULL, NULL, "accuracy %.3f", "margin %.4f", NULL, NULL};
    const char *line_rm[] = {"loss %.4f", "accuracy %.3f", "margin %.4f", NULL, NULL};
    int k = p->dpo ? 7 : 5;
    for (int i = 0; i < k; i++) {
        snprintf(keys[i], sizeof keys[i], "%s%s", pre, p->dpo ? dpo[i] : rm[i]);
        out[i] = (Metric){keys[i], p->dpo ? dv[i] : rv[i], p->dpo ? line_dpo[i] : line_rm[i]};
    }
    return k;
}

/* ---- the training task (train/trainer.h) ------------------------------------------------ */

static void pref_setup(void *ctx, int max_tokens, int max_seq, int M) {
    Pref *p = ctx;
    p->max_tokens = max_tokens;
    p->ctx = xcalloc(M, sizeof(PrefCtx));
    p->refs = xcalloc((size_t)M * max_tokens, sizeof(double));
    if (!p->dpo) return;
    model_alloc_state(p->ref, max_tokens, max_seq);
    p->lse = xmalloc(sizeof(float) * max_tokens); p->lp = xmalloc(sizeof(float) * max_tokens);
    p->amax_lp = xmalloc(sizeof(float) * max_tokens); p->amax = xmalloc(sizeof(int) * max_tokens);
}

/* DPO: the reference's weights and run state count too */
static void pref_mem_plan(void *ctx, MemPlan *plan) {
    Pref *p = ctx;
    if (!p->dpo) return;
    MemPlan rp = model_mem_plan(p->ref);
    if (p->ref != p->m) plan->weights += rp.weights;   /* LoRA: the base is the reference, no copy */
    plan->acts += sizeof(float) * (double)p->ref->s.n_floats;
}

/* each pair weighs dp / (the step's pairs): optim_step's dp mean gives the mean over pairs; DPO's
 * reference logprobs of every micro-batch */
static void pref_prepare_step(void *ctx, Step *st) {
    Pref *p = ctx;
    p->hook.pair_weight = st->n_pairs ? (double)p->mesh->dp / (double)st->n_pairs : 0.0;
    memset(&p->hook.stats, 0, sizeof p->hook.stats);
    for (int i = 0; i < st->n; i++) {
        double *ref = p->refs + (size_t)i * p->max_tokens;
        p->ctx[i] = (PrefCtx){st->margin + (size_t)i * p->max_tokens, ref};
        st->mbs[i].ctx = &p->ctx[i];
        if (p->dpo) reference_logps(p, &st->mbs[i], ref);
    }
}

static int pref_step_metrics(void *ctx, const LearnerStep *r, const Step *st, Metric *out) {
    (void)r; (void)st;
    Pref *p = ctx;
    PrefStats s = stats_share(p->mesh, p->hook.stats);
    return pref_metrics(p, &s, "", out, p->keys);
}

/* An eval pass: its line and metrics; after training the RM saves the eval rewards' mean and std
 * (for normalisation) in its config. */
static void pref_evaluate(void *ctx, TrainActs *a, Data *val, int step, const char *when, MetricsLog *ml) {
    Pref *p = ctx;
    PrefStats s = evaluate(p, a, val);
    int root = mesh_is_root(p->mesh);
    double n = s.n_pairs > 0 ? s.n_pairs : 1;
    if (root)
        fprintf(stderr, "eval %s (step %d): loss %.4f | accuracy %.3f | margin %.4f | chosen %.4f | rejected %.4f (%.0f pairs)\n",
                when, step, s.loss / n, s.correct / n, (s.chosen - s.rejected) / n, s.chosen / n, s.rejected / n, s.n_pairs);
    Metric met[TRAIN_MAX_METRICS];
    int k = pref_metrics(p, &s, "eval_", met, p->keys);
    metrics_begin(ml, step);
    for (int i = 0; i < k; i++) metrics_num(ml, met[i].key, met[i].value);
    metrics_end(ml);
    if (p->dpo || strcmp(when, "after") || s.n_pairs <= 0) return;
    double cnt = 2.0 * s.n_pairs, mean = (s.chosen + s.rejected) / cnt, var = s.sq / cnt - mean * mean;
    Model *m = p->m;
    m->cfg.has_reward_stats = 1;
    m->cfg.reward_mean = (float)mean;
    m->cfg.reward_std = (float)sqrt(var > 1e-12 ? var : 1e-12);
    if (!root) return;
    fprintf(stderr, "eval rewards: mean %.6f std %.6f (saved in config.json: normalize_reward; a LoRA run's in reward_stats.json)\n", mean,
            (double)m->cfg.reward_std);
    metrics_begin(ml, step);
    metrics_num(ml, "eval_reward_mean", mean);
    metrics_num(ml, "eval_reward_std", (double)m->cfg.reward_std);
    metrics_end(ml);
}

/* The policy (dpo; with its frozen reference on a second mesh over the same ranks) or the reward
 * model (rm: a score head, new unless the directory has one), from --resume when given. */
static int load_models(const TrainOptions *o, int dpo, const char *ref_dir, int head_seed, Mesh *mesh, Model *m,
                       Mesh *ref_mesh, Model *ref) {
    const char *start = o->resume && !o->lora_r ? o->resume : o->model_dir;   /* LoRA: the base */
    int own_ref = dpo && o->lora_r && !ref_dir;   /* LoRA's reference: the base, adapters off */
    Comm world = comm_world();
    mesh_init_ep(mesh, &world, o->tp, o->pp, o->ep);
    if (dpo) {
        model_load(m, start, mesh, o->dtype, o->be);
        if (m->head != HEAD_LM) user_error("%s: a score-head model; dpo trains a causal LM", start);
        if (own_ref) {
            comm_free(&world);
            return 1;
        }
        /* the reference: same ranks, its own communicators; the policy's --ep when it has experts, ep 1
         * when dense (nothing to split: a dense reference for a MoE policy is allowed) */
        const char *ref_path = ref_dir ? ref_dir : o->model_dir;
        ModelConfig rc;
        config_load(&rc, ref_path);
        mesh_init_ep(ref_mesh, &world, o->tp, o->pp, rc.moe == MOE_NONE ? 1 : o->ep);
        model_load(ref, ref_path, ref_mesh, o->dtype, o->be);
        if (ref->head != HEAD_LM) user_error("%s: a score-head model; the DPO reference must be a causal LM", ref_path);
        if (ref->cfg.vocab_size != m->cfg.vocab_size)
            user_error("--ref %s: vocabulary %d, the policy's is %d", ref_dir, ref->cfg.vocab_size, m->cfg.vocab_size);
    } else {
        model_load_score(m, start, mesh, (uint64_t)head_seed, o->dtype, o->be);
        if (o->resume && m->score_seed && !o->lora_r)   /* a new head would silently restart the reward model */
            user_error("--resume %s: a causal-LM checkpoint, not a reward model's (no score head)", o->resume);
    }
    comm_free(&world);
    return 0;
}

static int pref_main(int argc, char **argv, int dpo) {
    TrainOptions o = {0};
    const char *ref_dir, *loss_name, *input, *output, *adapter;
    int head_seed, score;
    float center, beta, label_smoothing;
    Option opts[] = {
        {"--model", OPT_MODEL, &o.model_dir, NULL, dpo ? "policy to start from (HF causal LM)" : "backbone to start from (causal LM / SFT or reward-model directory)"},
        {"--data", OPT_STR, &o.data_path, NULL, "preference pairs: jsonl or JSON array (prompt/chosen/rejected, hh-rlhf texts, messages, ShareGPT)"},
        TRAIN_OUT_OPTIONS(&o, "held-out pairs: metrics before, every --eval-every steps, after"),
        {"--score", OPT_FLAG, &score, NULL, "RM: score --input lines with the reward model --model (no training)"},
        {"--input", OPT_STR, &input, NULL, "rm --score: jsonl of {\"prompt\",\"response\"}, {\"text\"} or {\"messages\"}"},
        {"--output", OPT_STR, &output, NULL, "rm --score: the lines in input order with \"reward\" (\"reward_normalized\")"},
        ADAPTER_OPTION(&adapter),
        {"--ref", OPT_MODEL, &ref_dir, NULL, "DPO: reference model directory (default: --model, frozen)"},
        {"--beta", OPT_FLOAT, &beta, "0.1", "DPO: beta"},
        {"--loss", OPT_STR, &loss_name, "sigmoid", "DPO: sigmoid | ipo"},
        {"--label-smoothing", OPT_FLOAT, &label_smoothing, "0", "DPO (sigmoid): label smoothing in [0, 0.5)"},
        {"--center-rewards-coefficient", OPT_FLOAT, &center, "0", "RM: + coef * (r_chosen + r_rejected)^2 (TRL)"},
        {"--head-seed", OPT_INT, &head_seed, "42", "RM: seed of a new score head (normal(0, initializer_range))"},
        TRAIN_STEP_OPTIONS(&o, "tokens per sequence at most (the prompt loses tokens from the left)", "pairs per micro-batch",
                           dpo ? "5e-6" : "1e-5"),
        TRAIN_LORA_OPTIONS(&o),
        TRAIN_SKIP_OPTION(&o),
        TRAIN_CHAT_OPTION(&o),
        TRAIN_LOG_OPTIONS(&o),
    };
    o.opts = opts;
    o.n_opts = sizeof(opts) / sizeof(opts[0]);
    const char *cmd = dpo ? "dpo" : "rm";
    comm_init(&argc, &argv);
    args_parse(dpo ? "usage: tandem dpo --model DIR --data pairs.jsonl [--eval-data val.jsonl] --out DIR [--ref DIR] [options]"
                   : "usage: tandem rm --model DIR --data pairs.jsonl [--eval-data val.jsonl] --out DIR [options]",
               opts, o.n_opts, argc, argv);
    if (score && dpo) user_error("--score is an rm option");
    if (score && !o.model_dir) user_error("rm --score: --model is required");
    if (adapter && !score) user_error("--adapter: an inference option here (rm --score); training with adapters is not supported");
    if (score) {
        if (o.seq_len < 2 || o.batch_size < 1 || o.threads < 0) user_error("rm --score: --seq-len >= 2, --batch-size >= 1");
        ModelOpen mo = {.dir = o.model_dir, .adapter = adapter, .dtype_name = o.dtype_name, .device = o.device, .tp = o.tp,
                        .pp = o.pp, .ep = o.ep, .threads = o.threads, .comm_timeout = o.comm_timeout, .score_head = 1,
                        .kv_dtype_name = o.kv_dtype_name, .bf16_dot_name = o.bf16_dot_name};
        return rm_score_main(&mo, input, output, o.chat_template, o.seq_len, o.batch_size);
    }
    train_options_check(&o, cmd);
    if (!(center >= 0) || !isfinite(center)) user_error("--center-rewards-coefficient %g: must be >= 0", center);
    if (!(beta > 0) || !isfinite(beta)) user_error("--beta %g: must be > 0", beta);
    if (!(label_smoothing >= 0 && label_smoothing < 0.5f)) user_error("--label-smoothing %g: must be in [0, 0.5)", label_smoothing);
    if (strcmp(loss_name, "sigmoid") && strcmp(loss_name, "ipo")) user_error("--loss %s: expected sigmoid or ipo", loss_name);
    if (!dpo && ref_dir) user_error("rm: --ref is a dpo option");

    Mesh mesh, ref_mesh;
    Model m, ref;
    int own_ref = load_models(&o, dpo, ref_dir, head_seed, &mesh, &m, &ref_mesh, &ref);

    Pref p = {.dpo = dpo, .m = &m, .ref = !dpo ? NULL : own_ref ? &m : &ref, .mesh = &mesh};
    p.hook = (PrefHook){.center = center, .type = !strcmp(loss_name, "ipo") ? DPO_IPO : DPO_SIGMOID, .beta = beta,
                        .label_smoothing = label_smoothing};
    p.lh = (LossHook){dpo ? loss_dpo : loss_bt, &p.hook, 1.0f, 0.0f, NULL, NULL};
    TrainTask t = {.hook = &p.lh, .ctx = &p, .pairs = 1, .setup = pref_setup, .mem_plan = pref_mem_plan,
                   .prepare_step = pref_prepare_step, .step_metrics = pref_step_metrics, .evaluate = pref_evaluate};
    data_config_default(&t.data);
    t.data.preference = 1;
    t.data.pack = 0;
    train_run(&o, &m, &t);
    free(p.ctx); free(p.refs);
    free(p.lse); free(p.lp); free(p.amax_lp); free(p.amax);
    model_free(&m);
    if (dpo && !own_ref) { model_free(&ref); mesh_free(&ref_mesh); }
    mesh_free(&mesh);
    comm_finalize();
    return 0;
}

int rm_main(int argc, char **argv) { return pref_main(argc, argv, 0); }
int dpo_main(int argc, char **argv) { return pref_main(argc, argv, 1); }
