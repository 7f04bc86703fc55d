/* generate.c — `tandem generate --model DIR --input prompts.jsonl --output out.jsonl`.
 * Owns: the options, the engine run (its callbacks: stop strings on decoded text, finished lines),
 * moving finished lines of other data-parallel groups to rank 0, progress and the final report.
 * Does not own: what a line asks for (request.c), the output file and --resume (output.c),
 * scheduling and the KV cache (engine.c, kv_cache.c). Every rank reads (and checks) the same
 * input, a line at a time as its group's engine has room; the ranks of one dp group run the same
 * schedule over that group's prompts; rank 0 alone writes. */
#include "generate/generate.h"
#include "generate/engine.h"
#include "generate/output.h"
#include "generate/request.h"
#include "kernels/kernels.h"
#include "runtime/session.h"
#include "runtime/args.h"
#include "runtime/util.h"
#include "tokenizer/tokenizer.h"
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* An input line this rank runs: its request and its completion as it is decoded. Allocated one by
 * one (the engine keeps &req.seq), freed when it finishes: memory holds the lines in flight only. */
typedef struct {
    Request req;
    char *text;           /* decoded completion so far (special tokens skipped) */
    size_t len, cap;
    TokStream ts;
    int stopped;          /* finished by a stop string (the text is already cut) */
} Line;

static Line *line_of(Seq *s) { return (Line *)((char *)s - offsetof(Line, req.seq)); }
static void line_free(Line *l) {
    request_free(&l->req);
    free(l->text);
    free(l);
}

typedef struct {
    /* the input, read as the engine has room: this group keeps read_ahead of its lines in the
     * engine; a line longer than the engine was sized for waits in `held` (and the reading with
     * it) until the engine has drained, then the engine is made anew for it */
    RequestReader rd;
    Line **held;          /* (n_held) this group's lines read and not yet in the engine, in input order */
    int n_held, cap_held;
    int inflight;         /* this group's lines in the engine */
    int read_ahead;       /* 2 x --max-batch, at least READ_AHEAD_MIN */
    int eos[EOS_IDS_CAP]; /* the reader's EOS ids */
    EngineStats past;     /* the counters of the engines made anew (run_all) */
    Engine *e;
    int max_len;          /* the engine's size: prompt + max_new of its longest line */
    Model *m;
    EngineConfig *ec;
    Tokenizer *tok;
    Output out;
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
    CommRequest *sends;   /* a leader's sends, a ring of OUTBOX slots (their buffers in outbox) */
    char **outbox;
    int n_out;            /* lines sent so far: line k in slot k % OUTBOX */
} Run;

enum { TAG_LINE = 7 };  /* message: 4-byte input index, then the line */
/* A leader's sends in flight at most: rank 0 takes lines in at every step (on_step), so the oldest
 * has long arrived when its slot comes round; memory stays that of the lines in flight */
enum { OUTBOX = 256 };
/* Lines a group keeps in flight at least: a small --max-batch still reads the input (and finds its
 * errors) a few hundred lines at a time */
enum { READ_AHEAD_MIN = 256 };

/* The progress line: when a prompt finishes (PROGRESS_DONE), at most twice a second between
 * (PROGRESS_TICK, every engine step), and once at the end. Tokens/s counts every token generated so
 * far by rank 0's group, and other groups' finished prompts; the prompt count is of those read so
 * far until the input's end. */
enum { PROGRESS_TICK, PROGRESS_DONE, PROGRESS_FINAL };
static void progress(Run *run, int why) {
    if (!run->progress || !mesh_is_root(run->mesh)) return;
    double t = now_seconds(), dt = t - run->t0 > 0 ? t - run->t0 : 1e-9;
    if (why == PROGRESS_TICK && t - run->shown < 0.5) return;
    run->shown = t;
    double rate = run->n_done / dt;   /* prompts per second */
    fprintf(stderr, "\r[%d/%d%s prompts] %.1f tokens/s, ", run->n_done, run->n_total, run->rd.eof ? "" : "+",
            (run->live_tokens + run->remote_tokens) / dt);
    if (rate > 0 && run->rd.eof) fprintf(stderr, "ETA %.0f s   ", (run->n_total - run->n_done) / rate);
    else fprintf(stderr, "ETA -   ");
    if (why == PROGRESS_FINAL) fputc('\n', stderr);
    fflush(stderr);
}

/* ---- reading the input ------------------------------------------------------------------ */

static int line_len(const Line *l) { return l->req.seq.n_prompt + l->req.seq.max_new; }

