/* reward_cmd.c — see reward_cmd.h. One child (`sh -c CMD`, under a keeper) in its own session,
 * two pipes, and a poll loop that writes a batch's request lines while reading the replies as they
 * come, so neither side can block the other on a full pipe.
 * Owns: the child's life (start, reap, kill: the program and all it started end with us, on every
 * way out), the request/reply framing, and the one-line error messages. Does not own what a reward
 * means, nor retrying: after any error the RewardCmd is dead.
 * The strings it is given are written as they are: callers pass UTF-8 (the tokenizer's decode
 * always gives valid UTF-8). */
#include "rlhf/reward_cmd.h"
#include "runtime/jsonl.h"
#include "runtime/util.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define REWARD_CMD_GRACE_S 5.0          /* reward_cmd_stop: seconds after closing its stdin, then SIGKILL */
#define REWARD_CMD_SHOWN 200            /* bytes of a command or of a bad reply line in a message */
#define REWARD_CMD_MAX_LINE (16 << 20)  /* a reply line longer than this is an error, not a reason to grow */

struct RewardCmd {
    char *name;            /* the command for messages: one line (control bytes escaped), cut */
    pid_t pid;             /* the keeper (KEEPER); -1 once reaped */
    int to, from;          /* its stdin (we write), its stdout (we read); non-blocking */
    char *rbuf;            /* bytes read and not yet consumed as lines, NUL-terminated */
    size_t rlen, rcap;
    int failed;            /* an error was reported: only reward_cmd_stop is allowed */
};

/* s[0..len) cut to REWARD_CMD_SHOWN bytes (not inside a UTF-8 character, "..." marks the cut) with
 * control bytes escaped (\n \r \t \xNN), so a message stays one line. */
static void shown(char *out, size_t outlen, const char *s, size_t len) {
    size_t cut = len;
    if (cut > REWARD_CMD_SHOWN) {
        cut = REWARD_CMD_SHOWN;
        while (cut > 0 && ((unsigned char)s[cut] & 0xC0) == 0x80) cut--;
    }
    size_t o = 0;
    for (size_t i = 0; i < cut && o + 5 < outlen; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') o += (size_t)snprintf(out + o, outlen - o, "\\n");
        else if (c == '\r') o += (size_t)snprintf(out + o, outlen - o, "\\r");
        else if (c == '\t') o += (size_t)snprintf(out + o, outlen - o, "\\t");
        else if (c < 0x20 || c == 0x7f) o += (size_t)snprintf(out + o, outlen - o, "\\x%02x", c);
        else out[o++] = (char)c;
    }
    out[o] = 0;
    if (cut < len && o + 4 <= outlen) memcpy(out + o, "...", 4);
}

