/* test_optim.c — checks behind tests/optim.bats for train/optim.c. Usage:
 *   test_optim torch FIXTURE.json                 the pieces on plain arrays vs torch (adamw.json)
 *   test_optim mesh MODEL_DIR TP PP ZERO STEPS    optim_step on a real model's arena (under mpirun)
 *   test_optim resume MODEL_DIR TP PP ZERO DIR    4 steps straight == 2 steps, save, load, 2 steps
 *   test_optim load MODEL_DIR TP PP ZERO FILE     optim_load only (error messages; exit 2 if absent)
 *   test_optim reshard MODEL_DIR TP PP ZERO DIR save|load
 *                                                 the layout-free state (train/optim_state.c): save =
 *                                                 2 steps, then the weights and optimizer state into
 *                                                 DIR; load (any other layout) = DIR's weights and
 *                                                 state, then steps 2 and 3, printed as mesh prints
 *   test_optim backend NAME                       the backend's adamw, sum_squares and bf16 pack
 *                                                 against the CPU kernels: bit for bit
 *
 * torch: FIXTURE.json (tests/fixtures/optim/make_optim_fixtures.py) holds torch.optim.AdamW +
 * clip_grad_norm_ + HF's warmup/cosine LambdaLR over five steps of four small tensors, and the lr of
 * every schedule at every step. We run lr_schedule, cpu_sum_squares + clip_scale and cpu_adamw on
 * the same grads and compare after every step (tolerances at TOL_* below).
 *
 * mesh: every layout gets the SAME global gradient, by construction exact in fp32, so that every
 * layout must give bit-identical norms and params (no tolerance):
 *   - an element's gradient is a function of its tensor's name and its initial value (the model is
 *     loaded from one checkpoint, so an element has the same value on every layout; replicated
 *     tensors also use the index, which is global for them), never of arena offsets. So tp and pp
 *     layouts see the same global gradient without this test re-implementing the sharding.
 *   - data parallel: VDP = 4 virtual dp ranks each draw an integer k in [-1000, 1000]; dp rank r
 *     holds the mean of k / 1024 over its VDP / dp virtual ranks. Every sum is of a few multiples
 *     of 2^-12 and every division is by a power of two, so the dp mean is exact in any order, and
 *     the double sum of squares is exact too (multiples of 2^-28 summing to < 2^20: 48 bits): the norm and the
 *     params cannot depend on reduction order, only on a wrong count (a norm counted on two tp
 *     ranks, a tied copy counted twice, a ZeRO slice updated twice or not at all).
 *   - padded vocab rows (vocab not divisible by tp) get zero gradient, as train/grad.c gives them.
 * World rank 0 prints "norm STEP HEXFLOAT" per step and "checksum A B C D": the sum over every
 * element of the global model, counted once (ParamInfo.norm_once, dp rank 0, no padded rows), of a
 * 64-bit hash of (name, initial value, final value), kept as four exact 16-bit column sums, so it
 * does not depend on how elements are split across ranks. optim.bats compares these lines between
 * layouts. Every rank also checks that its dp replicas and its tp-replicated tensors are
 * bit-identical to those of dp rank 0 / tp rank 0, and the last stage that its tied lm_head copy is
 * bit-identical to the first stage's embedding. Prints "ok: optim ..." per rank. */
#include "kernels/cpu/cpu.h"   /* cpu_adamw, cpu_sum_squares: the optimizer's kernels against torch */
#include "runtime/mesh.h"
#include "runtime/model.h"
#include "runtime/util.h"
#include "train/checkpoint.h"
#include "train/optim.h"
#include "train/optim_state.h"
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- torch fixture ------------------------------------------------------------------------- */

