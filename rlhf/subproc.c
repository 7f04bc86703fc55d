/* subproc.c — see subproc.h. One child (`sh -c CMD`, under a keeper) in its own session, two
 * non-blocking pipes, and one poll round at a time for a caller's loop that writes a batch of
 * request lines while reading the replies as they come, so neither side can block the other on a
 * full pipe. The program and all it started end with us, on every way out. */
#include "rlhf/subproc.h"
#include "runtime/util.h"
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define SUBPROC_GRACE_S 5.0   /* subproc_stop: seconds after closing its stdin, then SIGTERM to the keeper */

void subproc_shown(char *out, size_t outlen, const char *s, size_t len) {
    size_t cut = len;
    if (cut > SUBPROC_SHOWN) {
        cut = SUBPROC_SHOWN;
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

/* The keeper, our child `sh -c KEEPER sh CMD`: it starts the program (`sh -c CMD`, a background job:
 * SIGINT and SIGQUIT ignored, as in any) in a session and process group of its own, and kills that
 * whole group when the program exits (what it started and left behind) or when the keeper gets
 * SIGTERM: subproc_stop's, or PR_SET_PDEATHSIG's when this process is gone, however it went (an
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

int subproc_start(Subproc *p, const char *cmd, const char *what, char *err, size_t errlen) {
    char name[4 * SUBPROC_SHOWN + 8];
    subproc_shown(name, sizeof name, cmd, strlen(cmd));
    /* A child that is gone shows up as EPIPE on write, not as a signal that kills us. Once, for the
     * whole process: the child gets the default back before exec. */
    signal(SIGPIPE, SIG_IGN);
    int in[2] = {-1, -1}, out[2] = {-1, -1};   /* its stdin, its stdout: [0] read end, [1] write end */
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC)) {
        snprintf(err, errlen, "%s `%s`: pipe: %s", what, name, strerror(errno));
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
        snprintf(err, errlen, "%s `%s`: fork: %s", what, name, strerror(errno));
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
    *p = (Subproc){.name = xstrdup(name), .pid = pid, .to = in[1], .from = out[0], .rcap = 65536};
    fcntl(p->to, F_SETFL, fcntl(p->to, F_GETFL) | O_NONBLOCK);
    fcntl(p->from, F_SETFL, fcntl(p->from, F_GETFL) | O_NONBLOCK);
    p->rbuf = xmalloc(p->rcap);
    p->rbuf[0] = 0;
    return 0;

close_pipes:
    for (int i = 0; i < 2; i++) {
        if (in[i] >= 0) close(in[i]);
        if (out[i] >= 0) close(out[i]);
    }
    return -1;
}

void subproc_describe_gone(Subproc *p, const char *closed, char *buf, size_t len) {
    int status = 0;
    pid_t w = 0;
    for (int i = 0; i < 100 && (w = waitpid(p->pid, &status, WNOHANG)) == 0; i++) usleep(10000);
    if (w != p->pid) {
        snprintf(buf, len, "closed its %s", closed);
        return;
    }
    p->pid = -1;
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

ssize_t subproc_read(Subproc *p) {
    if (p->rlen + 65536 + 1 > p->rcap) p->rbuf = xrealloc(p->rbuf, p->rcap = 2 * p->rcap + 65536);
    ssize_t k = read(p->from, p->rbuf + p->rlen, p->rcap - p->rlen - 1);
    if (k > 0) {
        p->rlen += (size_t)k;
        p->rbuf[p->rlen] = 0;
        return k;
    }
    if (k == 0) return 0;
    return errno == EAGAIN || errno == EINTR ? -1 : -2;
}

int subproc_pump(Subproc *p, const char *w, size_t wlen, size_t *woff, double t_end, const char *what, char *err,
                 size_t errlen) {
    struct pollfd fds[2] = {{p->from, POLLIN, 0}, {p->to, POLLOUT, 0}};
    int nfds = *woff < wlen ? 2 : 1, ms = -1, r = 0;
    if (t_end > 0) {
        double left = t_end - now_seconds();
        if (left <= 0) return SUBPROC_TIMEOUT;
        ms = left * 1000 + 1 > INT_MAX ? INT_MAX : (int)(left * 1000) + 1;
    }
    if (poll(fds, (nfds_t)nfds, ms) < 0) {
        if (errno == EINTR) return 0;
        snprintf(err, errlen, "%s `%s`: poll: %s", what, p->name, strerror(errno));
        return -1;
    }
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
        ssize_t k = subproc_read(p);
        if (k == 0) return SUBPROC_EOF;
        if (k == -2) {
            snprintf(err, errlen, "%s `%s`: read: %s", what, p->name, strerror(errno));
            return -1;
        }
        if (k > 0) r |= SUBPROC_READ;
    }
    if (nfds == 2 && (fds[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
        ssize_t k = write(p->to, w + *woff, wlen - *woff);
        if (k > 0) *woff += (size_t)k;
        else if (k < 0 && errno == EPIPE) r |= SUBPROC_EPIPE;
        else if (k < 0 && errno != EAGAIN && errno != EINTR) {
            snprintf(err, errlen, "%s `%s`: write: %s", what, p->name, strerror(errno));
            return -1;
        }
    }
    return r;
}

void subproc_stop(Subproc *p) {
    if (p->to >= 0) close(p->to);   /* end of its input: a well-behaved program exits now */
    double t_end = now_seconds() + SUBPROC_GRACE_S;
    while (p->pid > 0) {
        int status;
        pid_t w = waitpid(p->pid, &status, WNOHANG);
        if (w == p->pid || (w < 0 && errno != EINTR)) break;
        if (now_seconds() > t_end) {
            kill(p->pid, SIGTERM);    /* the keeper kills the program's group, then itself */
            for (int i = 0; i < 200 && waitpid(p->pid, &status, WNOHANG) == 0; i++) usleep(10000);
            if (waitpid(p->pid, &status, WNOHANG) == 0) {   /* a keeper that cannot act (stopped): 2 s */
                kill(p->pid, SIGKILL);
                while (waitpid(p->pid, &status, 0) < 0 && errno == EINTR) {}
            }
            break;
        }
        /* keep reading (and dropping) what it writes on its way out, so it never blocks on a full
         * pipe and never dies of SIGPIPE for a goodbye line; 10 ms at a time */
        struct pollfd q = {p->from, POLLIN, 0};
        if (p->from >= 0 && poll(&q, 1, 10) > 0) {
            char junk[4096];
            if (read(p->from, junk, sizeof junk) == 0) { close(p->from); p->from = -1; }
        } else if (p->from < 0) {
            usleep(10000);
        }
    }
    if (p->from >= 0) close(p->from);
    free(p->name);
    free(p->rbuf);
    *p = (Subproc){.pid = -1, .to = -1, .from = -1};
}