static double mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The keeper, our child `sh -c KEEPER sh CMD`: it starts the program (`sh -c CMD`, a background job:
 * SIGINT and SIGQUIT ignored, as in any) in a session and process group of its own, and kills that
 * whole group when the program exits (what it started and left behind) or when the keeper gets
 * SIGTERM: reward_cmd_stop's, or PR_SET_PDEATHSIG's when this process is gone, however it went (an
 * error exit, mpirun's SIGTERM, the SIGKILL Open MPI 4.1's mpirun may send a rank with no SIGTERM
 * first (seen), _exit as the comm deadline's stop). No code of ours runs on most of those ways
 * out: hence a process of its own, which outlives us. Its SIGTERM is caught from its first line,
 * so one that comes while the program starts is not lost. It keeps neither pipe open (the
 * program's closing either is seen) and exits as the program did (its status, or the same
 * terminating signal: HUP INT QUIT ILL ABRT FPE KILL SEGV PIPE ALRM TERM; a status of 128 + a stop
 * signal is an exit status, not a signal to raise). */
static const char KEEPER[] =
    "trap 't=1' TERM\n"   /* a SIGTERM before the program's group is known: acted on below */
    "exec 3<&0 4>&1 </dev/null >/dev/null\n"
    "setsid /bin/sh -c \"$1\" <&3 >&4 3<&- 4>&- &\n"
    "p=$!\n"
    "k() { kill -KILL -$p 2>/dev/null; kill -KILL $p 2>/dev/null; exit 143; }\n"   /* $p: before its setsid */
    "trap k TERM\n"
    "[ -z \"$t\" ] || k\n"
    "exec 3<&- 4>&-\n"
    "wait $p\n"
    "s=$?\n"
    "kill -KILL -$p 2>/dev/null\n"
    "case $s in 129|130|131|132|134|136|137|139|141|142|143) trap - TERM; ulimit -c 0; kill -$((s - 128)) $$;; esac\n"
    "exit $s\n";

/* In the child between fork and exec: only async-signal-safe calls. fd becomes target, open across
 * exec (pipe2's O_CLOEXEC is on the originals; dup2 onto itself would not clear it). */
static void child_fd(int fd, int target) {
    if (fd == target) fcntl(fd, F_SETFD, 0);
    else dup2(fd, target);
}

RewardCmd *reward_cmd_start(const char *cmd, char *err, size_t errlen) {
    char name[4 * REWARD_CMD_SHOWN + 8];
    shown(name, sizeof name, cmd, strlen(cmd));
    /* A child that is gone shows up as EPIPE on write, not as a signal that kills us. Once, for the
     * whole process: the child gets the default back before exec. */
    signal(SIGPIPE, SIG_IGN);
    int in[2] = {-1, -1}, out[2] = {-1, -1};   /* its stdin, its stdout: [0] read end, [1] write end */
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC)) {
        snprintf(err, errlen, "reward command `%s`: pipe: %s", name, strerror(errno));
        goto close_pipes;
    }
    sigset_t none;
    sigemptyset(&none);
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    long open_max = sysconf(_SC_OPEN_MAX);   /* for the child, should close_range be missing */
    if (open_max < 0 || open_max > 65536) open_max = 65536;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err, errlen, "reward command `%s`: fork: %s", name, strerror(errno));
        goto close_pipes;
    }
    if (pid == 0) {
        /* the keeper: a process group of its own (a terminal's ^C goes to us, not to it); stderr
         * stays ours. It hears of our end by SIGTERM, when the thread that started it ends (every
         * caller starts it from the main thread); a parent gone before that is set is seen here. */
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(127);
        sigaction(SIGPIPE, &dfl, NULL);
        sigaction(SIGTERM, &dfl, NULL);   /* a signal ignored at its start, sh could not trap */
        sigprocmask(SIG_SETMASK, &none, NULL);
        child_fd(in[0], 0);    /* in[0] is the lowest of the four fds: nothing else can be 0 */
        child_fd(out[1], 1);
        /* nothing else of ours: not MPI's sockets, nor a test harness's pipes */
        if (close_range(3, ~0u, 0))
            for (int fd = 3; fd < open_max; fd++) close(fd);
        execl("/bin/sh", "sh", "-c", KEEPER, "sh", cmd, (char *)NULL);
        _exit(127);
    }
    setpgid(pid, pid);         /* also here, so it holds before any ^C (EACCES after exec is fine) */
    close(in[0]);
    close(out[1]);
    RewardCmd *rc = xcalloc(1, sizeof(RewardCmd));
    rc->name = xstrdup(name);
    rc->pid = pid;
    rc->to = in[1];
    rc->from = out[0];
    fcntl(rc->to, F_SETFL, fcntl(rc->to, F_GETFL) | O_NONBLOCK);
    fcntl(rc->from, F_SETFL, fcntl(rc->from, F_GETFL) | O_NONBLOCK);
    rc->rcap = 65536;
    rc->rbuf = xmalloc(rc->rcap);
    rc->rbuf[0] = 0;
    return rc;

close_pipes:
    for (int i = 0; i < 2; i++) {
        if (in[i] >= 0) close(in[i]);
        if (out[i] >= 0) close(out[i]);
    }
    return NULL;
}

/* What became of the child, for "reward command `CMD`: <this> after k of n replies": "exited with
 * status 3", "was killed by signal 9 (Killed)", or, when it is still running a second later, what it
 * closed. Reaps it when it has exited. */
