/* test_reward_cmd.c — checks behind tests/reward_cmd.bats for rlhf/reward_cmd.c, one case per run:
 *   score CMD N [TIMEOUT_S [BYTES]]  scores N responses ("response I", or BYTES letters each) with
 *                        CMD and prints the rewards one a line; or prints the error line, exits 1
 *   python               a python3 verifier answering line by line: reward = len(response) in code
 *                        points, for responses that need JSON escapes and multi-byte UTF-8
 *   labels               labels of every JSON type reach the program as the same JSON value; no
 *                        "label" field for a NULL label or NULL labels
 *   many                 5000 responses of 200 bytes (about 1 MiB each way, past any pipe buffer)
 *                        with a line-by-line program (jq), a program that reads a whole batch before
 *                        answering (python, two batches) and one that reads all its input first
 *                        (head | jq -s)
 *   counter              one long-lived program across calls: its counter goes on (1 2 3, 4 5); a
 *                        call with n = 0 writes nothing
 *   timeout              a program that reads and never answers: the error after 1 s, then
 *                        reward_cmd_stop returns at once (its stdin closes, it exits)
 *   stop DIR             a program that ignores its stdin (and started a second process): stop
 *                        returns after the 5 s grace; the two pids are written to DIR/pids for the
 *                        bats test to check that neither is left
 *   badlabel             a label that is not JSON: a CHECK (a caller's bug), not an error line
 *   end HOW DIR          a program that answers and has started a second process that outlives
 *                        its own exit; the two pids to DIR/pids; then this process ends
 *                        by HOW: stop (reward_cmd_stop: the program exits, its second process stays
 *                        behind), exit (no stop), error (rank_error), term / int / hup (that signal),
 *                        kill (SIGKILL), _exit (from a second thread, as the comm deadline stops).
 *                        The bats test checks that no pid of DIR/pids is left.
 * Each prints what failed and exits 1, or prints one "ok" line (score: its rewards). */
#include "rlhf/reward_cmd.h"
#include "runtime/util.h"
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static RewardCmd *start(const char *cmd) {
    char err[1024];
    RewardCmd *rc = reward_cmd_start(cmd, err, sizeof err);
    if (!rc) { printf("%s\n", err); exit(1); }
    return rc;
}

/* scores n or exits 1 with the error line */
static void score(RewardCmd *rc, int n, const char *const *prompts, const char *const *responses,
                  const char *const *labels, double *rewards, double timeout_s) {
    char err[1024];
    if (reward_cmd_score(rc, n, prompts, responses, labels, rewards, timeout_s, err, sizeof err)) {
        printf("%s\n", err);
        reward_cmd_stop(rc);
        exit(1);
    }
}

