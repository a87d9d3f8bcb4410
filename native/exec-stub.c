/* warren-exec-stub: the last step of starting a command in a sandbox.
 *
 * The exec helper forks the command's process ahead of time, and that process execs
 * this program from a sealed memfd at once; this program then confines itself for good
 * (``confine`` below: rlimits, no_new_privs, its own Landlock domain, no capabilities,
 * the seccomp filter) and waits. So when a command comes, it starts from a process of
 * a few pages instead of a copy of the helper's Python (tearing that down in execve
 * cost about a millisecond), and the process made ahead costs no Python either
 * (confining itself in Python, in a fresh copy of the helper, cost 1.3 ms of page
 * faults and calls). Without WARREN_CONFINE in its environment the process confined
 * itself before the exec (the helper's Python path, ``shim._await_launch``).
 *
 * WARREN_CONFINE, what to confine to (fields separated by ';'): the descriptor of its
 *   channel (put at fd 3) and of the Landlock ruleset ("-1": none), as the process that
 *   exec'd it left them; the signals whose disposition a command starts with as default
 *   (numbers separated by ','), oom ("1": write 500 to /proc/self/oom_score_adj, "0"
 *   not), rlimits ("RES:VALUE" pairs separated by ','; soft and hard set to VALUE), the
 *   seccomp filter (its struct sock_filter array, hex). First a session of its own and an
 *   empty signal mask. Nothing is said before every step is done.
 *
 * On fd 3, a stream socket to the helper (or, for an exec the supervisor hands the
 * sandbox itself, the helper's end of it held by the supervisor: it writes the request,
 * the helper reads the outcome):
 *   -> "C"                            confined and ready; also the format's version: a
 *                                     change of the format (or of what "ready" means)
 *                                     changes it
 *   -> "F", u32 step, u32 errno       (big-endian) a step of confining failed; exit 127
 *   <- u32 length (big-endian), then that many bytes of NUL-terminated strings:
 *      cwd, walk ("1": if cwd cannot be entered, the nearest ancestor that can),
 *      scratch (a directory to make, mode 0700, if missing; "" none), path,
 *      search ("1": path is a name to look up in the environment's PATH, as execvp),
 *      nulls (three "0"/"1": which of stdin, stdout, stderr is /dev/null; the passed
 *      fds fill the others in order), ctty ("-1" or the index of a passed fd), argc,
 *      argv..., env...
 *      with the command's stdio (up to 3 fds) passed along (SCM_RIGHTS)
 *   -> nothing: fd 3 closes on a successful execve
 *   -> "E", u32 step, u32 errno (big-endian) when a step failed; exit 127
 * An end of file before the request (the helper did not need this process): exit 0.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>

#define SOCK 3
#define MAX_REQUEST (64u << 20) /* far above what execve takes (ARG_MAX with a big stack) */
#define MAX_FDS 3

enum step { STEP_PROTOCOL = 1, STEP_CHDIR = 2, STEP_CTTY = 3, STEP_STDIO = 4, STEP_EXECVE = 5, STEP_SEARCH = 6 };
#define FIELDS 8 /* strings before argv */

/* The steps of confining, as a failed one is reported ("F"). */
enum confine_step {
    CONFINE_SPEC = 1,
    CONFINE_RLIMIT = 2,
    CONFINE_NO_NEW_PRIVS = 3,
    CONFINE_LANDLOCK = 4,
    CONFINE_CAPABILITIES = 5,
    CONFINE_SECCOMP = 6
};

static void report(char kind, uint32_t step, int err) {
    unsigned char out[9];
    uint32_t s = htonl(step), e = htonl((uint32_t)err);
    out[0] = (unsigned char)kind;
    memcpy(out + 1, &s, 4);
    memcpy(out + 5, &e, 4);
    ssize_t n;
    do {
        n = write(SOCK, out, sizeof out);
    } while (n < 0 && errno == EINTR);
    _exit(127);
}

static void fail(enum step step, int err) { report('E', (uint32_t)step, err); }