/* Every line is checked against the KV cache, whichever group runs it (the error then comes from
 * every rank). */
static void check_fit(Run *run, const Line *l) {
    char err[256];
    if (engine_check(run->e, &l->req.seq, err, sizeof err)) user_error("%s:%d: %s", run->rd.path, l->req.in_line, err);
}

/* whether line l is this data-parallel group's (group g runs the prompts i with i % dp == g) */
static int owns(const Run *run, const Line *l) { return l->req.seq.index % run->mesh->dp == run->mesh->dp_rank; }

/* A line read once the engine exists: checked, then held for the engine, or dropped as another
 * group's (counted: rank 0 receives its output) */
static void route(Run *run, Line *l) {
    check_fit(run, l);
    if (!owns(run, l)) {
        run->n_remote++;
        line_free(l);
        return;
    }
    if (run->n_held == run->cap_held) run->held = xrealloc(run->held, sizeof(Line *) * (run->cap_held = 2 * run->cap_held + 16));
    run->held[run->n_held++] = l;
}

/* Reads the next input line: its output slot; this group's line goes to `held`, another group's
 * or one --resume skips is dropped. keep (the first lines, read before the engine exists):
 * every line read is appended to *keep (n_keep) instead, unchecked. 0 at the end of the input. */
static int read_one(Run *run, Line ***keep, int *n_keep) {
    Line *l = xcalloc(1, sizeof(Line));
    if (!requests_next(&run->rd, &l->req)) {
        free(l);
        return 0;
    }
    if (output_add(&run->out, l->req.id_json)) {
        line_free(l);
        return 1;
    }
    run->n_total++;
    if (run->tok) {
        tok_stream_init(&l->ts, run->tok, 1);
        l->ts.n_seen = 1;  /* the completion continues the prompt: keep its first token's leading space */
    }
    if (keep) {
        *keep = xrealloc(*keep, sizeof(Line *) * (*n_keep + 1));
        (*keep)[(*n_keep)++] = l;
        return 1;
    }
    route(run, l);
    return 1;
}

/* Keeps read_ahead of this group's lines in the engine, reading as they are needed; stops at a line
 * longer than the engine's size. What enters the engine when depends only on the group's lines and
 * their finishing, so the ranks of a group (rank 0 also reads ahead for other groups' lines) agree. */
static void refill(Run *run) {
    while (run->inflight < run->read_ahead) {
        if (!run->n_held && !read_one(run, NULL, NULL)) return;
        if (!run->n_held) continue;
        Line *l = run->held[0];
        if (line_len(l) > run->max_len) return;
        char err[256];
        CHECK(engine_add(run->e, &l->req.seq, err, sizeof err) == 0);
        run->inflight++;
        memmove(run->held, run->held + 1, sizeof(Line *) * --run->n_held);
    }
}

/* ---- engine callbacks ------------------------------------------------------------------- */

static int on_token(void *ctx, Seq *s) {
    Run *run = ctx;
    Line *g = line_of(s);
    const Request *r = &g->req;
    run->live_tokens++;
    if (!run->tok) return 0;
    size_t before = g->len;
    tok_stream_push(&g->ts, s->out[s->n_out - 1], &g->text, &g->len, &g->cap);
    if (s->n_out <= s->min_new) return 0;  /* min_new_tokens: as for stop ids, the first min_new tokens
                                             * cannot end a stop (vLLM's min_tokens holds stop strings too) */
    char *first = stop_find(r->stops, r->n_stops, g->text, g->len, before);
    if (!first) return 0;
    g->len = (size_t)(first - g->text);   /* cut the stop string and what follows it */
    g->text[g->len] = 0;
    g->stopped = 1;
    return 1;
}

static void on_finish(void *ctx, Seq *s) {
    Run *run = ctx;
    Line *g = line_of(s);
    if (run->tok && !g->stopped) tok_stream_flush(&g->ts, &g->text, &g->len, &g->cap);
    if (!run->tok) { g->text = xstrdup(""); }
    int idx = s->index, n_out = s->n_out;
    run->inflight--;
    run->n_done++;
    run->gen_tokens += n_out;
    char *line = run->leader ? format_line(&g->req, g->text) : NULL;
    line_free(g);   /* s with it: the engine drops it after this call */
    if (!run->leader) return;
    if (mesh_is_root(run->mesh)) {
        output_ready(&run->out, idx, line);
        progress(run, PROGRESS_DONE);
        return;
    }
    /* another group's leader: to rank 0, [index][tokens][line] */
    size_t n = strlen(line);
    char *msg = xmalloc(8 + n);
    int32_t head[2] = {idx, n_out};
    memcpy(msg, head, 8);
    memcpy(msg + 8, line, n);
    free(line);
    if (!run->outbox) {
        run->outbox = xcalloc(OUTBOX, sizeof(char *));
        run->sends = xcalloc(OUTBOX, sizeof(CommRequest));
    }
    int k = run->n_out % OUTBOX;
    comm_wait(&run->sends[k]);   /* the line OUTBOX before this one */
    free(run->outbox[k]);
    run->outbox[k] = msg;
    run->sends[k] = (CommRequest){NULL, NULL};
    comm_isend_tag(&run->mesh->group, msg, 8 + n, 0, TAG_LINE, &run->sends[k]);
    run->n_out++;
}

