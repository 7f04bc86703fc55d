/* fetch.c — see fetch.h. */
#include "runtime/fetch.h"
#include "runtime/args.h"
#include "runtime/http.h"
#include "runtime/hub.h"
#include "runtime/util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fetch_main(int argc, char **argv) {
    const char *rev, *dir, *include;
    int timeout, retries;
    Option opts[] = {
        {"--revision", OPT_STR, &rev, "main", "branch, tag or commit"},
        {"--dir", OPT_STR, &dir, NULL, "put the files in DIR instead of the hub cache"},
        {"--include", OPT_STR, &include, NULL, "comma-separated globs of files to fetch (default: config, tokenizer, safetensors)"},
        {"--timeout", OPT_INT, &timeout, "10", "seconds a connection may take to open or stall"},
        {"--retries", OPT_INT, &retries, "5", "retries (0.5 s, 1 s, 2 s, ... apart) after a failure that moved no bytes"},
    };
    const char *repo = NULL;   /* the one positional argument: the first word not after a flag */
    char **rest = xmalloc(sizeof(char *) * (size_t)(argc + 1));
    int nrest = 0;
    for (int a = 0; a < argc; a++) {
        if (a > 0 && !repo && argv[a][0] != '-' && (a == 1 || argv[a - 1][0] != '-')) { repo = argv[a]; continue; }
        rest[nrest++] = argv[a];
    }
    args_parse("usage: tandem fetch ORG/NAME [--revision R] [--dir DIR] [--include GLOB,GLOB]\n"
               "Downloads a Hugging Face Hub model into the hub cache (HF_HUB_CACHE, else $HF_HOME/hub, else\n"
               "~/.cache/huggingface/hub) and prints its directory. Honours HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE.",
               opts, sizeof opts / sizeof *opts, nrest, rest);
    free(rest);
    if (!repo) user_error("fetch: a repository id ORG/NAME is required");
    const char *why = hub_repo_id_error(repo);   /* (control bytes shown as spaces: one line) */
    if (why) user_error("fetch: \"%s\" is not a repository id ORG/NAME: %s", http_one_line(xstrdup(repo)), why);
    if ((why = hub_revision_error(rev)))
        user_error("--revision: \"%s\" is not a revision: %s", http_one_line(xstrdup(rev)), why);
    if (timeout < 1) user_error("--timeout must be >= 1");
    if (retries < 0) user_error("--retries must be >= 0");
    char *inc_buf = include ? xstrdup(include) : NULL, *inc[64];
    int n_inc = 0;
    char *save = NULL;
    for (char *t = inc_buf ? strtok_r(inc_buf, ",", &save) : NULL; t; t = strtok_r(NULL, ",", &save)) {
        if (n_inc == 64) user_error("--include: at most 64 globs");
        inc[n_inc++] = t;
    }
    if (include && !n_inc) user_error("--include: no glob given");
    char *snap = hub_fetch(repo, rev, dir, inc, n_inc, timeout, retries);
    printf("%s\n", snap);
    free(snap);
    free(inc_buf);
    return 0;
}
