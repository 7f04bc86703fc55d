/* cuda.h — the CUDA backend (kernels/cuda/, built whenever nvcc is found): cuda_backend, the
 * kernels/kernels.h operation table filled with CUDA kernels, and the few host-side helpers the
 * runtime and tests need around it. Every entry has the CPU kernel's contract (kernels/cpu/cpu.h,
 * kernels/cpu/backward.h) on device pointers, int arrays included; all work is queued on one
 * stream per process (the legacy default stream), so consecutive calls are ordered and to_host
 * waits for everything before it.
 * Owns: cuda_backend, cuda_sync and the matmul's launch geometry (cuda_matmul_geometry, host-side:
 * tested without a GPU).
 * Checked against the CPU oracle, entry by entry, by tests/cuda/cuda_vs_cpu.c. */
#ifndef TANDEM_CUDA_H
#define TANDEM_CUDA_H
#include <stddef.h>
#include "kernels/kernels.h"

/* Defined in kernels/cuda/ (C++ .cu files), called from C: C linkage. */
#ifdef __cplusplus
extern "C" {
#endif
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
#ifdef __cplusplus
}
#endif
#endif
