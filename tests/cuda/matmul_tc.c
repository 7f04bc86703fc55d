/* matmul_tc.c — cuda_vs_cpu's checks of the bf16 tensor-core matmul (kernels/cuda/matmul_tc.cu):
 * on the dut, the hi-only kernel's bits and the skip of zero mma's; host-side, in every run, both CUDA
 * matmuls' launch geometry, the runs, the fragment map against the PTX ISA's, the exact split of x and
 * an emulation of the kernels' index arithmetic. Owns those checks. */
#include "tests/cuda/cuda_vs_cpu.h"

/* Whether the dut's tensor-core matmul should take the hi-only kernel (bf16-valued x, no NaN): 1 / 0,
 * or -1 when the dut is not that kernel (--self, the SIMT kernel: nothing to check) */
int hi_expected(int N, int n_in, int n_out, int leaves) {
    if (self_mode || !tc_mode || !cuda_matmul_tc_fast()) return -1;
    return cuda_mma_hi_geometry(N, n_in, n_out, leaves, 132).ok;   /* ok does not depend on sms */
}
/* The hi-only kernel (N > 32, x bf16-valued: matmul_tc.cu) == the general kernel forced on the same
 * x (cuda_matmul_set_tc_fast(0)) bit for bit, and it is taken exactly when it should be. kind 0 bf16
 * x; 1 bf16 x and an inf weight (that row NaN either way); 2 a NaN weight; 3 bf16 x with zeros, rows
 * of -0 (and the weights negative there), an inf in x; 4 bf16 x but one element not (the general
 * kernel: the pre-pass says so); 5 bf16 x and one NaN (the general kernel too). */
void inv_tc_fast(int N, int n_in, int n_out, int leaves, int kind) {
    cur_entry = "inv";
    void *w, *b;
    float *x = rand_f32((size_t)N * n_in, 1.0f), *wf = rand_f32((size_t)n_out * n_in, 1.0f);
    for (size_t i = 0; i < (size_t)N * n_in; i++) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
    if (kind == 1) wf[(size_t)3 * n_in + 5 % n_in] = INFINITY;
    if (kind == 2) wf[(size_t)(n_out - 1) * n_in + n_in / 2] = NAN;
    if (kind == 3) {
        for (int n = 0; n < N; n += 5)
            for (int k = 0; k < n_in; k++) x[(size_t)n * n_in + k] = n % 2 ? -0.0f : 0.0f;
        for (int k = 0; k < n_in; k++) wf[k] = -fabsf(wf[k]) - 1.0f;
        x[(size_t)1 * n_in + 7] = INFINITY, x[(size_t)2 * n_in + 3] = -INFINITY;
    }
    if (kind == 4) x[(size_t)(N - 1) * n_in + n_in - 1] += ldexpf(1.0f, -20);
    if (kind == 5) x[(size_t)(N / 2) * n_in] = NAN;
    w = store_weight(wf, DTYPE_BF16, (size_t)n_out * n_in);
    float *bf = rand_weight(&b, DTYPE_BF16, n_out, 1.0f);
    float *fast = xmalloc(nf(N, n_out)), *gen = xmalloc(nf(N, n_out));
    run_matmul(dut, fast, x, w, kind == 2 ? NULL : b, DTYPE_BF16, N, n_in, n_out, leaves);
    int want = hi_expected(N, n_in, n_out, leaves), taken = want < 0 ? -1 : cuda_matmul_tc_hi_taken();
    if (want > 0 && kind >= 4) want = 0;
    int was = cuda_matmul_tc_fast();
    cuda_matmul_set_tc_fast(0);
    run_matmul(dut, gen, x, w, kind == 2 ? NULL : b, DTYPE_BF16, N, n_in, n_out, leaves);
    cuda_matmul_set_tc_fast(was);
    static const char *kinds[6] = {"bf16_x", "inf_weight", "nan_weight", "zeros,-0_rows,inf_x", "one_x_not_bf16", "nan_x"};
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,n_in=%d,n_out=%d,leaves=%d,%s", N, n_in, n_out, leaves, kinds[kind]);
    cmp_bits("inv.tc_hi_vs_general", DTYPE_BF16, sh, fast, gen, (size_t)N * n_out);
    report("inv.tc_hi_taken", DTYPE_BF16, sh, 0.0, 0.0, 0.0, want < 0 || taken == want);
    free(x), free(w), free(wf), free(b), free(bf), free(fast), free(gen);
}
/* The tensor-core kernel's skip of the mid and lo mma's (matmul_tc.cu's header) changes no bit: the
 * dut with the skip (cuda_matmul_set_tc_skip(1), the default) == without it, on x of bf16 values (the
 * mid and lo mma's always skipped), fp32 x (never), x whose rows or columns alternate between the two
 * (tiles and runs that switch: an accumulator skipped, then used, then skipped), zeros and -0 in x,
 * and one weight inf (its fragments never skipped: inf x 0 is a NaN). kind 0 bf16 x, 1 fp32, 2 rows
 * alternate, 3 the first half of every row bf16 and zeros, 4 bf16 x with an inf weight. Elsewhere
 * (the CPU, the SIMT kernel) the switch does nothing and the bits are trivially the same. */
