/* trainer.h — what every training command (sft, rm, dpo) shares around the training step: a
 * step's micro-batches for this dp rank, and checkpoints with their trainer state.
 * Owns: Step (copies of M micro-batches out of Data's buffers; every dp rank reads the same stream
 * and dp rank r keeps micro-batches r, r + dp, ...), out/checkpoint-STEP (HF model + optimizer
 * state per rank + trainer_state.json, written last) and reading it back. */
#ifndef TANDEM_TRAINER_H
#define TANDEM_TRAINER_H
#include "train/data.h"
#include "train/grad.h"
#include "train/optim.h"

/* M micro-batches of this dp rank, copied out of Data's buffers */
typedef struct {
    MicroBatch *mbs;            /* (M) */
    int *tokens, *seq_start, *targets;  /* per micro-batch: (max_tokens), (max_tokens + 1), (max_tokens) */
    float *weight;              /* (max_tokens) per micro-batch */
    float *margin;              /* preference data: (max_tokens) per micro-batch, the pairs' margins */
    int M, max_tokens, n;       /* n: how many were filled */
    long loss_tokens, n_tokens; /* over the whole step (all dp ranks) */
    long n_pairs;               /* preference data: pairs in the whole step (all dp ranks) */
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
 * optim.rankR.bin per rank, then trainer_state.json (rank 0, atomic): a checkpoint without it is
 * incomplete. Collective over m's mesh. A failed model write is reported and the run goes on. */
void trainer_save_checkpoint(Model *m, Optim *o, Data *d, const char *model_dir, const char *out, int step, int keep);
/* --save-total-limit: keeps the newest `keep` complete checkpoints of out (those with
 * trainer_state.json or ppo_state.json), deleting the older complete ones; incomplete ones are left
 * alone, so the newest complete one, which a run resumes from, is never deleted. keep <= 0: all.
 * Call on one rank (the writer), after a checkpoint is complete. */
void trainer_rotate_checkpoints(const char *out, int keep);
/* Reads DIR/trainer_state.json; user_error when it is missing or not ours. */
void trainer_load_state(const char *dir, TrainerState *ts);
/* The resume directory must hold the same architecture as --model (its config.json). */
void trainer_check_same_model(const char *model_dir, const char *resume_dir);
#endif
