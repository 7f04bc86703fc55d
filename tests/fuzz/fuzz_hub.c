/* fuzz_hub.c — libFuzzer harness: the Hub API's answer for a revision (hub_parse_files,
 * runtime/hub.c: the commit, the file list, which files are wanted, their hashes and sizes).
 * Input: byte 0 chooses the --include globs (none: the default files; "*"; "*.json" and
 * "tokenizer*"; "sub/" and a star), the rest is the answer.
 * Invariants: the commit is 40 hex digits; at least one file; each name a plain relative path (it
 * becomes a path under the cache), each blob 64 hex (LFS) or 40 hex (git), each size >= 0. */
#include "tests/fuzz/harness.h"
#include "runtime/hub.h"

static int hex_len(const char *s) {
    int n = 0;
    while ((s[n] >= '0' && s[n] <= '9') || (s[n] >= 'a' && s[n] <= 'f')) n++;
    return s[n] ? -1 : n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (n < 1) return 0;
    FUZZ_CATCH_USER_ERROR();
    static char *globs[][2] = {{NULL, NULL}, {"*", NULL}, {"*.json", "tokenizer*"}, {"sub/*", NULL}};
    static const int n_globs[] = {0, 1, 2, 1};
    int g = data[0] & 3;
    char *ans = fuzz_cstr(data + 1, n - 1);
    HubFile *files;
    int nf;
    char *commit = hub_parse_files(ans, "https://huggingface.co/api/models/org/name/revision/main?blobs=true",
                                   "org/name", "main", globs[g], n_globs[g], &files, &nf);
    FUZZ_ASSERT(hex_len(commit) == 40);
    FUZZ_ASSERT(nf >= 1);
    for (int i = 0; i < nf; i++) {
        FUZZ_ASSERT(hub_safe_rel_path(files[i].name));
        FUZZ_ASSERT(hex_len(files[i].blob) == (files[i].lfs ? 64 : 40));
        FUZZ_ASSERT(files[i].size >= 0);
    }
    hub_files_free(files, nf);
    free(commit);
    free(ans);
    return 0;
}
