/* reward_cmd.c — see reward_cmd.h. One child (`sh -c CMD`), two pipes, a poll loop that writes the
 * batch's request lines while reading the replies as they come (neither side can block the other
 * on a full pipe). */
#include "rlhf/reward_cmd.h"
#include "runtime/jsonl.h"
#include "runtime/util.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct RewardCmd {
    char *cmd;
    pid_t pid;
    int to, from;          /* its stdin (we write), its stdout (we read) */
    char *rbuf;            /* bytes read and not yet consumed as lines */
    size_t rlen, rcap;
};

RewardCmd *reward_cmd_start(const char *cmd, char *err, size_t errlen) {
    int in[2], outp[2];
    signal(SIGPIPE, SIG_IGN);   /* a dead child shows up as EPIPE on write, not as a signal */
    if (pipe2(in, O_CLOEXEC) || pipe2(outp, O_CLOEXEC)) {
        snprintf(err, errlen, "reward command `%s`: pipe: %s", cmd, strerror(errno));
        return NULL;
    }
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err, errlen, "reward command `%s`: fork: %s", cmd, strerror(errno));
        return NULL;
    }
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(outp[1], 1);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(outp[1]);
    RewardCmd *rc = xcalloc(1, sizeof(RewardCmd));
    rc->cmd = xstrdup(cmd);
    rc->pid = pid;
    rc->to = in[1];
    rc->from = outp[0];
    fcntl(rc->to, F_SETFL, fcntl(rc->to, F_GETFL) | O_NONBLOCK);
    fcntl(rc->from, F_SETFL, fcntl(rc->from, F_GETFL) | O_NONBLOCK);
    return rc;
}

/* "exited with status 3" / "was killed by signal 9" / "closed its output" (still running) */
static void why_gone(RewardCmd *rc, char *buf, size_t len) {
    int status;
    pid_t w = 0;
    for (int i = 0; i < 50 && (w = waitpid(rc->pid, &status, WNOHANG)) == 0; i++) usleep(10000);
    if (w == rc->pid && WIFEXITED(status)) snprintf(buf, len, "exited with status %d", WEXITSTATUS(status));
    else if (w == rc->pid && WIFSIGNALED(status)) snprintf(buf, len, "was killed by signal %d", WTERMSIG(status));
    else snprintf(buf, len, "closed its output");
    if (w == rc->pid) rc->pid = -1;
}

static double mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int reward_cmd_score(RewardCmd *rc, int n, const char *const *prompts, const char *const *responses,
                     const char *const *labels, double *rewards, double timeout_s, char *err, size_t errlen) {
    /* the request: n lines */
    size_t wlen = 0, wcap = 4096, woff = 0;
    char *w = xmalloc(wcap);
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "prompt", prompts[i]);
        cJSON_AddStringToObject(o, "response", responses[i]);
        if (labels && labels[i]) {
            cJSON *l = cJSON_Parse(labels[i]);
            CHECK(l != NULL);
            cJSON_AddItemToObject(o, "label", l);
        }
        jsonl_append(&w, &wlen, &wcap, o);
        cJSON_Delete(o);
    }
    int got = 0, rv = 0;
    double t_end = timeout_s > 0 ? mono() + timeout_s : 0;
    char why[128];
    while (got < n) {
        /* whole lines already read */
        char *nl;
        while (got < n && rc->rlen && (nl = memchr(rc->rbuf, '\n', rc->rlen))) {
            *nl = 0;
            cJSON *o = cJSON_Parse(rc->rbuf);
            const cJSON *r = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, "reward") : NULL;
            if (!cJSON_IsNumber(r) || !isfinite(r->valuedouble)) {
                snprintf(err, errlen, "reward command `%s`: reply %d is not a JSON object with a finite number \"reward\": %.200s",
                         rc->cmd, got + 1, rc->rbuf);
                cJSON_Delete(o);
                rv = -1;
                goto done;
            }
            rewards[got++] = r->valuedouble;
            cJSON_Delete(o);
            size_t used = (size_t)(nl - rc->rbuf) + 1;
            memmove(rc->rbuf, nl + 1, rc->rlen - used);
            rc->rlen -= used;
        }
        if (got == n) break;
        struct pollfd fds[2] = {{rc->from, POLLIN, 0}, {rc->to, POLLOUT, 0}};
        int nfds = woff < wlen ? 2 : 1;
        int ms = -1;
        if (t_end > 0) {
            double left = t_end - mono();
            if (left <= 0) {
                snprintf(err, errlen, "reward command `%s`: no reply within %g s (%d of %d replies)", rc->cmd, timeout_s, got, n);
                rv = -1;
                goto done;
            }
            ms = (int)(left * 1000) + 1;
        }
        if (poll(fds, nfds, ms) < 0) {
            if (errno == EINTR) continue;
            snprintf(err, errlen, "reward command `%s`: poll: %s", rc->cmd, strerror(errno));
            rv = -1;
            goto done;
        }
        if (nfds == 2 && (fds[1].revents & (POLLOUT | POLLERR | POLLHUP))) {
            ssize_t k = write(rc->to, w + woff, wlen - woff);
            if (k > 0) woff += (size_t)k;
            else if (k < 0 && errno != EAGAIN && errno != EINTR) {   /* EPIPE: it is gone */
                why_gone(rc, why, sizeof why);
                snprintf(err, errlen, "reward command `%s`: %s after %d of %d replies", rc->cmd, why, got, n);
                rv = -1;
                goto done;
            }
        }
        if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            if (rc->rlen + 65536 > rc->rcap) rc->rbuf = xrealloc(rc->rbuf, rc->rcap = 2 * rc->rcap + 65536);
            ssize_t k = read(rc->from, rc->rbuf + rc->rlen, rc->rcap - rc->rlen - 1);
            if (k > 0) { rc->rlen += (size_t)k; rc->rbuf[rc->rlen] = 0; }
            else if (k == 0) {
                why_gone(rc, why, sizeof why);
                snprintf(err, errlen, "reward command `%s`: %s after %d of %d replies", rc->cmd, why, got, n);
                rv = -1;
                goto done;
            } else if (errno != EAGAIN && errno != EINTR) {
                snprintf(err, errlen, "reward command `%s`: read: %s", rc->cmd, strerror(errno));
                rv = -1;
                goto done;
            }
        }
    }
done:
    free(w);
    return rv;
}

void reward_cmd_stop(RewardCmd *rc) {
    if (!rc) return;
    close(rc->to);
    close(rc->from);
    if (rc->pid > 0) {
        int status;
        double t_end = mono() + 5.0;
        while (waitpid(rc->pid, &status, WNOHANG) == 0) {
            if (mono() > t_end) { kill(rc->pid, SIGKILL); waitpid(rc->pid, &status, 0); break; }
            usleep(10000);
        }
    }
    free(rc->cmd);
    free(rc->rbuf);
    free(rc);
}
