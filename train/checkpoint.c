/* checkpoint.c — see checkpoint.h. Saving walks model_param_infos (the spec table) and nothing
 * else: each ParamInfo says where a shard sits in its HF tensor, so gathering needs no knowledge of
 * which tensor is split how.
 *
 * Who does what (dp ranks > 0 hold copies of dp rank 0's weights and only join the collectives):
 *   rank 0              checks out_dir, creates out_dir.tmp.<pid>, writes config.json and the
 *                       tokenizer files there, broadcasts the temp name; later writes the index
 *                       and publishes the directory with one rename.
 *   tp rank 0, dp 0     of each stage: receives the other tp ranks' shards tensor by tensor, places
 *                       them by (row0, col0), writes the stage's file, sends its tensor names to
 *                       rank 0 (over the pp group: those writers are exactly one pp group).
 *   tp rank r > 0, dp 0 sends (ParamInfo, shard) of each tensor to its tp rank 0, unless its copy
 *                       is a replica (norms; a kv head shared by several tp ranks): only the first
 *                       rank of each replica group sends, every copy being identical.
 *   dp q, 0 < q < ep    expert parallelism: the first ep group's rank q holds experts [q E/ep, ...):
 *                       it sends each of their shards to its dp rank 0 (same tp rank) over the ep
 *                       group, in tensor order, which then sends or writes it as its own. */
#include "train/checkpoint.h"
#include "runtime/comm.h"
#include "runtime/safetensors.h"
#include "runtime/util.h"
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const COPY_FILES[] = {CHECKPOINT_COPY_FILES};
#define N_COPY_FILES ((int)(sizeof(COPY_FILES) / sizeof(COPY_FILES[0])))

/* ---- small filesystem helpers (rank 0) ---------------------------------------------------- */

/* fsync a directory so a rename inside it survives a crash; best effort (some filesystems refuse). */
static void fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return;
    fsync(fd);
    close(fd);
}

static void parent_of(const char *path, char *out, size_t cap) {
    snprintf(out, cap, "%s", path);
    char *slash = strrchr(out, '/');
    if (!slash) snprintf(out, cap, ".");
    else if (slash == out) out[1] = 0;
    else *slash = 0;
}

/* ---- config.json ------------------------------------------------------------------------- */

/* src's config.json with the top-level "torch_dtype" set to dt ("float32" or "bfloat16": the dtype
 * of the stored tensors). When the key appears exactly once the text is kept byte for byte apart from that
 * value; otherwise (absent, or nested copies in sub-configs) the JSON is re-printed. NULL if not a
 * JSON object. malloc'd. */
static char *config_text_dtype(const char *text, const char *dt) {
    cJSON *root = cJSON_Parse(text);
    if (!cJSON_IsObject(root)) { cJSON_Delete(root); return NULL; }
    const char *key = "\"torch_dtype\"";
    const char *k = strstr(text, key);
    char *out = NULL;
    if (cJSON_IsString(cJSON_GetObjectItemCaseSensitive(root, "torch_dtype")) && k && !strstr(k + 1, key)) {
        const char *v = k + strlen(key);
        while (isspace((unsigned char)*v)) v++;
        if (*v == ':') v++;
        while (isspace((unsigned char)*v)) v++;
        const char *end = *v == '"' ? strchr(v + 1, '"') : NULL;
        if (end) {
            size_t head = (size_t)(v - text), n = head + strlen(dt) + 2 + strlen(end + 1) + 1;
            out = xmalloc(n);
            snprintf(out, n, "%.*s\"%s\"%s", (int)head, text, dt, end + 1);
        }
    }
    if (!out) {
        cJSON_DeleteItemFromObjectCaseSensitive(root, "torch_dtype");
        cJSON_AddStringToObject(root, "torch_dtype", dt);
        out = cJSON_Print(root);
    }
    cJSON_Delete(root);
    return out;
}

