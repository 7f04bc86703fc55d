/* trainer.h — the one training loop of sft, rm and dpo, and what it is made of.
 * A command supplies a TrainTask (its loss hook, per-step preparation, metrics and eval) and the
 * loop does the rest: data (train and eval), the step count, the optimizer settings, resume, one
 * Learner (train/learner.h: the step itself), the memory plan and summary, eval before / every /
 * after, the progress line, metrics.jsonl (train/metrics.h), checkpoints and the closing line.
 * Owns: TrainOptions and their option rows, the loop (train_run), Step (copies of M micro-batches
 * out of Data's buffers; every dp rank reads the same stream and dp rank r keeps micro-batches r,
 * r + dp, ...), out/checkpoint-STEP (HF model + layout-free optimizer state + trainer_state.json,
 * written last) and reading it back.
 * Does not own: the step (learner), losses (train/grad.h LossXent, rlhf/pref_loss.h), loading the
 * model (the command does: rm adds a score head, dpo a reference). */
#ifndef TANDEM_TRAINER_H
#define TANDEM_TRAINER_H
#include "train/data.h"
#include "train/grad.h"
#include "train/learner.h"
#include "train/metrics.h"
#include "train/optim.h"
#include "runtime/args.h"

/* M micro-batches of this dp rank, copied out of Data's buffers */
typedef struct {
    MicroBatch *mbs;            /* (M) */
    int *tokens, *seq_start, *targets;  /* per micro-batch: (max_tokens), (max_tokens + 1), (max_tokens) */
    float *weight;              /* (max_tokens) per micro-batch */
    float *margin;              /* preference data: (max_tokens) per micro-batch, the pairs' margins */
    int M, max_tokens, n;       /* n: how many were filled */
    long loss_tokens, n_tokens; /* over the whole step (all dp ranks) */
    long n_pairs;               /* preference data: pairs in the whole step (all dp ranks) */
    long *token0;               /* (M) where each kept micro-batch starts among the step's tokens (all dp
                                   ranks', in the data's order): LoRA dropout's masks (runtime/lora.h) */
} Step;

void step_alloc(Step *s, int M, int max_tokens);
void step_free(Step *s);
/* Reads the step's M * dp micro-batches; keeps this dp rank's. Returns 0 when the data has ended
 * before a full step (the partial step is dropped: every dp rank must run the same M). Each kept
 * position's weight is 1 / (the step's loss tokens over all micro-batches and dp ranks). */
int step_fill(Step *s, Data *d, const Mesh *mesh);

typedef struct {
    int step, tp, pp, dp, zero;
    uint8_t cursor[DATA_CURSOR_BYTES];
} TrainerState;

/* out/checkpoint-STEP: the model (checkpoint_save_model from model_dir's config and tokenizer),
 * its optimizer state (optimizer/, train/optim_state.h), then trainer_state.json (rank 0, atomic): a checkpoint without it is
 * incomplete. Collective over m's mesh. A failed model write is reported and the run goes on. */
void trainer_save_checkpoint(Learner *L, Data *d, const char *model_dir, const char *out, int step, int keep);
/* --save-total-limit: keeps the newest `keep` complete checkpoints of out (those holding the file
 * `marker`, the caller's state file written last, e.g. "trainer_state.json"), deleting the
 * older complete ones; incomplete ones are left alone, so the newest complete one, which a run
 * resumes from, is never deleted. keep <= 0: all. Call on one rank (the writer), after a checkpoint
 * is complete. */
void trainer_rotate_checkpoints(const char *out, int keep, const char *marker);
/* A checkpoint's last step (the writer rank): dir/marker = json (n bytes), atomic, which makes dir
 * complete; if it cannot be written, dir is removed (not a checkpoint) and the run stops with one
 * line. Then "saved DIR" and trainer_rotate_checkpoints(out, keep, marker). */
void trainer_finish_checkpoint(const char *dir, const char *marker, const char *json, size_t n, const char *out, int keep);
/* Reads DIR/trainer_state.json; user_error when it is missing or not ours. */
void trainer_load_state(const char *dir, TrainerState *ts);
/* A new run (no --resume, no --overwrite) may write into out unless it holds something a run would
 * lose: a complete checkpoint of any command (checkpoint-N holding a NAME_state.json, the state
 * file each command writes last: a new sft run does not overwrite a ppo run's) or anything no run writes (a name other than
 * metrics.jsonl, metrics.jsonl.tmp.PID, checkpoint-N, checkpoint-N.tmp.*, and the --tensorboard
 * directory `tensorboard` (NULL: none) or the one of out's directories that holds it). So a run that
 * stopped before its first checkpoint (a failed step 1, a failed save, kill -9) leaves nothing that
 * blocks the same command; its metrics.jsonl is started afresh (and its event files purged from
 * step 0). user_error otherwise. */
