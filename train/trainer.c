/* trainer.c — see trainer.h. */
#include "train/trainer.h"
#include "runtime/util.h"
#include "train/checkpoint.h"
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
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
}
void step_free(Step *s) {
    free(s->mbs); free(s->tokens); free(s->seq_start); free(s->targets); free(s->weight); free(s->margin);
}

/* Reads the step's M * dp micro-batches; keeps this dp rank's. Returns 0 when the data has ended
 * before a full step (the partial step is dropped: every dp rank must run the same M). */
int step_fill(Step *s, Data *d, const Mesh *mesh) {
    s->n = 0;
    s->loss_tokens = s->n_tokens = s->n_pairs = 0;
    DataBatch b;
    for (int k = 0; k < s->M * mesh->dp; k++) {
        if (!data_next_batch(d, &b)) return 0;
        s->loss_tokens += b.n_loss;
        s->n_tokens += b.n_tokens;
        if (b.margin) s->n_pairs += b.n_seqs / 2;
        if (k % mesh->dp != mesh->dp_rank) continue;
        int i = s->n++;
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
void trainer_save_checkpoint(Model *m, Optim *o, Data *d, const char *model_dir, const char *out, int step, int keep) {
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/checkpoint-%d", out, step);
    if (checkpoint_save_model(m, model_dir, dir, 1)) return;   /* the failing rank said why; go on */
    snprintf(path, sizeof path, "%s/optim.rank%d.bin", dir, m->mesh->rank);
    if (optim_save(o, path)) rank_error("%s: cannot write: %s", path, strerror(errno));
    comm_barrier(&m->mesh->group);
    if (m->mesh->rank != 0) return;
    uint8_t cur[DATA_CURSOR_BYTES];
    data_cursor_save(d, cur);
    char hex[2 * DATA_CURSOR_BYTES + 1];
    for (int i = 0; i < DATA_CURSOR_BYTES; i++) sprintf(hex + 2 * i, "%02x", cur[i]);
    char json[1024];
    int n = snprintf(json, sizeof json,
                     "{\"format\": \"tandem-trainer-state\", \"version\": 1, \"step\": %d, \"tp\": %d, \"pp\": %d, "
                     "\"dp\": %d, \"zero\": %d, \"data_cursor\": \"%s\"}\n",
                     step, m->mesh->tp, m->mesh->pp, m->mesh->dp, o->cfg.zero, hex);
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    if (write_file_atomic(path, json, (size_t)n)) user_error("%s: cannot write: %s", path, strerror(errno));
    fprintf(stderr, "saved %s\n", dir);
    trainer_rotate_checkpoints(out, keep);
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(path);
}

static int cmp_desc(const void *a, const void *b) { return *(const int *)b - *(const int *)a; }

void trainer_rotate_checkpoints(const char *out, int keep) {
    if (keep <= 0) return;
    DIR *d = opendir(out);
    if (!d) return;
    int *steps = NULL, n = 0;
    char path[4200];
    for (struct dirent *e; (e = readdir(d));) {
        int step, len = 0;
        if (sscanf(e->d_name, "checkpoint-%d%n", &step, &len) != 1 || e->d_name[len]) continue;
        snprintf(path, sizeof path, "%s/%s/trainer_state.json", out, e->d_name);
        int complete = file_exists(path);
        snprintf(path, sizeof path, "%s/%s/ppo_state.json", out, e->d_name);
        if (!complete && !file_exists(path)) continue;
        steps = xrealloc(steps, sizeof(int) * (n + 1));
        steps[n++] = step;
    }
    closedir(d);
    qsort(steps, n, sizeof(int), cmp_desc);
    for (int i = keep; i < n; i++) {
        snprintf(path, sizeof path, "%s/checkpoint-%d", out, steps[i]);
        if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS)) fprintf(stderr, "warning: %s: cannot delete: %s\n", path, strerror(errno));
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

