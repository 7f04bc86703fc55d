/* test_checkpoint.c — checks behind tests/checkpoint.bats for train/checkpoint.c. Usage:
 *   test_checkpoint save MODEL_DIR OUT_DIR [TP PP [overwrite | fail-last-stage]]   (mpirun when > 1 rank)
 *       loads MODEL_DIR at TP x PP (dp = ranks / (TP*PP)), saves it to OUT_DIR; every rank prints
 *       "ok: saved ..." when checkpoint_save_model returned 0, else exits 1.
 *       fail-last-stage: the last stage's writer fails (a file-size limit, as a full disk would): the
 *       save must return -1 on every rank and leave nothing; then, limit lifted, the same process
 *       saves again and must succeed (a training loop goes on after a failed save). Prints
 *       "ok: failed save returned -1 ..." before the second save's line.
 *   test_checkpoint compare ORIG_DIR SAVED_DIR [OTHER_SAVED_DIR ...]     (one process)
 *       1. ORIG and SAVED loaded at 1x1: the parameter arenas have the same layout and every
 *          parameter is bit-identical (memcmp; fp32 in memory both ways, bf16 -> f32 is exact);
 *       2. SAVED's safetensors hold exactly the 1x1 model's tensors (no lm_head.weight when tied,
 *          no padded vocab rows), each F32 with the HF shape and the original's values bit for bit;
 *       3. SAVED's index: weight_map names every tensor and only those, each in the file that holds
 *          it, files named model-0000s-of-0000P.safetensors, metadata.total_size the sum of sizes;
 *       4. each OTHER_SAVED_DIR (the same model saved at another layout) holds the same tensor
 *          names, shapes and bytes as SAVED.
 *       Prints one line per check and "ok: compare ..." and exits 0, or names what differs, exit 1.
 *   test_checkpoint torch-sft FIXTURE.json ORIG_DIR TRAINED_DIR METRICS.jsonl           (one process)
 *       a `tandem sft` run against a plain torch training loop on the same records
 *       (tests/fixtures/sft/make_sft_fixture.py): every step's loss, pre-clip gradient norm and lr
 *       from METRICS, and each tensor's change TRAINED - ORIG (L2 norm, dot with cos(0.7 i), and for
 *       1-D tensors every value). Prints the worst deviation of each kind and "ok: torch-sft", or
 *       names what is off, exit 1.
 *   test_checkpoint save-score MODEL_DIR OUT_DIR SCORES.json [TP PP]     (mpirun when > 1 rank)
 *       loads MODEL_DIR with a score head (model_load_score: a *ForSequenceClassification directory
 *       keeps its score.weight, a causal LM gets a new one from seed 7), saves it to OUT_DIR, and
 *       writes SCORES.json: three sequences of ids and the value at each one's last token, for
 *       tests/fixtures/check_hf_score.py to compare with transformers' pooled scores. */
#include "runtime/jsonl.h"
#include "runtime/mesh.h"
#include "runtime/model.h"
#include "runtime/safetensors.h"
#include "runtime/util.h"
#include "train/checkpoint.h"
#include "kernels/kernels.h"
#include <cjson/cJSON.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static int g_fail;

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) { fprintf(stderr, "FAIL: " __VA_ARGS__); fputc('\n', stderr); g_fail = 1; }  \
    } while (0)