static void describe_gone(RewardCmd *rc, const char *closed, char *buf, size_t len) {
    int status = 0;
    pid_t w = 0;
    for (int i = 0; i < 100 && (w = waitpid(rc->pid, &status, WNOHANG)) == 0; i++) usleep(10000);
    if (w != rc->pid) {
        snprintf(buf, len, "closed its %s", closed);
        return;
    }
    rc->pid = -1;
    if (WIFEXITED(status)) {
        int s = WEXITSTATUS(status);
        /* sh's codes for a command it could not find / run (it also says so on stderr) */
        snprintf(buf, len, "exited with status %d%s", s,
                 s == 127 ? " (command not found?)" : s == 126 ? " (command not executable?)" : "");
    } else if (WIFSIGNALED(status)) {
        snprintf(buf, len, "was killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
    } else {
        snprintf(buf, len, "ended with wait status 0x%x", (unsigned)status);
    }
}

/* Takes the reward from reply k (1-based; NUL-terminated, newline removed): a finite number within
 * the bound, and an echoed "index", if any, that is k - 1. 0, or -1 with the error. */
static int take_reply(RewardCmd *rc, const char *line, size_t len, int k, double *reward, char *err, size_t errlen) {
    /* require_null_terminated: `{"reward": 1} junk` is not a reply */
    cJSON *o = cJSON_ParseWithOpts(line, NULL, 1);
    const cJSON *r = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, "reward") : NULL;
    const cJSON *ix = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, "index") : NULL;
    int ok = cJSON_IsNumber(r) && isfinite(r->valuedouble);
    double v = ok ? r->valuedouble : 0.0;
    int index_ok = !ix || (cJSON_IsNumber(ix) && ix->valuedouble == k - 1);
    cJSON_Delete(o);
    char bad[4 * REWARD_CMD_SHOWN + 8];
    shown(bad, sizeof bad, line, len);
    if (!ok) {
        snprintf(err, errlen, "reward command `%s`: reply %d is not a JSON object with a finite number \"reward\": %s",
                 rc->name, k, bad);
        return -1;
    }
    if (!index_ok) {
        snprintf(err, errlen, "reward command `%s`: reply %d echoes an \"index\" other than its request's %d "
                 "(replies out of order, or more replies than requests): %s", rc->name, k, k - 1, bad);
        return -1;
    }
    if (!(fabs(v) <= REWARD_ABS_MAX)) {
        snprintf(err, errlen, "reward command `%s`: reply %d: reward %.9g is outside [-%g, %g]: %s", rc->name, k, v,
                 REWARD_ABS_MAX, REWARD_ABS_MAX, bad);
        return -1;
    }
    *reward = v;
    return 0;
}

/* Consumes the whole lines in rbuf (and, at_eof, a last line with no newline) as replies got..n-1.
 * sent: the requests written whole before these bytes were read; a reply beyond them answers no
 * request of ours (a surplus line of the program's). */
static int take_lines(RewardCmd *rc, int n, int sent, int *got, double *rewards, int at_eof, char *err, size_t errlen) {
    size_t pos = 0;
    int rv = 0;
    while (*got < n && pos < rc->rlen) {
        char *line = rc->rbuf + pos, *nl = memchr(line, '\n', rc->rlen - pos);
        if (!nl && !at_eof) {
            if (rc->rlen - pos > REWARD_CMD_MAX_LINE) {
                char bad[4 * REWARD_CMD_SHOWN + 8];
                shown(bad, sizeof bad, line, rc->rlen - pos);
                snprintf(err, errlen, "reward command `%s`: reply %d has no newline in its first %d MiB: %s",
                         rc->name, *got + 1, REWARD_CMD_MAX_LINE >> 20, bad);
                rv = -1;
            }
            break;
        }
        size_t len = nl ? (size_t)(nl - line) : rc->rlen - pos;
        line[len] = 0;
        if ((rv = take_reply(rc, line, len, *got + 1, &rewards[*got], err, errlen))) break;
        if (*got >= sent) {
            char bad[4 * REWARD_CMD_SHOWN + 8];
            shown(bad, sizeof bad, line, len);
            snprintf(err, errlen, "reward command `%s`: more replies than requests: reply %d came before request %d "
                     "was written: %s", rc->name, *got + 1, *got + 1, bad);
            rv = -1;
            break;
        }
        (*got)++;
        pos += len + (nl != NULL);
    }
    memmove(rc->rbuf, rc->rbuf + pos, rc->rlen - pos);
    rc->rlen -= pos;
    rc->rbuf[rc->rlen] = 0;
    return rv;
}

