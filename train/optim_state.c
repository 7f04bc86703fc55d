/* optim_state.c — see optim_state.h. The sections are Optim's one state block in order (m, v,
 * master: optim.h), each written as its own HF directory of tensors. */
#include "train/optim_state.h"
#include "runtime/device.h"
#include "runtime/lora.h"
#include "runtime/comm.h"
#include "runtime/safetensors.h"
#include "runtime/util.h"
#include "train/checkpoint.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define STATE_FORMAT "tandem-optimizer"
#define STATE_VERSION 1
/* torch.optim.AdamW's state names; "master" only with BF16 weights (Optim.master) */
static const char *const SECTIONS[] = {"exp_avg", "exp_avg_sq", "master"};

static int n_sections(DType dt) { return dt == DTYPE_BF16 ? 3 : 2; }

/* ---- save ------------------------------------------------------------------------------------- */

/* One section as a ShardSource (checkpoint.h): a tensor's state on the ranks that send or write
 * it. Plain data parallel: dp rank 0 holds every element. ZeRO: dp rank r holds its piece of the
 * tensor (optim_piece: a run of it, or none), so the tensor is gathered onto dp rank 0 from each dp
 * rank that holds a piece (the same rule on every dp rank: no message is unmatched). */
typedef struct {
    const Optim *o;
    const float *section;   /* (n_state) the backend's memory: this section of Optim's state block */
    float *buf;             /* (cap) host: the tensor's shard, gathered */
    size_t cap;
} StateSource;

static const float *state_shard(void *ctx, const ParamInfo *in) {
    StateSource *s = ctx;
    const Optim *o = s->o;
    const Mesh *mesh = o->mesh;
    if (mesh->tp_rank % in->replicas != 0) return NULL;   /* another tp rank's identical copy is written */
    if (!o->cfg.zero && mesh->dp_rank != in->ep_owner) return NULL;  /* dp replicas: dp rank 0's (an expert: its ep rank's) */
    if (!s->buf || in->numel > s->cap) s->buf = xrealloc(s->buf, sizeof(float) * (s->cap = in->numel ? in->numel : 1));
    OptimPiece pc;
    if (!o->cfg.zero) {   /* plain: its holder has all of it */
        CHECK(optim_piece(o, 0, in->offset, &pc) == 1 && pc.lo == in->offset && pc.hi == in->offset + in->numel);
        o->be->to_host(s->buf, s->section + pc.held, sizeof(float) * in->numel);
        return s->buf;
    }
    /* ZeRO-1 at ep > 1: an expert's state is split over the edp group of its holders, gathered onto
     * edp rank 0 (the first ep group's rank ep_owner: checkpoint.c relays it to dp rank 0 from there) */
    int ex = mesh->ep > 1 && in->expert >= 0, me = ex ? mesh->edp_rank : mesh->dp_rank;
    const Comm *c = ex ? &mesh->edp_comm : &mesh->dp_comm;
    for (int r = 0; r < c->size; r++) {
        if (!optim_piece(o, ex ? r * mesh->ep : r, in->offset, &pc)) continue;   /* a dp rank of edp rank r */
        float *at = s->buf + (pc.lo - in->offset);
        size_t bytes = sizeof(float) * (pc.hi - pc.lo);
        if (r == me) {
            o->be->to_host(at, s->section + pc.held, bytes);
            if (r != 0) comm_send(c, at, bytes, 0);
        } else if (me == 0) {
            comm_recv(c, at, bytes, r);
        }
    }
    return me == 0 ? s->buf : NULL;
}

/* LoRA (OptimSet of the adapters): section k laid out as the adapters' arena on the host, every dp
 * rank's pieces (each element held by one dp rank under ZeRO, by every one plain: dp rank 0's) */
static float *lora_section(const Optim *o, int k) {
    float *host = xcalloc(o->n_params ? o->n_params : 1, sizeof(float));
    const Mesh *mesh = o->mesh;
    if (o->cfg.zero || mesh->dp_rank == 0)
        for (int i = 0; i < o->n_pieces; i++) {
            const OptimPiece *pc = &o->pieces[i];
            o->be->to_host(host + pc->lo, o->m + (size_t)k * o->n_state + pc->held, sizeof(float) * (pc->hi - pc->lo));
        }
    comm_all_reduce_sum(&mesh->dp_comm, host, o->n_params);   /* exact: one rank's value, zeros elsewhere */
    return host;
}