static int cmd_save(int argc, char **argv) {
    int tp = argc >= 6 ? atoi(argv[4]) : 1, pp = argc >= 6 ? atoi(argv[5]) : 1;
    int overwrite = argc >= 7 && strcmp(argv[6], "overwrite") == 0;
    int fail_last = argc >= 7 && strcmp(argv[6], "fail-last-stage") == 0;
    Mesh mesh;
    Comm world = comm_world();   /* this command's meshes span the job */
    mesh_init(&mesh, &world, tp, pp);
    comm_free(&world);
    Model m;
    model_load(&m, argv[2], &mesh, DTYPE_F32, backend_default());
    if (fail_last) {
        /* after MPI_Init and the load: only the checkpoint's own writes hit the limit (EFBIG) */
        struct rlimit old, lim;
        int last = mesh.pp_rank == pp - 1 && mesh.tp_rank == 0 && mesh.dp_rank == 0;
        signal(SIGXFSZ, SIG_IGN);
        CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0);
        lim = (struct rlimit){4096, old.rlim_max};  /* the soft limit only: it can be lifted again */
        if (last) CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
        char err[CHECKPOINT_ERR_CAP];
        int rc = checkpoint_save_model(&m, argv[2], argv[3], 0, DTYPE_AUTO, err);
        if (last) CHECK(setrlimit(RLIMIT_FSIZE, &old) == 0);
        if (rc != 0 && mesh.rank == 0) fprintf(stderr, "tandem: %s\n", err);
        if (rc != -1) { fprintf(stderr, "FAIL: the save with a failing writer returned %d\n", rc); return 1; }
        if (mesh.rank == 0) {
            char tmp[4096];
            snprintf(tmp, sizeof tmp, "%s.tmp.%d", argv[3], (int)getpid());
            if (access(argv[3], F_OK) == 0 || access(tmp, F_OK) == 0) {
                fprintf(stderr, "FAIL: the failed save left %s behind\n", access(tmp, F_OK) == 0 ? tmp : argv[3]);
                return 1;
            }
        }
        printf("ok: failed save returned -1 [rank %d]\n", mesh.rank);
        fflush(stdout);
        comm_barrier(&mesh.group);  /* every rank's line before the second save */
    }
    char err[CHECKPOINT_ERR_CAP];
    int rc = checkpoint_save_model(&m, argv[2], argv[3], overwrite, DTYPE_AUTO, err);
    if (rc != 0 && mesh.rank == 0) fprintf(stderr, "tandem: %s\n", err);
    if (rc == 0)
        printf("ok: saved [tp %d/%d pp %d/%d dp %d/%d]\n", mesh.tp_rank, tp, mesh.pp_rank, pp, mesh.dp_rank, mesh.dp);
    fflush(stdout);
    model_free(&m);
    mesh_free(&mesh);
    return rc == 0 ? 0 : 1;
}

/* 1. both loaded at 1x1: every parameter bit-identical */
static void check_params(const Model *a, const Model *b) {
    int n = model_param_infos(a, NULL, 0);
    ParamInfo *ia = xmalloc(sizeof(ParamInfo) * n), *ib = xmalloc(sizeof(ParamInfo) * n);
    EXPECT(model_param_infos(b, NULL, 0) == n && a->n_params == b->n_params, "parameter layouts differ");
    if (g_fail) return;
    int fail0 = g_fail;
    model_param_infos(a, ia, n);
    model_param_infos(b, ib, n);
    for (int i = 0; i < n; i++) {
        EXPECT(strcmp(ia[i].name, ib[i].name) == 0 && ia[i].numel == ib[i].numel, "tensor %d: %s vs %s", i,
               ia[i].name, ib[i].name);
        size_t es = dtype_size(a->dtype);
        EXPECT(a->dtype == b->dtype && memcmp((char *)a->params + es * ia[i].offset, (char *)b->params + es * ib[i].offset,
                                              es * ia[i].numel) == 0,
               "%s: loaded values differ from the original's", ia[i].name);
    }
    if (g_fail == fail0)
        printf("params: %d tensors (%zu floats) bit-identical after the round trip\n", n, a->n_params);
    free(ia);
    free(ib);
}

/* full HF tensor `name` of shape (rows, cols) as f32 (cols 0 = 1-D) */
static float *read_full(const SafeTensors *st, const char *name, int rows, int cols) {
    float *x = xmalloc(sizeof(float) * (size_t)rows * (cols ? cols : 1));
    st_read_block(st, name, rows, cols, 0, rows, 0, cols ? cols : 1, x, DTYPE_F32);
    return x;
}

