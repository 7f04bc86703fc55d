/* test_groups.c — role groups: one job cut into named groups of ranks, each running its own
 * model(s) on its own mesh at the same time. Usage (under mpirun, or alone for one 1-rank group):
 *   test_groups OUT_PREFIX GROUP [GROUP ...]
 *   GROUP = NAME:RANKS:MODEL_DIR:TP:PP[+MODEL_DIR:TP:PP]
 * The world is split into the groups in order (group_split: RANKS consecutive ranks each). Each
 * group builds a mesh over its own ranks, loads MODEL_DIR at TP x PP and scores a fixed batch
 * (model_score: log-sum-exp and the logprob of each next token); with "+MODEL_DIR:TP:PP" the same
 * ranks also build a second mesh and load a second model (two models in one process, e.g. a policy
 * and a frozen reference), scored after the first. The group's root writes
 * OUT_PREFIX.NAME.K.txt (K = 0, 1: the model) with every value as a hex float, so a run of one
 * group alone can be compared byte for byte (tests/groups.bats). */
#include "kernels/kernels.h"
#include "runtime/mesh.h"
#include "runtime/model.h"
#include "runtime/util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_GROUPS = 4 };

/* scores m (loaded on mesh) and writes path on the mesh's root */
static void score_one(Model *mp, const Mesh *mesh, const char *dir, const char *path) {
    Model m = *mp;
    const int start[3] = {0, 9, 22};
    int N = start[2], ids[22], row[22], tok[22];
    for (int t = 0; t < N; t++) {
        ids[t] = 1 + (t * 37 + 11) % 90;   /* < every fixture's vocab */
        row[t] = t;
    }
    for (int t = 0; t < N; t++) tok[t] = t + 1 < N ? ids[t + 1] : ids[0];
    model_alloc_state(&m, N, 16);
    float lse[22], lp[22], amax_lp[22];
    int amax[22];
    Scores sc = {lse, amax, amax_lp, lp};
    model_score(&m, ids, start, 2, N, row, tok, &sc);
    *mp = m;
    if (mesh_is_root(mesh)) {
        FILE *f = fopen(path, "w");
        CHECK(f);
        for (int t = 0; t < N; t++) fprintf(f, "%d %a %a %d %a\n", t, lse[t], lp[t], amax[t], amax_lp[t]);
        CHECK(fclose(f) == 0);
        printf("ok: group scored %s at tp=%d pp=%d dp=%d -> %s\n", dir, mesh->tp, mesh->pp, mesh->dp, path);
    }
}

int main(int argc, char **argv) {
    comm_init(&argc, &argv);
    if (argc < 3 || argc - 2 > MAX_GROUPS) { fprintf(stderr, "usage: test_groups OUT_PREFIX NAME:RANKS:DIR:TP:PP[+DIR:TP:PP] ...\n"); return 2; }
    backend_set_threads(1);
    int n = argc - 2, counts[MAX_GROUPS];
    char *names[MAX_GROUPS], *rest[MAX_GROUPS];
    for (int g = 0; g < n; g++) {
        names[g] = strtok(argv[2 + g], ":");
        counts[g] = atoi(strtok(NULL, ":"));
        rest[g] = strtok(NULL, "");
    }
    Comm world = comm_world();
    RoleGroup grp;
    group_split(&world, n, (const char *const *)names, counts, "group ranks", &grp);
    /* this group's models: DIR:TP:PP, then optionally +DIR:TP:PP; both loaded before either runs */
    char *spec = rest[grp.index], *second = strchr(spec, '+'), *dirs[2];
    if (second) *second++ = 0;
    int n_models = second ? 2 : 1;
    Mesh meshes[2];
    Model models[2];
    for (int k = 0; k < n_models; k++) {
        dirs[k] = strtok(k ? second : spec, ":");
        int tp = atoi(strtok(NULL, ":")), pp = atoi(strtok(NULL, ":"));
        mesh_init(&meshes[k], &grp.comm, tp, pp);
        model_load(&models[k], dirs[k], &meshes[k], DTYPE_F32, backend_default());
    }
    for (int k = 0; k < n_models; k++) {
        char path[4096];
        snprintf(path, sizeof path, "%s.%s.%d.txt", argv[1], grp.name, k);
        score_one(&models[k], &meshes[k], dirs[k], path);
    }
    for (int k = 0; k < n_models; k++) {
        model_free(&models[k]);
        mesh_free(&meshes[k]);
    }
    fflush(stdout);
    group_free(&grp);
    comm_free(&world);
    comm_finalize();
    return 0;
}
