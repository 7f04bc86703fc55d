/* test_kernels.c — the batch-invariance contract of the CPU forward kernels (kernels/cpu/cpu.h):
 * cpu_matmul gives each output row the same bits whether the row is computed alone, inside a batch
 * of any size and offset (4x4 tiles vs the 1x1 edge kernel), or with 1 or 2 threads; the same for
 * cpu_attention across thread counts, and across the contiguous and paged layouts. Exact
 * comparison: the contract is bitwise. Also silu (exp16) against exact values, and the one-pass
 * argmax against a plain scan.
 * Usage: test_kernels  (prints one line per shape, exits 1 on any difference) */
#include "kernels/cpu/cpu.h"
#include "runtime/util.h"
#include <omp.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float frand(unsigned *s) {
    *s = *s * 1103515245u + 12345u;
    return ((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

int main(void) {
    const int shapes[][2] = {{16, 4}, {33, 7}, {64, 64}, {288, 768}, {47, 130}, {768, 33}, {1, 5}, {2048, 9}};
    const int batches[] = {1, 2, 3, 4, 5, 7, 8, 13, 37, 64, 65};
    int fail = 0;
    unsigned seed = 1;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int K = shapes[si][0], O = shapes[si][1], NMAX = 65;
        float *x = xmalloc(sizeof(float) * NMAX * K), *w = xmalloc(sizeof(float) * O * K), *b = xmalloc(sizeof(float) * O);
        float *ref = xmalloc(sizeof(float) * NMAX * O), *out = xmalloc(sizeof(float) * NMAX * O);
        for (int i = 0; i < NMAX * K; i++) x[i] = frand(&seed);
        for (int i = 0; i < O * K; i++) w[i] = frand(&seed);
        for (int i = 0; i < O; i++) b[i] = frand(&seed);
        int bad = 0;
        for (int leaves = 1; leaves <= 8; leaves *= 8)   /* 1 and 8 leaves (where 8 divides K) */
        for (int use_bias = 0; use_bias < 2 && K % leaves == 0; use_bias++) {
            cpu_set_threads(1);
            for (int n = 0; n < NMAX; n++)   /* every row alone: the reference */
                cpu_matmul(ref + (size_t)n * O, x + (size_t)n * K, w, use_bias ? b : NULL, DTYPE_F32, 1, K, O, leaves);
            for (int th = 1; th <= 2; th++) {
                cpu_set_threads(th);
                for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
                    int N = batches[bi];
                    for (int off = 0; off + N <= NMAX; off += N > 1 ? N : 17) {
                        cpu_matmul(out, x + (size_t)off * K, w, use_bias ? b : NULL, DTYPE_F32, N, K, O, leaves);
                        if (memcmp(out, ref + (size_t)off * O, sizeof(float) * N * O)) bad++;
                    }
                }
            }
        }
        printf("cpu_matmul K=%-4d O=%-4d: rows alone vs batches 1..65 at every offset, 1 and 2 threads, with and "
               "without bias, 1 and 8 leaves: %s\n", K, O, bad ? "DIFFERENT" : "bit-identical");
        fail |= bad != 0;
        free(x); free(w); free(b); free(ref); free(out);
    }
    /* tp invariance (kernels.h TP_LEAVES): a row-parallel matmul at tp = t is t ranks each holding
     * K / t columns of x and w, computing TP_LEAVES / t leaves, their outputs added by tree_sum over
     * the ranks (comm_all_reduce_sum_fixed); that must be the 1x1 matmul with TP_LEAVES leaves, bit
     * for bit, for fp32 and bf16 weights, at decode (N <= 4: bf16's split path) and batch sizes. The
     * same for the vocabulary's sums: ranks of round_up(V, 8) / t columns (the padding -inf), each
     * TP_LEAVES / t leaves, against 1x1's V columns in TP_LEAVES leaves. */
    {
        const int tshapes[][2] = {{64, 9}, {288, 40}, {768, 33}, {16, 5}, {2048 + 128, 12}, {8192, 5}};   /* 8192: blocked leaves */
        const int tN[] = {1, 3, 4, 5, 37};
        int bad = 0, cases = 0;
        for (size_t si = 0; si < sizeof tshapes / sizeof tshapes[0]; si++) {
            int K = tshapes[si][0], O = tshapes[si][1], NMAX = 37;
            float *x = xmalloc(sizeof(float) * NMAX * K), *wf = xmalloc(sizeof(float) * O * K);
            uint16_t *wb = xmalloc(2 * (size_t)O * K);
            for (int i = 0; i < NMAX * K; i++) x[i] = frand(&seed);
            for (int i = 0; i < O * K; i++) { wb[i] = f32_to_bf16(frand(&seed)); wf[i] = frand(&seed); }
            float *whole = xmalloc(sizeof(float) * NMAX * O), *parts = xmalloc(sizeof(float) * 8 * NMAX * O);
            float *xr = xmalloc(sizeof(float) * NMAX * K), *wr = xmalloc(sizeof(float) * O * K);
            for (int dt = 0; dt < 2; dt++) {
                DType wt = dt ? DTYPE_BF16 : DTYPE_F32;
                size_t es = dtype_size(wt);
                const char *w = dt ? (const char *)wb : (const char *)wf;
                for (size_t ni = 0; ni < sizeof tN / sizeof tN[0]; ni++) {
                    int N = tN[ni];
                    cpu_matmul(whole, x, w, NULL, wt, N, K, O, TP_LEAVES);
                    for (int t = 2; t <= TP_LEAVES; t *= 2) {
                        int Kr = K / t;
                        for (int r = 0; r < t; r++) {   /* rank r: columns [r Kr, (r + 1) Kr) */
                            for (int n = 0; n < N; n++) memcpy(xr + (size_t)n * Kr, x + (size_t)n * K + (size_t)r * Kr, sizeof(float) * Kr);
                            for (int o = 0; o < O; o++) memcpy((char *)wr + es * o * Kr, w + es * ((size_t)o * K + (size_t)r * Kr), es * Kr);
                            cpu_matmul(parts + (size_t)r * N * O, xr, wr, NULL, wt, N, Kr, O, TP_LEAVES / t);
                        }
                        tree_sum(parts, t, (size_t)N * O);
                        bad += memcmp(parts, whole, sizeof(float) * N * O) != 0;
                        cases++;
                    }
                }
            }
            free(x); free(wf); free(wb); free(whole); free(parts); free(xr); free(wr);
        }
        const int vocab[] = {512, 37, 3, 1000};
        for (size_t vi = 0; vi < sizeof vocab / sizeof vocab[0]; vi++) {
            int V = vocab[vi], Vp = (V + TP_LEAVES - 1) / TP_LEAVES * TP_LEAVES, N = 3;
            float *x = xmalloc(sizeof(float) * N * V), mx[3] = {0.5f, -1.0f, 2.0f}, whole[2][3];
            for (int i = 0; i < N * V; i++) x[i] = 4.0f * frand(&seed);
            float *xr = xmalloc(sizeof(float) * N * Vp);
            cpu_row_sumexp(whole[0], x, mx, N, V, 0.7f, TP_LEAVES);
            cpu_row_entropy_part(whole[1], x, mx, N, V, 0.7f, TP_LEAVES);
            for (int t = 2; t <= TP_LEAVES; t *= 2) {
                int Vl = Vp / t;
                float sums[8 * 3], ents[8 * 3];   /* (t, N) */
                for (int r = 0; r < t; r++) {
                    for (int n = 0; n < N; n++)
                        for (int v = 0; v < Vl; v++) {
                            int g = r * Vl + v;
                            xr[(size_t)n * Vl + v] = g < V ? x[(size_t)n * V + g] : -INFINITY;
                        }
                    cpu_row_sumexp(sums + r * N, xr, mx, N, Vl, 0.7f, TP_LEAVES / t);
                    cpu_row_entropy_part(ents + r * N, xr, mx, N, Vl, 0.7f, TP_LEAVES / t);
                }
                tree_sum(sums, t, N);
                tree_sum(ents, t, N);
                bad += memcmp(sums, whole[0], sizeof whole[0]) != 0;
                bad += memcmp(ents, whole[1], sizeof whole[1]) != 0;   /* the -inf padding adds 0, not NaN */
                cases += 2;
            }
            free(x); free(xr);
        }
        printf("tp invariance: %d cases of matmul (fp32, bf16; N 1-37; tp 2, 4, 8) and vocabulary sums: %s\n", cases,
               bad ? "DIFFERENT" : "tp ranks' tree == 1x1, bit for bit");
        fail |= bad != 0;
    }
    /* attention, one sequence of T tokens, window 0 and 7, for head sizes that take every path of
     * the P.V code (1-4 register chunks of 16 columns, a scalar tail, tail only): the contiguous
     * layout with 1 thread is the reference; 2 threads, and the paged head-major layout (blocks of
     * 16 and 5, in a scrambled table) as one prefill and as T one-token decode steps, must give the
     * same bits: that is what makes generation's logprobs equal training's */
    const int head_dims[] = {8, 16, 40, 48, 64, 80};
    int T = 50, H = 6, Hkv = 2;
    for (size_t di = 0; di < sizeof head_dims / sizeof head_dims[0]; di++) {
        int Dh = head_dims[di];
        size_t qn = (size_t)T * H * Dh, kn = (size_t)T * Hkv * Dh;
        float *q = xmalloc(sizeof(float) * qn), *k = xmalloc(sizeof(float) * kn), *v = xmalloc(sizeof(float) * kn);
        float *ref = xmalloc(sizeof(float) * qn), *o = xmalloc(sizeof(float) * qn), *sc = xmalloc(sizeof(float) * 2 * H * T); /* 2 threads x (H, T) */
        for (size_t i = 0; i < qn; i++) q[i] = frand(&seed);
        for (size_t i = 0; i < kn; i++) { k[i] = frand(&seed); v[i] = frand(&seed); }
        KVLayout rows = kv_rows(T, Hkv, Dh);
        for (int window = 0; window <= 7; window += 7) {
            cpu_set_threads(1);
            cpu_attention(ref, q, k, v, &rows, T, 0, H, Hkv, Dh, window, sc);
            cpu_set_threads(2);
            cpu_attention(o, q, k, v, &rows, T, 0, H, Hkv, Dh, window, sc);
            int bad_threads = memcmp(o, ref, sizeof(float) * qn) != 0, bad_paged = 0;
            for (int block = 16; block >= 5; block -= 11) {
                int nb = (T + block - 1) / block, *table = xmalloc(sizeof(int) * nb);
                for (int b = 0; b < nb; b++) table[b] = (b * 7 + 3) % nb;   /* 7 is prime to nb: a permutation */
                float *kc = xcalloc((size_t)nb * block * Hkv * Dh, sizeof(float)), *vc = xcalloc((size_t)nb * block * Hkv * Dh, sizeof(float));
                KVLayout paged = kv_paged(table, block, Dh);
                for (int j = 0; j < T; j++)
                    for (int h = 0; h < Hkv; h++) {
                        size_t at = kv_offset(&paged, (size_t)Hkv * Dh, j) + h * paged.head;
                        memcpy(kc + at, k + ((size_t)j * Hkv + h) * Dh, sizeof(float) * Dh);
                        memcpy(vc + at, v + ((size_t)j * Hkv + h) * Dh, sizeof(float) * Dh);
                    }
                for (size_t i = 0; i < qn; i++) o[i] = NAN;   /* a kernel that writes nothing must fail */
                cpu_attention(o, q, kc, vc, &paged, T, 0, H, Hkv, Dh, window, sc);
                bad_paged |= memcmp(o, ref, sizeof(float) * qn) != 0;
                for (size_t i = 0; i < qn; i++) o[i] = NAN;
                for (int t = 0; t < T; t++) {
                    size_t row = (size_t)t * H * Dh;
                    cpu_attention(o + row, q + row, kc, vc, &paged, 1, t, H, Hkv, Dh, window, sc);
                }
                bad_paged |= memcmp(o, ref, sizeof(float) * qn) != 0;
                free(table); free(kc); free(vc);
            }
            printf("cpu_attention Dh=%-3d window %d: 1 vs 2 threads %s; paged prefill and decode %s\n", Dh, window,
                   bad_threads ? "DIFFERENT" : "bit-identical", bad_paged ? "DIFFERENT" : "bit-identical");
            fail |= bad_threads | bad_paged;
        }
        free(q); free(k); free(v); free(ref); free(o); free(sc);
    }
    /* silu through exp16 (vec.h) against the exact value in double, on 10^6 points over [-100, 100]
     * and the edges of exp's range: within 4 ulp-sized relative steps (2^-21): exp16 is within 2 ulp
     * of exp, then 1 + e, the division and the product each round once. Overflow must give -0, not NaN. */
    {
        size_t n = 1000003;
        float *g = xmalloc(sizeof(float) * n), *u = xmalloc(sizeof(float) * n), *o = xmalloc(sizeof(float) * n);
        const float edges[] = {0.0f, -0.0f, 87.3f, 87.4f, -87.3f, -87.4f, 88.7f, 88.8f, -88.7f, -88.8f, -1e30f, 1e30f};
        for (size_t i = 0; i < n; i++) {
            g[i] = i < 12 ? edges[i] : -100.0f + 200.0f * (float)i / (float)n;
            u[i] = 1.0f;
        }
        cpu_set_threads(2);
        cpu_swiglu(o, g, u, n);
        double worst = 0;
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) {
            double want = (double)g[i] / (1.0 + exp(-(double)g[i]));
            /* below 1e-30 in size, absolute: fp32's exp overflows past 88.72, so silu(-88.8) is -0 in
             * fp32 (as torch's) where the exact value is -2.8e-37 */
            double err = fabs(want) < 1e-30 ? fabs(o[i] - want) : fabs(o[i] - want) / fabs(want);
            if (!(err <= 0x1p-21)) { bad++; if (bad <= 3) printf("  g=%.9g: %.9g, exact %.9g\n", g[i], o[i], want); }
            if (err > worst) worst = err;
        }
        printf("cpu_swiglu (exp16): %zu points, worst relative error %.3g (limit %.3g): %s\n", n, worst, 0x1p-21,
               bad ? "OUT OF TOLERANCE" : "within");
        fail |= bad != 0;
        free(g); free(u); free(o);
    }
    /* cpu_argmax against a plain scan (the largest non-NaN value, its first index; 0 when there is
     * none): lengths around the 16 lanes, values from 8 levels so ties are common, NaN and -inf
     * planted, and rows of only -inf, only NaN, and NaN before -inf */
    {
        const int lens[] = {1, 2, 15, 16, 17, 31, 33, 100, 1000};
        int bad = 0, rows = 0;
        float *x = xmalloc(sizeof(float) * 1000);
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
            for (int kind = 0; kind < 6; kind++, rows++) {
                int n = lens[li];
                for (int i = 0; i < n; i++) {
                    float r = frand(&seed);
                    x[i] = kind == 3 ? -INFINITY : kind == 4 ? NAN : floorf(4.0f * r);
                    if (kind == 1 && i % 7 == 3) x[i] = NAN;
                    if (kind == 2 && i % 5 == 1) x[i] = -INFINITY;
                    if (kind == 5) x[i] = i < n / 2 ? NAN : -INFINITY;
                }
                float mx = -INFINITY;
                int want = 0, any = 0;
                for (int i = 0; i < n; i++)
                    if (x[i] == x[i] && (!any || x[i] > mx)) mx = x[i], want = i, any = 1;
                int got = cpu_argmax(x, n);
                if (got != want) { bad++; if (bad <= 3) printf("  argmax n=%d kind %d: %d, want %d\n", n, kind, got, want); }
            }
        printf("cpu_argmax: %d rows (ties, NaN, -inf): %s\n", rows, bad ? "DIFFERENT" : "the plain scan's index");
        fail |= bad != 0;
        free(x);
    }
    /* BF16 weights: every kernel that reads a weight gives, on bf16 weights, the bits it gives on
     * their fp32 upcast (bf16 -> fp32 is exact: a 16-bit shift), whatever the batch, offset and
     * threads; so BF16 mode inherits the fp32 kernels' batch invariance and their bits on every ISA.
     * cpu_matmul_backward's dx is the same sum in one block of w's rows (n_out <= 512) and a sum of
     * per-block sgemms above that (checked to 1e-5 relative: summation order only). */
    {
        const int bshapes[][2] = {{16, 4}, {33, 7}, {64, 64}, {288, 768}, {47, 130}, {1, 5}, {64, 1100}};
        int bad = 0, bad_bw = 0;
        for (size_t si = 0; si < sizeof bshapes / sizeof bshapes[0]; si++) {
            int K = bshapes[si][0], O = bshapes[si][1], NMAX = 37;
            float *x = xmalloc(sizeof(float) * NMAX * K), *wf = xmalloc(sizeof(float) * O * K), *bf = xmalloc(sizeof(float) * O);
            uint16_t *w = xmalloc(2 * (size_t)O * K), *b = xmalloc(2 * (size_t)O);
            size_t KO = (size_t)NMAX * (K > O ? K : O);   /* ref, out also hold (NMAX, K) rows */
            float *ref = xmalloc(sizeof(float) * KO), *out = xmalloc(sizeof(float) * KO);
            for (int i = 0; i < NMAX * K; i++) x[i] = frand(&seed);
            for (int i = 0; i < O * K; i++) { w[i] = f32_to_bf16(frand(&seed)); wf[i] = bf16_to_f32(w[i]); }
            for (int i = 0; i < O; i++) { b[i] = f32_to_bf16(frand(&seed)); bf[i] = bf16_to_f32(b[i]); }
            cpu_set_threads(1);
            for (int leaves = 1; leaves <= 8 && K % leaves == 0; leaves *= 8) {
                cpu_set_threads(1);
                cpu_matmul(ref, x, wf, bf, DTYPE_F32, NMAX, K, O, leaves);
                for (int th = 1; th <= 2; th++) {
                    cpu_set_threads(th);
                    for (int N = 1; N <= NMAX; N += N < 5 ? 1 : 8)
                        for (int off = 0; off + N <= NMAX; off += N + 3) {
                            cpu_matmul(out, x + (size_t)off * K, w, b, DTYPE_BF16, N, K, O, leaves);
                            if (memcmp(out, ref + (size_t)off * O, sizeof(float) * N * O)) bad++;
                        }
                }
            }
            /* rmsnorm (weight of K), embedding (a table of O rows of K) */
            cpu_rmsnorm(ref, x, wf, DTYPE_F32, NMAX, K, 1e-5f);
            cpu_rmsnorm(out, x, w, DTYPE_BF16, NMAX, K, 1e-5f);
            if (memcmp(out, ref, sizeof(float) * NMAX * K)) bad++;
            int ids[5] = {0, O - 1, O / 2, O + 3, -1};
            cpu_embedding(ref, wf, DTYPE_F32, ids, 5, K, 0, O);
            cpu_embedding(out, w, DTYPE_BF16, ids, 5, K, 0, O);
            if (memcmp(out, ref, sizeof(float) * 5 * K)) bad++;
            /* matmul backward: dx (NMAX, K) from dout (NMAX, O) */
            float *dx0 = xmalloc(sizeof(float) * NMAX * K), *dx1 = xmalloc(sizeof(float) * NMAX * K);
            float *dw0 = xcalloc((size_t)O * K, sizeof(float)), *dw1 = xcalloc((size_t)O * K, sizeof(float));
            float *db0 = xcalloc(O, sizeof(float)), *db1 = xcalloc(O, sizeof(float));
            for (int i = 0; i < NMAX * O; i++) out[i] = frand(&seed);
            cpu_matmul_backward(dx0, dw0, db0, out, x, wf, DTYPE_F32, NMAX, K, O);
            cpu_matmul_backward(dx1, dw1, db1, out, x, w, DTYPE_BF16, NMAX, K, O);
            if (memcmp(dw0, dw1, sizeof(float) * O * K) || memcmp(db0, db1, sizeof(float) * O)) bad_bw++;
            for (int i = 0; i < NMAX * K; i++) {
                float d = fabsf(dx0[i] - dx1[i]), mag = fabsf(dx0[i]) > 1.0f ? fabsf(dx0[i]) : 1.0f;
                if (O <= 512 ? dx0[i] != dx1[i] : d > 1e-5f * mag * sqrtf((float)O)) { bad_bw++; break; }
            }
            free(dx0); free(dx1); free(dw0); free(dw1); free(db0); free(db1);
            free(x); free(wf); free(bf); free(w); free(b); free(ref); free(out);
        }
        printf("bf16 weights: cpu_matmul (batches 1..37 at offsets, 1 and 2 threads, bias, 1 and 8 leaves), cpu_rmsnorm, "
               "cpu_embedding: %s; cpu_matmul_backward: %s\n", bad ? "DIFFERENT" : "the fp32 kernels' bits on the upcast",
               bad_bw ? "DIFFERENT" : "dw, db bit-identical, dx as the fp32 sum");
        fail |= bad != 0 || bad_bw != 0;
    }
    /* cpu_round_to BF16: round to nearest, ties to even (torch's .to(torch.bfloat16)); NaN stays NaN,
     * inf stays inf, the largest values round to inf as torch's do; F32 leaves the bits alone */
    {
        /* a tie to even, a tie to the odd neighbour's even one, above a tie, the largest bf16 (exact),
         * the tie above it (-> inf), a subnormal (truncated: its low half is below the half-ulp) */
        float in[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -(1.0f + 0x1p-8f + 0x1p-20f), 0x1.fep127f, 0x1.ffp127f,
                      0x1.0p-133f, INFINITY, -0.0f, NAN};
        float want[] = {1.0f, 1.0f + 0x1p-6f, -(1.0f + 0x1p-7f), 0x1.fep127f, INFINITY, 0x1.0p-133f, INFINITY, -0.0f, NAN};
        float y[9], z[9];
        memcpy(y, in, sizeof in);
        memcpy(z, in, sizeof in);
        cpu_round_to(y, 9, DTYPE_BF16);
        cpu_round_to(z, 9, DTYPE_F32);
        int bad = memcmp(z, in, sizeof in) != 0;
        for (int i = 0; i < 9; i++)
            if (!(y[i] == want[i] || (isnan(y[i]) && isnan(want[i]))) || signbit(y[i]) != signbit(want[i])) {
                bad++;
                printf("  round_to(%a) = %a, want %a\n", in[i], y[i], want[i]);
            }
        printf("cpu_round_to bf16: ties to even, NaN, inf, overflow, subnormal, -0: %s\n", bad ? "WRONG" : "as torch");
        fail |= bad != 0;
    }
    return fail;
}
