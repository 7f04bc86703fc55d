/* roles.c — see roles.h. */
#include "rlhf/roles.h"
#include "runtime/adapter.h"
#include "runtime/device.h"
#include "runtime/util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const ROLE_NAMES[N_ROLES] = {"actor", "critic", "ref", "reward", "teacher", "rollout"};

/* ---- placement ------------------------------------------------------------------------------ */

static int role_of(const char *name, const char *spec) {
    if (!strcmp(name, "rollout")) user_error("--colocate %s: the rollout ranks are a group of their own (--rollout-ranks)", spec);
    for (int r = 0; r < R_ROLLOUT; r++) if (!strcmp(name, ROLE_NAMES[r])) return r;
    user_error("--colocate %s: unknown role \"%s\" (actor, critic, ref, reward, teacher)", spec, name);
}

/* Role groups from the counts and --colocate ("all", or sets like "actor,ref:critic,reward"). */
void roles_place(Roles *p, const char *colocate) {
    Role *R = p->role;
    int set_of[N_ROLES], n_sets = 0, any_count = 0;
    for (int r = 0; r < N_ROLES; r++) { set_of[r] = -1; any_count |= R[r].active && R[r].count > 0; }
    if (!colocate && !any_count) colocate = "all";
    if (colocate && !strcmp(colocate, "all")) {
        for (int r = 0; r < R_ROLLOUT; r++) if (R[r].active) set_of[r] = 0;
        n_sets = 1;
    } else if (colocate) {
        char *spec = xstrdup(colocate), *save1 = NULL;
        for (char *set = strtok_r(spec, ":", &save1); set; set = strtok_r(NULL, ":", &save1), n_sets++) {
            char *save2 = NULL;
            for (char *nm = strtok_r(set, ",", &save2); nm; nm = strtok_r(NULL, ",", &save2)) {
                int r = role_of(nm, colocate);
                if (set_of[r] >= 0) user_error("--colocate %s: role %s named twice", colocate, nm);
                set_of[r] = n_sets;
            }
        }
        free(spec);
    }
    /* the rest: a group each, except that a role given no rank count shares the actor's */
    if (set_of[R_ACTOR] < 0) set_of[R_ACTOR] = n_sets++;
    for (int r = 0; r < N_ROLES; r++)
        if (R[r].active && set_of[r] < 0) set_of[r] = R[r].count > 0 ? n_sets++ : set_of[R_ACTOR];
    /* groups in role order (actor first: world rank 0 is the actor's root) */
    int order[N_ROLES], n_groups = 0, counts[N_ROLES], first_role[N_ROLES];
    const char *names[N_ROLES];
    static char name_buf[N_ROLES][32];
    for (int r = 0; r < N_ROLES; r++) {
        if (!R[r].active) continue;
        int g = -1;
        for (int k = 0; k < n_groups; k++) if (order[k] == set_of[r]) g = k;
        if (g < 0) {
            g = n_groups++;
            order[g] = set_of[r];
            counts[g] = 0;
            first_role[g] = r;
            name_buf[g][0] = 0;
        }
        R[r].group = g;
        if (name_buf[g][0]) strncat(name_buf[g], "+", sizeof name_buf[g] - strlen(name_buf[g]) - 1);
        strncat(name_buf[g], ROLE_NAMES[r], sizeof name_buf[g] - strlen(name_buf[g]) - 1);
        if (R[r].count > 0) {
            if (counts[g] > 0 && counts[g] != R[r].count)
                user_error("--%s-ranks %d: colocated roles (%s) must have the same rank count (%d)", ROLE_NAMES[r],
                           R[r].count, name_buf[g], counts[g]);
            counts[g] = R[r].count;
        }
    }
    for (int g = 0; g < n_groups; g++) {
        names[g] = name_buf[g];
        if (counts[g] == 0) {
            if (n_groups > 1) user_error("role group %s: give its rank count (--%s-ranks)", names[g], ROLE_NAMES[first_role[g]]);
            counts[g] = p->world.size;
        }
    }
    /* the device, while world rank 0 still reports alone, and before the groups are cut (their links) */
    p->be = device_open_local(p->device, &p->world);
    RoleGroup mine;
    char flag[160];
    snprintf(flag, sizeof flag, "--actor-ranks/--critic-ranks/--ref-ranks/--reward-ranks%s%s",
             R[R_TEACHER].active ? "/--teacher-ranks" : "", R[R_ROLLOUT].active ? "/--rollout-ranks" : "");
    group_split(&p->world, n_groups, names, counts, flag, &mine);
    int first = 0;
    for (int g = 0; g < n_groups; g++) {
        for (int r = 0; r < N_ROLES; r++)
            if (R[r].active && R[r].group == g) { R[r].root = first; R[r].member = g == mine.index; }
        first += counts[g];
    }
    static const char *const EP_FLAGS[N_ROLES] = {"--actor-ep", "--critic-ep", "--ref-ep", "--reward-ep", "--teacher-ep", "--actor-ep"};
    for (int r = 0; r < N_ROLES; r++)   /* the rollout ranks hold the actor's tp x pp shards: ep 1 (--actor-ep > 1 refuses them) */
        if (R[r].member) mesh_init_ep_flag(&R[r].mesh, &mine.comm, R[r].tp, R[r].pp, r != R_ROLLOUT && R[r].ep ? R[r].ep : 1, EP_FLAGS[r]);
    for (int r = 0; r < N_ROLES; r++)
        if (R[r].active) {
            char ep[16] = "";   /* the role's --X-ep, when not 1 */
            if (r != R_ROLLOUT && R[r].ep > 1) snprintf(ep, sizeof ep, ":ep%d", R[r].ep);
            snprintf(p->placement + strlen(p->placement), sizeof p->placement - strlen(p->placement), "%s%s@%d+%d:tp%d:pp%d%s",
                     p->placement[0] ? "," : "", ROLE_NAMES[r], R[r].root, counts[R[r].group], R[r].tp, R[r].pp, ep);
        }
    if (p->world_rank == 0) {
        fprintf(stderr, "placement (%d ranks):", p->world.size);
        for (int r = 0; r < N_ROLES; r++)
            if (R[r].active)
                fprintf(stderr, " %s ranks %d-%d (group %s, tp %d pp %d dp %d)%s", ROLE_NAMES[r], R[r].root,
                        R[r].root + counts[R[r].group] - 1, names[R[r].group], R[r].tp, R[r].pp,
                        counts[R[r].group] / (R[r].tp * R[r].pp), r + 1 < N_ROLES ? ";" : "");
        fprintf(stderr, "\n");
    }
    p->group_root = mine.comm.rank == 0;
    snprintf(p->group_name, sizeof p->group_name, "%s", n_groups > 1 ? mine.name : "");
    group_free(&mine);
    p->job = comm_dup(&p->world);
    if (R[R_ROLLOUT].active) {   /* two sides: the step's collectives stay on this rank's own (roles.h) */
        Comm side = comm_split(&p->job, R[R_ROLLOUT].member, p->world_rank);
        comm_free(&p->world);
        p->world = side;
        if (R[R_ROLLOUT].member) R[R_ROLLOUT].root = 0;
    }
}