static int utf8_chars(const char *s) {
    int n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* n prompts "p<i>" and responses of `bytes` letters each (0: "response <i>") */
static void make_batch(int n, int bytes, char ***prompts, char ***responses) {
    *prompts = xmalloc(sizeof(char *) * (size_t)n);
    *responses = xmalloc(sizeof(char *) * (size_t)n);
    for (int i = 0; i < n; i++) {
        char buf[64];
        snprintf(buf, sizeof buf, "p%d", i);
        (*prompts)[i] = xstrdup(buf);
        if (bytes > 0) {
            char *r = xmalloc((size_t)bytes + 1);
            for (int j = 0; j < bytes; j++) r[j] = (char)('a' + (i + j) % 26);
            r[bytes] = 0;
            (*responses)[i] = r;
        } else {
            snprintf(buf, sizeof buf, "response %d", i);
            (*responses)[i] = xstrdup(buf);
        }
    }
}

static void free_batch(int n, char **prompts, char **responses) {
    for (int i = 0; i < n; i++) { free(prompts[i]); free(responses[i]); }
    free(prompts);
    free(responses);
}

static int case_score(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: test_reward_cmd score CMD N [TIMEOUT_S [BYTES]]\n"); return 2; }
    int n = atoi(argv[3]), bytes = argc > 5 ? atoi(argv[5]) : 0;
    double timeout_s = argc > 4 ? atof(argv[4]) : 0;
    char **prompts, **responses;
    make_batch(n, bytes, &prompts, &responses);
    double *rewards = xmalloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    RewardCmd *rc = start(argv[2]);
    score(rc, n, (const char *const *)prompts, (const char *const *)responses, NULL, rewards, timeout_s);
    reward_cmd_stop(rc);
    for (int i = 0; i < n; i++) printf("%.17g\n", rewards[i]);
    free_batch(n, prompts, responses);
    free(rewards);
    return 0;
}

#define PY_LEN "python3 -u -c 'import sys, json\n" \
               "for line in sys.stdin.buffer:\n" \
               "    d = json.loads(line)\n" \
               "    print(json.dumps({\"reward\": len(d[\"response\"])}), flush=True)'"

static int case_python(void) {
    const char *responses[] = {"", "plain", "quote \" backslash \\ slash /", "new\nline\ttab\r\x01\x1f end",
                               "h\xc3\xa9llo w\xc3\xb6rld \xe2\x9c\x93", "emoji \xf0\x9f\x98\x80!", "{\"reward\": 5}\n"};
    const int n = (int)(sizeof responses / sizeof *responses);
    const char *prompts[7] = {"a", "b", "c", "d", "e", "f", "g"};
    double rewards[7];
    RewardCmd *rc = start(PY_LEN);
    score(rc, n, prompts, responses, NULL, rewards, 30);
    reward_cmd_stop(rc);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        if (rewards[i] != utf8_chars(responses[i])) {
            printf("FAIL response %d: reward %g, want %d\n", i, rewards[i], utf8_chars(responses[i]));
            bad = 1;
        }
    }
    if (bad) return 1;
    printf("ok python: %d rewards = len(response) in code points (JSON escapes, UTF-8)\n", n);
    return 0;
}

/* The program writes reward 1 when the label it got, printed canonically by Python, equals the
 * prompt (which carries what we expect), "<none>" for no label field. */
#define PY_LABEL "python3 -u -c 'import sys, json\n" \
                 "for line in sys.stdin.buffer:\n" \
                 "    d = json.loads(line)\n" \
                 "    got = json.dumps(d[\"label\"], separators=(\",\", \":\"), sort_keys=True, ensure_ascii=False) if \"label\" in d else \"<none>\"\n" \
                 "    if got != d[\"prompt\"]: print(\"label\", got, \"want\", d[\"prompt\"], file=sys.stderr)\n" \
                 "    print(json.dumps({\"reward\": int(got == d[\"prompt\"]), \"got\": got}), flush=True)'"

static int case_labels(void) {
    /* label JSON text, what Python prints for the value it receives */
    const char *labels[] = {"\"abc\"", "42", " -1.5e3 ", "0.1", "1e300", "true", "false", "null",
                            "[1, \"x\", {\"a\": null}, []]", "{\"k\": [1, 2], \"b\": {\"c\": \"d\"}}", "{}", "\"\"",
                            "\"\\u00fcn\xc3\xaf \xe2\x9c\x93 \\\"q\\\" \\\\ \\n\"", NULL};
    const char *want[] = {"\"abc\"", "42", "-1500", "0.1", "1e+300", "true", "false", "null",
                          "[1,\"x\",{\"a\":null},[]]", "{\"b\":{\"c\":\"d\"},\"k\":[1,2]}", "{}", "\"\"",
                          "\"\xc3\xbcn\xc3\xaf \xe2\x9c\x93 \\\"q\\\" \\\\ \\n\"", "<none>"};
    const int n = (int)(sizeof labels / sizeof *labels);
    const char *none[14], *responses[14];
    double rewards[14];
    for (int i = 0; i < n; i++) { none[i] = "<none>"; responses[i] = "r"; }
    RewardCmd *rc = start(PY_LABEL);
    score(rc, n, want, responses, labels, rewards, 30);
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (rewards[i] != 1) { printf("FAIL label %s: the program did not get %s\n", labels[i] ? labels[i] : "NULL", want[i]); bad = 1; }
    score(rc, n, none, responses, NULL, rewards, 30);   /* labels == NULL: no label fields */
    for (int i = 0; i < n; i++)
        if (rewards[i] != 1) { printf("FAIL labels NULL: response %d has a label field\n", i); bad = 1; }
    reward_cmd_stop(rc);
    if (bad) return 1;
    printf("ok labels: %d JSON values of every type arrive as sent; NULL label or labels: no field\n", n - 1);
    return 0;
}