void inv_tc_skip(int N, int n_in, int n_out, int leaves, int kind) {
    cur_entry = "inv";
    void *w, *b;
    float *x = rand_f32((size_t)N * n_in, 1.0f), *wf = rand_f32((size_t)n_out * n_in, 1.0f);
    if (kind == 4) wf[(size_t)3 * n_in + 5 % n_in] = INFINITY;
    w = store_weight(wf, DTYPE_BF16, (size_t)n_out * n_in);
    float *bf = rand_weight(&b, DTYPE_BF16, n_out, 1.0f);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < n_in; k++) {
            float *v = x + (size_t)n * n_in + k;
            int bf16 = kind == 0 || kind == 4 || (kind == 2 && n % 2 == 0) || (kind == 3 && k < n_in / 2);
            if (bf16) *v = bf16_to_f32(f32_to_bf16(*v));
            if (kind == 3 && k % 37 == 0) *v = k % 74 ? -0.0f : 0.0f;
        }
    float *on = xmalloc(nf(N, n_out)), *off = xmalloc(nf(N, n_out));
    run_matmul(dut, on, x, w, b, DTYPE_BF16, N, n_in, n_out, leaves);
    cuda_matmul_set_tc_skip(0);
    run_matmul(dut, off, x, w, b, DTYPE_BF16, N, n_in, n_out, leaves);
    cuda_matmul_set_tc_skip(1);
    static const char *kinds[5] = {"bf16_x", "fp32_x", "rows_alternate", "half_bf16_zeros", "bf16_x,inf_weight"};
    char sh[96];
    snprintf(sh, sizeof sh, "N=%d,n_in=%d,n_out=%d,leaves=%d,%s", N, n_in, n_out, leaves, kinds[kind]);
    cmp_bits("inv.tc_skip", DTYPE_BF16, sh, on, off, (size_t)N * n_out);
    free(x), free(w), free(wf), free(b), free(bf), free(on), free(off);
}
/* ---- the bf16 tensor-core matmul, host-side (kernels/cuda/matmul_tc.cu, cuda.h) ----------------------
 * The PTX ISA's fragment layout of mma.m16n8k16 for .bf16 ("Matrix Fragments for mma.m16n8k16 with
 * floating point type"), written here from the ISA's text independently of cuda.h; g = lane >> 2,
 * t = lane % 4. A (16 x 16): element i (0..7; register i / 2, low half first) at row g for i in
 * {0, 1, 4, 5}, else g + 8; column 2t + (i & 1), + 8 for i >= 4. B (16 x 8): element i (0..3) at row
 * 2t + (i & 1), + 8 for i >= 2; column g. C, D (16 x 8): element i (0..3) at row g, + 8 for i >= 2;
 * column 2t + (i & 1). */
static void ptx_a(int lane, int i, int *row, int *col) {
    *row = lane / 4 + (i == 2 || i == 3 || i == 6 || i == 7 ? 8 : 0);
    *col = 2 * (lane % 4) + (i & 1) + (i >= 4 ? 8 : 0);
}
static void ptx_b(int lane, int i, int *row, int *col) {
    *row = 2 * (lane % 4) + (i & 1) + (i >= 2 ? 8 : 0);
    *col = lane / 4;
}
static void ptx_c(int lane, int i, int *row, int *col) {
    *row = lane / 4 + (i >= 2 ? 8 : 0);
    *col = 2 * (lane % 4) + (i & 1);
}
static void host_line(int bad, const char *what, const char *shape) {
    printf("%-4s %-27s %-4s %-46s %-9s %-9s %s\n", bad ? "FAIL" : "ok", what, "host", shape, "0.000e+00", "0.000e+00",
           "0.000e+00");
}
/* The kernel's fragment map (cuda.h mma_*) against the ISA's: every A element's row is the ISA's,
 * A and B put the same k in each of the 16 slots, a permutation of 0..15, so D (row, col) = sum over
 * k of W[row][k] x[col][k], each k once; C elements are written where the ISA puts them; and the
 * vector loads' assumptions (a lane's k are 4t .. 4t + 3: registers r and r + 2 of A one 8-byte load,
 * B's two registers one 16-byte load, starts 4-element aligned). Returns the failures. */