/* A score-head model's config.json, as transformers writes a *ForSequenceClassification: the
 * family's architecture, num_labels 1 (id2label / label2id dropped so they cannot disagree), a
 * pad_token_id (score_pad_id: transformers needs one to find each row's last token in a padded
 * batch) and no tied embeddings. text: config_text_dtype's output; malloc'd. */
static int is_eos(const ModelConfig *c, int id) {
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == id) return 1;
    return 0;
}
/* transformers pools a sequence-classification score at the token before the first pad_token_id,
 * so the pad must not be EOS (Tandem's sequences end with EOS, where the reward is read): the
 * model's own pad if it is not an EOS, else 0 (<unk> in LLaMA's vocabularies), else the last id. */
static int score_pad_id(const ModelConfig *c) {
    if (c->pad_id >= 0 && !is_eos(c, c->pad_id)) return c->pad_id;
    if (!is_eos(c, 0) && c->bos_id != 0) return 0;
    return c->vocab_size - 1;
}

static char *config_text_score(char *text, const ModelConfig *c) {
    cJSON *root = cJSON_Parse(text);
    free(text);
    CHECK(cJSON_IsObject(root));
    static const char *const FAMILY[][2] = {{"llama", "Llama"}, {"mistral", "Mistral"}, {"qwen2", "Qwen2"}, {"qwen3", "Qwen3"}};
    const char *fam = "Llama";
    for (size_t i = 0; i < sizeof FAMILY / sizeof FAMILY[0]; i++)
        if (!strcmp(c->model_type, FAMILY[i][0])) fam = FAMILY[i][1];
    char arch[64];
    snprintf(arch, sizeof arch, "%sForSequenceClassification", fam);
    const char *drop[] = {"architectures", "num_labels", "id2label", "label2id", "pad_token_id", "tie_word_embeddings"};
    for (size_t i = 0; i < sizeof drop / sizeof drop[0]; i++) cJSON_DeleteItemFromObjectCaseSensitive(root, drop[i]);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "architectures"), cJSON_CreateString(arch));
    cJSON_AddNumberToObject(root, "num_labels", 1);
    cJSON_AddNumberToObject(root, "pad_token_id", score_pad_id(c));
    cJSON_AddBoolToObject(root, "tie_word_embeddings", 0);
    const char *stats[] = {"normalize_reward", "mean", "std"};
    for (size_t i = 0; i < 3; i++) cJSON_DeleteItemFromObjectCaseSensitive(root, stats[i]);
    if (c->has_reward_stats) {   /* OpenRLHF's names: r_normalized = (r - mean) / std */
        cJSON_AddBoolToObject(root, "normalize_reward", 1);
        cJSON_AddNumberToObject(root, "mean", c->reward_mean);
        cJSON_AddNumberToObject(root, "std", c->reward_std);
    }
    char *out = cJSON_Print(root);
    cJSON_Delete(root);
    return out;
}

/* ---- step 1 (rank 0): check, create the temp directory, write config and tokenizer files ---- */

enum { PREP_OK = 0, PREP_USER_ERROR, PREP_IO_ERROR };
typedef struct {
    int status;
    char text[1024];         /* the error line, without "tandem: " */
    char tmp[PATH_MAX];      /* out_dir.tmp.<pid>: where every writer writes */
} Prepare;

__attribute__((format(printf, 3, 4))) static void prep_fail(Prepare *p, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    p->status = status;
    vsnprintf(p->text, sizeof p->text, fmt, ap);
    va_end(ap);
}

/* Copies src_dir/name to dir/name if present. Returns 0, -1 (unreadable source: PREP_USER_ERROR set),
 * or -2 (write failed: PREP_IO_ERROR set). */
