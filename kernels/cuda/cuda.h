/* cuda.h — the CUDA backend (kernels/cuda/, built whenever nvcc is found): cuda_backend, the
 * kernels/kernels.h operation table filled with CUDA kernels, and the few host-side helpers the
 * runtime and tests need around it. Every entry has the CPU kernel's contract (kernels/cpu/cpu.h,
 * kernels/cpu/backward.h) on device pointers, int arrays included; all work is queued on one
 * stream per process (the legacy default stream), so consecutive calls are ordered and to_host
 * waits for everything before it.
 * Owns: cuda_backend, cuda_sync and the matmuls' launch geometry (cuda_matmul_geometry, the fp32
 * SIMT kernel's; cuda_mma_geometry, the bf16 tensor-core kernel's), the tensor-core kernel's fragment
 * index map and its exact 3-piece bf16 split of x (host and device: tested without a GPU).
 * Checked against the CPU oracle, entry by entry, by tests/cuda/cuda_vs_cpu.c. */
#ifndef TANDEM_CUDA_H
#define TANDEM_CUDA_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define TANDEM_HD __host__ __device__
#else
#define TANDEM_HD
#endif
/* Defined in kernels/cuda/ (C++ .cu files), called from C: C linkage; kernels.h's functions
 * (backend_fatal) are C's, called from the .cu files. */