/* 2. + 3. the saved files against the original's tensors; the index */
static void check_files(const Model *orig, const char *orig_dir, const char *saved_dir) {
    SafeTensors *so = st_open_dir(orig_dir), *ss = st_open_dir(saved_dir);
    int fail0 = g_fail, n = model_param_infos(orig, NULL, 0);
    ParamInfo *in = xmalloc(sizeof(ParamInfo) * n);
    model_param_infos(orig, in, n);
    EXPECT(ss->n_tensors == n, "%s holds %d tensors, the model has %d", saved_dir, ss->n_tensors, n);
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        const StTensor *t = st_find(ss, in[i].name);
        EXPECT(t, "%s: tensor %s missing", saved_dir, in[i].name);
        if (!t) continue;
        EXPECT(t->dtype == ST_F32, "%s: not F32", in[i].name);
        int ndim = in[i].cols_global ? 2 : 1;
        EXPECT(t->ndim == ndim && t->shape[0] == in[i].rows_global && (ndim == 1 || t->shape[1] == in[i].cols_global),
               "%s: saved shape differs from the HF shape [%d, %d]", in[i].name, in[i].rows_global, in[i].cols_global);
        /* the original may store it in bf16 and, tied, under embed_tokens for both uses */
        float *a = read_full(so, in[i].name, in[i].rows_global, in[i].cols_global);
        float *b = read_full(ss, in[i].name, in[i].rows_global, in[i].cols_global);
        size_t numel = (size_t)in[i].rows_global * (in[i].cols_global ? in[i].cols_global : 1);
        EXPECT(memcmp(a, b, sizeof(float) * numel) == 0, "%s: saved values differ from the original file's",
               in[i].name);
        total += (int64_t)(4 * numel);
        free(a);
        free(b);
    }
    EXPECT(!orig->cfg.tie_embeddings || !st_find(ss, "lm_head.weight"), "tied model: lm_head.weight was written");
    if (g_fail == fail0) printf("files: %d tensors, F32, HF shapes, values equal to %s\n", n, orig_dir);

    char *ipath = path_join(saved_dir, "model.safetensors.index.json");
    char *text = read_file(ipath, NULL);
    cJSON *idx = text ? cJSON_Parse(text) : NULL;
    EXPECT(idx, "%s: missing or not JSON", ipath);
    if (idx) {
        const cJSON *meta = cJSON_GetObjectItemCaseSensitive(idx, "metadata");
        const cJSON *ts = meta ? cJSON_GetObjectItemCaseSensitive(meta, "total_size") : NULL;
        EXPECT(cJSON_IsNumber(ts) && (int64_t)ts->valuedouble == total, "index: metadata.total_size is not %lld",
               (long long)total);
        const cJSON *wm = cJSON_GetObjectItemCaseSensitive(idx, "weight_map");
        EXPECT(cJSON_GetArraySize(wm) == n, "index: weight_map has %d entries, expected %d", cJSON_GetArraySize(wm), n);
        const cJSON *e;
        cJSON_ArrayForEach(e, wm) {
            const StTensor *t = st_find(ss, e->string);
            int stage, of;
            EXPECT(t && cJSON_IsString(e) && sscanf(e->valuestring, "model-%5d-of-%5d.safetensors", &stage, &of) == 2,
                   "index: %s -> %s", e->string, cJSON_IsString(e) ? e->valuestring : "?");
            if (!t || !cJSON_IsString(e)) continue;
            const char *file = strrchr(ss->files[t->file].path, '/');
            EXPECT(file && strcmp(file + 1, e->valuestring) == 0, "index: %s is not in %s", e->string, e->valuestring);
        }
        if (g_fail == fail0) printf("index: %d entries, total_size %lld\n", n, (long long)total);
    }
    cJSON_Delete(idx);
    free(text);
    free(ipath);
    free(in);
    st_close(so);
    st_close(ss);
}

