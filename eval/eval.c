/* eval.c — `tandem eval`.
 *   --reference REF.jsonl  compares Tandem's log_softmax with a Hugging Face reference (format in
 *                          README.md, written by eval/hf_reference.py), then greedy decoding.
 *   --data FILE.jsonl      mean next-token loss and perplexity of {"input_ids": [...]} or {"text"} lines.
 * Records are spread over dp groups; every tp x pp layout gives the 1x1 numbers.
 * Greedy decoding runs on the generation engine (generate/engine.c), teacher-forced. */
#include "eval/eval.h"
#include "generate/engine.h"
#include "kernels/kernels.h"
#include "runtime/args.h"
#include "runtime/comm.h"
#include "runtime/jsonl.h"
#include "runtime/mesh.h"
#include "runtime/model.h"
#include "runtime/session.h"
#include "runtime/util.h"
#include "tokenizer/tokenizer.h"
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>

typedef struct {
    char id[64];
    int *ids;          /* (T) input_ids */
    int T;
    int *top_ids;      /* (n_top) flattened reference pairs */
    float *top_lp;     /* (n_top) */
    int *top_pos;      /* (n_top) position each pair belongs to */
    int *top1;         /* (T) reference top-1 at each position, -1 if none listed */
    int n_top;
    int *greedy;       /* (G) reference greedy continuation */
    float *greedy_gap; /* (G) reference top-2 logprob gap per greedy step, NAN if unknown */
    float *tie_gap;    /* (G) the reference's own tie gap per greedy step ("greedy_tie_gap"), NAN: --tie-gap */
    int G;
    int pair0;         /* offset of this record's pairs in the all-records logprob array */
} Record;

/* Per-record results, summed over dp ranks at the end (each record is owned by one dp rank, the
 * others hold zeros). All doubles, so an array of them is reduced as one buffer. */
typedef struct {
    double max_diff, sum_diff;
    double n_pairs, positions, top1_agree, top1_total;
    double greedy_tokens, greedy_mismatches, greedy_ties;
    double greedy_prefix; /* greedy steps before the first token unlike the reference's (tie or not) */
    double nll;        /* --data */
} Result;

static int *json_int_array(cJSON *a, int *n, const char *file, int line, const char *field, int vocab) {
    if (!cJSON_IsArray(a)) user_error("%s:%d: field \"%s\" must be a list of token ids", file, line, field);
    *n = cJSON_GetArraySize(a);
    int *out = xmalloc(sizeof(int) * (*n ? *n : 1)), i = 0;
    cJSON *e;
    cJSON_ArrayForEach(e, a) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble))
            user_error("%s:%d: %s[%d] is not an integer", file, line, field, i);
        if (e->valuedouble < 0 || e->valuedouble >= vocab)
            user_error("%s:%d: %s[%d] = %.0f is outside the vocabulary (size %d)", file, line, field, i, e->valuedouble, vocab);
        out[i++] = e->valueint;
    }
    return out;
}

/* Reads a list of [[id, logprob], ...] lists. Appends pairs for position p0 + k of list k. */
static void json_top_lists(cJSON *a, const char *file, int line, const char *field, int vocab, int **ids, float **lp,
                           int **pos, int *n, int expect_len) {
    if (!cJSON_IsArray(a)) user_error("%s:%d: field \"%s\" must be a list (one entry per position)", file, line, field);
    if (cJSON_GetArraySize(a) != expect_len)
        user_error("%s:%d: field \"%s\" has %d entries, expected %d (one per position)", file, line, field,
                   cJSON_GetArraySize(a), expect_len);
    int t = 0;
    cJSON *lst;
    cJSON_ArrayForEach(lst, a) {
        if (!cJSON_IsArray(lst)) user_error("%s:%d: %s[%d] must be a list of [token_id, logprob] pairs", file, line, field, t);
        cJSON *pr;
        cJSON_ArrayForEach(pr, lst) {
            cJSON *i0 = cJSON_GetArrayItem(pr, 0), *l0 = cJSON_GetArrayItem(pr, 1);
            if (!cJSON_IsArray(pr) || cJSON_GetArraySize(pr) != 2 || !cJSON_IsNumber(i0) || !cJSON_IsNumber(l0))
                user_error("%s:%d: %s[%d] must hold [token_id, logprob] pairs", file, line, field, t);
            if (i0->valuedouble < 0 || i0->valuedouble >= vocab)
                user_error("%s:%d: %s[%d] names token %.0f, outside the vocabulary (size %d)", file, line, field, t,
                           i0->valuedouble, vocab);
            *ids = xrealloc(*ids, sizeof(int) * (*n + 1));
            *lp = xrealloc(*lp, sizeof(float) * (*n + 1));
            *pos = xrealloc(*pos, sizeof(int) * (*n + 1));
            (*ids)[*n] = i0->valueint;
            (*lp)[*n] = (float)l0->valuedouble;
            (*pos)[*n] = t;
            (*n)++;
        }
        t++;
    }
}

