/* device.h — choosing what a command runs on: --device (the backend, opened for this process) and
 * --dtype (the weights' storage type, or config.json's torch_dtype with auto).
 * Owns: the names the flags take, their one-line errors, opening the device for this rank's node
 * slot and handing it to runtime/comm.c. Does not own: the backends (kernels/), loading a model
 * (runtime/model.c), the flags' rows (runtime/args.h). */
#ifndef TANDEM_DEVICE_H
#define TANDEM_DEVICE_H
#include "kernels/kernels.h"
#include "runtime/comm.h"
#include "runtime/config.h"

/* --dtype auto (transformers' torch_dtype="auto", vLLM's --dtype auto): a config's torch_dtype
 * "bfloat16" -> BF16; "float16" -> BF16 too (no fp16 kernels: bf16 keeps fp16's 2 bytes and every
 * fp16 value's range, rounding its 11-bit significand to 8 bits, as vLLM's CPU backend does; pass
 * --dtype fp32 to keep fp16 weights exactly); "float32", absent or anything else -> F32. */
DType model_dtype_auto(const ModelConfig *c);
/* "auto", "bf16" (or "bfloat16"), "fp32" (or "float32"); anything else is a user_error naming flag */
DType dtype_parse(const char *flag, const char *value);
/* --device NAME (cpu | cuda | cpu-guarded), opened for this process: one user_error line when the
 * name is unknown, when the build lacks it, or when it cannot run (open's reason). A device other
 * than the CPU opens device local_rank % devices (local_rank: this process's rank among the job's
 * ranks on its node) and becomes the backend runtime/comm.c moves device buffers for
 * (comm_use_backend), so call it before cutting meshes. Collective over the world when NAME is not
 * cpu. device_open_local: the same over the ranks of world. */
const Backend *device_open(const char *name);
/* --kv-dtype fp32 | bf16 and --cpu-bf16-dot exact | native, for every model this process loads
 * afterwards (model_load copies kv_dtype_default() into Model.kv_dtype; the dot product is the CPU
 * kernels' one setting, backend_set_bf16_dot). One user_error line for an unknown value, and for
 * bf16 keys or the native dot on a device other than the CPU (--device cuda keeps an fp32 cache and
 * its own tensor-core matmul). */
void kernel_options_set(const char *kv_dtype, const char *bf16_dot, const char *device);
DType kv_dtype_default(void);
/* whether --cpu-bf16-dot native was given: model_load refuses it for fp32 weights (nothing to do) */
int bf16_dot_native_requested(void);
const Backend *device_open_local(const char *name, const Comm *world);
#endif