int optim_state_save(const Optim *o, const Model *m, const char *dir, char *err) {
    const Mesh *mesh = o->mesh;
    int ns = n_sections(o->dtype), rc = -1;
    char *root = path_join(dir, OPTIM_STATE_DIR);
    err[0] = 0;
    if (mesh->rank == 0) {   /* the directories, by one rank (dir is on a filesystem every rank sees) */
        for (int k = -1; k < ns && !err[0]; k++) {
            char *d = k < 0 ? xstrdup(root) : path_join(root, SECTIONS[k]);
            if (mkdir(d, 0755) != 0 && errno != EEXIST)
                snprintf(err, CHECKPOINT_ERR_CAP, "%s: cannot create directory: %s", d, strerror(errno));
            free(d);
        }
    }
    if (comm_first_error(&mesh->group, err, CHECKPOINT_ERR_CAP)) goto free_root;
    for (int k = 0; k < ns; k++) {
        char *d = path_join(root, SECTIONS[k]);
        int failed;
        if (o->params != m->params) {   /* LoRA's adapters: each section as an adapter file */
            float *host = lora_section(o, k);
            char *f = path_join(d, "adapter_model.safetensors");
            failed = lora_write_blocks(m, host, f, err, CHECKPOINT_ERR_CAP);
            free(f);
            free(host);
        } else {
            StateSource s = {o, o->m + (size_t)k * o->n_state, NULL, 0};
            ShardSource src = {state_shard, &s};
            failed = checkpoint_save_tensors(m, &src, d, DTYPE_F32, err);
            free(s.buf);
        }
        free(d);
        if (failed) goto free_root;
    }
    if (mesh->rank == 0) {   /* written last: the state is complete once it is there */
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "format", STATE_FORMAT);
        cJSON_AddNumberToObject(j, "version", STATE_VERSION);
        cJSON_AddNumberToObject(j, "step", o->step);
        cJSON_AddStringToObject(j, "dtype", dtype_name(o->dtype));
        cJSON *secs = cJSON_AddArrayToObject(j, "sections");
        for (int k = 0; k < ns; k++) cJSON_AddItemToArray(secs, cJSON_CreateString(SECTIONS[k]));
        cJSON *by = cJSON_AddObjectToObject(j, "saved_by");   /* for the reader: loading needs none of it */
        cJSON_AddNumberToObject(by, "tp", mesh->tp);
        cJSON_AddNumberToObject(by, "pp", mesh->pp);
        cJSON_AddNumberToObject(by, "dp", mesh->dp);
        cJSON_AddNumberToObject(by, "zero", o->cfg.zero);
        char *text = cJSON_Print(j), *path = path_join(root, OPTIM_STATE_FILE);
        cJSON_Delete(j);
        if (write_file_atomic(path, text, strlen(text)) != 0)
            snprintf(err, CHECKPOINT_ERR_CAP, "%s: cannot write: %s", path, strerror(errno));
        free(text);
        free(path);
    }
    rc = comm_first_error(&mesh->group, err, CHECKPOINT_ERR_CAP) ? -1 : 0;
free_root:
    free(root);
    return rc;
}

/* ---- load ------------------------------------------------------------------------------------- */

int optim_state_present(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/" OPTIM_STATE_DIR "/" OPTIM_STATE_FILE, dir);
    return file_exists(path);
}

DType optim_state_dtype(const char *dir, DType given) {
    if (given != DTYPE_AUTO) return given;
    char path[4200];
    snprintf(path, sizeof path, "%s/" OPTIM_STATE_DIR "/" OPTIM_STATE_FILE, dir);
    char *text = read_file(path, NULL);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    DType d = DTYPE_AUTO;
    if (cJSON_IsString(dt) && (!strcmp(dt->valuestring, "bf16") || !strcmp(dt->valuestring, "fp32")))
        d = dtype_parse("--dtype", dt->valuestring);
    cJSON_Delete(j);
    free(text);
    return d;
}

/* A section must hold exactly the checkpoint's own tensors (names and shapes of its weights, w):
 * checked on every rank for the whole model, so a bad file is one user_error whatever stage reads it. */
static void check_section(const SafeTensors *w, const SafeTensors *st, const char *sdir) {
    for (int i = 0; i < w->n_tensors; i++) {
        const StTensor *a = &w->tensors[i], *b = st_find(st, a->name);
        if (!b) user_error("%s: no state for tensor %s of the checkpoint's weights (not this checkpoint's optimizer "
                           "state?)", sdir, a->name);
        int same = a->ndim == b->ndim;
        for (int d = 0; same && d < a->ndim; d++) same = a->shape[d] == b->shape[d];
        if (!same || b->dtype != ST_F32)
            user_error("%s: tensor %s: %s state of another shape than the checkpoint's weights (not this checkpoint's "
                       "optimizer state?)", st->files[b->file].path, a->name, b->dtype != ST_F32 ? "non-F32" : "F32");
    }
    if (st->n_tensors != w->n_tensors)
        user_error("%s: %d tensors; the checkpoint's weights are %d (not this checkpoint's optimizer state?)", sdir,
                   st->n_tensors, w->n_tensors);
}

