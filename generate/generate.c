/* generate.c — `tandem generate --model DIR --input prompts.jsonl --output out.jsonl`.
 * Owns: reading and validating input lines (prompt | messages | input_ids, per-line sampling
 * overrides), tokenization, stop strings on decoded text, the output file (input order, whole lines,
 * flushed as they complete, --resume), progress and the final report. The engine (engine.c) owns
 * scheduling and the KV cache. Every rank reads the same input; the ranks of one dp group run the
 * same schedule over that group's prompts; rank 0 alone writes. */
#include "generate/generate.h"
#include "generate/engine.h"
#include "kernels/kernels.h"
#include "runtime/args.h"
#include "runtime/jsonl.h"
#include "runtime/util.h"
#include "tokenizer/tokenizer.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAX_STOPS = 16 };
enum { SKIP_WRITTEN = 1, SKIP_PENDING = 2 };

typedef struct {
    Seq seq;
    char *id_json;        /* the "id" value as JSON text (given, or the 1-based line number) */
    int in_line;          /* its line in --input */
    char *prompt_json;    /* the prompt field as given, JSON text */
    char *stops[MAX_STOPS];
    int n_stops;
    char *text;           /* decoded completion so far (special tokens skipped) */
    size_t len, cap;
    TokStream ts;
    int stopped;          /* finished by a stop string (the text is already cut) */
    int skip;             /* --resume: SKIP_WRITTEN in the output file, SKIP_PENDING in its side file */
    int done;
    char *line;           /* the finished output line (rank 0) */
} Gen;

typedef struct {
    Gen *gens;
    int n;
    Tokenizer *tok;
    int next_write;       /* first input index not yet written */
    int fd;               /* output file (rank 0), O_APPEND */
    const char *out_path;
    long resume_keep;     /* --resume: bytes of --output kept (a partial last line dropped); -1: all */
    /* Lines finished ahead of an earlier unfinished one wait for it in memory; each is also appended
     * to OUTPUT.pending (rank 0, regular files only), so a kill loses only the prompts still
     * generating: --resume takes them from there. Removed when the run ends. */
    char *pending_path;
    int pending_fd;       /* -1: none open */
    int n_done, n_total, progress;
    long gen_tokens;      /* tokens of this group's finished prompts */
    long live_tokens;     /* progress: tokens this group has generated so far, finished or not */
    long remote_tokens;   /* progress, rank 0: tokens of other groups' finished prompts */
    double t0, shown;     /* start; when the progress line was last drawn */
    /* data parallel: dp group g generates the prompts i with i % dp == g; each group's leader
     * (tp 0, pp 0) sends finished lines to world rank 0, which writes them in input order */
    const Mesh *mesh;
    int leader;           /* this rank formats its group's lines */
    int n_remote;         /* rank 0: lines still to receive from other groups */
    CommRequest *reqs;    /* a leader's pending sends, one per line (their buffers in outbox) */
    char **outbox;
    int n_out;
} Run;

enum { TAG_LINE = 7 };  /* message: 4-byte input index, then the line */

/* ---- input ------------------------------------------------------------------------------ */

/* A line's field; null counts as absent (the default applies), for every field. */
static cJSON *field(const cJSON *o, const char *key) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNull(v) ? NULL : v;
}

/* v is a JSON number holding an integer in [lo, hi). */
static int json_int_in(const cJSON *v, double lo, double hi) {
    return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) && v->valuedouble >= lo && v->valuedouble < hi;
}
/* 2^53 + 1 reads as 2^53: integers of magnitude below 2^53 are the ones a double is sure to hold */
#define EXACT_INT 0x1p53

static float get_num(cJSON *o, const char *key, float dflt, const char *file, int line) {
    cJSON *v = field(o, key);
    if (!v) return dflt;
    if (!cJSON_IsNumber(v)) user_error("%s:%d: field \"%s\" must be a number", file, line, key);
    return (float)v->valuedouble;
}
static int get_int(cJSON *o, const char *key, int dflt, const char *file, int line) {
    cJSON *v = field(o, key);
    if (!v) return dflt;
    if (!json_int_in(v, -INT_MAX, INT_MAX + 1.0))
        user_error("%s:%d: field \"%s\" must be an integer in [%d, %d]", file, line, key, -INT_MAX, INT_MAX);
    return (int)v->valuedouble;
}
/* A seed is any integer a double is sure to hold exactly, taken modulo 2^64 as the --seed option is:
 * -1 and 2^64 - 1 are the same seed. */
static uint64_t get_seed(cJSON *v, const char *file, int line) {
    if (!json_int_in(v, -EXACT_INT + 1, EXACT_INT))
        user_error("%s:%d: field \"seed\" must be an integer of magnitude below 2^53", file, line);
    return (uint64_t)(int64_t)v->valuedouble;
}

/* An "id" as JSON text, the key --resume matches on. Numbers are printed exactly (cJSON's own
 * printing rounds to 15 digits, which merges ids such as 9007199254740990 and ...991), so a numeric
 * id must be an integer a double holds exactly; larger ones must be strings. */
static char *id_text(const cJSON *id, const char *where) {
    if (!cJSON_IsNumber(id)) return cJSON_PrintUnformatted(id);
    double v = id->valuedouble;
    if (!json_int_in(id, -EXACT_INT + 1, EXACT_INT)) user_error("%s: a numeric \"id\" must be an integer of magnitude below 2^53 (use a string)", where);
    char *t = xmalloc(24);
    snprintf(t, 24, "%.0f", v);
    return t;
}