/* Another role's model must read the actor's token ids. */
void roles_check_vocab(const Roles *p) {
    ModelConfig a;
    config_load(&a, p->role[R_ACTOR].dir);
    for (int r = R_CRITIC; r < R_ROLLOUT; r++) {
        if (!p->role[r].active) continue;
        ModelConfig c;
        config_load(&c, p->role[r].dir);
        if (c.vocab_size != a.vocab_size)
            user_error("--%s %s: vocabulary of %d tokens, the actor's has %d: the roles must share the actor's tokenizer",
                       ROLE_NAMES[r], p->role[r].dir, c.vocab_size, a.vocab_size);
        if (r == R_REWARD && !c.score_head && !p->score_head[r])
            user_error("--reward %s: a causal LM, not a reward model (*ForSequenceClassification, e.g. from `tandem rm`)",
                       p->role[r].dir);
        if (r == R_REF && c.score_head) user_error("--ref %s: a score-head model; the reference is a causal LM", p->role[r].dir);
        if (r == R_TEACHER && c.score_head) user_error("--teacher %s: a score-head model; the teacher is a causal LM", p->role[r].dir);
        for (const char *const *f = (const char *const[]){"tokenizer.model", "tokenizer.json", NULL}; *f; f++) {
            char *pa = path_join(p->role[R_ACTOR].dir, *f), *pc = path_join(p->role[r].dir, *f);
            size_t la = 0, lc = 0;
            char *ta = read_file(pa, &la), *tc = read_file(pc, &lc);
            int differ = ta && tc && (la != lc || memcmp(ta, tc, la)), missing = ta && !tc;
            free(ta); free(tc); free(pa); free(pc);
            /* a teacher's logprobs of ids it reads otherwise would be silently wrong: it must show its tokenizer */
            if (missing && r == R_TEACHER)
                user_error("--teacher %s: no %s beside the actor's: cannot check that it reads the actor's token ids",
                           p->role[r].dir, *f);
            if (differ) user_error("--%s %s: its %s differs from the actor's: the roles must share the actor's tokenizer",
                                   ROLE_NAMES[r], p->role[r].dir, *f);
        }
    }
}