/* Tolerances vs torch:
 * lr: both sides evaluate the same double formulas; HF's min-lr cosine is base * (f * (1 - r) + r),
 *     ours min_lr + (lr - min_lr) * f: a few double ulps (measured 2.7e-16). 1e-12 relative.
 * norm: torch takes an fp32 norm per tensor, then the fp32 norm of those; we sum squares in double
 *     and round once. They differ by ~1 fp32 ulp (measured 8.6e-8). 1e-6 relative.
 * params, clip factor from torch's norm: cpu_adamw is torch's fp32 op sequence (the same
 *     roundings, fma where torch's add and addcmul kernels use one), so 0 ulp: bit-identical.
 * params, clip factor from our norm (end to end): a 1-ulp different norm scales the grads by 1 ulp;
 *     Adam's m / sqrt(v) cancels a common scale, but where m nearly cancels (beta1 * m ~ -(1 - beta1)
 *     * g) the relative error of m grows, and the param moves by a few ulp (measured 8 ulp of
 *     max(|ref|, 2^-10) at step 3). 16 ulp. A wrong formula is off by far more (measured by
 *     mutating cpu_adamw: decay after the update 7e4 ulp, eps inside the sqrt 4e6, no bias
 *     correction of v 1e8); addcmul without torch's fma is caught only by the 0-ulp run (8 ulp). */
#define TOL_LR 1e-12
#define TOL_NORM 1e-6
#define TOL_ULP 16.0

static const cJSON *item(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!v) { fprintf(stderr, "fixture: field %s missing\n", k); exit(1); }
    return v;
}

static float *floats(const cJSON *arr, size_t *n) {
    *n = (size_t)cJSON_GetArraySize(arr);
    float *x = xmalloc(sizeof(float) * (*n ? *n : 1));
    size_t i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) x[i++] = (float)v->valuedouble;
    return x;
}

/* |a - b| in units of the last place of max(|b|, 2^-10) */
static double ulps(float a, float b) {
    float mag = fabsf(b) > 0x1p-10f ? fabsf(b) : 0x1p-10f;
    return fabs((double)a - (double)b) / (double)(nextafterf(mag, INFINITY) - mag);
}

/* Five steps of AdamW + clipping + warmup/cosine over the fixture's tensors. ref_norm: take the
 * clip factor from torch's norm (isolates cpu_adamw: must be bit-identical), else from ours. */
