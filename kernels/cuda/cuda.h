/* cuda.h — the CUDA kernels (kernels/cuda/, built by `make cuda`): kernels/cpu/cpu.h's names with a
 * cuda_ prefix, the same argument order, device pointers and a trailing stream argument; checked
 * against the CPU oracle by tests/cuda/cuda_vs_cpu.c.
 * Owns: the cuda_* prototypes. Does not own the seam (kernels/kernels.h): no Backend table uses
 * these yet. */
#ifndef TANDEM_CUDA_H
#define TANDEM_CUDA_H
#include <stddef.h>

/* Defined in kernels/cuda/ (C++ .cu files), called from C: C linkage. cudaStream_t is spelled as in
 * cuda_runtime.h so C callers need no CUDA headers; NULL is the default stream. */
#ifdef __cplusplus
extern "C" {
#endif
typedef struct CUstream_st *cudaStream_t;
void cuda_matmul(float *out, const float *x, const float *w, const float *bias, int N, int n_in, int n_out,
                 cudaStream_t stream);
void cuda_rmsnorm(float *out, const float *x, const float *w, int N, int D, float eps, cudaStream_t stream);
/* device memory helpers for tests and the runtime; each checks its CUDA call and stops the job on
 * failure, except cuda_available: 1 if a CUDA device can be used, 0 (no abort) without driver or device */
int cuda_available(void);
void *cuda_alloc(size_t bytes);
void cuda_free(void *p);
void cuda_to_device(void *dst, const void *src, size_t bytes);
void cuda_to_host(void *dst, const void *src, size_t bytes);
void cuda_sync(void);
#ifdef __cplusplus
}
#endif
#endif
