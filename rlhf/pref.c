/* pref.c — `tandem rm` (reward model: backbone + score head, Bradley–Terry) and `tandem dpo`
 * (policy against a frozen reference) on preference pairs. Both are SFT's loop (train/trainer.h:
 * steps of M micro-batches per dp rank, 1F1B, AdamW / ZeRO-1, checkpoints, resume) with another
 * loss hook (rlhf/pref_loss.h) and per-pair metrics. A micro-batch holds whole pairs (chosen
 * 2i, rejected 2i + 1: train/data.c's preference mode), so both halves of a pair always meet in
 * one hook call. DPO's reference is a second model on its own mesh over the same ranks (the same
 * layout), loaded from --ref or again from --model and never updated; its logprobs come from the
 * same forward as the policy's, so before the first update they are equal bit for bit.
 * Owns: the two commands' options, the metrics (TRL's names for DPO), the RM's reward statistics
 * on the eval set (saved as "normalize_reward", "mean", "std", OpenRLHF's config keys). */
#include "rlhf/pref.h"
#include "kernels/kernels.h"
#include "rlhf/pref_loss.h"
#include "runtime/args.h"
#include "runtime/jsonl.h"
#include "tokenizer/tokenizer.h"
#include "runtime/util.h"
#include "train/schedule.h"
#include "train/trainer.h"
#include <errno.h>
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
    int *rows;                 /* (max_tokens) identity rows for model_score */
    float *lse, *lp, *amax_lp; /* (max_tokens) the reference's scores */
    int *amax;
} Pref;

/* ctx->ref (n_seqs) = the reference's response logprob per sequence (sum; mean for IPO) */
static void reference_logps(Pref *p, const MicroBatch *mb, double *ref) {
    int N = mb->seq_start[mb->n_seqs];
    Scores sc = {p->lse, p->amax, p->amax_lp, p->lp};
    model_score(p->ref, mb->tokens, mb->seq_start, mb->n_seqs, N, p->rows, mb->targets, &sc);
    pref_seq_logps(mb->seq_start, mb->n_seqs, mb->targets, p->lp, p->hook.type == DPO_IPO, ref);
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
    for (int k = 0; data_next_batch(d, &b); k++) {
        if (k % mesh->dp != mesh->dp_rank) continue;
        PrefCtx ctx = {b.margin, ref};
        MicroBatch mb = {b.tokens, b.seq_start, b.n_seqs, b.targets, NULL, &ctx};
        if (p->dpo) reference_logps(p, &mb, ref);
        train_forward(p->m, a, b.tokens, b.seq_start, b.n_seqs);
        const float *out = train_outputs(p->m, a, b.targets, 1.0f);
        if (out) p->lh.fn(&mb, b.n_tokens, out, dout, &p->hook);
    }
    free(ref);
    free(dout);
    PrefStats s = stats_share(mesh, p->hook.stats);
    p->hook.stats = keep;
    return s;
}

/* One metrics object's fields (no braces): prefix "" for a step, "eval_" for an eval pass */
static void metrics_fields(FILE *f, const Pref *p, const PrefStats *s, const char *pre) {
    double n = s->n_pairs > 0 ? s->n_pairs : 1;
    if (p->dpo)
        fprintf(f, "\"%sloss\": %.9g, \"%srewards/chosen\": %.9g, \"%srewards/rejected\": %.9g, "
                   "\"%srewards/accuracies\": %.9g, \"%srewards/margins\": %.9g, \"%slogps/chosen\": %.9g, "
                   "\"%slogps/rejected\": %.9g", pre, s->loss / n, pre, s->chosen / n, pre, s->rejected / n, pre,
                s->correct / n, pre, (s->chosen - s->rejected) / n, pre, s->logp_chosen / n, pre, s->logp_rejected / n);
    else
        fprintf(f, "\"%sloss\": %.9g, \"%saccuracy\": %.9g, \"%smargin\": %.9g, \"%sreward_chosen\": %.9g, "
                   "\"%sreward_rejected\": %.9g", pre, s->loss / n, pre, s->correct / n, pre,
                (s->chosen - s->rejected) / n, pre, s->chosen / n, pre, s->rejected / n);
}