static int mma_map_checks(void) {
    int bad = 0, ak[16][16], bk[16][8];
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) ak[i][j] = -1, bk[j][i % 8] = -1;
    for (int lane = 0; lane < 32; lane++) {
        for (int r = 0; r < 4; r++)
            for (int h = 0; h < 2; h++) {
                int row, col;
                ptx_a(lane, 2 * r + h, &row, &col);
                bad += row != mma_a_row(lane, r) || ak[row][col] != -1;
                ak[row][col] = mma_a_k(lane, r, h);
                bad += mma_a_k(lane, r, h) != mma_a_k(lane, 0, 0) + 2 * (r >> 1) + h || mma_a_row(lane, r) != mma_a_row(lane, r & 1);
            }
        for (int r = 0; r < 2; r++)
            for (int h = 0; h < 2; h++) {
                int row, col;
                ptx_b(lane, 2 * r + h, &row, &col);
                bad += col != mma_b_col(lane) || bk[row][col] != -1;
                bk[row][col] = mma_b_k(lane, r, h);
                bad += mma_b_k(lane, r, h) != mma_b_k(lane, 0, 0) + 2 * r + h;
            }
        for (int i = 0; i < 4; i++) {
            int row, col;
            ptx_c(lane, i, &row, &col);
            bad += row != mma_c_row(lane, i) || col != mma_c_col(lane, i);
        }
        bad += mma_a_k(lane, 0, 0) % 4 != 0 || mma_b_k(lane, 0, 0) % 4 != 0;
    }
    for (int row = 0; row < 16; row++)
        for (int col = 0; col < 8; col++) {
            int seen[16] = {0};
            for (int slot = 0; slot < 16; slot++) {
                int k = ak[row][slot];
                bad += k < 0 || k >= 16 || k != bk[slot][col];
                if (k >= 0 && k < 16) bad += seen[k]++ != 0;
            }
        }
    host_line(bad, "mma.fragment_map", "A,B,C_vs_PTX_ISA,32_lanes");
    return bad != 0;
}
/* mma_split3 (cuda.h): hi + mid + lo == x exactly for x a multiple of 2^-133 (every |x| >= 2^-110),
 * within 2^-133 below; |mid| + |lo| < 2^-7 |x| (the bound's (1 + 2^-7)); a bf16 value is its own hi;
 * inf and NaN stay in hi. Over random bit patterns of every exponent, and the edges. */
static int mma_split_checks(void) {
    int bad = 0;
    for (int i = 0; i < 1 << 20; i++) {
        uint32_t u = (uint32_t)rand_u64();
        if (i < 64) u = (uint32_t)i | (i & 1 ? 0x80000000u : 0u);   /* the least subnormals */
        if (i >= 64 && i < 128) u = 0x7f7fffffu - (uint32_t)(i - 64); /* the largest floats */
        float x;
        memcpy(&x, &u, 4);
        uint16_t p[3];
        mma_split3(x, p);
        double hi = bf16_to_f32(p[0]), mid = bf16_to_f32(p[1]), lo = bf16_to_f32(p[2]);
        if (isnan(x)) { bad += !isnan(hi) || p[1] || p[2]; continue; }
        if (isinf(x)) { bad += hi != x || p[1] || p[2]; continue; }
        double err = fabs(hi + mid + lo - (double)x);   /* the pieces span <= 24 bits: exact in double */
        int exact = fabs(x) >= 0x1p-110 || fmod(fabs((double)x), 0x1p-133) == 0.0;
        bad += exact ? err != 0.0 : !(err < 0x1p-133);
        bad += !(fabs(mid) + fabs(lo) <= 0x1p-7 * fabs((double)x));
        uint16_t q[3];
        mma_split3(bf16_to_f32(f32_to_bf16(x)), q);   /* a bf16 value: hi alone */
        bad += !isinf(bf16_to_f32(f32_to_bf16(x))) && (q[0] != f32_to_bf16(x) || q[1] || q[2]);
    }
    host_line(bad, "mma.split_exact", "2^20_random_floats_and_edges");
    return bad != 0;
}
/* The kernel's index arithmetic, emulated: for each block, warp (its tile and its share of the tile's
 * units, leaves x runs), unit, and lane and chunk of the unit's run, the operands it loads (with its
 * bounds: row < n_out, x row < N, k < the leaf's end) placed where the ISA says, multiplied slot by
 * slot into the output the ISA's D element is written to: every product W[o][k] x[n][k] is
 * accumulated exactly once into out[n][o], by the unit whose leaf and run hold k; a tile's warps
 * take contiguous aligned power-of-two groups of its units, together each unit once (so their
 * stacks and the shared-memory rounds add tree_sum's tree); every output is written once.
 * Returns the failures. */
