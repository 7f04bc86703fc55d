/* roles.h — which ranks run which RLHF role, and moving a role's results to every rank.
 * The five roles of a ppo run (actor, critic, reference, reward, teacher) are placed on role groups
 * of one job (runtime/mesh.h group_split): --ROLE-ranks consecutive ranks in the order actor, critic,
 * ref, reward, teacher; --colocate puts roles in one group, where they take turns; a role given no count shares
 * the actor's; with no counts every role shares every rank (one process works without mpirun).
 * Each role has its own tp x pp x dp mesh over its group and its own Model.
 * Owns: placement, each role's mesh, model and device, the vocabulary check between roles, and
 * sharing a role's per-item results (dp sum inside the role, then a broadcast from its root over the
 * world; host memory: what moves between roles is host copies, whatever the device).
 * Does not own: what the roles compute (rlhf/experience.c), their training (train/learner.h). */
#ifndef TANDEM_ROLES_H
#define TANDEM_ROLES_H
#include "rlhf/ppo_loss.h"
#include "runtime/model.h"

/* R_TEACHER: on-policy distillation's frozen teacher (--teacher), forward-only like the reference.
 * R_ROLLOUT (--rollout-ranks): forward-only ranks holding exact copies of the actor's weights (its tp
 * and pp, any dp) that generate the rollouts (rlhf/async.h); always its own group, the last ranks of
 * the job. Without it the actor generates on its own training shards. */
enum { R_ACTOR, R_CRITIC, R_REF, R_REWARD, R_TEACHER, R_ROLLOUT, N_ROLES };
extern const char *const ROLE_NAMES[N_ROLES];   /* "actor", "critic", "ref", "reward", "teacher", "rollout" */

typedef struct {
    int active, member;        /* in this run; held by this rank */
    int group, root;           /* its role group, and that group's first rank in Roles.world (with a
                                  rollout role: the rollout's root is 0 on its own side) */
    int count, tp, pp;         /* --ROLE-ranks, --ROLE-tp, --ROLE-pp */
    int ep;                    /* --actor-ep, --ref-ep, ... (a MoE model's experts over its dp ranks); 1 for the rollout ranks */
    const char *dir;
    Mesh mesh;                 /* members only */
    Model m;                   /* members only */
} Role;

typedef struct {
    Role role[N_ROLES];
    Comm world;                /* the ranks this rank's step runs its collectives over: every rank; with a
                                  rollout role, this rank's side (the trainer ranks 0 .. T-1, numbered as in
                                  the job, or the rollout ranks), cut by roles_place */
    Comm job;                  /* every rank of the job (the exchanges between the two sides) */
    int world_rank;            /* this rank in the job (0: the trainer side's root, the writer) */
    char placement[512];       /* the layout, as a checkpoint saves it: "actor@0+2:tp1:pp1,..." */
    char group_name[32];       /* this rank's role group ("" with one group), for error lines */
    int group_root;            /* this rank is its group's root */
    const char *device;        /* --device (set before roles_open) */
    int score_head[N_ROLES];   /* roles_load gives that role a score head whatever its directory (the
                                  reward when its adapter brings one: a causal-LM base) */
    const Backend *be;         /* its backend, opened by roles_place: every role's model is on it */
} Roles;

/* The run's roles: the actor always, critic, reward and teacher when given a directory, the reference when
 * has_ref (default: the actor's directory); checks the directories, the rank counts and the
 * vocabularies (roles_check_vocab), then places them (roles_place) over the job's world. */
void roles_open(Roles *rs, int has_ref, const char *colocate);
/* Each member role's model from load_dir[role] at dtype[role] on its mesh (the critic with a score
 * head, a new one seeded 42 on a causal LM); a role's model errors name the role. */
void roles_load(Roles *rs, const char *const *load_dir, const DType dtype[N_ROLES]);
/* adapter[role] (NULL: none): a PEFT adapter merged into that role's model (runtime/adapter.h). */
void roles_merge_adapters(Roles *rs, const char *const *adapter);
/* ZeRO-3: every member role's weights whole (model_shards_gather_all; a no-op for the others), for
 * the experience phases (generation, logprobs, values), as verl syncs the actor's weights into its
 * rollout engine; each update's learner_step releases them again. */
void roles_gather_weights(Roles *rs);
/* The role that generates the rollouts: R_ROLLOUT when the run has one, else the actor. */
static inline int rollout_role(const Roles *rs) { return rs->role[R_ROLLOUT].active ? R_ROLLOUT : R_ACTOR; }
/* This rank's models and meshes, and the world. */
void roles_free(Roles *rs);
/* Splits the world into role groups from the counts and --colocate ("all", or sets like
 * "actor,ref:critic,reward") and builds each member role's mesh; prints the placement (world rank
 * 0); opens rs->device (runtime/device.h device_open_local) before the groups are cut, each rank
 * on device local_rank % devices: a device trains and scores at any role layout (tp, pp, dp, ZeRO),
 * colocated roles sharing the process and its device. rs->role[*].active/count/tp/pp must be set.
 * Collective over the world. */
void roles_place(Roles *rs, const char *colocate);
/* Every other role must read the actor's token ids: the same vocabulary size and tokenizer files;
 * the reward is a score model, the reference and the teacher causal LMs, and the teacher has each
 * tokenizer file the actor has. user_error naming the role otherwise. */
void roles_check_vocab(const Roles *rs);
/* A role's per-item results, computed by its dp replicas (each filled its own items, zeros
 * elsewhere) and its pp stages (the last computes; its broadcast done already): summed over the
 * role's dp, then from the role's root to every rank of the world. Every rank calls it. */
void roles_share_f(const Roles *rs, const Role *r, float *x, size_t n);
void roles_share_d(const Roles *rs, const Role *r, double *x, size_t n);
void roles_share_i(const Roles *rs, const Role *r, int *x, size_t n);
/* A loss hook's sums over the role's mesh (dp sum; max for the logprob check; from the last
 * stage), then to every rank. */
void roles_share_stats(const Roles *rs, const Role *r, PpoStats *s);
#endif