/* --data lines may hold "text" instead of "input_ids": encoded with the model's tokenizer, BOS as
 * the tokenizer's config says. */
static int *encode_text(Tokenizer *tok, const char *text, int *n) {
    TokIds t = {0};
    tokenizer_encode(tok, text, strlen(text), tokenizer_add_bos_default(tok) ? TOK_ADD_BOS : 0, &t, NULL);
    int *ids = xmalloc(sizeof(int) * (t.n ? t.n : 1));
    for (size_t i = 0; i < t.n; i++) ids[i] = t.ids[i];
    *n = (int)t.n;
    tok_ids_free(&t);
    return ids;
}

/* Parses REF.jsonl (reference mode) or FILE.jsonl (data mode: input_ids or text; a record longer
 * than max_pos is refused, as generate and ppo refuse such a prompt). */
static Record *read_records(const char *path, int vocab, int max_pos, int reference, Tokenizer *tok, int *n_out) {
    JsonlReader rd;
    jsonl_open(&rd, path);
    Record *recs = NULL;
    int n = 0, line;
    cJSON *j;
    while ((j = jsonl_next(&rd))) {
        line = rd.line;
        recs = xrealloc(recs, sizeof(Record) * (n + 1));
        Record *r = &recs[n];
        memset(r, 0, sizeof(*r));
        cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "id");
        if (cJSON_IsString(id)) snprintf(r->id, sizeof(r->id), "%s", id->valuestring);
        else snprintf(r->id, sizeof(r->id), "line%d", line);
        cJSON *in = cJSON_GetObjectItemCaseSensitive(j, "input_ids"), *text = cJSON_GetObjectItemCaseSensitive(j, "text");
        if (!in && !reference && cJSON_IsString(text)) {
            if (!tok) user_error("%s:%d: \"text\" needs a tokenizer in the model directory (or give \"input_ids\")", path, line);
            r->ids = encode_text(tok, text->valuestring, &r->T);
        } else {
            if (!in) user_error("%s:%d: field \"input_ids\" missing%s", path, line, reference ? "" : " (or give \"text\")");
            r->ids = json_int_array(in, &r->T, path, line, "input_ids", vocab);
        }
        if (r->T == 0) user_error("%s:%d: field \"input_ids\" is empty", path, line);
        if (!reference && r->T > max_pos)   /* the model has no positions past max_pos: no loss there */
            user_error("%s:%d: %d tokens exceed max_position_embeddings %d (split the text)", path, line, r->T, max_pos);
        if (reference) {
            cJSON *top = cJSON_GetObjectItemCaseSensitive(j, "top_logprobs");
            if (!top) user_error("%s:%d: field \"top_logprobs\" missing", path, line);
            json_top_lists(top, path, line, "top_logprobs", vocab, &r->top_ids, &r->top_lp, &r->top_pos, &r->n_top, r->T);
            r->top1 = xmalloc(sizeof(int) * r->T);
            for (int t = 0; t < r->T; t++) r->top1[t] = -1;
            float *best = xmalloc(sizeof(float) * r->T);
            for (int i = 0; i < r->n_top; i++) {
                int t = r->top_pos[i];
                if (r->top1[t] < 0 || r->top_lp[i] > best[t]) { r->top1[t] = r->top_ids[i]; best[t] = r->top_lp[i]; }
            }
            free(best);
            cJSON *g = cJSON_GetObjectItemCaseSensitive(j, "greedy_ids");
            if (g) r->greedy = json_int_array(g, &r->G, path, line, "greedy_ids", vocab);
            r->greedy_gap = xmalloc(sizeof(float) * (r->G ? r->G : 1));
            r->tie_gap = xmalloc(sizeof(float) * (r->G ? r->G : 1));
            for (int k = 0; k < r->G; k++) r->greedy_gap[k] = r->tie_gap[k] = NAN;
            /* optional: how large a top-2 gap still makes each step a tie, when a single --tie-gap does
             * not fit every step (tests/bf16_fidelity.bats: a bound on the bf16 rounding error of
             * that step's gap, which varies 5 to 15 fold over a continuation) */
            cJSON *tg = cJSON_GetObjectItemCaseSensitive(j, "greedy_tie_gap");
            if (tg && r->G) {
                if (!cJSON_IsArray(tg) || cJSON_GetArraySize(tg) != r->G)
                    user_error("%s:%d: field \"greedy_tie_gap\" must be a list of %d numbers (one per greedy step)",
                               path, line, r->G);
                int k = 0;
                cJSON *e;
                cJSON_ArrayForEach(e, tg) {
                    if (!cJSON_IsNumber(e) || !(e->valuedouble >= 0))
                        user_error("%s:%d: greedy_tie_gap[%d] must be a number >= 0", path, line, k);
                    r->tie_gap[k++] = (float)e->valuedouble;
                }
            }
            cJSON *gt = cJSON_GetObjectItemCaseSensitive(j, "greedy_top_logprobs");
            if (gt && r->G) {
                int *gi = NULL, *gp = NULL, gn = 0;
                float *gl = NULL;
                json_top_lists(gt, path, line, "greedy_top_logprobs", vocab, &gi, &gl, &gp, &gn, r->G);
                /* gap between the two largest listed logprobs of each step */
                for (int k = 0; k < r->G; k++) {
                    float a = -INFINITY, b = -INFINITY;
                    for (int i = 0; i < gn; i++) {
                        if (gp[i] != k) continue;
                        if (gl[i] > a) { b = a; a = gl[i]; } else if (gl[i] > b) b = gl[i];
                    }
                    if (isfinite(b)) r->greedy_gap[k] = a - b;
                }
                free(gi); free(gl); free(gp);
            }
        }
        cJSON_Delete(j);
        n++;
    }
    jsonl_close(&rd);
    if (n == 0) user_error("%s: no records", path);
    *n_out = n;
    return recs;
}

