/* ppo_checkpoint.c — tandem ppo's checkpoints: out/checkpoint-STEP with the actor's and critic's
 * HF directories and optimizer states, then ppo_state.json (the step, the adaptive KL coefficient,
 * the seed and the role placement), and reading that state back for --resume.
 * Owns: the checkpoint directory's layout and ppo_state.json's format. */
#include "rlhf/ppo_checkpoint.h"
#include "runtime/adapter.h"
#include "runtime/lora.h"
#include "runtime/util.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* out/checkpoint-STEP: actor/ (causal LM) and critic/ (sequence classification), each an HF
 * directory with its optimizer state (layout-free: optimizer/), then ppo_state.json (world rank 0, atomic, written
 * last: a checkpoint without it is incomplete). Prompt order, samples and mini-batch shuffles are
 * pure functions of (seed, step), so the step is the whole data and RNG position. */
void ppo_checkpoint_save(const Roles *rs, Learner *learner, const char *const *load_dir, const char *out, int step,
                         double kl_coef, uint64_t seed, int save_limit, const char *inflight, size_t inflight_bytes) {
    char dir[4096], path[4200], err[CHECKPOINT_ERR_CAP] = "";
    snprintf(dir, sizeof dir, "%s/checkpoint-%d", out, step);
    if (rs->world_rank == 0) mkdir_p(dir);
    comm_barrier(&rs->world);
    for (int r = R_ACTOR; r <= R_CRITIC; r++) {
        if (!rs->role[r].member) continue;
        snprintf(path, sizeof path, "%s/%s", dir, ROLE_NAMES[r]);
        char e[CHECKPOINT_ERR_CAP];
        if (learner_save(&learner[r], load_dir[r], path, e) && !err[0]) snprintf(err, sizeof err, "%s", e);
    }
    if (inflight && rs->world_rank == 0) {
        snprintf(path, sizeof path, "%s/inflight.bin", dir);
        if (write_file_atomic(path, inflight, inflight_bytes) && !err[0])
            snprintf(err, sizeof err, "%s: cannot write: %s", path, strerror(errno));
    }
    /* a failed save stops the run (all roles): what is on disk is the previous complete checkpoint */
    snprintf(path, sizeof path, "%s/ppo_state.json", dir);
    if (comm_first_error(&rs->world, err, sizeof err)) {
        if (rs->world_rank == 0 && !file_exists(path)) remove_tree(dir);   /* one role's part alone is no checkpoint */
        job_error(rs->world_rank == 0, "%s", err);
    }
    if (rs->world_rank != 0) return;
    char json[1024];
    int n = snprintf(json, sizeof json, "{\"format\": \"tandem-ppo-state\", \"version\": 1, \"step\": %d, \"kl_coef\": %.17g, "
                     "\"seed\": %llu, \"placement\": \"%s\"}\n", step, kl_coef, (unsigned long long)seed, rs->placement);
    trainer_finish_checkpoint(dir, "ppo_state.json", json, (size_t)n, out, save_limit);
}

void ppo_checkpoint_merge(Roles *rs, const char *const *load_dir, const char *out, int step, DType save_dtype) {
    Role *R = rs->role;
    for (int r = R_ACTOR; r <= R_CRITIC; r++) {
        if (!R[r].member) continue;
        char ck[4200], err[CHECKPOINT_ERR_CAP], *root = path_join(out, "merged"), *dir = path_join(root, ROLE_NAMES[r]);
        snprintf(ck, sizeof ck, "%s/checkpoint-%d/%s", out, step, ROLE_NAMES[r]);
        if (R[r].mesh.rank == 0) mkdir_p(root);
        comm_barrier(&R[r].mesh.group);
        lora_merge(&R[r].m, ck);
        if (checkpoint_save_model(&R[r].m, load_dir[r], dir, 1, save_dtype, err)) job_error(R[r].mesh.rank == 0, "%s", err);
        if (R[r].mesh.rank == 0) fprintf(stderr, "merged %s\n", dir);
        free(dir);
        free(root);
    }
}

void ppo_state_load(const char *dir, PpoState *st) {
    char *path = path_join(dir, "ppo_state.json");
    char *text = read_file(path, NULL);
    if (!text) user_error("%s: missing: not a complete ppo checkpoint (was the run killed while saving?)", path);
    cJSON *o = cJSON_Parse(text);
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, "format"), *v = cJSON_GetObjectItemCaseSensitive(o, "version");
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "step"), *k = cJSON_GetObjectItemCaseSensitive(o, "kl_coef");
    const cJSON *pl = cJSON_GetObjectItemCaseSensitive(o, "placement");
    if (!cJSON_IsString(f) || strcmp(f->valuestring, "tandem-ppo-state") || !cJSON_IsNumber(v) || v->valueint != 1 ||
        !cJSON_IsNumber(s) || !cJSON_IsNumber(k) || !cJSON_IsString(pl))
        user_error("%s: not a tandem ppo state of version 1", path);
    st->step = s->valueint;
    st->kl_coef = k->valuedouble;
    snprintf(st->placement, sizeof st->placement, "%s", pl->valuestring);
    cJSON_Delete(o);
    free(text);
    free(path);
}
