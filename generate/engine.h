/* engine.h — the generation engine: a queue of sequences, a paged KV cache, and a scheduler that
 * runs one forward step at a time over every running sequence (prefill of newly admitted ones and
 * one decode token for the rest, in one packed batch: continuous batching; a context larger than
 * the free pool runs alone and is fed in chunks).
 * Owns: admission, block tables, preemption (recompute), sliding-window block freeing, sampling
 * calls, EOS / stop-id / length stops. Does not own text: stop strings and output formatting come
 * through callbacks (generate/generate.c). The ranks of one dp group run the same scheduler on the
 * same inputs; only the last pp stage computes logits and its results are broadcast, so they agree. */
#ifndef TANDEM_ENGINE_H
#define TANDEM_ENGINE_H
#include "generate/sampler.h"
#include "runtime/model.h"

typedef enum { FINISH_NONE = 0, FINISH_STOP, FINISH_LENGTH } FinishReason;

typedef struct {
    int index;             /* input order */
    int *prompt;           /* (n_prompt) */
    int n_prompt;
    SamplingParams sp;
    int max_new, min_new;
    int *stop_ids;         /* (n_stop_ids) EOS ids and --stop-token-ids: finish "stop" */
    int n_stop_ids;
    const int *forced;     /* (max_new) or NULL: append these instead of what is chosen (teacher forcing) */
    int logprobs_n;        /* top-N alternatives per generated token (0 = none) */

    /* results */
    int *out;              /* (max_new) generated ids */
    int n_out;
    float *lp;             /* (max_new) logprob of each appended token under the model's raw distribution
                            * (or the truncated one: EngineConfig.truncated_lp; NaN unless logprobs_n > 0,
                            * forced, or EngineConfig.want_logprobs) */
    int *top_ids;          /* (max_new, logprobs_n) */
    float *top_lp;         /* (max_new, logprobs_n) */
    int *chosen;           /* (max_new) what the engine chose (differs from out only when forced) */
    float *chosen_lp;      /* (max_new) its logprob */
    FinishReason finish;

    /* engine state */
    int *table;            /* block table: block ids by position / block, -1 = freed (out of window) */
    int n_table;
    int n_cached;          /* tokens of prompt ++ out whose k, v are in the cache */
    int n_step;            /* tokens fed in the current step */
} Seq;

typedef struct Engine Engine;
/* Called on every rank after a token is appended to s (s->out[s->n_out - 1]); return 1 to finish
 * the sequence with FINISH_STOP (stop strings). May be NULL. */
typedef int (*StopFn)(void *ctx, Seq *s);
/* Called on every rank when s finishes (its blocks are already released). */
typedef void (*FinishFn)(void *ctx, Seq *s);
/* Called on every rank after each step (e.g. to collect other data-parallel groups' output). */
typedef void (*StepFn)(void *ctx);

typedef struct {
    int max_batch;         /* running sequences at most */
    int max_batch_tokens;  /* tokens in one forward step at most (a longer prompt runs alone, whole
                            * when the pool holds it, else in chunks) */
    size_t kv_bytes;       /* KV cache budget per rank */
    int block;             /* tokens per KV block */
    int max_ctx;           /* positions per sequence at most (max_position_embeddings) */
    int micro_batches;     /* pp > 1: pipelined micro-batches per step (pp keeps every stage busy) */
    int want_logprobs;     /* compute every token's logprob even without --logprobs (else NaN) */
    StopFn on_token;
    FinishFn on_finish;
    void *ctx;
    StepFn on_step;        /* may be NULL */
    int kv_blocks;         /* > 0: the KV pool in blocks of `block` tokens (kv_bytes is then ignored) */
    float lp_temperature;  /* > 0: lp and chosen_lp are logprobs of logits / lp_temperature (PPO's policy
                            * at its sampling temperature: the formula training uses); 0: of the raw
                            * logits. Top-N alternatives (logprobs_n) need the raw ones. */
    int truncated_lp;      /* 1 (PPO with top-k / top-p / min-p): lp and chosen_lp are logprobs under the
                            * truncated, renormalised distribution each token was drawn from: a sampled
                            * row's entries outside sampler_truncate's kept set become -inf in the
                            * logits before the log-sum-exp (train/grad.c recomputes the same set).
                            * Sequences then have no penalties, min_new, forcing or top-N logprobs, and
                            * sample (not greedy). 0: the raw distribution (generate --logprobs). */
} EngineConfig;

/* Sizes the KV cache and the engine's own run state (activations) for `max_len`, the longest prompt +
 * max_new of any sequence that will be added. An engine lives as long as its model: after
 * engine_run, sequences can be added and run again, also after optimizer steps changed the weights
 * in place (nothing derived from the weights outlives a run: every sequence's KV blocks are freed
 * when it finishes, and nothing else is cached). */
Engine *engine_new(Model *m, const EngineConfig *cfg, int max_len);
void engine_free(Engine *e);
/* Queues s (the engine keeps the pointer; s must outlive the run) and returns 0; a sequence that
 * could never fit in the KV cache is not queued: the message (for the caller to report with the
 * input's name and line) is written to err and -1 returned. */
int engine_add(Engine *e, Seq *s, char *err, size_t errlen);
/* engine_add's fit check alone (for sequences another data-parallel group runs: every rank checks
 * every prompt, so the error comes from rank 0 whichever group owns the prompt). */
int engine_check(const Engine *e, const Seq *s, char *err, size_t errlen);
/* Runs until every queued sequence is done. */
void engine_run(Engine *e);
/* Counters for the report. */
typedef struct {
    long prefill_tokens, decode_tokens, steps, preemptions;   /* tokens fed in steps with / without prefill */
    double prefill_s, decode_s;  /* time in steps with / without prefill tokens */
    int kv_blocks, kv_block_tokens, peak_blocks_used;
    double kv_bytes;             /* the KV pool of this rank */
    double act_bytes;            /* the engine's run state (activations) */
} EngineStats;
EngineStats engine_stats(const Engine *e);
void seq_alloc_results(Seq *s);  /* allocates out/lp/... for max_new and logprobs_n */
void seq_free(Seq *s);
#endif