static void scores_alloc(Scores *s, int N, int n_pairs) {
    s->lse = xmalloc(sizeof(float) * N);
    s->argmax = xmalloc(sizeof(int) * N);
    s->argmax_logprob = xmalloc(sizeof(float) * N);
    s->pair_logprob = xmalloc(sizeof(float) * (n_pairs ? n_pairs : 1));
}
static void scores_free(Scores *s) {
    free(s->lse); free(s->argmax); free(s->argmax_logprob); free(s->pair_logprob);
}

/* Scores a group of records [a, b) packed into one forward: reference logprobs, top-1, NLL. */
static void score_group(Model *m, Record *recs, int a, int b, Result *res, int reference, double *ours, int relative) {
    int n_seqs = b - a, N = 0, n_pairs = 0;
    int *start = xmalloc(sizeof(int) * (n_seqs + 1));
    for (int i = a; i < b; i++) {
        start[i - a] = N;
        N += recs[i].T;
        n_pairs += reference ? recs[i].n_top : recs[i].T - 1;
    }
    start[n_seqs] = N;
    int *tokens = xmalloc(sizeof(int) * N), *row = xmalloc(sizeof(int) * (n_pairs + 1)), *tok = xmalloc(sizeof(int) * (n_pairs + 1));
    int p = 0;
    for (int i = a; i < b; i++) {
        Record *r = &recs[i];
        memcpy(tokens + start[i - a], r->ids, sizeof(int) * r->T);
        if (reference) {
            for (int k = 0; k < r->n_top; k++) { row[p] = start[i - a] + r->top_pos[k]; tok[p++] = r->top_ids[k]; }
        } else {
            for (int t = 0; t + 1 < r->T; t++) { row[p] = start[i - a] + t; tok[p++] = r->ids[t + 1]; }
        }
    }
    Scores sc;
    scores_alloc(&sc, N, n_pairs);
    model_score(m, tokens, start, n_seqs, n_pairs, row, tok, &sc);
    p = 0;
    for (int i = a; i < b; i++) {
        Record *r = &recs[i];
        Result *o = &res[i];
        if (reference) {
            for (int k = 0; k < r->n_top; k++, p++) {
                ours[r->pair0 + k] = sc.pair_logprob[p];
                double d = fabs((double)sc.pair_logprob[p] - r->top_lp[k]);
                if (relative) d /= fmax(1.0, fabs((double)r->top_lp[k]));
                if (d > o->max_diff || isnan(d)) o->max_diff = isnan(d) ? INFINITY : d;
                o->sum_diff += d;
                o->n_pairs++;
            }
            o->positions = r->T;
            for (int t = 0; t < r->T; t++) {
                if (r->top1[t] < 0) continue;
                o->top1_total++;
                o->top1_agree += sc.argmax[start[i - a] + t] == r->top1[t];
            }
        } else {
            for (int t = 0; t + 1 < r->T; t++, p++) o->nll -= sc.pair_logprob[p];
            o->positions = r->T;
        }
    }
    scores_free(&sc);
    free(start); free(tokens); free(row); free(tok);
}

