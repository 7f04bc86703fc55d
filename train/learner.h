/* learner.h — one trained model's training step as an object: the model it updates, its optimizer
 * (AdamW, plain or ZeRO-1), the gradient arena with the model's layout, and the activation slots
 * of the 1F1B pipeline. One step reads like llm.c's four lines:
 *
 *     optim_zero_grad;  schedule_1f1b (forward + hook + backward of M micro-batches);  optim_step
 *
 * Used by sft, rm and dpo (train/trainer.c's loop), the two trained roles of ppo (actor, critic)
 * and `tandem bench --train`.
 * Owns: the optimizer, the gradient arena, the activation slots, the step's order, and saving /
 * resuming them (the weights as an HF directory, the optimizer's state layout-free in it).
 * Does not own: the model's weights (the caller loaded them), data, the loss (the hook), logging,
 * the loop, the trainer's own state file (trainer_state.json, ppo_state.json). */
#ifndef TANDEM_LEARNER_H
#define TANDEM_LEARNER_H
#include "train/grad.h"
#include "train/optim.h"

typedef struct {
    Model *m;              /* the trained model (on its own mesh: m->mesh) */
    Optim *opt;
    float *grads;          /* (optim_grad_floats(opt)) gradient arena, the parameter arena's layout (the
                              model's backend's memory, as the optimizer state and the slots); NULL
                              under ZeRO-2 */
    GradSink sink;         /* the gradients as tensors (views into grads; ZeRO-2: into the optimizer's
                              unit buffers, each layer reduce-scattered after its backward) */
    LayerWeights *gl;      /* (L_local) */
    TrainActs *slots;      /* (n_slots) one per micro-batch in flight: min(pp, micro-batches) */
    int n_slots;
    DType save_dtype;      /* learner_save's weights (DTYPE_AUTO, learner_init's default: the model's) */
    float moe_z_coef;      /* MoE: the router z-loss's coefficient (--moe-z-loss-coef; 0, learner_init's
                              default: none; TrainActs.moe_z_coef) */
    double *moe_tokens;    /* MoE: (E) LearnerStep.moe_tokens' buffer; else NULL */
} Learner;

/* What one step gives back, the same on every rank of the mesh. */
typedef struct {
    float loss;            /* the hook's summed loss over this rank's micro-batches (last stage's,
                              shared over pp; not summed over dp) */
    float grad_norm;       /* global gradient norm before clipping */
    float lr;              /* the learning rate the step used */
    const char *non_finite;/* NULL: the step was applied. Else what was NaN or inf ("the loss" on
                              some rank of the mesh, "the gradient norm") and the step was NOT applied
                              (weights, moments and the optimizer's step count are as before it):
                              the caller stops the run */
    float moe_aux;         /* MoE with config.json's output_router_logits: the mean over this rank's
                              micro-batches of HF's load-balancing loss (unscaled; TrainActs.moe_aux_coef),
                              in the loss times router_aux_loss_coef; else 0 */
    float moe_load_max;    /* MoE: the busiest expert's share of the step's (token, choice) pairs over
                              every layer and rank, times E (1: balanced; E: one expert takes all); else 0 */
    float moe_load_min;    /* the idlest expert's, times E (0: an expert no token chose) */
    float moe_balance;     /* MoE: HF's load-balancing loss of the step's routing taken as one batch,
                              E sum_e f_e P_e over every layer, micro-batch and dp rank (one micro-batch
                              at dp 1: moe_aux exactly); else 0 */
    float moe_z;           /* MoE with Learner.moe_z_coef: the router z-loss (unscaled) of the step, the
                              mean over the layers, micro-batches and dp ranks of mean_t lse_t^2, as
                              Megatron-Core logs z_loss; else 0 */
    const double *moe_tokens; /* MoE: (E) the (token, choice) pairs routed to each expert in the step,
                              summed over every layer, micro-batch and dp rank (Learner-owned; valid
                              until the next step); else NULL */
    int moe_n_experts;     /* E (MoE), else 0 */
} LearnerStep;

/* Sizes everything up front: slots for micro-batches of up to max_tokens tokens (max_seq per
 * sequence), enough for n_micro micro-batches per step on this pp; flags: train_acts_init's
 * (TRAIN_RECOMPUTE: keep only layer inputs; TRAIN_SEQ_PARALLEL). Collective over m's tp group. */
void learner_init(Learner *L, Model *m, OptimConfig oc, int max_tokens, int max_seq, int n_micro, int flags);
void learner_free(Learner *L);
/* One optimizer step over M micro-batches of this dp rank (collective over the mesh):
 * zero the gradients, 1F1B forward + hook + backward, AdamW (dp reduction, clipping, ZeRO-1).
 * A step whose loss (on any rank) or global gradient norm is not finite is not applied and comes
 * back with non_finite set, the same on every rank of the mesh. */
LearnerStep learner_step(Learner *L, const MicroBatch *mbs, int M, const LossHook *hook);
/* Adds the learner's parts to a memory plan: gradients, moments, activation slots. */
void learner_mem_plan(const Learner *L, MemPlan *plan);
/* dir: the weights as an HF directory (checkpoint_save_model from src_dir's config and tokenizer,
 * atomic), then the optimizer's state in it, layout-free (optim_state_save: dir/optimizer/).
 * Collective over the mesh. Returns 0, or -1 on every rank when a file could not be written: err
 * (CHECKPOINT_ERR_CAP bytes) then holds the line naming it (printed by nobody) and dir is gone (the
 * weights alone are no checkpoint); the caller stops the run. */
int learner_save(Learner *L, const char *src_dir, const char *dir, char *err);
/* Continues from dir (what learner_save wrote, at any layout): the optimizer's moments (and master)
 * resharded onto this layout and its step (optim_state_load), so a resume at the same layout is bit
 * for bit. A checkpoint of an earlier build (one optim.rankR.bin per rank) loads only at the layout
 * that saved it (same_layout: this rank's file); at another it is a user_error saying so. The weights
 * were loaded with the model. */
void learner_resume(Learner *L, const char *dir, int same_layout);
#endif
