/* matmul_tc.cu — the forward matmul for bf16 weights on tensor cores: out (N, n_out) = x (N, n_in)
 * w^T [+ bias], w bf16 (n_out, n_in), x fp32. cuda_matmul (ops.cu) calls it for bf16 weights when
 * cuda_matmul_simt_bf16() is 0 (cuda.h), for every N (1 included); fp32 weights keep ops.cu's SIMT
 * kernel. Owns the kernel and its launch geometry (cuda_mma_geometry). No memory of its own, no
 * communication.
 *
 * The promise it keeps: a row's output bits depend only on that row of x and the weights, never on
 * N, on which rows share a launch or on the tiling. Every output is this fixed computation, by n_in
 * and leaves alone (mma.sync m16n8k16 bf16, fp32 accumulators; cuda.h has the fragment map):
 *   a leaf (KL = n_in / leaves consecutive inputs) is C = ceil(KL / 16) chunks of 16 k from its start
 *   (a chunk past the leaf's end holds zeros in both operands), cut into R = mma_runs(KL) runs of
 *   consecutive chunks (mma_run_chunks: floor(r C / R) ..; R a power of two <= 16, runs >= 256 k).
 *   A run: three accumulators hi, mid, lo start at +0; each chunk in increasing order is split
 *   (mma_split3, cuda.h: x = hi + mid + lo exactly) and adds one mma per piece, piece p times the
 *   chunk's 16 weights into accumulator p. The run's sum is hi + z(lo + mid), z turning a -0 into +0.
 *   The leaves x R runs' sums (leaf-major) are added by tree_sum's pairwise tree (kernels.h): as R is
 *   a power of two, the tree of each leaf's runs, then the leaves' tree, as kernels.h allows. Then
 *   the bias.
 * The skip: the mid (lo) mma of a chunk is not issued when every lane's mid (lo) B register of that
 * row tile is 0 (+0 pieces: always so for bf16-valued x, the forward's matmul inputs in bf16 mode)
 * and every weight of the A fragment is finite (a __any_sync each: warp-uniform, no divergence).
 * Same bits: an mma's terms are then its C element and 16 products a x (+0) of finite a, each a
 * zero; their exact sum is C's value, which the tensor core returns exactly (aligned to C, nothing
 * below it to truncate), a zero C giving a zero. So skipping changes at most the sign of a zero
 * accumulator; a zero's sign changes no later nonzero sum (the exact value is the same), and a run
 * ends with z(lo + mid) + hi, where z makes any zero +0. Hence the result is the same whether or
 * not any mid / lo mma was skipped, and the skip deciding by the 8 rows of a tile (its neighbours)
 * does not make a row depend on them. (An inf or NaN weight times +0 is a NaN: hence "finite".)
 * cuda_vs_cpu checks it bit for bit (cuda_matmul_set_tc_skip(0)), on bf16 and on fp32 x.
 * The variants (cuda_mma_geometry: mt x 16 outputs by nt x 8 rows a tile; a tile's runs over
 * `share` warps of a block, each a contiguous power-of-two-aligned group of them added on a stack,
 * then the warps' subtrees in shared memory; or share = 1: one warp all the runs in turn) change
 * which outputs, rows and runs a warp computes and which lane holds which row, never an output's
 * operands, their order, or the tree: a contiguous aligned group of 2^j of the leaves x R is a
 * subtree of tree_sum's tree. An mma's output element depends only on its row of A, its column of B
 * and its C element (the hardware computes each element alone), so the bits are identical by
 * construction; cuda_vs_cpu checks it across N = 1, 7, 8, 20, 37, 64, 512 and row offsets.
 * Products of bf16 values are exact in the tensor core; its fp32 accumulation aligns them to the
 * largest and truncates (Fasi et al. 2021), a different rounding than the CPU's fmaf chain:
 * cuda_vs_cpu's header derives the bound. Decode (N <= 8): one m16 x n8 tile, its runs over up to 8
 * warps of a block, a run's 16 chunks of loads in flight at once (q_proj at N = 1: 128 tiles x 8
 * runs = 1024 warps streaming the weights). Batched decode (N <= 32): 16 outputs x 32 rows, the
 * same. Prefill (N > 32): 32 outputs x 32 rows a warp, 4 warps a block side by side (sharing their x
 * rows through L1), each warp every run in turn.
 * The hi-only prefill variant (N > 32; cuda.h MmaHiGeometry; off with TANDEM_CUDA_TC_FAST=0 or
 * cuda_matmul_set_tc_fast(0)): a pre-pass kernel sets a device flag when some x element is not
 * bf16-valued or is a NaN; then the hi-only kernel (which returns at once if the flag is set) and the
 * general prefill kernel (which returns at once unless it is set) are both queued: no host sync. With
 * x bf16-valued and no NaN, mid = lo = +0 and hi is x's high 16 bits, so the general kernel's
 * mid / lo mma's are skipped (finite weights) and its run's sum is z(+0 + +0) + hi = +0 + hi; the
 * hi-only kernel issues the same hi mma's (same A and B registers, same order, from +0) into one
 * accumulator and adds +0 + hi (__fadd_rn: an add, never folded, so a -0 becomes +0 as there), then
 * the same stack and bias. A nonfinite weight (the general kernel's mid mma then issued: inf x 0 =
 * NaN) is found by scanning the row of a nonfinite result and gives NaN by an add. One accumulator
 * set: 64 x 32 a warp, 128 x 128 (or 128 x 64 when that would not fill the GPU) a block, the
 * operands staged in shared memory by cp.async, 3 stages of 2 chunks. cuda_vs_cpu checks it against
 * the general kernel bit for bit and its index arithmetic on the host (mma_hi.emulated_cover). */
