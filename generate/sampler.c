/* sampler.c — logits processors in Hugging Face's order and a counter-based draw (see sampler.h).
 *
 * Each processor copies the arithmetic of its transformers 4.47 counterpart in fp32, in the same
 * order, so processed logits match HF bit for bit where the math is elementwise (penalties,
 * temperature, top-k). Top-p and min-p compare softmax probabilities against a threshold; there our
 * expf and sum differ from torch's SIMD ones in the last bits, so a token lying within ~1e-7 of the
 * threshold may fall on the other side. Tests keep their cases away from such edges.
 * Nothing here allocates except sampler_process given scratch == NULL. */
#include "generate/sampler.h"
#include "runtime/util.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float v; /* a logit */
    int id;  /* its token id */
} SortEntry;

void sampling_params_default(SamplingParams *p) {
    p->temperature = 1.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->repetition_penalty = 1.0f;
    p->presence_penalty = 0.0f;
    p->frequency_penalty = 0.0f;
    p->seed = 0;
}

const char *sampling_params_check(const SamplingParams *p) {
    static char msg[128];
    /* Written as !(valid) so that NaN, which fails every comparison, is rejected too. */
    if (!(p->temperature >= 0.0f && isfinite(p->temperature)))
        snprintf(msg, sizeof(msg), "temperature must be >= 0 and finite, got %g", p->temperature);
    else if (p->top_k < 0)
        snprintf(msg, sizeof(msg), "top_k must be >= 0 (0 = off), got %d", p->top_k);
    else if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        snprintf(msg, sizeof(msg), "top_p must be in (0, 1], got %g", p->top_p);
    else if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        snprintf(msg, sizeof(msg), "min_p must be in [0, 1], got %g", p->min_p);
    else if (!(p->repetition_penalty >= 1e-6f && isfinite(p->repetition_penalty)))   /* s / 1e-40 is inf */
        snprintf(msg, sizeof(msg), "repetition_penalty must be > 0 (at least 1e-6) and finite, got %g", p->repetition_penalty);
    else if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        snprintf(msg, sizeof(msg), "presence_penalty must be in [-2, 2], got %g", p->presence_penalty);
    else if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        snprintf(msg, sizeof(msg), "frequency_penalty must be in [-2, 2], got %g", p->frequency_penalty);
    else
        return NULL;
    return msg;
}

size_t sampler_scratch_bytes(int V) {
    return (size_t)V * sizeof(SortEntry) + (size_t)V * sizeof(float);
}

/* ---------------------------------------------------------------- processors */

/* RepetitionPenaltyLogitsProcessor: gather, s < 0 ? s * r : s / r, scatter. A token repeated in the
 * history is scattered with the same value, i.e. penalized once. seen (V) is scratch. */
static void apply_repetition(float *logits, int V, float r, const int *prompt, int n_prompt,
                             const int *output, int n_output, float *seen) {
    memset(seen, 0, (size_t)V * sizeof(float));
    for (int i = 0; i < n_prompt + n_output; i++) {
        int id = i < n_prompt ? prompt[i] : output[i - n_prompt];
        CHECK(id >= 0 && id < V);
        if (seen[id] != 0.0f) continue;
        seen[id] = 1.0f;
        float s = logits[id];
        logits[id] = s < 0.0f ? s * r : s / r;
    }
}

/* OpenAI presence/frequency penalties over output tokens: s -= presence * (c > 0) + frequency * c.
 * count (V) is scratch; counts are exact in fp32 up to 2^24. The penalty is built in two statements
 * so that no compiler contracts it into an fma (the reference rounds the product first). */
static void apply_presence_frequency(float *logits, int V, float presence, float frequency,
                                     const int *output, int n_output, float *count) {
    memset(count, 0, (size_t)V * sizeof(float));
    for (int i = 0; i < n_output; i++) {
        CHECK(output[i] >= 0 && output[i] < V);
        count[output[i]] += 1.0f;
    }
    for (int i = 0; i < n_output; i++) {
        int id = output[i];
        float c = count[id];
        if (c == 0.0f) continue; /* already done: a token is penalized once */
        float pen = frequency * c;
        pen = presence + pen;
        logits[id] -= pen;
        count[id] = 0.0f;
    }
}

/* Moves the m largest entries of e (n) to the front, m in [1, n], in no particular order, followed
 * by every other entry equal to the smallest of them; returns the new count m' >= m. e[m' - 1].v is
 * then the m-th largest value (counting duplicates, torch.topk(x, m)[0][-1]) and every entry past
 * m' is strictly smaller. Quickselect with a three-way partition: a run of equal values (-inf after
 * earlier filters) stays together and costs O(n). Average O(n). */
