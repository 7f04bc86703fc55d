/* trainer.c — see trainer.h. */
#include "train/trainer.h"
#include "runtime/adapter.h"
#include "runtime/device.h"
#include "runtime/lora.h"
#include "runtime/util.h"
#include "kernels/kernels.h"
#include "train/checkpoint.h"
#include "train/optim_state.h"
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void step_alloc(Step *s, int M, int max_tokens) {
    memset(s, 0, sizeof(*s));
    s->M = M;
    s->max_tokens = max_tokens;
    s->mbs = xcalloc(M, sizeof(MicroBatch));
    s->tokens = xmalloc(sizeof(int) * (size_t)M * max_tokens);
    s->seq_start = xmalloc(sizeof(int) * (size_t)M * (max_tokens + 1));
    s->targets = xmalloc(sizeof(int) * (size_t)M * max_tokens);
    s->weight = xmalloc(sizeof(float) * (size_t)M * max_tokens);
    s->margin = xmalloc(sizeof(float) * (size_t)M * max_tokens);
    s->token0 = xmalloc(sizeof(long) * M);
}
void step_free(Step *s) {
    free(s->mbs); free(s->tokens); free(s->seq_start); free(s->targets); free(s->weight); free(s->margin); free(s->token0);
}

/* Reads the step's M * dp micro-batches; keeps this dp rank's. Returns 0 when the data has ended
 * before a full step (the partial step is dropped: every dp rank must run the same M). */
int step_fill(Step *s, Data *d, const Mesh *mesh) {
    s->n = 0;
    s->loss_tokens = s->n_tokens = s->n_pairs = 0;
    DataBatch b;
    for (int k = 0; k < s->M * mesh->dp; k++) {
        if (!data_next_batch(d, &b)) return 0;
        long token0 = s->n_tokens;
        s->loss_tokens += b.n_loss;
        s->n_tokens += b.n_tokens;
        if (b.margin) s->n_pairs += b.n_seqs / 2;
        if (k % mesh->dp != mesh->dp_rank) continue;
        int i = s->n++;
        s->token0[i] = token0;
        int *tok = s->tokens + (size_t)i * s->max_tokens, *st = s->seq_start + (size_t)i * (s->max_tokens + 1);
        int *tg = s->targets + (size_t)i * s->max_tokens;
        memcpy(tok, b.tokens, sizeof(int) * b.n_tokens);
        memcpy(st, b.seq_start, sizeof(int) * (b.n_seqs + 1));
        memcpy(tg, b.targets, sizeof(int) * b.n_tokens);
        if (b.margin) memcpy(s->margin + (size_t)i * s->max_tokens, b.margin, sizeof(float) * (b.n_seqs / 2));
        s->mbs[i] = (MicroBatch){tok, st, b.n_seqs, tg, s->weight + (size_t)i * s->max_tokens, NULL};
    }
    /* every position weighs 1 / (the step's loss tokens over all micro-batches and dp ranks) */
    float w = s->loss_tokens ? 1.0f / (float)s->loss_tokens : 0.0f;
    for (int i = 0; i < s->n; i++) {
        float *wt = s->weight + (size_t)i * s->max_tokens;
        int N = s->mbs[i].seq_start[s->mbs[i].n_seqs];
        for (int t = 0; t < N; t++) wt[t] = s->mbs[i].targets[t] >= 0 ? w : 0.0f;
    }
    return 1;
}

/* ---- checkpoints: out/checkpoint-STEP = HF model + this layout's training state ----------- */