static int read_exactly(char *buf, size_t len) {
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(SOCK, buf + got, len - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    return 0;
}

/* The head (the length) with the passed descriptors; 0 at an end of file. */
static int read_head(uint32_t *len, int *fds, int *nfds) {
    char head[4];
    union {
        char buf[CMSG_SPACE(sizeof(int) * MAX_FDS)];
        struct cmsghdr align;
    } control;
    struct iovec iov = {.iov_base = head, .iov_len = sizeof head};
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf, .msg_controllen = sizeof control.buf};
    ssize_t n;
    do {
        n = recvmsg(SOCK, &msg, MSG_CMSG_CLOEXEC);
    } while (n < 0 && errno == EINTR);
    if (n == 0)
        return 0;
    if (n < 0 || (msg.msg_flags & MSG_CTRUNC))
        fail(STEP_PROTOCOL, n < 0 ? errno : EMSGSIZE);
    *nfds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count && *nfds < MAX_FDS; i++)
            memcpy(&fds[(*nfds)++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
    }
    if (n < (ssize_t)sizeof head && read_exactly(head + n, sizeof head - (size_t)n) < 0)
        fail(STEP_PROTOCOL, EPROTO);
    memcpy(len, head, 4);
    *len = ntohl(*len);
    return 1;
}

/* Enter cwd; with walk, the nearest ancestor that can be entered (as the helper does
 * for the default directory, which it reports as a warning). */
static void enter(char *cwd, int walk) {
    if (chdir(cwd) == 0)
        return;
    if (!walk)
        fail(STEP_CHDIR, errno);
    for (char *slash = strrchr(cwd, '/'); slash != NULL && slash != cwd; slash = strrchr(cwd, '/')) {
        *slash = '\0';
        if (chdir(cwd) == 0)
            return;
    }
    if (chdir("/") < 0)
        fail(STEP_CHDIR, errno);
}

/* PATH search as the helper's: the first executable regular file wins; else the first
 * regular file found (its execve says why: EACCES); else not found. */
static void search_and_exec(const char *name, char **argv, char **envp) {
    const char *path = NULL;
    for (char **e = envp; *e != NULL; e++)
        if (strncmp(*e, "PATH=", 5) == 0)
            path = *e + 5;
    if (path == NULL || *path == '\0')
        path = "/usr/bin:/bin";
    size_t nlen = strlen(name);
    char *candidate = malloc(strlen(path) + nlen + 3);
    char *first = NULL;
    if (candidate == NULL)
        fail(STEP_PROTOCOL, ENOMEM);
    for (const char *p = path;; p++) {
        const char *colon = strchrnul(p, ':');
        size_t dlen = (size_t)(colon - p);
        if (dlen == 0) {
            candidate[0] = '.';
            dlen = 1;
        } else {
            memcpy(candidate, p, dlen);
        }
        if (candidate[dlen - 1] != '/')
            candidate[dlen++] = '/';
        memcpy(candidate + dlen, name, nlen + 1);
        struct stat st;
        if (stat(candidate, &st) == 0 && S_ISREG(st.st_mode)) {
            if (access(candidate, X_OK) == 0) {
                execve(candidate, argv, envp);
                fail(STEP_EXECVE, errno);
            }
            if (first == NULL)
                first = strdup(candidate);
        }
        p = colon;
        if (*p == '\0')
            break;
    }
    if (first != NULL) {
        execve(first, argv, envp);
        fail(STEP_EXECVE, errno);
    }
    fail(STEP_SEARCH, ENOENT);
}