static int copy_file(const char *src_dir, const char *dir, const char *name, const char *text, Prepare *p) {
    char *src = path_join(src_dir, name), *dst = path_join(dir, name);
    int rc = 0;
    size_t len = text ? strlen(text) : 0;
    char *data = text ? NULL : read_file(src, &len);
    if (!text && !data) {
        prep_fail(p, PREP_USER_ERROR, "%s: cannot read: %s", src, strerror(errno));
        rc = -1;
    } else if (write_file_atomic(dst, text ? text : data, len) != 0) {
        prep_fail(p, PREP_IO_ERROR, "%s: cannot write: %s", dst, strerror(errno));
        rc = -2;
    }
    free(data);
    free(src);
    free(dst);
    return rc;
}

/* score: the model's config when it has a score head (its config.json says so), else NULL */
static void prepare(const char *src_dir, const char *out_dir, int overwrite, const ModelConfig *score, DType dt,
                    Prepare *p) {
    struct stat st;
    if (strlen(out_dir) + 32 >= sizeof p->tmp) {
        prep_fail(p, PREP_USER_ERROR, "%s: path too long", out_dir);
        return;
    }
    if (stat(out_dir, &st) == 0) {
        char *cfg = path_join(out_dir, "config.json");
        int is_model = S_ISDIR(st.st_mode) && file_exists(cfg);
        free(cfg);
        if (!overwrite) {
            prep_fail(p, PREP_USER_ERROR, "%s: already exists; not replacing it (ask for overwrite)", out_dir);
            return;
        }
        if (!is_model) {
            prep_fail(p, PREP_USER_ERROR, "%s: exists and is not a model directory (no config.json); not replacing it",
                      out_dir);
            return;
        }
    }
    char *cfg_path = path_join(src_dir, "config.json");
    char *cfg_text = read_file(cfg_path, NULL);
    char *cfg_out = cfg_text ? config_text_dtype(cfg_text, dt == DTYPE_BF16 ? "bfloat16" : "float32") : NULL;
    if (!cfg_text) prep_fail(p, PREP_USER_ERROR, "%s: cannot read: %s", cfg_path, strerror(errno));
    else if (!cfg_out) prep_fail(p, PREP_USER_ERROR, "%s: not a JSON object", cfg_path);
    free(cfg_text);
    free(cfg_path);
    if (p->status) return;
    if (score) cfg_out = config_text_score(cfg_out, score);

    if (snprintf(p->tmp, sizeof p->tmp, "%s.tmp.%d", out_dir, (int)getpid()) >= (int)sizeof p->tmp) {
        prep_fail(p, PREP_USER_ERROR, "%s: path too long", out_dir);   /* never a truncated name to remove_tree */
        free(cfg_out);
        return;
    }
    if (stat(p->tmp, &st) == 0) remove_tree(p->tmp);  /* left by a killed run that had our pid */
    if (mkdir_parents(p->tmp) != 0 || mkdir(p->tmp, 0755) != 0) {
        prep_fail(p, PREP_USER_ERROR, "%s: cannot create directory: %s", p->tmp, strerror(errno));
        free(cfg_out);
        return;
    }
    int rc = copy_file(src_dir, p->tmp, "config.json", cfg_out, p);
    free(cfg_out);
    for (int i = 0; i < N_COPY_FILES && rc == 0; i++) {
        char *src = path_join(src_dir, COPY_FILES[i]);
        int present = file_exists(src);
        free(src);
        if (present) rc = copy_file(src_dir, p->tmp, COPY_FILES[i], NULL, p);
    }
    if (rc != 0) remove_tree(p->tmp);
}

/* ---- step 2 (dp rank 0 of every stage): gather each tensor, write the stage file ---------- */

/* Copies one shard (in->rows, in->cols; cols 0 = 1-D) into its place in the full HF tensor
 * (rows_global, cols_global), dropping rows past rows_global (vocab padding). Returns the number of
 * elements placed. */