static void add_stop(Gen *g, const char *s, const char *where) {
    if (!*s) user_error("%s: empty stop string", where);
    if (g->n_stops == MAX_STOPS) user_error("%s: more than %d stop strings", where, MAX_STOPS);
    g->stops[g->n_stops++] = xstrdup(s);
}
static void parse_stops(Gen *g, cJSON *v, const char *where) {
    if (cJSON_IsString(v)) { add_stop(g, v->valuestring, where); return; }
    if (!cJSON_IsArray(v)) user_error("%s: \"stop\" must be a string or a list of strings", where);
    cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (!cJSON_IsString(e)) user_error("%s: \"stop\" must be a string or a list of strings", where);
        add_stop(g, e->valuestring, where);
    }
}
static void parse_stop_ids(Seq *s, cJSON *v, const char *where, int vocab) {
    if (!v) return;
    if (!cJSON_IsArray(v)) user_error("%s: \"stop_token_ids\" must be a list of token ids", where);
    cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (!json_int_in(e, 0, vocab))
            user_error("%s: \"stop_token_ids\" entries must be token ids in [0, %d)", where, vocab);
        s->stop_ids = xrealloc(s->stop_ids, sizeof(int) * (s->n_stop_ids + 1));
        s->stop_ids[s->n_stop_ids++] = e->valueint;
    }
}

typedef struct {
    SamplingParams sp;
    int max_new, min_new, logprobs, truncate, no_bos, ignore_eos;
    const char *key, *chat_template;
    cJSON *stop, *stop_ids;   /* --stop, --stop-token-ids, parsed (NULL: not given) */
} Defaults;

/* See generate.h. */
char *prompt_tokens(Tokenizer *tok, const cJSON *j, const char *key, const char *chat_template, int no_bos, int vocab,
                    const char *file, int line, TokIds *t) {
    const cJSON *ids = field(j, "input_ids"), *msgs = field(j, "messages"), *text = field(j, key);
    t->n = 0;
    char *given;
    if (ids) {
        if (!cJSON_IsArray(ids)) user_error("%s:%d: field \"input_ids\" must be a list of token ids", file, line);
        const cJSON *e;
        cJSON_ArrayForEach(e, ids) {
            if (!json_int_in(e, 0, vocab))
                user_error("%s:%d: \"input_ids\" entries must be token ids in [0, %d)", file, line, vocab);
            tok_ids_push(t, e->valueint);
        }
        given = cJSON_PrintUnformatted(ids);
    } else if (msgs) {
        if (!tok) user_error("%s:%d: \"messages\" needs a tokenizer in the model directory", file, line);
        if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
            user_error("%s:%d: field \"messages\" must be a non-empty list", file, line);
        int n = cJSON_GetArraySize(msgs), k = 0;
        ChatMessage *m = xcalloc(n, sizeof(ChatMessage));
        const cJSON *e;
        cJSON_ArrayForEach(e, msgs) {
            const cJSON *role = cJSON_GetObjectItemCaseSensitive(e, "role"), *content = cJSON_GetObjectItemCaseSensitive(e, "content");
            if (!cJSON_IsString(role) || !cJSON_IsString(content))
                user_error("%s:%d: messages[%d] needs string fields \"role\" and \"content\"", file, line, k);
            m[k++] = (ChatMessage){role->valuestring, content->valuestring};
        }
        char err[512];
        int fmt = chat_format_resolve(tok, chat_template, err, sizeof err);
        if (fmt < 0) user_error("%s:%d: %s", file, line, err);
        TokIds mask = {0};
        if (chat_render(tok, (ChatFormat)fmt, m, n, 1, t, &mask, err, sizeof err))
            user_error("%s:%d: %s", file, line, err);
        tok_ids_free(&mask);
        free(m);
        given = cJSON_PrintUnformatted(msgs);
    } else if (text) {
        if (!cJSON_IsString(text)) user_error("%s:%d: field \"%s\" must be a string", file, line, key);
        if (!tok) user_error("%s:%d: text prompts need a tokenizer in the model directory", file, line);
        unsigned flags = (!no_bos && tokenizer_add_bos_default(tok)) ? TOK_ADD_BOS : 0;
        tokenizer_encode(tok, text->valuestring, strlen(text->valuestring), flags, t, NULL);
        given = cJSON_PrintUnformatted(text);
    } else {
        user_error("%s:%d: field \"%s\" missing (or give \"messages\" or \"input_ids\")", file, line, key);
    }
    if (t->n == 0) user_error("%s:%d: the prompt is empty", file, line);
    return given;
}

/* Tokenizes one line's prompt into s->prompt. */
static void line_prompt(Run *run, Gen *g, cJSON *j, const Defaults *d, const char *file, int line, int vocab) {
    Seq *s = &g->seq;
    TokIds t = {0};
    g->prompt_json = prompt_tokens(run->tok, j, d->key, d->chat_template, d->no_bos, vocab, file, line, &t);
    s->n_prompt = (int)t.n;
    s->prompt = xmalloc(sizeof(int) * t.n);
    for (size_t i = 0; i < t.n; i++) s->prompt[i] = t.ids[i];
    tok_ids_free(&t);
}

