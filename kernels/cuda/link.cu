/* link.cu — the CUDA backend's side of communication (runtime/comm.c): which pointers are device
 * memory (owns), the fixed pairwise tree over ranks' partials on the device (tree_sum), and the
 * NCCL link between ranks that each have a GPU of their own (cuda_link: kernels.h DeviceLink).
 * NCCL is opened with dlopen at the first group that can use it, so a binary built here runs where
 * libnccl.so.2 is absent (groups then stage through host memory, comm.c says so once). Every NCCL
 * call is queued on the legacy default stream, after the kernels queued before it, like every
 * entry of this backend. Owns: the NCCL library handle and its function table. */
#include "kernels/cuda/common.cuh"
#include <dlfcn.h>
#include <nccl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* 1 when p is device memory (cudaMalloc'd); host and managed-but-host pointers are 0 */
extern "C" int cuda_owns(const void *p) {
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();   /* an unregistered host pointer on old drivers: not ours */
        return 0;
    }
    return a.type == cudaMemoryTypeDevice;
}

/* v[i] = the pairwise tree (kernels.h tree_sum) over planes p of v[p * n + i]: the same additions in
 * the same order as the host's loop, one thread per element */
__global__ void tree_sum_kernel(float *v, int P, size_t n) {
    GRID_STRIDE(i, n) {
        for (int s = 1; s < P; s *= 2)
            for (int p = 0; p + s < P; p += 2 * s) v[(size_t)p * n + i] += v[(size_t)(p + s) * n + i];
    }
}
extern "C" void cuda_tree_sum(float *v, int P, size_t n) {
    if (P < 2 || n == 0) return;
    tree_sum_kernel<<<blocks_for(n), THREADS>>>(v, P, n);
    CUDA_CHECK_LAUNCH();
}

/* ---- NCCL, through dlopen ---------------------------------------------------------------------- */
static struct {
    int tried;
    const char *why;   /* NULL once loaded */
    decltype(&ncclGetUniqueId) get_unique_id;
    decltype(&ncclCommInitRank) init_rank;
    decltype(&ncclCommDestroy) destroy;
    decltype(&ncclGroupStart) group_start;
    decltype(&ncclGroupEnd) group_end;
    decltype(&ncclSend) send;
    decltype(&ncclRecv) recv;
    decltype(&ncclAllGather) all_gather;
    decltype(&ncclBroadcast) broadcast;
    decltype(&ncclAllReduce) all_reduce;
    decltype(&ncclGetErrorString) error_string;
} nccl;

static const char *nccl_load(void) {
    static char why[300];
    if (nccl.tried) return nccl.why;
    nccl.tried = 1;
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        snprintf(why, sizeof why, "NCCL is not available (%s)", dlerror());
        return nccl.why = why;
    }
#define SYM(field, name)                                                                          \
    if (!(*(void **)&nccl.field = dlsym(h, name))) {                                              \
        snprintf(why, sizeof why, "libnccl.so.2 has no %s (NCCL 2.7 or newer is needed)", name); \
        return nccl.why = why;                                                                    \
    }
    SYM(get_unique_id, "ncclGetUniqueId") SYM(init_rank, "ncclCommInitRank") SYM(destroy, "ncclCommDestroy")
    SYM(group_start, "ncclGroupStart") SYM(group_end, "ncclGroupEnd") SYM(send, "ncclSend") SYM(recv, "ncclRecv")
    SYM(all_gather, "ncclAllGather") SYM(broadcast, "ncclBroadcast") SYM(all_reduce, "ncclAllReduce")
    SYM(error_string, "ncclGetErrorString")
#undef SYM
    return nccl.why = NULL;
}

/* Every NCCL call: a failure names the call, file and line and stops the job (backend_fatal) */
#define NCCL_CHECK(call)                                                                                  \
    do {                                                                                                  \
        ncclResult_t r_ = (call);                                                                         \
        if (r_ != ncclSuccess)                                                                            \
            backend_fatal("internal error %s:%d: %s failed: %s", __FILE__, __LINE__, #call, nccl.error_string(r_)); \
    } while (0)

static void link_device_key(char *key, size_t cap) {
    char host[64] = "?", bus[32] = "?";
    int dev = 0;
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetPCIBusId(bus, (int)sizeof bus, dev));
    snprintf(key, cap, "%s/%s", host, bus);
}
static const char *link_make_id(void *id) {
    const char *why = nccl_load();
    if (why) return why;
    NCCL_CHECK(nccl.get_unique_id((ncclUniqueId *)id));
    return NULL;
}
static const char *link_open(void **h, const void *id, int rank, int size) {
    const char *why = nccl_load();
    if (why) return why;
    ncclUniqueId uid;
    memcpy(&uid, id, sizeof uid);
    ncclComm_t c;
    NCCL_CHECK(nccl.init_rank(&c, size, uid, rank));
    *h = c;
    return NULL;
}
static void link_close(void *h) {
    if (h) NCCL_CHECK(nccl.destroy((ncclComm_t)h));
}
static void link_group_begin(void) { NCCL_CHECK(nccl.group_start()); }
static void link_group_end(void) { NCCL_CHECK(nccl.group_end()); }
static void link_send(void *h, const void *buf, size_t bytes, int peer) {
    NCCL_CHECK(nccl.send(buf, bytes, ncclInt8, peer, (ncclComm_t)h, 0));
}
static void link_recv(void *h, void *buf, size_t bytes, int peer) {
    NCCL_CHECK(nccl.recv(buf, bytes, ncclInt8, peer, (ncclComm_t)h, 0));
}
static void link_all_gather(void *h, const float *in, float *out, size_t n_each) {
    NCCL_CHECK(nccl.all_gather(in, out, n_each, ncclFloat32, (ncclComm_t)h, 0));   /* in place when in = out + rank n */
}
static void link_broadcast(void *h, void *buf, size_t bytes, int root) {
    NCCL_CHECK(nccl.broadcast(buf, buf, bytes, ncclInt8, root, (ncclComm_t)h, 0));
}
static void link_max(void *h, float *buf, size_t n) {
    NCCL_CHECK(nccl.all_reduce(buf, buf, n, ncclFloat32, ncclMax, (ncclComm_t)h, 0));
}

extern "C" const DeviceLink cuda_link = {
    .name = "NCCL",
    .id_bytes = sizeof(ncclUniqueId),
    .device_key = link_device_key,
    .make_id = link_make_id,
    .open = link_open,
    .close = link_close,
    .group_begin = link_group_begin,
    .group_end = link_group_end,
    .send = link_send,
    .recv = link_recv,
    .all_gather = link_all_gather,
    .broadcast = link_broadcast,
    .max = link_max,
};