void optim_state_load(Optim *o, const Model *m, const char *dir) {
    char *root = path_join(dir, OPTIM_STATE_DIR), *jpath = path_join(root, OPTIM_STATE_FILE);
    char *text = read_file(jpath, NULL);
    if (!text) user_error("%s: cannot read: %s (not a complete checkpoint?)", jpath, strerror(errno));
    cJSON *j = cJSON_Parse(text);
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(j, "format"), *v = cJSON_GetObjectItemCaseSensitive(j, "version");
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "step"), *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    if (!cJSON_IsString(f) || strcmp(f->valuestring, STATE_FORMAT) || !cJSON_IsNumber(v) || !cJSON_IsNumber(s) ||
        s->valuedouble < 0 || s->valuedouble > 2e9 || !cJSON_IsString(dt))
        user_error("%s: not a tandem optimizer state (format \"" STATE_FORMAT "\", a step and a dtype)", jpath);
    if (v->valueint != STATE_VERSION)
        user_error("%s: optimizer state format version %d; this build reads version %d: resume with the build that "
                   "saved it", jpath, v->valueint, STATE_VERSION);
    if (strcmp(dt->valuestring, dtype_name(o->dtype)))
        user_error("%s: saved by a run with %s weights; this run has %s weights: resume with --dtype %s (or --dtype "
                   "auto, which takes this file's)", jpath, dt->valuestring, dtype_name(o->dtype), dt->valuestring);
    int step = s->valueint;
    cJSON_Delete(j);
    free(text);

    if (o->params != m->params) {   /* LoRA's adapters: each section an adapter file */
        float *host = xmalloc(sizeof(float) * (o->n_params ? o->n_params : 1));
        for (int k = 0; k < n_sections(o->dtype); k++) {
            char *f = path_join(root, SECTIONS[k]), *p = path_join(f, "adapter_model.safetensors");
            lora_read_blocks(m, p, host);
            for (int i = 0; i < o->n_pieces; i++) {
                const OptimPiece *pc = &o->pieces[i];
                for (size_t e = pc->lo; k == 1 && e < pc->hi; e++)
                    if (host[e] < 0) user_error("%s: a negative second moment: a corrupt optimizer state", p);
                o->be->to_device(o->m + (size_t)k * o->n_state + pc->held, host + pc->lo, sizeof(float) * (pc->hi - pc->lo));
            }
            free(p);
            free(f);
        }
        free(host);
        free(jpath);
        free(root);
        o->step = step;
        return;
    }
    int n = model_param_infos(m, NULL, 0);
    ParamInfo *infos = xmalloc(sizeof(ParamInfo) * (size_t)n);
    model_param_infos(m, infos, n);
    SafeTensors *w = st_open_dir(dir);   /* the checkpoint's weights: what every section must match */
    float *buf = NULL;                   /* (cap) host: one tensor's block, then to the backend */
    size_t cap = 0;
    for (int k = 0; k < n_sections(o->dtype); k++) {
        char *sdir = path_join(root, SECTIONS[k]);
        SafeTensors *st = st_open_dir(sdir);
        check_section(w, st, sdir);
        float *section = o->m + (size_t)k * o->n_state;   /* the backend's memory: the held floats */
        for (int i = 0; i < n; i++) {
            const ParamInfo *in = &infos[i];
            OptimPiece pc;
            if (!optim_piece(o, o->mesh->dp_rank, in->offset, &pc)) continue;   /* none in this rank's ZeRO slices */
            size_t lo = pc.lo, hi = pc.hi;
            if (in->numel > cap) buf = xrealloc(buf, sizeof(float) * (cap = in->numel));
            /* a tied lm_head's copy on the last stage is the embedding's state, as its weights are */
            int tied_copy = m->cfg.tie_embeddings && !strcmp(in->name, "lm_head.weight");
            const char *name = tied_copy ? "model.embed_tokens.weight" : in->name;
            st_read_block(st, name, in->rows_global, in->cols_global, in->row0, in->rows, in->col0,
                          in->cols ? in->cols : 1, buf, DTYPE_F32);   /* rows past the vocab: zero */
            for (size_t e = 0; e < in->numel; e++)
                if (!isfinite(buf[e]) || (k == 1 && buf[e] < 0.0f))
                    rank_error("%s: tensor %s holds %g at element %zu of this rank's block: a corrupt optimizer "
                               "state (restore the checkpoint)", st->files[st_find(st, name)->file].path, name,
                               buf[e], e);
            o->be->to_device(section + pc.held, buf + (lo - in->offset), sizeof(float) * (hi - lo));
        }
        st_close(st);
        free(sdir);
    }
    st_close(w);
    free(buf);
    free(infos);
    free(jpath);
    free(root);
    o->step = step;
}
