/* async.h — `tandem ppo --rollout-ranks N [--async-lag L]`: the actor's rollouts generated on ranks of
 * their own (the rollout role, rlhf/roles.h: exact copies of the actor's shards, its tp and pp, any
 * dp), L steps ahead of the trainer, with bounded staleness.
 *   lag 0   synchronous: batch k is generated from weights version k (the weights after k updates),
 *           then trained; the same batches, bits and weights as the colocated run (same actor layout)
 *   lag L   lock-step pipeline: during step k the rollout ranks generate batch k + L from version k
 *           while the trainer ranks train on batch k; batches 0 .. L are generated from version 0 (the
 *           prologue), so batch j comes from version max(0, j - L): staleness min(j, L) <= L
 * Two sides: the trainer ranks (every other role) run the step's collectives over their own world
 * (Roles.world); the rollout ranks over theirs. Between them, over the job (Roles.job), only:
 *   batch     rollout root -> job rank 0, then a broadcast over the trainer side: the rollout's packed
 *             Experience (tokens, targets, loss mask, behaviour logprobs, lengths, finish, draw,
 *             version), with the rollout's seconds generating it and waiting before it
 *   weights   each actor rank of dp rank 0 -> the rollout rank of its tp and pp coordinates and dp rank
 *             0, then a broadcast over the rollout's dp: the parameter arena, byte for byte, with a
 *             64-bit checksum that the receiver checks on its own arena after loading it
 * in a fixed order, so nothing waits on anything but its peer: the trainer takes batch k at the start
 * of step k (receiving it if it has not yet), and at the end of step k receives batch k + L (L >= 1),
 * then sends version k + 1 when a later batch needs it; the rollout, for each batch j, receives the
 * versions up to max(j - L, first) first. Decoupled PPO corrects the lag (rlhf/ppo_loss.h).
 * Resume: the batches in flight at a checkpoint (steps k+1 .. k+L) are saved in it (inflight.bin),
 * so a resumed run trains on the uninterrupted run's batches, bit for bit, at any lag.
 * Owns: the pipeline's state, the two exchanges, the rollout ranks' loop, the in-flight batches'
 * file. Does not own: generation (experience_rollout), the step (rlhf/ppo.c). */
#ifndef TANDEM_ASYNC_H
#define TANDEM_ASYNC_H
#include "rlhf/experience.h"

typedef struct {
    double wait_s;            /* trainer: seconds waiting for batches this step */
    double sync_bytes, sync_s;/* trainer: the weights sent this step (every actor sender's bytes; the slowest's s) */
    double gen_s, idle_s;     /* rollout: generating the last batch received, and waiting for weights before it */
    double stale_mean, stale_max, diff_max;   /* the batch's staleness; max |prox - behaviour| where fresh */
    int n_fresh;              /* its sequences from the current version (where diff_max is checked) */
} AsyncStats;

typedef struct {
    int on, lag;              /* a rollout role; --async-lag */
    int step0, last, limit;   /* the first and one-past-last trained steps; batches generated: [step0, limit) */
    int S, max_len;
    size_t blob_bytes;        /* a packed batch */
    char **q;                 /* (lag + 1) packed batches, batch j at j % (lag + 1) (trainer ranks) */
    int next;                 /* the next batch to receive (trainer) or generate (rollout) */
    size_t wbytes;            /* the actor's arena on this rank (senders and receivers) */
    AsyncStats st;
} AsyncPipe;

/* Sizes the pipe for a run of steps [step0, last) of `steps`: batches up to min(last + lag, steps)
 * are generated. Loads the in-flight batches of a resumed checkpoint (resume: its directory, or
 * NULL): a user_error naming the file when the checkpoint's lag or batches are not this run's. */
void async_open(AsyncPipe *a, const Roles *rs, int lag, int S, int max_len, int step0, int last, int steps,
                const char *resume);
void async_close(AsyncPipe *a);
/* Both sides, once after setup: the actor's weights (version step0) to the rollout ranks. */
void async_initial_sync(AsyncPipe *a, Roles *rs);
/* The rollout ranks' whole run: receive weights, generate, send, until the last batch. */
void async_rollout_loop(AsyncPipe *a, ExperienceMaker *x, Roles *rs);
/* Trainer ranks, step k's start: batch k into b (pidx: its prompts); the waiting in a->st. */
void async_take(AsyncPipe *a, ExperienceMaker *x, const Roles *rs, int step, int *pidx, Experience *b);
/* The number of b's sequences sampled by the weights of `step` (staleness 0). */
int async_fresh(const Experience *b, int step);
/* Trainer ranks, after the prox pass: staleness and the exactness check where the batch is of the
 * current version (max |prox - behaviour| must be 0; user_error naming the step otherwise). */
void async_check(AsyncPipe *a, const Experience *b, int step);
/* Trainer ranks, step k's end: the batch k + lag received (lag >= 1), then weights version k + 1 sent
 * when a later batch needs them. */
void async_end_step(AsyncPipe *a, Roles *rs, int step);
/* The in-flight batches after step `step` (steps step .. step + lag - 1, those generated), packed
 * for the checkpoint: *n of them; returns the buffer (NULL when none; the caller frees it). */
char *async_inflight(const AsyncPipe *a, int step, int *n, size_t *bytes);
#endif
