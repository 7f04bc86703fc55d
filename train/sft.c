/* sft.c — `tandem sft --model DIR --data train.jsonl [--eval-data val.jsonl] --out DIR`.
 * One optimizer step = M micro-batches on each of the dp ranks: every rank reads the same data
 * stream (train/data.c, deterministic by seed) and dp rank r takes micro-batches r, r + dp, ...;
 * each micro-batch's positions are weighted by 1 / (loss tokens of the whole step) so the step's
 * loss is the token mean over all of them. The pipeline runs them in 1F1B order
 * (train/schedule.c); the optimizer (train/optim.c) reduces gradients over dp, clips the global
 * norm and applies AdamW. Owns: the loop, evaluation, logging (progress line + metrics.jsonl),
 * the output directory and resume. */
#include "train/sft.h"
#include "kernels/kernels.h"
#include "runtime/args.h"
#include "runtime/util.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/grad.h"
#include "train/optim.h"
#include "train/schedule.h"
#include "train/trainer.h"
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Mean next-token loss over a whole eval set (forward only), spread over dp ranks. */
static double eval_loss(Model *m, TrainActs *a, Data *d, const Mesh *mesh) {
    data_rewind(d);
    DataBatch b;
    double sum = 0.0, n = 0.0;
    for (int k = 0; data_next_batch(d, &b); k++) {
        if (k % mesh->dp != mesh->dp_rank) continue;
        train_forward(m, a, b.tokens, b.seq_start, b.n_seqs);
        sum += train_eval_loss_sum(m, a, b.targets);
        n += b.n_loss;
    }
    const Comm *pp = &mesh->pp_comm;
    comm_broadcast(pp, &sum, sizeof(sum), pp->size - 1);   /* the last stage's sum, once per eval */
    double v[2] = {sum, n};
    comm_all_reduce_sum_f64(&mesh->dp_comm, v, 2);
    return v[1] > 0 ? v[0] / v[1] : NAN;
}

/* ---- main --------------------------------------------------------------------------------- */

