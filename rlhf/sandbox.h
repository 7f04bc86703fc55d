/* sandbox.h — runs an untrusted python3 program on one input, confined (Linux, as root or with
 * unprivileged user namespaces).
 *
 * Each run is one process tree made by clone() with namespaces of its own:
 *   pid     a fresh PID namespace whose pid 1 is a minimal init (sandbox.c child_main) and the
 *           program its child: when the program ends the init exits, and when the wall-clock kill
 *           SIGKILLs the init, the kernel kills every process in the namespace (no escape by double
 *           fork or setsid); the program sees and signals no process outside;
 *   net     a fresh network namespace: no interface but a loopback that is down (not the host's);
 *   mount   every mount read-only (mount_setattr, recursive), a fresh /proc, empty read-only tmpfs
 *           over /tmp, /var/tmp and /dev/shm, and the working directory /tmp/sandbox a fresh tmpfs
 *           (SANDBOX_DIR_BYTES) owned by the program's uid holding main.py: the only place it can
 *           write, and it vanishes with the namespace (nothing reaches the host's disk);
 *   ipc, uts.
 * Then: every descriptor but stdin/stdout/stderr closed (close_range), signals reset, rlimits
 * (CPU seconds, address space, processes, file size, open files, no core), no_new_privs, and as root
 * a uid/gid of its own (SANDBOX_UID_BASE + 64 x pid + slot: RLIMIT_NPROC counts per uid and is
 * not enforced for root, so each concurrent slot gets an unprivileged uid of its own; without root,
 * the user namespace's uid 0, the caller's uid outside), then exec of python3 in the init's child.
 * The children run only system calls between clone and exec (safe from a threaded or MPI process).
 * Owns: that process and its pipes. Not: what a test case is or how outputs compare (rlhf/verify.c). */
#ifndef TANDEM_SANDBOX_H
#define TANDEM_SANDBOX_H
#include <stddef.h>

/* uids BASE .. BASE + 64 x PID_LIMIT (2^28): no passwd entry uses them, and no two processes' slots
 * share one (Linux's pid_max is at most 2^22 = PID_MAX_LIMIT on 64-bit) */
#define SANDBOX_UID_BASE 1000000000u
#define SANDBOX_PID_LIMIT (1u << 22)
#define SANDBOX_DIR_BYTES (32u << 20)  /* the working directory's tmpfs (over RLIMIT_FSIZE: a big file is SIGXFSZ) */

typedef struct {
    double cpu_s;        /* RLIMIT_CPU (rounded up to whole seconds) */
    size_t mem_bytes;    /* RLIMIT_AS */
    int nproc;           /* RLIMIT_NPROC (processes and threads of the run's uid) */
    size_t fsize_bytes;  /* RLIMIT_FSIZE */
    size_t out_bytes;    /* stdout kept; more is SANDBOX_OUTPUT_LIMIT */
} SandboxLimits;
/* cpu 10 s, 1 GiB, 8 processes, 16 MiB files, 1 MiB of output. RLIMIT_AS is per process: a run may
 * hold up to 8 GiB of address space, and --workers runs at once that times as much (no cgroup here) */
SandboxLimits sandbox_default_limits(void);

typedef enum {
    SANDBOX_EXITED,        /* status: the exit code */
    SANDBOX_SIGNALED,      /* status: the signal (SIGXCPU: the CPU limit; SIGXFSZ: the file size limit) */
    SANDBOX_TIMEOUT,       /* killed at the wall-clock deadline */
    SANDBOX_OUTPUT_LIMIT,  /* killed for writing more than out_bytes to stdout */
} SandboxStatus;

typedef struct {
    SandboxStatus status;
    int code;
    char *out;            /* stdout (malloc'd, NUL-terminated; at most out_bytes), free it */
    size_t out_len;
    char err_last[160];   /* the last non-blank line of stderr (cut), "" if none */
} SandboxResult;

/* Runs `python3 main.py` (main.py = program) with stdin = input[0..input_len), killed at
 * `deadline` (now_seconds() clock). slot (0..63) picks the uid: concurrent runs use distinct slots.
 * Returns 0 with res filled (whatever the program did), or -1 with err set when the sandbox
 * itself could not be set up (no python3, no namespaces: not the program's fault). */
int sandbox_run(const char *program, const char *input, size_t input_len, double deadline, int slot,
                const SandboxLimits *lim, SandboxResult *res, char *err, size_t errlen);
#endif
