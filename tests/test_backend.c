/* test_backend.c — the seam's own checks (kernels/cpu/backend.c, guarded.c): backend_check accepts
 * every table this build has and refuses one with a NULL entry, naming it; cpu-guarded's counting
 * mode (the oracle harness's) counts a misuse and goes on; backend_fatal's line is the runtime's.
 * Usage: test_backend          the checks; prints one line each, "ok" last, exits 0
 *        test_backend fatal    backend_fatal("internal error: test"): its one line, exit 1 */
#include "kernels/cpu/cpu.h"
#include <stdio.h>
#include <string.h>

static int bad;
static void expect(int ok, const char *what) {
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    bad |= !ok;
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "fatal")) backend_fatal("internal error: %s", "test");

    /* every table this build has is complete; cuda only where nvcc built it */
    const char *names[] = {"cpu", "cpu-guarded", "cuda"};
    for (int i = 0; i < 3; i++) {
        const Backend *be = backend_named(names[i]);
        if (be) expect(backend_check(be) == NULL, names[i]);
    }
    /* an entry left out of a table is refused by name; owns and link may be NULL */
    Backend t = cpu_backend;
    t.owns = NULL, t.link = NULL;
    expect(backend_check(&t) == NULL, "owns and link NULL: accepted");
    t.rope_backward = NULL;
    const char *why = backend_check(&t);
    expect(why && !strcmp(why, "internal error: backend cpu: entry rope_backward is NULL in its table"),
           why ? why : "rope_backward NULL: accepted");
    t = cpu_backend, t.open = NULL;
    why = backend_check(&t);
    expect(why && strstr(why, "entry open is NULL"), why ? why : "open NULL: accepted");
    t = cpu_backend, t.sync = NULL;
    why = backend_check(&t);
    expect(why && strstr(why, "entry sync is NULL"), why ? why : "sync NULL: accepted");

    /* counting: a host argument is one fault (its line on stderr) and the call still runs */
    const Backend *G = &cpu_guarded_backend;
    G->open(0);
    cpu_guarded_count_faults(1);
    GuardedStats s0 = cpu_guarded_stats();
    float x[6] = {1, 2, 3, 4, 5, 6}, w[6] = {1, 0, 0, 0, 1, 0}, out[4], want[4] = {1, 2, 4, 5};   /* (2,3) @ (2,3)^T */
    float *dw = G->alloc(sizeof w), *dout = G->alloc(sizeof out);
    G->to_device(dw, w, sizeof w);
    G->matmul(dout, x, dw, NULL, DTYPE_F32, 2, 3, 2, 1);
    G->to_host(out, dout, sizeof out);
    GuardedStats s1 = cpu_guarded_stats();
    expect(s1.faults - s0.faults == 1 && !memcmp(out, want, sizeof out), "counting: a host x is one fault, the call runs");
    float *dshort = G->alloc(sizeof out - 1);
    G->matmul(dshort, x, dw, NULL, DTYPE_F32, 2, 3, 1, 1);   /* n_out 1: dshort is large enough, x is not ours */
    G->copy_bytes(dshort, dout, sizeof out);                 /* 16 bytes into 15 */
    GuardedStats s2 = cpu_guarded_stats();
    expect(s2.faults - s1.faults == 2, "counting: a transfer past an allocation's bytes is one fault");
    G->free(dw), G->free(dout), G->free(dshort);
    GuardedStats s3 = cpu_guarded_stats();
    expect(s3.allocs - s0.allocs == 3 && s3.live == s0.live, "counting: allocations counted, all freed");
    cpu_guarded_count_faults(0);

    printf(bad ? "FAIL\n" : "ok\n");
    return bad;
}