#include "kernels/cuda/common.cuh"
#include <stdlib.h>

/* d (16 x 8, fp32) += a (16 x 16 bf16) b (16 x 8 bf16): one warp, fragments as cuda.h's map */
__device__ __forceinline__ void mma_bf16(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* One chunk of 16 k as a lane holds it: a[mt] the A fragment of weight rows o0 + 16 mt .., x[nt] the
 * four fp32 values of x row n0 + 8 nt + g at k = 4t .. 4t + 3 (B slots, cuda.h) */
template <int MT, int NT> struct Chunk {
    uint32_t a[MT][4];
    float x[NT][4];
};

/* The warp's tile and operands: w (n_out, K) bf16, x (N, K), o0 / n0 its first output / row */
struct Tile {
    const uint16_t *w;
    const float *x;
    int N, K, n_out, o0, n0, lane;
};

/* chunk at absolute column kc, all 16 k inside the leaf, rows 8-byte aligned (w) and 16-byte (x):
 * one 8-byte load per weight row (k 4t .. 4t + 3 of rows g and g + 8: registers r, r + 2) and one
 * 16-byte load of x per row; rows past n_out or N read as zeros */
template <int MT, int NT>
__device__ __forceinline__ void load_vec(Chunk<MT, NT> &c, const Tile &T, int kc) {
    int lane = T.lane;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int row = T.o0 + MMA_M * mt + mma_a_row(lane, r);
            uint2 v = make_uint2(0u, 0u);
            if (row < T.n_out) v = __ldg((const uint2 *)(T.w + (size_t)row * T.K + kc + mma_a_k(lane, r, 0)));
            c.a[mt][r] = v.x;       /* k 4t, 4t + 1 */
            c.a[mt][r + 2] = v.y;   /* k 4t + 2, 4t + 3 */
        }
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        int n = T.n0 + MMA_N * nt + mma_b_col(lane);
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (n < T.N) v = __ldg((const float4 *)(T.x + (size_t)n * T.K + kc + mma_b_k(lane, 0, 0)));
        c.x[nt][0] = v.x, c.x[nt][1] = v.y, c.x[nt][2] = v.z, c.x[nt][3] = v.w;
    }
}
/* the same chunk element by element (a leaf's last partial chunk, or unaligned rows): the same values
 * in the same places, zeros at k >= kend */
template <int MT, int NT>
__device__ __forceinline__ void load_one(Chunk<MT, NT> &c, const Tile &T, int kc, int kend) {
    int lane = T.lane;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            int row = T.o0 + MMA_M * mt + mma_a_row(lane, r);
            uint32_t v = 0;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int k = kc + mma_a_k(lane, r, h);
                if (row < T.n_out && k < kend) v |= (uint32_t)__ldg(T.w + (size_t)row * T.K + k) << (16 * h);
            }
            c.a[mt][r] = v;
        }
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        int n = T.n0 + MMA_N * nt + mma_b_col(lane);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int k = kc + mma_b_k(lane, j / 2, j % 2);
            c.x[nt][j] = n < T.N && k < kend ? __ldg(T.x + (size_t)n * T.K + k) : 0.0f;
        }
    }
}