/* After n replies: anything left in rbuf is a surplus reply. 0, or -1 with the error. */
static int surplus(const RewardCmd *rc, int n, char *err, size_t errlen) {
    if (rc->rlen == 0) return 0;
    char *nl = memchr(rc->rbuf, '\n', rc->rlen), bad[4 * REWARD_CMD_SHOWN + 8];
    shown(bad, sizeof bad, rc->rbuf, nl ? (size_t)(nl - rc->rbuf) : rc->rlen);
    snprintf(err, errlen, "reward command `%s`: more replies than requests: a line after reply %d of %d: %s",
             rc->name, n, n, bad);
    return -1;
}

/* See reward_cmd.h. The reading half of reward_cmd_score on bytes already in hand: every request
 * written, then the program's whole output up to its end. */
int reward_cmd_parse_replies(const char *name, const char *bytes, size_t len, int n, double *rewards, char *err,
                             size_t errlen) {
    RewardCmd rc = {.name = (char *)name, .pid = -1, .to = -1, .from = -1, .rlen = len, .rcap = len + 1};
    rc.rbuf = xmalloc(len + 1);
    memcpy(rc.rbuf, bytes, len);
    rc.rbuf[len] = 0;
    int got = 0, rv = take_lines(&rc, n, n, &got, rewards, 1, err, errlen);
    if (rv == 0 && got < n) {
        snprintf(err, errlen, "reward command `%s`: closed its output after %d of %d replies", name, got, n);
        rv = -1;
    }
    if (rv == 0) rv = surplus(&rc, n, err, errlen);
    free(rc.rbuf);
    return rv;
}

/* One read into rbuf: >0 bytes read, 0 end of file, -1 nothing to read now (EAGAIN/EINTR), -2 error. */
static ssize_t read_some(RewardCmd *rc) {
    if (rc->rlen + 65536 + 1 > rc->rcap) rc->rbuf = xrealloc(rc->rbuf, rc->rcap = 2 * rc->rcap + 65536);
    ssize_t k = read(rc->from, rc->rbuf + rc->rlen, rc->rcap - rc->rlen - 1);
    if (k > 0) {
        rc->rlen += (size_t)k;
        rc->rbuf[rc->rlen] = 0;
        return k;
    }
    if (k == 0) return 0;
    return errno == EAGAIN || errno == EINTR ? -1 : -2;
}

