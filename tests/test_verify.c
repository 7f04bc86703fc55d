/* test_verify.c — verify_batch as a caller in C (tandem ppo's --reward-fn) uses it: the refs as
 * the prompt lines' objects, NULL refs for format, the timeout counted, a bad ref or bad settings
 * an error (-1, err) and never a crash; verify_quote's one line of valid UTF-8.
 * Usage: test_verify   prints one line per check, "ok" last; exits 0 when all pass */
#include "rlhf/verify.h"
#include <stdio.h>
#include <string.h>

static int bad;
static void expect(int ok, const char *what) {
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    bad |= !ok;
}

int main(void) {
    char err[300];
    VerifyResult r[4];

    /* format: no refs at all */
    const char *fmt[] = {"so \\boxed{3}", "so 3", "#### 12\n", "\\boxed{3"};
    expect(verify_batch(VERIFY_FORMAT, 4, fmt, NULL, 2, 5, r, err, sizeof err) == 0, "format: NULL refs");
    expect(r[0].reward == 1 && r[1].reward == 0 && r[2].reward == 1 && r[3].reward == 0, "format: rewards 1 0 1 0");

    /* math: the refs are the prompt lines, answer a string or a number */
    cJSON *refs[3] = {cJSON_Parse("{\"prompt\": \"1+1\", \"answer\": \"2\"}"), cJSON_Parse("{\"answer\": 0.5}"),
                      cJSON_Parse("{\"answer\": \"(1,2)\"}")};
    const char *math[] = {"\\boxed{2}", "\\boxed{\\frac{2}{4}}", "\\boxed{(2,1)}"};
    expect(verify_batch(VERIFY_MATH, 3, math, (const cJSON *const *)refs, 3, 5, r, err, sizeof err) == 0, "math: batch");
    expect(r[0].reward == 1 && r[1].reward == 1 && r[2].reward == 0, "math: rewards 1 1 0");
    expect(!strcmp(r[2].reason, "wrong answer: got \"(2,1)\", expected \"(1,2)\""), "math: the reason");
    expect(!r[0].timed_out && !r[1].timed_out && !r[2].timed_out, "math: none timed out");

    /* a ref without an answer, bad settings: errors of the caller, not rewards */
    cJSON *noanswer = cJSON_Parse("{\"prompt\": \"x\"}");
    const cJSON *one[1] = {noanswer};
    expect(verify_batch(VERIFY_MATH, 1, math, one, 1, 5, r, err, sizeof err) == -1 &&
               !strcmp(err, "verify math: sample 0: field \"answer\" missing"), "math: a ref without answer is an error");
    expect(verify_batch(VERIFY_MATH, 1, math, (const cJSON *const *)refs, 0, 5, r, err, sizeof err) == -1, "workers 0 refused");
    expect(verify_batch(VERIFY_MATH, 1, math, (const cJSON *const *)refs, 1, 0, r, err, sizeof err) == -1, "timeout 0 refused");

    /* code: a pass, a loop cut at the sample's timeout, a wrong answer; the timed-out one counted */
    cJSON *tests = cJSON_Parse("{\"tests\": {\"inputs\": [\"3\\n\"], \"outputs\": [\"6\\n\"]}}");
    const cJSON *trefs[3] = {tests, tests, tests};
    const char *code[] = {"```python\nprint(2 * int(input()))\n```", "```python\nwhile True: pass\n```",
                          "```py\nprint(7)\n```"};
    expect(verify_batch(VERIFY_CODE, 3, code, trefs, 3, 2, r, err, sizeof err) == 0, "code: batch");
    expect(r[0].reward == 1 && r[1].reward == 0 && r[2].reward == 0, "code: rewards 1 0 0");
    expect(!r[0].timed_out && r[1].timed_out && !r[2].timed_out, "code: the loop timed out, the others not");
    printf("     %s | %s | %s\n", r[0].reason, r[1].reason, r[2].reason);

    /* reasons are one line of valid UTF-8, cut at a character boundary */
    char q[12];
    verify_quote(q, sizeof q, "a\nb\xff\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9", 13);
    expect(!strcmp(q, "a b?\xc3\xa9\xc3\xa9..."), "quote: control -> space, bad byte -> ?, cut with ...");
    char reason[200];
    cJSON *ans = cJSON_CreateString("5");
    expect(verify_math("\\boxed{\xff\xfe}", ans, reason, sizeof reason) == 0 &&
               !strcmp(reason, "wrong answer: got \"??\", expected \"5\""), "math: invalid UTF-8 quoted as ?");

    cJSON_Delete(ans), cJSON_Delete(tests), cJSON_Delete(noanswer);
    for (int i = 0; i < 3; i++) cJSON_Delete(refs[i]);
    printf("%s\n", bad ? "FAIL" : "ok");
    return bad;
}