void trainer_check_new_out(const char *out, const char *tensorboard);
/* Removes what a killed run's unfinished writes left in out: its temporaries NAME.tmp.PID
 * (checkpoint-N.tmp.PID/, metrics.jsonl.tmp.PID) and those inside each checkpoint-N/ (a command's
 * model directories' NAME.tmp.PID/, the state files' temporaries), so none ends up inside a
 * checkpoint the run rewrites. Every such name is removed, whatever its PID: one run at a time
 * writes an OUT (a new run refuses one holding a checkpoint, and two runs would overwrite each
 * other's checkpoints and metrics anyway), and a PID proves nothing here: the writer may have run
 * on another node of a shared filesystem or in another PID namespace, and PIDs are reused. Call on
 * the writer at every start (new, --overwrite or --resume), before any checkpoint is written. Each
 * removal is printed; one that fails is a user_error. */
void trainer_remove_stale_tmp(const char *out);
/* The resume directory must hold the same architecture as --model (its config.json). */
void trainer_check_same_model(const char *model_dir, const char *resume_dir);

/* ---- the loop ---------------------------------------------------------------------------- */

/* The settings every sft / rm / dpo run shares (their rows: the TRAIN_*_OPTIONS macros); ppo keeps
 * its run and optimizer settings in one too (the fields its rows name). */
typedef struct {
    const char *model_dir, *data_path, *eval_path, *out, *resume, *schedule_name, *chat_template, *recompute_name, *tensorboard;
    const char *dtype_name, *save_dtype_name, *device;
    const char *kv_dtype_name, *bf16_dot_name;   /* --kv-dtype, --cpu-bf16-dot (runtime/device.h kernel_options_set) */
    DType dtype, save_dtype;   /* parsed by run_options_check (DTYPE_AUTO: the checkpoint's / the model's) */
    const Backend *be;         /* --device, opened by train_options_check: load the models onto it */
    int tp, pp, ep, threads, seq_len, batch_size, M, epochs, max_steps, stop_after, warmup, zero, skip_bad, overwrite, sp;
    int seed, eval_every, save_every, save_limit, log_every;
    int lora_r, lora_rslora, merge;  /* LoRA (runtime/lora.h): rank (0 = off), rsLoRA's scale; --merge */
    float lora_alpha, lora_dropout;
    const char *lora_target;
    float lr, min_lr, wd, beta1, beta2, eps, clip, comm_timeout;
    float moe_z_coef;      /* --moe-z-loss-coef: the router z-loss (Learner.moe_z_coef; MoE only) */
    const Option *opts;    /* the command's whole table, echoed in the summary */
    int n_opts;
} TrainOptions;

/* Rows, placed where each command's table has them (the order is --help's and the echo's). */
#define TRAIN_OUT_OPTIONS(o, eval_help)                                                                          \
    {"--eval-data", OPT_STR, &(o)->eval_path, NULL, eval_help},                                                 \
    {"--out", OPT_STR, &(o)->out, NULL, "output directory: checkpoint-STEP/ (HF model + state), metrics.jsonl"}, \
    {"--resume", OPT_STR, &(o)->resume, NULL, "continue from a checkpoint directory (out/checkpoint-STEP)"},     \
    TRAIN_OVERWRITE_OPTION(o),                                                                                   \
    TENSORBOARD_OPTION(&(o)->tensorboard), SAVE_DTYPE_OPTION(&(o)->save_dtype_name)