static int mma_emulate(int N, int n_in, int n_out, int leaves) {
    MmaGeometry g = cuda_mma_geometry(N, n_in, n_out, leaves);
    unsigned char *count = xcalloc((size_t)N * n_out * (n_in ? n_in : 1), 1), *written = xcalloc((size_t)N * n_out, 1);
    int bad = 0, KL = n_in / leaves, R = g.runs, C = (KL + MMA_K - 1) / MMA_K, S = leaves * R;
    int tiles = g.warps / g.share, per = S / g.share, *cov = xcalloc((size_t)S, sizeof(int));
    bad += R != mma_runs(KL) || per * g.share != S || (per & (per - 1)) != 0;
    for (unsigned bx = 0; bx < g.grid_x; bx++)
        for (unsigned by = 0; by < g.grid_y; by++)
            for (int tile = 0; tile < tiles; tile++) {
                memset(cov, 0, sizeof(int) * (size_t)S);
                for (int sub = 0; sub < g.share; sub++) {
                    int o0 = ((int)bx * tiles + tile) * MMA_M * g.mt, n0 = (int)by * MMA_N * g.nt;
                    if (o0 >= n_out) {
                        bad += g.share > 1;   /* a block that leaves before its __syncthreads */
                        continue;
                    }
                    for (int i = 0; i < per; i++) {
                        int u = sub * per + i, lf = u / R, c0, c1, kb = lf * KL, kend = kb + KL;
                        cov[u]++;
                        mma_run_chunks(C, R, u % R, &c0, &c1);
                        for (int mt = 0; mt < g.mt; mt++)
                            for (int nt = 0; nt < g.nt; nt++)
                                for (int c = c0; c < c1; c++) {
                                    int ao[16][16], ak[16][16], bn[16][8], bk[16][8], kc = kb + c * MMA_K;
                                    for (int lane = 0; lane < 32; lane++) {
                                        for (int e = 0; e < 8; e++) {
                                            int row, col, o = o0 + MMA_M * mt + mma_a_row(lane, e / 2);
                                            int k = kc + mma_a_k(lane, e / 2, e % 2);
                                            ptx_a(lane, e, &row, &col);
                                            ao[row][col] = o < n_out && k < kend ? o : -1, ak[row][col] = k;
                                        }
                                        for (int e = 0; e < 4; e++) {
                                            int row, col, n = n0 + MMA_N * nt + mma_b_col(lane);
                                            int k = kc + mma_b_k(lane, e / 2, e % 2);
                                            ptx_b(lane, e, &row, &col);
                                            bn[row][col] = n < N && k < kend ? n : -1, bk[row][col] = k;
                                        }
                                    }
                                    for (int lane = 0; lane < 32; lane++)
                                        for (int e = 0; e < 4; e++) {
                                            int row, col, o = o0 + MMA_M * mt + mma_c_row(lane, e);
                                            int n = n0 + MMA_N * nt + mma_c_col(lane, e);
                                            ptx_c(lane, e, &row, &col);
                                            for (int slot = 0; slot < 16; slot++) {
                                                if (ao[row][slot] < 0 || bn[slot][col] < 0) continue;   /* a zero operand */
                                                int k = ak[row][slot];
                                                bad += ak[row][slot] != bk[slot][col] || ao[row][slot] != o || bn[slot][col] != n;
                                                bad += k < kb || k >= kend || (k - kb) / MMA_K < c0 || (k - kb) / MMA_K >= c1;
                                                if (o < n_out && n < N && k < n_in) count[((size_t)n * n_out + o) * n_in + k]++;
                                            }
                                        }
                                }
                    }
                    if (sub == 0)   /* share > 1: warp 0 of the block writes the tile's sums */
                        for (int mt = 0; mt < g.mt; mt++)
                            for (int nt = 0; nt < g.nt; nt++)
                                for (int lane = 0; lane < 32; lane++)
                                    for (int e = 0; e < 4; e++) {
                                        int o = o0 + MMA_M * mt + mma_c_row(lane, e), n = n0 + MMA_N * nt + mma_c_col(lane, e);
                                        if (o < n_out && n < N) written[(size_t)n * n_out + o]++;
                                    }
                }
                int o0 = ((int)bx * tiles + tile) * MMA_M * g.mt;
                for (int u = 0; u < S && o0 < n_out; u++) bad += cov[u] != 1;
            }
    for (size_t e = 0; e < (size_t)N * n_out; e++) {
        bad += written[e] != 1;
        for (int k = 0; k < n_in; k++) bad += count[e * n_in + k] != 1;
    }
    free(count), free(written), free(cov);
    return bad;
}
/* The hi-only kernel's index arithmetic (matmul_tc.cu matmul_tc_hi_kernel, cuda.h MmaHiGeometry),
 * emulated as the kernel runs it: per block, the stages' chunks (mma_hi_chunk) staged by the 16-byte
 * copies (mma_hi_w_copy, mma_hi_x_copy; each tile slot written once, a copy wholly inside its leaf
 * and row or zero-filled), each warp's fragments read from the tiles as the kernel reads them, placed
 * where the ISA says: every product W[o][k] x[n][k] accumulated exactly once into out[n][o], while
 * the unit that holds k is open; the units closed in order, each once, the stack within
 * MMA_HI_DEPTH and empty at the end; every output written once. Returns the failures. */
