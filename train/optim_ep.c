/* optim_ep.c — the optimizer's two steps that expert parallelism changes (train/optim.c calls them
 * at ep > 1): the dp reduction, where the routed experts' gradients are summed over the expert-data-
 * parallel group only (the dp / ep ranks holding the same experts; the other tensors over dp as
 * before), plain or ZeRO-1 (whose experts' unit is split over that group: optim.h OptimUnit; ZeRO-2's
 * units are reduced by optim.c's optim_reduce_unit over their own group), and
 * plain's global norm's sum of squares, taken in ep 1's order (ZeRO-1's is summed over dp as at ep 1).
 * Does not own: the per-source sums that make an expert's gradient at ep > 1 equal to ep 1's dp sum
 * (runtime/moe_ep.c), the rest of the step (train/optim.c).
 *
 * Bits: each element is summed by comm_reduce_scatter_sum_fixed's pairwise tree. At ep 1 dp D an
 * expert's gradient is the tree over the D ranks; at ep P it is the tree over the P sources (moe_ep
 * fold) and then the tree over the D / P edp ranks, each holding a block of P consecutive dp ranks:
 * for powers of two that is the same tree ((g0 + g1) + (g2 + g3) at D = 4, P = 2), so the reduced
 * gradient has ep 1's bits (at dp 2, ep 2: g0 + g1 either way). The mean divides by dp as at ep 1. */
#include "train/optim.h"
#include "runtime/comm.h"
#include "runtime/util.h"
#include <stdlib.h>
#include <string.h>

/* packs (back 0) or unpacks (back 1) the ranges of one kind (expert or not) to / from buf */
static size_t pack_kind(const Optim *o, float *grads, float *buf, int expert, int back) {
    size_t at = 0;
    for (int t = 0; t < o->n_ranges; t++) {
        const OptimRange *rg = &o->ranges[t];
        if (rg->expert != expert) continue;
        size_t n = rg->hi - rg->lo;
        if (back) memcpy(grads + rg->lo, buf + at, sizeof(float) * n);
        else memcpy(buf + at, grads + rg->lo, sizeof(float) * n);
        at += n;
    }
    return at;
}

/* the reductions' groups and padded sizes: kind k (1: the experts) over groups[k], P S floats */
static const Comm *kind_comm(const Optim *o, int k) { return k ? &o->mesh->edp_comm : &o->mesh->dp_comm; }
static size_t kind_S(const Optim *o, int k) {
    size_t n = 0, P = (size_t)kind_comm(o, k)->size, q = 16 * P;   /* a slice: whole 64-byte lines, as optim.c's */
    for (int t = 0; t < o->n_ranges; t++) n += o->ranges[t].expert == k ? o->ranges[t].hi - o->ranges[t].lo : 0;
    return (n + q - 1) / q * q / P;
}

size_t optim_ep_buf_floats(const Optim *o) {
    size_t n = 0;
    if (o->mesh->ep == 1 || o->cfg.zero >= 2) return 0;
    if (o->cfg.zero)
        for (int u = 0; u < o->n_units; u++) {
            size_t f = o->units[u].S * kind_comm(o, o->units[u].kind == 2)->size;
            if (f > n) n = f;
        }
    else
        for (int k = 0; k < 2; k++)
            if (kind_comm(o, k)->size > 1 && kind_S(o, k) * kind_comm(o, k)->size > n) n = kind_S(o, k) * kind_comm(o, k)->size;
    return n + 1;
}

/* packs kind k of grads into o->epbuf, (P S) floats with zero padding */
static void pack(const Optim *o, float *grads, int k, size_t P, size_t S) {
    size_t at = pack_kind(o, grads, o->epbuf, k, 0);
    CHECK(P * S < o->n_epbuf);
    memset(o->epbuf + at, 0, sizeof(float) * (P * S - at));
}

void optim_ep_reduce(const Optim *o, float *grads) {
    CHECK(!o->be->owns && !o->cfg.zero);   /* MoE runs on the CPU; ZeRO-1: optim_ep_reduce_zero */
    for (int k = 0; k < 2; k++) {   /* the other tensors over dp, the experts over edp */
        const Comm *c = kind_comm(o, k);
        if (c->size == 1) continue;
        size_t S = kind_S(o, k);
        float *mine = o->epbuf + (size_t)c->rank * S;
        pack(o, grads, k, c->size, S);
        comm_reduce_scatter_sum_fixed(c, o->epbuf, mine, S);   /* in place */
        comm_all_gather(c, mine, o->epbuf, S);
        pack_kind(o, grads, o->epbuf, k, 1);
    }
}

void optim_ep_reduce_zero(const Optim *o, float *grads) {
    CHECK(!o->be->owns);
    for (int u = 0; u < o->n_units; u++) {
        const OptimUnit *un = &o->units[u];
        const Comm *c = kind_comm(o, un->kind == 2);
        pack(o, grads, un->kind == 2, c->size, un->S);
        comm_reduce_scatter_sum_fixed(c, o->epbuf, o->slice + un->held, un->S);
    }
}

double optim_ep_sumsq(const Optim *o, const Model *m, const double *sums) {
    const Mesh *mesh = o->mesh;
    int P = mesh->ep, nx = 0, El = m->n_experts_local;
    for (int i = 0; i < o->n_pieces; i++) nx += o->ranges[o->pieces[i].t].expert;
    double *mine = xmalloc(sizeof(double) * (nx + 1)), *all = xmalloc(sizeof(double) * ((size_t)P * nx + 1));
    for (int i = 0, x = 0; i < o->n_pieces; i++)
        if (o->ranges[o->pieces[i].t].expert) mine[x++] = o->ranges[o->pieces[i].t].in_norm ? sums[i] : 0.0;
    comm_all_gather(&mesh->ep_comm, (const float *)mine, (float *)all, 2 * (size_t)nx);   /* doubles as float pairs */
    /* ep 1's order: each run of a tensor's local experts (El pieces in a row) stands for every ep
     * rank's run of it, rank by rank */
    double sumsq = 0.0;
    for (int i = 0, x = 0; i < o->n_pieces;) {
        const OptimRange *rg = &o->ranges[o->pieces[i].t];
        if (!rg->expert) {
            if (rg->in_norm) sumsq += sums[i];
            i++;
            continue;
        }
        for (int q = 0; q < P; q++)
            for (int j = 0; j < El; j++) sumsq += all[(size_t)q * nx + x + j];
        x += El;
        i += El;
    }
    free(mine);
    free(all);
    return sumsq;
}