/* Rank 0: take in other groups' finished lines (blocking until `want` more have come). A line of
 * another group may come before rank 0 has read that far: it reads on to its slot. */
static void collect_lines(Run *run, int want) {
    int src;
    size_t bytes;
    while (run->n_remote > 0 && comm_probe(&run->mesh->group, TAG_LINE, want > 0, &src, &bytes)) {
        char *msg = xmalloc(bytes + 1);
        comm_recv_tag(&run->mesh->group, msg, bytes, src, TAG_LINE);
        int32_t head[2];   /* index, tokens */
        memcpy(head, msg, 8);
        int idx = head[0];
        while (idx >= run->out.n) CHECK(read_one(run, NULL, NULL));
        CHECK(bytes >= 8 && idx >= 0);
        char *line = xmalloc(bytes - 8 + 1);
        memcpy(line, msg + 8, bytes - 8);
        line[bytes - 8] = 0;
        run->remote_tokens += head[1];
        free(msg);
        run->n_remote--;
        run->n_done++;
        want--;
        output_ready(&run->out, idx, line);
        progress(run, PROGRESS_DONE);
    }
}

static void on_step(void *ctx) {
    Run *run = ctx;
    if (mesh_is_root(run->mesh) && run->n_remote) collect_lines(run, 0);
    refill(run);
    progress(run, PROGRESS_TICK);
}

/* ---- setup and report ------------------------------------------------------------------- */