static int mma_hi_emulate(int N, int n_in, int n_out, int leaves, int sms) {
    MmaHiGeometry g = cuda_mma_hi_geometry(N, n_in, n_out, leaves, sms);
    if (!g.ok) return 1;
    int bad = 0, KL = n_in / leaves, R = g.runs, C = (KL + MMA_K - 1) / MMA_K, S = leaves * R, J = leaves * C;
    int BM = MMA_HI_BM, BN = MMA_HI_WN * g.wn, T = 64 * g.wn, NS = (J + MMA_HI_SC - 1) / MMA_HI_SC;
    int MT = MMA_HI_WM / MMA_M, NT = MMA_HI_WN / MMA_N;
    unsigned char *count = xcalloc((size_t)N * n_out * n_in, 1), *written = xcalloc((size_t)N * n_out, 1);
    int *wo = xmalloc(sizeof(int) * BM * MMA_K), *wk = xmalloc(sizeof(int) * BM * MMA_K);
    int *xn = xmalloc(sizeof(int) * BN * MMA_K), *xk = xmalloc(sizeof(int) * BN * MMA_K);
    bad += (g.wn != 2 && g.wn != 4) || R != mma_runs(KL);
    for (unsigned bx = 0; bx < g.grid_x; bx++)
        for (unsigned by = 0; by < g.grid_y; by++) {
            int o0 = (int)bx * BM, n0 = (int)by * BN, u = 0, uend = mma_hi_unit_end(0, C, R), top = 0, closed = 0;
            for (int s = 0; s < NS; s++)
                for (int q = 0; q < MMA_HI_SC; q++) {
                    int j = s * MMA_HI_SC + q, kc, kend;
                    if (j >= J) break;
                    mma_hi_chunk(j, C, KL, &kc, &kend);
                    for (int i = 0; i < BM * MMA_K; i++) wo[i] = -2;
                    for (int i = 0; i < BN * MMA_K; i++) xn[i] = -2;
                    for (int t = 0; t < T; t++) {   /* the copies, thread by thread as the kernel loops */
                        for (int c = 0; c < BM * 2 / T; c++) {
                            int i = t + c * T, row, k;
                            mma_hi_w_copy(i, &row, &k);
                            int ok = o0 + row < n_out && kc + k < kend;
                            for (int e = 0; e < 8; e++) {
                                int slot = row * MMA_K + k + e;
                                bad += row < 0 || row >= BM || k + e >= MMA_K || wo[slot] != -2;
                                if (ok) bad += kc + k + e >= kend || kc + k + e >= n_in;
                                wo[slot] = ok ? o0 + row : -1, wk[slot] = kc + k + e;
                            }
                        }
                        for (int c = 0; c < BN * 4 / T; c++) {
                            int i = t + c * T, row, k;
                            mma_hi_x_copy(i, &row, &k);
                            int ok = n0 + row < N && kc + k < kend;
                            for (int e = 0; e < 4; e++) {
                                int slot = row * MMA_K + k + e;
                                bad += row < 0 || row >= BN || k + e >= MMA_K || xn[slot] != -2;
                                if (ok) bad += kc + k + e >= kend || kc + k + e >= n_in;
                                xn[slot] = ok ? n0 + row : -1, xk[slot] = kc + k + e;
                            }
                        }
                    }
                    for (int i = 0; i < BM * MMA_K; i++) bad += wo[i] == -2;
                    for (int i = 0; i < BN * MMA_K; i++) bad += xn[i] == -2;
                    int lf = u / R, c0, c1;
                    mma_run_chunks(C, R, u % R, &c0, &c1);
                    for (int warp = 0; warp < T / 32; warp++) {
                        int wm = warp & 1, wnn = warp >> 1;
                        for (int mt = 0; mt < MT; mt++)
                            for (int nt = 0; nt < NT; nt++) {
                                int ao[16][16], ak[16][16], bn[16][8], bk[16][8];
                                for (int lane = 0; lane < 32; lane++) {
                                    for (int r = 0; r < 2; r++) {   /* uint2 at (row, k 4t): registers r, r + 2 */
                                        int base = mma_hi_a_off(wm, mt, lane, r);
                                        bad += base % 4 != 0 || base < 0 || base + 4 > BM * MMA_K;
                                        for (int e = 0; e < 4; e++) {
                                            int reg = e < 2 ? r : r + 2, row, col;
                                            ptx_a(lane, 2 * reg + (e & 1), &row, &col);
                                            ao[row][col] = wo[base + e], ak[row][col] = wk[base + e];
                                        }
                                    }
                                    int base = mma_hi_b_off(wnn, nt, lane);
                                    bad += base % 4 != 0 || base < 0 || base + 4 > BN * MMA_K;
                                    for (int e = 0; e < 4; e++) {   /* uint4 .x .y -> register 0, .z .w -> 1 */
                                        int row, col;
                                        ptx_b(lane, e, &row, &col);
                                        bn[row][col] = xn[base + e], bk[row][col] = xk[base + e];
                                    }
                                }
                                for (int lane = 0; lane < 32; lane++)
                                    for (int e = 0; e < 4; e++) {
                                        int row, col, o = o0 + MMA_HI_WM * wm + MMA_M * mt + mma_c_row(lane, e);
                                        int n = n0 + MMA_HI_WN * wnn + MMA_N * nt + mma_c_col(lane, e);
                                        ptx_c(lane, e, &row, &col);
                                        for (int slot = 0; slot < 16; slot++) {
                                            if (ao[row][slot] < 0 || bn[slot][col] < 0) continue;
                                            int k = ak[row][slot];
                                            bad += k != bk[slot][col] || ao[row][slot] != o || bn[slot][col] != n;
                                            bad += k < lf * KL || k >= (lf + 1) * KL || (k - lf * KL) / MMA_K < c0 ||
                                                   (k - lf * KL) / MMA_K >= c1;
                                            if (o < n_out && n < N && k < n_in) count[((size_t)n * n_out + o) * n_in + k]++;
                                        }
                                    }
                            }
                    }
                    if (j + 1 == uend) {   /* the kernel's close: the stack */
                        bad += closed != u;
                        closed++;
                        for (int m = u + 1; m % 2 == 0; m /= 2) top--;
                        bad += top < 0;
                        if (u + 1 < S) {
                            top++;
                            bad += top > MMA_HI_DEPTH;
                            u++;
                            uend = mma_hi_unit_end(u, C, R);
                        }
                    }
                }
            bad += closed != S || top != 0;
            for (int warp = 0; warp < T / 32; warp++)
                for (int mt = 0; mt < MT; mt++)
                    for (int nt = 0; nt < NT; nt++)
                        for (int lane = 0; lane < 32; lane++)
                            for (int e = 0; e < 4; e++) {
                                int o = o0 + MMA_HI_WM * (warp & 1) + MMA_M * mt + mma_c_row(lane, e);
                                int n = n0 + MMA_HI_WN * (warp >> 1) + MMA_N * nt + mma_c_col(lane, e);
                                if (o < n_out && n < N) written[(size_t)n * n_out + o]++;
                            }
        }
    for (size_t e = 0; e < (size_t)N * n_out; e++) {
        bad += written[e] != 1;
        for (int k = 0; k < n_in; k++) bad += count[e * n_in + k] != 1;
    }
    free(count), free(written), free(wo), free(wk), free(xn), free(xk);
    return bad;
}
/* cuda_mma_hi_geometry: ok exactly for N > 32, n_in >= 16, n_in and its leaves' length multiples of 8
 * and at most MMA_HI_MAX_UNITS units; runs mma_runs(n_in / leaves); wn 4 when the 128 x 128 blocks
 * are at least sms, else 2; the grid covers every output and row with less than one block of slack.
 * Returns the failures. */
