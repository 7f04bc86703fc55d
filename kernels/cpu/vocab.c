/* vocab.c — CPU kernels over a logits row of the vocabulary (the oracle for CUDA's): masking the
 * padded columns, the first maximum, the row max, the leaves' sums of exp and of the entropy term
 * (kernels.h TP_LEAVES), picking target logits, and the log-softmax's last steps. Owns no memory and
 * does no communication. */
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/vec.h"
#include <math.h>
#include <omp.h>

/* One pass, a native vector of lanes: each lane keeps its first maximum (a strict >), then the
 * lanes' best with the lowest index among equals, which is the first maximum of x. A row with no
 * value above -inf (all -inf or NaN) goes to the plain scan: its first -inf, else 0. */
int cpu_argmax(const float *x, int n) {
    vnat best = (vnat){0} - INFINITY;               /* per lane: its largest so far, */
    vinat at = (vinat){0} - 1;                      /* and where (-1: none above -inf yet) */
    vinat idx;
    for (int l = 0; l < NAT; l++) idx[l] = l;
    int v = 0;
    for (; v + NAT <= n; v += NAT, idx = idx + NAT) {
        vnat xv = ldnat(x + v);
        vinat gt = xv > best;
        best = selnat(gt, xv, best);
        at = (idx & gt) | (at & ~gt);
    }
    float mx = -INFINITY;
    int arg = -1;
    for (int l = 0; l < NAT; l++)
        if (at[l] >= 0 && (best[l] > mx || (best[l] == mx && at[l] < arg))) mx = best[l], arg = at[l];
    for (; v < n; v++)
        if (x[v] > mx) mx = x[v], arg = v;
    if (arg >= 0) return arg;
    for (v = 0; v < n; v++)
        if (x[v] == -INFINITY) return v;
    return 0;
}

void cpu_log_add(float *lse, const float *sum, int N) {
    for (int n = 0; n < N; n++) lse[n] += logf(sum[n]);
}

void cpu_sub_at(float *out, const float *a, const float *b, const int *idx, int n) {
    for (int i = 0; i < n; i++) out[i] = a[i] - b[idx ? idx[i] : i];
}

void cpu_mask_cols(float *x, int N, int V, int from) {
    if (from < 0) from = 0;
    for (int n = 0; n < N && from < V; n++)
        for (int v = from; v < V; v++) x[(size_t)n * V + v] = -INFINITY;
}

void cpu_argmax_rows(int *ids, float *vals, const float *x, int N, int V, int v0) {
#pragma omp parallel for schedule(static) if (N > 1)
    for (int n = 0; n < N; n++) {
        const float *row = x + (size_t)n * V;
        int best = cpu_argmax(row, V);
        vals[n] = row[best];
        ids[n] = v0 + best;
    }
}

void cpu_row_max(float *mx, const float *x, int N, int V, float T) {
#pragma omp parallel for schedule(static) if (N > 1)
    for (int n = 0; n < N; n++) {
        const float *row = x + (size_t)n * V;
        float m = -INFINITY;
        for (int v = 0; v < V; v++) m = row[v] > m ? row[v] : m;
        mx[n] = m / T;
    }
}

/* Row sums over V columns in `leaves` runs of ceil(V / leaves) (kernels.h), each in double and
 * rounded once, added by tree_sum: sum[n] of exp(x / T - mx[n]) (ENTROPY 0) or of
 * exp(x / T - mx[n]) * x / T (ENTROPY 1, mx = lse: the entropy's sum of p z) */
static void row_sums(float *sum, const float *x, const float *mx, int N, int V, float T, int leaves, int entropy) {
    int w = (V + leaves - 1) / leaves;
#pragma omp parallel for schedule(static) if (N > 1)
    for (int n = 0; n < N; n++) {
        const float *row = x + (size_t)n * V;
        float part[leaves];   /* (leaves) */
        for (int l = 0; l < leaves; l++) {
            int lo = l * w < V ? l * w : V, hi = lo + w < V ? lo + w : V;
            double acc = 0.0;
            for (int v = lo; v < hi; v++) {
                float z = row[v] / T;
                float p = expf(z - mx[n]);
                acc += entropy ? (p == 0.0f ? 0.0 : (double)p * z) : p;   /* -inf (padded): 0, not 0 * inf */
            }
            part[l] = (float)acc;
        }
        tree_sum(part, leaves, 1);
        sum[n] = part[0];
    }
}

void cpu_row_sumexp(float *sum, const float *x, const float *mx, int N, int V, float T, int leaves) {
    row_sums(sum, x, mx, N, V, T, leaves, 0);
}

void cpu_row_entropy_part(float *s, const float *x, const float *lse, int N, int V, float T, int leaves) {
    row_sums(s, x, lse, N, V, T, leaves, 1);
}

void cpu_pick_logits(float *z, const float *x, const int *targets, int N, int V, int v0, float T) {
    for (int n = 0; n < N; n++) {
        int r = targets[n] - v0;
        z[n] = (targets[n] >= 0 && r >= 0 && r < V) ? x[(size_t)n * V + r] / T : 0.0f;
    }
}