int reward_cmd_score(RewardCmd *rc, int n, const char *const *prompts, const char *const *responses,
                     const char *const *labels, double *rewards, double timeout_s, char *err, size_t errlen) {
    CHECK(!rc->failed);   /* the caller must stop a RewardCmd after an error */
    if (n <= 0) return 0;
    /* the request: n lines; line i ends at ends[i] */
    size_t wlen = 0, wcap = 4096, woff = 0, *ends = xmalloc(sizeof(size_t) * n);
    char *w = xmalloc(wcap);
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "prompt", prompts[i]);
        cJSON_AddStringToObject(o, "response", responses[i]);
        if (labels && labels[i]) {
            cJSON *l = cJSON_Parse(labels[i]);
            CHECK(l != NULL);   /* labels are JSON texts the caller printed */
            cJSON_AddItemToObject(o, "label", l);
        }
        cJSON_AddNumberToObject(o, "index", i);
        jsonl_append(&w, &wlen, &wcap, o);
        ends[i] = wlen;
        cJSON_Delete(o);
    }
    /* sent: requests written whole; seen: that count when the bytes in rbuf were read (a reply can
     * only answer a request the program had then) */
    int got = 0, rv = -1, input_closed = 0, sent = 0, seen = 0;
    double t_end = timeout_s > 0 ? mono() + timeout_s : 0;
    char why[256];
    for (;;) {
        if (take_lines(rc, n, seen, &got, rewards, 0, err, errlen)) goto done;
        if (got == n) break;
        if (input_closed) {
            /* EPIPE: it closed its stdin, most likely by exiting. What it wrote before is already in
             * the pipe; a bad line there explains more than the exit does. */
            ssize_t k;
            seen = sent;
            while ((k = read_some(rc)) > 0) {
                if (take_lines(rc, n, seen, &got, rewards, 0, err, errlen)) goto done;
            }
            if (take_lines(rc, n, seen, &got, rewards, k == 0, err, errlen)) goto done;
            if (got == n) break;
            describe_gone(rc, "input", why, sizeof why);
            snprintf(err, errlen, "reward command `%s`: %s after %d of %d replies", rc->name, why, got, n);
            goto done;
        }
        struct pollfd fds[2] = {{rc->from, POLLIN, 0}, {rc->to, POLLOUT, 0}};
        int nfds = woff < wlen ? 2 : 1;
        int ms = -1;
        if (t_end > 0) {
            double left = t_end - mono();
            if (left <= 0) {
                snprintf(err, errlen, "reward command `%s`: no reply within %g s (%d of %d replies)", rc->name,
                         timeout_s, got, n);
                goto done;
            }
            ms = left * 1000 + 1 > INT_MAX ? INT_MAX : (int)(left * 1000) + 1;
        }
        if (poll(fds, (nfds_t)nfds, ms) < 0) {
            if (errno == EINTR) continue;
            snprintf(err, errlen, "reward command `%s`: poll: %s", rc->name, strerror(errno));
            goto done;
        }
        if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            seen = sent;
            ssize_t k = read_some(rc);
            if (k == 0) {   /* end of its output: a last line without a newline still counts */
                if (take_lines(rc, n, seen, &got, rewards, 1, err, errlen)) goto done;
                if (got == n) break;
                describe_gone(rc, "output", why, sizeof why);
                snprintf(err, errlen, "reward command `%s`: %s after %d of %d replies", rc->name, why, got, n);
                goto done;
            }
            if (k == -2) {
                snprintf(err, errlen, "reward command `%s`: read: %s", rc->name, strerror(errno));
                goto done;
            }
        }
        if (nfds == 2 && (fds[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
            ssize_t k = write(rc->to, w + woff, wlen - woff);
            if (k > 0) {
                woff += (size_t)k;
                while (sent < n && ends[sent] <= woff) sent++;
            } else if (k < 0 && errno == EPIPE) input_closed = 1;
            else if (k < 0 && errno != EAGAIN && errno != EINTR) {
                snprintf(err, errlen, "reward command `%s`: write: %s", rc->name, strerror(errno));
                goto done;
            }
        }
    }
    /* n replies to n requests: anything more already written (or read with the last reply) is a
     * surplus, which would otherwise become the next batch's first reward */
    while (read_some(rc) > 0) {}
    if (surplus(rc, n, err, errlen)) goto done;
    rv = 0;
done:
    if (rv) rc->failed = 1;
    free(w);
    free(ends);
    return rv;
}

void reward_cmd_stop(RewardCmd *rc) {
    if (!rc) return;
    close(rc->to);   /* end of its input: a well-behaved program exits now */
    double t_end = mono() + REWARD_CMD_GRACE_S;
    while (rc->pid > 0) {
        int status;
        pid_t w = waitpid(rc->pid, &status, WNOHANG);
        if (w == rc->pid || (w < 0 && errno != EINTR)) break;
        if (mono() > t_end) {
            kill(rc->pid, SIGTERM);    /* the keeper kills the program's group, then itself */
            for (int i = 0; i < 200 && waitpid(rc->pid, &status, WNOHANG) == 0; i++) usleep(10000);
            if (waitpid(rc->pid, &status, WNOHANG) == 0) {   /* a keeper that cannot act (stopped): 2 s */
                kill(rc->pid, SIGKILL);
                while (waitpid(rc->pid, &status, 0) < 0 && errno == EINTR) {}
            }
            break;
        }
        /* keep reading (and dropping) what it writes on its way out, so it never blocks on a full
         * pipe and never dies of SIGPIPE for a goodbye line; 10 ms at a time */
        struct pollfd p = {rc->from, POLLIN, 0};
        if (rc->from >= 0 && poll(&p, 1, 10) > 0) {
            char junk[4096];
            if (read(rc->from, junk, sizeof junk) == 0) { close(rc->from); rc->from = -1; }
        } else if (rc->from < 0) {
            usleep(10000);
        }
    }
    if (rc->from >= 0) close(rc->from);
    free(rc->name);
    free(rc->rbuf);
    free(rc);
}