static size_t place_shard(float *full, const ParamInfo *in, const float *shard) {
    size_t cols = in->cols ? (size_t)in->cols : 1, cols_global = in->cols_global ? (size_t)in->cols_global : 1;
    CHECK((size_t)in->col0 + cols <= cols_global);
    size_t placed = 0;
    for (int r = 0; r < in->rows; r++) {
        size_t gr = (size_t)in->row0 + (size_t)r;
        if (gr >= (size_t)in->rows_global) break;
        memcpy(full + gr * cols_global + (size_t)in->col0, shard + (size_t)r * cols, sizeof(float) * cols);
        placed += cols;
    }
    return placed;
}

/* Tied embeddings: lm_head.weight is embed_tokens.weight and is not written. On one stage the
 * infos list it once (as the embedding); with pp > 1 the last stage lists its copy as lm_head. */
static int skip_tensor(const Model *m, const ParamInfo *in) {
    return m->cfg.tie_embeddings && strcmp(in->name, "lm_head.weight") == 0;
}

typedef struct {
    char *names;      /* this stage's tensor names, each followed by '\n' (writers only) */
    size_t len;
    int64_t bytes;    /* sum of the stage's tensor sizes in bytes */
} StageList;

/* The weights as a ShardSource: each shard as fp32 (a bf16 weight's exact upcast), copied out of
 * the backend's memory (numel elements of the model's dtype); only where it is sent or written. */
typedef struct {
    const Model *m;
    void *raw;          /* (numel) the shard in the model's dtype */
    float *f;           /* (numel) the same as fp32 */
    size_t cap;         /* elements of each */
} WeightSource;

static const float *weight_shard(void *ctx, const ParamInfo *in) {
    WeightSource *s = ctx;
    const Model *m = s->m;
    const Mesh *mesh = m->mesh;
    if (mesh->dp_rank != in->ep_owner || mesh->tp_rank % in->replicas != 0) return NULL;   /* ep: its holder */
    size_t es = dtype_size(m->dtype);
    if (!s->raw || in->numel > s->cap) {
        s->cap = in->numel ? in->numel : 1;
        s->raw = xrealloc(s->raw, es * s->cap);
        s->f = xrealloc(s->f, sizeof(float) * s->cap);
    }
    m->be->to_host(s->raw, model_tensor_data(m, in), es * in->numel);
    if (m->dtype == DTYPE_F32) return s->raw;
    for (size_t k = 0; k < in->numel; k++) s->f[k] = weight_at(s->raw, m->dtype, k);
    return s->f;
}

/* Every rank of the mesh calls it: src->shard runs everywhere (a source may gather over dp), the
 * tp groups of dp rank 0 gather and write. A failed write puts its line in err (cap
 * CHECKPOINT_ERR_CAP; left "" when this rank wrote fine). */