#define PY_BATCH "python3 -c 'import sys, json\n" \
                 "n = int(sys.argv[1])\n" \
                 "while True:\n" \
                 "    lines = [sys.stdin.buffer.readline() for _ in range(n)]\n" \
                 "    if not lines[0]: break\n" \
                 "    out = [json.dumps({\"reward\": len(json.loads(l)[\"response\"]), \"pad\": \"x\" * 300}) for l in lines]\n" \
                 "    sys.stdout.write(\"\\n\".join(out) + \"\\n\")\n" \
                 "    sys.stdout.flush()' 5000"

static int case_many(void) {
    const int n = 5000, bytes = 200;
    char **prompts, **responses;
    make_batch(n, bytes, &prompts, &responses);
    double *rewards = xmalloc(sizeof(double) * n);
    struct { const char *what, *cmd; int calls; } progs[] = {
        {"line by line (jq --unbuffered, ~230-byte replies)", "jq --unbuffered -c '{reward: (.response | length), echo: .response}'", 1},
        {"a batch read before answering (python, 330-byte replies), twice", PY_BATCH, 2},
        {"all input read first (head | jq -s)", "head -n 5000 | jq -s -c '.[] | {reward: (.response | length)}'", 1},
    };
    for (size_t p = 0; p < sizeof progs / sizeof *progs; p++) {
        double t0 = mono();
        RewardCmd *rc = start(progs[p].cmd);
        for (int c = 0; c < progs[p].calls; c++) {
            for (int i = 0; i < n; i++) rewards[i] = -1;
            score(rc, n, (const char *const *)prompts, (const char *const *)responses, NULL, rewards, 60);
            for (int i = 0; i < n; i++)
                if (rewards[i] != bytes) { printf("FAIL %s: reward %d is %g, want %d\n", progs[p].what, i, rewards[i], bytes); return 1; }
        }
        reward_cmd_stop(rc);
        printf("ok many: %d x %d bytes, %s: %.2f s\n", n, bytes, progs[p].what, mono() - t0);
    }
    free_batch(n, prompts, responses);
    free(rewards);
    return 0;
}

static int case_counter(void) {
    char **prompts, **responses;
    make_batch(3, 0, &prompts, &responses);
    double r[3];
    /* (not awk: Debian's mawk reads ahead and answers nothing until its buffer fills or input ends) */
    RewardCmd *rc = start("n=0; while read l; do n=$((n + 1)); echo \"{\\\"reward\\\": $n}\"; done");
    score(rc, 3, (const char *const *)prompts, (const char *const *)responses, NULL, r, 10);
    if (r[0] != 1 || r[1] != 2 || r[2] != 3) { printf("FAIL first call: %g %g %g, want 1 2 3\n", r[0], r[1], r[2]); return 1; }
    score(rc, 0, NULL, NULL, NULL, NULL, 10);
    score(rc, 2, (const char *const *)prompts, (const char *const *)responses, NULL, r, 10);
    if (r[0] != 4 || r[1] != 5) { printf("FAIL second call: %g %g, want 4 5 (the same process)\n", r[0], r[1]); return 1; }
    reward_cmd_stop(rc);
    free_batch(3, prompts, responses);
    printf("ok counter: one process across calls (1 2 3, then 4 5; n = 0 in between)\n");
    return 0;
}

static int case_timeout(void) {
    char **prompts, **responses;
    make_batch(8, 0, &prompts, &responses);
    double r[8];
    char err[1024];
    RewardCmd *rc = start("while read l; do :; done");
    double t0 = mono();
    int rv = reward_cmd_score(rc, 8, (const char *const *)prompts, (const char *const *)responses, NULL, r, 1, err, sizeof err);
    double t_score = mono() - t0;
    t0 = mono();
    reward_cmd_stop(rc);
    double t_stop = mono() - t0;
    free_batch(8, prompts, responses);
    printf("%s\n", rv ? err : "FAIL: no error");
    /* 0.5 s of slack: a loaded CI machine */
    if (rv == 0 || t_score < 1.0 || t_score > 1.5) { printf("FAIL score returned after %.2f s, want 1 s\n", t_score); return 1; }
    if (t_stop > 1.0) { printf("FAIL stop took %.2f s: closing its stdin should end it\n", t_stop); return 1; }
    printf("ok timeout: the error after %.2f s, stop in %.2f s\n", t_score, t_stop);
    return 0;
}