/* 1 when a bf16 weight (2 halves of a register) is inf or NaN */
__device__ __forceinline__ bool nonfinite2(uint32_t r) {
    return (r & 0x7f80u) == 0x7f80u || (r & 0x7f800000u) == 0x7f800000u;
}

/* The run's accumulators: [piece][mt][nt][4], piece 0 hi, 1 mid, 2 lo */
template <int MT, int NT> struct Acc {
    float v[3][MT][NT][4];
};

/* acc += the chunk: x split into its three pieces, then per (mt, nt) the hi mma, and the mid and lo
 * mma's unless skippable (the header: every lane's piece +0 and the A fragment finite) */
template <int MT, int NT>
__device__ __forceinline__ void mma_chunk(Acc<MT, NT> &acc, const Chunk<MT, NT> &c, int skip) {
    uint32_t b[NT][3][2];   /* [row tile][piece][register] */
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            uint16_t lo[3], hi[3];   /* the pieces of k 4t + 2r (low half) and 4t + 2r + 1 (high half) */
            mma_split3(c.x[nt][2 * r], lo);
            mma_split3(c.x[nt][2 * r + 1], hi);
#pragma unroll
            for (int p = 0; p < 3; p++) b[nt][p][r] = (uint32_t)lo[p] | (uint32_t)hi[p] << 16;
        }
    bool zero[NT][3], fin[MT];   /* warp-uniform: every lane's piece +0; every weight of A finite */
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int p = 1; p < 3; p++) zero[nt][p] = skip && !__any_sync(0xffffffffu, (b[nt][p][0] | b[nt][p][1]) != 0u);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
        fin[mt] = skip && !__any_sync(0xffffffffu, nonfinite2(c.a[mt][0]) || nonfinite2(c.a[mt][1]) ||
                                                       nonfinite2(c.a[mt][2]) || nonfinite2(c.a[mt][3]));
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            mma_bf16(acc.v[0][mt][nt], c.a[mt], b[nt][0]);
#pragma unroll
            for (int p = 1; p < 3; p++)
                if (!(zero[nt][p] && fin[mt])) mma_bf16(acc.v[p][mt][nt], c.a[mt], b[nt][p]);
        }
}

/* V chunks from chunk c of the leaf at column kb, every one whole and vector-loadable: all loads
 * issued before the mma's (decode is bound by the loads in flight); each accumulator still takes the
 * chunks one after another, so V never changes a bit */
template <int MT, int NT, int V>
__device__ __forceinline__ void chunks_vec(Acc<MT, NT> &acc, const Tile &T, int kb, int c, int skip) {
    Chunk<MT, NT> ch[V];
#pragma unroll
    for (int u = 0; u < V; u++) load_vec(ch[u], T, kb + (c + u) * MMA_K);
#pragma unroll
    for (int u = 0; u < V; u++) mma_chunk(acc, ch[u], skip);
}

/* out = one run's sum: chunks [c0, c1) of the leaf [kb, kend), in increasing order (U at a time,
 * then 8, 4, 2, 1: the same sequence), three accumulators, then hi + z(lo + mid) */
/* Unit u's sum is in acc: the units' pairwise tree (tree_sum's order) on a stack of pending left
 * subtrees. Every subtree u closes is added as (left) + (acc); then, unless u is the last unit (a
 * power-of-two count closes every subtree), acc is pushed, and zeroed when clear (the next unit
 * accumulates into it). The one copy both kernels use: their units combine in the same order. */
template <int MT, int NT, int DEPTH>
__device__ __forceinline__ void tree_step(float (&acc)[MT][NT][4], float (&stack)[DEPTH][MT][NT][4], int &top, int u,
                                          int last, int clear) {
    for (int m = u + 1; m % 2 == 0; m /= 2) {
        top--;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[mt][nt][e] = stack[top][mt][nt][e] + acc[mt][nt][e];
    }
    if (last) return;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                stack[top][mt][nt][e] = acc[mt][nt][e];
                if (clear) acc[mt][nt][e] = 0.0f;
            }
    top++;
}

