/* verify.h — built-in verifiable rewards: math answers, code that passes tests, an answer's format.
 *
 * math    the LAST \boxed{...} (also `\boxed TOKEN`, \fbox{...}) or, when there is none, the last
 *         GSM8K `#### N` line, against the reference answer: equal as exact rationals (integers,
 *         decimals, \frac / \dfrac / \tfrac, a/b, signs, 1,234 separators, $ and % dropped), tuples
 *         and intervals element by element in order, multiple-choice letters, else equal strings
 *         after the normalisation of verl's math_dapo (rlhf/verify_math.c lists the rules).
 * code    the program in the response's last fenced block (``` / ```python / ```py) run by python3
 *         on every test case in a sandbox (rlhf/sandbox.h): 1 when every case's stdout equals its
 *         output after trimming trailing whitespace, else 0.
 * format  1 when the response ends (after trailing whitespace) with a well-formed \boxed{...}
 *         answer or a `#### N` line, else 0.
 * Every reward is 0 or 1; a sample the verifier cannot decide is 0 with a reason, never an error.
 * Owns: the graders, the pool that scores a batch, and `tandem verify`. Not: where the rewards go
 * (rlhf/ppo*.c). */
#ifndef TANDEM_VERIFY_H
#define TANDEM_VERIFY_H
#include <cjson/cJSON.h>
#include <stddef.h>

typedef enum { VERIFY_MATH, VERIFY_CODE, VERIFY_FORMAT } VerifyKind;
#define VERIFY_MAX_WORKERS 64   /* samples verified at once at most: a sandbox slot (uid) per worker (sandbox.h) */

/* "math" | "code" | "format"; anything else is a user_error naming flag (e.g. "--reward-fn"). */
VerifyKind verify_kind_parse(const char *flag, const char *name);
const char *verify_kind_name(VerifyKind kind);

typedef struct {
    double reward;      /* 0 or 1 */
    int timed_out;      /* the sample ran past timeout_s (reward 0) */
    char reason[200];   /* one line of valid UTF-8: "correct", or why not */
} VerifyResult;

/* Whether ref is a usable reference for kind: math, an object with "answer" (a string or a number);
 * code, an object with "tests": {"inputs": [...], "outputs": [...]} (strings, the same number of
 * each, at least one); format needs none (ref may be NULL). 0, or -1 with a message in err that
 * names the field (the caller puts file:line in front). verify_batch checks it too: a bad ref is a
 * verifier error there, so callers check while reading their input. */
int verify_ref_check(VerifyKind kind, const cJSON *ref, char *err, size_t errlen);

/* Scores n samples, responses[i] against refs[i] (see verify_ref_check; refs may be NULL for
 * format), at most `workers` at once (>= 1), each within timeout_s seconds (> 0): a sample over it
 * gets reward 0, timed_out 1 and a reason saying so. Code samples run in forked sandboxes (one
 * process tree per test case); math and format run in this process on OpenMP threads, in time
 * linear in the response (at most VERIFY_SCAN_MAX bytes of it are read), so that their timeout is a
 * check made after the fact that cannot be reached by any input of the jsonl size limit. Call from
 * one thread at a time (the main thread in an MPI job: nothing here calls MPI).
 * Returns 0, or -1 with err set for a fault of the verifier itself (a bad ref, a sandbox that
 * cannot be set up: no temporary directory, no namespaces, no python3). A bad sample is never an
 * error: it is reward 0 with a reason. */
int verify_batch(VerifyKind kind, int n, const char *const *responses, const cJSON *const *refs, int workers,
                 double timeout_s, VerifyResult *out, char *err, size_t errlen);

/* The graders alone (thread-safe, no state). The math grader reads at most the last VERIFY_SCAN_MAX
 * bytes of a response and at most VERIFY_ANSWER_MAX bytes of an answer. */
#define VERIFY_SCAN_MAX (1 << 20)
#define VERIFY_ANSWER_MAX 1024
double verify_math(const char *response, const cJSON *answer, char *reason, size_t reason_len);
double verify_format(const char *response, char *reason, size_t reason_len);

/* Copies s into dst (cap bytes, NUL included) as one line of valid UTF-8: control bytes become
 * spaces, invalid bytes '?', cut at a character boundary (with "..." when cut). For reasons. */
void verify_quote(char *dst, size_t cap, const char *s, size_t len);

/* tandem verify math|code|format --input F.jsonl --output O.jsonl [--workers N] [--timeout S] */
int verify_main(int argc, char **argv);
#endif