static int run_adamw(const cJSON *root, int ref_norm, double tol_ulp) {
    const cJSON *cfgj = item(root, "config");
    OptimConfig c = optim_config_default();
    c.lr = item(cfgj, "lr")->valuedouble;
    c.beta1 = item(cfgj, "beta1")->valuedouble;
    c.beta2 = item(cfgj, "beta2")->valuedouble;
    c.eps = item(cfgj, "eps")->valuedouble;
    c.weight_decay = item(cfgj, "weight_decay")->valuedouble;
    c.clip = item(cfgj, "clip")->valuedouble;
    c.warmup = item(cfgj, "warmup")->valueint;
    c.total_steps = item(cfgj, "total_steps")->valueint;
    c.schedule = LR_COSINE;
    const cJSON *tensors = item(root, "tensors");
    int nt = cJSON_GetArraySize(tensors), fail = 0;
    float *p[8], *m[8], *v[8];
    size_t n[8];
    int decay[8];
    const char *tname[8];
    CHECK(nt <= 8);
    for (int k = 0; k < nt; k++) {
        const cJSON *t = cJSON_GetArrayItem(tensors, k);
        p[k] = floats(item(t, "init"), &n[k]);
        m[k] = xcalloc(n[k], sizeof(float));
        v[k] = xcalloc(n[k], sizeof(float));
        decay[k] = item(t, "decay")->valueint;
        tname[k] = item(t, "name")->valuestring;
    }
    double partials[4], worst_ulp = 0.0;
    int exact = 0, total = 0, s = 0;
    const cJSON *st;
    printf("adamw, clip factor from %s norm:\n", ref_norm ? "torch's" : "our");
    cJSON_ArrayForEach(st, item(root, "steps")) {
        double lr = lr_schedule(&c, s), lr_ref = item(st, "lr")->valuedouble;
        if (fabs(lr - lr_ref) > TOL_LR * (lr_ref > 0 ? lr_ref : 1.0)) {
            fprintf(stderr, "FAIL step %d: lr %.17g vs torch %.17g\n", s, lr, lr_ref);
            fail = 1;
        }
        float *g[8];
        double sumsq = 0.0;
        for (int k = 0; k < nt; k++) {
            size_t ng;
            g[k] = floats(cJSON_GetArrayItem(item(st, "grads"), k), &ng);
            CHECK(ng == n[k]);
            double sq;
            cpu_sum_squares(&sq, g[k], n[k], partials);
            sumsq += sq;
        }
        float norm = (float)sqrt(sumsq), norm_ref = (float)item(st, "norm")->valuedouble;
        double norm_rel = fabs((double)norm - norm_ref) / norm_ref;
        if (norm_rel > TOL_NORM) { fprintf(stderr, "FAIL step %d: norm %.9g vs torch %.9g\n", s, norm, norm_ref); fail = 1; }
        float scale = clip_scale(ref_norm ? norm_ref : norm, c.clip);
        double step_ulp = 0.0;
        for (int k = 0; k < nt; k++) {
            cpu_adamw(p[k], g[k], m[k], v[k], n[k], scale, lr, c.beta1, c.beta2, c.eps,
                      decay[k] ? c.weight_decay : 0.0, s + 1);
            size_t nr;
            float *ref = floats(cJSON_GetArrayItem(item(st, "params"), k), &nr);
            CHECK(nr == n[k]);
            double tw = 0.0;
            for (size_t i = 0; i < n[k]; i++) {
                double u = ulps(p[k][i], ref[i]);
                if (u > tw) tw = u;
                exact += p[k][i] == ref[i];
                total++;
            }
            if (tw > tol_ulp) { fprintf(stderr, "FAIL step %d tensor %s: %.1f ulp from torch\n", s, tname[k], tw); fail = 1; }
            if (tw > step_ulp) step_ulp = tw;
            free(ref);
            free(g[k]);
        }
        if (step_ulp > worst_ulp) worst_ulp = step_ulp;
        printf("  step %d: lr %-10.6g norm %.9g (torch %.9g, rel %.2g) clip x%-9.6g params max %.1f ulp\n", s, lr,
               norm, norm_ref, norm_rel, scale, step_ulp);
        s++;
    }
    printf("  %d of %d param values bit-identical to torch after %d steps, max %.1f ulp (tolerance %.0f)\n", exact,
           total, s, worst_ulp, tol_ulp);
    for (int k = 0; k < nt; k++) { free(p[k]); free(m[k]); free(v[k]); }
    return fail;
}

static int test_torch(const char *path) {
    char *text = read_file(path, NULL);
    if (!text) { fprintf(stderr, "%s: cannot read\n", path); return 1; }
    cJSON *root = cJSON_Parse(text);
    if (!root) { fprintf(stderr, "%s: not JSON\n", path); return 1; }
    int fail = 0;

    /* schedules: lr at every step vs HF's LambdaLR */
    const cJSON *sch = item(root, "schedules");
    const char *names[] = {"cosine", "cosine_min_lr", "linear", "constant"};
    LrSchedule kinds[] = {LR_COSINE, LR_COSINE, LR_LINEAR, LR_CONSTANT};
    for (int s = 0; s < 4; s++) {
        OptimConfig c = optim_config_default();
        c.lr = item(sch, "lr")->valuedouble;
        c.warmup = item(sch, "warmup")->valueint;
        c.total_steps = item(sch, "total_steps")->valueint;
        c.schedule = kinds[s];
        c.min_lr = s == 1 ? item(sch, "min_lr_cosine_min_lr")->valuedouble : 0.0;
        const cJSON *v;
        double worst = 0.0;
        int step = 0;
        cJSON_ArrayForEach(v, item(sch, names[s])) {
            double ours = lr_schedule(&c, step), ref = v->valuedouble;
            double rel = fabs(ours - ref) / (ref > 0 ? ref : 1.0);
            if (rel > worst) worst = rel;
            if (rel > TOL_LR) { fprintf(stderr, "FAIL schedule %s step %d: %.17g vs HF %.17g\n", names[s], step, ours, ref); fail = 1; }
            step++;
        }
        printf("schedule %-13s %2d steps: max rel diff vs HF %.3g\n", names[s], step, worst);
    }
    fail |= run_adamw(root, 1, 0.0);
    fail |= run_adamw(root, 0, TOL_ULP);
    cJSON_Delete(root);
    free(text);
    if (!fail) printf("ok: optim torch\n");
    return fail;
}