template <int MT, int NT, int U>
__device__ __forceinline__ void run_dot(float (&out)[MT][NT][4], const Tile &T, int kb, int kend, int c0, int c1,
                                        int vec, int skip) {
    Acc<MT, NT> acc;
#pragma unroll
    for (int p = 0; p < 3; p++)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) acc.v[p][mt][nt][i] = 0.0f;
    int n_full = vec ? (kend - kb) / MMA_K : 0, cf = c1 < n_full ? c1 : n_full, c = c0;
    for (; c + U <= cf; c += U) chunks_vec<MT, NT, U>(acc, T, kb, c, skip);
    if (U > 8)   /* a run's remaining whole chunks in fewer rounds of loads: 22 = 16 + 4 + 2 */
        for (; c + 8 <= cf; c += 8) chunks_vec<MT, NT, (U > 8 ? 8 : 1)>(acc, T, kb, c, skip);
    if (U > 4)
        for (; c + 4 <= cf; c += 4) chunks_vec<MT, NT, (U > 4 ? 4 : 1)>(acc, T, kb, c, skip);
    if (U > 2)
        for (; c + 2 <= cf; c += 2) chunks_vec<MT, NT, (U > 2 ? 2 : 1)>(acc, T, kb, c, skip);
    for (; c < c1; c++) {
        Chunk<MT, NT> ch;
        if (c < n_full) load_vec(ch, T, kb + c * MMA_K);
        else load_one(ch, T, kb + c * MMA_K, kend);
        mma_chunk(acc, ch, skip);
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float lm = acc.v[2][mt][nt][i] + acc.v[1][mt][nt][i];
                lm = __float_as_uint(lm) == 0x80000000u ? 0.0f : lm;   /* z: -0 as +0 (bits: no folding) */
                out[mt][nt][i] = lm + acc.v[0][mt][nt][i];
            }
}

/* Each warp: its tile (o0, n0) and units [u0, u0 + count) of the leaves x R (unit u: leaf u / R, run
 * u % R), count a power of two, u0 a multiple of it: the units' sums added by tree_sum's tree on a
 * stack (unit i closes the subtrees its index completes: (left) + (right)). share > 1: the block's
 * warps are one tile's, warp s having units [s count, (s + 1) count); their sums are added in shared
 * memory by the same tree ((s) + (s + st) for st = 1, 2, 4 ..), warp 0 writes. Then the bias. */
template <int MT, int NT, int U, int SH>
__global__ void __launch_bounds__(MMA_MAX_WARPS *WARP)
matmul_tc_kernel(float *out, const float *x, const uint16_t *w, const uint16_t *bias, int N, int K, int n_out,
                 int leaves, int R, int share, int vec, int skip, const int *gate) {
    __shared__ float red[SH][MT * NT * 4][WARP];   /* SH: the most warps that share a tile (share <= SH) */
    if (gate && !*gate) return;   /* the hi-only kernel took this call (its pre-pass found x bf16-valued) */
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, warps = blockDim.x / WARP;
    int tile = warp / share, sub = warp % share, tiles = warps / share;
    Tile T = {w, x, N, K, n_out, ((int)blockIdx.x * tiles + tile) * MMA_M * MT, (int)blockIdx.y * MMA_N * NT, lane};
    /* a whole warp leaves (mma.sync needs all 32 lanes); with share > 1 the block is one tile, which
     * the grid never puts past n_out, so no warp misses the __syncthreads below */
    if (T.o0 >= n_out) return;
    int KL = K / leaves, C = (KL + MMA_K - 1) / MMA_K, count = leaves * R / share, u0 = sub * count;
    float acc[MT][NT][4], stack[10][MT][NT][4];   /* leaves x R <= 1024: at most 10 left subtrees pending */
    int top = 0;
    for (int i = 0; i < count; i++) {
        int u = u0 + i, lf = u / R, c0, c1;
        mma_run_chunks(C, R, u % R, &c0, &c1);
        run_dot<MT, NT, U>(acc, T, lf * KL, (lf + 1) * KL, c0, c1, vec, skip);
        tree_step(acc, stack, top, i, i + 1 == count, 0);   /* run_dot starts acc afresh */
    }
    if (SH > 1 && share > 1) {
        for (int st = 1; st < share; st *= 2) {
            /* round st: warp s + st (s = 0 mod 2 st) stores its subtree, warp s adds it to its own:
             * (left) + (right) */
            if (sub % (2 * st) == st) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) red[sub][(mt * NT + nt) * 4 + e][lane] = acc[mt][nt][e];
            }
            __syncthreads();
            if (sub % (2 * st) == 0) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            acc[mt][nt][e] = acc[mt][nt][e] + red[sub + st][(mt * NT + nt) * 4 + e][lane];
            }
            __syncthreads();
        }
        if (sub != 0) return;
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int o = T.o0 + MMA_M * mt + mma_c_row(lane, i), n = T.n0 + MMA_N * nt + mma_c_col(lane, i);
                if (o >= n_out || n >= N) continue;
                float v = acc[mt][nt][i];
                out[(size_t)n * n_out + o] = bias ? v + bf16_up(bias[o]) : v;
            }
}