static void save_stage(const Model *m, const ShardSource *src, DType dt, const char *tmp, StageList *list, char *err) {
    const Mesh *mesh = m->mesh;
    const Comm *tpc = &mesh->tp_comm;
    int tp = mesh->tp, writer = mesh->tp_rank == 0 && mesh->dp_rank == 0;
    int n = model_param_infos_all(m, NULL, 0);   /* every expert, those other ep ranks hold too */
    ParamInfo *infos = xmalloc(sizeof(ParamInfo) * (size_t)n);
    CHECK(model_param_infos_all(m, infos, n) == n);

    /* the writer streams the stage file: header from the shapes, then each tensor as it is gathered,
     * so it never holds more than one full tensor */
    StWriter *w = NULL;
    char who[32] = "";   /* which rank failed, when there are several */
    if (mesh->size > 1) snprintf(who, sizeof who, "[rank %d] ", mesh->rank);
    char *path = NULL;
    if (writer) {
        StWriteTensor *hdr = xcalloc((size_t)n, sizeof(StWriteTensor));
        int nh = 0;
        for (int i = 0; i < n; i++) {
            if (skip_tensor(m, &infos[i])) continue;
            hdr[nh++] = (StWriteTensor){infos[i].name, infos[i].cols_global ? 2 : 1,
                                        {infos[i].rows_global, infos[i].cols_global}, NULL};
        }
        char name[64];
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", mesh->pp_rank + 1, mesh->pp);
        path = path_join(tmp, name);
        if (!dir_exists(tmp))
            snprintf(err, CHECKPOINT_ERR_CAP, "%s%s: directory not visible from this rank (the output must be "
                     "on a filesystem every rank sees)", who, tmp);
        else if (!(w = st_writer_open(path, hdr, nh, dt == DTYPE_BF16 ? ST_BF16 : ST_F32)))
            snprintf(err, CHECKPOINT_ERR_CAP, "%s%s: cannot write: %s", who, path, strerror(errno));
        free(hdr);
    }
    size_t cap = 0, names_cap = 0, relay_cap = 0;
    float *recv_buf = NULL;     /* one shard from another tp rank */
    float *relay = NULL;        /* ep > 1: an expert's shard from the ep rank holding it */
    for (int i = 0; i < n; i++) {
        const ParamInfo *in = &infos[i];
        if (skip_tensor(m, in)) continue;
        const float *shard = in->held ? src->shard(src->ctx, in) : NULL;   /* on every rank, in tensor order */
        /* an expert of ep rank q > 0: dp rank q (the first ep group's) sends its shard to dp rank 0 */
        if (in->ep_owner && mesh->dp_rank == in->ep_owner) {
            CHECK(shard != NULL);
            comm_send(&mesh->ep_comm, shard, sizeof(float) * in->numel, 0);
        }
        if (mesh->dp_rank != 0) continue;
        if (in->ep_owner) {
            if (in->numel > relay_cap) relay = xrealloc(relay, sizeof(float) * (relay_cap = in->numel));
            comm_recv(&mesh->ep_comm, relay, sizeof(float) * in->numel, in->ep_owner);
            shard = relay;
        }
        /* replicas: consecutive tp ranks holding the same copy (all tp for norms); the first of each
         * group stands for it */
        if (!writer) {
            if (mesh->tp_rank % in->replicas == 0) {
                CHECK(shard != NULL);
                comm_send(tpc, in, sizeof(ParamInfo), 0);
                comm_send(tpc, shard, sizeof(float) * in->numel, 0);
            }
            continue;
        }
        CHECK(shard != NULL);
        size_t cols_global = in->cols_global ? (size_t)in->cols_global : 1;
        size_t numel_global = (size_t)in->rows_global * cols_global;
        float *full = xmalloc(sizeof(float) * numel_global);
        size_t placed = place_shard(full, in, shard);
        for (int r = in->replicas; r < tp; r += in->replicas) {
            ParamInfo rin;
            comm_recv(tpc, &rin, sizeof rin, r);
            CHECK(strcmp(rin.name, in->name) == 0 && rin.numel == in->numel);
            if (in->numel > cap) recv_buf = xrealloc(recv_buf, sizeof(float) * (cap = in->numel));
            comm_recv(tpc, recv_buf, sizeof(float) * in->numel, r);
            placed += place_shard(full, &rin, recv_buf);
        }
        CHECK(placed == numel_global);  /* the shards tile the tensor exactly once */
        /* a failed write still gathers the rest: the other tp ranks are sending */
        if (w && st_writer_put(w, full, numel_global) != 0 && !err[0])
            snprintf(err, CHECKPOINT_ERR_CAP, "%s%s: cannot write: %s", who, path, strerror(errno));
        free(full);
        size_t need = list->len + strlen(in->name) + 2;
        if (need > names_cap) list->names = xrealloc(list->names, names_cap = 2 * need);
        list->len += (size_t)snprintf(list->names + list->len, names_cap - list->len, "%s\n", in->name);
        list->bytes += (int64_t)(dtype_size(dt) * numel_global);
    }
    free(recv_buf);
    free(relay);
    if (w && st_writer_close(w) != 0 && !err[0])
        snprintf(err, CHECKPOINT_ERR_CAP, "%s%s: cannot write: %s", who, path, strerror(errno));
    free(path);
    free(infos);
}

