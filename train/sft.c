/* sft.c — `tandem sft --model DIR --data train.jsonl [--eval-data val.jsonl] --out DIR`.
 * The shared training loop (train/trainer.h) with SFT's loss: the token-mean next-token
 * cross-entropy over all of a step's micro-batches and dp ranks (train/data.c weighs each position
 * 1 / (the step's loss tokens); each dp rank scales its weights by dp because optim_step averages
 * gradients over dp). Owns: the options, the loss task and the eval loss. */
#include "train/sft.h"
#include "runtime/util.h"
#include "train/trainer.h"
#include <math.h>
#include <string.h>

typedef struct {
    Model *m;
    double eval0;   /* the eval loss before training, repeated in the "after" line */
} Sft;

/* each dp rank weighs its positions by dp / L so optim_step's dp mean gives 1 / L overall */
static void sft_prepare_step(void *ctx, Step *st) {
    const Mesh *mesh = ((Sft *)ctx)->m->mesh;
    for (int i = 0; i < st->n; i++) {
        float *w = (float *)st->mbs[i].weight;
        int N = st->mbs[i].seq_start[st->mbs[i].n_seqs];
        for (int t = 0; t < N; t++) w[t] *= (float)mesh->dp;
    }
}

/* the step's loss: each dp rank's share of the token mean, summed over dp and divided by dp; a MoE
 * model with output_router_logits: the loss holds router_aux_loss_coef x the load-balancing loss,
 * whose mean over the step's micro-batches is moe_aux_loss */
static int sft_step_metrics(void *ctx, const LearnerStep *r, const Step *st, Metric *out) {
    (void)st;
    const Model *m = ((Sft *)ctx)->m;
    const Mesh *mesh = m->mesh;
    double v[2] = {r->loss, r->moe_aux};
    comm_all_reduce_sum_f64(&mesh->dp_comm, v, 2);
    out[0] = (Metric){"loss", (float)(v[0] / mesh->dp), "loss %.4f"};
    if (m->cfg.moe == MOE_NONE) return 1;
    int n = 1;   /* MoE: the experts' load (learner.h), and the balance loss when it is trained */
    out[n++] = (Metric){"moe_load_max", r->moe_load_max, "load max %.2f"};
    out[n++] = (Metric){"moe_load_min", r->moe_load_min, "min %.2f"};
    if (m->cfg.output_router_logits) out[n++] = (Metric){"moe_aux_loss", (float)(v[1] / mesh->dp), "aux %.4f"};
    return n;
}

/* Mean next-token loss over the whole eval set (forward only), spread over dp ranks. */
static void sft_evaluate(void *ctx, TrainActs *a, Data *d, int step, const char *when, MetricsLog *ml) {
    Sft *s = ctx;
    const Mesh *mesh = s->m->mesh;
    data_rewind(d);
    DataBatch b;
    double sum = 0.0, n = 0.0;
    for (int k = 0; data_next_batch(d, &b); k++) {
        if (k % mesh->dp != mesh->dp_rank) continue;
        train_forward(s->m, a, b.tokens, b.seq_start, b.n_seqs);
        sum += train_eval_loss_sum(s->m, a, b.targets);
        n += b.n_loss;
    }
    moe_drain(s->m);   /* ep > 1: the dp ranks ran different numbers of batches (runtime/moe_ep.c) */
    const Comm *pp = &mesh->pp_comm;
    comm_broadcast(pp, &sum, sizeof(sum), pp->size - 1);   /* the last stage's sum, once per eval */
    double v[2] = {sum, n};
    comm_all_reduce_sum_f64(&mesh->dp_comm, v, 2);
    double loss = v[1] > 0 ? v[0] / v[1] : NAN;
    if (!strcmp(when, "before")) s->eval0 = loss;
    if (!mesh_is_root(mesh)) return;
    if (!strcmp(when, "before")) fprintf(stderr, "eval loss before: %.4f\n", loss);
    else if (!strcmp(when, "after")) fprintf(stderr, "eval loss after: %.4f (before %.4f)\n", loss, s->eval0);
    else fprintf(stderr, "step %d eval loss %.4f\n", step, loss);
    metrics_begin(ml, step);
    metrics_fmt(ml, "eval_loss", "%.6f", loss);
    metrics_end(ml);
}

int sft_main(int argc, char **argv) {
    TrainOptions o = {0};
    int pack, train_on_prompt, drop_long;
    Option opts[] = {
        {"--model", OPT_MODEL, &o.model_dir, NULL, "Hugging Face model directory to start from"},
        {"--data", OPT_STR, &o.data_path, NULL, "training data: jsonl or JSON array (prompt/response, Alpaca, messages, ShareGPT)"},
        TRAIN_OUT_OPTIONS(&o, "held-out data: eval loss before, every --eval-every steps, after"),
        TRAIN_STEP_OPTIONS(&o, "tokens per sample / packed row at most", "rows per micro-batch", "1e-4"),
        TRAIN_LORA_OPTIONS(&o),
        {"--pack", OPT_FLAG, &pack, NULL, "pack several samples per row (positions restart, no cross-attention)"},
        {"--train-on-prompt", OPT_FLAG, &train_on_prompt, NULL, "loss on prompt tokens too"},
        TRAIN_SKIP_OPTION(&o),
        {"--drop-long", OPT_FLAG, &drop_long, NULL, "drop samples longer than --seq-len (default: truncate)"},
        TRAIN_CHAT_OPTION(&o),
        TRAIN_LOG_OPTIONS(&o),
    };
    o.opts = opts;
    o.n_opts = sizeof(opts) / sizeof(opts[0]);
    comm_init(&argc, &argv);
    args_parse("usage: tandem sft --model DIR --data train.jsonl [--eval-data val.jsonl] --out DIR [options]", opts,
               o.n_opts, argc, argv);
    train_options_check(&o, "sft");

    Mesh mesh;
    mesh_init_world(&mesh, o.tp, o.pp, o.ep);
    Model m;
    model_load(&m, o.resume && !o.lora_r ? o.resume : o.model_dir, &mesh, o.dtype, o.be);   /* LoRA: the base */
    Sft s = {&m, NAN};
    TrainTask t = {.hook = &LOSS_XENT, .ctx = &s, .prepare_step = sft_prepare_step, .step_metrics = sft_step_metrics,
                   .evaluate = sft_evaluate};
    data_config_default(&t.data);
    t.data.pack = pack;
    t.data.overlong = drop_long ? OVERLONG_DROP : OVERLONG_TRUNCATE;
    t.data.train_on_prompt = train_on_prompt;
    train_run(&o, &m, &t);
    model_free(&m);
    mesh_free(&mesh);
    comm_finalize();
    return 0;
}