int sft_main(int argc, char **argv) {
    const char *model_dir, *data_path, *eval_path, *out, *resume, *schedule_name, *chat_template;
    int tp, pp, threads, seq_len, batch_size, M, epochs, max_steps, eval_every, save_every, save_limit, warmup, zero, seed;
    int pack, train_on_prompt, skip_bad, drop_long, overwrite, stop_after, log_every, recompute;
    const char *recompute_name;
    float lr, min_lr, wd, beta1, beta2, eps, clip;
    Option opts[] = {
        {"--model", OPT_MODEL, &model_dir, NULL, "Hugging Face model directory to start from"},
        {"--data", OPT_STR, &data_path, NULL, "training data: jsonl or JSON array (prompt/response, Alpaca, messages, ShareGPT)"},
        {"--eval-data", OPT_STR, &eval_path, NULL, "held-out data: eval loss before, every --eval-every steps, after"},
        {"--out", OPT_STR, &out, NULL, "output directory: checkpoint-STEP/ (HF model + state), metrics.jsonl"},
        {"--resume", OPT_STR, &resume, NULL, "continue from a checkpoint directory (out/checkpoint-STEP)"},
        {"--overwrite", OPT_FLAG, &overwrite, NULL, "allow an existing --out"},
        {"--seq-len", OPT_INT, &seq_len, "512", "tokens per sample / packed row at most"},
        {"--batch-size", OPT_INT, &batch_size, "4", "rows per micro-batch"},
        {"--micro-batches", OPT_INT, &M, "1", "micro-batches per step per dp rank (accumulation; pipeline)"},
        {"--epochs", OPT_INT, &epochs, "1", "passes over the data"},
        {"--max-steps", OPT_INT, &max_steps, "0", "optimizer steps (0 = what --epochs gives); sets the LR schedule"},
        {"--stop-after", OPT_INT, &stop_after, "0", "stop (saving) after this step, as if killed there (0 = off)"},
        {"--lr", OPT_FLOAT, &lr, "1e-4", "peak learning rate"},
        {"--min-lr", OPT_FLOAT, &min_lr, "0", "learning-rate floor"},
        {"--warmup", OPT_INT, &warmup, "0", "linear warmup steps"},
        {"--lr-schedule", OPT_STR, &schedule_name, "cosine", "cosine | linear | constant"},
        {"--weight-decay", OPT_FLOAT, &wd, "0.0", "AdamW decoupled weight decay (not on norms and biases)"},
        {"--beta1", OPT_FLOAT, &beta1, "0.9", "AdamW"},
        {"--beta2", OPT_FLOAT, &beta2, "0.999", "AdamW"},
        {"--eps", OPT_FLOAT, &eps, "1e-8", "AdamW"},
        {"--clip", OPT_FLOAT, &clip, "1.0", "global gradient-norm clipping (0 = off)"},
        {"--recompute", OPT_STR, &recompute_name, "none", "full: keep only layer inputs, recompute in backward (less memory)"},
        {"--zero", OPT_INT, &zero, "0", "1 = ZeRO-1: optimizer state sharded over data-parallel ranks"},
        {"--pack", OPT_FLAG, &pack, NULL, "pack several samples per row (positions restart, no cross-attention)"},
        {"--train-on-prompt", OPT_FLAG, &train_on_prompt, NULL, "loss on prompt tokens too"},
        {"--skip-bad-lines", OPT_FLAG, &skip_bad, NULL, "skip malformed records (counted) instead of stopping"},
        {"--drop-long", OPT_FLAG, &drop_long, NULL, "drop samples longer than --seq-len (default: truncate)"},
        {"--chat-template", OPT_STR, &chat_template, NULL, "chat format for messages (default: the tokenizer's)"},
        {"--seed", OPT_INT, &seed, "1234", "data shuffling seed"},
        {"--eval-every", OPT_INT, &eval_every, "0", "steps between evals (0 = only before and after)"},
        {"--save-every", OPT_INT, &save_every, "0", "steps between checkpoints (0 = only at the end)"},
        {"--save-total-limit", OPT_INT, &save_limit, "0", "keep only the newest N complete checkpoints (0 = all)"},
        {"--log-every", OPT_INT, &log_every, "1", "steps between progress lines"},
        MESH_OPTIONS(&tp, &pp, &threads),
    };
    int n_opts = sizeof(opts) / sizeof(opts[0]);
    comm_init(&argc, &argv);
    args_parse("usage: tandem sft --model DIR --data train.jsonl [--eval-data val.jsonl] --out DIR [options]", opts,
               n_opts, argc, argv);
    if (!model_dir || !data_path || !out) user_error("sft: --model, --data and --out are required");
    if (seq_len < 2 || batch_size < 1 || M < 1 || epochs < 1 || max_steps < 0 || threads < 0 || warmup < 0)
        user_error("sft: --seq-len >= 2, --batch-size, --micro-batches, --epochs >= 1, --threads >= 0 required");
    if (!(lr > 0) || min_lr < 0 || wd < 0 || clip < 0 || !(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1) || !(eps > 0))
        user_error("sft: invalid optimizer setting (--lr > 0, --min-lr/--weight-decay/--clip >= 0, betas in [0, 1), --eps > 0)");
    LrSchedule sched = lr_schedule_parse("--lr-schedule", schedule_name);
    if (zero != 0 && zero != 1) user_error("--zero must be 0 or 1");
    if (strcmp(recompute_name, "none") && strcmp(recompute_name, "full"))
        user_error("--recompute %s: expected full or none", recompute_name);
    recompute = !strcmp(recompute_name, "full");
    if (dir_exists(out) && !overwrite && !resume)
        user_error("%s: already exists (use --resume DIR to continue a run, or --overwrite)", out);
    if (resume) trainer_check_same_model(model_dir, resume);
    if (save_limit < 0) user_error("--save-total-limit %d: must be >= 0", save_limit);
    threads = backend_set_threads(threads);

    Mesh mesh;
    mesh_init_world(&mesh, tp, pp);
    Model m;
    model_load(&m, resume ? resume : model_dir, &mesh);
    char err[1024];
    Tokenizer *tok = tokenizer_open(model_dir, err, sizeof err);
    if (!tok) user_error("%s", err);
    DataConfig dc;
    data_config_default(&dc);
    dc.seq_len = seq_len; dc.batch_size = batch_size; dc.pack = pack; dc.shuffle = 1; dc.seed = (uint64_t)seed;
    dc.n_epochs = max_steps ? 0 : epochs;   /* --max-steps decides: the data repeats as needed */
    dc.overlong = drop_long ? OVERLONG_DROP : OVERLONG_TRUNCATE; dc.train_on_prompt = train_on_prompt;
    dc.skip_bad_records = skip_bad; dc.chat_template = chat_template;
    Data train, val;
    data_open(&train, data_path, tok, &dc);
    int have_eval = eval_path != NULL;
    if (have_eval) {
        DataConfig ec = dc;
        ec.shuffle = 0;
        ec.n_epochs = 1;
        data_open(&val, eval_path, tok, &ec);
    }
    tokenizer_free(tok);

    /* steps: --max-steps, else every full step the epochs give */
    int steps_total = max_steps;
    if (!steps_total) {
        DataBatch b;
        long n = 0;
        while (data_next_batch(&train, &b)) n++;
        data_rewind(&train);
        steps_total = (int)(n / ((long)M * mesh.dp));
        if (steps_total < 1) user_error("%s: %ld micro-batches make no full step of %d x dp %d", data_path, n, M, mesh.dp);
    }

    OptimConfig oc = optim_config_default();
    oc.lr = lr; oc.min_lr = min_lr; oc.warmup = warmup; oc.total_steps = steps_total; oc.schedule = sched;
    oc.beta1 = beta1; oc.beta2 = beta2; oc.eps = eps; oc.weight_decay = wd; oc.clip = clip; oc.zero = zero;
    Optim *o = optim_new(&m, &mesh, oc);
    int step0 = 0;
    if (resume) {
        TrainerState ts;
        trainer_load_state(resume, &ts);
        step0 = ts.step;
        if (data_cursor_restore(&train, ts.cursor, DATA_CURSOR_BYTES, err, sizeof err))
            user_error("%s/trainer_state.json: %s", resume, err);
        if (ts.tp == tp && ts.pp == pp && ts.dp == mesh.dp && ts.zero == zero) {
            char path[4200];
            snprintf(path, sizeof path, "%s/optim.rank%d.bin", resume, mesh.rank);
            if (optim_load(o, path)) rank_error("%s: cannot read", path);
        } else {
            o->step = step0;
            if (mesh_is_root(&mesh))
                fprintf(stderr, "resume: saved with tp=%d pp=%d dp=%d zero=%d, now tp=%d pp=%d dp=%d zero=%d: weights and "
                                "data position continue, the optimizer state restarts\n",
                        ts.tp, ts.pp, ts.dp, ts.zero, tp, pp, mesh.dp, zero);
        }
    }
    mkdir_p(out);

    int max_tokens = data_max_batch_tokens(&train);
    int n_slots = pp < M ? pp : M;
    TrainActs *slots = xcalloc(n_slots, sizeof(TrainActs));
    for (int i = 0; i < n_slots; i++) train_acts_init(&slots[i], &m, max_tokens, seq_len, recompute);
    float *grads = xcalloc(optim_grad_floats(o), sizeof(float));
    ModelWeights gw;
    LayerWeights *gl = xcalloc(m.n_layers_local, sizeof(LayerWeights));
    model_weights_place(&m, grads, &gw, gl);
    Step st;
    step_alloc(&st, M, max_tokens);
    MemPlan plan = model_mem_plan(&m);
    plan.grads = sizeof(float) * (double)optim_grad_floats(o);
    plan.moments = 2.0 * sizeof(float) * o->n_state;
    for (int i = 0; i < n_slots; i++) plan.acts += sizeof(float) * (double)slots[i].n_arena;
    model_print_memory_plan(&m, &plan);
    if (mesh_is_root(&mesh)) {
        fprintf(stderr, "+------------------------+--------------------------------+\n");
        args_print(opts, n_opts);
        model_print_summary(&m);
        data_print_summary(&train, stderr);
        if (have_eval) data_print_summary(&val, stderr);
        optim_print_summary(o);
        fprintf(stderr, "steps %d (from %d), %d micro-batches of <= %d tokens per step per dp rank\n", steps_total,
                step0, M, max_tokens);
    }
    FILE *metrics = NULL;
    if (mesh_is_root(&mesh)) {
        char *mp = path_join(out, "metrics.jsonl");
        metrics = fopen(mp, resume ? "a" : "w");
        if (!metrics) user_error("%s: cannot open for writing: %s", mp, strerror(errno));
        free(mp);
    }
    double eval0 = have_eval ? eval_loss(&m, &slots[0], &val, &mesh) : NAN;
    if (mesh_is_root(&mesh) && have_eval) {
        fprintf(stderr, "eval loss before: %.4f\n", eval0);
        fprintf(metrics, "{\"step\": %d, \"eval_loss\": %.6f}\n", step0, eval0);
        fflush(metrics);
    }

    double t_start = now_seconds();
    long tokens_done = 0;
    int step = step0, last = steps_total;
    if (stop_after > 0 && stop_after < last) last = stop_after;
    while (step < last && step_fill(&st, &train, &mesh)) {
        double t0 = now_seconds();
        optim_zero_grad(o, grads);
        /* each dp rank weighs its positions by dp / L so optim_step's dp mean gives 1 / L overall */
        for (int i = 0; i < st.n; i++) {
            float *w = (float *)st.mbs[i].weight;
            int N = st.mbs[i].seq_start[st.mbs[i].n_seqs];
            for (int t = 0; t < N; t++) w[t] *= (float)mesh.dp;
        }
        float loss = schedule_1f1b(&m, slots, n_slots, st.mbs, st.n, &LOSS_XENT, &gw);
        double lsum = loss;
        comm_all_reduce_sum_f64(&mesh.dp_comm, &lsum, 1);
        loss = (float)(lsum / mesh.dp);
        float lr_now = (float)optim_lr(o, o->step);
        float gnorm = optim_step(o, &m, grads);
        step++;
        tokens_done += st.n_tokens;
        double dt = now_seconds() - t0, el = now_seconds() - t_start;
        double eta = (last - step) * (el / (step - step0));
        if (mesh_is_root(&mesh)) {
            if (step % log_every == 0 || step == last)
                fprintf(stderr, "step %d/%d | loss %.4f | lr %.3g | grad norm %.3f | %.0f tok/s | ETA %.0f s\n", step,
                        steps_total, loss, lr_now, gnorm, st.n_tokens / dt, eta);
            fprintf(metrics, "{\"step\": %d, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, \"tokens\": %ld, "
                             "\"tokens_per_s\": %.1f}\n", step, loss, lr_now, gnorm, st.n_tokens, st.n_tokens / dt);
            fflush(metrics);
        }
        if (have_eval && eval_every > 0 && step % eval_every == 0 && step != last) {
            double ev = eval_loss(&m, &slots[0], &val, &mesh);
            if (mesh_is_root(&mesh)) {
                fprintf(stderr, "step %d eval loss %.4f\n", step, ev);
                fprintf(metrics, "{\"step\": %d, \"eval_loss\": %.6f}\n", step, ev);
                fflush(metrics);
            }
        }
        if (save_every > 0 && step % save_every == 0 && step != last) trainer_save_checkpoint(&m, o, &train, model_dir, out, step, save_limit);
    }
    double ev1 = have_eval ? eval_loss(&m, &slots[0], &val, &mesh) : NAN;
    if (mesh_is_root(&mesh) && have_eval) {
        fprintf(stderr, "eval loss after: %.4f (before %.4f)\n", ev1, eval0);
        fprintf(metrics, "{\"step\": %d, \"eval_loss\": %.6f}\n", step, ev1);
    }
    trainer_save_checkpoint(&m, o, &train, model_dir, out, step, save_limit);
    if (mesh_is_root(&mesh)) {
        double el = now_seconds() - t_start;
        fprintf(stderr, "trained %d steps, %ld tokens in %.1f s (%.0f tok/s), peak RSS %.1f MiB\n", step - step0,
                tokens_done, el, tokens_done / (el > 0 ? el : 1), peak_rss_mib());
        fclose(metrics);
    }
    step_free(&st);
    for (int i = 0; i < n_slots; i++) train_acts_free(&slots[i]);
    free(slots); free(grads); free(gl);
    optim_free(o);
    data_free(&train);
    if (have_eval) data_free(&val);
    model_free(&m);
    mesh_free(&mesh);
    comm_finalize();
    return 0;
}