static void log_eval(Pref *p, FILE *metrics, int step, const PrefStats *s, const char *when) {
    if (!mesh_is_root(p->mesh)) return;
    double n = s->n_pairs > 0 ? s->n_pairs : 1;
    fprintf(stderr, "eval %s (step %d): loss %.4f | accuracy %.3f | margin %.4f | chosen %.4f | rejected %.4f (%.0f pairs)\n",
            when, step, s->loss / n, s->correct / n, (s->chosen - s->rejected) / n, s->chosen / n, s->rejected / n,
            s->n_pairs);
    fprintf(metrics, "{\"step\": %d, ", step);
    metrics_fields(metrics, p, s, "eval_");
    fprintf(metrics, "}\n");
    fflush(metrics);
}

/* ---- rm --score: rewards of {"prompt","response"}, {"text"} or {"messages"} lines ---------- */

/* One line's ids, tokenized as in training: [BOS] + encode(prompt + response) + [EOS] (text: the
 * same with the text), messages: chat_render, cut after the last end-of-turn token. */
static void score_tokens(Tokenizer *t, int chat_format, JsonlReader *r, const cJSON *o, TokIds *ids) {
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(o, "prompt"), *rs = cJSON_GetObjectItemCaseSensitive(o, "response");
    const cJSON *tx = cJSON_GetObjectItemCaseSensitive(o, "text"), *ms = cJSON_GetObjectItemCaseSensitive(o, "messages");
    ids->n = 0;
    if (ms) {
        if (!cJSON_IsArray(ms) || !cJSON_GetArraySize(ms)) user_error("%s:%d: field \"messages\" is not a non-empty list", r->path, r->line);
        int n = cJSON_GetArraySize(ms), i = 0;
        ChatMessage *m = xcalloc((size_t)n, sizeof(ChatMessage));
        const cJSON *e;
        cJSON_ArrayForEach(e, ms) {
            const cJSON *role = cJSON_GetObjectItemCaseSensitive(e, "role"), *c = cJSON_GetObjectItemCaseSensitive(e, "content");
            if (!cJSON_IsString(role) || !cJSON_IsString(c))
                user_error("%s:%d: messages[%d]: \"role\" and \"content\" must be strings", r->path, r->line, i);
            m[i++] = (ChatMessage){role->valuestring, c->valuestring};
        }
        if (chat_format < 0) user_error("%s:%d: messages need a chat template (--chat-template)", r->path, r->line);
        TokIds mask = {0};
        char err[512];
        if (chat_render(t, (ChatFormat)chat_format, m, n, 0, ids, &mask, err, sizeof err))
            user_error("%s:%d: %s", r->path, r->line, err);
        while (ids->n > 0 && !mask.ids[ids->n - 1]) ids->n--;   /* ends with the answer's end-of-turn */
        if (!ids->n) user_error("%s:%d: messages: no assistant turn to score", r->path, r->line);
        tok_ids_free(&mask);
        free(m);
        return;
    }
    const char *a = "", *b;
    if (tx) {
        if (!cJSON_IsString(tx)) user_error("%s:%d: field \"text\" is not a string", r->path, r->line);
        b = tx->valuestring;
    } else if (pr || rs) {
        if (!cJSON_IsString(pr)) user_error("%s:%d: field \"prompt\" missing or not a string", r->path, r->line);
        if (!cJSON_IsString(rs)) user_error("%s:%d: field \"response\" missing or not a string", r->path, r->line);
        a = pr->valuestring;
        b = rs->valuestring;
    } else {
        user_error("%s:%d: no \"prompt\"/\"response\", \"text\" or \"messages\" field", r->path, r->line);
    }
    size_t la = strlen(a), lb = strlen(b);
    char *text = xmalloc(la + lb + 1);
    memcpy(text, a, la);
    memcpy(text + la, b, lb + 1);
    if (tokenizer_bos_id(t) >= 0) tok_ids_push(ids, tokenizer_bos_id(t));
    tokenizer_encode(t, text, la + lb, 0, ids, NULL);
    tok_ids_push(ids, tokenizer_eos_id(t));
    free(text);
}

