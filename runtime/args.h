/* args.h — one option table per subcommand: defaults, parsing, --help and the echoed settings
 * table all come from it (STYLE.md 12). Bad values are user errors naming the flag. */
#ifndef TANDEM_ARGS_H
#define TANDEM_ARGS_H
#include "runtime/comm.h"   /* COMM_TIMEOUT_OPTION's default */

/* OPT_MODEL: a string naming a model, a directory or a Hub repo id ORG/NAME; after parsing it holds
 * the directory (runtime/hub.h: hub_model_path, which fetches a missing repo into the cache). */
typedef enum { OPT_INT, OPT_FLOAT, OPT_STR, OPT_FLAG, OPT_MODEL } OptType;
typedef struct {
    const char *name;   /* "--tp" */
    OptType type;
    void *ptr;          /* int*, float*, const char** (STR, MODEL), int* */
    const char *dflt;   /* default as text; NULL = unset (strings stay NULL, numbers 0) */
    const char *help;
} Option;

/* The rows every model-running subcommand shares (int *tp, *pp, *threads; const char **dtype, read
 * with dtype_parse). */
#define THREADS_OPTION(threads)                                                                         \
    {"--threads", OPT_INT, threads, "0", "CPU threads per rank (0 = the cores available to this rank)"}
#define DTYPE_OPTION(dtype)                                                                             \
    {"--dtype", OPT_STR, dtype, "auto", "weights: auto (config.json's torch_dtype; float16 loads as bf16) | bf16 | fp32"}
/* the trainers' (const char **save_dtype) */
#define SAVE_DTYPE_OPTION(save_dtype)                                                                   \
    {"--save-dtype", OPT_STR, save_dtype, "auto", "saved weights: auto (the model's dtype) | bf16 | fp32"}
/* every model-running command's (const char **device, opened with runtime/device.h device_open; ppo:
 * per role group, device_open_local) */
#define DEVICE_OPTION(device)                                                                           \
    {"--device", OPT_STR, device, "cpu", "cpu | cuda (the GPU local_rank % devices, at any tp x pp x dp) | cpu-guarded (a testing aid)"}
/* every command that starts ranks (float *seconds, handed to comm_set_timeout after parsing) */
#define SEQ_PARALLEL_OPTION(flag)                                                                       \
    {"--sequence-parallel", OPT_FLAG, flag, NULL,                                                        \
     "training at tp > 1: the norm / residual activations keep 1/tp of the tokens (Megatron's; the same bits)"}
/* every training command's (int *stage; train/optim.h says what each stage shards) */
#define ZERO_OPTION(stage)                                                                              \
    {"--zero", OPT_INT, stage, "0",                                                                      \
     "0 = plain data parallel; 1 = ZeRO-1: optimizer state sharded over dp ranks; 2 = ZeRO-2: and the gradients; 3 = ZeRO-3: and the layers' weights"}
#define COMM_TIMEOUT_OPTION(seconds)                                                                    \
    {"--comm-timeout", OPT_FLOAT, seconds, comm_timeout_default(),                                       \
     "seconds a rank may wait inside one communication call before it stops the job (0 = no deadline; TANDEM_COMM_TIMEOUT sets the default)"}
/* every training command's (const char **dir; train/metrics.h: metrics_open) */
#define TENSORBOARD_OPTION(dir)                                                                         \
    {"--tensorboard", OPT_STR, dir, NULL, "also write metrics.jsonl's numbers as TensorBoard event files into DIR"}
/* the inference commands' (const char **dir; runtime/adapter.h: adapter_merge after model_load) */
#define ADAPTER_OPTION(dir)                                                                             \
    {"--adapter", OPT_STR, dir, NULL, "PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors), merged into the weights"}
/* every model-running command's (const char **kv, **dot; runtime/device.h kernel_options_set) */
#define KERNEL_OPTIONS(kv, dot)                                                                         \
    {"--kv-dtype", OPT_STR, kv, "fp32",                                                                  \
     "keys and values: fp32 | bf16 (rounded to bf16 where produced, after RoPE, in generation and training alike; the KV cache at 2 bytes an element; CPU only)"}, \
    {"--cpu-bf16-dot", OPT_STR, dot, "exact",                                                            \
     "bf16 weights' forward matmul on the CPU: exact (fp32 multiply-adds on the upcast, the same bits on every ISA) | native (AVX512_BF16's vdpbf16ps arithmetic, emulated where the CPU lacks it)"}
#define MESH_OPTIONS(tp, pp, ep, threads, dtype, kv, dot)                         \
    {"--tp", OPT_INT, tp, "1", "tensor-parallel size"},                           \
    {"--pp", OPT_INT, pp, "1", "pipeline-parallel size"},                         \
    {"--ep", OPT_INT, ep, "1", "expert-parallel size (MoE: experts split over ep of the dp ranks)"}, \
    THREADS_OPTION(threads), DTYPE_OPTION(dtype), KERNEL_OPTIONS(kv, dot)

/* Parses argv (argv[0] is the subcommand). --help prints usage and exits 0. */
void args_parse(const char *usage, Option *opts, int n_opts, int argc, char **argv);
/* Whether the last args_parse set the option stored at ptr (an Option's ptr) from the command line,
 * not from its default: where a saved setting (a checkpoint's) stands unless a flag overrides it. */
int args_given(const void *ptr);
/* Prints "| setting | value |" for every option to stderr (call on rank 0 only). */
void args_print(const Option *opts, int n_opts);
#endif