/* ---- the hi-only variant (N > 32, x bf16-valued: cuda.h's MmaHiGeometry) ----------------------------
 * The pre-pass: *flag = 1 when some x element has low 16 bits set or is a NaN (then mid or lo may be
 * nonzero, or hi would carry a NaN's quiet bit: the general kernel). n4 float4's, x 16-byte aligned. */
__global__ void tc_hi_check_kernel(const uint4 *x, size_t n4, int *flag) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = __ldg(x + i);
        uint32_t u[4] = {v.x, v.y, v.z, v.w};
        bool bad = false;
#pragma unroll
        for (int e = 0; e < 4; e++) bad |= (u[e] & 0xffffu) != 0u || (u[e] & 0x7fffffffu) > 0x7f800000u;
        if (bad) *flag = 1;
    }
}
__device__ int tc_hi_flag;   /* the pre-pass's verdict for the call in flight: 0 the hi-only kernel */

__device__ __forceinline__ void cp_async16(void *dst, const void *src, int bytes) {
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int P> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(P) : "memory");
}

/* stage s's chunks into buffer s % STAGES: weights rows o0 .., x rows n0 .., 16-byte copies, each
 * wholly inside or outside its leaf (n_in and KL multiples of 8); outside, or past n_out / N: zeros,
 * as the general kernel's loads give */
template <int WN>
__device__ __forceinline__ void hi_load(uint16_t *Ws, float *Xs, const uint16_t *w, const float *x, int s, int J, int C,
                                        int KL, int K, int N, int n_out, int o0, int n0) {
    constexpr int BN = MMA_HI_WN * WN, T = 64 * WN, WSZ = MMA_HI_BM * MMA_K, XSZ = BN * MMA_K;
    int buf = s % MMA_HI_STAGES;
#pragma unroll
    for (int q = 0; q < MMA_HI_SC; q++) {
        int j = s * MMA_HI_SC + q;
        if (j >= J) break;
        int kc, kend;
        mma_hi_chunk(j, C, KL, &kc, &kend);
        uint16_t *wd = Ws + (buf * MMA_HI_SC + q) * WSZ;
        float *xd = Xs + (buf * MMA_HI_SC + q) * XSZ;
#pragma unroll
        for (int c = 0; c < MMA_HI_BM * 2 / T; c++) {
            int i = (int)threadIdx.x + c * T, row, k;
            mma_hi_w_copy(i, &row, &k);
            bool ok = o0 + row < n_out && kc + k < kend;
            cp_async16(wd + row * MMA_K + k, ok ? (const void *)(w + (size_t)(o0 + row) * K + kc + k) : (const void *)w,
                       ok ? 16 : 0);
        }
#pragma unroll
        for (int c = 0; c < BN * 4 / T; c++) {
            int i = (int)threadIdx.x + c * T, row, k;
            mma_hi_x_copy(i, &row, &k);
            bool ok = n0 + row < N && kc + k < kend;
            cp_async16(xd + row * MMA_K + k, ok ? (const void *)(x + (size_t)(n0 + row) * K + kc + k) : (const void *)x,
                       ok ? 16 : 0);
        }
    }
}