/* trainer_state.json is written last (rank 0, atomic): a checkpoint without it is incomplete. */
void trainer_save_checkpoint(Learner *L, Data *d, const char *model_dir, const char *out, int step, int keep) {
    const Mesh *mesh = L->m->mesh;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/checkpoint-%d", out, step);
    char err[CHECKPOINT_ERR_CAP];
    /* a failed save stops the run: what is on disk is the previous complete checkpoint */
    if (learner_save(L, model_dir, dir, err)) job_error(mesh->rank == 0, "%s", err);
    comm_barrier(&mesh->group);
    if (mesh->rank != 0) return;
    uint8_t cur[DATA_CURSOR_BYTES];
    data_cursor_save(d, cur);
    char hex[2 * DATA_CURSOR_BYTES + 1];
    for (int i = 0; i < DATA_CURSOR_BYTES; i++) sprintf(hex + 2 * i, "%02x", cur[i]);
    char json[1024];
    int n = snprintf(json, sizeof json,
                     "{\"format\": \"tandem-trainer-state\", \"version\": 1, \"step\": %d, \"tp\": %d, \"pp\": %d, "
                     "\"dp\": %d, \"zero\": %d, \"data_cursor\": \"%s\"}\n",
                     step, mesh->tp, mesh->pp, mesh->dp, L->opt->cfg.zero, hex);
    trainer_finish_checkpoint(dir, "trainer_state.json", json, (size_t)n, out, keep);
}

void trainer_finish_checkpoint(const char *dir, const char *marker, const char *json, size_t n, const char *out, int keep) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, marker);
    if (write_file_atomic(path, json, n)) {
        int e = errno;
        remove_tree(dir);   /* no state file: not a checkpoint */
        user_error("%s: cannot write: %s", path, strerror(e));
    }
    fprintf(stderr, "saved %s\n", dir);
    trainer_rotate_checkpoints(out, keep, marker);
}

static int cmp_desc(const void *a, const void *b) { return *(const int *)b - *(const int *)a; }

void trainer_rotate_checkpoints(const char *out, int keep, const char *marker) {
    if (keep <= 0) return;
    DIR *d = opendir(out);
    if (!d) return;
    int *steps = NULL, n = 0;
    char path[4200];
    for (struct dirent *e; (e = readdir(d));) {
        int step, len = 0;
        if (sscanf(e->d_name, "checkpoint-%d%n", &step, &len) != 1 || e->d_name[len]) continue;
        snprintf(path, sizeof path, "%s/%s/%s", out, e->d_name, marker);
        if (!file_exists(path)) continue;
        steps = xrealloc(steps, sizeof(int) * (n + 1));
        steps[n++] = step;
    }
    closedir(d);
    qsort(steps, n, sizeof(int), cmp_desc);
    for (int i = keep; i < n; i++) {
        snprintf(path, sizeof path, "%s/checkpoint-%d", out, steps[i]);
        if (remove_tree(path)) fprintf(stderr, "warning: %s: cannot delete: %s\n", path, strerror(errno));
        else fprintf(stderr, "deleted %s (--save-total-limit %d)\n", path, keep);
    }
    free(steps);
}

/* Reads DIR/trainer_state.json; user_error when it is missing or not ours. */
void trainer_load_state(const char *dir, TrainerState *ts) {
    char *path = path_join(dir, "trainer_state.json");
    char *text = read_file(path, NULL);
    if (!text) user_error("%s: missing: not a complete checkpoint (was the run killed while saving?)", path);
    int v = 0;
    char hex[2 * DATA_CURSOR_BYTES + 8] = "";
    const char *p = strstr(text, "\"data_cursor\": \"");
    if (!strstr(text, "\"tandem-trainer-state\"") ||
        sscanf(strstr(text, "\"version\":") ? strstr(text, "\"version\":") : "", "\"version\": %d", &v) != 1 || v != 1 ||
        sscanf(strstr(text, "\"step\":"), "\"step\": %d, \"tp\": %d, \"pp\": %d, \"dp\": %d, \"zero\": %d", &ts->step,
               &ts->tp, &ts->pp, &ts->dp, &ts->zero) != 5 || !p || sscanf(p + 16, "%112[0-9a-f]", hex) != 1 ||
        strlen(hex) != 2 * DATA_CURSOR_BYTES)
        user_error("%s: not a tandem trainer state of version 1", path);
    for (int i = 0; i < DATA_CURSOR_BYTES; i++) {
        unsigned b;
        sscanf(hex + 2 * i, "%2x", &b);
        ts->cursor[i] = (uint8_t)b;
    }
    free(text);
    free(path);
}

/* NAME.tmp.DIGITS: a temporary that checkpoint_save_model or write_file_atomic names after its pid. */
static int is_tmp_name(const char *name) {
    const char *t = strstr(name, ".tmp.");
    if (!t || t == name || !t[5]) return 0;
    for (t += 5; *t; t++)
        if (*t < '0' || *t > '9') return 0;
    return 1;
}