static int select_top(SortEntry *e, int n, int m) {
    int lo = 0, hi = n - 1, want = m - 1; /* index in descending order */
    while (lo < hi) {
        float a = e[lo].v, b = e[lo + (hi - lo) / 2].v, c = e[hi].v;
        float pivot = a > b ? (b > c ? b : (a > c ? c : a)) : (a > c ? a : (b > c ? c : b));
        /* [lo, gt) > pivot, [gt, i) == pivot, (lt, hi] < pivot */
        int gt = lo, i = lo, lt = hi;
        while (i <= lt) {
            SortEntry t = e[i];
            if (t.v > pivot) { e[i] = e[gt]; e[gt] = t; gt++; i++; }
            else if (t.v < pivot) { e[i] = e[lt]; e[lt] = t; lt--; }
            else i++;
        }
        if (want < gt) hi = gt - 1;
        else if (want > lt) lo = lt + 1;
        else return lt + 1; /* [gt, lt] holds every entry equal to the pivot */
    }
    return want + 1; /* a range of one: its value occurs nowhere else */
}

/* TopKLogitsWarper: remove s < (k-th largest s). Ties with the k-th value all stay. ent (V) scratch. */
static void apply_top_k(float *logits, int V, int k, SortEntry *ent) {
    if (k >= V) return; /* the threshold would be the minimum: nothing is removed */
    for (int i = 0; i < V; i++) ent[i] = (SortEntry){logits[i], i};
    float thr = ent[select_top(ent, V, k) - 1].v;
    for (int i = 0; i < V; i++)
        if (logits[i] < thr) logits[i] = -INFINITY;
}

/* Descending by value, descending id among equal values: read backwards, ascending by (value, id),
 * which is what a stable ascending sort gives. */
static int cmp_entry_desc(const void *pa, const void *pb) {
    const SortEntry *a = pa, *b = pb;
    if (a->v != b->v) return a->v > b->v ? -1 : 1;
    return (a->id < b->id) - (a->id > b->id);
}

/* TopPLogitsWarper: sort ascending, probs = softmax, cumsum, remove cumsum <= 1 - top_p, keep the
 * largest. torch's CPU cumsum accumulates in double and stores fp32, and compares against
 * 1 - top_p computed in double and rounded to fp32; we do the same. Entries already -inf have
 * probability 0 and stay removed, so only finite entries take part. Among equal values the lower
 * id comes first in ascending order and is removed first, as with torch.sort(stable=True); torch's
 * default sort agrees for V <= 16 and is unspecified beyond. ent (V) scratch.
 *
 * Not a full sort: the kept tokens are the largest ones, usually few. We move the m largest to the
 * front (select_top); if the probability of all the others, summed, is still <= 1 - top_p, they
 * are all removed (each one's cumulative sum is at most that total) and only the m are sorted, the
 * cumulative sum continuing from that total. Otherwise m grows 8x, up to a full sort. The total is
 * summed in another order than a sort would, which can only matter for a double-precision rounding
 * that lands exactly on an fp32 rounding boundary at the threshold. 128k vocab, Gaussian logits
 * (std 3), temperature 0.8, top_p 0.9 (1114 kept): 17 ms per row with a full qsort, 5 ms this way,
 * process and draw together (one core, -O2). */
static void apply_top_p(float *logits, int V, float top_p, SortEntry *ent) {
    int n = 0;
    float max = -INFINITY;
    for (int i = 0; i < V; i++) {
        if (logits[i] == -INFINITY) continue;
        ent[n++] = (SortEntry){logits[i], i};
        if (logits[i] > max) max = logits[i];
    }
    if (n <= 1) return;
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += expf(ent[i].v - max);
    float inv = (float)(1.0 / sum);                  /* softmax: exp(s - max) * (1 / sum), as torch */
    float thr = (float)(1.0 - (double)top_p);
    double cum = 0.0;                                /* cumulative prob of everything below ent[m) */
    int m = n < 1024 ? n : 1024;
    while (m < n) {
        m = select_top(ent, n, m);
        double rest = 0.0;
        for (int i = m; i < n; i++) rest += expf(ent[i].v - max) * inv;
        if ((float)rest <= thr) {
            for (int i = m; i < n; i++) logits[ent[i].id] = -INFINITY;
            cum = rest;
            break;
        }
        m = m > n / 8 ? n : 8 * m;
    }
    qsort(ent, (size_t)m, sizeof(SortEntry), cmp_entry_desc);
    for (int i = m - 1; i > 0; i--) { /* ascending; i == 0 (the largest) is always kept */
        cum += expf(ent[i].v - max) * inv;
        if ((float)cum > thr) break;
        logits[ent[i].id] = -INFINITY;
    }
}