/* A block: 128 outputs x 32 WN rows, warp (wm, wn) = (warp % 2, warp / 2) the 64 x 32 at (64 wm, 32 wn).
 * Per output exactly the general kernel's arithmetic on bf16-valued x: each unit's chunks in order into
 * one accumulator from +0 (the hi mma with the same A and B registers: B's halves are x's high 16 bits,
 * what mma_split3 gives as hi when x has no NaN), the run's sum +0 + hi (the general kernel's
 * z(lo + mid) + hi with lo = mid = +0), the units by the same stack (tree_sum's tree), the bias. A
 * nonfinite weight: the general kernel's mid mma (issued: its fragment is not finite) makes the row
 * NaN (inf x 0); here hi is then inf or NaN, so a nonfinite result scans its weight row and, finding
 * one, gives the NaN (by an add, as the general kernel's last step is one: the same NaN bits). Returns at once if the pre-pass's *flag says x is not bf16-valued. */
template <int WN>
__global__ void __launch_bounds__(64 * WN)
matmul_tc_hi_kernel(float *out, const float *x, const uint16_t *w, const uint16_t *bias, int N, int K, int n_out,
                    int leaves, int R, const int *flag) {
    if (*flag) return;
    constexpr int BN = MMA_HI_WN * WN, WSZ = MMA_HI_BM * MMA_K, XSZ = BN * MMA_K, ST = MMA_HI_STAGES;
    constexpr int MT = MMA_HI_WM / MMA_M, NT = MMA_HI_WN / MMA_N;
    extern __shared__ __align__(16) unsigned char hi_smem[];
    uint16_t *Ws = (uint16_t *)hi_smem;                                           /* [ST SC][128][16] */
    float *Xs = (float *)(hi_smem + sizeof(uint16_t) * ST * MMA_HI_SC * WSZ);   /* [ST SC][BN][16] */
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, wm = warp & 1, wn = warp >> 1;
    int o0 = (int)blockIdx.x * MMA_HI_BM, n0 = (int)blockIdx.y * BN;
    int KL = K / leaves, C = (KL + MMA_K - 1) / MMA_K, J = leaves * C, NS = (J + MMA_HI_SC - 1) / MMA_HI_SC;
    int S = leaves * R, u = 0, uend = mma_hi_unit_end(0, C, R), top = 0;
    float acc[MT][NT][4], stack[MMA_HI_DEPTH][MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mt][nt][e] = 0.0f;
#pragma unroll
    for (int s = 0; s < ST - 1; s++) {
        if (s < NS) hi_load<WN>(Ws, Xs, w, x, s, J, C, KL, K, N, n_out, o0, n0);
        cp_async_commit();
    }
    for (int s = 0; s < NS; s++) {
        cp_async_wait<ST - 2>();
        __syncthreads();   /* stage s landed for every thread; buffer (s - 1) % ST free */
        if (s + ST - 1 < NS) hi_load<WN>(Ws, Xs, w, x, s + ST - 1, J, C, KL, K, N, n_out, o0, n0);
        cp_async_commit();
        int buf = s % ST;
#pragma unroll
        for (int q = 0; q < MMA_HI_SC; q++) {
            int j = s * MMA_HI_SC + q;
            if (j >= J) break;
            const uint16_t *wt = Ws + (buf * MMA_HI_SC + q) * WSZ;
            const float *xt = Xs + (buf * MMA_HI_SC + q) * XSZ;
            uint32_t a[MT][4], b[NT][2];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int r = 0; r < 2; r++) {   /* load_vec's registers: r k 4t, 4t + 1; r + 2 k 4t + 2, 4t + 3 */
                    uint2 v = *(const uint2 *)(wt + mma_hi_a_off(wm, mt, lane, r));
                    a[mt][r] = v.x, a[mt][r + 2] = v.y;
                }
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {   /* register r: hi(x[k 4t + 2r]) | hi(x[k 4t + 2r + 1]) << 16 */
                uint4 v = *(const uint4 *)(xt + mma_hi_b_off(wn, nt, lane));
                b[nt][0] = __byte_perm(v.x, v.y, 0x7632), b[nt][1] = __byte_perm(v.z, v.w, 0x7632);
            }
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++) mma_bf16(acc[mt][nt], a[mt], b[nt]);
            if (j + 1 == uend) {   /* unit u closes: its run's sum, then matmul_tc_kernel's stack */
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) acc[mt][nt][e] = __fadd_rn(0.0f, acc[mt][nt][e]);   /* z(+0 + +0) + hi */
                tree_step(acc, stack, top, u, u + 1 == S, 1);
                if (u + 1 < S) {
                    u++;
                    uend = mma_hi_unit_end(u, C, R);
                }
            }
        }
    }
    cp_async_wait<0>();
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int o = o0 + MMA_HI_WM * wm + MMA_M * mt + mma_c_row(lane, i);
                int n = n0 + MMA_HI_WN * wn + MMA_N * nt + mma_c_col(lane, i);
                if (o >= n_out || n >= N) continue;
                float v = acc[mt][nt][i];
                if ((__float_as_uint(v) & 0x7f800000u) == 0x7f800000u)   /* inf or NaN: a nonfinite weight? */
                    for (int k = 0; k < K; k++)
                        if ((w[(size_t)o * K + k] & 0x7f80u) == 0x7f80u) {
                            v = __fadd_rn(v, __uint_as_float(0x7fffffffu));   /* a NaN as an add makes it */
                            break;
                        }
                out[(size_t)n * n_out + o] = bias ? v + bf16_up(bias[o]) : v;
            }
}