/* ---- step 3 (the stage writers, one pp group): the index, written by rank 0 ---------------- */

typedef struct {
    const char *name;
    int stage;
} MapEntry;
static int map_cmp(const void *a, const void *b) {
    return strcmp(((const MapEntry *)a)->name, ((const MapEntry *)b)->name);
}

/* Stage writers send their lists to pp rank 0 (world rank 0), which writes
 * model.safetensors.index.json with the weight_map sorted by name (as transformers writes it).
 * A failed write puts its line in err (rank 0). */
static void write_index(const Model *m, const char *tmp, StageList *mine, char *err) {
    const Mesh *mesh = m->mesh;
    const Comm *ppc = &mesh->pp_comm;
    int pp = mesh->pp;
    if (mesh->pp_rank != 0) {
        int64_t hdr[2] = {(int64_t)mine->len, mine->bytes};
        comm_send(ppc, hdr, sizeof hdr, 0);
        comm_send(ppc, mine->names, mine->len, 0);
        return;
    }
    StageList *lists = xcalloc((size_t)pp, sizeof(StageList));
    lists[0] = *mine;
    int n_names = 0;
    int64_t total = 0;
    for (int s = 0; s < pp; s++) {
        if (s > 0) {
            int64_t hdr[2];
            comm_recv(ppc, hdr, sizeof hdr, s);
            lists[s].len = (size_t)hdr[0];
            lists[s].bytes = hdr[1];
            lists[s].names = xmalloc(lists[s].len + 1);
            comm_recv(ppc, lists[s].names, lists[s].len, s);
        }
        for (size_t i = 0; i < lists[s].len; i++) n_names += lists[s].names[i] == '\n';
        total += lists[s].bytes;
    }
    MapEntry *map = xmalloc(sizeof(MapEntry) * (size_t)(n_names ? n_names : 1));
    int k = 0;
    for (int s = 0; s < pp; s++)
        for (char *p = lists[s].names, *e; p && p < lists[s].names + lists[s].len; p = e + 1) {
            e = strchr(p, '\n');
            *e = 0;
            map[k++] = (MapEntry){p, s};
        }
    qsort(map, (size_t)k, sizeof(MapEntry), map_cmp);

    cJSON *root = cJSON_CreateObject();
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(root, "metadata"), "total_size", (double)total);
    cJSON *wm = cJSON_AddObjectToObject(root, "weight_map");
    for (int i = 0; i < k; i++) {
        char file[64];
        snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", map[i].stage + 1, pp);
        cJSON_AddStringToObject(wm, map[i].name, file);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    char *path = path_join(tmp, "model.safetensors.index.json");
    if (write_file_atomic(path, text, strlen(text)) != 0 && !err[0])
        snprintf(err, CHECKPOINT_ERR_CAP, "%s: cannot write: %s", path, strerror(errno));
    free(path);
    free(text);
    free(map);
    for (int s = 1; s < pp; s++) free(lists[s].names);
    free(lists);
}

/* Steps 2 and 3 on every rank: the stage files and the index in dir. Returns comm_first_error's
 * answer over the mesh (also: every writer has finished). */
static int save_tensors(const Model *m, const ShardSource *src, const char *dir, DType dt, char *err) {
    const Mesh *mesh = m->mesh;
    StageList list = {0};
    save_stage(m, src, dt, dir, &list, err);
    if (mesh->dp_rank == 0 && mesh->tp_rank == 0) write_index(m, dir, &list, err);
    free(list.names);
    return comm_first_error(&mesh->group, err, CHECKPOINT_ERR_CAP);
}

