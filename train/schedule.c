/* schedule.c — see schedule.h. Sends are non-blocking (train/grad.c posts them on the slot) and
 * receives block, so neighbours exchanging activations and gradients at the same time cannot
 * deadlock; a slot waits for its previous send before its buffers are reused. */
#include "train/schedule.h"
#include "runtime/lora.h"
#include "runtime/util.h"

static void run_forward(Model *m, TrainActs *slots, int n_slots, const MicroBatch *mbs, int i) {
    slots[i % n_slots].lora_key = lora_micro_key(m, i);   /* LoRA dropout's masks, kept for the backward */
    train_forward(m, &slots[i % n_slots], mbs[i].tokens, mbs[i].seq_start, mbs[i].n_seqs);
}
static float run_backward(Model *m, TrainActs *slots, int n_slots, const MicroBatch *mbs, int i, const LossHook *hook,
                          GradSink *g) {
    return train_loss_backward(m, &slots[i % n_slots], &mbs[i], hook, g);
}

float schedule_1f1b(Model *m, TrainActs *slots, int n_slots, const MicroBatch *mbs, int M, const LossHook *hook,
                    GradSink *grads) {
    int pp = m->mesh->pp, s = m->mesh->pp_rank;
    int warmup = pp - s - 1 < M ? pp - s - 1 : M;
    CHECK(n_slots >= (pp < M ? pp : M));
    double loss = 0.0;
    for (int i = 0; i < warmup; i++) run_forward(m, slots, n_slots, mbs, i);            /* fill */
    for (int i = 0; i < M - warmup; i++) {                                              /* steady: 1F1B */
        run_forward(m, slots, n_slots, mbs, warmup + i);
        loss += run_backward(m, slots, n_slots, mbs, i, hook, grads);
    }
    for (int i = M - warmup; i < M; i++) loss += run_backward(m, slots, n_slots, mbs, i, hook, grads); /* drain */
    for (int i = 0; i < n_slots; i++) {
        train_acts_wait(&slots[i]);
        slots[i].lora_key = 0;   /* eval's forwards: no dropout */
    }
    train_tied_embedding_all_reduce(m, &slots[0], &grads->w);    /* tied table used on two stages */
    moe_ep_fold_grads(m, &grads->w);                             /* ep > 1: the sources' expert gradients */
    return train_loss_share(m, (float)loss);
}
