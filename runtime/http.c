/* http.c — see http.h. */
#include "runtime/http.h"
#include <unistd.h>

int http_should_retry(CURLcode rc, long status) {
    if (rc != CURLE_OK)
        return rc != CURLE_WRITE_ERROR && rc != CURLE_URL_MALFORMAT && rc != CURLE_UNSUPPORTED_PROTOCOL &&
               rc != CURLE_COULDNT_RESOLVE_HOST && rc != CURLE_ABORTED_BY_CALLBACK;
    return status == 429 || status >= 500;
}

void http_backoff(int attempt) {
    if (attempt < 1) return;
    usleep((useconds_t)(0.5e6 * (1 << (attempt - 1 < 4 ? attempt - 1 : 4))));
}
