/* reward_http.h — rewards from HTTP reward servers (libcurl), OpenRLHF's --remote_rm_url protocol:
 * POST {"query": [prompt + response, ...], "prompts": [...], "labels": [...]} as JSON, answer
 * {"rewards": [...]} (other keys, e.g. "scores" or "extra_logs", are ignored). A batch is split into
 * contiguous parts, one per URL, sent at the same time. Each reward is a finite number within
 * +-REWARD_ABS_MAX (rlhf/reward_cmd.h: 1e6). Connection failures, timeouts, 429 and 5xx are retried
 * with exponential backoff (0.5 s, 1 s, 2 s, ... capped at 8 s); other statuses, a malformed answer
 * (NaN and Infinity are not JSON), the wrong number of rewards or a reward out of bounds are errors
 * at once.
 * Owns: the requests, their retries and the answer's checks. */
#ifndef TANDEM_REWARD_HTTP_H
#define TANDEM_REWARD_HTTP_H
#include <stddef.h>

/* Scores n responses: rewards (n). labels[i]: a JSON text or NULL (sent as null); labels may be
 * NULL. timeout_s bounds each request (0 = none); retries: attempts after the first. Returns 0, or
 * -1 with a one-line message naming the URL and what went wrong (status, curl's error, the answer
 * cut to 200 bytes, the reward out of bounds and its place in that URL's answer). */
int reward_http_score(const char *const *urls, int n_urls, int n, const char *const *queries,
                      const char *const *prompts, const char *const *labels, double *rewards, double timeout_s,
                      int retries, char *err, size_t errlen);
/* The check of one server's answer: ans (NUL-terminated, NULL for none) must be {"rewards": [n finite
 * numbers within +-REWARD_ABS_MAX]}. 0 with rewards (n), or -1 with the one-line message naming url.
 * reward_http_score's own step, exposed for the fuzz harness (tests/fuzz/libfuzz.sh). */
/* --reward-url's comma-separated list: each an http(s) URL (user_error naming the flag otherwise);
 * returns how many, the malloc'd copies in *urls. */
int reward_http_parse_urls(const char *list, char ***urls);
int reward_http_parse_answer(const char *url, const char *ans, int n, double *rewards, char *err, size_t errlen);
#endif
