/* mesh.c — see mesh.h. */
#include "runtime/mesh.h"
#include "runtime/util.h"
#include <stdio.h>
#include <string.h>

int mesh_rank_of(const Mesh *m, int tp_rank, int dp_rank, int pp_rank) {
    return tp_rank + m->tp * (dp_rank + m->dp * pp_rank);
}

void mesh_init(Mesh *m, const Comm *parent, int tp, int pp) { mesh_init_ep(m, parent, tp, pp, 1); }

void mesh_init_ep(Mesh *m, const Comm *parent, int tp, int pp, int ep) { mesh_init_ep_flag(m, parent, tp, pp, ep, "--ep"); }

void mesh_init_ep_flag(Mesh *m, const Comm *parent, int tp, int pp, int ep, const char *flag) {
    memset(m, 0, sizeof(*m));
    m->ep_flag = flag;
    m->group = comm_dup(parent);
    m->rank = m->group.rank;
    m->size = m->group.size;
    if (tp < 1 || pp < 1) user_error("--tp and --pp must be >= 1 (got tp=%d pp=%d)", tp, pp);
    if (m->size % (tp * pp))
        user_error("%d ranks are not divisible by tp*pp = %d*%d", m->size, tp, pp);
    m->tp = tp;
    m->pp = pp;
    m->dp = m->size / (tp * pp);
    int r = m->rank;
    m->tp_rank = r % tp;
    m->dp_rank = (r / tp) % m->dp;
    m->pp_rank = r / (tp * m->dp);
    CHECK(mesh_rank_of(m, m->tp_rank, m->dp_rank, m->pp_rank) == r);
    m->tp_comm = comm_split(&m->group, m->dp_rank + m->dp * m->pp_rank, m->tp_rank);
    m->dp_comm = comm_split(&m->group, m->tp_rank + tp * m->pp_rank, m->dp_rank);
    m->pp_comm = comm_split(&m->group, m->tp_rank + tp * m->dp_rank, m->pp_rank);
    CHECK(m->tp_comm.rank == m->tp_rank && m->dp_comm.rank == m->dp_rank && m->pp_comm.rank == m->pp_rank);
    if (ep < 1 || m->dp % ep)
        user_error("%s %d must divide the data-parallel size dp = %d (%d ranks / (tp %d x pp %d))", flag, ep, m->dp, m->size,
                   tp, pp);
    m->ep = ep;
    m->edp = m->dp / ep;
    m->ep_rank = m->dp_rank % ep;
    m->edp_rank = m->dp_rank / ep;
    int line = m->tp_rank + tp * m->pp_rank;   /* the dp line this rank is on */
    m->ep_comm = comm_split(&m->group, line * m->edp + m->edp_rank, m->ep_rank);
    m->edp_comm = comm_split(&m->group, line * ep + m->ep_rank, m->edp_rank);
    CHECK(m->ep_comm.rank == m->ep_rank && m->edp_comm.rank == m->edp_rank);
}

void mesh_init_world(Mesh *m, int tp, int pp, int ep) {
    Comm world = comm_world();
    mesh_init_ep(m, &world, tp, pp, ep);
    comm_free(&world);
}

void mesh_free(Mesh *m) {
    comm_free(&m->tp_comm);
    comm_free(&m->dp_comm);
    comm_free(&m->pp_comm);
    comm_free(&m->ep_comm);
    comm_free(&m->edp_comm);
    comm_free(&m->group);
}

void group_split(const Comm *world, int n_groups, const char *const *names, const int *counts, const char *flag,
                 RoleGroup *mine) {
    int total = 0;
    for (int g = 0; g < n_groups; g++) {
        if (counts[g] < 1) user_error("%s: the %s group needs at least 1 rank (got %d)", flag, names[g], counts[g]);
        total += counts[g];
    }
    if (total != world->size)
        user_error("%s: the groups' ranks add up to %d, but the job has %d", flag, total, world->size);
    memset(mine, 0, sizeof(*mine));
    for (int g = 0, first = 0; g < n_groups; first += counts[g++])
        if (world->rank >= first && world->rank < first + counts[g]) {
            mine->index = g;
            mine->first = first;
            mine->n = counts[g];
            snprintf(mine->name, sizeof mine->name, "%s", names[g]);
        }
    mine->comm = comm_split(world, mine->index, world->rank);
    util_set_reporter(mine->comm.rank == 0, n_groups > 1 ? mine->name : NULL);
}

void group_free(RoleGroup *g) { comm_free(&g->comm); }