/* Whether out/name is the --tensorboard directory or one of its parents (both exist on a rerun). */
static int holds_tensorboard(const char *out, const char *name, const char *tensorboard) {
    if (!tensorboard) return 0;
    char *entry = path_join(out, name), *a = realpath(entry, NULL), *b = realpath(tensorboard, NULL);
    size_t n = a ? strlen(a) : 0;
    int holds = a && b && !strncmp(a, b, n) && (b[n] == '\0' || b[n] == '/');
    free(entry);
    free(a);
    free(b);
    return holds;
}

/* Whether dir holds a command's state file (NAME_state.json: trainer_state.json, ppo_state.json, ...,
 * each command's written last), which makes a checkpoint complete. */
static int holds_state(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int found = 0;
    for (struct dirent *e; !found && (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        found = n > 11 && !strcmp(e->d_name + n - 11, "_state.json");
    }
    closedir(d);
    return found;
}

/* See trainer.h. */
void trainer_check_new_out(const char *out, const char *tensorboard) {
    DIR *d = opendir(out);
    if (!d) return;   /* absent (or not a directory: mkdir_p says so) */
    const char *blocker = NULL;
    for (struct dirent *e; !blocker && (e = readdir(d));) {
        const char *name = e->d_name;
        int step, len = 0;
        if (!strcmp(name, ".") || !strcmp(name, "..") || !strcmp(name, "metrics.jsonl")) continue;
        if (!strncmp(name, "metrics.jsonl.", 14) && is_tmp_name(name)) continue;   /* a killed resume's trim */
        if (holds_tensorboard(out, name, tensorboard)) continue;
        if (sscanf(name, "checkpoint-%d%n", &step, &len) != 1 || (name[len] && strncmp(name + len, ".tmp.", 5))) {
            blocker = name;   /* not a run's */
            continue;
        }
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", out, name);
        if (holds_state(path)) blocker = name;   /* a complete checkpoint, any command's */
    }
    char name[256];
    snprintf(name, sizeof name, "%s", blocker ? blocker : "");
    closedir(d);
    if (blocker)
        user_error("%s: already exists (use --resume DIR to continue a run, or --overwrite): it holds %s", out, name);
}

/* Removes the temporaries directly inside dir (a file or a whole tree each); in OUT itself
 * (top) only those of names a run writes there. */
static void remove_tmp_in(const char *dir, int top) {
    DIR *d = opendir(dir);
    if (!d) return;
    char path[4200];
    for (struct dirent *e; (e = readdir(d));) {
        if (!is_tmp_name(e->d_name)) continue;
        if (top && strncmp(e->d_name, "checkpoint-", 11) && strncmp(e->d_name, "metrics.jsonl.", 14)) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (remove_tree(path) != 0) user_error("%s: cannot remove a killed run's temporary: %s", path, strerror(errno));
        fprintf(stderr, "removed %s (a killed run's unfinished write)\n", path);
    }
    closedir(d);
}

/* See trainer.h. */
void trainer_remove_stale_tmp(const char *out) {
    remove_tmp_in(out, 1);
    DIR *d = opendir(out);
    if (!d) return;
    char path[4200];
    for (struct dirent *e; (e = readdir(d));) {
        int step, len = 0;
        if (sscanf(e->d_name, "checkpoint-%d%n", &step, &len) != 1 || e->d_name[len]) continue;
        snprintf(path, sizeof path, "%s/%s", out, e->d_name);
        remove_tmp_in(path, 0);
    }
    closedir(d);
}

/* The resume directory must hold the same architecture as --model (its config.json). */
void trainer_check_same_model(const char *model_dir, const char *resume_dir) {
    ModelConfig a, b;
    config_load(&a, model_dir);
    config_load(&b, resume_dir);
    if (a.dim != b.dim || a.hidden_dim != b.hidden_dim || a.n_layers != b.n_layers || a.n_heads != b.n_heads ||
        a.n_heads_kv != b.n_heads_kv || a.head_dim != b.head_dim || a.vocab_size != b.vocab_size ||
        strcmp(a.model_type, b.model_type))
        user_error("--resume %s: a checkpoint of another model (%s %dx%d, %d layers) than --model %s (%s %dx%d, %d layers)",
                   resume_dir, b.model_type, b.dim, b.hidden_dim, b.n_layers, model_dir, a.model_type, a.dim, a.hidden_dim,
                   a.n_layers);
}


/* ---- the loop ---------------------------------------------------------------------------- */

void run_options_check(TrainOptions *o) {
    o->dtype = dtype_parse("--dtype", o->dtype_name);
    o->save_dtype = dtype_parse("--save-dtype", o->save_dtype_name);
    kernel_options_set(o->kv_dtype_name, o->bf16_dot_name, o->device);
    if (o->save_limit < 0) user_error("--save-total-limit %d: must be >= 0", o->save_limit);
    if (!o->overwrite && !o->resume) trainer_check_new_out(o->out, o->tensorboard);
    if (o->tensorboard) tensorboard_check_dir(o->tensorboard);
    o->threads = backend_set_threads(o->threads);
}

void optim_options_check(const TrainOptions *o, int tp, const char *sp_refusal) {
    if (o->zero < 0 || o->zero > 3) user_error("--zero %d: must be 0, 1, 2 or 3", o->zero);
    if (o->sp && tp < 2) user_error("--sequence-parallel: %s", sp_refusal);
    if (o->lora_r < 0) user_error("--lora-r %d: must be >= 0 (0 = full training)", o->lora_r);
    if (o->merge && !o->lora_r) user_error("--merge: merges LoRA adapters; give --lora-r");
    if (!(o->lora_dropout >= 0 && o->lora_dropout < 1)) user_error("--lora-dropout %g: must be in [0, 1)", o->lora_dropout);
    if (o->merge && o->zero == 3) user_error("--merge with --zero 3: the merge needs the whole weights (merge from the checkpoint with --adapter)");
}

void train_moe_z_check(float coef, const ModelConfig *c) {
    if (!(coef >= 0 && isfinite(coef))) user_error("--moe-z-loss-coef %g: must be a finite number >= 0 (0 = off)", coef);
    if (c && coef != 0.0f && c->moe == MOE_NONE)
        user_error("--moe-z-loss-coef %g: the router z-loss needs a Mixture-of-Experts model (model_type %s has no "
                   "router)", coef, c->model_type);
}

void train_options_check(TrainOptions *o, const char *cmd) {
    comm_set_timeout(o->comm_timeout);
    if (!o->model_dir || !o->data_path || !o->out) user_error("%s: --model, --data and --out are required", cmd);
    if (o->seq_len < 2 || o->batch_size < 1 || o->M < 1 || o->epochs < 1 || o->max_steps < 0 || o->threads < 0 || o->warmup < 0)
        user_error("%s: --seq-len >= 2, --batch-size, --micro-batches, --epochs >= 1, --threads >= 0 required", cmd);
    if (!(o->lr > 0) || o->min_lr < 0 || o->wd < 0 || o->clip < 0 || !(o->beta1 >= 0 && o->beta1 < 1) ||
        !(o->beta2 >= 0 && o->beta2 < 1) || !(o->eps > 0))
        user_error("%s: invalid optimizer setting (--lr > 0, --min-lr/--weight-decay/--clip >= 0, betas in [0, 1), --eps > 0)", cmd);
    lr_schedule_parse("--lr-schedule", o->schedule_name);
    train_moe_z_check(o->moe_z_coef, NULL);
    if (strcmp(o->recompute_name, "none") && strcmp(o->recompute_name, "full"))
        user_error("--recompute %s: expected full or none", o->recompute_name);
    lora_options_check(&o->lora_r, &o->lora_alpha, &o->lora_target, &o->lora_rslora, &o->lora_dropout, o->resume, NULL);
    optim_options_check(o, o->tp, "needs --tp > 1 (it shares the tp ranks' rows)");
    if (o->lora_r && o->resume) {   /* a LoRA checkpoint: the adapter (the base is --model) */
        char *p = path_join(o->resume, "adapter_config.json");
        if (!file_exists(p)) user_error("%s: missing: --lora-r resumes from a LoRA run's checkpoint (a PEFT adapter directory)", p);
        free(p);
    }
    if (o->resume && !o->lora_r) trainer_check_same_model(o->model_dir, o->resume);
    run_options_check(o);
    if (o->resume && !o->lora_r) o->dtype = optim_state_dtype(o->resume, o->dtype);   /* auto: the run's */
    o->be = device_open(o->device);
}

/* Train and eval data, tokenized with --model's tokenizer. */
static void open_data(const TrainOptions *o, const TrainTask *t, Data *train, Data *val) {
    char err[1024];
    Tokenizer *tok = tokenizer_open(o->model_dir, err, sizeof err);
    if (!tok) user_error("%s", err);
    DataConfig dc = t->data;
    dc.seq_len = o->seq_len; dc.batch_size = o->batch_size; dc.shuffle = 1; dc.seed = (uint64_t)o->seed;
    dc.n_epochs = o->max_steps ? 0 : o->epochs;   /* --max-steps decides: the data repeats as needed */
    dc.skip_bad_records = o->skip_bad; dc.chat_template = o->chat_template;
    data_open(train, o->data_path, tok, &dc);
    if (o->eval_path) {
        DataConfig ec = dc;
        ec.shuffle = 0;
        ec.n_epochs = 1;
        data_open(val, o->eval_path, tok, &ec);
    }
    tokenizer_free(tok);
}

/* --max-steps, else every full step the epochs give */
static int count_steps(const TrainOptions *o, Data *train, const Mesh *mesh) {
    if (o->max_steps) return o->max_steps;
    DataBatch b;
    long n = 0;
    while (data_next_batch(train, &b)) n++;
    data_rewind(train);
    int steps = (int)(n / ((long)o->M * mesh->dp));
    if (steps < 1) user_error("%s: %ld micro-batches make no full step of %d x dp %d", o->data_path, n, o->M, mesh->dp);
    return steps;
}

/* --resume: the data position and the optimizer's state (resharded at another layout). */
static int resume_from(const TrainOptions *o, Learner *L, Data *train) {
    const Mesh *mesh = L->m->mesh;
    TrainerState ts;
    char err[1024];
    trainer_load_state(o->resume, &ts);
    if (data_cursor_restore(train, ts.cursor, DATA_CURSOR_BYTES, err, sizeof err))
        user_error("%s/trainer_state.json: %s", o->resume, err);
    int same = ts.tp == o->tp && ts.pp == o->pp && ts.dp == mesh->dp && ts.zero == o->zero;
    learner_resume(L, o->resume, same);
    if (L->opt->step != ts.step)
        user_error("%s: optimizer state at step %d, trainer_state.json at step %d: not one checkpoint", o->resume,
                   L->opt->step, ts.step);
    if (!same && mesh_is_root(mesh))
        fprintf(stderr, "resume: saved with tp=%d pp=%d dp=%d zero=%d, now tp=%d pp=%d dp=%d zero=%d: the weights, the "
                        "data position and the optimizer state (resharded) continue\n",
                ts.tp, ts.pp, ts.dp, ts.zero, o->tp, o->pp, mesh->dp, o->zero);
    return ts.step;
}

/* A MoE model's routing statistics of the step (learner.h), in the metrics line and so in TensorBoard:
 * moe_balance_loss, moe_z_loss (with --moe-z-loss-coef) and moe_tokens/E for every expert E (its
 * (token, choice) pairs summed over every layer, micro-batch and dp rank: one TensorBoard section) */
static void log_moe(const TrainOptions *o, MetricsLog *ml, const LearnerStep *r) {
    metrics_num(ml, "moe_balance_loss", r->moe_balance);
    if (o->moe_z_coef != 0.0f) metrics_num(ml, "moe_z_loss", r->moe_z);
    char key[32];
    for (int e = 0; r->moe_tokens && e < r->moe_n_experts; e++) {
        snprintf(key, sizeof key, "moe_tokens/%d", e);
        metrics_fmt(ml, key, "%.0f", r->moe_tokens[e]);
    }
}

/* The progress line and the metrics line of one step (the writer only). */
static void log_step(const TrainOptions *o, MetricsLog *ml, int step, int steps_total, int last, const Metric *met, int n,
                     const LearnerStep *r, const Step *st, double dt, double eta) {
    if (step % o->log_every == 0 || step == last) {
        fprintf(stderr, "step %d/%d | ", step, steps_total);
        for (int i = 0; i < n; i++)
            if (met[i].line) { fprintf(stderr, met[i].line, met[i].value); fputs(" | ", stderr); }
        fprintf(stderr, "lr %.3g | grad norm %.3f | %.0f tok/s | ETA %.0f s\n", r->lr, r->grad_norm, st->n_tokens / dt, eta);
    }
    metrics_begin(ml, step);
    for (int i = 0; i < n; i++) metrics_num(ml, met[i].key, met[i].value);
    if (r->moe_tokens) log_moe(o, ml, r);
    metrics_num(ml, "lr", r->lr);
    metrics_num(ml, "grad_norm", r->grad_norm);
    metrics_fmt(ml, "tokens", "%.0f", (double)st->n_tokens);
    metrics_fmt(ml, "tokens_per_s", "%.1f", st->n_tokens / dt);
    metrics_end(ml);
}

/* the task's eval pass, with whole weights (ZeRO-3: gathered for it; dp ranks may run other counts) */
static void evaluate(const TrainTask *t, Model *m, Learner *L, Data *val, int step, const char *when, MetricsLog *ml) {
    model_shards_gather_all(m);
    t->evaluate(t->ctx, &L->slots[0], val, step, when, ml);
    model_shards_release(m);
}

/* A step whose loss or gradient norm was not finite was not applied (learner_step); the run stops
 * here, before its metrics line and before any checkpoint, so OUT's last checkpoint is the last good
 * one. Every rank of the mesh gets here together (learner_step agrees over the mesh). */
static _Noreturn void stop_non_finite(const TrainOptions *o, const LearnerStep *r, int step) {
    user_error("step %d: %s is not finite (NaN or inf; lr %g): the step was not applied and no checkpoint was "
               "written after it; lower --lr (now %g) or check the data and the model", step, r->non_finite, r->lr, o->lr);
}

void train_run(const TrainOptions *o, Model *m, const TrainTask *t) {
    const Mesh *mesh = m->mesh;
    int root = mesh_is_root(mesh), have_eval = o->eval_path != NULL;
    Data train, val;
    open_data(o, t, &train, &val);
    int steps_total = count_steps(o, &train, mesh);
    int max_tokens = data_max_batch_tokens(&train);
    if (have_eval && data_max_batch_tokens(&val) > max_tokens) max_tokens = data_max_batch_tokens(&val);

    OptimConfig oc = optim_config_default();
    oc.lr = o->lr; oc.min_lr = o->min_lr; oc.warmup = o->warmup; oc.total_steps = steps_total;
    oc.schedule = lr_schedule_parse("--lr-schedule", o->schedule_name); oc.beta1 = o->beta1; oc.beta2 = o->beta2;
    oc.eps = o->eps; oc.weight_decay = o->wd; oc.clip = o->clip; oc.zero = o->zero;
    if (o->lora_r) {   /* the adapters, seeded by --seed: every layout draws the same A */
        int target[LORA_TARGETS];
        lora_targets_parse("--lora-target", o->lora_target, target);
        lora_new(m, o->lora_r, o->lora_alpha, o->lora_rslora, target, (uint64_t)o->seed);
        m->lora->dropout = o->lora_dropout;
        if (o->resume) lora_load(m, o->resume);
        if (root) fprintf(stderr, "LoRA: r %d, alpha %g, scale %g, %s; %zu trained parameters on rank 0\n", o->lora_r,
                          o->lora_alpha, m->lora->scale, o->lora_target, m->lora->n);
    }
    train_moe_z_check(o->moe_z_coef, &m->cfg);
    Learner L;
    learner_init(&L, m, oc, max_tokens, o->seq_len, o->M,
                 (!strcmp(o->recompute_name, "full") ? TRAIN_RECOMPUTE : 0) | (o->sp ? TRAIN_SEQ_PARALLEL : 0));
    L.save_dtype = o->save_dtype;
    L.moe_z_coef = o->moe_z_coef;
    int step0 = o->resume ? resume_from(o, &L, &train) : 0;
    mkdir_p(o->out);
    if (root) trainer_remove_stale_tmp(o->out);
    Step st;
    step_alloc(&st, o->M, max_tokens);
    if (m->lora) m->lora->token0 = st.token0;   /* LoRA dropout: masks by the tokens' places in the step */
    if (t->setup) t->setup(t->ctx, max_tokens, o->seq_len, o->M);

    MemPlan plan = model_mem_plan(m);
    learner_mem_plan(&L, &plan);
    if (t->mem_plan) t->mem_plan(t->ctx, &plan);
    model_print_memory_plan(m, &plan);
    if (root) {
        fprintf(stderr, "+------------------------+--------------------------------+\n");
        args_print(o->opts, o->n_opts);
        model_print_summary(m);
        data_print_summary(&train, stderr);
        if (have_eval) data_print_summary(&val, stderr);
        optim_print_summary(L.opt);
        fprintf(stderr, "steps %d (from %d), %d micro-batches of <= %d %s per step per dp rank\n", steps_total, step0, o->M,
                t->pairs ? o->batch_size : max_tokens, t->pairs ? "pairs" : "tokens");
    }
    int step = step0, last = steps_total;
    if (o->stop_after > 0 && o->stop_after < last) last = o->stop_after;
    MetricsLog ml, no_line = {0};
    metrics_open(&ml, o->out, o->tensorboard, o->resume ? step0 : -1, root);
    if (have_eval) {
        /* resumed at step0 > 0, the uninterrupted run has an eval line there only as an --eval-every
         * step (the "after" eval of the last step comes below): the eval is printed, its line
         * written only then, so the file stays equal to that run's */
        int line = !o->resume || (o->eval_every > 0 && step0 % o->eval_every == 0 && step0 != last);
        evaluate(t, m, &L, &val, step0, "before", line ? &ml : &no_line);
    }

    double t_start = now_seconds();
    long tokens_done = 0;
    while (step < last && step_fill(&st, &train, mesh)) {
        double t0 = now_seconds();
        if (t->prepare_step) t->prepare_step(t->ctx, &st);
        LearnerStep r = learner_step(&L, st.mbs, st.n, t->hook);
        if (r.non_finite) stop_non_finite(o, &r, step + 1);
        Metric met[TRAIN_MAX_METRICS];
        int n_met = t->step_metrics(t->ctx, &r, &st, met);
        step++;
        tokens_done += st.n_tokens;
        double dt = now_seconds() - t0, el = now_seconds() - t_start;
        double eta = (last - step) * (el / (step - step0));
        if (root) log_step(o, &ml, step, steps_total, last, met, n_met, &r, &st, dt, eta);
        if (have_eval && o->eval_every > 0 && step % o->eval_every == 0 && step != last)
            evaluate(t, m, &L, &val, step, "", &ml);
        if (o->save_every > 0 && step % o->save_every == 0 && step != last)
            trainer_save_checkpoint(&L, &train, o->model_dir, o->out, step, o->save_limit);
    }
    if (have_eval) evaluate(t, m, &L, &val, step, "after", &ml);
    trainer_save_checkpoint(&L, &train, o->model_dir, o->out, step, o->save_limit);
    if (o->merge) {   /* the last checkpoint's adapter into the weights, as --adapter merges it */
        char ck[4200], *dir = path_join(o->out, "merged"), err[CHECKPOINT_ERR_CAP];
        snprintf(ck, sizeof ck, "%s/checkpoint-%d", o->out, step);
        lora_merge(m, ck);
        if (checkpoint_save_model(m, o->model_dir, dir, 1, o->save_dtype, err)) job_error(m->mesh->rank == 0, "%s", err);
        if (root) fprintf(stderr, "merged %s\n", dir);
        free(dir);
    }
    if (root) {
        double el = now_seconds() - t_start;
        fprintf(stderr, "trained %d steps, %ld tokens in %.1f s (%.0f tok/s), peak RSS %.1f MiB\n", step - step0,
                tokens_done, el, tokens_done / (el > 0 ? el : 1), peak_rss_mib());
    }
    metrics_close(&ml);
    if (m->lora) m->lora->token0 = NULL;
    step_free(&st);
    learner_free(&L);
    data_free(&train);
    if (have_eval) data_free(&val);
}