/* Greedy decoding of every owned record with a reference continuation on the generation engine
 * (paged KV cache, continuous batching), teacher-forced with the reference tokens so each step is
 * compared on the same prefix. A mismatch where the top-2 logprob gap is < tie_gap (the
 * reference's gap when listed, else ours; the record's own greedy_tie_gap for that step if it has
 * one) is a tie, not an error. */
static void greedy_check(Model *m, Record *recs, int n, const int *own, int n_own, Result *res, float tie_gap) {
    /* the engine is sized from every record, not this group's: kv_init agrees on one pool size over
     * all ranks, and a group without greedy records must still take part in it. At most MAX_RUN
     * sequences run at once (the rest wait), and the pool holds MAX_RUN of the longest, so memory
     * does not grow with the size of the reference file. */
    enum { MAX_RUN = 64, MAX_STEP_TOKENS = 4096 };
    int n_seqs = 0, n_any = 0, max_len = 1;
    size_t most = 0;
    for (int i = 0; i < n; i++) {
        Record *r = &recs[i];
        if (!r->G) continue;
        n_any++;
        if (r->T + r->G > max_len) max_len = r->T + r->G;
        if ((size_t)(r->T + r->G + 15) / 16 + 1 > most) most = (size_t)(r->T + r->G + 15) / 16 + 1;
    }
    for (int k = 0; k < n_own; k++) n_seqs += recs[own[k]].G > 0;
    if (n_any == 0) return;                               /* the same on every rank */
    size_t blocks = most * (size_t)(n_any < MAX_RUN ? n_any : MAX_RUN);
    EngineConfig ec = {MAX_RUN, MAX_STEP_TOKENS, 0, 16, max_len + 1, m->mesh->pp, 1, NULL, NULL, NULL, NULL, (int)blocks, 0, 0};
    Engine *e = engine_new(m, &ec, max_len);
    Seq *seqs = xcalloc(n_seqs + 1, sizeof(Seq));
    int *who = xmalloc(sizeof(int) * (n_seqs + 1)), s = 0;
    for (int k = 0; k < n_own; k++) {
        Record *r = &recs[own[k]];
        if (!r->G) continue;
        Seq *q = &seqs[s];
        q->index = s;
        q->prompt = r->ids;
        q->n_prompt = r->T;
        sampling_params_default(&q->sp);
        q->sp.temperature = 0.0f;
        q->max_new = r->G;
        q->forced = r->greedy;
        seq_alloc_results(q);
        char err[256];
        CHECK(engine_add(e, q, err, sizeof err) == 0);   /* the pool holds the longest record */
        who[s++] = own[k];
    }
    engine_run(e);
    moe_drain(m);   /* ep > 1: dp groups run different numbers of steps (runtime/moe_ep.c) */
    for (int i = 0; i < n_seqs; i++) {
        Seq *q = &seqs[i];
        Record *r = &recs[who[i]];
        Result *o = &res[who[i]];
        /* teacher-forced, the steps up to the first different token saw the prefixes a free-running
         * decode would have: that many tokens come out the same without forcing */
        int prefix = q->n_out;
        for (int step = 0; step < q->n_out; step++)
            if (q->chosen[step] != r->greedy[step]) { prefix = step; break; }
        o->greedy_prefix = prefix;
        for (int step = 0; step < q->n_out; step++) {
            o->greedy_tokens++;
            if (q->chosen[step] == r->greedy[step]) continue;
            float gap = isnan(r->greedy_gap[step]) ? q->chosen_lp[step] - q->lp[step] : r->greedy_gap[step];
            if (gap < (isnan(r->tie_gap[step]) ? tie_gap : r->tie_gap[step])) o->greedy_ties++;
            else o->greedy_mismatches++;
        }
        seq_free(q);
    }
    engine_free(e);
    free(seqs);
    free(who);
}