static void read_input(Run *run, const char *path, const Defaults *d, const ModelConfig *cfg, const int *eos, int n_eos) {
    JsonlReader rd;
    jsonl_open(&rd, path);
    cJSON *j;
    while ((j = jsonl_next(&rd))) {
        int line = rd.line;
        run->gens = xrealloc(run->gens, sizeof(Gen) * (run->n + 1));
        Gen *g = &run->gens[run->n];
        memset(g, 0, sizeof(*g));
        Seq *s = &g->seq;
        s->index = run->n++;
        char where[600];
        snprintf(where, sizeof where, "%s:%d", path, line);
        g->in_line = line;
        cJSON *id = field(j, "id");
        if (id) g->id_json = id_text(id, where);
        else { g->id_json = xmalloc(16); snprintf(g->id_json, 16, "%d", line); }
        line_prompt(run, g, j, d, path, line, cfg->vocab_size);

        s->sp = d->sp;
        s->sp.temperature = get_num(j, "temperature", d->sp.temperature, path, line);
        s->sp.top_k = get_int(j, "top_k", d->sp.top_k, path, line);
        s->sp.top_p = get_num(j, "top_p", d->sp.top_p, path, line);
        s->sp.min_p = get_num(j, "min_p", d->sp.min_p, path, line);
        s->sp.repetition_penalty = get_num(j, "repetition_penalty", d->sp.repetition_penalty, path, line);
        s->sp.presence_penalty = get_num(j, "presence_penalty", d->sp.presence_penalty, path, line);
        s->sp.frequency_penalty = get_num(j, "frequency_penalty", d->sp.frequency_penalty, path, line);
        cJSON *seed = field(j, "seed");
        /* a sequence's draws depend only on its seed: the line's, else --seed mixed with the line index */
        s->sp.seed = seed ? get_seed(seed, path, line)
                          : d->sp.seed * 0x9E3779B97F4A7C15ull + (uint64_t)s->index + 1;
        const char *bad = sampling_params_check(&s->sp);
        if (bad) user_error("%s: %s", where, bad);
        s->max_new = get_int(j, "max_new_tokens", d->max_new, path, line);
        /* --min-new-tokens yields to a line's smaller max_new_tokens; a line's own min_new_tokens must fit */
        s->min_new = get_int(j, "min_new_tokens", d->min_new < s->max_new ? d->min_new : s->max_new, path, line);
        s->logprobs_n = get_int(j, "logprobs", d->logprobs, path, line);
        if (s->max_new < 1) user_error("%s: max_new_tokens must be >= 1", where);
        if (s->min_new < 0 || s->min_new > s->max_new) user_error("%s: min_new_tokens must be in [0, max_new_tokens]", where);
        if (s->logprobs_n < 0 || s->logprobs_n > 20) user_error("%s: logprobs must be in [0, 20]", where);
        for (int k = 0; k < n_eos && !d->ignore_eos; k++) {
            s->stop_ids = xrealloc(s->stop_ids, sizeof(int) * (s->n_stop_ids + 1));
            s->stop_ids[s->n_stop_ids++] = eos[k];
        }
        /* a line's "stop" / "stop_token_ids" replace --stop / --stop-token-ids (EOS ids stay) */
        cJSON *st = field(j, "stop"), *sti = field(j, "stop_token_ids");
        if (st) parse_stops(g, st, where);
        else if (d->stop) parse_stops(g, d->stop, "--stop");
        parse_stop_ids(s, sti ? sti : d->stop_ids, sti ? where : "--stop-token-ids", cfg->vocab_size);
        if (g->n_stops && !run->tok) user_error("%s: stop strings need a tokenizer in the model directory", where);

        int limit = cfg->max_pos;
        if ((long)s->n_prompt + s->max_new > limit) {   /* long: max_new may be up to INT_MAX */
            if (!d->truncate)
                user_error("%s: prompt of %d tokens + max_new_tokens %d exceeds max_position_embeddings %d "
                           "(use --truncate to keep the prompt's last tokens)", where, s->n_prompt, s->max_new, limit);
            int keep = limit - s->max_new;
            if (keep < 1) user_error("%s: max_new_tokens %d leaves no room for the prompt (max positions %d)", where, s->max_new, limit);
            memmove(s->prompt, s->prompt + s->n_prompt - keep, sizeof(int) * keep);
            s->n_prompt = keep;
        }
        seq_alloc_results(s);
        cJSON_Delete(j);
    }
    jsonl_close(&rd);
    if (run->n == 0) user_error("%s: no prompts", path);
}

/* ---- output ----------------------------------------------------------------------------- */

static int cmp_by_id(const void *a, const void *b, void *gens) {
    const Gen *g = gens;
    int i = *(const int *)a, j = *(const int *)b, c = strcmp(g[i].id_json, g[j].id_json);
    return c ? c : (i > j) - (i < j);
}

/* --resume, one file: each complete line marks the first input line with its id not yet marked
 * (ids sorted once: n log n, not n x m) with `mark`; SKIP_PENDING keeps the line to be written in
 * its place. A last line cut off by a kill (no newline) is ignored, and its start returned in *keep
 * unless keep is NULL (-1: the file ends with a whole line); blank lines are passed over; any other malformed line is
 * an error. Returns the number of input lines marked. */