/* ---- the mesh runs ------------------------------------------------------------------------- */

#define VDP 4                                        /* virtual dp ranks of the gradient */
static const float STEP_SCALE[] = {1.0f, 0.25f, 2.0f, 0.5f, 1.0f, 4.0f};   /* powers of two: exact */

static uint64_t mix64(uint64_t x) { return splitmix64_mix(x + SPLITMIX64_GAMMA); }
static uint64_t str_hash(const char *s) {   /* FNV-1a */
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}
static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

typedef struct {
    Mesh mesh;
    Model m;
    ParamInfo *infos;
    int n_info;
    float *p0;        /* (n_params) the loaded params: the key of each element */
    float *grads;     /* (optim_grad_floats) */
} Run;

/* the same tensor on every layout: a tied lm_head copy is the embedding */
static const char *canon_name(const Model *m, const ParamInfo *in) {
    return m->cfg.tie_embeddings && strcmp(in->name, "lm_head.weight") == 0 ? "model.embed_tokens.weight" : in->name;
}
static int is_pad_row(const Model *m, const ParamInfo *in, size_t i) {
    int vocab = strstr(in->name, "embed_tokens") || strcmp(in->name, "lm_head.weight") == 0;
    return vocab && m->vocab_start + (int)(i / (size_t)in->cols) >= m->cfg.vocab_size;
}
/* element key: (name, initial value, and the index where it is global: replicated tensors) */
static uint64_t elem_key(const Model *m, const ParamInfo *in, const float *p0, size_t i) {
    uint64_t idx = in->tp_replicated ? (uint64_t)i : 0;
    return str_hash(canon_name(m, in)) ^ mix64(f32_bits(p0[in->offset + i]) | idx << 32);
}

static void fill_grads(Run *r, int step) {
    const Model *m = &r->m;
    int per = VDP / r->mesh.dp, j0 = r->mesh.dp_rank * per;
    float div = 1024.0f * (float)per, scale = STEP_SCALE[step % 6];
    for (int t = 0; t < r->n_info; t++) {
        const ParamInfo *in = &r->infos[t];
        for (size_t i = 0; i < in->numel; i++) {
            if (is_pad_row(m, in, i)) { r->grads[in->offset + i] = 0.0f; continue; }
            uint64_t key = elem_key(m, in, r->p0, i);
            int sum = 0;
            for (int j = j0; j < j0 + per; j++) sum += (int)(mix64(key ^ mix64((uint64_t)(step * VDP + j + 1))) % 2001) - 1000;
            r->grads[in->offset + i] = (float)sum / div * scale;
        }
    }
}

static void run_init(Run *r, const char *dir, int tp, int pp) {
    Comm world = comm_world();   /* this command's meshes span the job */
    mesh_init(&r->mesh, &world, tp, pp);
    comm_free(&world);
    model_load(&r->m, dir, &r->mesh, DTYPE_F32, backend_default());
    r->n_info = model_param_infos(&r->m, NULL, 0);
    r->infos = xmalloc(sizeof(ParamInfo) * r->n_info);
    model_param_infos(&r->m, r->infos, r->n_info);
    r->p0 = xmalloc(sizeof(float) * r->m.n_params);
    memcpy(r->p0, ((float *)r->m.params), sizeof(float) * r->m.n_params);
    r->grads = NULL;
}
static void run_free(Run *r) {
    free(r->infos);
    free(r->p0);
    free(r->grads);
    model_free(&r->m);
    mesh_free(&r->mesh);
}