static int score_main(const char *model_dir, const char *input, const char *output, const char *chat_template, int tp,
                      int pp, int seq_len, int batch_size) {
    if (!input || !output) user_error("rm --score: --input and --output are required");
    ModelConfig cfg;
    config_load(&cfg, model_dir);
    if (!cfg.score_head)
        user_error("%s: a causal LM, not a reward model (rm --score needs a *ForSequenceClassification directory, "
                   "e.g. one `tandem rm` saved)", model_dir);
    Mesh mesh;
    mesh_init_world(&mesh, tp, pp);
    Model m;
    model_load(&m, model_dir, &mesh);
    char err[1024];
    Tokenizer *t = tokenizer_open(model_dir, err, sizeof err);
    if (!t) user_error("%s", err);
    if (tokenizer_eos_id(t) < 0) user_error("%s: the tokenizer has no EOS token; rewards are read there", model_dir);
    int chat_format = chat_format_resolve(t, chat_template, err, sizeof err);
    /* every rank reads and tokenizes every line (the same input): lines, their ids, their objects */
    JsonlReader r;
    jsonl_open(&r, input);
    int n = 0, cap = 0;
    cJSON **objs = NULL;
    TokIds *ids = NULL;
    for (cJSON *o; (o = jsonl_next(&r));) {
        if (n == cap) {
            cap = cap * 2 + 64;
            objs = xrealloc(objs, sizeof(cJSON *) * cap);
            ids = xrealloc(ids, sizeof(TokIds) * cap);
        }
        ids[n] = (TokIds){0};
        score_tokens(t, chat_format, &r, o, &ids[n]);
        if ((int)ids[n].n > seq_len) {   /* keep the end (the answer and its EOS), after BOS */
            size_t cut = ids[n].n - (size_t)seq_len, keep = tokenizer_bos_id(t) >= 0;
            memmove(ids[n].ids + keep, ids[n].ids + keep + cut, sizeof(int32_t) * (ids[n].n - keep - cut));
            ids[n].n = (size_t)seq_len;
        }
        objs[n++] = o;
    }
    jsonl_close(&r);
    tokenizer_free(t);
    if (!n) user_error("%s: no lines to score", input);
    model_alloc_state(&m, batch_size * seq_len, seq_len);
    double *rew = xcalloc((size_t)n, sizeof(double));
    int *tok = xmalloc(sizeof(int) * (size_t)batch_size * seq_len), *start = xmalloc(sizeof(int) * (batch_size + 1));
    float *vals = xmalloc(sizeof(float) * (size_t)batch_size * seq_len);
    for (int b0 = 0, k = 0; b0 < n; b0 += batch_size, k++) {
        if (k % mesh.dp != mesh.dp_rank) continue;   /* dp replicas take turns */
        int nb = n - b0 < batch_size ? n - b0 : batch_size, N = 0;
        start[0] = 0;
        for (int i = 0; i < nb; i++) {
            for (size_t j = 0; j < ids[b0 + i].n; j++) tok[N++] = ids[b0 + i].ids[j];
            start[i + 1] = N;
        }
        model_forward(&m, tok, start, nb);
        if (m.is_last) m.be->to_host(vals, m.s.logits, sizeof(float) * N);
        comm_broadcast(&mesh.pp_comm, vals, sizeof(float) * N, mesh.pp_comm.size - 1);
        for (int i = 0; i < nb; i++) rew[b0 + i] = vals[start[i + 1] - 1];   /* the value at EOS */
    }
    comm_all_reduce_sum_f64(&mesh.dp_comm, rew, n);   /* each line was scored by one dp replica */
    if (mesh_is_root(&mesh)) {
        size_t len = 0, cap2 = 1 << 16;
        char *buf = xmalloc(cap2);
        for (int i = 0; i < n; i++) {
            cJSON_AddNumberToObject(objs[i], "reward", rew[i]);
            if (m.cfg.has_reward_stats)
                cJSON_AddNumberToObject(objs[i], "reward_normalized", (rew[i] - m.cfg.reward_mean) / m.cfg.reward_std);
            jsonl_append(&buf, &len, &cap2, objs[i]);
        }
        if (write_file_atomic(output, buf, len)) user_error("%s: cannot write: %s", output, strerror(errno));
        free(buf);
        fprintf(stderr, "scored %d lines -> %s\n", n, output);
    }
    for (int i = 0; i < n; i++) { cJSON_Delete(objs[i]); tok_ids_free(&ids[i]); }
    free(objs); free(ids); free(rew); free(tok); free(start); free(vals);
    model_free(&m);
    mesh_free(&mesh);
    comm_finalize();
    return 0;
}