/* MinPLogitsWarper: probs = softmax(s); remove probs < min_p * max(probs). The largest token is
 * never below the threshold (min_p <= 1), so HF's "keep at least one" needs no sort here. */
static void apply_min_p(float *logits, int V, float min_p) {
    float max = -INFINITY;
    for (int i = 0; i < V; i++)
        if (logits[i] > max) max = logits[i];
    double sum = 0.0;
    for (int i = 0; i < V; i++) sum += expf(logits[i] - max);
    float inv = (float)(1.0 / sum);
    float thr = min_p * inv; /* min_p * max prob; max prob = exp(0) * inv */
    for (int i = 0; i < V; i++)
        if (expf(logits[i] - max) * inv < thr) logits[i] = -INFINITY;
}

void sampler_process(float *logits, int V, const SamplingParams *p, const int *prompt, int n_prompt,
                     const int *output, int n_output, void *scratch) {
    void *owned = NULL;
    if (!scratch) scratch = owned = xmalloc(sampler_scratch_bytes(V));
    SortEntry *ent = scratch;              /* (V) */
    float *work = (float *)(ent + V);      /* (V) repetition marks, then output token counts */

    if (p->repetition_penalty != 1.0f)
        apply_repetition(logits, V, p->repetition_penalty, prompt, n_prompt, output, n_output, work);
    if (p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f)
        apply_presence_frequency(logits, V, p->presence_penalty, p->frequency_penalty, output, n_output, work);
    if (sampler_is_greedy(p)) goto done;   /* greedy: the draw is argmax of the penalized logits */
    if (p->temperature != 1.0f)
        for (int i = 0; i < V; i++) logits[i] /= p->temperature;
    if (p->top_k > 0) apply_top_k(logits, V, p->top_k, ent);
    if (p->top_p < 1.0f) apply_top_p(logits, V, p->top_p, ent);
    if (p->min_p > 0.0f) apply_min_p(logits, V, p->min_p);
done:
    free(owned);
}

int sampler_truncate(float *row, int V, const SamplingParams *p, float *processed, void *scratch) {
    CHECK(p->repetition_penalty == 1.0f && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f);
    memcpy(processed, row, sizeof(float) * V);
    sampler_process(processed, V, p, NULL, 0, NULL, 0, scratch);
    int kept = 0;
    for (int i = 0; i < V; i++) {
        if (processed[i] == -INFINITY) row[i] = -INFINITY;
        else kept++;
    }
    return kept;
}

/* ---------------------------------------------------------------- draw */

double sampler_uniform(uint64_t seed, uint64_t step) {
    /* splitmix64 with state mix(seed): output n is mix(state + (n + 1) * gamma). Mixing the
     * seed first keeps nearby seeds (0, 1, 2, ...) from being shifted copies of one stream. */
    uint64_t z = splitmix64_mix(splitmix64_mix(seed) + (step + 1) * SPLITMIX64_GAMMA);
    return (double)(z >> 11) * 0x1.0p-53;
}

int sampler_draw(const float *logits, int V, const SamplingParams *p, int step) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best] || isnan(logits[best])) best = i; /* strict: lowest id on ties */
    if (sampler_is_greedy(p)) return isnan(logits[best]) ? -1 : best;   /* all NaN: nothing to choose */

    /* Inverse CDF in double: the first i with cumsum(exp(s - max))[i] > u * sum. */
    float max = logits[best];
    double sum = 0.0;
    for (int i = 0; i < V; i++)
        if (logits[i] != -INFINITY) sum += expf(logits[i] - max);
    if (!isfinite(max) || !isfinite(sum)) return -1;   /* NaN or +inf somewhere, or all -inf */
    double target = sampler_uniform(p->seed, (uint64_t)step) * sum, cum = 0.0;
    int last = best;
    for (int i = 0; i < V; i++) {
        if (logits[i] == -INFINITY) continue;
        float e = expf(logits[i] - max);
        if (e == 0.0f) continue;
        cum += e;
        last = i;
        if (cum > target) return i;
    }
    return last; /* u * sum rounded up to the total: the last token with nonzero probability */
}