static OptimConfig mesh_config(int zero) {
    OptimConfig c = optim_config_default();
    c.lr = 1e-2;
    c.warmup = 2;
    c.total_steps = 6;
    c.clip = 30.0;   /* the grads' norm is ~46 at scale 1 on these models: steps 0, 2 clip, 1, 3 not */
    c.zero = zero;
    return c;
}

/* steps [from, to) of the fixed gradient sequence; prints each norm on world rank 0 */
static void run_steps(Run *r, Optim *o, int from, int to) {
    for (int s = from; s < to; s++) {
        CHECK(o->step == s);
        optim_zero_grad(o, r->grads);
        fill_grads(r, s);
        float norm = optim_step(o, &r->m, r->grads);
        if (r->mesh.rank == 0)
            printf("norm %d %a (%.9g, lr %.6g, clip x%.6g)\n", s, norm, norm, optim_lr(o, s), clip_scale(norm, o->cfg.clip));
    }
}

/* The layout-invariant checksum of the params (see the file comment), printed by world rank 0. */
static void print_checksum(Run *r) {
    const Model *m = &r->m;
    double col[6] = {0};   /* four 16-bit column sums, elements changed, elements counted */
    if (r->mesh.dp_rank == 0)
        for (int t = 0; t < r->n_info; t++) {
            const ParamInfo *in = &r->infos[t];
            if (!in->norm_once) continue;
            for (size_t i = 0; i < in->numel; i++) {
                if (is_pad_row(m, in, i)) continue;
                float now = ((float *)m->params)[in->offset + i];
                uint64_t h = mix64(elem_key(m, in, r->p0, i) ^ mix64(f32_bits(now)));
                for (int c = 0; c < 4; c++) col[c] += (double)((h >> (16 * c)) & 0xffff);
                col[4] += now != r->p0[in->offset + i];
                col[5] += 1;
            }
        }
    comm_all_reduce_sum_f64(&r->mesh.group, col, 6);
    if (r->mesh.rank == 0)
        printf("checksum %.0f %.0f %.0f %.0f (%.0f of %.0f params changed)\n", col[0], col[1], col[2], col[3], col[4], col[5]);
}

/* dp replicas equal dp rank 0's arena; tp-replicated tensors equal tp rank 0's; a tied embedding's
 * two copies (first and last stage) are equal. */
