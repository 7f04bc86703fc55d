/* verify.c — the pool that scores a batch (verify_batch), the code grader's test loop, the checks
 * of a reference, and `tandem verify`. The graders themselves: rlhf/verify_math.c (math, format),
 * rlhf/sandbox.c (running one program). */
#include "rlhf/verify.h"
#include "rlhf/sandbox.h"
#include "runtime/args.h"
#include "runtime/jsonl.h"
#include "runtime/util.h"
#include <ctype.h>
#include <errno.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static const char *const kind_names[] = {"math", "code", "format"};

VerifyKind verify_kind_parse(const char *flag, const char *name) {
    for (int k = 0; k < 3; k++)
        if (name && !strcmp(name, kind_names[k])) return (VerifyKind)k;
    user_error("%s: unknown verifier '%s' (math | code | format)", flag, name ? name : "");
}

const char *verify_kind_name(VerifyKind kind) { return kind_names[kind]; }

static int string_array(const cJSON *a) {
    if (!cJSON_IsArray(a)) return -1;
    int n = 0;
    for (const cJSON *e = a->child; e; e = e->next, n++)
        if (!cJSON_IsString(e)) return -1;
    return n;
}

int verify_ref_check(VerifyKind kind, const cJSON *ref, char *err, size_t errlen) {
    if (kind == VERIFY_FORMAT) return 0;
    if (!cJSON_IsObject(ref)) {
        snprintf(err, errlen, "no reference object");
        return -1;
    }
    if (kind == VERIFY_MATH) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(ref, "answer");
        if (cJSON_IsNumber(a) || (cJSON_IsString(a) && strlen(a->valuestring) <= VERIFY_ANSWER_MAX)) return 0;
        snprintf(err, errlen, "field \"answer\" %s",
                 !a ? "missing" : cJSON_IsString(a) ? "longer than 1024 bytes" : "is not a string or a number");
        return -1;
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(ref, "tests");
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(t, "inputs"), *out = cJSON_GetObjectItemCaseSensitive(t, "outputs");
    int ni = string_array(in), no = string_array(out);
    if (!cJSON_IsObject(t)) snprintf(err, errlen, "field \"tests\" %s", t ? "is not an object" : "missing");
    else if (ni < 0 || no < 0)
        snprintf(err, errlen, "field \"tests\": \"%s\" is not an array of strings", ni < 0 ? "inputs" : "outputs");
    else if (ni != no) snprintf(err, errlen, "field \"tests\": %d inputs but %d outputs", ni, no);
    else if (ni == 0) snprintf(err, errlen, "field \"tests\": empty test list");
    else return 0;
    return -1;
}

/* ---- code ---------------------------------------------------------------------------------------- */

/* The body of the response's last fenced block (``` lines), malloc'd in *program; 0 with why in
 * reason if there is none, it is not closed, its language is not python, or it is over
 * VERIFY_SCAN_MAX bytes. */
static int code_program(const char *s, char **program, char *reason, size_t rlen) {
    const char *open = NULL, *body = NULL, *last_body = NULL, *last_end = NULL, *info = NULL, *last_info = NULL;
    for (const char *line = s; line && *line;) {
        const char *nl = strchr(line, '\n'), *p = line;
        while (*p == ' ' || *p == '\t') p++;
        if (!strncmp(p, "```", 3)) {
            if (!open) open = line, info = p + 3, body = nl ? nl + 1 : p + strlen(p);
            else last_body = body, last_end = line, last_info = info, open = NULL;
        }
        line = nl ? nl + 1 : NULL;
    }
    if (open) { snprintf(reason, rlen, "the last fenced code block is not closed"); return 0; }
    if (!last_body) { snprintf(reason, rlen, "no fenced code block"); return 0; }
    char lang[32] = "";
    size_t k = 0;
    while (k < sizeof lang - 1 && last_info[k] && !isspace((unsigned char)last_info[k]))
        lang[k] = (char)tolower((unsigned char)last_info[k]), k++;
    lang[k] = 0;
    if (*lang && strcmp(lang, "python") && strcmp(lang, "py") && strcmp(lang, "python3")) {
        char q[40];
        verify_quote(q, sizeof q, lang, strlen(lang));
        snprintf(reason, rlen, "the last code block is %s, not python", q);
        return 0;
    }
    size_t n = last_body <= last_end ? (size_t)(last_end - last_body) : 0;
    if (n > VERIFY_SCAN_MAX) {   /* it must fit the sandbox's working directory (sandbox.h) */
        snprintf(reason, rlen, "the program is longer than %d bytes", VERIFY_SCAN_MAX);
        return 0;
    }
    *program = xmalloc(n + 1);
    memcpy(*program, last_body, n);
    (*program)[n] = 0;
    return 1;
}

/* s[0..n) without trailing whitespace: the length kept. */
static size_t rtrim(const char *s, size_t n) {
    while (n && isspace((unsigned char)s[n - 1])) n--;
    return n;
}