/* 4. two saved dirs: the same names, shapes and bytes */
static void check_same(const char *a_dir, const char *b_dir) {
    SafeTensors *a = st_open_dir(a_dir), *b = st_open_dir(b_dir);
    int fail0 = g_fail;
    EXPECT(a->n_tensors == b->n_tensors, "%s has %d tensors, %s %d", a_dir, a->n_tensors, b_dir, b->n_tensors);
    for (int i = 0; i < a->n_tensors; i++) {
        const StTensor *x = &a->tensors[i], *y = st_find(b, x->name);
        EXPECT(y, "%s: %s missing", b_dir, x->name);
        if (!y) continue;
        size_t numel = 1;
        for (int d = 0; d < x->ndim; d++) numel *= (size_t)x->shape[d];
        EXPECT(x->dtype == y->dtype && x->ndim == y->ndim && !memcmp(x->shape, y->shape, sizeof x->shape) &&
                   !memcmp(x->data, y->data, 4 * numel),
               "%s: differs between %s and %s", x->name, a_dir, b_dir);
    }
    if (g_fail == fail0) printf("same: %s and %s hold identical tensors\n", a_dir, b_dir);
    st_close(a);
    st_close(b);
}

static int cmd_save_score(int argc, char **argv) {
    int tp = argc >= 7 ? atoi(argv[5]) : 1, pp = argc >= 7 ? atoi(argv[6]) : 1;
    Mesh mesh;
    Comm world = comm_world();   /* this command's meshes span the job */
    mesh_init(&mesh, &world, tp, pp);
    comm_free(&world);
    Model m;
    model_load_score(&m, argv[2], &mesh, 7, DTYPE_F32, backend_default());
    enum { S = 3 };
    const int len[S] = {5, 9, 7};
    int start[S + 1] = {0}, ids[32], V = m.cfg.vocab_size;
    for (int i = 0; i < S; i++) {
        start[i + 1] = start[i] + len[i];
        for (int t = 0; t < len[i]; t++) {
            int id = 1 + (i * 7 + t * 13) % (V - 1);
            ids[start[i] + t] = id == m.cfg.pad_id ? 1 + id % (V - 1) : id;   /* never the pad id */
        }
    }
    model_alloc_state(&m, start[S], 16);
    model_forward(&m, ids, start, S);
    float last[S];
    for (int i = 0; i < S && m.is_last; i++) last[i] = m.s.logits[start[i + 1] - 1];
    comm_broadcast(&mesh.pp_comm, last, sizeof last, pp - 1);
    char err[CHECKPOINT_ERR_CAP];
    int rc = checkpoint_save_model(&m, argv[2], argv[3], 1, DTYPE_AUTO, err);
    if (rc != 0 && mesh.rank == 0) fprintf(stderr, "tandem: %s\n", err);
    if (mesh.rank == 0 && rc == 0) {
        FILE *f = fopen(argv[4], "w");
        CHECK(f);
        fprintf(f, "{\"ids\": [");
        for (int i = 0; i < S; i++) {
            fprintf(f, "%s[", i ? ", " : "");
            for (int t = start[i]; t < start[i + 1]; t++) fprintf(f, "%s%d", t > start[i] ? ", " : "", ids[t]);
            fprintf(f, "]");
        }
        fprintf(f, "], \"scores\": [%.9g, %.9g, %.9g]}\n", last[0], last[1], last[2]);
        CHECK(fclose(f) == 0);
    }
    if (rc == 0) printf("ok: saved score model [rank %d]\n", mesh.rank);
    model_free(&m);
    mesh_free(&mesh);
    return rc ? 1 : 0;
}

static int cmd_compare(int argc, char **argv) {
    Mesh mesh;
    Comm world = comm_world();   /* this command's meshes span the job */
    mesh_init(&mesh, &world, 1, 1);
    comm_free(&world);
    Model orig, saved;
    model_load(&orig, argv[2], &mesh, DTYPE_F32, backend_default());
    model_load(&saved, argv[3], &mesh, DTYPE_F32, backend_default());
    check_params(&orig, &saved);
    check_files(&orig, argv[2], argv[3]);
    for (int i = 4; i < argc; i++) check_same(argv[3], argv[i]);
    if (!g_fail) printf("ok: compare %s %s\n", argv[2], argv[3]);
    model_free(&orig);
    model_free(&saved);
    mesh_free(&mesh);
    return g_fail;
}