static int check_replicas(Run *r) {
    const Model *m = &r->m;
    int fail = 0;
    float *tmp = xmalloc(sizeof(float) * m->n_params);
    memcpy(tmp, ((float *)m->params), sizeof(float) * m->n_params);
    comm_broadcast(&r->mesh.dp_comm, tmp, sizeof(float) * m->n_params, 0);
    if (memcmp(tmp, ((float *)m->params), sizeof(float) * m->n_params) != 0) {
        fprintf(stderr, "FAIL rank %d: params differ from dp rank 0's\n", r->mesh.rank);
        fail = 1;
    }
    for (int t = 0; t < r->n_info; t++) {
        const ParamInfo *in = &r->infos[t];
        if (!in->tp_replicated) continue;
        memcpy(tmp, ((float *)m->params) + in->offset, sizeof(float) * in->numel);
        comm_broadcast(&r->mesh.tp_comm, tmp, sizeof(float) * in->numel, 0);
        if (memcmp(tmp, ((float *)m->params) + in->offset, sizeof(float) * in->numel) != 0) {
            fprintf(stderr, "FAIL rank %d: %s differs from tp rank 0's\n", r->mesh.rank, in->name);
            fail = 1;
        }
    }
    /* a tied embedding on a pp > 1 mesh: the last stage's lm_head copy equals the first stage's */
    if (m->cfg.tie_embeddings && r->mesh.pp > 1 && (m->is_first || m->is_last)) {
        const char *name = m->is_first ? "model.embed_tokens.weight" : "lm_head.weight";
        const ParamInfo *in = NULL;
        for (int t = 0; t < r->n_info; t++)
            if (strcmp(r->infos[t].name, name) == 0) in = &r->infos[t];
        CHECK(in != NULL);
        size_t bytes = sizeof(float) * in->numel;
        if (m->is_first) {
            comm_send(&r->mesh.pp_comm, ((float *)m->params) + in->offset, bytes, r->mesh.pp - 1);
        } else {
            comm_recv(&r->mesh.pp_comm, tmp, bytes, 0);
            if (memcmp(tmp, ((float *)m->params) + in->offset, bytes) != 0) {
                fprintf(stderr, "FAIL rank %d: the tied lm_head copy differs from the first stage's embedding\n",
                        r->mesh.rank);
                fail = 1;
            }
        }
    }
    free(tmp);
    return fail;
}

static int test_mesh(const char *dir, int tp, int pp, int zero, int steps) {
    Run r;
    run_init(&r, dir, tp, pp);
    Optim *o = optim_new(&r.m, &r.mesh, mesh_config(zero));
    optim_print_summary(o);
    r.grads = xmalloc(sizeof(float) * optim_grad_floats(o));
    run_steps(&r, o, 0, steps);
    print_checksum(&r);
    int fail = check_replicas(&r);
    if (!fail)
        printf("ok: optim mesh rank %d (tp %d dp %d pp %d, zero %d): %zu params, %zu state floats per moment\n",
               r.mesh.rank, tp, r.mesh.dp, pp, zero, r.m.n_params, o->n_state);
    optim_free(o);
    run_free(&r);
    return fail;
}

static void state_path(char *buf, size_t cap, const char *dir, int rank) {
    snprintf(buf, cap, "%s/optim.rank%d.bin", dir, rank);
}

/* 4 steps straight must equal 2 steps, save, a fresh optimizer that loads, 2 more steps. */
static int test_resume(const char *dir, int tp, int pp, int zero, const char *out) {
    Run r;
    run_init(&r, dir, tp, pp);
    Optim *o = optim_new(&r.m, &r.mesh, mesh_config(zero));
    r.grads = xmalloc(sizeof(float) * optim_grad_floats(o));
    run_steps(&r, o, 0, 4);
    float *straight = xmalloc(sizeof(float) * r.m.n_params);
    memcpy(straight, ((float *)r.m.params), sizeof(float) * r.m.n_params);

    memcpy(((float *)r.m.params), r.p0, sizeof(float) * r.m.n_params);
    optim_free(o);
    o = optim_new(&r.m, &r.mesh, mesh_config(zero));
    run_steps(&r, o, 0, 2);
    char path[4096];
    state_path(path, sizeof path, out, r.mesh.rank);
    CHECK(optim_save(o, path) == 0);
    optim_free(o);
    o = optim_new(&r.m, &r.mesh, mesh_config(zero));
    CHECK(optim_load(o, path) == 0);
    CHECK(o->step == 2);
    run_steps(&r, o, 2, 4);
    int fail = memcmp(straight, ((float *)r.m.params), sizeof(float) * r.m.n_params) != 0;
    if (fail) fprintf(stderr, "FAIL rank %d: params after save/load differ from the straight run\n", r.mesh.rank);
    else printf("ok: optim resume rank %d: bit-identical params after 2 + save/load + 2 steps\n", r.mesh.rank);
    free(straight);
    optim_free(o);
    run_free(&r);
    return fail;
}