static int pref_main(int argc, char **argv, int dpo) {
    const char *model_dir, *data_path, *eval_path, *out, *resume, *schedule_name, *chat_template, *ref_dir, *loss_name;
    const char *recompute_name;
    int tp, pp, threads, seq_len, batch_size, M, epochs, max_steps, eval_every, save_every, save_limit, warmup, zero, seed;
    int skip_bad, overwrite, stop_after, log_every, head_seed, score;
    const char *input, *output;
    float lr, min_lr, wd, beta1, beta2, eps, clip, center, beta, label_smoothing;
    Option opts[] = {
        {"--model", OPT_MODEL, &model_dir, NULL, dpo ? "policy to start from (HF causal LM)" : "backbone to start from (causal LM / SFT or reward-model directory)"},
        {"--data", OPT_STR, &data_path, NULL, "preference pairs: jsonl or JSON array (prompt/chosen/rejected, hh-rlhf texts, messages, ShareGPT)"},
        {"--eval-data", OPT_STR, &eval_path, NULL, "held-out pairs: metrics before, every --eval-every steps, after"},
        {"--out", OPT_STR, &out, NULL, "output directory: checkpoint-STEP/ (HF model + state), metrics.jsonl"},
        {"--resume", OPT_STR, &resume, NULL, "continue from a checkpoint directory (out/checkpoint-STEP)"},
        {"--overwrite", OPT_FLAG, &overwrite, NULL, "allow an existing --out"},
        {"--score", OPT_FLAG, &score, NULL, "RM: score --input lines with the reward model --model (no training)"},
        {"--input", OPT_STR, &input, NULL, "rm --score: jsonl of {\"prompt\",\"response\"}, {\"text\"} or {\"messages\"}"},
        {"--output", OPT_STR, &output, NULL, "rm --score: the lines in input order with \"reward\" (\"reward_normalized\")"},
        {"--ref", OPT_MODEL, &ref_dir, NULL, "DPO: reference model directory (default: --model, frozen)"},
        {"--beta", OPT_FLOAT, &beta, "0.1", "DPO: beta"},
        {"--loss", OPT_STR, &loss_name, "sigmoid", "DPO: sigmoid | ipo"},
        {"--label-smoothing", OPT_FLOAT, &label_smoothing, "0", "DPO (sigmoid): label smoothing in [0, 0.5)"},
        {"--center-rewards-coefficient", OPT_FLOAT, &center, "0", "RM: + coef * (r_chosen + r_rejected)^2 (TRL)"},
        {"--head-seed", OPT_INT, &head_seed, "42", "RM: seed of a new score head (normal(0, initializer_range))"},
        {"--seq-len", OPT_INT, &seq_len, "512", "tokens per sequence at most (the prompt loses tokens from the left)"},
        {"--batch-size", OPT_INT, &batch_size, "4", "pairs per micro-batch"},
        {"--micro-batches", OPT_INT, &M, "1", "micro-batches per step per dp rank (accumulation; pipeline)"},
        {"--epochs", OPT_INT, &epochs, "1", "passes over the data"},
        {"--max-steps", OPT_INT, &max_steps, "0", "optimizer steps (0 = what --epochs gives); sets the LR schedule"},
        {"--stop-after", OPT_INT, &stop_after, "0", "stop (saving) after this step, as if killed there (0 = off)"},
        {"--lr", OPT_FLOAT, &lr, dpo ? "5e-6" : "1e-5", "peak learning rate"},
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
        {"--skip-bad-lines", OPT_FLAG, &skip_bad, NULL, "skip malformed records (counted) instead of stopping"},
        {"--chat-template", OPT_STR, &chat_template, NULL, "chat format for messages (default: the tokenizer's)"},
        {"--seed", OPT_INT, &seed, "1234", "data shuffling seed"},
        {"--eval-every", OPT_INT, &eval_every, "0", "steps between evals (0 = only before and after)"},
        {"--save-every", OPT_INT, &save_every, "0", "steps between checkpoints (0 = only at the end)"},
        {"--save-total-limit", OPT_INT, &save_limit, "0", "keep only the newest N complete checkpoints (0 = all)"},
        {"--log-every", OPT_INT, &log_every, "1", "steps between progress lines"},
        MESH_OPTIONS(&tp, &pp, &threads),
    };
    int n_opts = sizeof(opts) / sizeof(opts[0]);
    const char *cmd = dpo ? "dpo" : "rm";
    comm_init(&argc, &argv);
    args_parse(dpo ? "usage: tandem dpo --model DIR --data pairs.jsonl [--eval-data val.jsonl] --out DIR [--ref DIR] [options]"
                   : "usage: tandem rm --model DIR --data pairs.jsonl [--eval-data val.jsonl] --out DIR [options]",
               opts, n_opts, argc, argv);
    if (score && dpo) user_error("--score is an rm option");
    if (score && !model_dir) user_error("rm --score: --model is required");
    if (score) {
        if (seq_len < 2 || batch_size < 1 || threads < 0) user_error("rm --score: --seq-len >= 2, --batch-size >= 1");
        threads = backend_set_threads(threads);
        return score_main(model_dir, input, output, chat_template, tp, pp, seq_len, batch_size);
    }
    if (!model_dir || !data_path || !out) user_error("%s: --model, --data and --out are required", cmd);
    if (seq_len < 2 || batch_size < 1 || M < 1 || epochs < 1 || max_steps < 0 || threads < 0 || warmup < 0)
        user_error("%s: --seq-len >= 2, --batch-size, --micro-batches, --epochs >= 1, --threads >= 0 required", cmd);
    if (!(lr > 0) || min_lr < 0 || wd < 0 || clip < 0 || !(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1) || !(eps > 0))
        user_error("%s: invalid optimizer setting (--lr > 0, --min-lr/--weight-decay/--clip >= 0, betas in [0, 1), --eps > 0)", cmd);
    if (!(center >= 0) || !isfinite(center)) user_error("--center-rewards-coefficient %g: must be >= 0", center);
    if (!(beta > 0) || !isfinite(beta)) user_error("--beta %g: must be > 0", beta);
    if (!(label_smoothing >= 0 && label_smoothing < 0.5f)) user_error("--label-smoothing %g: must be in [0, 0.5)", label_smoothing);
    if (save_limit < 0) user_error("--save-total-limit %d: must be >= 0", save_limit);
    if (strcmp(loss_name, "sigmoid") && strcmp(loss_name, "ipo")) user_error("--loss %s: expected sigmoid or ipo", loss_name);
    if (!dpo && ref_dir) user_error("rm: --ref is a dpo option");
    LrSchedule sched = lr_schedule_parse("--lr-schedule", schedule_name);
    if (zero != 0 && zero != 1) user_error("--zero must be 0 or 1");
    if (strcmp(recompute_name, "none") && strcmp(recompute_name, "full"))
        user_error("--recompute %s: expected full or none", recompute_name);
    int recompute = !strcmp(recompute_name, "full");
    if (dir_exists(out) && !overwrite && !resume)
        user_error("%s: already exists (use --resume DIR to continue a run, or --overwrite)", out);
    if (resume) trainer_check_same_model(model_dir, resume);
    threads = backend_set_threads(threads);

    Mesh mesh, ref_mesh;
    Comm world = comm_world();
    mesh_init(&mesh, &world, tp, pp);
    Model m, ref;
    if (dpo) {
        model_load(&m, resume ? resume : model_dir, &mesh);
        if (m.head != HEAD_LM) user_error("%s: a score-head model; dpo trains a causal LM", resume ? resume : model_dir);
        mesh_init(&ref_mesh, &world, tp, pp);   /* the reference: same ranks, its own communicators */
        model_load(&ref, ref_dir ? ref_dir : model_dir, &ref_mesh);
        if (ref.head != HEAD_LM) user_error("%s: a score-head model; the DPO reference must be a causal LM", ref_dir ? ref_dir : model_dir);
        if (ref.cfg.vocab_size != m.cfg.vocab_size)
            user_error("--ref %s: vocabulary %d, the policy's is %d", ref_dir, ref.cfg.vocab_size, m.cfg.vocab_size);
    } else {
        model_load_score(&m, resume ? resume : model_dir, &mesh, (uint64_t)head_seed);
        if (resume && m.score_seed)   /* a new head would silently restart the reward model */
            user_error("--resume %s: a causal-LM checkpoint, not a reward model's (no score head)", resume);
    }
    comm_free(&world);
    char err[1024];
    Tokenizer *tok = tokenizer_open(model_dir, err, sizeof err);
    if (!tok) user_error("%s", err);
    DataConfig dc;
    data_config_default(&dc);
    dc.preference = 1; dc.seq_len = seq_len; dc.batch_size = batch_size; dc.pack = 0; dc.shuffle = 1;
    dc.seed = (uint64_t)seed; dc.n_epochs = max_steps ? 0 : epochs; dc.skip_bad_records = skip_bad;
    dc.chat_template = chat_template;
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
        }
    }
    mkdir_p(out);

    int max_tokens = data_max_batch_tokens(&train);
    if (have_eval && data_max_batch_tokens(&val) > max_tokens) max_tokens = data_max_batch_tokens(&val);
    int n_slots = pp < M ? pp : M;
    TrainActs *slots = xcalloc(n_slots, sizeof(TrainActs));
    for (int i = 0; i < n_slots; i++) train_acts_init(&slots[i], &m, max_tokens, seq_len, recompute);
    float *grads = xcalloc(optim_grad_floats(o), sizeof(float));
    ModelWeights gw;
    LayerWeights *gl = xcalloc(m.n_layers_local, sizeof(LayerWeights));
    model_weights_place(&m, grads, &gw, gl);
    Step st;
    step_alloc(&st, M, max_tokens);
    PrefCtx *ctx = xcalloc(M, sizeof(PrefCtx));
    double *refs = xcalloc((size_t)M * max_tokens, sizeof(double));

    Pref p = {.dpo = dpo, .m = &m, .ref = dpo ? &ref : NULL, .mesh = &mesh, .max_tokens = max_tokens};
    p.hook = (PrefHook){.center = center, .type = !strcmp(loss_name, "ipo") ? DPO_IPO : DPO_SIGMOID, .beta = beta,
                        .label_smoothing = label_smoothing};
    p.lh = (LossHook){dpo ? loss_dpo : loss_bt, &p.hook, 1.0f, 0.0f, NULL};
    if (dpo) {
        model_alloc_state(&ref, max_tokens, seq_len);
        p.rows = xmalloc(sizeof(int) * max_tokens);
        for (int i = 0; i < max_tokens; i++) p.rows[i] = i;
        p.lse = xmalloc(sizeof(float) * max_tokens); p.lp = xmalloc(sizeof(float) * max_tokens);
        p.amax_lp = xmalloc(sizeof(float) * max_tokens); p.amax = xmalloc(sizeof(int) * max_tokens);
    }

    MemPlan plan = model_mem_plan(&m);
    plan.grads = sizeof(float) * (double)optim_grad_floats(o);
    plan.moments = 2.0 * sizeof(float) * o->n_state;
    for (int i = 0; i < n_slots; i++) plan.acts += sizeof(float) * (double)slots[i].n_arena;
    if (dpo) { MemPlan rp = model_mem_plan(&ref); plan.weights += rp.weights; plan.acts += sizeof(float) * (double)ref.s.n_floats; }
    model_print_memory_plan(&m, &plan);
    if (mesh_is_root(&mesh)) {
        fprintf(stderr, "+------------------------+--------------------------------+\n");
        args_print(opts, n_opts);
        model_print_summary(&m);
        data_print_summary(&train, stderr);
        if (have_eval) data_print_summary(&val, stderr);
        optim_print_summary(o);
        fprintf(stderr, "steps %d (from %d), %d micro-batches of <= %d pairs per step per dp rank\n", steps_total, step0,
                M, batch_size);
    }
    FILE *metrics = NULL;
    if (mesh_is_root(&mesh)) {
        char *mp = path_join(out, "metrics.jsonl");
        metrics = fopen(mp, resume ? "a" : "w");
        if (!metrics) user_error("%s: cannot open for writing: %s", mp, strerror(errno));
        free(mp);
    }
    if (have_eval) {
        PrefStats e0 = evaluate(&p, &slots[0], &val);
        log_eval(&p, metrics, step0, &e0, "before");
    }

    double t_start = now_seconds();
    long tokens_done = 0;
    int step = step0, last = steps_total;
    if (stop_after > 0 && stop_after < last) last = stop_after;
    while (step < last && step_fill(&st, &train, &mesh)) {
        double t0 = now_seconds();
        optim_zero_grad(o, grads);
        /* each pair weighs dp / (the step's pairs): optim_step's dp mean gives the mean over pairs */
        p.hook.pair_weight = st.n_pairs ? (double)mesh.dp / (double)st.n_pairs : 0.0;
        memset(&p.hook.stats, 0, sizeof p.hook.stats);
        for (int i = 0; i < st.n; i++) {
            ctx[i] = (PrefCtx){st.margin + (size_t)i * max_tokens, refs + (size_t)i * max_tokens};
            st.mbs[i].ctx = &ctx[i];
            if (dpo) reference_logps(&p, &st.mbs[i], refs + (size_t)i * max_tokens);
        }
        schedule_1f1b(&m, slots, n_slots, st.mbs, st.n, &p.lh, &gw);
        PrefStats s = stats_share(&mesh, p.hook.stats);
        float lr_now = (float)optim_lr(o, o->step);
        float gnorm = optim_step(o, &m, grads);
        step++;
        tokens_done += st.n_tokens;
        double dt = now_seconds() - t0, el = now_seconds() - t_start;
        double eta = (last - step) * (el / (step - step0)), n = s.n_pairs > 0 ? s.n_pairs : 1;
        if (mesh_is_root(&mesh)) {
            if (step % log_every == 0 || step == last)
                fprintf(stderr, "step %d/%d | loss %.4f | accuracy %.3f | margin %.4f | lr %.3g | grad norm %.3f | %.0f tok/s | ETA %.0f s\n",
                        step, steps_total, s.loss / n, s.correct / n, (s.chosen - s.rejected) / n, lr_now, gnorm,
                        st.n_tokens / dt, eta);
            fprintf(metrics, "{\"step\": %d, ", step);
            metrics_fields(metrics, &p, &s, "");
            fprintf(metrics, ", \"lr\": %.9g, \"grad_norm\": %.9g, \"tokens\": %ld, \"tokens_per_s\": %.1f}\n", lr_now, gnorm,
                    st.n_tokens, st.n_tokens / dt);
            fflush(metrics);
        }
        if (have_eval && eval_every > 0 && step % eval_every == 0 && step != last) {
            PrefStats e = evaluate(&p, &slots[0], &val);
            log_eval(&p, metrics, step, &e, "");
        }
        if (save_every > 0 && step % save_every == 0 && step != last)
            trainer_save_checkpoint(&m, o, &train, model_dir, out, step, save_limit);
    }
    if (have_eval) {
        PrefStats e1 = evaluate(&p, &slots[0], &val);
        log_eval(&p, metrics, step, &e1, "after");
        if (!dpo && e1.n_pairs > 0) {   /* the eval rewards' mean and std, saved for normalisation */
            double k = 2.0 * e1.n_pairs, mean = (e1.chosen + e1.rejected) / k, var = e1.sq / k - mean * mean;
            m.cfg.has_reward_stats = 1;
            m.cfg.reward_mean = (float)mean;
            m.cfg.reward_std = (float)sqrt(var > 1e-12 ? var : 1e-12);
            if (mesh_is_root(&mesh)) {
                fprintf(stderr, "eval rewards: mean %.6f std %.6f (saved in config.json: normalize_reward)\n", mean,
                        (double)m.cfg.reward_std);
                fprintf(metrics, "{\"step\": %d, \"eval_reward_mean\": %.9g, \"eval_reward_std\": %.9g}\n", step, mean,
                        (double)m.cfg.reward_std);
            }
        }
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
    free(slots); free(grads); free(gl); free(ctx); free(refs);
    free(p.rows); free(p.lse); free(p.lp); free(p.amax_lp); free(p.amax);
    optim_free(o);
    data_free(&train);
    if (have_eval) data_free(&val);
    model_free(&m);
    if (dpo) { model_free(&ref); mesh_free(&ref_mesh); }
    mesh_free(&mesh);
    comm_finalize();
    return 0;
}

int rm_main(int argc, char **argv) { return pref_main(argc, argv, 0); }
int dpo_main(int argc, char **argv) { return pref_main(argc, argv, 1); }
