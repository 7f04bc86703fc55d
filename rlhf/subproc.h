/* subproc.h — a user's long-lived program (`sh -c CMD`) speaking lines on two pipes, for the reward
 * program (rlhf/reward_cmd.c) and the environment program (rlhf/env.c).
 * The program runs in a session of its own under a keeper (subproc.c KEEPER) that kills it and all
 * it started when it exits, when subproc_stop says so, or when this process ends, however it ends.
 * Its stdin and stdout are non-blocking pipes of ours; its stderr passes through.
 * Owns: the child's life (start, reap, kill), the pipes, the bytes read and not yet consumed, and
 * the one-line description of a program that is gone. Does not own what a line means: framing
 * beyond reading bytes, the protocol and its messages are the callers'. */
#ifndef TANDEM_SUBPROC_H
#define TANDEM_SUBPROC_H
#include <stddef.h>
#include <sys/types.h>

#define SUBPROC_SHOWN 200   /* bytes of a command or of a bad line quoted in a message */

typedef struct {
    char *name;            /* the command for messages: one line (control bytes escaped), cut */
    pid_t pid;             /* the keeper; -1 once reaped */
    int to, from;          /* its stdin (we write), its stdout (we read); non-blocking; -1 closed */
    char *rbuf;            /* bytes read and not yet consumed, NUL-terminated */
    size_t rlen, rcap;
} Subproc;

/* Starts `sh -c cmd` under its keeper into p. Call from the main thread (the keeper hears of our end
 * when the thread that started it ends). 0, or -1 with "<what> `CMD`: pipe|fork: ..." in err. */
int subproc_start(Subproc *p, const char *cmd, const char *what, char *err, size_t errlen);
/* One read into rbuf: >0 bytes read, 0 end of file, -1 nothing to read now (EAGAIN/EINTR), -2 error. */
ssize_t subproc_read(Subproc *p);
/* One round of a batch: waits until t_end (now_seconds(); 0 = no limit) for its output to be readable
 * or, while *woff < wlen, its input writable; then reads once (when readable) and, unless its output
 * ended, writes what fits of w[*woff..wlen). Returns SUBPROC_* bits (none: nothing happened yet), or
 * -1 with "<what> `CMD`: poll|read|write: ..." in err. */
#define SUBPROC_READ 1      /* bytes came into rbuf */
#define SUBPROC_EOF 2       /* its output ended (no write was tried) */
#define SUBPROC_EPIPE 4     /* its input is closed (it exited, most likely) */
#define SUBPROC_TIMEOUT 8   /* t_end has passed: nothing was done */
int subproc_pump(Subproc *p, const char *w, size_t wlen, size_t *woff, double t_end, const char *what, char *err,
                 size_t errlen);
/* What became of it, for "<what> `CMD`: <this> after ...": "exited with status 3", "was killed by
 * signal 9 (Killed)", or, when it is still running a second later, "closed its <closed>". Reaps it
 * when it has exited. */
void subproc_describe_gone(Subproc *p, const char *closed, char *buf, size_t len);
/* s[0..len) cut to SUBPROC_SHOWN bytes (not inside a UTF-8 character, "..." marks the cut) with
 * control bytes escaped (\n \r \t \xNN), so a message stays one line. outlen >= 4 * SUBPROC_SHOWN + 8. */
void subproc_shown(char *out, size_t outlen, const char *s, size_t len);
/* Closes its stdin, waits for it (reading and dropping its output; SIGTERM to the keeper, which kills
 * the program's group, after 5 s), frees name and rbuf (not p). */
void subproc_stop(Subproc *p);
#endif
