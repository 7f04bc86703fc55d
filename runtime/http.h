/* http.h — the retry policy shared by every HTTP client of the project: Hub downloads (runtime/hub.c)
 * and reward servers (rlhf/reward_http.c).
 * Owns: which failures are worth another attempt and how long to wait before it. Does not own a
 * connection, a request or a message: each client keeps its own curl handles and errors. */
#ifndef TANDEM_HTTP_H
#define TANDEM_HTTP_H
#include <curl/curl.h>

int http_should_retry(CURLcode rc, long status); /* connection trouble, timeouts, 429, 5xx */
void http_backoff(int attempt);                 /* sleeps 0.5, 1, 2, 4, 8, 8, ... s before attempt 1, 2, ... */
#endif