static int resume_scan_file(Run *run, const int *order, const char *path, int mark, long *keep) {
    size_t len;
    if (keep) *keep = -1;
    char *data = read_file(path, &len);
    if (!data) {
        if (errno != ENOENT) user_error("%s: cannot read for --resume: %s", path, strerror(errno));
        return 0;                                    /* nothing yet */
    }
    size_t good = 0, pos = 0;
    int line = 0, skipped = 0;
    while (pos < len) {
        char *nl = memchr(data + pos, '\n', len - pos);
        line++;
        if (!nl) break;                              /* partial tail */
        *nl = 0;
        if (strspn(data + pos, " \t\r") == (size_t)(nl - data - pos)) {   /* blank */
            pos = good = (size_t)(nl - data) + 1;
            continue;
        }
        cJSON *j = cJSON_ParseWithOpts(data + pos, NULL, 1);
        cJSON *id = j ? cJSON_GetObjectItemCaseSensitive(j, "id") : NULL;
        if (!j || !id || !cJSON_GetObjectItemCaseSensitive(j, "completion_ids"))
            user_error("%s:%d: not a complete output line; cannot --resume from this file", path, line);
        char where[600];
        snprintf(where, sizeof where, "%s:%d", path, line);
        char *key = id_text(id, where);
        int lo = 0, hi = run->n;                     /* first sorted position with id >= key */
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (strcmp(run->gens[order[mid]].id_json, key) < 0) lo = mid + 1; else hi = mid;
        }
        for (; lo < run->n && !strcmp(run->gens[order[lo]].id_json, key); lo++) {
            Gen *g = &run->gens[order[lo]];
            if (g->skip) continue;
            g->skip = mark;
            if (mark == SKIP_PENDING) {   /* the line, newline included, to be written in its turn */
                size_t n = (size_t)(nl - data - pos);
                g->line = xmalloc(n + 2);
                memcpy(g->line, data + pos, n);
                memcpy(g->line + n, "\n", 2);
            }
            skipped++;
            break;
        }
        free(key);
        cJSON_Delete(j);
        pos = (size_t)(nl - data) + 1;
        good = pos;
    }
    if (keep && good < len) *keep = (long)good;
    free(data);
    return skipped;
}

/* --resume: ids already in the output file, then lines finished ahead of their turn in its side
 * file. The output's partial tail is dropped when it is opened (run->resume_keep), after every
 * check. */
static void resume_scan(Run *run, const char *path) {
    int *order = xmalloc(sizeof(int) * run->n);
    for (int i = 0; i < run->n; i++) order[i] = i;
    qsort_r(order, run->n, sizeof(int), cmp_by_id, run->gens);
    int written = resume_scan_file(run, order, path, SKIP_WRITTEN, &run->resume_keep);
    int pending = resume_scan_file(run, order, run->pending_path, SKIP_PENDING, NULL);   /* its tail: ignored */
    if (mesh_is_root(run->mesh))
        fprintf(stderr, "resume: %d of %d prompts already in %s, %d more in %s\n", written, run->n, path, pending,
                run->pending_path);
    free(order);
}

/* Appends a whole line or nothing: a failed or short write (disk full) is cut back off the file. */
static void write_line(int fd, const char *path, const char *line) {
    size_t n = strlen(line), put = 0;
    off_t end = lseek(fd, 0, SEEK_END);
    while (put < n) {
        ssize_t w = write(fd, line + put, n - put);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int err = w < 0 ? errno : ENOSPC;
            if (ftruncate(fd, end) != 0) { /* nothing more to do: the error below names the file */ }
            user_error("%s: write failed: %s", path, strerror(err));
        }
        put += (size_t)w;
    }
}

/* Rank 0: the finished line of input index `idx` is in g->line: write every line now in turn; if
 * this one must still wait for an earlier one, keep a copy in the side file meanwhile. */
static void write_ready(Run *run, int idx) {
    while (run->next_write < run->n && (run->gens[run->next_write].done || run->gens[run->next_write].skip)) {
        Gen *g = &run->gens[run->next_write++];
        if (g->skip == SKIP_WRITTEN || !mesh_is_root(run->mesh)) continue;
        write_line(run->fd, run->out_path, g->line);
        free(g->line);
        g->line = NULL;
    }
    if (!mesh_is_root(run->mesh) || idx < run->next_write || !run->pending_path) return;
    if (run->pending_fd < 0) {
        run->pending_fd = open(run->pending_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (run->pending_fd < 0) user_error("%s: cannot open for writing: %s", run->pending_path, strerror(errno));
    }
    write_line(run->pending_fd, run->pending_path, run->gens[idx].line);
}

static char *format_line(const Gen *g) {
    const Seq *s = &g->seq;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "id", cJSON_CreateRaw(g->id_json));   /* as id_text printed it */
    cJSON_AddItemToObject(o, "prompt", cJSON_Parse(g->prompt_json));
    cJSON_AddStringToObject(o, "completion", g->text ? g->text : "");
    cJSON *ids = cJSON_AddArrayToObject(o, "completion_ids");
    for (int k = 0; k < s->n_out; k++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(s->out[k]));
    cJSON_AddStringToObject(o, "finish_reason", s->finish == FINISH_STOP ? "stop" : "length");
    cJSON_AddNumberToObject(o, "prompt_tokens", s->n_prompt);
    cJSON_AddNumberToObject(o, "completion_tokens", s->n_out);
    if (s->logprobs_n > 0) {
        cJSON *lps = cJSON_AddArrayToObject(o, "logprobs");
        for (int k = 0; k < s->n_out; k++) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "token", s->out[k]);
            cJSON_AddNumberToObject(e, "logprob", s->lp[k]);
            cJSON *top = cJSON_AddArrayToObject(e, "top");
            for (int j = 0; j < s->logprobs_n; j++) {
                int t = s->top_ids[(size_t)k * s->logprobs_n + j];
                if (t < 0) break;
                cJSON *pair = cJSON_CreateArray();
                cJSON_AddItemToArray(pair, cJSON_CreateNumber(t));
                cJSON_AddItemToArray(pair, cJSON_CreateNumber(s->top_lp[(size_t)k * s->logprobs_n + j]));
                cJSON_AddItemToArray(top, pair);
            }
            cJSON_AddItemToArray(lps, e);
        }
    }
    char *txt = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    size_t n = strlen(txt);
    txt = xrealloc(txt, n + 2);
    txt[n] = '\n';
    txt[n + 1] = 0;
    return txt;
}

