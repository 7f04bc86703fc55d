/* sandbox.c — see sandbox.h. The clone's side (the namespace's init: setup, fork of the program,
 * reaping; system calls only), then the parent's: feeding stdin, reading stdout / stderr under the
 * caps, the wall-clock kill, the init's report of the program's status.
 * Why namespaces and not Landlock: Landlock cannot deny the network (only TCP bind / connect
 * ports, and not in every kernel's ABI) nor contain a process tree; a PID namespace kills the whole
 * tree at once, a network namespace has no route anywhere, and a mount namespace gives the read-only
 * view and a private tmpfs; all three work as root on Debian 12's kernels (and unprivileged, with
 * user namespaces enabled). */
#include "rlhf/sandbox.h"
#include "runtime/util.h"
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/securebits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SYS_mount_setattr
#define SYS_mount_setattr 442
#endif
/* linux/mount.h's (not included: it clashes with sys/mount.h on older glibc) */
typedef struct { uint64_t attr_set, attr_clr, propagation, userns_fd; } MountAttr;
#define MOUNT_RDONLY 0x1
#define MOUNT_NOSUID 0x2
#define MOUNT_RECURSIVE 0x8000   /* AT_RECURSIVE */

SandboxLimits sandbox_default_limits(void) {
    return (SandboxLimits){.cpu_s = 10, .mem_bytes = (size_t)1 << 30, .nproc = 8,
                           .fsize_bytes = 16u << 20, .out_bytes = 1u << 20};
}

/* The setup steps, for the message when one fails. */
enum { ST_FDS, ST_USERNS, ST_PRIVATE, ST_READONLY, ST_PROC, ST_TMP, ST_WORKDIR, ST_TMP_RO, ST_HIDE,
       ST_PROGRAM, ST_RLIMIT, ST_CREDS, ST_EXEC, ST_FORK, ST_DONE };
static const char *const step_names[] = {
    "descriptors", "user namespace maps", "private mounts", "read-only remount of /", "mount /proc",
    "tmpfs on /tmp", "tmpfs working directory", "read-only /tmp", "tmpfs over /var/tmp or /dev/shm",
    "writing main.py", "rlimits", "dropping to the sandbox uid", "exec python3", "fork / wait in the init"};

typedef struct {
    int in_r, out_w, err_w, report_w;   /* the pipes' child ends */
    int as_root;                        /* else: a user namespace mapping the caller's uid to 0 */
    unsigned uid, outer_uid, outer_gid;
    const char *program;
    size_t program_len;
    char tmpfs_opts[160];
    struct rlimit rl[6];
    int rl_which[6];
    char *argv[6], *envp[6];
} Child;

static _Noreturn void child_fail(int step) {
    int msg[2] = {step, errno};
    ssize_t w = write(3, msg, sizeof msg);
    (void)w;
    _exit(127);
}

/* Writes "0 ID 1" to path (a user namespace map); system calls only. */
static int write_map(const char *path, unsigned id) {
    char buf[32] = "0 ", digits[12];
    int n = 0, k = 2;
    do digits[n++] = (char)('0' + id % 10); while ((id /= 10));
    while (n) buf[k++] = digits[--n];
    buf[k++] = ' ', buf[k++] = '1';
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    int ok = fd >= 0 && write(fd, buf, (size_t)k) == k;
    if (fd >= 0) close(fd);
    return ok ? 0 : -1;
}

static int mount_attr(const char *path, unsigned flags, uint64_t set) {
    MountAttr a = {.attr_set = set};
    return (int)syscall(SYS_mount_setattr, AT_FDCWD, path, flags, &a, sizeof a);
}

/* Without root the program is uid 0 of its own user namespace, where it holds every capability
 * (and could remount / read-write or unmount the tmpfs over /tmp): all of them go, for good: the
 * bounding set emptied, securebits so that uid 0 gains none at exec (locked), then none held. */
static int drop_capabilities(void) {
    for (int cap = 0; cap <= 63; cap++)
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) && errno != EINVAL) return -1;   /* EINVAL: past the last */
    if (prctl(PR_SET_SECUREBITS, SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP |
              SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_KEEP_CAPS_LOCKED, 0, 0, 0))
        return -1;
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2] = {{0, 0, 0}, {0, 0, 0}};
    return (int)syscall(SYS_capset, &h, d);
}

/* The program's process: limits, an unprivileged uid (or no capability in the user namespace),
 * exec. System calls only. */