static int mma_hi_geometry_checks(void) {
    static const int outs[] = {1, 15, 16, 17, 65, 256, 2048, 5632, 32000}, lvs[] = {1, 2, 8, 64}, sms[] = {1, 132};
    static const int ins[] = {64, 1000, 1004, 2048, 4096, 5632, 11008, 65536, 8};
    int bad = 0;
    for (int N = 1; N <= 700; N += N < 140 ? 1 : 37)
        for (size_t o = 0; o < sizeof outs / sizeof outs[0]; o++)
            for (size_t q = 0; q < sizeof ins / sizeof ins[0]; q++)
                for (int l = 0; l < 4; l++)
                    for (int m = 0; m < 2; m++) {
                        if (ins[q] % lvs[l]) continue;
                        MmaHiGeometry g = cuda_mma_hi_geometry(N, ins[q], outs[o], lvs[l], sms[m]);
                        int KL = ins[q] / lvs[l], R = mma_runs(KL);
                        int ok = N > 32 && ins[q] >= MMA_K && ins[q] % 8 == 0 && KL % 8 == 0 && lvs[l] * R <= MMA_HI_MAX_UNITS;
                        long bx = (outs[o] + 127) / 128, big = (N + 127) / 128, rows = MMA_HI_WN * (long)g.wn;
                        int wn = bx * big >= sms[m] ? 4 : 2, depth = 0;
                        for (int u = 1; u < lvs[l] * R; u *= 2) depth++;
                        if (g.ok != ok || g.runs != R || g.wn != wn || g.grid_x * (long)MMA_HI_BM < outs[o] ||
                            (g.grid_x - 1) * (long)MMA_HI_BM >= outs[o] || g.grid_y * rows < N || (g.grid_y - 1) * rows >= N ||
                            (ok && depth > MMA_HI_DEPTH))
                            if (bad++ < 5) printf("FAIL geometry.mma_hi N=%d n_in=%d n_out=%d leaves=%d sms=%d\n", N, ins[q], outs[o], lvs[l], sms[m]);
                    }
    host_line(bad, "geometry.mma_hi", "N=1..700,9_n_in,9_n_out,leaves_1..64,sms");
    static const int em[][5] = {{33, 64, 17, 1, 1},    {40, 1000, 67, 1, 132}, {130, 1040, 200, 2, 132}, {100, 8192, 40, 8, 132},
                                {129, 2048, 140, 1, 2}, {48, 1024, 33, 64, 132}, {200, 48, 300, 2, 1}, {65, 4096, 16, 16, 132}};
    int ebad = 0;
    for (size_t i = 0; i < sizeof em / sizeof em[0]; i++) {
        int b = mma_hi_emulate(em[i][0], em[i][1], em[i][2], em[i][3], em[i][4]);
        if (b && ebad < 3) printf("FAIL mma_hi.emulated_cover N=%d n_in=%d n_out=%d leaves=%d sms=%d\n", em[i][0], em[i][1], em[i][2], em[i][3], em[i][4]);
        ebad += b != 0;
    }
    host_line(ebad, "mma_hi.emulated_cover", "8_shapes,wn_2_and_4,partial_chunks,64_units");
    return bad + ebad;
}
/* mma_runs and mma_run_chunks (cuda.h) for every leaf length up to 2^17 and some beyond: R a power of
 * two <= MMA_MAX_RUNS, the largest with C >= 16 R (1 below 32 chunks); the runs cover the chunks in
 * order, none empty, lengths within one of each other, each >= 16 chunks when R > 1. Returns the
 * failures. */
