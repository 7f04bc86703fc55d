/* test_sampler.c — checks behind tests/sampler.bats, one subcommand per check:
 *   fixtures CASES.json  sampler_process against transformers 4.47's processors (cases written by
 *                        tests/fixtures/sampler/make_sampler_fixtures.py): every finite entry within
 *                        1e-6, every -inf at the same place; with caller scratch and with NULL;
 *                        on the cases without penalties, sampler_truncate keeps exactly HF's kept
 *                        set (the finite entries) with the raw logits' bits, and its processed
 *                        row is sampler_process's bit for bit
 *   topp_ties            top-p's partial sort (V > 1024) removes exactly what a full stable sort
 *                        removes, on rows with many tied logits
 *   chisq                sampler_draw frequencies vs the processed softmax (chi-square, 0.999 quantile)
 *   negative             the same check rejects deliberately wrong distributions (a 10% temperature
 *                        error; a biased inverse CDF), so it can fail
 *   determinism          a token is a pure function of (logits, seed, step); seeds differ
 *   uniform              sampler_uniform is uniform over steps and over seeds at a fixed step
 *   greedy               temperature 0 (or < 1e-5): argmax, lowest id on ties, -inf never drawn,
 *                        NaN never chosen; a draw from a NaN / +inf / all -inf row returns -1
 *   check                sampling_params_check accepts the valid edges and names each bad field
 * Each prints what failed and exits 1, or prints one "ok" summary line. */
#include "generate/sampler.h"
#include "runtime/util.h"
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- fixtures */

static float json_float(const cJSON *v) { /* null means -inf */
    return cJSON_IsNull(v) ? -INFINITY : (float)v->valuedouble;
}

static float *json_floats(const cJSON *arr, int n) {
    if (cJSON_GetArraySize(arr) != n) { fprintf(stderr, "array size %d != %d\n", cJSON_GetArraySize(arr), n); exit(1); }
    float *x = xmalloc((size_t)n * sizeof(float));
    int i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) x[i++] = json_float(v);
    return x;
}

static int *json_ints(const cJSON *arr, int *n) {
    *n = cJSON_GetArraySize(arr);
    int *x = xmalloc((size_t)(*n + 1) * sizeof(int));
    int i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) x[i++] = v->valueint;
    return x;
}

static float get_f(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v)) { fprintf(stderr, "params.%s missing\n", k); exit(1); }
    return (float)v->valuedouble;
}

/* Largest |got - want| over finite entries; counts -inf mismatches (they must match exactly). */
static double compare_row(const float *got, const float *want, int V, int *inf_mismatch) {
    double max_diff = 0.0;
    *inf_mismatch = 0;
    for (int i = 0; i < V; i++) {
        int gi = isinf(got[i]) && got[i] < 0, wi = isinf(want[i]) && want[i] < 0;
        if (gi != wi) { (*inf_mismatch)++; continue; }
        if (gi) continue;
        double d = fabs((double)got[i] - (double)want[i]);
        if (!(d <= max_diff)) max_diff = d; /* NaN propagates as a failure */
    }
    return max_diff;
}

/* Tolerance 1e-6: we run the same fp32 operations in the same order as HF (gather/scatter, one
 * multiply or divide per penalty, one divide for temperature, comparisons for the filters), and
 * +, -, *, / are correctly rounded on both sides, so finite entries should agree bit for bit (the
 * measured max diff is printed). 1e-6 is about one ulp for logits of magnitude 8-16: it allows a
 * one-ulp difference should torch ever compute a step differently (e.g. multiply by a reciprocal)
 * and nothing more. The -inf pattern (which tokens top-k/top-p/min-p removed) must match exactly;
 * the generator keeps probabilities at least 1e-5 away from the top-p/min-p thresholds, so last-bit
 * differences between our expf/sum and torch's cannot move a token across one. */