/* The progress line: when a prompt finishes (PROGRESS_DONE), at most twice a second between
 * (PROGRESS_TICK, every engine step), and once at the end. Tokens/s counts every token generated so
 * far by rank 0's group, and other groups' finished prompts. */
enum { PROGRESS_TICK, PROGRESS_DONE, PROGRESS_FINAL };
static void progress(Run *run, int why) {
    if (!run->progress || !mesh_is_root(run->mesh)) return;
    double t = now_seconds(), dt = t - run->t0 > 0 ? t - run->t0 : 1e-9;
    if (why == PROGRESS_TICK && t - run->shown < 0.5) return;
    run->shown = t;
    double rate = run->n_done / dt;   /* prompts per second */
    fprintf(stderr, "\r[%d/%d prompts] %.1f tokens/s, ", run->n_done, run->n_total, (run->live_tokens + run->remote_tokens) / dt);
    if (rate > 0) fprintf(stderr, "ETA %.0f s   ", (run->n_total - run->n_done) / rate);
    else fprintf(stderr, "ETA -   ");
    if (why == PROGRESS_FINAL) fputc('\n', stderr);
    fflush(stderr);
}

/* ---- engine callbacks ------------------------------------------------------------------- */

static int on_token(void *ctx, Seq *s) {
    Run *run = ctx;
    Gen *g = &run->gens[s->index];
    run->live_tokens++;
    if (!run->tok) return 0;
    size_t before = g->len;
    tok_stream_push(&g->ts, s->out[s->n_out - 1], &g->text, &g->len, &g->cap);
    if (s->n_out <= s->min_new) return 0;  /* min_new_tokens: as for stop ids, the first min_new tokens
                                             * cannot end a stop (vLLM's min_tokens holds stop strings too) */
    /* a stop string may straddle tokens: search from where it could have begun; of all the stop
     * strings found, the one that begins first in the text wins */
    char *first = NULL;
    for (int k = 0; k < g->n_stops; k++) {
        size_t sl = strlen(g->stops[k]), from = before >= sl ? before - sl + 1 : 0;
        char *hit = g->len >= sl ? memmem(g->text + from, g->len - from, g->stops[k], sl) : NULL;
        if (hit && (!first || hit < first)) first = hit;
    }
    if (!first) return 0;
    g->len = (size_t)(first - g->text);   /* cut the stop string and what follows it */
    g->text[g->len] = 0;
    g->stopped = 1;
    return 1;
}

static void on_finish(void *ctx, Seq *s) {
    Run *run = ctx;
    Gen *g = &run->gens[s->index];
    if (run->tok && !g->stopped) tok_stream_flush(&g->ts, &g->text, &g->len, &g->cap);
    if (!run->tok) { g->text = xstrdup(""); }
    g->done = 1;
    run->n_done++;
    run->gen_tokens += s->n_out;
    if (!run->leader) return;
    char *line = format_line(g);
    if (mesh_is_root(run->mesh)) {
        g->line = line;
        write_ready(run, s->index);
        progress(run, PROGRESS_DONE);
        return;
    }
    /* another group's leader: to rank 0, [index][tokens][line] */
    size_t n = strlen(line);
    char *msg = xmalloc(8 + n);
    int32_t head[2] = {s->index, s->n_out};
    memcpy(msg, head, 8);
    memcpy(msg + 8, line, n);
    free(line);
    run->outbox = xrealloc(run->outbox, sizeof(char *) * (run->n_out + 1));
    run->reqs = xrealloc(run->reqs, sizeof(CommRequest) * (run->n_out + 1));
    run->outbox[run->n_out] = msg;
    run->reqs[run->n_out] = (CommRequest){NULL};
    comm_isend_tag(&run->mesh->group, msg, 8 + n, 0, TAG_LINE, &run->reqs[run->n_out]);
    run->n_out++;
}