static int mma_run_checks(void) {
    int bad = 0;
    for (long KL = 0; KL <= 1L << 20; KL += KL < 1 << 17 ? 1 : 4093) {
        int C = (int)((KL + MMA_K - 1) / MMA_K), R = mma_runs((int)KL), want = 1;
        while (want < MMA_MAX_RUNS && C >= MMA_RUN_CHUNKS * 2 * want) want *= 2;
        bad += R != want || R < 1 || (R & (R - 1)) || R > MMA_MAX_RUNS || (R > 1 && C < MMA_RUN_CHUNKS * R) ||
               (R < MMA_MAX_RUNS && C >= MMA_RUN_CHUNKS * 2 * R);
        int next = 0, lo = 1 << 30, hi = 0;
        for (int r = 0; r < R; r++) {
            int c0, c1;
            mma_run_chunks(C, R, r, &c0, &c1);
            bad += c0 != next || (C > 0 && c1 <= c0) || (R > 1 && c1 - c0 < MMA_RUN_CHUNKS);
            lo = c1 - c0 < lo ? c1 - c0 : lo, hi = c1 - c0 > hi ? c1 - c0 : hi;
            next = c1;
        }
        bad += next != C || hi - lo > 1;
        if (bad && bad < 3) printf("FAIL mma.runs KL=%ld R=%d\n", KL, R);
    }
    host_line(bad, "mma.runs", "KL=0..2^17,..2^20");
    return bad != 0;
}
/* cuda_mma_geometry: blocks cover every output and x row with less than one block of slack; runs is
 * mma_runs(n_in / leaves); share a power of two dividing leaves x runs, at most MMA_MAX_WARPS, > 1
 * only at N <= 32 (the prefill kernel has no shared memory for it) and then the whole block; a
 * tile the launcher has a kernel for; then the runs, the map, the split, and the emulation at odd
 * shapes. Returns the failures. */
