/* matmul_tc.cu — the forward matmul for bf16 weights on tensor cores: out (N, n_out) = x (N, n_in)
 * w^T [+ bias], w bf16 (n_out, n_in), x fp32. cuda_matmul (ops.cu) calls it whenever the weight dtype
 * is DTYPE_BF16, for every N (1 included); fp32 weights keep ops.cu's SIMT kernel.
 * Owns the kernel, its launch geometry (cuda_mma_geometry) and the leaves' tree kernel. No memory
 * of its own but cuda_scratch slot 2 (the leaves' partial sums), no communication.
 *
 * The promise it keeps: a row's output bits depend only on that row of x and the weights, never on
 * N, on which rows share a launch or on the tiling. Every output is one fixed sequence of mma.sync
 * m16n8k16 bf16 instructions (fp32 accumulators; cuda.h has the fragment map):
 *   for each leaf (n_in / leaves consecutive inputs), an accumulator starting at 0 takes the chunks
 *   of 16 k in increasing order, each as three mma's, x's hi, mid and lo bf16 pieces (mma_split3,
 *   cuda.h: exact) times the same 16 weights; a chunk past the leaf's end holds zeros in both
 *   operands. The leaves' sums are added by tree_sum's pairwise tree (kernels.h), then the bias.
 * The tile variants (cuda_mma_geometry: mt x 16 outputs, nt x 8 rows a warp; leaves split over the
 * grid or run in turn) change which outputs and rows a warp computes, and which lane holds which
 * token, never an output's operands or their order. An mma's output element depends only on its row
 * of A, its column of B and its C element (the hardware computes each element alone), so the bits
 * are identical by construction; cuda_vs_cpu checks it across N = 1, 8, 37, 64 and row offsets.
 * Products of bf16 values are exact in the tensor core; its fp32 accumulation aligns them to the
 * largest and truncates (Fasi et al. 2021), a different rounding than the CPU's fmaf chain:
 * cuda_vs_cpu's header derives the bound. Decode-shaped (N <= 8): one m16 tile a warp, one warp a
 * block, 16 chunks' loads in flight (the weights stream from global memory into registers); prefill
 * (N > 32): 64 outputs x 32 rows a warp, 4 warps a block sharing their rows of x. */
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

/* acc += the chunk: x split into its three pieces, then per (mt, nt) the mma's hi, mid, lo in order */
template <int MT, int NT>
__device__ __forceinline__ void mma_chunk(float (&acc)[MT][NT][4], const Chunk<MT, NT> &c) {
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
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int p = 0; p < 3; p++) mma_bf16(acc[mt][nt], c.a[mt], b[nt][p]);
}

/* acc = one leaf's dot products: columns [kb, kb + KL), chunks in increasing order. U chunks' loads
 * are issued before their mma's (decode is bound by the loads in flight); each accumulator still
 * takes the chunks one after another, so U never changes a bit. */
template <int MT, int NT, int U>
__device__ __forceinline__ void leaf_dot(float (&acc)[MT][NT][4], const Tile &T, int kb, int KL, int vec) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[mt][nt][i] = 0.0f;
    int n_full = vec ? KL / MMA_K : 0, n_chunks = (KL + MMA_K - 1) / MMA_K, c = 0;
    for (; c + U <= n_full; c += U) {
        Chunk<MT, NT> ch[U];
#pragma unroll
        for (int u = 0; u < U; u++) load_vec(ch[u], T, kb + (c + u) * MMA_K);
#pragma unroll
        for (int u = 0; u < U; u++) mma_chunk(acc, ch[u]);
    }
    for (; c < n_chunks; c++) {
        Chunk<MT, NT> ch;
        if (c < n_full) load_vec(ch, T, kb + c * MMA_K);
        else load_one(ch, T, kb + c * MMA_K, kb + KL);
        mma_chunk(acc, ch);
    }
}

/* part NULL: each warp runs the leaves in turn, adds them by tree_sum's tree on a stack (leaf lf
 * closes the subtrees its index completes: (left) + (right)), then the bias, into out.
 * part (leaves, N, n_out): block row z computes leaf z alone into part; leaf_tree_kernel adds them. */
template <int MT, int NT, int U>
__global__ void __launch_bounds__(MMA_MAX_WARPS *WARP)
matmul_tc_kernel(float *out, float *part, const float *x, const uint16_t *w, const uint16_t *bias, int N, int K,
                 int n_out, int leaves, int vec) {
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, warps = blockDim.x / WARP;
    Tile T = {w, x, N, K, n_out, ((int)blockIdx.x * warps + warp) * MMA_M * MT, (int)blockIdx.y * MMA_N * NT, lane};
    if (T.o0 >= n_out) return;   /* a whole warp: mma.sync needs all 32 lanes, and they leave together */
    int KL = K / leaves;
    float acc[MT][NT][4];
    if (part) {
        int lf = blockIdx.z;
        leaf_dot<MT, NT, U>(acc, T, lf * KL, KL, vec);
        part += (size_t)lf * N * n_out;
    } else {
        float stack[6][MT][NT][4];   /* leaves <= 64: at most log2(64) left subtrees pending */
        int top = 0;
        for (int lf = 0; lf < leaves; lf++) {
            leaf_dot<MT, NT, U>(acc, T, lf * KL, KL, vec);
            for (int m = lf + 1; m % 2 == 0; m /= 2) {
                top--;
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
#pragma unroll
                        for (int i = 0; i < 4; i++) acc[mt][nt][i] = stack[top][mt][nt][i] + acc[mt][nt][i];
            }
            if (lf + 1 < leaves) {   /* leaves is a power of two: the last leaf closes every subtree */
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
#pragma unroll
                        for (int i = 0; i < 4; i++) stack[top][mt][nt][i] = acc[mt][nt][i];
                top++;
            }
        }
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
                if (part) part[(size_t)n * n_out + o] = v;
                else out[(size_t)n * n_out + o] = bias ? v + bf16_up(bias[o]) : v;
            }
}

