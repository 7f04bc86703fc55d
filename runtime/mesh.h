/* mesh.h — the TP x DP x PP mesh over a group of ranks: rank <-> coordinates, one Comm per axis;
 * and role groups: the world cut into named groups of consecutive ranks, each with its own meshes.
 *
 * Rank algebra within the mesh's group (Megatron's order: tp fastest, then dp, then pp):
 *     rank = tp_rank + tp * (dp_rank + dp * pp_rank),   dp = group size / (tp * pp)
 * Worked example, 8 ranks, tp=2 pp=2 dp=2:
 *     TP groups {0,1} {2,3} {4,5} {6,7}      (same dp, pp)
 *     DP groups {0,2} {1,3} {4,6} {5,7}      (same tp, pp)
 *     PP groups {0,4} {1,5} {2,6} {3,7}      (same tp, dp); pp stage s = pp_rank
 * Expert parallelism (--ep E, Megatron's layout: EP inside DP): E divides dp; an ep group is E
 * consecutive dp ranks of the same tp and pp coordinates, ep_rank = dp_rank % E; the expert-data-
 * parallel (edp) group is the dp / E ranks of the same tp, pp and ep_rank, which hold the same
 * experts (edp_rank = dp_rank / E). 8 ranks, tp=2 dp=4 ep=2: ep groups {0,2} {4,6} {1,3} {5,7},
 * edp groups {0,4} {2,6} {1,5} {3,7}. ep 1: each rank its own ep group, edp = dp.
 * Role groups, e.g. a world of 6 split as actor 4, critic 2 (group_split): the actor's ranks are
 * world 0-3 and its mesh (tp=2 pp=2) numbers them 0-3 as above; the critic's are world 4-5, its
 * own ranks 0-1 (tp=2). Each group's rank 0 is its root: it writes, logs and reports errors. Two
 * meshes may be built over the same group (two models in one process, e.g. a policy and a frozen
 * reference), at different layouts.
 * A Mesh* is passed down explicitly; there are no global rank getters.
 * Does not own model-dependent checks (heads vs tp, layers vs pp: runtime/model.c). */
#ifndef TANDEM_MESH_H
#define TANDEM_MESH_H
#include "runtime/comm.h"

typedef struct {
    int rank, size;                 /* this rank within the mesh's group, and the group's size */
    int tp, dp, pp;                 /* axis sizes */
    int tp_rank, dp_rank, pp_rank;  /* this rank's coordinates */
    Comm group, tp_comm, dp_comm, pp_comm;   /* group: a duplicate of the parent communicator */
    int ep, ep_rank, edp, edp_rank; /* expert parallelism (above): ep divides dp, edp = dp / ep */
    Comm ep_comm, edp_comm;         /* the ep group (its all-to-alls) and the expert-data-parallel group */
    const char *ep_flag;            /* the option that set ep, named in its errors: "--ep", ppo's "--actor-ep" */
} Mesh;

/* Cuts the ranks of parent into a tp x pp x dp mesh (collective over parent); an impossible layout
 * is a user_error (reported by the group's root). */
void mesh_init(Mesh *m, const Comm *parent, int tp, int pp);
/* mesh_init with --ep (above): ep must divide dp, else one user_error naming --ep (mesh_init_ep_flag:
 * naming flag, which the model's checks of ep name too) */
void mesh_init_ep(Mesh *m, const Comm *parent, int tp, int pp, int ep);
void mesh_init_ep_flag(Mesh *m, const Comm *parent, int tp, int pp, int ep, const char *flag);
/* mesh_init over every rank of the job (collective over the world): a command whose model spans it. */
void mesh_init_world(Mesh *m, int tp, int pp, int ep);
void mesh_free(Mesh *m);
int mesh_rank_of(const Mesh *m, int tp_rank, int dp_rank, int pp_rank);
static inline int mesh_is_root(const Mesh *m) { return m->rank == 0; }

/* This rank's role group: groups of counts[0], counts[1], ... consecutive world ranks, in order. */
typedef struct {
    char name[32];
    int index;           /* which group */
    int first, n;        /* its world ranks: first .. first + n - 1 */
    Comm comm;           /* its ranks (collective over them only) */
} RoleGroup;
/* Splits world (collective over it). The counts must be >= 1 and sum to the world size, else one
 * user_error naming `flag` (e.g. "--actor-ranks/--critic-ranks"). Makes the group's root this
 * process's error reporter, with the group's name in front of its messages when n_groups > 1. */
void group_split(const Comm *world, int n_groups, const char *const *names, const int *counts, const char *flag,
                 RoleGroup *mine);
void group_free(RoleGroup *g);
#endif
