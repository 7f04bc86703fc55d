/* test_env.c — the driver behind tests/env.bats for rlhf/env.c: runs a script of calls against an
 * environment and prints every reply, so the bats tests check the protocol from outside.
 *   test_env cmd CMD TIMEOUT_S WORD...   an --env-cmd program
 *   test_env url URL TIMEOUT_S WORD...   an --env-url server
 * WORD: reset:E,E,...  resets of those episodes (prompt line {"prompt": "p<E>"});
 *       step:E,E,...   a step of each (turn: that episode's count of steps so far + 1; action
 *                      "a<E>.<T>", action_ids [E, T]);
 *       sleep:S        sleeps S seconds.
 * Prints one line per reply, in the call's order:
 *   <reset|step> <E> <fault name> done=<0|1> reward=<%g> text=<the text>
 * then "detail: <env_fault_detail>" after a call that had a fault, and at the end
 * "dropped <env_dropped>" and "seconds <the longest call's wall seconds, %.1f>". An error prints its
 * one line and exits 1 (the Env closed first). */
#include "rlhf/env.h"
#include "runtime/util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_EP 64

int main(int argc, char **argv) {
    if (argc < 4 || (strcmp(argv[1], "cmd") && strcmp(argv[1], "url"))) {
        fprintf(stderr, "usage: test_env cmd|url CMD|URL TIMEOUT_S WORD...\n");
        return 2;
    }
    char err[1024];
    int is_cmd = !strcmp(argv[1], "cmd");
    Env *e = env_open(is_cmd ? argv[2] : NULL, is_cmd ? NULL : argv[2], atof(argv[3]), err, sizeof err);
    if (!e) { printf("%s\n", err); return 1; }
    int turns[1024] = {0};
    double longest = 0;
    for (int a = 4; a < argc; a++) {
        char *word = argv[a], *colon = strchr(word, ':');
        if (!colon) { fprintf(stderr, "bad word %s\n", word); return 2; }
        if (!strncmp(word, "sleep:", 6)) { usleep((useconds_t)(atof(colon + 1) * 1e6)); continue; }
        int step = !strncmp(word, "step:", 5), n = 0, ep[MAX_EP], turn[MAX_EP], ids[MAX_EP][2], n_ids[MAX_EP];
        char prompt[MAX_EP][64], action[MAX_EP][64];
        const char *pl[MAX_EP], *act[MAX_EP];
        const int *idp[MAX_EP];
        for (char *s = colon + 1; *s && n < MAX_EP; n++) {
            ep[n] = (int)strtol(s, &s, 10);
            if (*s == ',') s++;
            CHECK(ep[n] >= 0 && ep[n] < 1024);
            turn[n] = turns[ep[n]] + 1;
            snprintf(prompt[n], sizeof prompt[n], "{\"prompt\": \"p%d\"}", ep[n]);
            snprintf(action[n], sizeof action[n], "a%d.%d", ep[n], turn[n]);
            ids[n][0] = ep[n];
            ids[n][1] = turn[n];
            n_ids[n] = 2;
            pl[n] = prompt[n];
            act[n] = action[n];
            idp[n] = ids[n];
        }
        EnvReply r[MAX_EP];
        double t0 = now_seconds();
        int rv = step ? env_step(e, n, ep, turn, act, idp, n_ids, r, err, sizeof err)
                      : env_reset(e, n, ep, pl, r, err, sizeof err);
        if (now_seconds() - t0 > longest) longest = now_seconds() - t0;
        if (rv) {
            env_close(e);
            printf("%s\n", err);
            return 1;
        }
        for (int i = 0; i < n; i++) {
            if (step) turns[ep[i]]++;
            printf("%s %d %s done=%d reward=%g text=%s\n", step ? "step" : "reset", ep[i], ENV_FAULT_NAMES[r[i].fault],
                   r[i].done, r[i].reward, r[i].text);
            free(r[i].text);
        }
        if (env_fault_detail(e)[0]) printf("detail: %s\n", env_fault_detail(e));
        fflush(stdout);
    }
    printf("dropped %ld\nseconds %.1f\n", env_dropped(e), longest);
    env_close(e);
    return 0;
}
