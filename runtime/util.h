/* util.h — error reporting, checked allocation, small helpers shared by every module.
 *
 * Two kinds of failure (STYLE.md 3 and 4):
 *   CHECK(cond)         a bug or a system failure: names the statement, file, line and rank,
 *                       then stops the whole job (MPI_Abort with several ranks).
 *   user_error(...)     bad user input: one line "tandem: <message>" (control bytes of the message,
 *                       such as a newline in a quoted value, print as spaces), non-zero exit. Call it only
 *                       where every rank of a group sees the same input (config, flags, layout):
 *                       the group's root prints (the reporter), the whole job stops (every group).
 *                       rank_error(...) is for input only one rank sees (its own shard's bytes):
 *                       that rank prints and aborts the job.
 * This file does not own MPI setup (runtime/comm.c) nor any parsing. */
#ifndef TANDEM_UTIL_H
#define TANDEM_UTIL_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Whether this process speaks for its group (user_error's line, --help): the root of its role
 * group (group_split) or, with no groups, world rank 0 (comm_init). group_name (NULL: none) goes in
 * front of error lines. This is the error path's state, not a rank getter: code that writes or
 * logs asks its Mesh (mesh_is_root). */
void util_set_reporter(int is_reporter, const char *group_name);
int util_is_reporter(void);

_Noreturn void user_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Test-only: NULL in tandem. When set, user_error hands it the message (the one line that would
 * follow "tandem: ") instead of printing it and stopping the job; it must not return (tests/fuzz/harness.h
 * checks the message and longjmps back to the fuzz harness, so that a rejected input is one more
 * input, not the end of the process). rank_error, job_error and CHECK are untouched: they still
 * stop the process. */
extern void (*util_user_error_hook)(const char *msg);
_Noreturn void rank_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A failure every rank learned of together (a collective's result, e.g. a checkpoint write that
 * failed on some rank): `speaker` (exactly one rank of the world) prints the one line, every rank
 * stops (exit 1; MPI_Abort with several ranks). */
_Noreturn void job_error(int speaker, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
_Noreturn void check_failed(const char *expr, const char *file, int line);
#define CHECK(cond) do { if (!(cond)) check_failed(#cond, __FILE__, __LINE__); } while (0)
/* fn runs when this process stops on one of the errors above (before the exit or MPI_Abort), not
 * on a normal exit nor a signal: e.g. removing an output file a failed run would leave half written
 * (generate/output.c). It must not fail; at most 4. */
void util_on_error(void (*fn)(void));

void *xmalloc(size_t n);            /* malloc or die */
void *xcalloc(size_t n, size_t sz); /* calloc or die */
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *read_file(const char *path, size_t *len); /* whole file, NUL-terminated; NULL if unreadable */
int file_exists(const char *path);
int dir_exists(const char *path);
char *path_join(const char *dir, const char *name); /* malloc'd "dir/name" */
void mkdir_p(const char *path);     /* user_error if it cannot be created */
int mkdir_parents(const char *path); /* the missing parents of path (not path): 0, or -1 with errno */
int remove_tree(const char *path);  /* deletes a tree we wrote (links removed, never followed): 0, or -1 with errno */
double now_seconds(void);
double peak_rss_mib(void);          /* peak resident memory of this process */
/* Linux: peak_rss_mib counts from now (the current RSS) on, e.g. a training step's peak apart from
 * the load's; a no-op where /proc/self/clear_refs cannot be written */
void peak_rss_reset(void);

/* f16 -> f32 (bf16: kernels/kernels.h) */
float f16_to_f32(uint16_t h);

/* splitmix64 (Steele, Lea, Flood 2014; Vigna's constants): the one PRNG of the project.
 * splitmix64_mix is its output function; splitmix64_next advances a state by the golden gamma. */
#define SPLITMIX64_GAMMA 0x9E3779B97F4A7C15ull
static inline uint64_t splitmix64_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline uint64_t splitmix64_next(uint64_t *state) { return splitmix64_mix(*state += SPLITMIX64_GAMMA); }
/* Fisher–Yates over x (n), drawing from the splitmix64 stream *state (the project's one shuffle). */
void shuffle_ints(int *x, int n, uint64_t *state);

/* atomic file write: write to path.tmp.<pid>, fsync, rename. Returns 0 on success, else -1 with
 * errno saying why (ENOSPC, EFBIG, ...) and nothing left behind. */
int write_file_atomic(const char *path, const void *data, size_t len);
/* The same with the bytes that fill(f, ctx) puts in f (it returns 0, or -1 with errno set): a file
 * written in pieces (e.g. copied out of a device a buffer at a time). */
int write_file_atomic_with(const char *path, int (*fill)(FILE *f, void *ctx), void *ctx);
#endif