extern "C" MmaHiGeometry cuda_mma_hi_geometry(int N, int n_in, int n_out, int leaves, int sms) {
    MmaHiGeometry g;
    int KL = n_in / leaves;
    g.runs = mma_runs(KL);
    g.ok = N > 32 && n_in >= MMA_K && n_in % 8 == 0 && KL % 8 == 0 && leaves * g.runs <= MMA_HI_MAX_UNITS;
    long bx = (n_out + MMA_HI_BM - 1) / MMA_HI_BM, big = (N + 4 * MMA_HI_WN - 1) / (4 * MMA_HI_WN);
    g.wn = bx * big >= sms ? 4 : 2;
    g.grid_x = (unsigned)bx;
    g.grid_y = (unsigned)((N + g.wn * MMA_HI_WN - 1) / (g.wn * MMA_HI_WN));
    return g;
}

/* Decode (N <= 8): one m16 x n8 tile a block, its leaves x R runs over share = min(leaves R, 8)
 * warps, a run's 16 chunks of loads in flight. Batched decode (N <= 32): 16 outputs x 32 rows a
 * tile, 4 chunks in flight, the same sharing. Prefill (N > 32): 32 outputs x 32 rows a warp, 4 warps
 * a block side by side, every run in turn (share 1). */
extern "C" MmaGeometry cuda_mma_geometry(int N, int n_in, int n_out, int leaves) {
    MmaGeometry g;
    g.runs = mma_runs(n_in / leaves);
    int units = leaves * g.runs;
    if (N <= 8) g.mt = 1, g.nt = 1, g.unroll = 16;
    else if (N <= 32) g.mt = 1, g.nt = 4, g.unroll = 4;
    else g.mt = 2, g.nt = 4, g.unroll = 2;
    if (N <= 32) g.share = units < MMA_MAX_WARPS ? units : MMA_MAX_WARPS, g.warps = g.share;
    else g.share = 1, g.warps = 4;
    int outs = MMA_M * g.mt * (g.warps / g.share), rows = MMA_N * g.nt;
    g.grid_x = (unsigned)((n_out + outs - 1) / outs);
    g.grid_y = (unsigned)((N + rows - 1) / rows);
    return g;
}

static int tc_skip = 1;
extern "C" void cuda_matmul_set_tc_skip(int on) { tc_skip = on != 0; }

static int tc_fast = -1, hi_tried;   /* -1: not read from the environment yet */
extern "C" int cuda_matmul_tc_fast(void) {
    if (tc_fast < 0) {
        const char *e = getenv("TANDEM_CUDA_TC_FAST");
        tc_fast = !(e && !strcmp(e, "0"));
    }
    return tc_fast;
}
extern "C" void cuda_matmul_set_tc_fast(int on) { tc_fast = on != 0; }
extern "C" int cuda_matmul_tc_hi_taken(void) {
    int f = 1;
    if (hi_tried) CUDA_CHECK(cudaMemcpyFromSymbol(&f, tc_hi_flag, sizeof f));
    return hi_tried && f == 0;
}