/* out (N, n_out) = tree_sum of part's `leaves` planes (kernels.h: (p0 + p1) + (p2 + p3) ...), then the bias */
__global__ void leaf_tree_kernel(float *out, const float *part, const uint16_t *bias, int N, int n_out, int leaves) {
    size_t plane = (size_t)N * n_out;
    GRID_STRIDE(e, plane) {
        float v[MMA_MAX_LEAVES];
        for (int l = 0; l < leaves; l++) v[l] = part[(size_t)l * plane + e];
        for (int s = 1; s < leaves; s *= 2)
            for (int p = 0; p + s < leaves; p += 2 * s) v[p] += v[p + s];
        out[e] = bias ? v[0] + bf16_up(bias[e % n_out]) : v[0];
    }
}

/* Decode (N <= 8): one m16 tile a warp and one warp a block (n_out / 16 blocks spread over every SM),
 * 16 chunks of loads in flight; leaves split over the grid (o_proj / down_proj get leaves x the
 * warps). Batched decode (N <= 32): 32 rows a warp. Prefill (N > 32): 64 outputs x 32 rows a warp,
 * 4 warps a block; leaves in turn (no scratch of leaves x N x n_out). */
extern "C" MmaGeometry cuda_mma_geometry(int N, int n_out, int leaves) {
    MmaGeometry g;
    if (N <= 8) g.mt = 1, g.nt = 1, g.unroll = 16, g.warps = 1;
    else if (N <= 32) g.mt = 1, g.nt = 4, g.unroll = 4, g.warps = 1;
    else g.mt = 4, g.nt = 4, g.unroll = 2, g.warps = 4;
    g.split = leaves > 1 && N <= 32;
    int outs = MMA_M * g.mt * g.warps, rows = MMA_N * g.nt;
    g.grid_x = (unsigned)((n_out + outs - 1) / outs);
    g.grid_y = (unsigned)((N + rows - 1) / rows);
    g.grid_z = g.split ? (unsigned)leaves : 1u;
    return g;
}

static int simt_bf16 = -1;   /* -1: not read from the environment yet */
extern "C" int cuda_matmul_simt_bf16(void) {
    if (simt_bf16 < 0) {
        const char *e = getenv("TANDEM_CUDA_MATMUL");
        simt_bf16 = !(e && !strcmp(e, "tc"));   /* the SIMT kernel unless asked: see cuda.h */
    }
    return simt_bf16;
}
extern "C" void cuda_matmul_set_simt_bf16(int on) { simt_bf16 = on != 0; }

/* cuda_matmul's bf16 path (leaves already checked: a power of two up to 64 dividing n_in) */
void matmul_tc(float *out, const float *x, const uint16_t *w, const uint16_t *bias, int N, int K, int n_out,
               int leaves) {
    MmaGeometry g = cuda_mma_geometry(N, n_out, leaves);
    int KL = K / leaves;
    /* 8-byte weight loads and 16-byte x loads need every row and leaf start aligned: KL % 4 == 0
     * (then K % 4 == 0) and aligned bases; otherwise element by element, the same values */
    int vec = KL % 4 == 0 && (uintptr_t)w % 8 == 0 && (uintptr_t)x % 16 == 0;
    float *part = g.split ? (float *)cuda_scratch(2, sizeof(float) * (size_t)leaves * N * n_out) : NULL;
    dim3 grid(g.grid_x, g.grid_y, g.grid_z), block(g.warps * WARP);
    if (g.mt == 1 && g.nt == 1 && g.unroll == 16)
        matmul_tc_kernel<1, 1, 16><<<grid, block>>>(out, part, x, w, bias, N, K, n_out, leaves, vec);
    else if (g.mt == 1 && g.nt == 4 && g.unroll == 4)
        matmul_tc_kernel<1, 4, 4><<<grid, block>>>(out, part, x, w, bias, N, K, n_out, leaves, vec);
    else if (g.mt == 4 && g.nt == 4 && g.unroll == 2)
        matmul_tc_kernel<4, 4, 2><<<grid, block>>>(out, part, x, w, bias, N, K, n_out, leaves, vec);
    else
        rank_error("internal error: matmul_tc has no kernel for tile %d x %d, unroll %d", g.mt, g.nt, g.unroll);
    CUDA_CHECK_LAUNCH();
    if (g.split) {
        leaf_tree_kernel<<<blocks_for((size_t)N * n_out), THREADS>>>(out, part, bias, N, n_out, leaves);
        CUDA_CHECK_LAUNCH();
    }
}