static int cmd_fixtures(const char *path) {
    size_t len;
    char *text = read_file(path, &len);
    if (!text) { fprintf(stderr, "cannot read %s\n", path); return 1; }
    cJSON *doc = cJSON_Parse(text);
    if (!doc) { fprintf(stderr, "%s: not JSON\n", path); return 1; }
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(doc, "cases"), *c;
    int n_cases = 0, n_bad = 0, n_trunc = 0;
    double worst = 0.0;
    cJSON_ArrayForEach(c, cases) {
        const char *name = cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring;
        int V = cJSON_GetObjectItemCaseSensitive(c, "V")->valueint, n_prompt, n_output;
        const cJSON *pj = cJSON_GetObjectItemCaseSensitive(c, "params");
        SamplingParams p;
        sampling_params_default(&p);
        p.temperature = get_f(pj, "temperature");
        p.top_k = (int)get_f(pj, "top_k");
        p.top_p = get_f(pj, "top_p");
        p.min_p = get_f(pj, "min_p");
        p.repetition_penalty = get_f(pj, "repetition_penalty");
        p.presence_penalty = get_f(pj, "presence_penalty");
        p.frequency_penalty = get_f(pj, "frequency_penalty");
        const char *err = sampling_params_check(&p);
        if (err) { fprintf(stderr, "%s: params rejected: %s\n", name, err); n_bad++; continue; }
        int *prompt = json_ints(cJSON_GetObjectItemCaseSensitive(c, "prompt"), &n_prompt);
        int *output = json_ints(cJSON_GetObjectItemCaseSensitive(c, "output"), &n_output);
        float *logits = json_floats(cJSON_GetObjectItemCaseSensitive(c, "logits"), V);
        float *want = json_floats(cJSON_GetObjectItemCaseSensitive(c, "expected"), V);
        float *got = xmalloc((size_t)V * sizeof(float)), *got_null = xmalloc((size_t)V * sizeof(float));
        void *scratch = xmalloc(sampler_scratch_bytes(V));

        memcpy(got, logits, (size_t)V * sizeof(float));
        sampler_process(got, V, &p, prompt, n_prompt, output, n_output, scratch);
        memcpy(got_null, logits, (size_t)V * sizeof(float));
        sampler_process(got_null, V, &p, prompt, n_prompt, output, n_output, NULL);

        int inf_bad, kept = 0;
        double d = compare_row(got, want, V, &inf_bad);
        for (int i = 0; i < V; i++) kept += want[i] > -INFINITY;
        int same_null = memcmp(got, got_null, (size_t)V * sizeof(float)) == 0;
        /* greedy draw on the expected row = first argmax (np.argmax / torch.argmax) */
        int first_max = 0;
        for (int i = 1; i < V; i++) if (want[i] > want[first_max]) first_max = i;
        SamplingParams g = p;
        g.temperature = 0.0f;
        int greedy = sampler_draw(want, V, &g, 0);
        int trunc_ok = 1;   /* sampler_truncate: HF's kept set on the raw row, processed row = got */
        if (p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f) {
            float *row = xmalloc((size_t)V * sizeof(float)), *proc = xmalloc((size_t)V * sizeof(float));
            memcpy(row, logits, (size_t)V * sizeof(float));
            int n = sampler_truncate(row, V, &p, proc, scratch);
            trunc_ok = n == kept && !memcmp(proc, got, (size_t)V * sizeof(float));
            for (int i = 0; i < V; i++)
                trunc_ok &= want[i] == -INFINITY ? row[i] == -INFINITY : !memcmp(&row[i], &logits[i], sizeof(float));
            n_trunc++;
            free(row); free(proc);
        }
        int ok = d <= 1e-6 && inf_bad == 0 && same_null && greedy == first_max && trunc_ok;
        printf("%-34s V=%3d kept=%3d max_diff=%.3g inf_mismatch=%d%s%s%s\n", name, V, kept, d, inf_bad,
               same_null ? "" : " NULL-scratch-differs", greedy == first_max ? "" : " greedy-wrong",
               trunc_ok ? "" : " truncate-differs");
        if (!ok) n_bad++;
        if (d > worst) worst = d;
        n_cases++;
        free(prompt); free(output); free(logits); free(want); free(got); free(got_null); free(scratch);
    }
    cJSON_Delete(doc);
    free(text);
    if (n_cases == 0 || n_bad) { fprintf(stderr, "%d of %d cases failed\n", n_bad, n_cases); return 1; }
    printf("ok: %d/%d cases match transformers, max diff %.3g\n", n_cases, n_cases, worst);
    printf("ok: sampler_truncate keeps transformers' kept set with the raw bits on %d cases\n", n_trunc);
    return 0;
}