/* The same format as the input reference, with Tandem's logprobs for the same listed tokens and the
 * same greedy ids: a 1x1 run written this way is the reference for every other layout. */
static void write_reference(const char *path, const Record *recs, int n, const double *ours) {
    size_t cap = 1 << 16, len = 0;
    char *out = xmalloc(cap);
#define EMIT(...) do { \
        int need = snprintf(NULL, 0, __VA_ARGS__); \
        while (len + need + 1 > cap) out = xrealloc(out, cap *= 2); \
        len += snprintf(out + len, cap - len, __VA_ARGS__); \
    } while (0)
    for (int i = 0; i < n; i++) {
        const Record *r = &recs[i];
        EMIT("{\"id\": \"%s\", \"input_ids\": [", r->id);
        for (int t = 0; t < r->T; t++) EMIT(t ? ", %d" : "%d", r->ids[t]);
        EMIT("], \"top_logprobs\": [");
        for (int t = 0, k = 0; t < r->T; t++) {
            EMIT(t ? ", [" : "[");
            for (int first = 1; k < r->n_top && r->top_pos[k] == t; k++, first = 0)
                EMIT(first ? "[%d, %.9g]" : ", [%d, %.9g]", r->top_ids[k], ours[r->pair0 + k]);
            EMIT("]");
        }
        EMIT("]");
        if (r->G) {
            EMIT(", \"greedy_ids\": [");
            for (int k = 0; k < r->G; k++) EMIT(k ? ", %d" : "%d", r->greedy[k]);
            EMIT("]");
        }
        EMIT("}\n");
    }
#undef EMIT
    if (write_file_atomic(path, out, len)) user_error("%s: cannot write: %s", path, strerror(errno));
    free(out);
}

/* The run state for the largest batch: a record (prompt + greedy tokens) at least, every owned
 * record at once for the greedy check, --batch-tokens otherwise. */
static void alloc_state(Model *m, const Record *recs, int n, int batch_tokens) {
    int max_seq = 1, budget = batch_tokens;
    for (int i = 0; i < n; i++) {
        int len = recs[i].T + recs[i].G;
        if (len > max_seq) max_seq = len;
    }
    int greedy_total = 0;
    for (int i = 0; i < n; i++) greedy_total += (recs[i].T + recs[i].G);
    if (budget < max_seq) budget = max_seq;
    if (budget < greedy_total) budget = greedy_total; /* greedy packs all owned records per step */
    model_alloc_state(m, budget, max_seq);
}

