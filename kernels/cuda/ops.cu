/* ops.cu — CUDA kernels of kernels/cuda/cuda.h: matmul (cuBLAS) and RMSNorm, plus the device
 * memory helpers the tests and the runtime use. Same names and argument order as kernels/cpu/ops.c
 * with a cuda_ prefix, device pointers and a trailing stream (STYLE.md 7). Kernels first, then the
 * launchers; every launch ends with a launch-error check.
 * Owns no tensor memory and does no communication; the only state is the lazily created cuBLAS
 * handle. Picking a device per rank is the runtime's job, not this file's. */
#include "kernels/cuda/cuda.h"
#include <cublas_v2.h>
#include <cuda_runtime.h>

/* From runtime/util.h, which C++ cannot include as is (_Noreturn). Prints "tandem: [rank r] ..." and
 * stops the whole job (MPI_Abort with several ranks). */
extern "C" [[noreturn]] void rank_error(const char *fmt, ...);

/* Every fallible CUDA / cuBLAS call goes through one of these (STYLE.md 3): the message names the
 * statement, file and line; rank_error adds the rank and stops the job. */
#define CUDA_CHECK(call)                                                                                  \
    do {                                                                                                  \
        cudaError_t err_ = (call);                                                                        \
        if (err_ != cudaSuccess)                                                                          \
            rank_error("internal error %s:%d: %s failed: %s", __FILE__, __LINE__, #call,                  \
                       cudaGetErrorString(err_));                                                         \
    } while (0)
#define CUBLAS_CHECK(call)                                                                                \
    do {                                                                                                  \
        cublasStatus_t st_ = (call);                                                                      \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                                 \
            rank_error("internal error %s:%d: %s failed: %s", __FILE__, __LINE__, #call,                  \
                       cublasGetStatusString(st_));                                                       \
    } while (0)
/* After every <<<...>>>: catches bad launch configurations at once instead of at the next sync. */
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

enum { RMSNORM_THREADS = 256, BIAS_THREADS = 256, WARP = 32 };

/* ----------------------------------------------------------------------------------------------- */
/* kernels */

/* out (N, n_out) += bias (n_out), broadcast over rows; grid-stride over all N * n_out elements. */
__global__ void bias_add_kernel(float *out, const float *bias, size_t total, int n_out) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride)
        out[i] += bias[i % (size_t)n_out];
}

/* One block per row n: out[n] = x[n] / sqrt(mean(x[n]^2) + eps) * w, all in fp32, normalised first and
 * then multiplied by w (HF LlamaRMSNorm order, as cpu_rmsnorm). Sum of squares: per-thread strided
 * partial sums, a shuffle reduction inside each warp, then the warp sums through shared memory. */