static int case_stop(const char *dir) {
    char cmd[1024];
    /* sh and a second process it started, both ignoring their stdin; off our stderr, so that a
     * survivor cannot hold bats' output open (the test then sees it rather than hanging) */
    snprintf(cmd, sizeof cmd, "exec 2>/dev/null; sleep 300 & echo $$ $! > '%s/pids'; sleep 300", dir);
    char **prompts, **responses;
    make_batch(1, 0, &prompts, &responses);
    RewardCmd *rc = start(cmd);
    double r[1], t0 = mono();
    char err[1024];
    /* it never answers: this also makes sure it ran far enough to write its pids */
    int rv = reward_cmd_score(rc, 1, (const char *const *)prompts, (const char *const *)responses, NULL, r, 0.5, err, sizeof err);
    t0 = mono();
    reward_cmd_stop(rc);
    double t_stop = mono() - t0;
    free_batch(1, prompts, responses);
    if (rv == 0) { printf("FAIL: a reply from a program that writes none\n"); return 1; }
    if (t_stop < 4.9 || t_stop > 7) { printf("FAIL stop took %.2f s, want the 5 s grace\n", t_stop); return 1; }
    printf("ok stop: a program that ignores its stdin is killed after %.2f s\n", t_stop);
    return 0;
}

static void *exit_from_thread(void *arg) {
    (void)arg;
    _exit(1);
}

static int case_end(const char *how, const char *dir) {
    char cmd[1024];
    /* off our stderr, so that a survivor cannot hold bats' output open */
    snprintf(cmd, sizeof cmd, "exec 2>/dev/null; sleep 300 & echo $$ $! > '%s/pids'; while read l; do echo '{\"reward\": 1}'; done",
             dir);
    const char *p[1] = {"p"}, *r[1] = {"r"};
    double rw[1];
    RewardCmd *rc = start(cmd);
    score(rc, 1, p, r, NULL, rw, 10);   /* it runs: its pids are written */
    fflush(stdout);
    if (!strcmp(how, "stop")) reward_cmd_stop(rc);
    else if (!strcmp(how, "exit")) exit(0);
    else if (!strcmp(how, "error")) rank_error("an error while the reward command runs");
    else if (!strcmp(how, "term")) raise(SIGTERM);
    else if (!strcmp(how, "int")) raise(SIGINT);
    else if (!strcmp(how, "hup")) raise(SIGHUP);
    else if (!strcmp(how, "kill")) raise(SIGKILL);
    else if (!strcmp(how, "_exit")) {
        pthread_t t;
        pthread_create(&t, NULL, exit_from_thread, NULL);
        pause();
    }
    printf("ended by %s\n", how);
    return 0;
}

static int case_badlabel(void) {
    const char *p[1] = {"p"}, *r[1] = {"r"}, *l[1] = {"{not json"};
    double rw[1];
    RewardCmd *rc = start("cat");
    score(rc, 1, p, r, l, rw, 10);
    printf("FAIL: a label that is not JSON was accepted\n");
    return 1;
}

int main(int argc, char **argv) {
    const char *c = argc > 1 ? argv[1] : "";
    if (!strcmp(c, "score")) return case_score(argc, argv);
    if (!strcmp(c, "python")) return case_python();
    if (!strcmp(c, "labels")) return case_labels();
    if (!strcmp(c, "many")) return case_many();
    if (!strcmp(c, "counter")) return case_counter();
    if (!strcmp(c, "timeout")) return case_timeout();
    if (!strcmp(c, "stop") && argc > 2) return case_stop(argv[2]);
    if (!strcmp(c, "badlabel")) return case_badlabel();
    if (!strcmp(c, "end") && argc > 3) return case_end(argv[2], argv[3]);
    fprintf(stderr, "usage: test_reward_cmd score CMD N [TIMEOUT_S [BYTES]] | python | labels | many | counter | "
                    "timeout | stop DIR | badlabel | end HOW DIR\n");
    return 2;
}