#ifdef __cplusplus
extern "C" {
#endif
#include "kernels/kernels.h"
extern const Backend cuda_backend;
/* Waits for all queued work; a kernel's asynchronous fault is reported here (one line, job stops). */
void cuda_sync(void);

/* The forward matmul's launch geometry, host-side so tests can check it without a GPU.
 * out (N, n_out) = x (N, n_in) w^T: a warp computes CUDA_MM_ROWS outputs x rows_per_warp x rows;
 * lane l reads elements [4l, 4l + 4) of every 128-element chunk of a row (the fixed K split that
 * makes each output's bits independent of N, the grid and the tiling), then a fixed xor tree adds
 * the lanes. */
enum { CUDA_MM_ROWS = 4, CUDA_MM_WARPS = 4, CUDA_MM_CHUNK = 128 };
typedef struct {
    int x_rows;             /* x rows one warp handles: 1, 2, 4 or 8 (from N) */
    unsigned grid_x, grid_y;/* blocks over n_out, over N */
} MatmulGeometry;
MatmulGeometry cuda_matmul_geometry(int N, int n_out);

/* ---- the bf16 tensor-core matmul (kernels/cuda/matmul_tc.cu): what its host-side checks need ----
 * out (N, n_out) = x (N, n_in) w^T with w bf16: mma.sync m16n8k16 (bf16 x bf16, fp32 accumulators),
 * A = 16 weight rows x 16 k, B = 16 k x 8 x rows, D = 16 outputs x 8 rows. Each output's arithmetic
 * is fixed by n_in and leaves alone (matmul_tc.cu's header has it in full): a leaf of KL = n_in /
 * leaves inputs is C = ceil(KL / 16) chunks of 16 k, cut into R = mma_runs(KL) runs (mma_run_chunks);
 * a run is three accumulators from 0 (x's hi, mid, lo pieces), its chunks in increasing order, added
 * (lo + mid, a zero made +0) + hi; the leaves x R runs are added by tree_sum's pairwise tree, then
 * the bias. The geometry below only decides which outputs, rows and runs a warp computes, so every
 * N and every tile gives a row the same bits. */
enum { MMA_K = 16, MMA_M = 16, MMA_N = 8, MMA_MAX_WARPS = 8, MMA_MAX_LEAVES = 64, MMA_MAX_RUNS = 16,
       MMA_RUN_CHUNKS = 16 };
/* Runs of a leaf of KL inputs: the largest power of two R <= MMA_MAX_RUNS with C >= MMA_RUN_CHUNKS R
 * (C = ceil(KL / 16) chunks; runs of at least 256 k), 1 when C < 32. Fixed by KL alone (kernels.h:
 * a tp rank's leaves have the whole model's KL, so its subtree is the same). */
TANDEM_HD static inline int mma_runs(int KL) {
    int C = (KL + MMA_K - 1) / MMA_K, R = 1;
    while (R < MMA_MAX_RUNS && C >= MMA_RUN_CHUNKS * 2 * R) R *= 2;
    return R;
}
/* Run r of R over a leaf of C chunks: chunks [floor(r C / R), floor((r + 1) C / R)), lengths differing
 * by at most one, none empty (C >= R); the leaf's partial last chunk, if any, is in the last run. */
TANDEM_HD static inline void mma_run_chunks(int C, int R, int r, int *c0, int *c1) {
    *c0 = (int)((long long)r * C / R);
    *c1 = (int)((long long)(r + 1) * C / R);
}
typedef struct {
    int mt, nt;                      /* a tile: mt x 16 outputs, nt x 8 rows of x */
    int unroll;                      /* chunks whose loads are issued before their mma's */
    int share;                       /* warps sharing one tile, each a contiguous 1 / share of its
                                        leaves x runs (a power of two); their subtrees added in shared
                                        memory by the same tree. 1: a warp does every run in turn */
    int warps;                       /* warps per block: share warps on one tile, or warps tiles side
                                        by side over the outputs (share == 1) */
    int runs;                        /* mma_runs(n_in / leaves) */
    unsigned grid_x, grid_y;         /* blocks over n_out, over N */
} MmaGeometry;
MmaGeometry cuda_mma_geometry(int N, int n_in, int n_out, int leaves);
/* The hi-only variant for N > 32 (matmul_tc.cu's header): when every x element is bf16-valued and no
 * NaN (a device pre-pass decides, no host sync), mid = lo = +0 pieces, so a run is the hi accumulator
 * alone, hi + z(+0 + +0) = +0 + hi. Same per-output arithmetic as the general kernel; only the
 * tiling changes: a block 128 outputs x 32 wn rows (wn = 4, or 2 when the 128 x 128 tiles would not
 * fill the GPU's sms), warps 64 x 32 (2 along the outputs, wn along the rows), operands staged in
 * shared memory by cp.async, MMA_HI_SC chunks a stage, MMA_HI_STAGES stages. Every block walks the
 * whole chunk sequence j = 0 .. leaves C - 1 (mma_hi_chunk), closing unit u (leaf u / R, run u % R)
 * after chunk mma_hi_unit_end(u) - 1. ok: the shape the kernel takes (16-byte copies: n_in and the
 * leaf length multiples of 8; at most MMA_HI_MAX_UNITS units, the stack's depth); else the general
 * kernel. */
enum { MMA_HI_BM = 128, MMA_HI_WM = 64, MMA_HI_WN = 32, MMA_HI_SC = 2, MMA_HI_STAGES = 3, MMA_HI_MAX_UNITS = 64,
       MMA_HI_DEPTH = 6 };
typedef struct {
    int ok;                          /* the hi-only kernel can take this shape */
    int wn;                          /* warps along the x rows: 4 (128 x 128 a block) or 2 (128 x 64) */
    int runs;                        /* mma_runs(n_in / leaves) */
    unsigned grid_x, grid_y;         /* blocks over n_out, over N */
} MmaHiGeometry;
MmaHiGeometry cuda_mma_hi_geometry(int N, int n_in, int n_out, int leaves, int sms);
/* chunk j of the sequence (leaf j / C, chunk j % C): its first column and its leaf's end */
TANDEM_HD static inline void mma_hi_chunk(int j, int C, int KL, int *kc, int *kend) {
    int lf = j / C;
    *kc = lf * KL + (j - lf * C) * MMA_K;
    *kend = (lf + 1) * KL;
}
/* one past the last chunk (in the sequence) of unit u */
TANDEM_HD static inline int mma_hi_unit_end(int u, int C, int R) {
    int c0, c1;
    mma_run_chunks(C, R, u % R, &c0, &c1);
    return (u / R) * C + c1;
}
/* copy i of a chunk's staged tiles (16 bytes each): weights, a row of 16 bf16 in 2 copies (row i / 2,
 * k 8 (i % 2) ..); x, a row of 16 fp32 in 4 copies (row i / 4, k 4 (i % 4) ..) */
TANDEM_HD static inline void mma_hi_w_copy(int i, int *row, int *k) { *row = i >> 1, *k = 8 * (i & 1); }
TANDEM_HD static inline void mma_hi_x_copy(int i, int *row, int *k) { *row = i >> 2, *k = 4 * (i & 3); }
/* 0: never the hi-only variant (the general kernel for every N > 32 too). Default 1 unless
 * TANDEM_CUDA_TC_FAST=0 (read once); cuda_matmul_set_tc_skip(0) also turns it off (it is a skip). */
void cuda_matmul_set_tc_fast(int on);
int cuda_matmul_tc_fast(void);
/* 1 when the last bf16 tensor-core matmul took the hi-only variant (reads the device's flag: syncs;
 * a test's probe) */
int cuda_matmul_tc_hi_taken(void);
/* 0: always issue the mid and lo mma's (a debug switch: cuda_vs_cpu checks the bits are the same);
 * 1 (default): skip them where the warp's x pieces are all +0 and its weights finite */
void cuda_matmul_set_tc_skip(int on);
/* 1: bf16 weights take the fp32 SIMT kernel (on the upcast weights); 0 (default): the tensor cores
 * (matmul_tc.cu). TANDEM_CUDA_MATMUL=simt (read once) picks the SIMT kernel. Measured on an H200 at
 * the 1.1B shape against SIMT in one call: prefill 4 x 512 3.5x, decode batch 32 1.24x, a training
 * step 1.18x, decode batch 1 0.91x (README, Measured). One choice per process, so every batch size
 * gets the same bits. bench --kernels sets it to time both side by side. */
int cuda_matmul_simt_bf16(void);
void cuda_matmul_set_simt_bf16(int on);

/* Where a lane's fragment elements sit, as the kernel addresses them (g = lane / 4, t = lane % 4).
 * The PTX ISA ("Matrix Fragments for mma.m16n8k16 with floating point type") fixes which slot of
 * the 16 k slots each element occupies; the kernel chooses which k goes to which slot, the same
 * for A and B, so that a lane's four k are consecutive (one 8-byte weight load, one 16-byte x load):
 * slot 2t + h + 8q holds k = 4t + 2q + h (q = 0, 1; h = 0, 1 the low / high half of a register).
 * A register r (0..3): row g + 8 (r & 1), k 4t + 2 (r >> 1) + h.   B register r (0, 1): column (x
 * row) g, k 4t + 2r + h.   C element i (0..3): row (output) g + 8 (i >> 1), column (x row) 2t + (i & 1).
 * cuda_vs_cpu checks these against the ISA's table: every (output, x row, k) product exactly once. */
TANDEM_HD static inline int mma_a_row(int lane, int r) { return lane / 4 + 8 * (r & 1); }
TANDEM_HD static inline int mma_a_k(int lane, int r, int h) { return 4 * (lane % 4) + 2 * (r >> 1) + h; }
TANDEM_HD static inline int mma_b_col(int lane) { return lane / 4; }
TANDEM_HD static inline int mma_b_k(int lane, int r, int h) { return 4 * (lane % 4) + 2 * r + h; }
TANDEM_HD static inline int mma_c_row(int lane, int i) { return lane / 4 + 8 * (i >> 1); }
TANDEM_HD static inline int mma_c_col(int lane, int i) { return 2 * (lane % 4) + (i & 1); }

/* where warp (wm, wn)'s lane reads a chunk's staged tiles (elements from the tile's start, rows of 16):
 * A registers r, r + 2 of row tile mt one 8-byte read (k 4t .. 4t + 3 of its row mma_a_row(lane, r));
 * B registers 0, 1 of row tile nt one 16-byte read (k 4t .. 4t + 3 of x row mma_b_col(lane)) */
TANDEM_HD static inline int mma_hi_a_off(int wm, int mt, int lane, int r) {
    return (MMA_HI_WM * wm + MMA_M * mt + mma_a_row(lane, r)) * MMA_K + mma_a_k(lane, r, 0);
}
TANDEM_HD static inline int mma_hi_b_off(int wn, int nt, int lane) {
    return (MMA_HI_WN * wn + MMA_N * nt + mma_b_col(lane)) * MMA_K + mma_b_k(lane, 0, 0);
}
TANDEM_HD static inline uint32_t mma_f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
TANDEM_HD static inline float mma_u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
/* x as three bf16 pieces (their bits), p[0] + p[1] + p[2] == x exactly for every x that is a multiple
 * of 2^-133 (every |x| >= 2^-110, every bf16 value), else within 2^-133:
 *   hi = x with its low 16 bits cleared (x truncated to bf16's 8 significant bits: never rounds up,
 *   so never overflows to inf); r1 = x - hi is exact (Sterbenz: hi <= x < 2 hi, same sign; a
 *   subnormal difference is always exact): the low 16 significant bits of x, |r1| < 2^(e - 7) for x
 *   in [2^e, 2^(e+1)), a multiple of ulp(x) = 2^(e - 23). mid = r1 truncated the same way, r2 = r1 - mid
 *   exact likewise: with |r1| in [2^f, 2^(f+1)), f <= e - 8, |r2| < 2^(f - 7) <= 2^(e - 15), and r2 is
 *   a multiple of 2^(e - 23): fewer than 2^8 of them, at most 8 significant bits, which bf16 holds
 *   when r2 is a normal float, and when r2 is subnormal iff it is a multiple of bf16's least
 *   subnormal 2^-133 (true when e - 23 >= -133). lo = r2 truncated == r2 then; otherwise only r2's
 *   bits below 2^-133 are lost.
 * inf and NaN: hi carries them (a NaN stays a NaN, quiet bit set as f32_to_bf16), mid = lo = 0.
 * x a bf16 value (the forward's matmul inputs in bf16 mode): hi = x, mid = lo = 0. */
TANDEM_HD static inline void mma_split3(float x, uint16_t p[3]) {
    uint32_t u = mma_f2u(x);
    if ((u & 0x7f800000u) == 0x7f800000u) {
        p[0] = (uint16_t)((u >> 16) | ((u & 0x7fffffu) ? 0x40u : 0u));
        p[1] = p[2] = 0;
        return;
    }
    uint32_t h = u & 0xffff0000u;
    float r1 = x - mma_u2f(h);
    uint32_t m = mma_f2u(r1) & 0xffff0000u;
    float r2 = r1 - mma_u2f(m);
    p[0] = (uint16_t)(h >> 16);
    p[1] = (uint16_t)(m >> 16);
    p[2] = (uint16_t)(mma_f2u(r2) >> 16);
}
#ifdef __cplusplus
}
#endif
#endif