static int mma_checks(void) {
    static const int outs[] = {1, 15, 16, 17, 65, 256, 2048, 5632, 32000}, lvs[] = {1, 2, 8, 64};
    static const int ins[] = {64, 1000, 2048, 4096, 5632, 11008, 65536};
    int bad = 0;
    for (int N = 1; N <= 600; N += N < 80 ? 1 : 37)
        for (size_t o = 0; o < sizeof outs / sizeof outs[0]; o++)
            for (size_t q = 0; q < sizeof ins / sizeof ins[0]; q++)
                for (int l = 0; l < 4; l++) {
                    if (ins[q] % lvs[l]) continue;
                    MmaGeometry g = cuda_mma_geometry(N, ins[q], outs[o], lvs[l]);
                    int S = lvs[l] * g.runs, kernel = (g.mt == 1 && g.nt == 1 && g.unroll == 16) ||
                                                      (g.mt == 1 && g.nt == 4 && g.unroll == 4) ||
                                                      (g.mt == 2 && g.nt == 4 && g.unroll == 2 && g.share == 1);
                    if (g.share < 1 || (g.share & (g.share - 1)) || S % g.share || g.share > MMA_MAX_WARPS ||
                        g.warps < 1 || g.warps > MMA_MAX_WARPS || g.warps % g.share || (g.share > 1 && g.warps != g.share) ||
                        (N > 32 && g.share != 1) || g.runs != mma_runs(ins[q] / lvs[l]) || !kernel || g.unroll < 1) {
                        if (bad++ < 5) printf("FAIL geometry.mma N=%d n_in=%d n_out=%d leaves=%d\n", N, ins[q], outs[o], lvs[l]);
                        continue;
                    }
                    long per_x = (long)MMA_M * g.mt * (g.warps / g.share), per_y = (long)MMA_N * g.nt;
                    if (g.grid_x * per_x < outs[o] || (g.grid_x - 1) * per_x >= outs[o] || g.grid_y * per_y < N ||
                        (g.grid_y - 1) * per_y >= N)
                        if (bad++ < 5) printf("FAIL geometry.mma N=%d n_out=%d leaves=%d: grid\n", N, outs[o], lvs[l]);
                }
    host_line(bad, "geometry.mma", "N=1..600,7_n_in,9_n_out,leaves_1..64");
    bad += mma_run_checks() + mma_map_checks() + mma_split_checks();
    static const int em[][4] = {{1, 1, 1, 1},      {7, 33, 65, 1},   {2, 24, 5, 8},     {9, 17, 100, 1},
                                {20, 48, 33, 4},   {40, 33, 70, 1},  {40, 24, 70, 8},   {65, 130, 67, 2},
                                {7, 64, 17, 64},   {1, 0, 3, 1},     {1, 1000, 17, 1},  {20, 4096, 16, 1},
                                {40, 1000, 33, 2}, {3, 8192, 16, 8}, {37, 4100, 20, 1}, {9, 1016, 40, 1}};
    int ebad = 0;
    for (size_t i = 0; i < sizeof em / sizeof em[0]; i++) ebad += mma_emulate(em[i][0], em[i][1], em[i][2], em[i][3]);
    host_line(ebad, "mma.emulated_cover", "16_odd_shapes,every_variant,runs");
    return bad + (ebad != 0) + mma_hi_geometry_checks();
}

/* The matmul's launch geometry (host-side, cuda_matmul_geometry): the grid covers every output row
 * and x row exactly once, with less than one tile of slack, and x rows per warp is the smallest of
 * 1, 2, 4, 8 holding min(N, 8). Runs in every mode, GPU or not. Returns the failures. */
int geometry_checks(void) {
    static const int outs[] = {1, 15, 16, 17, 256, 2048, 5632, 32000};
    int bad = 0, tile = CUDA_MM_ROWS * CUDA_MM_WARPS;
    for (int N = 1; N <= 70; N++)
        for (size_t o = 0; o < sizeof outs / sizeof outs[0]; o++) {
            MatmulGeometry g = cuda_matmul_geometry(N, outs[o]);
            int want_xr = N > 4 ? 8 : N > 2 ? 4 : N;   /* the smallest of 1, 2, 4, 8 that holds min(N, 8) */
            if ((long)g.grid_x * tile < outs[o] || (long)(g.grid_x - 1) * tile >= outs[o] || g.x_rows != want_xr ||
                (long)g.grid_y * g.x_rows < N || (long)(g.grid_y - 1) * g.x_rows >= N) {
                if (bad++ < 5) printf("FAIL geometry N=%d n_out=%d: grid %u x %u, %d x rows per warp\n", N, outs[o], g.grid_x,
                                      g.grid_y, g.x_rows);
            }
        }
    printf("%-4s %-27s %-4s %-46s %-9s %-9s %s\n", bad ? "FAIL" : "ok", "geometry.matmul", "host", "N=1..70,8_n_out_sizes",
           "0.000e+00", "0.000e+00", "0.000e+00");
    return bad + mma_checks();
}
