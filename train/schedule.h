/* schedule.h — the order of forward and backward micro-batch steps on each pipeline stage.
 * Owns only ordering: train_forward / train_loss_backward (train/grad.c) move tensors between
 * stages; this file decides when each stage runs which micro-batch (Megatron's split of
 * p2p_communication.py and schedules.py). */
#ifndef TANDEM_SCHEDULE_H
#define TANDEM_SCHEDULE_H
#include "train/grad.h"

/* One optimizer step's forward and backward over M micro-batches, 1F1B order:
 *   stage s runs min(pp - s - 1, M) warm-up forwards, then alternates one forward and one backward,
 *   then drains the remaining backwards; at most min(pp, M) micro-batches are in flight, each in
 *   its own TrainActs slot (slots[i % n_slots]).
 * Each micro-batch's loss and gradient come from the hook (train/grad.h). Gradients accumulate
 * into grads; returns the step's summed loss on every rank. */
float schedule_1f1b(Model *m, TrainActs *slots, int n_slots, const MicroBatch *mbs, int M, const LossHook *hook,
                    GradSink *grads);
#endif