int checkpoint_save_tensors(const Model *m, const ShardSource *src, const char *dir, DType dt, char *err) {
    err[0] = 0;
    return save_tensors(m, src, dir, dt, err) ? -1 : 0;
}

/* ---- step 4 (rank 0): publish ------------------------------------------------------------ */

/* Moves the finished tmp to out (replacing an existing out when overwrite). Returns 0, or -1 with
 * the line in err. */
static int publish(const char *tmp, const char *out, int overwrite, char *err) {
    struct stat st;
    int replace = overwrite && lstat(out, &st) == 0;
    const char *old = NULL;          /* where the replaced model ends up, deleted once out is new */
    char old_buf[PATH_MAX + 32];
    int rc;
    fsync_dir(tmp);
    if (replace) {
        /* one atomic swap: out becomes the new directory, tmp the old one */
        rc = renameat2(AT_FDCWD, tmp, AT_FDCWD, out, RENAME_EXCHANGE);
        old = tmp;
        if (rc != 0 && (errno == EINVAL || errno == ENOSYS)) {
            /* a filesystem without RENAME_EXCHANGE (NFS): two renames, out briefly absent */
            snprintf(old_buf, sizeof old_buf, "%s.old.%d", out, (int)getpid());
            old = old_buf;
            rc = rename(out, old);
            if (rc == 0 && (rc = rename(tmp, out)) != 0) rename(old, out);
        }
    } else {
        /* NOREPLACE: never silently replace an out_dir that appeared since the check */
        rc = renameat2(AT_FDCWD, tmp, AT_FDCWD, out, RENAME_NOREPLACE);
        if (rc != 0 && (errno == EINVAL || errno == ENOSYS)) rc = rename(tmp, out);
    }
    if (rc != 0) {
        snprintf(err, CHECKPOINT_ERR_CAP, "%s: cannot move the saved model there from %s: %s", out, tmp, strerror(errno));
        remove_tree(tmp);
        return -1;
    }
    if (old) remove_tree(old);
    char parent[PATH_MAX];
    parent_of(out, parent, sizeof parent);
    fsync_dir(parent);
    return 0;
}

int checkpoint_save_model(const Model *m, const char *src_dir, const char *out_dir, int overwrite, DType dtype,
                          char *err) {
    const Mesh *mesh = m->mesh;
    int root = mesh->rank == 0;
    /* "out/" and "out" are the same directory; the temp name must sit beside it, not inside */
    char out[PATH_MAX];
    snprintf(out, sizeof out, "%s", out_dir);
    for (size_t n = strlen(out); n > 1 && out[n - 1] == '/'; n--) out[n - 1] = 0;
    err[0] = 0;

    Prepare *p = xcalloc(1, sizeof(Prepare));
    if (dtype == DTYPE_AUTO) dtype = m->dtype;
    if (root) prepare(src_dir, out, overwrite, m->head == HEAD_SCORE ? &m->cfg : NULL, dtype, p);
    comm_broadcast(&mesh->group, p, sizeof(Prepare), 0);
    if (p->status == PREP_USER_ERROR) user_error("%s", p->text);
    if (p->status == PREP_IO_ERROR) {
        snprintf(err, CHECKPOINT_ERR_CAP, "%s", p->text);
        free(p);
        return -1;
    }

    WeightSource ws = {m, NULL, NULL, 0};
    ShardSource src = {weight_shard, &ws};
    int failed = save_tensors(m, &src, p->tmp, dtype, err);
    free(ws.raw);
    free(ws.f);

    int result = -1;
    if (root && failed) remove_tree(p->tmp);
    if (root && !failed) result = publish(p->tmp, out, overwrite, err);
    comm_broadcast(&mesh->group, &result, sizeof result, 0);
    if (result != 0) comm_broadcast(&mesh->group, err, CHECKPOINT_ERR_CAP, 0);
    free(p);
    return result;
}