/* One code sample: every test in turn, all within the sample's deadline. -1 (err) on a sandbox fault. */
static int code_sample(const char *response, const cJSON *ref, double timeout_s, int slot, VerifyResult *r,
                       char *err, size_t errlen) {
    char *program = NULL;
    if (!code_program(response, &program, r->reason, sizeof r->reason)) return 0;
    const cJSON *tests = cJSON_GetObjectItemCaseSensitive(ref, "tests");
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(tests, "inputs")->child;
    const cJSON *want = cJSON_GetObjectItemCaseSensitive(tests, "outputs")->child;
    double deadline = now_seconds() + timeout_s;
    SandboxLimits lim = sandbox_default_limits();
    lim.cpu_s = timeout_s;
    int rc = 0, pass = 1;
    for (int i = 1; in && pass; in = in->next, want = want->next, i++) {
        SandboxResult res;
        if (sandbox_run(program, in->valuestring, strlen(in->valuestring), deadline, slot, &lim, &res, err, errlen)) {
            rc = -1;
            break;
        }
        char got[48], exp[48];
        pass = 0;
        int cpu = res.status == SANDBOX_SIGNALED && res.code == SIGXCPU;   /* RLIMIT_CPU's soft limit */
        if (res.status == SANDBOX_TIMEOUT || cpu) {
            r->timed_out = 1;
            snprintf(r->reason, sizeof r->reason, "test %d: timeout (over %.3g s %s)", i, timeout_s,
                     res.status == SANDBOX_TIMEOUT ? "of wall clock" : "of CPU");
        } else if (res.status == SANDBOX_OUTPUT_LIMIT)
            snprintf(r->reason, sizeof r->reason, "test %d: output limit (over %zu bytes)", i, lim.out_bytes);
        else if (res.status == SANDBOX_SIGNALED)
            snprintf(r->reason, sizeof r->reason, "test %d: killed by signal %d (%s)%s", i, res.code,
                     sigdescr_np(res.code) ? sigdescr_np(res.code) : "?",   /* strsignal is not thread-safe */
                     res.code == SIGXFSZ ? ": file size limit" : "");
        else if (res.code != 0) {
            char line[100];
            verify_quote(line, sizeof line, res.err_last, strlen(res.err_last));
            snprintf(r->reason, sizeof r->reason, "test %d: runtime error (exit %d): %s", i, res.code, line);
        } else {
            size_t gl = rtrim(res.out, res.out_len), wl = rtrim(want->valuestring, strlen(want->valuestring));
            pass = gl == wl && !memcmp(res.out, want->valuestring, gl);
            if (!pass) {
                verify_quote(got, sizeof got, res.out, gl);
                verify_quote(exp, sizeof exp, want->valuestring, wl);
                snprintf(r->reason, sizeof r->reason, "test %d: wrong answer: got \"%s\", expected \"%s\"", i, got, exp);
            }
        }
        free(res.out);
    }
    free(program);
    if (rc == 0 && pass) {
        r->reward = 1;
        snprintf(r->reason, sizeof r->reason, "passed %d tests", cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(tests, "inputs")));
    }
    return rc;
}

/* ---- the pool ------------------------------------------------------------------------------------ */

int verify_batch(VerifyKind kind, int n, const char *const *responses, const cJSON *const *refs, int workers,
                 double timeout_s, VerifyResult *out, char *err, size_t errlen) {
    if (workers < 1 || workers > VERIFY_MAX_WORKERS || !(timeout_s > 0)) {
        snprintf(err, errlen, "verify: workers must be 1..%d and the timeout > 0 (got %d, %g)", VERIFY_MAX_WORKERS,
                 workers, timeout_s);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        memset(&out[i], 0, sizeof out[i]);
        char why[160];
        if (verify_ref_check(kind, refs ? refs[i] : NULL, why, sizeof why)) {
            snprintf(err, errlen, "verify %s: sample %d: %s", kind_names[kind], i, why);
            return -1;
        }
    }
    if (kind == VERIFY_CODE) signal(SIGPIPE, SIG_IGN);   /* a program that exits unread: EPIPE, not death */
    int failed = 0;
    /* Math and format: linear in at most VERIFY_SCAN_MAX bytes (microseconds to a few ms per sample),
     * so they run in place; the timeout is still applied, after the fact. Code: one sandbox per test,
     * a slot (uid) per thread. */
#pragma omp parallel for num_threads(workers) schedule(dynamic, 1)
    for (int i = 0; i < n; i++) {
        VerifyResult *r = &out[i];
        if (kind == VERIFY_CODE) {
            char e[256];
            int stop;
#pragma omp atomic read
            stop = failed;
            if (stop) continue;
            if (code_sample(responses[i], refs[i], timeout_s, omp_get_thread_num(), r, e, sizeof e)) {
#pragma omp critical(verify_err)
                if (!failed) { failed = 1; snprintf(err, errlen, "%s", e); }
            }
            continue;
        }
        double t0 = now_seconds();
        const cJSON *answer = kind == VERIFY_MATH ? cJSON_GetObjectItemCaseSensitive(refs[i], "answer") : NULL;
        r->reward = kind == VERIFY_MATH ? verify_math(responses[i], answer, r->reason, sizeof r->reason)
                                        : verify_format(responses[i], r->reason, sizeof r->reason);
        if (now_seconds() - t0 > timeout_s) {
            r->reward = 0, r->timed_out = 1;
            snprintf(r->reason, sizeof r->reason, "timeout (over %.3g s)", timeout_s);
        }
    }
    return failed ? -1 : 0;
}

