/* sampler.h — next-token sampling: logits processors in Hugging Face's order and a counter-based draw.
 *
 * Owns: SamplingParams (defaults, validation), sampler_process (penalties and warpers applied in place
 * to one row of logits), sampler_truncate (the kept set of the warpers on a raw row: PPO's truncated
 * policy), sampler_draw (one token from softmax of a processed row), sampler_uniform (the random
 * number behind a draw).
 * Does not own: the model, logprobs reported to the user (model_logsumexp over the raw logits),
 * batching, stop strings, communication. Everything here is pure math on one row of V floats.
 *
 * Order (transformers 4.47 generate(); vLLM for the OpenAI penalties):
 *   1. repetition penalty  every distinct token of prompt + output, once: s < 0 ? s * r : s / r
 *                          (RepetitionPenaltyLogitsProcessor)
 *   2. presence/frequency  OpenAI, over OUTPUT tokens only: s -= presence * (count > 0) + frequency * count
 *   3. temperature         s / t (TemperatureLogitsWarper). t == 0 means greedy: stop here, draw argmax.
 *   4. top-k               drop s < k-th largest s; ties with the k-th are kept (TopKLogitsWarper)
 *   5. top-p               sort ascending, cumulative softmax; drop tokens whose cumulative prob
 *                          <= 1 - top_p; the largest is always kept (TopPLogitsWarper)
 *   6. min-p               drop tokens with prob < min_p * max prob, probs = softmax of the current
 *                          scores (MinPLogitsWarper)
 * A processor at its "off" value (see SamplingParams) is skipped, as generate() skips it. Dropped
 * entries become -INFINITY.
 *
 * Determinism: the uniform used at output step `step` is sampler_uniform(seed, step), a pure function
 * of (seed, step). A sequence's tokens depend only on its logits and its seed, never on batch size,
 * batch composition or the parallel layout. */
#ifndef TANDEM_SAMPLER_H
#define TANDEM_SAMPLER_H
#include <stddef.h>
#include <stdint.h>

typedef struct {
    float temperature;        /* 0 = greedy (argmax), and so is anything below 1e-5; valid >= 0 */
    int top_k;                /* 0 = off; valid >= 0 */
    float top_p;              /* 1 = off; valid (0, 1] */
    float min_p;              /* 0 = off; valid [0, 1] */
    float repetition_penalty; /* 1 = off; valid >= 1e-6 (smaller ones overflow positive logits to inf) */
    float presence_penalty;   /* 0 = off; valid [-2, 2] (OpenAI) */
    float frequency_penalty;  /* 0 = off; valid [-2, 2] (OpenAI) */
    uint64_t seed;
} SamplingParams;

/* temperature 1, top_k 0, top_p 1, min_p 0, repetition 1, presence 0, frequency 0, seed 0 */
void sampling_params_default(SamplingParams *p);

/* NULL if every field is valid, else a message naming the first bad field and its value, e.g.
 * "top_p must be in (0, 1], got 1.5". NaN is rejected everywhere. The message lives in a static
 * buffer (not thread-safe); copy it before the next call. */
const char *sampling_params_check(const SamplingParams *p);

/* Greedy: temperature below 1e-5 (vLLM's _SAMPLING_EPS). Dividing by a smaller one would push
 * logits to +-inf (1e-40 turns a whole row into inf - inf = NaN), and the softmax is then an argmax. */
static inline int sampler_is_greedy(const SamplingParams *p) { return p->temperature < 1e-5f; }

/* Bytes of scratch sampler_process needs for a row of V: V floats + V (float, int) pairs. */
size_t sampler_scratch_bytes(int V);

/* Applies steps 1-6 above in place. p must pass sampling_params_check.
 *   logits  (V)         one row, fp32
 *   prompt  (n_prompt)  token ids in [0, V); duplicates allowed
 *   output  (n_output)  ids generated so far, in [0, V)
 *   scratch             at least sampler_scratch_bytes(V) bytes, any alignment of a malloc'd block;
 *                       NULL to have it malloc'd and freed inside this call.
 * Work: O(V + n_prompt + n_output), a quickselect for top-k (average O(V)), and for top-p a
 * quickselect plus a sort of the tokens near the nucleus (at least 1024 or all finite ones, fewer
 * after top-k). */
void sampler_process(float *logits, int V, const SamplingParams *p, const int *prompt, int n_prompt,
                     const int *output, int n_output, void *scratch);

/* The warpers truncate the distribution (top-k, top-p or min-p on, not greedy): the policy that
 * samples is then softmax over a kept set, not the full softmax. */
static inline int sampler_truncates(const SamplingParams *p) {
    return !sampler_is_greedy(p) && (p->top_k > 0 || p->top_p < 1.0f || p->min_p > 0.0f);
}

/* The kept set of the truncated policy on one raw row (PPO: the rollout and the training forward
 * call it on the same gathered row, so they keep the same set). p must pass sampling_params_check
 * and have no penalties (repetition 1, presence 0, frequency 0: they depend on the history).
 *   row        (V)  raw logits; entries that sampler_process leaves -INFINITY become -INFINITY,
 *                   every other entry keeps its bits (raw: NOT divided by the temperature), so the
 *                   log-softmax of row / temperature is the kept set's renormalised logprob
 *   processed  (V)  out: sampler_process's row (what sampler_draw draws from)
 *   scratch         as sampler_process's
 * Returns the number of entries kept (>= 1 when the row has a finite maximum). Greedy p: nothing is
 * dropped. Work: sampler_process's plus one pass. */
int sampler_truncate(float *row, int V, const SamplingParams *p, float *processed, void *scratch);

/* One token drawn from softmax(logits) (V) by inverse CDF with u = sampler_uniform(p->seed, step).
 * -INFINITY entries are never drawn; returns -1 when there is nothing to draw from: a NaN or +inf
 * logit, or no finite one (a broken model: the caller reports it).
 * Greedy (sampler_is_greedy): argmax, lowest id on ties, NaN skipped (as model_argmax); -1 only
 * when every logit is NaN. */
int sampler_draw(const float *logits, int V, const SamplingParams *p, int step);

/* Uniform in [0, 1) with 53 random bits: splitmix64 output number `step` of a stream whose start is
 * splitmix64's mix of `seed`. Pure function of (seed, step). */
double sampler_uniform(uint64_t seed, uint64_t step);

#endif
