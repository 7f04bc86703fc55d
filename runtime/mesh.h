/* mesh.h — the TP x DP x PP mesh: world rank <-> coordinates, and one Comm per axis.
 *
 * Rank algebra (Megatron's order: tp fastest, then dp, then pp):
 *     rank = tp_rank + tp * (dp_rank + dp * pp_rank),   dp = world_size / (tp * pp)
 * Worked example, 8 ranks, tp=2 pp=2 dp=2:
 *     TP groups {0,1} {2,3} {4,5} {6,7}      (same dp, pp)
 *     DP groups {0,2} {1,3} {4,6} {5,7}      (same tp, pp)
 *     PP groups {0,4} {1,5} {2,6} {3,7}      (same tp, dp); pp stage s = pp_rank
 * A Mesh* is passed down explicitly; there are no global rank getters.
 * Does not own model-dependent checks (heads vs tp, layers vs pp: runtime/model.c). */
#ifndef TANDEM_MESH_H
#define TANDEM_MESH_H
#include "runtime/comm.h"

typedef struct {
    int world_rank, world_size;
    int tp, dp, pp;                 /* axis sizes */
    int tp_rank, dp_rank, pp_rank;  /* this rank's coordinates */
    Comm world, tp_comm, dp_comm, pp_comm;
} Mesh;

/* Splits the world; an impossible layout is a user_error (reported once by rank 0). */
void mesh_init(Mesh *m, int tp, int pp);
void mesh_free(Mesh *m);
int mesh_rank_of(const Mesh *m, int tp_rank, int dp_rank, int pp_rank);
#endif