static void records_free(Record *recs, int n) {
    for (int i = 0; i < n; i++) {
        free(recs[i].ids); free(recs[i].top_ids); free(recs[i].top_lp); free(recs[i].top_pos);
        free(recs[i].top1); free(recs[i].greedy); free(recs[i].greedy_gap); free(recs[i].tie_gap);
    }
    free(recs);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Quantiles (nearest rank: the ceil(q n)-th smallest) of |logprob difference| over every listed pair
 * of every record, measured as score_group does (relative or not, NaN as inf): the max alone says
 * nothing of how the other pairs are spread, and fidelity tests (tests/bf16_fidelity.bats) read it. */
static void diff_quantiles(const Record *recs, int n, const double *ours, int relative, const double *q, int nq,
                           double *out) {
    size_t total = 0, k = 0;
    for (int i = 0; i < n; i++) total += recs[i].n_top;
    double *d = xmalloc(sizeof(double) * (total ? total : 1));
    for (int i = 0; i < n; i++)
        for (int j = 0; j < recs[i].n_top; j++) {
            double v = fabs(ours[recs[i].pair0 + j] - recs[i].top_lp[j]);
            if (relative) v /= fmax(1.0, fabs((double)recs[i].top_lp[j]));
            d[k++] = isnan(v) ? INFINITY : v;
        }
    qsort(d, total, sizeof(double), cmp_double);
    for (int i = 0; i < nq; i++) {
        size_t r = (size_t)ceil(q[i] * (double)total);
        out[i] = total ? d[r ? r - 1 : 0] : 0.0;
    }
    free(d);
}

/* The per-record table (unless quiet) and the summary JSON line on stdout (the root); returns 1
 * when a reference check failed. */
static int report(const Record *recs, int n, const Result *res, int reference, int quiet, double max_diff,
                  const double *ours, int relative, const Mesh *mesh, double elapsed) {
    int failed = 0;
    double max_all = 0, sum_all = 0, nll = 0;
    long pairs = 0, positions = 0, agree = 0, total1 = 0, gt = 0, gm = 0, gties = 0, gprefix = 0, nll_tokens = 0;
    int first_div = -1;   /* the earliest greedy step at which any record's decode differs */
    if (!quiet) {
        if (reference)
            printf("%-16s %6s %12s %12s %8s %14s %8s\n", "record", "tokens", "max|dlogp|", "mean|dlogp|", "top1",
                   "greedy(mm/tie)", "diverge");
        else
            printf("%-16s %6s %12s %12s\n", "record", "tokens", "loss", "ppl");
    }
    for (int i = 0; i < n; i++) {
        const Result *v = &res[i];
        max_all = v->max_diff > max_all ? v->max_diff : max_all;
        sum_all += v->sum_diff; pairs += (long)v->n_pairs; positions += (long)v->positions;
        agree += (long)v->top1_agree; total1 += (long)v->top1_total;
        gt += (long)v->greedy_tokens; gm += (long)v->greedy_mismatches; gties += (long)v->greedy_ties; nll += v->nll;
        gprefix += (long)v->greedy_prefix;
        int diverged = v->greedy_prefix < v->greedy_tokens;   /* the step of its first different token */
        if (diverged && (first_div < 0 || v->greedy_prefix < first_div)) first_div = (int)v->greedy_prefix;
        nll_tokens += recs[i].T - 1;
        if (quiet) continue;
        if (reference) {
            printf("%-16.16s %6d %12.3g %12.3g %8.3f %6d (%d/%d)", recs[i].id, recs[i].T, v->max_diff,
                   v->n_pairs ? v->sum_diff / v->n_pairs : 0.0, v->top1_total ? v->top1_agree / v->top1_total : 1.0,
                   (int)v->greedy_tokens, (int)v->greedy_mismatches, (int)v->greedy_ties);
            if (diverged) printf(" %8d\n", (int)v->greedy_prefix);
            else printf(" %8s\n", "-");
        } else {
            double l = recs[i].T > 1 ? v->nll / (recs[i].T - 1) : 0.0;
            printf("%-16.16s %6d %12.6f %12.4f\n", recs[i].id, recs[i].T, l, exp(l));
        }
    }
    if (reference) {
        failed = !(max_all <= max_diff) || gm > 0;
        static const double q[] = {0.5, 0.9, 0.99};
        double qv[3];
        diff_quantiles(recs, n, ours, relative, q, 3, qv);
        printf("{\"records\": %d, \"positions\": %ld, \"max_abs_logprob_diff\": %.9g, \"mean_abs_logprob_diff\": %.9g, "
               "\"p50_abs_logprob_diff\": %.9g, \"p90_abs_logprob_diff\": %.9g, \"p99_abs_logprob_diff\": %.9g, "
               "\"top1_agreement\": %.6f, \"greedy_tokens\": %ld, \"greedy_mismatches\": %ld, \"greedy_ties\": %ld, "
               "\"greedy_agreed_prefix\": %ld, \"greedy_first_divergence\": %d, "
               "\"tp\": %d, \"pp\": %d, \"dp\": %d, \"seconds\": %.3f, \"pass\": %s}\n",
               n, positions, max_all, pairs ? sum_all / pairs : 0.0, qv[0], qv[1], qv[2],
               total1 ? (double)agree / total1 : 1.0, gt, gm, gties, gprefix, first_div,
               mesh->tp, mesh->pp, mesh->dp, elapsed, failed ? "false" : "true");
        if (failed)
            fprintf(stderr, "tandem: eval failed: max |logprob diff| %.3g (limit %.3g), %ld greedy mismatches\n",
                    max_all, max_diff, gm);
    } else {
        double loss = nll_tokens ? nll / nll_tokens : 0.0;
        printf("{\"records\": %d, \"tokens\": %ld, \"loss\": %.9g, \"ppl\": %.9g, \"tp\": %d, \"pp\": %d, \"dp\": %d, "
               "\"seconds\": %.3f}\n", n, nll_tokens, loss, exp(loss), mesh->tp, mesh->pp, mesh->dp, elapsed);
    }
    if (fflush(stdout) != 0 || ferror(stdout)) user_error("stdout: cannot write: %s", strerror(errno));
    return failed;
}

/* Scores this dp replica's records (i % dp == dp_rank; packed up to batch_tokens when dp is 1)
 * into res and ours (every listed pair's logprob), the greedy check with a reference, then sums
 * both over dp (each record's result lives on one replica, zeros elsewhere). Returns the seconds
 * of the scoring. */
static double score_records(Model *m, Record *recs, int n, int reference, int relative, float tie_gap, int batch_tokens,
                            Result *res, double *ours, int n_pairs_all) {
    /* records i with i % dp == dp_rank belong to this dp group */
    int *own = xmalloc(sizeof(int) * n), n_own = 0;
    for (int i = 0; i < n; i++) if (i % m->mesh->dp == m->mesh->dp_rank) own[n_own++] = i;
    double t0 = now_seconds();
    for (int k = 0; k < n_own;) {
        /* pack consecutive owned records up to the token budget (records are contiguous in recs
         * only for dp == 1; pack one at a time otherwise) */
        int a = own[k], b = a + 1, tokens = recs[a].T;
        k++;
        while (m->mesh->dp == 1 && k < n_own && tokens + recs[own[k]].T <= batch_tokens) { tokens += recs[own[k]].T; b++; k++; }
        score_group(m, recs, a, b, res, reference, ours, relative);
    }
    moe_drain(m);   /* ep > 1: dp groups score different numbers of batches (runtime/moe_ep.c) */
    if (reference) greedy_check(m, recs, n, own, n_own, res, tie_gap);
    double elapsed = now_seconds() - t0;
    free(own);

    /* gather: each record's result lives on its dp group; sum over dp (others hold zeros) */
    comm_all_reduce_sum_f64(&m->mesh->dp_comm, (double *)res, (size_t)n * sizeof(Result) / sizeof(double));
    comm_all_reduce_sum_f64(&m->mesh->dp_comm, ours, (size_t)n_pairs_all);
    return elapsed;
}

int eval_main(int argc, char **argv) {
    const char *ref = NULL, *data = NULL, *write_ref = NULL;
    ModelOpen mo = {0};
    int batch_tokens, quiet, relative;
    float max_diff, tie_gap;
    Option opts[] = {
        {"--model", OPT_MODEL, &mo.dir, NULL, "Hugging Face model directory or Hub id ORG/NAME"},
        ADAPTER_OPTION(&mo.adapter),
        {"--reference", OPT_STR, &ref, NULL, "reference jsonl written by eval/hf_reference.py"},
        {"--data", OPT_STR, &data, NULL, "jsonl of {\"input_ids\": [...]} or {\"text\": ...}: loss and perplexity"},
        MODEL_OPEN_OPTIONS(&mo),
        {"--max-logprob-diff", OPT_FLOAT, &max_diff, "1e-4", "fail (exit 1) above this |logprob difference|"},
        {"--relative", OPT_FLAG, &relative, NULL, "measure |diff| / max(1, |reference logprob|) (fp32 rounding is relative)"},
        {"--tie-gap", OPT_FLOAT, &tie_gap, "1e-4", "greedy mismatch with a top-2 gap below this is a tie (a record's greedy_tie_gap overrides it)"},
        {"--batch-tokens", OPT_INT, &batch_tokens, "4096", "tokens per forward pass"},
        {"--write-reference", OPT_STR, &write_ref, NULL, "write Tandem's own logprobs of the listed tokens as a reference file"},
        {"--quiet", OPT_FLAG, &quiet, NULL, "only the final JSON line"},
    };
    int n_opts = sizeof(opts) / sizeof(opts[0]);
    comm_init(&argc, &argv);
    args_parse("usage: tandem eval --model DIR (--reference REF.jsonl | --data FILE.jsonl) [options]", opts, n_opts,
               argc, argv);
    if (!mo.dir) user_error("eval: --model DIR is required");
    if (!ref == !data) user_error("eval: give exactly one of --reference or --data");
    if (mo.threads < 0) user_error("--threads must be >= 0 (0 = the cores available)");
    if (batch_tokens < 1) user_error("--batch-tokens must be >= 1");

    Mesh mesh;
    Model m;
    model_open(&mo, &mesh, &m);
    int reference = ref != NULL, n;
    const char *path = reference ? ref : data;
    char terr[512];
    Tokenizer *tok = reference ? NULL : tokenizer_open(mo.dir, terr, sizeof terr);  /* optional */
    Record *recs = read_records(path, m.cfg.vocab_size, m.cfg.max_pos, reference, tok, &n);
    if (tok) tokenizer_free(tok);
    if (mesh_is_root(&mesh) && !quiet) {
        fprintf(stderr, "+------------------------+--------------------------------+\n");
        args_print(opts, n_opts);
        model_print_summary(&m);
    }

    alloc_state(&m, recs, n, batch_tokens);
    if (!quiet) {   /* the same flag on every rank: the plan's gather is collective */
        MemPlan plan = model_mem_plan(&m);
        model_print_memory_plan(&m, &plan);
    }

    Result *res = xcalloc(n, sizeof(Result));
    int n_pairs_all = 0;
    for (int i = 0; i < n; i++) { recs[i].pair0 = n_pairs_all; n_pairs_all += recs[i].n_top; }
    double *ours = xcalloc(n_pairs_all + 1, sizeof(double)); /* our logprob of every listed pair */
    double elapsed = score_records(&m, recs, n, reference, relative, tie_gap, batch_tokens, res, ours, n_pairs_all);
    if (mesh_is_root(&mesh) && write_ref) write_reference(write_ref, recs, n, ours);
    int failed = mesh_is_root(&mesh) ? report(recs, n, res, reference, quiet, max_diff, ours, relative, &mesh, elapsed) : 0;
    comm_broadcast(&mesh.group, &failed, sizeof(int), 0);
    free(ours);
    free(res);
    records_free(recs, n);
    model_free(&m);
    mesh_free(&mesh);
    comm_finalize();
    return failed ? 1 : 0;
}