/* Rank 0: take in other groups' finished lines (blocking until `want` more have come). */
static void collect_lines(Run *run, int want) {
    int src;
    size_t bytes;
    while (run->n_remote > 0 && comm_probe(&run->mesh->group, TAG_LINE, want > 0, &src, &bytes)) {
        char *msg = xmalloc(bytes + 1);
        comm_recv_tag(&run->mesh->group, msg, bytes, src, TAG_LINE);
        int32_t head[2];   /* index, tokens */
        memcpy(head, msg, 8);
        int idx = head[0];
        CHECK(bytes >= 8 && idx >= 0 && idx < run->n && !run->gens[idx].done);
        Gen *g = &run->gens[idx];
        g->line = xmalloc(bytes - 8 + 1);
        memcpy(g->line, msg + 8, bytes - 8);
        g->line[bytes - 8] = 0;
        run->remote_tokens += head[1];
        g->done = 1;
        free(msg);
        run->n_remote--;
        run->n_done++;
        want--;
        write_ready(run, idx);
        progress(run, PROGRESS_DONE);
    }
}

static void on_step(void *ctx) {
    Run *run = ctx;
    if (mesh_is_root(run->mesh) && run->n_remote) collect_lines(run, 0);
    progress(run, PROGRESS_TICK);
}