__global__ void rmsnorm_kernel(float *out, const float *x, const float *w, int D, float eps) {
    __shared__ float warp_sums[RMSNORM_THREADS / WARP];
    __shared__ float row_scale;
    const float *xr = x + (size_t)blockIdx.x * D;  /* (D) */
    float *o = out + (size_t)blockIdx.x * D;       /* (D) */
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;

    float ss = 0.0f;
    for (int i = threadIdx.x; i < D; i += blockDim.x) ss += xr[i] * xr[i];
    for (int off = WARP / 2; off > 0; off /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if (lane == 0) warp_sums[warp] = ss;
    __syncthreads();
    if (warp == 0) {
        int n_warps = blockDim.x / WARP;
        ss = lane < n_warps ? warp_sums[lane] : 0.0f;
        for (int off = WARP / 2; off > 0; off /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, off);
        /* 1/sqrtf rather than rsqrtf: correctly rounded, like the CPU oracle */
        if (lane == 0) row_scale = 1.0f / sqrtf(ss / (float)D + eps);
    }
    __syncthreads();
    float scale = row_scale;
    for (int i = threadIdx.x; i < D; i += blockDim.x) o[i] = w[i] * (xr[i] * scale);
}

/* ----------------------------------------------------------------------------------------------- */
/* launchers */

/* One handle per process, created on first use (creating it costs milliseconds, so never per call).
 * Math mode: TF32 tensor cores (10-bit mantissa inputs) and the BF16x9 fp32 emulation are opt-in in
 * cuBLAS >= 11 (CUBLAS_TF32_TENSOR_OP_MATH, CUBLAS_FP32_EMULATED_BF16X9_MATH); CUBLAS_DEFAULT_MATH
 * keeps SGEMM in true fp32, so results differ from cpu_matmul only by summation order. We set it
 * explicitly so the choice is visible here. CUBLAS_PEDANTIC_MATH would also rule out any reduced
 * precision step but may pick slower kernels; it is the thing to try if cuda_vs_cpu ever fails on a
 * new GPU or cuBLAS. Not thread-safe: one host thread per process drives the GPU. */
static cublasHandle_t blas_handle(void) {
    static cublasHandle_t handle = NULL;
    if (!handle) {
        CUBLAS_CHECK(cublasCreate(&handle));
        CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
    }
    return handle;
}

/* out (N, n_out) = x (N, n_in) @ w (n_out, n_in)^T [+ bias (n_out)]; bias may be NULL.
 * cuBLAS is column-major. A row-major (r, c) matrix is the column-major (c, r) matrix, its transpose,
 * with the same leading dimension c. So we ask cuBLAS for the column-major out^T (n_out, N):
 *   out^T = w @ x^T,  where w = op_T(w as column-major (n_in, n_out), ld n_in)
 *                     and x^T = op_N(x as column-major (n_in, N), ld n_in).
 * The bias is a separate broadcast add after the product, as cpu_matmul adds it after the dot. */
extern "C" void cuda_matmul(float *out, const float *x, const float *w, const float *bias, int N, int n_in,
                            int n_out, cudaStream_t stream) {
    if (N == 0 || n_out == 0) return;
    cublasHandle_t h = blas_handle();
    const float one = 1.0f, zero = 0.0f;
    int ld_in = n_in > 0 ? n_in : 1;  /* cuBLAS rejects ld < 1 even when k == 0 */
    CUBLAS_CHECK(cublasSetStream(h, stream));
    CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, n_out, N, n_in, &one, w, ld_in, x, ld_in, &zero,
                             out, n_out));
    if (bias) {
        size_t total = (size_t)N * n_out;
        size_t blocks = (total + BIAS_THREADS - 1) / BIAS_THREADS;
        if (blocks > 65536) blocks = 65536;  /* grid-stride covers the rest */
        bias_add_kernel<<<(unsigned)blocks, BIAS_THREADS, 0, stream>>>(out, bias, total, n_out);
        CUDA_CHECK_LAUNCH();
    }
}

/* out (N, D) = x / sqrt(mean(x^2) + eps) * w, normalised in fp32 then multiplied (HF order). */
extern "C" void cuda_rmsnorm(float *out, const float *x, const float *w, int N, int D, float eps,
                             cudaStream_t stream) {
    if (N == 0 || D == 0) return;
    rmsnorm_kernel<<<N, RMSNORM_THREADS, 0, stream>>>(out, x, w, D, eps);
    CUDA_CHECK_LAUNCH();
}

/* ----------------------------------------------------------------------------------------------- */
/* device helpers */

/* 0 when there is no driver, no device, or the driver is too old: callers fall back or skip. The
 * failed query leaves an error in the runtime's last-error slot; clear it so a later
 * CUDA_CHECK_LAUNCH does not report it. */
extern "C" int cuda_available(void) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n > 0;
}

extern "C" void *cuda_alloc(size_t bytes) {
    void *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, bytes));
    return p;
}

extern "C" void cuda_free(void *p) {
    if (p) CUDA_CHECK(cudaFree(p));
}

extern "C" void cuda_to_device(void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

extern "C" void cuda_to_host(void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

extern "C" void cuda_sync(void) { CUDA_CHECK(cudaDeviceSynchronize()); }