#define TRAIN_STEP_OPTIONS(o, seq_help, batch_help, lr_default)                                                    \
    {"--seq-len", OPT_INT, &(o)->seq_len, "512", seq_help},                                                       \
    {"--batch-size", OPT_INT, &(o)->batch_size, "4", batch_help},                                                 \
    {"--micro-batches", OPT_INT, &(o)->M, "1", "micro-batches per step per dp rank (accumulation; pipeline)"},     \
    {"--epochs", OPT_INT, &(o)->epochs, "1", "passes over the data"},                                              \
    {"--max-steps", OPT_INT, &(o)->max_steps, "0", "optimizer steps (0 = what --epochs gives); sets the LR schedule"}, \
    {"--stop-after", OPT_INT, &(o)->stop_after, "0", "stop (saving) after this step, as if killed there (0 = off)"}, \
    {"--lr", OPT_FLOAT, &(o)->lr, lr_default, "peak learning rate"},                                               \
    {"--min-lr", OPT_FLOAT, &(o)->min_lr, "0", "learning-rate floor"},                                             \
    {"--warmup", OPT_INT, &(o)->warmup, "0", "linear warmup steps"},                                               \
    {"--lr-schedule", OPT_STR, &(o)->schedule_name, "cosine", "cosine | linear | constant"},                       \
    {"--weight-decay", OPT_FLOAT, &(o)->wd, "0.0", "AdamW decoupled weight decay (not on norms and biases)"},       \
    {"--beta1", OPT_FLOAT, &(o)->beta1, "0.9", "AdamW"},                                                           \
    {"--beta2", OPT_FLOAT, &(o)->beta2, "0.999", "AdamW"},                                                         \
    {"--eps", OPT_FLOAT, &(o)->eps, "1e-8", "AdamW"},                                                              \
    {"--clip", OPT_FLOAT, &(o)->clip, "1.0", "global gradient-norm clipping (0 = off)"},                           \
    {"--recompute", OPT_STR, &(o)->recompute_name, "none", "full: keep only layer inputs, recompute in backward (less memory)"}, \
    SEQ_PARALLEL_OPTION(&(o)->sp),                                                                                 \
    ZERO_OPTION(&(o)->zero),                                                                                       \
    {"--moe-z-loss-coef", OPT_FLOAT, &(o)->moe_z_coef, "0",                                                        \
     "MoE: + coef x mean_t logsumexp(router logits)^2 per MoE layer (ST-MoE's router z-loss; 0 = off)"}
/* LoRA adapters (runtime/lora.h; sft): the base frozen, A and B trained, PEFT's adapter saved */
#define TRAIN_LORA_OPTIONS(o)                                                                                      \
    {"--lora-r", OPT_INT, &(o)->lora_r, "0", "LoRA rank: train adapters on the frozen model (0 = full training)"},   \
    {"--lora-alpha", OPT_FLOAT, &(o)->lora_alpha, "16", "LoRA alpha: the adapters' scale is alpha / r"},             \
    {"--lora-target", OPT_STR, &(o)->lora_target, "all-linear",                                                     \
     "all-linear, or a comma list of q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"},                     \
    {"--lora-rslora", OPT_FLAG, &(o)->lora_rslora, NULL, "rank-stabilised LoRA: scale alpha / sqrt(r)"},            \
    {"--lora-dropout", OPT_FLOAT, &(o)->lora_dropout, "0", "LoRA: dropout on each adapter's input in training (masks from --seed)"}, \
    {"--merge", OPT_FLAG, &(o)->merge, NULL, "with --lora-r: also write OUT/merged, the model with the adapters merged"}
/* single rows ppo shares too (rlhf/ppo.c: its TrainOptions) */
#define TRAIN_OVERWRITE_OPTION(o)                                                                                  \
    {"--overwrite", OPT_FLAG, &(o)->overwrite, NULL, "allow an existing --out"}
#define TRAIN_SAVE_LIMIT_OPTION(o)                                                                                 \
    {"--save-total-limit", OPT_INT, &(o)->save_limit, "0", "keep only the newest N complete checkpoints (0 = all)"}
#define TRAIN_LOG_EVERY_OPTION(o)                                                                                  \
    {"--log-every", OPT_INT, &(o)->log_every, "1", "steps between progress lines"}
#define TRAIN_SKIP_OPTION(o)                                                                                       \
    {"--skip-bad-lines", OPT_FLAG, &(o)->skip_bad, NULL, "skip malformed records (counted) instead of stopping"}
#define TRAIN_CHAT_OPTION(o)                                                                                       \
    {"--chat-template", OPT_STR, &(o)->chat_template, NULL, "chat format for messages (default: the tokenizer's)"}