static _Noreturn void program_exec(const Child *c) {
    for (int i = 0; i < 6; i++)
        if (setrlimit(c->rl_which[i], &c->rl[i])) child_fail(ST_RLIMIT);
    if (c->as_root && (setgroups(0, NULL) || setresgid(c->uid, c->uid, c->uid) || setresuid(c->uid, c->uid, c->uid)))
        child_fail(ST_CREDS);
    if (!c->as_root && drop_capabilities()) child_fail(ST_CREDS);
    /* after the uid change, which clears it: dies with the namespace's init */
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)) child_fail(ST_CREDS);
    execve(c->argv[0], c->argv, c->envp);
    child_fail(ST_EXEC);
}

/* The namespaces and the mounts (see sandbox.h), main.py written, the working directory entered. */
static void child_setup(const Child *c) {
    if (!c->as_root) {
        int fdg = open("/proc/self/setgroups", O_WRONLY | O_CLOEXEC);
        if (fdg < 0 || write(fdg, "deny", 4) != 4) child_fail(ST_USERNS);
        close(fdg);
        if (write_map("/proc/self/uid_map", c->outer_uid) || write_map("/proc/self/gid_map", c->outer_gid))
            child_fail(ST_USERNS);
    }
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL)) child_fail(ST_PRIVATE);
    if (mount_attr("/", MOUNT_RECURSIVE, MOUNT_RDONLY | MOUNT_NOSUID)) child_fail(ST_READONLY);
    if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL)) child_fail(ST_PROC);
    if (mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,nr_inodes=16,mode=0755")) child_fail(ST_TMP);
    if (mkdir("/tmp/sandbox", 0755) || mount("tmpfs", "/tmp/sandbox", "tmpfs", MS_NOSUID | MS_NODEV, c->tmpfs_opts))
        child_fail(ST_WORKDIR);
    if (mount_attr("/tmp", 0, MOUNT_RDONLY)) child_fail(ST_TMP_RO);
    static const char *const hide[] = {"/var/tmp", "/dev/shm"};
    for (int i = 0; i < 2; i++)
        if (mount("tmpfs", hide[i], "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,nr_inodes=1") && errno != ENOENT)
            child_fail(ST_HIDE);
    int p = open("/tmp/sandbox/main.py", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0444);
    if (p < 0) child_fail(ST_PROGRAM);
    for (size_t off = 0; off < c->program_len;) {
        ssize_t w = write(p, c->program + off, c->program_len - off);
        if (w <= 0) child_fail(ST_PROGRAM);
        off += (size_t)w;
    }
    close(p);
    if (chdir("/tmp/sandbox")) child_fail(ST_WORKDIR);
}

/* Runs in the clone: pid 1 of its namespaces, a minimal init. It sets up, forks the program (an
 * init ignores the signals its namespace sends it, so the program must not be pid 1: a program
 * that raises SIGSEGV or SIGTERM on itself dies of it), reaps every orphan, and when the program
 * ends reports its wait status on fd 3 and exits, which kills whatever the program left running.
 * System calls only (the fork is the raw clone: no glibc fork handlers in a copy of a threaded
 * process). */
static int child_main(void *arg) {
    const Child *c = arg;
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);   /* dies with the thread that made it */
    int fd[4] = {c->in_r, c->out_w, c->err_w, c->report_w};
    for (int i = 0; i < 4; i++)
        if ((fd[i] = fcntl(fd[i], F_DUPFD_CLOEXEC, 10)) < 0) _exit(126);
    if (dup2(fd[0], 0) < 0 || dup2(fd[1], 1) < 0 || dup2(fd[2], 2) < 0 || dup3(fd[3], 3, O_CLOEXEC) < 0) _exit(126);
    if (close_range(4, ~0u, 0) != 0) child_fail(ST_FDS);
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    for (int s = 1; s < NSIG; s++) sigaction(s, &dfl, NULL);   /* SIGXFSZ, SIGPIPE: tandem ignores them */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    setsid();
    child_setup(c);
    pid_t prog = (pid_t)syscall(SYS_clone, SIGCHLD, NULL, NULL, NULL, NULL);
    if (prog < 0) child_fail(ST_FORK);
    if (prog == 0) program_exec(c);
    close(0), close(1), close(2);   /* the program's alone: EOF when it and its children are done */
    int ws = 0;
    for (pid_t w; (w = waitpid(-1, &ws, 0)) != prog;)
        if (w < 0 && errno != EINTR) child_fail(ST_FORK);
    int msg[2] = {ST_DONE, ws};
    ssize_t n = write(3, msg, sizeof msg);
    _exit(n == (ssize_t)sizeof msg ? 0 : 127);
}

