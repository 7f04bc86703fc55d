/* harness.h — what the in-process libFuzzer harnesses (tests/fuzz/fuzz_*.c, built and run by
 * tests/fuzz/libfuzz.sh) share: a rejected input (user_error) returns to the harness instead of
 * ending the process, the input as a file the parsers can open by name, the test assets, and an
 * invariant check that aborts (a crash libFuzzer keeps).
 * A harness is one LLVMFuzzerTestOneInput; it starts with FUZZ_CATCH_USER_ERROR(), which makes a
 * user_error anywhere below it check that its message is one line, then come back there
 * (util_user_error_hook + longjmp) and return 0: nothing is printed. What
 * the parser had allocated by then is lost: libfuzz.sh runs those harnesses with -detect_leaks=0,
 * as tandem itself exits at that point. */
#ifndef TANDEM_FUZZ_HARNESS_H
#define TANDEM_FUZZ_HARNESS_H
#include "runtime/util.h"
#include "tokenizer/tokenizer.h"
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static jmp_buf fuzz_jmp;
static int fuzz_one_line(const char *s);
/* A user_error: its message must be one line (README: one `tandem: ...` line), then back to the harness. */
static void fuzz_on_user_error(const char *msg) {
    if (!fuzz_one_line(msg)) {
        fprintf(stderr, "fuzz: a user_error message that is not one line: %s\n", msg);
        abort();
    }
    longjmp(fuzz_jmp, 1);
}

#define FUZZ_CATCH_USER_ERROR()                 \
    do {                                        \
        util_user_error_hook = fuzz_on_user_error; \
        if (setjmp(fuzz_jmp)) return 0;         \
    } while (0)

/* An invariant of the code under test: a message and abort() (libFuzzer saves the input). */
#define FUZZ_ASSERT(cond)                                                                  \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "fuzz: %s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                       \
        }                                                                                  \
    } while (0)

/* data[0..n) as the contents of a file; returns its path (/proc/self/fd/N of one memfd, rewritten
 * each call: no disk traffic). */
static const char *fuzz_as_file(const uint8_t *data, size_t n) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("fuzz-input", 0);
        if (fd < 0) { perror("memfd_create"); abort(); }
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) || (n && pwrite(fd, data, n, 0) != (ssize_t)n)) { perror("fuzz input"); abort(); }
    return path;
}

/* $TANDEM_FUZZ_ASSETS/rel (default ../shared/assets, the tree's neighbour), malloc'd */
static char *fuzz_asset(const char *rel) {
    const char *dir = getenv("TANDEM_FUZZ_ASSETS");
    return path_join(dir && *dir ? dir : "../shared/assets", rel);
}

/* The two tokenizer kinds the text harnesses pick from: stories260K's SentencePiece model [0] and
 * minimind's BPE tokenizer.json [1], opened once. */
static inline void fuzz_tokenizers(Tokenizer *tok[2]) {
    static const char *const rel[2] = {"models/stories260K-hf/tokenizer.model", "tokenizers/minimind/tokenizer.json"};
    for (int i = 0; i < 2 && !tok[i]; i++) {
        char err[512], *p = fuzz_asset(rel[i]);
        tok[i] = tokenizer_open(p, err, sizeof err);
        if (!tok[i]) { fprintf(stderr, "fuzz: %s\n", err); exit(2); }
        free(p);
    }
}

/* data[0..n) NUL-terminated, malloc'd */
static char *fuzz_cstr(const uint8_t *data, size_t n) {
    char *s = xmalloc(n + 1);
    memcpy(s, data, n);
    s[n] = 0;
    return s;
}

/* 1 when s is one line: no byte below 0x20 nor 0x7f (an error message must be one line) */
static int fuzz_one_line(const char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f) return 0;
    return 1;
}
#endif