/* ---- torch-sft ----
 * Tolerances, against what was measured on stories260K, 6 steps (tests/sft.bats):
 *  - loss: 1e-5 relative (measured <= 5e-7). Both sides sum ~1000 token losses in fp32 in other
 *    orders; one step moves the loss by 10-30%, so a wrong update is far outside.
 *  - grad norm: 1e-4 relative (measured <= 4e-6): the gradients differ by summation order only.
 *  - lr: 1e-6 relative: ours is a float printed to 9 digits, torch's a double.
 *  - a tensor's change, L2 norm: 1e-4 relative (measured <= 2.5e-6); its dot with cos(0.7 i): within
 *    1e-3 of the L2 norm (measured <= 1.1e-4; the pattern cancels most of the sum, so the error is
 *    relative to the norm, not to the dot). Skipping weight decay (2e-4 of a weight per step)
 *    moves both by more than that.
 *  - a norm weight's change, per element: 1e-6 absolute (measured <= 2.4e-7, 2 ulp at 1.0, where the
 *    weights sit). Decay applied to a norm would move it by ~5e-4 over the run. */
static double rel(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-30); }

/* the number o[key]; a missing or non-number field fails the check (and reads as NaN) */
static double num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    EXPECT(cJSON_IsNumber(v), "field \"%s\" missing or not a number", key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static int cmd_torch_sft(char **argv) {
    char *fx_text = read_file(argv[2], NULL);
    cJSON *fx = fx_text ? cJSON_Parse(fx_text) : NULL;
    if (!fx) { fprintf(stderr, "FAIL: cannot read %s\n", argv[2]); return 1; }
    /* 1. the steps: the metrics lines with a "loss" (eval lines have none), in order */
    JsonlReader r;
    jsonl_open(&r, argv[5]);
    const cJSON *steps = cJSON_GetObjectItemCaseSensitive(fx, "steps"), *st;
    double w_loss = 0, w_norm = 0, w_lr = 0;
    int n_steps = 0;
    cJSON_ArrayForEach(st, steps) {
        cJSON *m;
        while ((m = jsonl_next(&r)) && !cJSON_GetObjectItemCaseSensitive(m, "loss")) cJSON_Delete(m);
        int step = (int)num(st, "step");
        EXPECT(m, "metrics: no line for step %d", step);
        if (!m) break;
        double l = num(m, "loss"), g = num(m, "grad_norm"), lr = num(m, "lr");
        double tl = num(st, "loss"), tg = num(st, "grad_norm"), tlr = num(st, "lr");
        EXPECT(num(m, "step") == step, "metrics: step %d out of order", step);
        EXPECT(rel(l, tl) <= 1e-5, "step %d: loss %.9g, torch %.9g", step, l, tl);
        EXPECT(rel(g, tg) <= 1e-4, "step %d: grad norm %.9g, torch %.9g", step, g, tg);
        EXPECT(tlr == 0 ? lr == 0 : rel(lr, tlr) <= 1e-6, "step %d: lr %.9g, torch %.9g", step, lr, tlr);
        w_loss = fmax(w_loss, rel(l, tl));
        w_norm = fmax(w_norm, rel(g, tg));
        w_lr = fmax(w_lr, tlr == 0 ? 0 : rel(lr, tlr));
        n_steps++;
        cJSON_Delete(m);
    }
    jsonl_close(&r);
    printf("steps: %d, worst relative deviation from torch: loss %.2g, grad norm %.2g, lr %.2g\n", n_steps, w_loss,
           w_norm, w_lr);
    /* 2. every tensor's change */
    SafeTensors *so = st_open_dir(argv[3]), *ss = st_open_dir(argv[4]);
    const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(fx, "tensors"), *t;
    double w_l2 = 0, w_dot = 0, w_elem = 0;
    int n_t = 0;
    cJSON_ArrayForEach(t, tensors) {
        const StTensor *a = st_find(so, t->string), *b = st_find(ss, t->string);
        EXPECT(a && b, "%s: not in both %s and %s", t->string, argv[3], argv[4]);
        if (!a || !b) continue;
        int64_t rows = a->shape[0], cols = a->ndim == 2 ? a->shape[1] : 0;
        size_t numel = (size_t)rows * (cols ? cols : 1);
        float *x = read_full(so, t->string, (int)rows, (int)cols), *y = read_full(ss, t->string, (int)rows, (int)cols);
        /* 1-D tensors: every value, walked along the fixture's list */
        const cJSON *delta = cJSON_GetObjectItemCaseSensitive(t, "delta");
        EXPECT(!delta || (size_t)cJSON_GetArraySize(delta) == numel, "%s: fixture has %d deltas for %zu values", t->string,
               cJSON_GetArraySize(delta), numel);
        const cJSON *de = delta && (size_t)cJSON_GetArraySize(delta) == numel ? delta->child : NULL;
        double l2 = 0, dot = 0;
        for (size_t i = 0; i < numel; i++) {
            double d = (double)y[i] - (double)x[i];
            l2 += d * d;
            dot += d * cos(0.7 * (double)i);
            if (!de) continue;
            double e = fabs(d - de->valuedouble);
            EXPECT(e <= 1e-6, "%s[%zu]: change %.9g, torch %.9g", t->string, i, d, de->valuedouble);
            w_elem = fmax(w_elem, e);
            de = de->next;
        }
        l2 = sqrt(l2);
        double tl2 = num(t, "l2"), tdot = num(t, "dot");
        EXPECT(rel(l2, tl2) <= 1e-4, "%s: |change| %.9g, torch %.9g", t->string, l2, tl2);
        EXPECT(fabs(dot - tdot) <= 1e-3 * tl2, "%s: change . cos(0.7 i) %.9g, torch %.9g (|change| %.3g)", t->string, dot,
               tdot, tl2);
        w_l2 = fmax(w_l2, rel(l2, tl2));
        w_dot = fmax(w_dot, fabs(dot - tdot) / tl2);
        n_t++;
        free(x);
        free(y);
    }
    EXPECT(n_t == so->n_tensors, "%d tensors compared, %s holds %d", n_t, argv[3], so->n_tensors);
    printf("tensors: %d, worst: |change| %.2g relative, dot %.2g of |change|, norm weights %.2g absolute\n", n_t, w_l2,
           w_dot, w_elem);
    if (!g_fail) printf("ok: torch-sft\n");
    st_close(so);
    st_close(ss);
    cJSON_Delete(fx);
    free(fx_text);
    return g_fail;
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    backend_set_threads(getenv("OMPI_COMM_WORLD_SIZE") ? 1 : 2);   /* 1 per rank under mpirun */
    int rc = 2;
    if (argc >= 4 && strcmp(argv[1], "save") == 0 && argc != 5 && argc <= 7) rc = cmd_save(argc, argv);
    else if (argc >= 4 && strcmp(argv[1], "compare") == 0) rc = cmd_compare(argc, argv);
    else if ((argc == 5 || argc == 7) && strcmp(argv[1], "save-score") == 0) rc = cmd_save_score(argc, argv);
    else if (argc == 6 && strcmp(argv[1], "torch-sft") == 0) rc = cmd_torch_sft(argv);
    else fprintf(stderr, "usage: test_checkpoint save MODEL_DIR OUT_DIR [TP PP [overwrite | fail-last-stage]]\n"
                         "       test_checkpoint compare ORIG_DIR SAVED_DIR [OTHER_SAVED_DIR ...]\n"
                         "       test_checkpoint torch-sft FIXTURE.json ORIG_DIR TRAINED_DIR METRICS.jsonl\n");
    comm_finalize();
    return rc;
}