/* The first python3 of the usual places (the sandbox's PATH is not the caller's). */
static const char *python_path(void) {
    static const char *const where[] = {"/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"};
    for (int i = 0; i < 3; i++)
        if (access(where[i], X_OK) == 0) return where[i];
    return NULL;
}

static void child_init(Child *c, const char *program, int slot, const SandboxLimits *lim, double seconds) {
    memset(c, 0, sizeof *c);
    c->as_root = geteuid() == 0;
    c->outer_uid = (unsigned)geteuid(), c->outer_gid = (unsigned)getegid();
    c->uid = c->as_root ? SANDBOX_UID_BASE + (unsigned)getpid() % SANDBOX_PID_LIMIT * 64u + (unsigned)(slot & 63) : 0;
    c->program = program, c->program_len = strlen(program);
    snprintf(c->tmpfs_opts, sizeof c->tmpfs_opts, "size=%u,nr_inodes=4096,mode=0700,uid=%u,gid=%u", SANDBOX_DIR_BYTES,
             c->uid, c->uid);
    rlim_t cpu = (rlim_t)(seconds < 1 ? 1 : seconds + 0.999);
    if (lim->cpu_s > 0 && (rlim_t)(lim->cpu_s + 0.999) < cpu) cpu = (rlim_t)(lim->cpu_s + 0.999);
    int which[6] = {RLIMIT_CPU, RLIMIT_AS, RLIMIT_NPROC, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_CORE};
    rlim_t soft[6] = {cpu, lim->mem_bytes, (rlim_t)lim->nproc, lim->fsize_bytes, 256, 0};
    for (int i = 0; i < 6; i++) {
        c->rl_which[i] = which[i];
        c->rl[i].rlim_cur = soft[i];
        c->rl[i].rlim_max = which[i] == RLIMIT_CPU ? soft[i] + 1 : soft[i];   /* SIGXCPU, then SIGKILL */
    }
    c->argv[0] = (char *)python_path(), c->argv[1] = "-I", c->argv[2] = "-B", c->argv[3] = "main.py";
    c->envp[0] = "PATH=/usr/local/bin:/usr/bin:/bin", c->envp[1] = "HOME=/tmp/sandbox", c->envp[2] = "LANG=C.UTF-8",
    c->envp[3] = "PYTHONHASHSEED=0";
}

/* Keeps the last non-blank line of the stderr bytes seen so far (tail: a rolling 4 KiB). */
static void last_line(const char *tail, size_t n, char *dst, size_t cap) {
    while (n && strchr(" \t\r\n", tail[n - 1])) n--;
    size_t s = n;
    while (s && tail[s - 1] != '\n') s--;
    size_t len = n - s < cap - 1 ? n - s : cap - 1;
    memcpy(dst, tail + s, len);
    dst[len] = 0;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)dst[i] < 0x20) dst[i] = ' ';
}

/* The parent's loop: input in, output and stderr out, until both close or the deadline / the cap. */
static SandboxStatus pump(pid_t pid, int in_w, int out_r, int err_r, const char *input, size_t input_len,
                          double deadline, size_t out_cap, SandboxResult *res) {
    char tail[4096], buf[65536];
    size_t tail_len = 0, in_off = 0;
    res->out = xmalloc(out_cap + 1);
    res->out_len = 0;
    fcntl(in_w, F_SETFL, O_NONBLOCK);
    if (input_len == 0) close(in_w), in_w = -1;
    SandboxStatus st = SANDBOX_EXITED;
    while (out_r >= 0 || err_r >= 0) {
        double left = deadline - now_seconds();
        if (left <= 0) { st = SANDBOX_TIMEOUT; break; }
        struct pollfd pf[3] = {{.fd = in_w, .events = POLLOUT}, {.fd = out_r, .events = POLLIN}, {.fd = err_r, .events = POLLIN}};
        int ms = left > 1 ? 1000 : (int)(left * 1000) + 1;
        if (poll(pf, 3, ms) < 0 && errno != EINTR) break;
        if (in_w >= 0 && pf[0].revents) {
            ssize_t w = write(in_w, input + in_off, input_len - in_off);
            if (w > 0) in_off += (size_t)w;
            if ((w < 0 && errno != EAGAIN) || in_off == input_len) close(in_w), in_w = -1;   /* EPIPE: it stopped reading */
        }
        if (out_r >= 0 && pf[1].revents) {
            ssize_t r = read(out_r, buf, sizeof buf);
            if (r <= 0) { close(out_r), out_r = -1; continue; }
            if (res->out_len + (size_t)r > out_cap) { st = SANDBOX_OUTPUT_LIMIT; break; }
            memcpy(res->out + res->out_len, buf, (size_t)r);
            res->out_len += (size_t)r;
        }
        if (err_r >= 0 && pf[2].revents) {
            ssize_t r = read(err_r, buf, sizeof buf);
            if (r <= 0) { close(err_r), err_r = -1; continue; }
            size_t k = (size_t)r > sizeof tail ? sizeof tail : (size_t)r;
            if (tail_len + k > sizeof tail) {      /* keep the newest bytes */
                size_t drop = tail_len + k - sizeof tail;
                memmove(tail, tail + drop, tail_len - drop);
                tail_len -= drop;
            }
            memcpy(tail + tail_len, buf + (size_t)r - k, k);
            tail_len += k;
        }
    }
    if (st != SANDBOX_EXITED) kill(pid, SIGKILL);   /* pid 1 of its namespace: the whole tree goes */
    if (in_w >= 0) close(in_w);
    if (out_r >= 0) close(out_r);
    if (err_r >= 0) close(err_r);
    res->out[res->out_len] = 0;
    last_line(tail, tail_len, res->err_last, sizeof res->err_last);
    return st;
}