static int test_load(const char *dir, int tp, int pp, int zero, const char *file) {
    Run r;
    run_init(&r, dir, tp, pp);
    Optim *o = optim_new(&r.m, &r.mesh, mesh_config(zero));
    int rc = optim_load(o, file);
    if (rc != 0) printf("cannot open %s\n", file);
    else printf("ok: optim load rank %d: step %d\n", r.mesh.rank, o->step);
    optim_free(o);
    run_free(&r);
    return rc != 0 ? 2 : 0;
}

/* The layout-free state across layouts. The test gradients make every layout's steps bit-identical
 * (see the file comment), so steps 0-1 at the saving layout, the state resharded, and steps 2-3 at
 * the loading one must print exactly the norms and checksum of 4 steps at 1x1: a moment or master
 * element lost, misplaced, or taken from the wrong replica changes the params of steps 2-3. */
static int test_reshard(const char *dir, int tp, int pp, int zero, const char *out, const char *what) {
    Run r;
    run_init(&r, dir, tp, pp);   /* the initial weights: the gradients' keys (p0) */
    Optim *o = optim_new(&r.m, &r.mesh, mesh_config(zero));
    r.grads = xmalloc(sizeof(float) * optim_grad_floats(o));
    int fail = 0;
    char err[CHECKPOINT_ERR_CAP];
    if (strcmp(what, "save") == 0) {
        run_steps(&r, o, 0, 2);
        CHECK(checkpoint_save_model(&r.m, dir, out, 1, DTYPE_AUTO, err) == 0);
        CHECK(optim_state_save(o, &r.m, out, err) == 0);
        printf("ok: optim reshard save rank %d\n", r.mesh.rank);
    } else {
        Model saved;   /* the weights after step 1, at this layout */
        model_load(&saved, out, &r.mesh, DTYPE_F32, backend_default());
        CHECK(saved.n_params == r.m.n_params);
        memcpy(r.m.params, saved.params, sizeof(float) * r.m.n_params);
        model_free(&saved);
        optim_free(o);
        o = optim_new(&r.m, &r.mesh, mesh_config(zero));
        optim_state_load(o, &r.m, out);
        CHECK(o->step == 2);
        run_steps(&r, o, 2, 4);
        print_checksum(&r);
        fail = check_replicas(&r);
        if (!fail) printf("ok: optim reshard load rank %d (tp %d dp %d pp %d, zero %d)\n", r.mesh.rank, tp, r.mesh.dp, pp, zero);
    }
    optim_free(o);
    run_free(&r);
    return fail;
}

/* The optimizer's entries of backend NAME (cuda, cpu-guarded) against cpu_adamw and cpu_sum_squares
 * on pseudo-random arrays of sizes around the chunk and lane boundaries, through the backend's memory:
 * three AdamW steps (decay and none, clipped), the sum of squares, the master's bf16 rounding. The
 * CUDA kernels keep the CPU's arithmetic order, so every bit must match (kernels/cuda/optim.cu). */
