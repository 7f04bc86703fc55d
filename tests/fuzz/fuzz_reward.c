/* fuzz_reward.c — libFuzzer harness: what a reward program writes back (reward_cmd_parse_replies:
 * the line framing and reply checks of rlhf/reward_cmd.c) and, with bit 7 of byte 0, a reward
 * server's answer (reward_http_parse_answer, rlhf/reward_http.c).
 * Input: byte 0 = the batch size n (1 + its low 3 bits) and the bit above; the rest is the output.
 * Invariants: accepted means n finite rewards within +-REWARD_ABS_MAX; refused means a non-empty
 * one-line message (it ends the run as the job's one `tandem: ...` line). No user_error is expected
 * here (these return their errors), so this harness also runs with leak detection. */
#include "tests/fuzz/harness.h"
#include "rlhf/reward_cmd.h"
#include "rlhf/reward_http.h"
#include <math.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (n < 1) return 0;
    int batch = 1 + (data[0] & 7), server = data[0] >> 7;
    double rewards[8];
    char err[1024] = "";
    int rv;
    if (server) {
        char *ans = fuzz_cstr(data + 1, n - 1);
        rv = reward_http_parse_answer("http://127.0.0.1:1/score", ans, batch, rewards, err, sizeof err);
        free(ans);
    } else {
        rv = reward_cmd_parse_replies("python3 reward.py", (const char *)data + 1, n - 1, batch, rewards, err,
                                      sizeof err);
    }
    FUZZ_ASSERT(rv == 0 || rv == -1);
    if (rv == 0) {
        for (int i = 0; i < batch; i++) FUZZ_ASSERT(isfinite(rewards[i]) && fabs(rewards[i]) <= REWARD_ABS_MAX);
    } else {
        FUZZ_ASSERT(err[0] && fuzz_one_line(err));
    }
    return 0;
}