void roles_open(Roles *rs, int has_ref, const char *colocate) {
    Role *R = rs->role;
    R[R_ACTOR].active = 1;
    R[R_CRITIC].active = R[R_CRITIC].dir != NULL;
    R[R_REWARD].active = R[R_REWARD].dir != NULL;
    R[R_TEACHER].active = R[R_TEACHER].dir != NULL;
    R[R_REF].active = has_ref;
    if (R[R_REF].active && !R[R_REF].dir) R[R_REF].dir = R[R_ACTOR].dir;
    R[R_ROLLOUT].active = R[R_ROLLOUT].count > 0;   /* the actor's model and layout (rlhf/async.h) */
    R[R_ROLLOUT].dir = R[R_ACTOR].dir;
    R[R_ROLLOUT].tp = R[R_ACTOR].tp;
    R[R_ROLLOUT].pp = R[R_ACTOR].pp;
    for (int r = 0; r < N_ROLES; r++) {
        if (R[r].active && !dir_exists(R[r].dir)) user_error("--%s %s: not a directory", ROLE_NAMES[r], R[r].dir);
        if (!R[r].active && R[r].count > 0) user_error("--%s-ranks %d: this run has no %s", ROLE_NAMES[r], R[r].count, ROLE_NAMES[r]);
    }
    roles_check_vocab(rs);
    rs->world = comm_world();
    rs->world_rank = rs->world.rank;
    roles_place(rs, colocate);
}

void roles_load(Roles *rs, const char *const *load_dir, const DType dtype[N_ROLES]) {
    Role *R = rs->role;
    for (int r = 0; r < N_ROLES; r++) {
        if (!R[r].member) continue;
        util_set_reporter(R[r].mesh.rank == 0, ROLE_NAMES[r]);   /* a role's model errors name the role */
        if (r == R_CRITIC || rs->score_head[r]) model_load_score(&R[r].m, load_dir[r], &R[r].mesh, 42, dtype[r], rs->be);
        else model_load(&R[r].m, load_dir[r], &R[r].mesh, dtype[r], rs->be);
        if (r == R_ACTOR && R[r].m.head != HEAD_LM) user_error("--actor %s: a score-head model; the actor is a causal LM", R[r].dir);
    }
    util_set_reporter(rs->group_root, rs->group_name[0] ? rs->group_name : NULL);
}

void roles_merge_adapters(Roles *rs, const char *const *adapter) {
    for (int r = 0; r < N_ROLES; r++)
        if (rs->role[r].member && adapter[r]) adapter_merge(&rs->role[r].m, adapter[r]);
}

void roles_gather_weights(Roles *rs) {
    for (int r = 0; r < N_ROLES; r++)
        if (rs->role[r].member) model_shards_gather_all(&rs->role[r].m);
}

void roles_free(Roles *rs) {
    for (int r = 0; r < N_ROLES; r++)
        if (rs->role[r].member) { model_free(&rs->role[r].m); mesh_free(&rs->role[r].mesh); }
    comm_free(&rs->world);
    comm_free(&rs->job);
}

/* ---- moving results between roles ------------------------------------------------------------ */

void roles_share_f(const Roles *p, const Role *r, float *x, size_t n) {
    if (r->member) comm_all_reduce_sum(&r->mesh.dp_comm, x, n);
    comm_broadcast(&p->world, x, sizeof(float) * n, r->root);
}
void roles_share_d(const Roles *p, const Role *r, double *x, size_t n) {
    if (r->member) comm_all_reduce_sum_f64(&r->mesh.dp_comm, x, n);
    comm_broadcast(&p->world, x, sizeof(double) * n, r->root);
}
void roles_share_i(const Roles *p, const Role *r, int *x, size_t n) {
    if (r->member) comm_all_reduce_sum_int(&r->mesh.dp_comm, x, n);
    comm_broadcast(&p->world, x, sizeof(int) * n, r->root);
}

void roles_share_stats(const Roles *p, const Role *r, PpoStats *s) {
    if (r->member) {
        double mx = s->logprob_diff_max;
        comm_all_reduce_sum_f64(&r->mesh.dp_comm, (double *)s, PPO_STATS_N);
        float fm = (float)mx;   /* a max of differences of floats: exact in float */
        comm_all_reduce_max(&r->mesh.dp_comm, &fm, 1);
        s->logprob_diff_max = fm;
        comm_broadcast(&r->mesh.pp_comm, s, sizeof *s, r->mesh.pp_comm.size - 1);
    }
    comm_broadcast(&p->world, s, sizeof *s, r->root);
}