static int test_backend(const char *name) {
    const Backend *be = backend_named(name);
    if (!be) { fprintf(stderr, "test_optim: no backend %s in this build\n", name); return 2; }
    const char *why = be->open(0);
    if (why) { fprintf(stderr, "test_optim: %s: %s\n", name, why); return 2; }
    static const size_t sizes[] = {1, 7, 8, 13, 65536, 65543, 3 * 65536 + 5, 1000003};
    int fail = 0;
    uint64_t st = 7;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        float *h = xmalloc(sizeof(float) * 4 * n), *back = xmalloc(sizeof(float) * 4 * n);   /* p, g, m, v */
        for (size_t i = 0; i < 4 * n; i++) {
            double u = (splitmix64_next(&st) >> 11) * 0x1.0p-53;
            h[i] = (float)((u - 0.5) * (i / n == 3 ? 1e-2 : 2.0));   /* v: small, then squared into it */
            if (i / n == 3) h[i] *= h[i];
        }
        float *d = be->alloc(sizeof(float) * 4 * n);
        be->to_device(d, h, sizeof(float) * 4 * n);
        size_t nc = (n + 65535) / 65536;
        double *dsum = be->alloc(sizeof(double) * (nc + 1)), got, want, *part = xmalloc(sizeof(double) * (nc + 1));
        be->sum_squares(dsum, d + n, n, dsum + 1);
        be->to_host(&got, dsum, sizeof got);
        cpu_sum_squares(&want, h + n, n, part);
        if (memcmp(&got, &want, sizeof got)) { fprintf(stderr, "FAIL n %zu: sum_squares %a vs cpu %a\n", n, got, want); fail = 1; }
        for (int t = 1; t <= 3; t++) {
            float scale = t == 2 ? 0.37f : 1.0f;
            double wd = t == 3 ? 0.0 : 0.1;
            be->adamw(d, d + n, d + 2 * n, d + 3 * n, n, scale, 3e-3 * t, 0.9, 0.95, 1e-8, wd, t);
            cpu_adamw(h, h + n, h + 2 * n, h + 3 * n, n, scale, 3e-3 * t, 0.9, 0.95, 1e-8, wd, t);
        }
        be->to_host(back, d, sizeof(float) * 4 * n);
        size_t bad = 0;
        for (size_t i = 0; i < 4 * n; i++) bad += memcmp(&back[i], &h[i], 4) != 0;
        if (bad) { fprintf(stderr, "FAIL n %zu: adamw: %zu of %zu p/g/m/v values differ from cpu\n", n, bad, 4 * n); fail = 1; }
        uint16_t *w = be->alloc(sizeof(uint16_t) * n), *wh = xmalloc(sizeof(uint16_t) * n), *wc = xmalloc(sizeof(uint16_t) * n);
        be->pack(w, DTYPE_BF16, d, n);
        be->to_host(wh, w, sizeof(uint16_t) * n);
        cpu_pack(wc, DTYPE_BF16, h, n);
        if (memcmp(wh, wc, sizeof(uint16_t) * n)) { fprintf(stderr, "FAIL n %zu: pack bf16 differs from cpu\n", n); fail = 1; }
        printf("n %zu: sum_squares %a, p[0] %a: %s\n", n, got, back[0], fail ? "FAIL" : "same bits");
        be->free(d); be->free(dsum); be->free(w);
        free(h); free(back); free(part); free(wh); free(wc);
    }
    if (!fail) printf("ok: optim backend %s\n", name);
    return fail;
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "torch") == 0) return test_torch(argv[2]);
    if (argc >= 3 && strcmp(argv[1], "backend") == 0) return test_backend(argv[2]);
    if (argc < 6) {
        fprintf(stderr, "usage: test_optim torch FIXTURE.json | mesh MODEL TP PP ZERO STEPS | "
                        "resume MODEL TP PP ZERO DIR | load MODEL TP PP ZERO FILE | "
                        "reshard MODEL TP PP ZERO DIR save|load | backend NAME\n");
        return 1;
    }
    comm_init(&argc, &argv);
    const char *mode = argv[1], *dir = argv[2];
    int tp = atoi(argv[3]), pp = atoi(argv[4]), zero = atoi(argv[5]), rc = 1;
    if (strcmp(mode, "mesh") == 0 && argc >= 7) rc = test_mesh(dir, tp, pp, zero, atoi(argv[6]));
    else if (strcmp(mode, "resume") == 0 && argc >= 7) rc = test_resume(dir, tp, pp, zero, argv[6]);
    else if (strcmp(mode, "load") == 0 && argc >= 7) rc = test_load(dir, tp, pp, zero, argv[6]);
    else if (strcmp(mode, "reshard") == 0 && argc >= 8) rc = test_reshard(dir, tp, pp, zero, argv[6], argv[7]);
    else fprintf(stderr, "test_optim: unknown mode %s\n", mode);
    comm_finalize();
    return rc;
}