/* --output must not be --input (that would overwrite the prompts as they are read). */
static void same_file_check(const char *in, const char *out) {
    struct stat a, b;
    if (stat(in, &a) == 0 && stat(out, &b) == 0 && S_ISREG(a.st_mode) && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
        user_error("%s: --output is the --input file", out);
}

/* The options no line overrides, and the defaults of those it may. */
static void options_check(RequestDefaults *d, int greedy, int seed, const char *stop) {
    if (greedy) d->sp.temperature = 0.0f;
    d->sp.seed = (uint64_t)(int64_t)seed;
    const char *bad = sampling_params_check(&d->sp);
    if (bad) user_error("generate: %s", bad);
    if (d->max_new < 1) user_error("--max-new-tokens must be >= 1");
    if (d->min_new < 0 || d->min_new > d->max_new) user_error("--min-new-tokens must be in [0, --max-new-tokens]");
    if (d->logprobs < 0 || d->logprobs > 20) user_error("--logprobs must be in [0, 20]");
    if (stop) d->n_stops = stops_parse_flag(stop, d->stops);
}

/* The engine, sized for the longest of the first lines (read before it: their errors come first,
 * as every input error did when generate read all of its input first), and a memory plan with it. */
static void engine_start(Run *run, Line **first, int n_first) {
    run->max_len = 1;
    for (int i = 0; i < n_first; i++)
        if (line_len(first[i]) > run->max_len) run->max_len = line_len(first[i]);
    run->e = engine_new(run->m, run->ec, run->max_len);
    MemPlan plan = model_mem_plan(run->m);
    plan.kv = engine_stats(run->e).kv_bytes;
    plan.acts += engine_stats(run->e).act_bytes;
    model_print_memory_plan(run->m, &plan);
    for (int i = 0; i < n_first; i++) route(run, first[i]);
    free(first);
}

/* The first lines: until read_ahead of this group's (or the end). */
static int read_first(Run *run, Line ***first) {
    int n = 0, own = 0;
    *first = NULL;
    while (own < run->read_ahead) {
        int before = n;
        if (!read_one(run, first, &n)) break;
        if (n > before && owns(run, (*first)[n - 1])) own++;
    }
    return n;
}

/* The engine's counters of a run that made it anew: the earlier engines' added in. */
static void stats_add(EngineStats *sum, const EngineStats *a) {
    sum->prefill_tokens += a->prefill_tokens; sum->decode_tokens += a->decode_tokens;
    sum->steps += a->steps; sum->preemptions += a->preemptions;
    sum->prefill_s += a->prefill_s; sum->decode_s += a->decode_s;
    if (a->peak_blocks_used > sum->peak_blocks_used) sum->peak_blocks_used = a->peak_blocks_used;
    sum->kv_blocks = a->kv_blocks; sum->kv_block_tokens = a->kv_block_tokens;
}

/* Generates every line; rank 0 writes them in input order as they finish. A line longer than the
 * engine's size waits for the engine to drain, which is then made anew for it (tokens do not
 * depend on the batch: the same bytes). */
static void run_all(Run *run, int resume) {
    comm_barrier(&run->mesh->group);
    run->t0 = now_seconds();
    output_ready(&run->out, -1, NULL);
    for (;;) {
        refill(run);
        engine_run(run->e);
        moe_drain(run->m);   /* ep > 1: the ep group's exchanges until its every rank is done (runtime/moe_ep.c) */
        /* twice the size, or the line's if more (a few drains at most); the line alone decides,
         * so every rank of the group (rank 0 may have read further) sizes it the same. The engine's
         * making is collective over every rank (the KV pool's sizing): when any group holds a line,
         * every group makes the largest size asked (a group without one runs it empty) */
        float need = 0;
        if (run->n_held) {
            need = 2 * run->max_len < run->ec->max_ctx ? 2 * run->max_len : run->ec->max_ctx;
            if (line_len(run->held[0]) > need) need = line_len(run->held[0]);
        }
        comm_all_reduce_max(&run->mesh->group, &need, 1);   /* exact: a length < 2^24 */
        if (need == 0) break;
        EngineStats st = engine_stats(run->e);
        stats_add(&run->past, &st);
        engine_free(run->e);
        run->max_len = (int)need;
        run->e = engine_new(run->m, run->ec, run->max_len);
    }
    CHECK(run->rd.eof && run->inflight == 0);
    if (mesh_is_root(run->mesh)) collect_lines(run, run->n_remote);   /* the other groups' last lines */
    else run->n_remote = 0;
    for (int i = 0; i < run->n_out && i < OUTBOX; i++) { comm_wait(&run->sends[i]); free(run->outbox[i]); }
    free(run->sends);
    free(run->outbox);
    output_ready(&run->out, -1, NULL);
    output_close(&run->out, resume);
}

static void run_free(Run *run) {
    free(run->held);
    requests_close(&run->rd);
    if (run->tok) tokenizer_free(run->tok);
}

/* The last line: the data-parallel groups summed (each group's ranks hold the same numbers). */
static void report(Run *run) {
    const Mesh *mesh = run->mesh;
    EngineStats st = run->past, last = engine_stats(run->e);
    stats_add(&st, &last);
    double agg[6] = {(double)run->gen_tokens, (double)st.prefill_tokens, st.prefill_s, (double)st.decode_tokens,
                     st.decode_s, (double)st.preemptions};
    if (!run->leader) memset(agg, 0, sizeof agg);
    comm_all_reduce_sum_f64(&mesh->group, agg, 6);
    run->gen_tokens = (long)agg[0];
    st.prefill_tokens = (long)agg[1]; st.decode_tokens = (long)agg[3]; st.preemptions = (long)agg[5];
    st.prefill_s = agg[2] / mesh->dp; st.decode_s = agg[4] / mesh->dp;   /* groups run at the same time */
    double peak = peak_rss_mib();
    float pk = (float)peak;
    comm_all_reduce_max(&mesh->group, &pk, 1);
    if (mesh_is_root(mesh)) {
        fprintf(stderr, "generated: %d prompts, %ld tokens in %.2f s | prefill steps %ld tokens %.1f tok/s | decode steps %ld tokens "
                        "%.1f tok/s | %ld steps, %ld preemptions | KV %d blocks x %d tokens, peak %d used | peak RSS %.1f MiB/rank\n",
                run->n_total, run->gen_tokens, now_seconds() - run->t0, st.prefill_tokens,
                st.prefill_s > 0 ? st.prefill_tokens / st.prefill_s : 0.0, st.decode_tokens,
                st.decode_s > 0 ? st.decode_tokens / st.decode_s : 0.0, st.steps, st.preemptions, st.kv_blocks,
                st.kv_block_tokens, st.peak_blocks_used, pk);
    }
}

/* ---- main ------------------------------------------------------------------------------- */

/* The input's reader: the tokenizer (optional: input_ids work without one), --stop-token-ids and
 * the EOS ids (generate/request.h eos_ids_load); and the output (resume scan). */
static void run_read(Run *run, RequestDefaults *d, const Model *m, const char *model_dir, const char *in_path,
                     const char *out_path, const char *stop_ids, int resume) {
    char err[1024];
    run->tok = tokenizer_open(model_dir, err, sizeof err);   /* optional: input_ids work without one */
    if (d->chat_template && run->tok && chat_format_resolve(run->tok, d->chat_template, err, sizeof err) < 0)
        user_error("--chat-template: %s", err);        /* checked even when no line has "messages" */
    if (stop_ids) stop_ids_parse_flag(stop_ids, m->cfg.vocab_size, &d->stop_ids, &d->n_stop_ids);
    int n_eos = eos_ids_load(model_dir, &m->cfg, run->tok, run->eos);
    output_init(&run->out, out_path, mesh_is_root(m->mesh));
    if (resume) output_resume_scan(&run->out);
    requests_open(&run->rd, in_path, d, run->tok, &m->cfg, run->eos, n_eos);
}

/* Everything after loading: the first lines, the summary table, the engine, the output (opened
 * once the first lines are checked; an error in a later line removes it again: output.h), every
 * line as the engine has room, the final progress line and report; then the run's memory. */
static void generate_all(Run *run, Model *m, const Option *opts, int n_opts, EngineConfig *ec, int resume) {
    run->m = m;
    run->ec = ec;
    run->read_ahead = 2 * ec->max_batch > READ_AHEAD_MIN ? 2 * ec->max_batch : READ_AHEAD_MIN;
    Line **first;
    int n_first = read_first(run, &first);
    if (mesh_is_root(m->mesh)) {
        fprintf(stderr, "+------------------------+--------------------------------+\n");
        args_print(opts, n_opts);
        model_print_summary(m);
    }
    engine_start(run, first, n_first);
    if (mesh_is_root(m->mesh)) output_open(&run->out, resume);
    run_all(run, resume);
    progress(run, PROGRESS_FINAL);
    report(run);
    engine_free(run->e);
    run_free(run);
}

int generate_main(int argc, char **argv) {
    const char *in_path, *out_path;
    ModelOpen mo = {0};
    RequestDefaults d = {0};
    const char *stop = NULL, *stop_ids = NULL;
    int greedy, resume, show_progress, max_batch, max_batch_tokens, block, seed, micro;
    float kv_mib;
    Option opts[] = {
        {"--model", OPT_MODEL, &mo.dir, NULL, "Hugging Face model directory or Hub id ORG/NAME"},
        ADAPTER_OPTION(&mo.adapter),
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
        {"--chat-template", OPT_STR, &d.chat_template, NULL, "llama2 | mistral | chatml | chatml-think | llama3 | qwen3 | qwen3-nothink (default: detected)"},
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
        MODEL_OPEN_OPTIONS(&mo),
    };
    int n_opts = sizeof(opts) / sizeof(opts[0]);
    comm_init(&argc, &argv);
    sampling_params_default(&d.sp);
    args_parse("usage: tandem generate --model DIR --input prompts.jsonl --output out.jsonl [options]", opts, n_opts, argc, argv);
    if (!mo.dir || !in_path || !out_path) user_error("generate: --model, --input and --output are required");
    options_check(&d, greedy, seed, stop);
    same_file_check(in_path, out_path);
    if (block < 1 || max_batch < 1 || max_batch_tokens < 1 || mo.threads < 0 || !(kv_mib > 0))
        user_error("--block-size, --max-batch, --max-batch-tokens, --threads, --kv-cache-mem must be positive");

    Mesh mesh;
    Model m;
    model_open(&mo, &mesh, &m);
    Run run = {0};
    run.mesh = &mesh;
    run.leader = mesh.tp_rank == 0 && mesh.pp_rank == 0;
    run_read(&run, &d, &m, mo.dir, in_path, out_path, stop_ids, resume);
    run.progress = show_progress || isatty(2);
    EngineConfig ec = {max_batch, max_batch_tokens, (size_t)(kv_mib * 1048576.0), block, m.cfg.max_pos,
                       micro < 1 ? m.mesh->pp : micro, 0, on_token, on_finish, &run, on_step, 0, 0, 0};
    generate_all(&run, &m, opts, n_opts, &ec, resume);
    for (int k = 0; k < d.n_stops; k++) free(d.stops[k]);
    free(d.stop_ids);
    model_free(&m);
    mesh_free(&mesh);
    comm_finalize();
    return 0;
}
