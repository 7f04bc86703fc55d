/* optim_state.h — an optimizer's state on disk, layout-free (Megatron's distributed checkpointing,
 * PyTorch DCP): a checkpoint saved at any tp x pp x dp x zero resumes at any other with its AdamW
 * moments (and fp32 master) resharded, not restarted. In a checkpoint directory DIR:
 *
 *     DIR/optimizer/exp_avg/       AdamW's first moments as an HF directory of tensors:
 *                                  model-0000s-of-0000P.safetensors + model.safetensors.index.json,
 *                                  the model's own tensor names and full HF shapes, F32
 *     DIR/optimizer/exp_avg_sq/    the second moments, the same way
 *     DIR/optimizer/master/        BF16 weights only: the fp32 master weights, the same way
 *     DIR/optimizer/optimizer.json {"format": "tandem-optimizer", "version": 1, "step", "dtype",
 *                                  "sections", and the layout that wrote it (for the reader)}:
 *                                  written last, so the state is complete once it is there
 *
 * Saving: each section goes through the weights' machinery (checkpoint_save_tensors: tp gather,
 * one file per pp stage, padded vocab rows dropped, one copy of each replica, no tied lm_head) from
 * a source that first gathers each tensor's ZeRO-1 slices over dp (tensor by tensor: never more
 * than one tensor's state in host memory). Loading: every rank reads its own block of each tensor
 * (ParamInfo's row0/col0/rows/cols, as model_load reads the weights: vocab padding rows zero, a
 * replicated kv head read by each replica, a tied lm_head copy from model.embed_tokens.weight) and
 * keeps the part in its ZeRO-1 slice. Values are fp32 copied, never recomputed, so a resume at the
 * same layout is bit for bit, and any layout's optimizer holds exactly the state the saving one held.
 * Why every copy may be dropped or duplicated: replicas (tp copies of norms, of replicated kv
 * heads, of the score head; a tied embedding's copy on the last stage) get identical gradients
 * (train/grad.c) and so hold identical state; padded vocab rows get zero gradients and keep zero
 * moments (and a zero master); ZeRO-1's arena tail past the parameters is zero.
 * Does not own: the step arithmetic (train/optim.c), the weights (train/checkpoint.c), the trainer's
 * state files (step, RNG, data cursor). */
#ifndef TANDEM_OPTIM_STATE_H
#define TANDEM_OPTIM_STATE_H
#include "train/optim.h"

#define OPTIM_STATE_DIR "optimizer"          /* under a checkpoint directory */
#define OPTIM_STATE_FILE "optimizer.json"    /* under OPTIM_STATE_DIR, written last */

/* Writes o's state (of model m, on o's mesh) into dir/optimizer/. Collective over the mesh.
 * Returns 0 on every rank, or -1 on every rank with the line naming the file that could not be
 * written in err (CHECKPOINT_ERR_CAP bytes). */
int optim_state_save(const Optim *o, const Model *m, const char *dir, char *err);
/* Whether dir holds a complete layout-free optimizer state (dir/optimizer/optimizer.json). */
int optim_state_present(const char *dir);
/* The dtype a full-training --resume from dir runs at: `given` (--dtype) unless it is DTYPE_AUTO, then
 * the weights' dtype the state in dir/optimizer/ was saved with (optimizer.json's "dtype": BF16 state
 * holds the fp32 master, and its run's weights were bf16 whatever --save-dtype wrote: the saved
 * weights may be another dtype), DTYPE_AUTO when there is no readable one (optim_state_load reports it). */
DType optim_state_dtype(const char *dir, DType given);
/* Reads dir/optimizer/ into o (a fresh optimizer of model m, any layout) and sets o->step.
 * Collective only in that every rank reads the same files. A missing or unreadable optimizer.json,
 * another format or version, another dtype (BF16 state needs BF16 weights: --dtype bf16, or auto), a section whose tensors
 * are not the checkpoint's own (names, shapes), a truncated or corrupt file: one user_error line
 * naming the file. A non-finite value in this rank's block: rank_error naming file and tensor. */
void optim_state_load(Optim *o, const Model *m, const char *dir);
#endif