/* Deterministic test logits, independent of sampler_uniform (xorshift64*, Box-Muller). */
static uint64_t g_state = 0x2545F4914F6CDD1Dull;
static double test_rand(void) {
    g_state ^= g_state >> 12; g_state ^= g_state << 25; g_state ^= g_state >> 27;
    return (double)((g_state * 0x2545F4914F6CDD1Dull) >> 11) * 0x1.0p-53;
}
static void test_logits(float *x, int V, double scale) {
    for (int i = 0; i < V; i++) {
        double u1 = test_rand(), u2 = test_rand();
        x[i] = (float)(scale * sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2));
    }
}

/* ---------------------------------------------------------------- top-p shortcut vs full sort */

typedef struct { float v; int id; } Ent;
static int cmp_ent_asc(const void *pa, const void *pb) { /* ascending (value, id): a stable sort */
    const Ent *a = pa, *b = pb;
    if (a->v != b->v) return a->v < b->v ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

/* The plain TopPLogitsWarper: full ascending sort, softmax, double cumsum stored as fp32. */
static void top_p_reference(float *x, int V, float top_p) {
    Ent *e = xmalloc((size_t)V * sizeof(Ent));
    float max = -INFINITY;
    for (int i = 0; i < V; i++) { e[i] = (Ent){x[i], i}; if (x[i] > max) max = x[i]; }
    qsort(e, (size_t)V, sizeof(Ent), cmp_ent_asc);
    double sum = 0.0;
    for (int i = 0; i < V; i++) sum += expf(e[i].v - max);
    float inv = (float)(1.0 / sum), thr = (float)(1.0 - (double)top_p);
    double cum = 0.0;
    for (int i = 0; i < V - 1; i++) {
        cum += expf(e[i].v - max) * inv;
        if ((float)cum <= thr) x[e[i].id] = -INFINITY;
    }
    free(e);
}

/* sampler.c sorts only the tokens near the nucleus when V > 1024; on rows with many ties (logits
 * quantized to 1/8, so tie groups straddle its 1024 cut) it must remove exactly what a full stable
 * sort removes. */
static int cmd_topp_ties(void) {
    const int Vs[] = {1500, 5000, 32000};
    const float tps[] = {0.3f, 0.7f, 0.9f, 0.99f};
    const double scales[] = {1.0, 2.5};
    int n = 0, fails = 0;
    for (int a = 0; a < 3; a++) for (int b = 0; b < 4; b++) for (int c = 0; c < 2; c++) {
        int V = Vs[a];
        float *x = xmalloc((size_t)V * sizeof(float)), *want = xmalloc((size_t)V * sizeof(float));
        test_logits(x, V, scales[c]);
        for (int i = 0; i < V; i++) x[i] = roundf(x[i] * 8.0f) / 8.0f;
        memcpy(want, x, (size_t)V * sizeof(float));
        SamplingParams p;
        sampling_params_default(&p);
        p.top_p = tps[b];
        sampler_process(x, V, &p, NULL, 0, NULL, 0, NULL);
        top_p_reference(want, V, p.top_p);
        int kept = 0, diff = 0;
        for (int i = 0; i < V; i++) { kept += x[i] > -INFINITY; diff += (x[i] > -INFINITY) != (want[i] > -INFINITY); }
        if (diff) { fprintf(stderr, "V=%d top_p=%g std=%g: %d tokens differ (kept %d)\n", V, p.top_p, scales[c], diff, kept); fails++; }
        n++;
        free(x); free(want);
    }
    /* A row built so the top-p cut falls inside a tie group that straddles the 1024 largest:
     * 900 tokens at 2, 400 at 1, 2700 at -5, ids shuffled; top_p leaves ~300 of the 400 removed
     * (the lowest ids, as a stable sort does) and fewer than 1024 kept (the partial path). */
    {
        const int V = 4000;
        float *x = xmalloc((size_t)V * sizeof(float)), *want = xmalloc((size_t)V * sizeof(float));
        int *perm = xmalloc((size_t)V * sizeof(int));
        for (int i = 0; i < V; i++) perm[i] = i;
        for (int i = V - 1; i > 0; i--) { int j = (int)(test_rand() * (i + 1)); int t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
        for (int i = 0; i < V; i++) x[perm[i]] = i < 900 ? 2.0f : i < 1300 ? 1.0f : -5.0f;
        double total = 900 * exp(2.0) + 400 * exp(1.0) + 2700 * exp(-5.0);
        SamplingParams p;
        sampling_params_default(&p);
        p.top_p = (float)(1.0 - (2700 * exp(-5.0) + 300.5 * exp(1.0)) / total);
        memcpy(want, x, (size_t)V * sizeof(float));
        sampler_process(x, V, &p, NULL, 0, NULL, 0, NULL);
        top_p_reference(want, V, p.top_p);
        int kept = 0, kept_ones = 0, diff = 0;
        for (int i = 0; i < V; i++) {
            kept += want[i] > -INFINITY;
            kept_ones += want[i] == 1.0f;
            diff += (x[i] > -INFINITY) != (want[i] > -INFINITY);
        }
        if (!(kept < 1024 && kept_ones > 0 && kept_ones < 400)) {
            fprintf(stderr, "straddle row does not straddle: kept %d, of the tie group %d\n", kept, kept_ones);
            fails++;
        }
        if (diff) { fprintf(stderr, "straddle row: %d tokens differ from a full stable sort\n", diff); fails++; }
        n++;
        free(x); free(want); free(perm);
    }
    if (fails) return 1;
    printf("ok: top-p with a partial sort equals a full stable sort on %d tie-heavy rows\n", n);
    return 0;
}

/* ---------------------------------------------------------------- chi-square */

static void softmax_f64(const float *x, int V, double *prob) {
    float max = -INFINITY;
    for (int i = 0; i < V; i++) if (x[i] > max) max = x[i];
    double sum = 0.0;
    for (int i = 0; i < V; i++) sum += (prob[i] = exp((double)x[i] - max));
    for (int i = 0; i < V; i++) prob[i] /= sum;
}

/* Upper alpha quantile of chi-square with df degrees of freedom by Wilson-Hilferty: (X/df)^(1/3) is
 * close to normal with mean 1 - 2/(9 df) and variance 2/(9 df), so
 *   q = df * (1 - 2/(9 df) + z * sqrt(2/(9 df)))^3,  z the normal quantile (3.0902 for 0.999).
 * It overestimates slightly: +1.4% at df 4, +0.8% at df 7, +0.3% at df 19, +0.01% at df 196 (checked
 * against the exact quantile from the regularized incomplete gamma), so the test runs at a level a
 * little above 0.999. The distributions here have df in [7, 196]. */
static double chi2_quantile_999(int df) {
    const double z = 3.090232306167813;
    double a = 2.0 / (9.0 * df);
    double t = 1.0 - a + z * sqrt(a);
    return df * t * t * t;
}

/* Pearson's statistic of counts (V, n draws) against prob (V); categories with prob 0 are left out
 * of the sum and of df, and must have count 0 (else the statistic is infinite). */
static double chi2_stat(const long *count, const double *prob, int V, long n, int *df) {
    double stat = 0.0;
    int cats = 0;
    for (int i = 0; i < V; i++) {
        if (prob[i] == 0.0) { if (count[i]) return INFINITY; continue; }
        double e = prob[i] * (double)n;
        stat += (count[i] - e) * (count[i] - e) / e;
        cats++;
    }
    *df = cats - 1;
    return stat;
}

typedef struct {
    const char *name;
    int V;
    double scale; /* logit std */
    SamplingParams p;
} Dist;

static int make_dists(Dist *d) {
    int n = 0;
    SamplingParams p;
    sampling_params_default(&p);
    d[n++] = (Dist){"V=20 temperature 1", 20, 1.5, p};
    p.temperature = 0.8f; p.top_k = 12; p.top_p = 0.9f;
    d[n++] = (Dist){"V=20 temperature 0.8 top-k 12 top-p 0.9", 20, 1.5, p};
    sampling_params_default(&p);
    p.temperature = 1.3f; p.min_p = 0.05f;
    d[n++] = (Dist){"V=50 temperature 1.3 min-p 0.05", 50, 2.0, p};
    sampling_params_default(&p);
    p.top_p = 0.999f;
    d[n++] = (Dist){"V=200 top-p 0.999 (long tail)", 200, 1.0, p};
    return n;
}

/* Draws n tokens at steps 0..n-1 from the processed row, for each seed, and compares the counts with
 * the processed softmax (negative == 0: must pass) or with the softmax at 1.1x the temperature
 * (negative == 1: must be rejected by the same 0.999 test). Returns the number of failures. */
static int run_chisq(int negative) {
    Dist dists[8];
    int n_dists = make_dists(dists), fails = 0;
    const long n = 40000;
    const uint64_t seeds[] = {0, 1, 12345};
    for (int k = 0; k < n_dists; k++) {
        Dist *d = &dists[k];
        int V = d->V;
        float *x = xmalloc((size_t)V * sizeof(float));
        double *prob = xmalloc((size_t)V * sizeof(double)), *wrong = xmalloc((size_t)V * sizeof(double));
        long *count = xmalloc((size_t)V * sizeof(long));
        test_logits(x, V, d->scale);
        sampler_process(x, V, &d->p, NULL, 0, NULL, 0, NULL);
        softmax_f64(x, V, prob);
        /* Wrong distribution: the processed softmax at 1.1x temperature (same support), a 10%
         * miscalibration a biased sampler could produce. */
        float *xw = xmalloc((size_t)V * sizeof(float));
        for (int i = 0; i < V; i++) xw[i] = x[i] / 1.1f;
        softmax_f64(xw, V, wrong);
        for (size_t s = 0; s < sizeof(seeds) / sizeof(seeds[0]); s++) {
            SamplingParams p = d->p;
            p.seed = seeds[s];
            memset(count, 0, (size_t)V * sizeof(long));
            for (long t = 0; t < n; t++) count[sampler_draw(x, V, &p, (int)t)]++;
            int df;
            double stat = chi2_stat(count, negative ? wrong : prob, V, n, &df);
            double crit = chi2_quantile_999(df);
            int ok = negative ? stat > crit : stat < crit;
            printf("%-44s seed=%-6llu n=%ld df=%3d chi2=%10.2f %s %.2f (%.1fx)%s\n", d->name,
                   (unsigned long long)p.seed, n, df, stat, negative ? ">" : "<", crit, stat / crit,
                   ok ? "" : "  FAIL");
            fails += !ok;
        }
        free(x); free(xw); free(prob); free(wrong); free(count);
    }
    return fails;
}

static int cmd_chisq(void) {
    int fails = run_chisq(0);
    if (fails) { fprintf(stderr, "%d chi-square checks failed\n", fails); return 1; }
    printf("ok: draw frequencies match the processed softmax (chi-square below its 0.999 quantile)\n");
    return 0;
}

static int cmd_negative(void) {
    int fails = run_chisq(1);
    /* A biased sampler is caught by a wide margin: counts from an inverse CDF fed u/2 instead of u
     * must exceed the critical value tenfold. */
    const int V = 20;
    const long n = 40000;
    float x[20];
    double prob[20];
    long count[20] = {0};
    test_logits(x, V, 1.5);
    softmax_f64(x, V, prob);
    uint64_t seed = 7;
    for (long t = 0; t < n; t++) {
        double u = sampler_uniform(seed, (uint64_t)t) * 0.5, cum = 0.0;
        int tok = V - 1;
        for (int i = 0; i < V; i++) { cum += prob[i]; if (cum > u) { tok = i; break; } }
        count[tok]++;
    }
    int df;
    double stat = chi2_stat(count, prob, V, n, &df), crit = chi2_quantile_999(df);
    printf("%-44s n=%ld df=%3d chi2=%10.2f > 10 x %.2f%s\n", "biased inverse CDF (u/2), V=20", n, df, stat,
           crit, stat > 10.0 * crit ? "" : "  FAIL");
    fails += !(stat > 10.0 * crit);
    if (fails) { fprintf(stderr, "%d negative controls were not rejected\n", fails); return 1; }
    printf("ok: wrong distributions are rejected (chi-square above its 0.999 quantile)\n");
    return 0;
}

/* ---------------------------------------------------------------- determinism, uniform, greedy */

static int cmd_determinism(void) {
    const int V = 1000, T = 256;
    float *x = xmalloc((size_t)V * sizeof(float));
    test_logits(x, V, 0.5); /* nearly flat: two seeds agree at a step with probability ~1e-3 */
    SamplingParams a, b;
    sampling_params_default(&a);
    a.seed = 1;
    b = a;
    b.seed = 2;
    int tok_a[256], tok_b[256], fails = 0, same = 0;
    double u_a[256];
    for (int t = 0; t < T; t++) {
        tok_a[t] = sampler_draw(x, V, &a, t);
        tok_b[t] = sampler_draw(x, V, &b, t);
        u_a[t] = sampler_uniform(1, (uint64_t)t);
    }
    /* Again in reverse order, interleaved with other seeds (another "batch layout"): same tokens. */
    for (int t = T - 1; t >= 0; t--) {
        SamplingParams o = a;
        o.seed = (uint64_t)t + 100;
        (void)sampler_draw(x, V, &o, t);
        if (sampler_draw(x, V, &a, t) != tok_a[t]) { fprintf(stderr, "seed 1 step %d changed\n", t); fails++; }
        if (sampler_uniform(1, (uint64_t)t) != u_a[t]) fails++;   /* vs the first pass, not itself */
    }
    for (int t = 0; t < T; t++) same += tok_a[t] == tok_b[t];
    if (same > 5) { fprintf(stderr, "seeds 1 and 2 agree at %d of %d steps\n", same, T); fails++; }
    /* Steps differ too: seed 1 does not repeat one token. */
    int distinct = 0;
    for (int t = 0; t < T; t++) {
        int seen = 0;
        for (int u = 0; u < t; u++) seen |= tok_a[u] == tok_a[t];
        distinct += !seen;
    }
    if (distinct < T / 2) { fprintf(stderr, "seed 1: only %d distinct tokens in %d steps\n", distinct, T); fails++; }
    free(x);
    if (fails) return 1;
    printf("ok: tokens are a pure function of (seed, step); seeds 1 and 2 agree at %d of %d steps, "
           "%d distinct tokens\n", same, T, distinct);
    return 0;
}

static int uniform_bins(const char *what, int over_seeds) {
    enum { BINS = 100 };
    const long n = 1000000;
    long count[BINS] = {0};
    double prob[BINS];
    for (int i = 0; i < BINS; i++) prob[i] = 1.0 / BINS;
    for (long i = 0; i < n; i++) {
        double u = over_seeds ? sampler_uniform((uint64_t)i, 7) : sampler_uniform(42, (uint64_t)i);
        if (!(u >= 0.0 && u < 1.0)) { fprintf(stderr, "%s: u = %g outside [0, 1)\n", what, u); return 1; }
        count[(int)(u * BINS)]++;
    }
    int df;
    double stat = chi2_stat(count, prob, BINS, n, &df), crit = chi2_quantile_999(df);
    printf("%-36s n=%ld df=%d chi2=%.2f < %.2f%s\n", what, n, df, stat, crit, stat < crit ? "" : "  FAIL");
    return stat < crit ? 0 : 1;
}

static int cmd_uniform(void) {
    int fails = uniform_bins("seed 42, steps 0..999999", 0) + uniform_bins("seeds 0..999999, step 7", 1);
    if (fails) return 1;
    printf("ok: sampler_uniform is uniform over steps and over seeds\n");
    return 0;
}

static int cmd_greedy(void) {
    float x[6] = {0.5f, 2.0f, -1.0f, 2.0f, -INFINITY, 1.0f};
    SamplingParams p;
    sampling_params_default(&p);
    p.temperature = 0.0f;
    int fails = 0;
    for (int t = 0; t < 10; t++) fails += sampler_draw(x, 6, &p, t) != 1; /* tie 1 and 3: lowest id */
    float y[4] = {-INFINITY, -INFINITY, -3.0f, -INFINITY};
    fails += sampler_draw(y, 4, &p, 0) != 2;
    /* Sampling with one finite entry always draws it, whatever the uniform. */
    p.temperature = 1.0f;
    for (int t = 0; t < 1000; t++) fails += sampler_draw(y, 4, &p, t) != 2;
    /* Greedy processing stops after penalties: top-k etc. leave the row alone. */
    float z[5] = {1.0f, 3.0f, 2.0f, -1.0f, 0.0f};
    int hist[1] = {1};
    p.temperature = 0.0f; p.top_k = 1; p.top_p = 0.1f; p.min_p = 0.9f; p.repetition_penalty = 2.0f;
    sampler_process(z, 5, &p, hist, 1, NULL, 0, NULL);
    float want[5] = {1.0f, 1.5f, 2.0f, -1.0f, 0.0f};
    fails += memcmp(z, want, sizeof(z)) != 0;
    fails += sampler_draw(z, 5, &p, 0) != 2;
    /* A temperature below 1e-5 is greedy: 1e-40 would turn {0.5, 3, -1, 1, 0.2} into inf - inf. */
    float w[5] = {0.5f, 3.0f, -1.0f, 1.0f, 0.2f}, w0[5];
    memcpy(w0, w, sizeof(w));
    SamplingParams c;
    sampling_params_default(&c);
    for (int k = 0; k < 2; k++) {
        c.temperature = k ? 1e-40f : 9e-6f;
        sampler_process(w, 5, &c, NULL, 0, NULL, 0, NULL);
        if (memcmp(w, w0, sizeof(w))) { fprintf(stderr, "temperature %g changed the row\n", c.temperature); fails++; }
        for (int t = 0; t < 100; t++) fails += sampler_draw(w, 5, &c, t) != 1;
    }
    /* Non-finite logits: greedy skips NaN (as model_argmax); a draw reports -1 for NaN, +inf and a
     * row with no finite entry, instead of a token from arithmetic on NaN. */
    float nan_row[4] = {NAN, 1.0f, 2.0f, NAN}, inf_row[3] = {0.0f, INFINITY, 1.0f}, none[2] = {-INFINITY, -INFINITY};
    fails += sampler_draw(nan_row, 4, &c, 0) != 2;
    float all_nan[3] = {NAN, NAN, NAN};
    fails += sampler_draw(all_nan, 3, &c, 0) != -1;
    c.temperature = 1.0f;
    for (int t = 0; t < 10; t++)
        fails += (sampler_draw(nan_row, 4, &c, t) != -1) + (sampler_draw(inf_row, 3, &c, t) != -1) +
                 (sampler_draw(none, 2, &c, t) != -1);
    if (fails) { fprintf(stderr, "%d greedy checks failed\n", fails); return 1; }
    printf("ok: greedy is argmax with lowest id on ties (also below temperature 1e-5); -inf never drawn; "
           "non-finite rows refused\n");
    return 0;
}

/* ---------------------------------------------------------------- params check */

static int cmd_check(void) {
    typedef struct { const char *field; float value; const char *want; } Bad;
    const Bad bad[] = {
        {"temperature", -0.5f, "temperature must be >= 0"}, {"temperature", NAN, "temperature"},
        {"temperature", INFINITY, "temperature"},
        {"top_p", 0.0f, "top_p must be in (0, 1], got 0"}, {"top_p", 1.5f, "top_p must be in (0, 1], got 1.5"},
        {"top_p", -0.1f, "top_p"}, {"top_p", NAN, "top_p must be in (0, 1], got nan"},
        {"min_p", -0.01f, "min_p must be in [0, 1]"}, {"min_p", 1.01f, "min_p"}, {"min_p", NAN, "min_p"},
        {"repetition_penalty", 0.0f, "repetition_penalty must be > 0"},
        {"repetition_penalty", -1.0f, "repetition_penalty"}, {"repetition_penalty", NAN, "repetition_penalty"},
        {"repetition_penalty", 1e-7f, "repetition_penalty must be > 0 (at least 1e-6)"},
        {"presence_penalty", 2.5f, "presence_penalty must be in [-2, 2]"},
        {"presence_penalty", NAN, "presence_penalty"},
        {"frequency_penalty", -2.01f, "frequency_penalty must be in [-2, 2]"},
        {"frequency_penalty", NAN, "frequency_penalty"},
        {"top_k", -1.0f, "top_k must be >= 0"},
    };
    int fails = 0, n_bad = (int)(sizeof(bad) / sizeof(bad[0]));
    for (int i = 0; i < n_bad; i++) {
        SamplingParams p;
        sampling_params_default(&p);
        const char *f = bad[i].field;
        float v = bad[i].value;
        if (!strcmp(f, "temperature")) p.temperature = v;
        else if (!strcmp(f, "top_p")) p.top_p = v;
        else if (!strcmp(f, "min_p")) p.min_p = v;
        else if (!strcmp(f, "repetition_penalty")) p.repetition_penalty = v;
        else if (!strcmp(f, "presence_penalty")) p.presence_penalty = v;
        else if (!strcmp(f, "frequency_penalty")) p.frequency_penalty = v;
        else if (!strcmp(f, "top_k")) p.top_k = (int)v;
        const char *msg = sampling_params_check(&p);
        if (!msg || !strstr(msg, bad[i].want)) {
            fprintf(stderr, "%s = %g: got %s, want a message containing \"%s\"\n", f, v,
                    msg ? msg : "(accepted)", bad[i].want);
            fails++;
        }
    }
    /* Valid edges. */
    SamplingParams ok[6];
    for (int i = 0; i < 6; i++) sampling_params_default(&ok[i]);
    ok[1].temperature = 0.0f; ok[1].top_k = 1000000;
    ok[2].top_p = 1.0f; ok[2].min_p = 1.0f;
    ok[3].top_p = 1e-6f; ok[3].min_p = 0.0f;
    ok[4].presence_penalty = -2.0f; ok[4].frequency_penalty = 2.0f; ok[4].repetition_penalty = 1e-3f;
    ok[5].temperature = 100.0f; ok[5].seed = UINT64_MAX;
    for (int i = 0; i < 6; i++) {
        const char *msg = sampling_params_check(&ok[i]);
        if (msg) { fprintf(stderr, "valid params #%d rejected: %s\n", i, msg); fails++; }
    }
    SamplingParams d;
    sampling_params_default(&d);
    if (!(d.temperature == 1.0f && d.top_k == 0 && d.top_p == 1.0f && d.min_p == 0.0f &&
          d.repetition_penalty == 1.0f && d.presence_penalty == 0.0f && d.frequency_penalty == 0.0f && d.seed == 0)) {
        fprintf(stderr, "sampling_params_default is not temperature 1, everything off, seed 0\n");
        fails++;
    }
    if (fails) return 1;
    printf("ok: %d invalid params rejected with the field named, 6 valid edge cases accepted\n", n_bad);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "fixtures")) return cmd_fixtures(argv[2]);
    if (argc == 2 && !strcmp(argv[1], "topp_ties")) return cmd_topp_ties();
    if (argc == 2 && !strcmp(argv[1], "chisq")) return cmd_chisq();
    if (argc == 2 && !strcmp(argv[1], "negative")) return cmd_negative();
    if (argc == 2 && !strcmp(argv[1], "determinism")) return cmd_determinism();
    if (argc == 2 && !strcmp(argv[1], "uniform")) return cmd_uniform();
    if (argc == 2 && !strcmp(argv[1], "greedy")) return cmd_greedy();
    if (argc == 2 && !strcmp(argv[1], "check")) return cmd_check();
    fprintf(stderr, "usage: %s fixtures CASES.json | topp_ties | chisq | negative | determinism | uniform | greedy | check\n",
            argv[0]);
    return 2;
}