int sandbox_run(const char *program, const char *input, size_t input_len, double deadline, int slot,
                const SandboxLimits *lim, SandboxResult *res, char *err, size_t errlen) {
    memset(res, 0, sizeof *res);
    Child c;
    child_init(&c, program, slot, lim, deadline - now_seconds());
    if (!c.argv[0]) {
        snprintf(err, errlen, "code sandbox: no python3 in /usr/bin, /usr/local/bin or /bin");
        return -1;
    }
    int in[2], out[2], er[2], rep[2];
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) || pipe2(er, O_CLOEXEC) || pipe2(rep, O_CLOEXEC)) {
        snprintf(err, errlen, "code sandbox: pipe: %s", strerror(errno));
        return -1;   /* a leak of a few descriptors on a failing pipe2: the caller stops anyway */
    }
    c.in_r = in[0], c.out_w = out[1], c.err_w = er[1], c.report_w = rep[1];
    size_t stack_size = 256 << 10;
    char *stack = xmalloc(stack_size);   /* the clone's copy of it: no CLONE_VM, so freed at once here */
    int flags = CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS | SIGCHLD;
    if (!c.as_root) flags |= CLONE_NEWUSER;
    pid_t pid = clone(child_main, stack + stack_size, flags, &c);
    int clone_errno = errno;
    free(stack);
    close(in[0]), close(out[1]), close(er[1]), close(rep[1]);
    if (pid < 0) {
        close(in[1]), close(out[0]), close(er[0]), close(rep[0]);
        snprintf(err, errlen, "code sandbox: clone with new pid/net/mount namespaces: %s%s", strerror(clone_errno),
                 c.as_root ? "" : " (not root: unprivileged user namespaces must be enabled)");
        return -1;
    }
    res->status = pump(pid, in[1], out[0], er[0], input, input_len, deadline, lim->out_bytes, res);
    /* Its pipes are closed, but it may run on (a program that closed stdout and stderr): the
     * deadline still holds. Polled every ms at first, every 10 ms after the first 10. */
    for (int tries = 0;; tries++) {
        pid_t w = waitpid(pid, NULL, res->status == SANDBOX_EXITED ? WNOHANG : 0);
        if (w == pid || (w < 0 && errno != EINTR)) break;
        if (w == 0 && now_seconds() >= deadline) {
            kill(pid, SIGKILL);
            res->status = SANDBOX_TIMEOUT;
            continue;
        }
        if (w == 0) usleep(tries < 10 ? 1000 : 10000);
    }
    /* The init has ended: its report is there, or it was killed (timeout, output cap) */
    int msg[2];
    ssize_t got;
    while ((got = read(rep[0], msg, sizeof msg)) < 0 && errno == EINTR) {}
    close(rep[0]);
    if (got == (ssize_t)sizeof msg && msg[0] != ST_DONE) {   /* the setup failed: not the program's fault */
        free(res->out), res->out = NULL;
        snprintf(err, errlen, "code sandbox: %s: %s", step_names[msg[0]], strerror(msg[1]));
        return -1;
    }
    if (res->status != SANDBOX_EXITED) return 0;
    if (got != (ssize_t)sizeof msg) {
        free(res->out), res->out = NULL;
        snprintf(err, errlen, "code sandbox: its init ended without a report");
        return -1;
    }
    if (WIFSIGNALED(msg[1])) res->status = SANDBOX_SIGNALED, res->code = WTERMSIG(msg[1]);
    else res->code = WEXITSTATUS(msg[1]);
    return 0;
}