static int simt_bf16 = -1;   /* -1: not read from the environment yet */
extern "C" int cuda_matmul_simt_bf16(void) {
    if (simt_bf16 < 0) {
        const char *e = getenv("TANDEM_CUDA_MATMUL");
        simt_bf16 = e && !strcmp(e, "simt");   /* the tensor cores unless asked: see cuda.h */
    }
    return simt_bf16;
}
extern "C" void cuda_matmul_set_simt_bf16(int on) { simt_bf16 = on != 0; }

/* cuda_matmul's bf16 path (leaves already checked: a power of two up to 64 dividing n_in) */
void matmul_tc(float *out, const float *x, const uint16_t *w, const uint16_t *bias, int N, int K, int n_out,
               int leaves) {
    MmaGeometry g = cuda_mma_geometry(N, K, n_out, leaves);
    int KL = K / leaves;
    /* 8-byte weight loads and 16-byte x loads need every row and leaf start aligned: KL % 4 == 0
     * (then K % 4 == 0) and aligned bases; otherwise element by element, the same values */
    int vec = KL % 4 == 0 && (uintptr_t)w % 8 == 0 && (uintptr_t)x % 16 == 0;
    dim3 grid(g.grid_x, g.grid_y), block(g.warps * WARP);
    const int *gate = NULL;   /* the hi-only kernel's flag: the general kernel runs only if it is set */
    hi_tried = 0;
    if (N > 32 && tc_skip && cuda_matmul_tc_fast() && (uintptr_t)w % 16 == 0 && (uintptr_t)x % 16 == 0) {
        int dev, sms;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        MmaHiGeometry h = cuda_mma_hi_geometry(N, K, n_out, leaves, sms);
        if (h.ok) {
            int *flag;
            CUDA_CHECK(cudaGetSymbolAddress((void **)&flag, tc_hi_flag));
            CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int)));
            size_t n4 = (size_t)N * K / 4;
            unsigned cb = (unsigned)((n4 + 255) / 256 < (size_t)sms * 8 ? (n4 + 255) / 256 : (size_t)sms * 8);
            tc_hi_check_kernel<<<cb, 256>>>((const uint4 *)x, n4, flag);
            CUDA_CHECK_LAUNCH();
            dim3 hg(h.grid_x, h.grid_y);
            size_t st = (size_t)MMA_HI_STAGES * MMA_HI_SC * MMA_K * (MMA_HI_BM * sizeof(uint16_t) + h.wn * MMA_HI_WN * sizeof(float));
            if (h.wn == 4) {
                CUDA_CHECK(cudaFuncSetAttribute(matmul_tc_hi_kernel<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)st));
                matmul_tc_hi_kernel<4><<<hg, 256, st>>>(out, x, w, bias, N, K, n_out, leaves, h.runs, flag);
            } else {
                CUDA_CHECK(cudaFuncSetAttribute(matmul_tc_hi_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)st));
                matmul_tc_hi_kernel<2><<<hg, 128, st>>>(out, x, w, bias, N, K, n_out, leaves, h.runs, flag);
            }
            CUDA_CHECK_LAUNCH();
            gate = flag, hi_tried = 1;
        }
    }
    if (g.mt == 1 && g.nt == 1 && g.unroll == 16)
        matmul_tc_kernel<1, 1, 16, MMA_MAX_WARPS><<<grid, block>>>(out, x, w, bias, N, K, n_out, leaves, g.runs, g.share, vec, tc_skip, gate);
    else if (g.mt == 1 && g.nt == 4 && g.unroll == 4)
        matmul_tc_kernel<1, 4, 4, MMA_MAX_WARPS><<<grid, block>>>(out, x, w, bias, N, K, n_out, leaves, g.runs, g.share, vec, tc_skip, gate);
    else if (g.mt == 2 && g.nt == 4 && g.unroll == 2 && g.share == 1)
        matmul_tc_kernel<2, 4, 2, 1><<<grid, block>>>(out, x, w, bias, N, K, n_out, leaves, g.runs, g.share, vec, tc_skip, gate);
    else   /* the prefill kernel has no shared memory for sharing a tile: share must be 1 there */
        backend_fatal("internal error: matmul_tc has no kernel for tile %d x %d, unroll %d", g.mt, g.nt, g.unroll);
    CUDA_CHECK_LAUNCH();
}
