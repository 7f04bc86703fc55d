/* mesh.c — see mesh.h. */
#include "runtime/mesh.h"
#include "runtime/util.h"
#include <string.h>

int mesh_rank_of(const Mesh *m, int tp_rank, int dp_rank, int pp_rank) {
    return tp_rank + m->tp * (dp_rank + m->dp * pp_rank);
}

void mesh_init(Mesh *m, int tp, int pp) {
    memset(m, 0, sizeof(*m));
    m->world = comm_world();
    m->world_rank = m->world.rank;
    m->world_size = m->world.size;
    if (tp < 1 || pp < 1) user_error("--tp and --pp must be >= 1 (got tp=%d pp=%d)", tp, pp);
    if (m->world_size % (tp * pp))
        user_error("world size %d is not divisible by tp*pp = %d*%d", m->world_size, tp, pp);
    m->tp = tp;
    m->pp = pp;
    m->dp = m->world_size / (tp * pp);
    int r = m->world_rank;
    m->tp_rank = r % tp;
    m->dp_rank = (r / tp) % m->dp;
    m->pp_rank = r / (tp * m->dp);
    CHECK(mesh_rank_of(m, m->tp_rank, m->dp_rank, m->pp_rank) == r);
    m->tp_comm = comm_split(&m->world, m->dp_rank + m->dp * m->pp_rank, m->tp_rank);
    m->dp_comm = comm_split(&m->world, m->tp_rank + tp * m->pp_rank, m->dp_rank);
    m->pp_comm = comm_split(&m->world, m->tp_rank + tp * m->dp_rank, m->pp_rank);
    CHECK(m->tp_comm.rank == m->tp_rank && m->dp_comm.rank == m->dp_rank && m->pp_comm.rank == m->pp_rank);
}

void mesh_free(Mesh *m) {
    comm_free(&m->tp_comm);
    comm_free(&m->dp_comm);
    comm_free(&m->pp_comm);
    comm_free(&m->world);
}