/* --output must not be --input (that would overwrite the prompts as they are read). */
static void same_file_check(const char *in, const char *out) {
    struct stat a, b;
    if (stat(in, &a) == 0 && stat(out, &b) == 0 && S_ISREG(a.st_mode) && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
        user_error("%s: --output is the --input file", out);
}

/* ---- main ------------------------------------------------------------------------------- */

/* EOS ids of generation_config.json (int or list), added to eos[] without duplicates. */
static int add_generation_eos(const char *dir, int *eos, int n_eos) {
    char *path = path_join(dir, "generation_config.json");
    char *text = read_file(path, NULL);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    if (text && !j) user_error("%s: not valid JSON", path);
    cJSON *v = j ? cJSON_GetObjectItemCaseSensitive(j, "eos_token_id") : NULL, *e;
    if (cJSON_IsNull(v)) v = NULL;   /* null: none given, as config.json's reader and HF take it */
    if (v && !cJSON_IsNumber(v) && !cJSON_IsArray(v)) user_error("%s: eos_token_id must be an integer or a list", path);
    cJSON *one = cJSON_IsNumber(v) ? cJSON_CreateIntArray(&v->valueint, 1) : NULL, *list = one ? one : v;
    cJSON_ArrayForEach(e, list) {
        if (!cJSON_IsNumber(e)) user_error("%s: eos_token_id entries must be integers", path);
        int have = 0;
        for (int k = 0; k < n_eos; k++) have |= eos[k] == e->valueint;
        if (!have && n_eos < 2 * MAX_EOS_IDS) eos[n_eos++] = e->valueint;
    }
    cJSON_Delete(one);
    cJSON_Delete(j);
    free(text);
    free(path);
    return n_eos;
}

int generate_main(int argc, char **argv) {
    const char *model_dir, *in_path, *out_path;
    Defaults d = {0};
    const char *stop = NULL, *stop_ids = NULL;
    int tp, pp, threads, greedy, resume, show_progress, max_batch, max_batch_tokens, block, seed, micro;
    float kv_mib;
    Option opts[] = {
        {"--model", OPT_MODEL, &model_dir, NULL, "Hugging Face model directory or Hub id ORG/NAME"},
        {"--input", OPT_STR, &in_path, NULL, "prompts jsonl: \"prompt\" | \"messages\" | \"input_ids\" per line"},
        {"--output", OPT_STR, &out_path, NULL, "output jsonl (input order, one line per prompt)"},
        {"--input-key", OPT_STR, &d.key, "prompt", "field holding the prompt text"},
        {"--temperature", OPT_FLOAT, &d.sp.temperature, "1.0", "0 = greedy"},
        {"--top-k", OPT_INT, &d.sp.top_k, "0", "0 = off"},
        {"--top-p", OPT_FLOAT, &d.sp.top_p, "1.0", "nucleus, (0, 1]"},
        {"--min-p", OPT_FLOAT, &d.sp.min_p, "0.0", "[0, 1]"},
        {"--repetition-penalty", OPT_FLOAT, &d.sp.repetition_penalty, "1.0", "HF definition, >= 1e-6"},
        {"--presence-penalty", OPT_FLOAT, &d.sp.presence_penalty, "0.0", "OpenAI definition"},
        {"--frequency-penalty", OPT_FLOAT, &d.sp.frequency_penalty, "0.0", "OpenAI definition"},
        {"--greedy", OPT_FLAG, &greedy, NULL, "same as --temperature 0"},
        {"--seed", OPT_INT, &seed, "0", "base seed; a line's \"seed\" overrides it"},
        {"--max-new-tokens", OPT_INT, &d.max_new, "128", "tokens to generate at most"},
        {"--min-new-tokens", OPT_INT, &d.min_new, "0", "no EOS, stop id or stop string before this many"},
        {"--stop", OPT_STR, &stop, NULL, "stop string, or a JSON list of them"},
        {"--stop-token-ids", OPT_STR, &stop_ids, NULL, "comma-separated ids that end a sequence"},
        {"--logprobs", OPT_INT, &d.logprobs, "0", "per generated token: its logprob and the top N"},
        {"--chat-template", OPT_STR, &d.chat_template, NULL, "llama2 | mistral | chatml | chatml-think | llama3 (default: detected)"},
        {"--ignore-eos", OPT_FLAG, &d.ignore_eos, NULL, "do not stop at EOS (parity runs against HF greedy)"},
        {"--no-bos", OPT_FLAG, &d.no_bos, NULL, "do not add BOS to text prompts"},
        {"--truncate", OPT_FLAG, &d.truncate, NULL, "keep the last tokens of prompts that are too long"},
        {"--resume", OPT_FLAG, &resume, NULL, "skip ids already in --output; take finished lines from OUTPUT.pending"},
        {"--progress", OPT_FLAG, &show_progress, NULL, "progress line on stderr even when not a terminal"},
        {"--kv-cache-mem", OPT_FLOAT, &kv_mib, "512", "KV cache MiB per rank"},
        {"--block-size", OPT_INT, &block, "16", "tokens per KV cache block"},
        {"--max-batch", OPT_INT, &max_batch, "64", "running sequences at most"},
        {"--max-batch-tokens", OPT_INT, &max_batch_tokens, "2048", "tokens a step admits (a longer context runs alone)"},
        {"--micro-batches", OPT_INT, &micro, "0", "pp > 1: pipelined micro-batches per step (0 = pp)"},
        MESH_OPTIONS(&tp, &pp, &threads),
    };
    int n_opts = sizeof(opts) / sizeof(opts[0]);
    comm_init(&argc, &argv);
    sampling_params_default(&d.sp);
    args_parse("usage: tandem generate --model DIR --input prompts.jsonl --output out.jsonl [options]", opts, n_opts, argc, argv);
    if (!model_dir || !in_path || !out_path) user_error("generate: --model, --input and --output are required");
    if (greedy) d.sp.temperature = 0.0f;
    d.sp.seed = (uint64_t)(int64_t)seed;
    const char *bad = sampling_params_check(&d.sp);
    if (bad) user_error("generate: %s", bad);
    if (d.max_new < 1) user_error("--max-new-tokens must be >= 1");
    if (d.min_new < 0 || d.min_new > d.max_new) user_error("--min-new-tokens must be in [0, --max-new-tokens]");
    if (d.logprobs < 0 || d.logprobs > 20) user_error("--logprobs must be in [0, 20]");
    /* --stop: a JSON list of strings, else the text itself (so "[END]" is a stop string) */
    if (stop) {
        d.stop = cJSON_ParseWithOpts(stop, NULL, 1);
        if (!cJSON_IsArray(d.stop)) { cJSON_Delete(d.stop); d.stop = cJSON_CreateString(stop); }
    }
    if (stop_ids) {
        char *txt = xmalloc(strlen(stop_ids) + 3);
        sprintf(txt, "[%s]", stop_ids);
        d.stop_ids = cJSON_ParseWithOpts(txt, NULL, 1);
        if (!d.stop_ids) user_error("--stop-token-ids: expected comma-separated token ids, got \"%s\"", stop_ids);
        free(txt);
    }
    same_file_check(in_path, out_path);
    if (block < 1 || max_batch < 1 || max_batch_tokens < 1 || threads < 0 || !(kv_mib > 0))
        user_error("--block-size, --max-batch, --max-batch-tokens, --threads, --kv-cache-mem must be positive");
    threads = backend_set_threads(threads);

    Mesh mesh;
    mesh_init_world(&mesh, tp, pp);
    Run run = {0};
    run.resume_keep = -1;   /* keep the whole file (--resume may say less); 0 would truncate a pipe */
    run.out_path = out_path;
    run.pending_path = xmalloc(strlen(out_path) + sizeof ".pending");
    sprintf(run.pending_path, "%s.pending", out_path);
    run.pending_fd = -1;
    run.mesh = &mesh;
    run.leader = mesh.tp_rank == 0 && mesh.pp_rank == 0;
    Model m;
    model_load(&m, model_dir, &mesh);
    char err[1024];
    run.tok = tokenizer_open(model_dir, err, sizeof err);   /* optional: input_ids work without one */
    if (d.chat_template && run.tok && chat_format_resolve(run.tok, d.chat_template, err, sizeof err) < 0)
        user_error("--chat-template: %s", err);        /* checked even when no line has "messages" */
    int eos[3 * MAX_EOS_IDS + 1], n_eos = 0;
    for (int k = 0; k < m.cfg.n_eos; k++) eos[n_eos++] = m.cfg.eos_ids[k];
    n_eos = add_generation_eos(model_dir, eos, n_eos);
    if (run.tok && tokenizer_eos_id(run.tok) >= 0) {
        int e = tokenizer_eos_id(run.tok), have = 0;
        for (int k = 0; k < n_eos; k++) have |= eos[k] == e;
        if (!have) eos[n_eos++] = e;
    }
    read_input(&run, in_path, &d, &m.cfg, eos, n_eos);
    if (resume) resume_scan(&run, out_path);
    run.progress = show_progress || isatty(2);
    if (mesh_is_root(&mesh)) {
        fprintf(stderr, "+------------------------+--------------------------------+\n");
        args_print(opts, n_opts);
        model_print_summary(&m);
    }

    EngineConfig ec = {max_batch, max_batch_tokens, (size_t)(kv_mib * 1048576.0), block, m.cfg.max_pos,
                       micro < 1 ? m.mesh->pp : micro, 0, on_token, on_finish, &run, on_step, 0, 0};
    int max_len = 1;
    for (int i = 0; i < run.n; i++) {
        Seq *s = &run.gens[i].seq;
        if (s->n_prompt + s->max_new > max_len) max_len = s->n_prompt + s->max_new;
    }
    Engine *e = engine_new(&m, &ec, max_len);
    MemPlan plan = model_mem_plan(&m);
    plan.kv = engine_stats(e).kv_bytes;
    plan.acts += engine_stats(e).act_bytes;
    model_print_memory_plan(&m, &plan);
    for (int i = 0; i < run.n; i++) {
        Gen *g = &run.gens[i];
        if (g->skip) continue;
        if (run.tok) {
            tok_stream_init(&g->ts, run.tok, 1);
            g->ts.n_seen = 1;  /* the completion continues the prompt: keep its first token's leading space */
        }
        run.n_total++;
        char err[256];
        if (engine_check(e, &g->seq, err, sizeof err)) user_error("%s:%d: %s", in_path, g->in_line, err);
        if (i % mesh.dp != mesh.dp_rank) {   /* another data-parallel group's prompt */
            run.n_remote++;
            continue;
        }
        CHECK(engine_add(e, &g->seq, err, sizeof err) == 0);
    }
    /* every input check is done: only now is the output file created */
    if (mesh_is_root(&mesh)) {
        run.fd = open(out_path, O_WRONLY | O_CREAT | O_APPEND | (resume ? 0 : O_TRUNC), 0644);
        if (run.fd < 0) user_error("%s: cannot open for writing: %s", out_path, strerror(errno));
        if (run.resume_keep >= 0 && ftruncate(run.fd, (off_t)run.resume_keep) != 0)
            user_error("%s: cannot drop the partial last line: %s", out_path, strerror(errno));
        struct stat st;
        if (fstat(run.fd, &st) != 0 || !S_ISREG(st.st_mode)) {   /* a pipe or device: nothing to resume */
            free(run.pending_path);
            run.pending_path = NULL;
        } else if (!resume && unlink(run.pending_path) != 0 && errno != ENOENT) {   /* a stale one: not this output's */
            user_error("%s: cannot remove: %s", run.pending_path, strerror(errno));
        }
    }
    comm_barrier(&mesh.group);
    run.t0 = now_seconds();
    write_ready(&run, -1);
    engine_run(e);
    if (mesh_is_root(&mesh)) collect_lines(&run, run.n_remote);   /* the other groups' last lines */
    else run.n_remote = 0;
    for (int i = 0; i < run.n_out; i++) { comm_wait(&run.reqs[i]); free(run.outbox[i]); }
    free(run.reqs);
    free(run.outbox);
    write_ready(&run, -1);
    CHECK(!mesh_is_root(&mesh) || run.next_write == run.n);
    /* a deferred write error (NFS, quota) surfaces at close: the pending file then stays for --resume */
    if (mesh_is_root(&mesh) && close(run.fd) != 0) user_error("%s: write failed at close: %s", out_path, strerror(errno));
    if (mesh_is_root(&mesh) && run.pending_path) {   /* every line is in the output now */
        if (run.pending_fd >= 0) close(run.pending_fd);
        if (unlink(run.pending_path) != 0 && errno != ENOENT) user_error("%s: cannot remove: %s", run.pending_path, strerror(errno));
    }
    free(run.pending_path);
    progress(&run, PROGRESS_FINAL);
    EngineStats st = engine_stats(e);
    /* the report sums the data-parallel groups (each group's ranks hold the same numbers) */
    double agg[6] = {(double)run.gen_tokens, (double)st.prefill_tokens, st.prefill_s, (double)st.decode_tokens,
                     st.decode_s, (double)st.preemptions};
    if (!run.leader) memset(agg, 0, sizeof agg);
    comm_all_reduce_sum_f64(&mesh.group, agg, 6);
    run.gen_tokens = (long)agg[0];
    st.prefill_tokens = (long)agg[1]; st.decode_tokens = (long)agg[3]; st.preemptions = (long)agg[5];
    st.prefill_s = agg[2] / mesh.dp; st.decode_s = agg[4] / mesh.dp;   /* groups run at the same time */
    double peak = peak_rss_mib();
    float pk = (float)peak;
    comm_all_reduce_max(&mesh.group, &pk, 1);
    if (mesh_is_root(&mesh)) {
        fprintf(stderr, "generated: %d prompts, %ld tokens in %.2f s | prefill steps %ld tokens %.1f tok/s | decode steps %ld tokens "
                        "%.1f tok/s | %ld steps, %ld preemptions | KV %d blocks x %d tokens, peak %d used | peak RSS %.1f MiB/rank\n",
                run.n_total, run.gen_tokens, now_seconds() - run.t0, st.prefill_tokens,
                st.prefill_s > 0 ? st.prefill_tokens / st.prefill_s : 0.0, st.decode_tokens,
                st.decode_s > 0 ? st.decode_tokens / st.decode_s : 0.0, st.steps, st.preemptions, st.kv_blocks,
                st.kv_block_tokens, st.peak_blocks_used, pk);
    }
    engine_free(e);
    for (int i = 0; i < run.n; i++) {
        Gen *g = &run.gens[i];
        free(g->seq.prompt); free(g->seq.stop_ids); seq_free(&g->seq);
        free(g->id_json); free(g->prompt_json); free(g->text); free(g->line);
        for (int k = 0; k < g->n_stops; k++) free(g->stops[k]);
    }
    free(run.gens);
    if (run.tok) tokenizer_free(run.tok);
    cJSON_Delete(d.stop);
    cJSON_Delete(d.stop_ids);
    model_free(&m);
    mesh_free(&mesh);
    comm_finalize();
    return 0;
}