/* ---- tandem verify -------------------------------------------------------------------------------- */

int verify_main(int argc, char **argv) {
    const char *usage = "usage: tandem verify math|code|format --input F.jsonl --output O.jsonl [--workers N] [--timeout S]";
    if (argc < 2 || argv[1][0] == '-') {
        if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) { printf("%s\n", usage); return 0; }
        user_error("verify: name a verifier: math | code | format (%s)", usage + 7);
    }
    VerifyKind kind = verify_kind_parse("verify", argv[1]);
    const char *in_path = NULL, *out_path = NULL;
    int workers = 0;
    float timeout_s = 0;
    Option opts[] = {
        {"--input", OPT_STR, &in_path, NULL, "jsonl: {\"response\": ..., \"answer\": ...} (math), {\"response\": ..., \"tests\": {\"inputs\": [...], \"outputs\": [...]}} (code), {\"response\": ...} (format); \"id\" copied"},
        {"--output", OPT_STR, &out_path, NULL, "jsonl: {\"id\", \"reward\", \"reason\"} per input line, in order"},
        {"--workers", OPT_INT, &workers, "4", "samples verified at once (1..64)"},
        {"--timeout", OPT_FLOAT, &timeout_s, "10", "seconds per sample (all its tests); over it: reward 0, counted as timed out"},
    };
    args_parse(usage, opts, (int)(sizeof opts / sizeof opts[0]), argc - 1, argv + 1);
    if (!in_path) user_error("verify: --input missing");
    if (!out_path) user_error("verify: --output missing");
    if (workers < 1 || workers > VERIFY_MAX_WORKERS) user_error("--workers: must be 1..%d, got %d", VERIFY_MAX_WORKERS, workers);
    if (!(timeout_s > 0)) user_error("--timeout: must be > 0 seconds, got %g", timeout_s);

    JsonlReader rd;
    jsonl_open(&rd, in_path);
    cJSON **lines = NULL;
    const char **responses = NULL;
    int n = 0, cap = 0;
    for (cJSON *o; (o = jsonl_next(&rd));) {
        const cJSON *resp = cJSON_GetObjectItemCaseSensitive(o, "response");
        char why[200];
        if (!cJSON_IsString(resp)) user_error("%s:%d: field \"response\" %s", in_path, rd.line, resp ? "is not a string" : "missing");
        if (verify_ref_check(kind, o, why, sizeof why)) user_error("%s:%d: %s", in_path, rd.line, why);
        if (n == cap) {
            cap = cap ? 2 * cap : 256;
            lines = xrealloc(lines, (size_t)cap * sizeof *lines);
            responses = xrealloc(responses, (size_t)cap * sizeof *responses);
        }
        lines[n] = o, responses[n++] = resp->valuestring;
    }
    jsonl_close(&rd);
    VerifyResult *res = xcalloc((size_t)(n ? n : 1), sizeof *res);
    char err[300];
    double t0 = now_seconds();
    if (verify_batch(kind, n, responses, (const cJSON *const *)lines, workers, timeout_s, res, err, sizeof err))
        user_error("%s", err);
    double secs = now_seconds() - t0, sum = 0;
    int timed_out = 0;
    char *buf = NULL;
    size_t len = 0, bcap = 0;
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject(), *id = cJSON_GetObjectItemCaseSensitive(lines[i], "id");
        if (id) cJSON_AddItemToObject(o, "id", cJSON_Duplicate(id, 1));
        cJSON_AddNumberToObject(o, "reward", res[i].reward);
        cJSON_AddStringToObject(o, "reason", res[i].reason);
        if (res[i].timed_out) cJSON_AddTrueToObject(o, "timed_out");
        jsonl_append(&buf, &len, &bcap, o);
        cJSON_Delete(o);
        sum += res[i].reward, timed_out += res[i].timed_out;
    }
    if (write_file_atomic(out_path, buf ? buf : "", len)) user_error("%s: cannot write: %s", out_path, strerror(errno));
    fprintf(stderr, "verify %s: n %d, mean reward %.4f, timed out %d, %.2f s (%d workers)\n", kind_names[kind], n,
            n ? sum / n : 0.0, timed_out, secs, workers);
    for (int i = 0; i < n; i++) cJSON_Delete(lines[i]);
    free(lines), free(responses), free(res), free(buf);
    return 0;
}
