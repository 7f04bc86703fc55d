/* session.h — the prelude of the inference commands (generate, eval, bench, rm --score): their
 * shared settings (ModelOpen; generate's, eval's and bench's rows: MODEL_OPEN_OPTIONS) and
 * model_open, which applies them in one order: --comm-timeout, --threads, --dtype, --device, the
 * world's mesh, the model, --adapter.
 * Owns: that order. Does not own: parsing (each command's table, runtime/args.h), a command's own
 * checks (made before model_open), the trainers' prelude (train/trainer.h train_options_check). */
#ifndef TANDEM_SESSION_H
#define TANDEM_SESSION_H
#include "runtime/args.h"
#include "runtime/mesh.h"
#include "runtime/model.h"

typedef struct {
    const char *dir;               /* --model (a directory once parsed) */
    const char *adapter;           /* --adapter: merged into the weights after the load (NULL: none) */
    const char *dtype_name, *device;   /* --dtype (runtime/device.h dtype_parse), --device */
    const char *kv_dtype_name, *bf16_dot_name;   /* --kv-dtype, --cpu-bf16-dot (kernel_options_set) */
    int tp, pp, ep, threads;           /* threads: 0 = the cores available; model_open sets the count in use */
    float comm_timeout;            /* --comm-timeout */
    int score_head;                /* a reward model: the directory's score head, else a new one (seed 1) */
} ModelOpen;

/* The rows --tp, --pp, --ep, --threads, --dtype, --device, --comm-timeout (ModelOpen *s) */
#define MODEL_OPEN_OPTIONS(s)                                                                     \
    MESH_OPTIONS(&(s)->tp, &(s)->pp, &(s)->ep, &(s)->threads, &(s)->dtype_name, &(s)->kv_dtype_name, &(s)->bf16_dot_name), \
        DEVICE_OPTION(&(s)->device),                                                                  \
        COMM_TIMEOUT_OPTION(&(s)->comm_timeout)

/* After comm_init, args_parse and the command's checks: sets the communication deadline and the
 * thread count (s->threads), opens the device, cuts the world's mesh (tp x pp, dp the rest) and
 * loads s->dir onto it (model_load, or model_load_score with s->score_head), then merges s->adapter.
 * Every rank calls it; a bad setting is one user_error line naming the flag. Free with model_free,
 * then mesh_free. */
void model_open(ModelOpen *s, Mesh *mesh, Model *m);
#endif