#define TRAIN_LOG_OPTIONS(o)                                                                                       \
    {"--seed", OPT_INT, &(o)->seed, "1234", "data shuffling seed"},                                                \
    {"--eval-every", OPT_INT, &(o)->eval_every, "0", "steps between evals (0 = only before and after)"},           \
    {"--save-every", OPT_INT, &(o)->save_every, "0", "steps between checkpoints (0 = only at the end)"},           \
    TRAIN_SAVE_LIMIT_OPTION(o), TRAIN_LOG_EVERY_OPTION(o),                                                        \
    MESH_OPTIONS(&(o)->tp, &(o)->pp, &(o)->ep, &(o)->threads, &(o)->dtype_name, &(o)->kv_dtype_name, &(o)->bf16_dot_name), \
    DEVICE_OPTION(&(o)->device), COMM_TIMEOUT_OPTION(&(o)->comm_timeout)

/* The checks every trainer shares (sft, rm, dpo and ppo, whose TrainOptions holds its run and
 * optimizer settings), each a user_error line naming the flag:
 * run_options_check: --dtype and --save-dtype (parsed into o->dtype, o->save_dtype),
 *   --save-total-limit, a new --out (no --resume, no --overwrite: trainer_check_new_out), --tensorboard's directory, then the thread count
 *   (o->threads: the count in use). The device is the caller's to open: one mesh's
 *   (train_options_check), or each role group's (ppo: rlhf/roles.h).
 * optim_options_check: --zero, --sequence-parallel (tp: the largest tp of the trained meshes;
 *   sp_refusal: the line's text after "--sequence-parallel: " when it is below 2), --lora-r,
 *   --lora-dropout and --merge. */
void run_options_check(TrainOptions *o);
/* --moe-z-loss-coef: a finite number >= 0, and (c: the trained model's config, NULL: not yet known)
 * non-zero only on a Mixture-of-Experts model; a user_error line otherwise */
void train_moe_z_check(float coef, const ModelConfig *c);
void optim_options_check(const TrainOptions *o, int tp, const char *sp_refusal);
/* sft's, rm's and dpo's: the required flags, the step and optimizer settings, the two above, a
 * --resume that fits --model (and --lora-r), then the device (o->be, runtime/device.h device_open: any
 * layout and ZeRO stage). Call before loading the model.
 * user_error lines start with cmd. */
void train_options_check(TrainOptions *o, const char *cmd);

/* One metric of a step: "key" in metrics.jsonl (%.9g); line: the progress line's "label fmt" for
 * it (NULL: metrics only). */
typedef struct {
    const char *key;
    double value;
    const char *line;
} Metric;
enum { TRAIN_MAX_METRICS = 16 };

/* What a command adds to the loop. Every callback runs on every rank of the mesh (they may be
 * collective) and may be NULL. ctx is the command's. */
typedef struct {
    const LossHook *hook;
    void *ctx;
    DataConfig data;       /* the command's data settings (preference, pack, ...); the loop sets the
                              shared ones (seq_len, batch_size, seed, epochs, shuffle, ...) */
    int pairs;             /* the summary counts a micro-batch in pairs (batch_size), not tokens */
    /* after the data is open: buffers for M micro-batches of up to max_tokens tokens, max_seq
     * per sequence */
    void (*setup)(void *ctx, int max_tokens, int max_seq, int M);
    void (*mem_plan)(void *ctx, MemPlan *plan);
    /* before each step's learner_step */
    void (*prepare_step)(void *ctx, Step *st);
    /* after it: fills up to TRAIN_MAX_METRICS metrics (the same on every rank), returns how many */
    int (*step_metrics)(void *ctx, const LearnerStep *r, const Step *st, Metric *out);
    /* a pass over the eval set at `step`; when: "before", "" (every --eval-every) or "after";
     * writes its own progress and metrics lines (the writer's metrics are NULL elsewhere; a resumed
     * run's "before" pass gets a log that writes nothing unless the uninterrupted run has an eval
     * line at that step, so the file stays equal to that run's) */
    void (*evaluate)(void *ctx, TrainActs *slot, Data *val, int step, const char *when, MetricsLog *ml);
} TrainTask;

/* The run: every rank of m's mesh calls it with the same options. m holds the starting weights
 * (the checkpoint's on --resume). Returns when the last checkpoint is saved. */
void train_run(const TrainOptions *o, Model *m, const TrainTask *t);
#endif
