/* device.c — see device.h. */
#include "runtime/device.h"
#include "runtime/util.h"
#include <string.h>

DType model_dtype_auto(const ModelConfig *c) {
    const char *t = c->torch_dtype;
    return !strcmp(t, "bfloat16") || !strcmp(t, "float16") || !strcmp(t, "half") ? DTYPE_BF16 : DTYPE_F32;
}

DType dtype_parse(const char *flag, const char *value) {
    if (!strcmp(value, "auto")) return DTYPE_AUTO;
    if (!strcmp(value, "bf16") || !strcmp(value, "bfloat16")) return DTYPE_BF16;
    if (!strcmp(value, "fp32") || !strcmp(value, "float32")) return DTYPE_F32;
    user_error("%s %s: expected auto, bf16 or fp32 (fp16 checkpoints load as bf16 or fp32)", flag, value);
}

static DType kv_dtype = DTYPE_F32;
static int bf16_dot_native;
DType kv_dtype_default(void) { return kv_dtype; }
int bf16_dot_native_requested(void) { return bf16_dot_native; }

void kernel_options_set(const char *kv, const char *dot, const char *device) {
    int cpu = !strcmp(device, "cpu") || !strcmp(device, "cpu-guarded");
    if (!strcmp(kv, "bf16") || !strcmp(kv, "bfloat16")) kv_dtype = DTYPE_BF16;
    else if (!strcmp(kv, "fp32") || !strcmp(kv, "float32")) kv_dtype = DTYPE_F32;
    else user_error("--kv-dtype %s: expected fp32 or bf16", kv);
    if (kv_dtype == DTYPE_BF16 && !cpu)
        user_error("--kv-dtype bf16: --device %s keeps an fp32 KV cache (bf16 keys and values are CPU-only for now)", device);
    int native = !strcmp(dot, "native");
    if (!native && strcmp(dot, "exact")) user_error("--cpu-bf16-dot %s: expected exact or native", dot);
    if (native && !cpu) user_error("--cpu-bf16-dot native: a CPU kernel; --device %s has its own matmul", device);
    backend_set_bf16_dot(native);
    bf16_dot_native = native;
}

/* backend_named's, or one user_error line: unknown, not in this build */
static const Backend *device_named(const char *name) {
    const Backend *be = backend_named(name);
    if (!be && strcmp(name, "cuda"))
        user_error("--device %s: expected cpu or cuda (or cpu-guarded, the CPU kernels behind memory the host "
                   "cannot touch: a testing aid)", name);
    return be;
}
/* opens be for this process's local rank: one user_error line when it cannot run */
static const Backend *device_ready(const char *name, const Backend *be, int local_rank) {
    if (!be) user_error("--device cuda: this build has no CUDA backend (nvcc was not found when it was built)");
    const char *why = be->open(local_rank);
    if (why) user_error("--device %s: %s", name, why);
    return be;
}

const Backend *device_open(const char *name) {
    Comm world = comm_world();
    const Backend *be = device_open_local(name, &world);
    comm_free(&world);
    return be;
}

const Backend *device_open_local(const char *name, const Comm *world) {
    const Backend *be = device_named(name);
    if (!strcmp(name, "cpu")) return device_ready(name, be, 0);
    Comm node = comm_split_node(world);
    int local_rank = node.rank;
    comm_free(&node);
    device_ready(name, be, local_rank);
    comm_use_backend(be);   /* before any mesh or role group is cut: their links open with them */
    return be;
}