static int hexval(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* Confine this process for good, as ``harden.harden`` and ``shim.limit_resources`` do
 * in Python, in the same order; ``spec`` is WARREN_CONFINE (see the top). */
/* WARREN_CONFINE's descriptors put in place: its channel as fd 3 (SOCK), and the
 * Landlock ruleset (-1: none) returned where it is now, out of the way; both must be
 * open, the first fields are numbers. Before anything can be reported on SOCK. */
static int place_fds(char **spec) {
    char *end;
    long sock = strtol(*spec, &end, 10);
    if (*end != ';' || sock < 0 || fcntl((int)sock, F_GETFD) < 0)
        _exit(127); /* no channel to say it on: the helper sees it gone */
    long ruleset = strtol(end + 1, &end, 10);
    if (*end != ';' || ruleset < -1 || (ruleset >= 0 && fcntl((int)ruleset, F_GETFD) < 0))
        _exit(127);
    *spec = end + 1;
    if (ruleset == SOCK) {
        ruleset = fcntl((int)ruleset, F_DUPFD_CLOEXEC, SOCK + 1);
        if (ruleset < 0)
            _exit(127);
    }
    if (sock != SOCK) {
        if (dup2((int)sock, SOCK) < 0)
            _exit(127);
        close((int)sock);
    }
    if (ruleset >= 0 && ruleset != SOCK + 1) {
        if (dup2((int)ruleset, SOCK + 1) < 0)
            _exit(127);
        close((int)ruleset);
        ruleset = SOCK + 1;
    }
    /* Nothing else of the process that started it (posix_spawn keeps what is not
     * close-on-exec). */
    syscall(SYS_close_range, ruleset >= 0 ? SOCK + 2 : SOCK + 1, ~0U, 0U);
    if (ruleset >= 0)
        fcntl((int)ruleset, F_SETFD, FD_CLOEXEC);
    return (int)ruleset;
}

static void confine(char *spec) {
    int ruleset = place_fds(&spec);
    char *fields[4];
    for (int i = 0; i < 4; i++) {
        fields[i] = spec;
        if (i < 3) {
            char *sep = strchr(spec, ';');
            if (sep == NULL)
                report('F', CONFINE_SPEC, EINVAL);
            *sep = '\0';
            spec = sep + 1;
        }
    }
    char *signals = fields[0], *oom = fields[1], *limits = fields[2], *hex = fields[3];
    char *end;
    if (setsid() < 0 && getsid(0) != getpid())
        _exit(0); /* as the Python path: not usable, so not needed after all */
    for (char *sig = signals; *sig != '\0';) {
        long number = strtol(sig, &end, 10);
        if ((*end != ',' && *end != '\0') || number <= 0 || number >= NSIG)
            report('F', CONFINE_SPEC, EINVAL);
        signal((int)number, SIG_DFL);
        sig = *end == ',' ? end + 1 : end;
    }
    /* glibc's own two (SIGCANCEL, SIGSETXID), which its sigaction refuses and which a
     * process started by posix_spawn has ignored: at their default, as a command the
     * host's shell starts has them (all zero: SIG_DFL, whatever the struct's layout). */
    for (int sig = 32; sig <= 33; sig++) {
        unsigned long zero[8] = {0};
        syscall(SYS_rt_sigaction, sig, zero, NULL, sizeof(unsigned long));
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (strcmp(oom, "1") == 0) {
        int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
        if (fd >= 0) { /* as the Python path: a failure here is not one */
            (void)!write(fd, "500", 3);
            close(fd);
        }
    }
    for (char *pair = limits; *pair != '\0';) {
        long res = strtol(pair, &end, 10);
        if (*end != ':' || res < 0)
            report('F', CONFINE_SPEC, EINVAL);
        unsigned long long value = strtoull(end + 1, &end, 10);
        if (*end != ',' && *end != '\0')
            report('F', CONFINE_SPEC, EINVAL);
        struct rlimit limit = {.rlim_cur = (rlim_t)value, .rlim_max = (rlim_t)value};
        if (setrlimit((int)res, &limit) < 0)
            report('F', CONFINE_RLIMIT, errno);
        pair = *end == ',' ? end + 1 : end;
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        report('F', CONFINE_NO_NEW_PRIVS, errno);
    if (ruleset >= 0) {
        if (syscall(SYS_landlock_restrict_self, ruleset, 0U) < 0)
            report('F', CONFINE_LANDLOCK, errno);
        close(ruleset);
    }
    struct __user_cap_header_struct header = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct caps[2];
    memset(caps, 0, sizeof caps);
    if (syscall(SYS_capset, &header, caps) < 0)
        report('F', CONFINE_CAPABILITIES, errno);
    size_t hexlen = strlen(hex);
    size_t count = hexlen / (2 * sizeof(struct sock_filter));
    if (count == 0 || count > BPF_MAXINSNS || hexlen != count * 2 * sizeof(struct sock_filter))
        report('F', CONFINE_SPEC, EINVAL);
    unsigned char *program = malloc(hexlen / 2);
    if (program == NULL)
        report('F', CONFINE_SPEC, ENOMEM);
    for (size_t i = 0; i < hexlen / 2; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            report('F', CONFINE_SPEC, EINVAL);
        program[i] = (unsigned char)(hi << 4 | lo);
    }
    struct sock_fprog prog = {.len = (unsigned short)count, .filter = (struct sock_filter *)program};
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) < 0)
        report('F', CONFINE_SECCOMP, errno);
    free(program);
}

int main(void) {
    /* Its name while it waits, whichever way it was started (spawned by a /proc/self/fd
     * path its name would be a number): PID 1 tells it from a command by it when a
     * quiesce finds one still there, on its way out (``pid1.Init._quiesce``). */
    prctl(PR_SET_NAME, "warren-stub", 0, 0, 0);
    char *spec = getenv("WARREN_CONFINE");
    if (spec != NULL)
        confine(spec); /* its channel is put at SOCK first */
    /* Closed by the command's execve: the helper's sign that it runs. */
    if (fcntl(SOCK, F_SETFD, FD_CLOEXEC) < 0)
        return 127;
    ssize_t n;
    do {
        n = write(SOCK, "C", 1);
    } while (n < 0 && errno == EINTR);
    if (n != 1)
        return 127;

    uint32_t len;
    int fds[MAX_FDS], nfds = 0;
    if (!read_head(&len, fds, &nfds))
        return 0; /* not needed after all */
    if (len == 0 || len > MAX_REQUEST)
        fail(STEP_PROTOCOL, EMSGSIZE);
    char *body = malloc((size_t)len + 1);
    if (body == NULL)
        fail(STEP_PROTOCOL, ENOMEM);
    if (read_exactly(body, len) < 0)
        fail(STEP_PROTOCOL, EPROTO);
    body[len] = '\0';

    /* Split into strings: the FIELDS, then argv and env. */
    size_t count = 0;
    for (uint32_t i = 0; i < len; i++)
        count += body[i] == '\0';
    if (body[len - 1] != '\0' || count < FIELDS + 1)
        fail(STEP_PROTOCOL, EPROTO);
    char **strings = calloc(count + 1, sizeof(char *));
    if (strings == NULL)
        fail(STEP_PROTOCOL, ENOMEM);
    size_t k = 0;
    for (char *p = body; p < body + len; p += strlen(p) + 1)
        strings[k++] = p;
    char *cwd = strings[0], *scratch = strings[2], *path = strings[3], *nulls = strings[5], *end;
    int walk = strcmp(strings[1], "1") == 0, search = strcmp(strings[4], "1") == 0;
    if (strlen(nulls) != 3 || strspn(nulls, "01") != 3)
        fail(STEP_PROTOCOL, EPROTO);
    int given = (nulls[0] == '0') + (nulls[1] == '0') + (nulls[2] == '0');
    if (given != nfds)
        fail(STEP_PROTOCOL, EPROTO);
    long ctty = strtol(strings[6], &end, 10);
    if (*end != '\0' || ctty < -1 || ctty >= nfds)
        fail(STEP_PROTOCOL, EPROTO);
    long argc = strtol(strings[7], &end, 10);
    if (*end != '\0' || argc < 1 || (size_t)argc > count - FIELDS)
        fail(STEP_PROTOCOL, EPROTO);
    char **argv = calloc((size_t)argc + 1, sizeof(char *));
    char **envp = calloc(count - FIELDS - (size_t)argc + 1, sizeof(char *));
    if (argv == NULL || envp == NULL)
        fail(STEP_PROTOCOL, ENOMEM);
    memcpy(argv, strings + FIELDS, (size_t)argc * sizeof(char *));
    memcpy(envp, strings + FIELDS + argc, (count - FIELDS - (size_t)argc) * sizeof(char *));

    if (*scratch != '\0')
        (void)mkdir(scratch, 0700); /* removed by an earlier command: made again, empty */
    enter(cwd, walk);
    if (ctty >= 0 && ioctl(fds[ctty], TIOCSCTTY, 0) < 0)
        fail(STEP_CTTY, errno);
    int stdio[3], next = 0;
    for (int i = 0; i < 3; i++) {
        if (nulls[i] == '1') {
            stdio[i] = open("/dev/null", O_RDWR | O_CLOEXEC);
            if (stdio[i] < 0)
                fail(STEP_STDIO, errno);
        } else {
            stdio[i] = fds[next++];
        }
    }
    for (int i = 0; i < 3; i++) {
        /* dup2 onto itself keeps close-on-exec: move it out of the way first */
        if (stdio[i] < 3) {
            int moved = fcntl(stdio[i], F_DUPFD_CLOEXEC, 3);
            if (moved < 0)
                fail(STEP_STDIO, errno);
            stdio[i] = moved;
        }
    }
    for (int i = 0; i < 3; i++)
        if (dup2(stdio[i], i) < 0) /* the copy is not close-on-exec; the received fd is */
            fail(STEP_STDIO, errno);
    if (search && strchr(path, '/') == NULL)
        search_and_exec(path, argv, envp);
    execve(path, argv, envp);
    fail(STEP_EXECVE, errno);
    return 127;
}
