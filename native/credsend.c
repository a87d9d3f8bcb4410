/* warren-credsend: the one process of a sandbox that may name another process as the
 * sender of a unix message (SCM_CREDENTIALS).
 *
 * Every send of a sandboxed command is made by PID 1's broker (``_core.broker.sockets``),
 * so a receiver that asks for its sender's credentials (SO_PASSCRED) would be told PID
 * 1's pid. Chromium's zygote handshake is one such receiver: it checks the pid, and
 * fails. The kernel takes an explicit SCM_CREDENTIALS naming another pid only from a
 * sender holding CAP_SYS_ADMIN over the user namespace that owns its pid namespace.
 * PID 1 must not keep that capability (it made every mount of the sandbox; none is
 * locked against it), so this program holds it instead, and can do nothing else:
 *
 * PID 1 spawns it (posix_spawn) from a sealed memfd before dropping its own
 * capabilities, with CAP_SYS_ADMIN (and CAP_SETPCAP, to empty its bounding set) raised
 * as ambient capabilities for that spawn. It then keeps CAP_SYS_ADMIN alone, sets no_new_privs, makes
 * itself not dumpable (PID 1 cannot trace it) and installs a seccomp filter that
 * allows recvmsg, sendmsg, close and exit only: every other call kills it. The
 * capability then serves SCM_CREDENTIALS alone, and the broker asks for the pid of
 * the command whose send it makes, never another (``docs/security.md``).
 *
 * fd 3: a SOCK_SEQPACKET socket to PID 1's broker; fd 4: a memfd shared with it (the
 * message's address, control and data are written there, not copied through fd 3).
 *   <- struct request (below), with SCM_RIGHTS: the socket to send on, then the fds
 *      the message passes, in the order its SCM_RIGHTS name them
 *   -> int64 result: bytes sent, or -errno
 * The memfd: the address at NAME_AT, the control at CTL_AT (room for one more
 * SCM_CREDENTIALS message before it), the data at DATA_AT.
 * An end of file on fd 3 (PID 1 gone or done with it): exit 0. A setup step that
 * fails: exit 1, and the broker makes its sends itself, as without this program.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#define SOCK 3
#define SHARED 4
#define NAME_ROOM 128
#define CREDS_ROOM 32 /* CMSG_SPACE(sizeof(struct ucred)) */
#define CTL_MAX (256u << 10)
#define DATA_MAX (1u << 20)
#define NAME_AT 0
#define CTL_AT (NAME_ROOM + CREDS_ROOM)
#define DATA_AT (CTL_AT + CTL_MAX)
#define SHARED_SIZE (DATA_AT + DATA_MAX)
#define MAX_FDS 253 /* SCM_MAX_FD */

static uid_t uid; /* read before the filter: getuid() is not allowed after */
static gid_t gid;

struct request {
    uint32_t flags;
    uint32_t namelen;
    uint32_t ctllen;
    uint32_t datalen;
    int32_t pid; /* > 0: add SCM_CREDENTIALS naming it (the control has none) */
};

#ifndef PR_CAP_AMBIENT
#define PR_CAP_AMBIENT 47
#define PR_CAP_AMBIENT_CLEAR_ALL 4
#endif

#if defined(__x86_64__)
#define ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define ARCH AUDIT_ARCH_AARCH64
#else
#error "warren-credsend: unsupported architecture"
#endif

static int keep_sys_admin_only(void) {
    for (int cap = 0; cap <= 63; cap++) {
        if (cap == CAP_SYS_ADMIN)
            continue;
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno == EINVAL)
            break; /* beyond the kernel's last capability */
    }
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof data);
    data[CAP_TO_INDEX(CAP_SYS_ADMIN)].effective = CAP_TO_MASK(CAP_SYS_ADMIN);
    data[CAP_TO_INDEX(CAP_SYS_ADMIN)].permitted = CAP_TO_MASK(CAP_SYS_ADMIN);
    if (syscall(SYS_capset, &hdr, data) != 0)
        return -1;
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0)
        return -1;
    memset(data, 0, sizeof data);
    if (syscall(SYS_capget, &hdr, data) != 0)
        return -1;
    /* exactly CAP_SYS_ADMIN, effective: without it the explicit pid is refused */
    for (int i = 0; i < 2; i++) {
        uint32_t want = i == CAP_TO_INDEX(CAP_SYS_ADMIN) ? CAP_TO_MASK(CAP_SYS_ADMIN) : 0;
        if (data[i].effective != want || data[i].permitted != want || data[i].inheritable)
            return -1;
    }
    return 0;
}

#define ALLOW(nr) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1), BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)

static int lock_down(void) {
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ARCH, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        ALLOW(__NR_recvmsg),
        ALLOW(__NR_sendmsg),
        ALLOW(__NR_close),
        ALLOW(__NR_exit),
        ALLOW(__NR_exit_group),
        ALLOW(__NR_rt_sigreturn),
        ALLOW(__NR_restart_syscall),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
    };
    struct sock_fprog prog = {sizeof filter / sizeof filter[0], filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        return -1;
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0);
}

static void reply(int64_t result) {
    struct iovec iov = {&result, sizeof result};
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    while (sendmsg(SOCK, &msg, MSG_NOSIGNAL) < 0 && errno == EINTR)
        ;
}

/* The message of one request, sent; -errno. */
static int64_t send_one(unsigned char *shared, const struct request *req, int *fds, int nfds) {
    if (nfds < 1 || req->namelen > NAME_ROOM || req->ctllen > CTL_MAX || req->datalen > DATA_MAX)
        return -EINVAL;
    unsigned char *ctl = shared + CTL_AT;
    size_t ctllen = req->ctllen;
    int next = 1; /* fds[0] is the socket; the message's own follow */
    /* The control's SCM_RIGHTS name the broker's fds: put the ones received here in
     * their places, in order (walked as the kernel walks it: it stops at a header that
     * does not fit). */
    for (size_t off = 0; off + sizeof(struct cmsghdr) <= ctllen;) {
        struct cmsghdr h;
        memcpy(&h, ctl + off, sizeof h);
        if (h.cmsg_len < sizeof h || h.cmsg_len > ctllen - off)
            break;
        if (h.cmsg_level == SOL_SOCKET && h.cmsg_type == SCM_RIGHTS) {
            for (size_t at = off + CMSG_LEN(0); at + sizeof(int) <= off + h.cmsg_len; at += sizeof(int)) {
                if (next >= nfds)
                    return -EBADF;
                memcpy(ctl + at, &fds[next++], sizeof(int));
            }
        }
        off += CMSG_ALIGN(h.cmsg_len);
    }
    if (req->pid > 0) {
        /* SCM_CREDENTIALS naming the command, before its own control messages */
        struct cmsghdr h = {CMSG_LEN(sizeof(struct ucred)), SOL_SOCKET, SCM_CREDENTIALS};
        struct ucred creds = {req->pid, uid, gid};
        unsigned char *at = ctl - CREDS_ROOM;
        memset(at, 0, CREDS_ROOM);
        memcpy(at, &h, sizeof h);
        memcpy(CMSG_DATA((struct cmsghdr *)at), &creds, sizeof creds);
        ctl = at;
        ctllen += CREDS_ROOM;
    }
    struct iovec iov = {shared + DATA_AT, req->datalen};
    struct msghdr msg = {0};
    msg.msg_name = req->namelen ? shared + NAME_AT : NULL;
    msg.msg_namelen = req->namelen;
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctllen ? ctl : NULL;
    msg.msg_controllen = ctllen;
    /* never SIGPIPE here: the broker gives the command its own (``_sigpipe``) */
    ssize_t n = sendmsg(fds[0], &msg, (int)req->flags | MSG_NOSIGNAL);
    return n < 0 ? -(int64_t)errno : (int64_t)n;
}

int main(int argc, char **argv) {
    /* its parent: PID 1 of the sandbox, or a keeper joined later (its pid, argv[1]) */
    long parent = argc > 1 ? strtol(argv[1], NULL, 10) : 1;
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0 || getppid() != (pid_t)parent)
        return 1; /* spawned by that process; gone already: nothing to serve */
    /* PID 1 runs with signals blocked at times (and SIGPIPE ignored, which an execve
     * keeps): a stop's SIGTERM must end it at once, whatever it inherited */
    sigset_t none;
    sigemptyset(&none);
    if (sigprocmask(SIG_SETMASK, &none, NULL) != 0 || signal(SIGPIPE, SIG_IGN) == SIG_ERR)
        return 1;
    struct stat st;
    if (fstat(SHARED, &st) != 0 || st.st_size < (off_t)SHARED_SIZE)
        return 1;
    unsigned char *shared = mmap(NULL, SHARED_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, SHARED, 0);
    if (shared == MAP_FAILED)
        return 1;
    close(SHARED);
    if (syscall(SYS_close_range, 5, ~0u, 0) != 0)
        return 1;
    uid = getuid();
    gid = getgid();
    prctl(PR_SET_NAME, "warren-credsend", 0, 0, 0); /* spawned as /proc/self/fd/N: its name */
    if (keep_sys_admin_only() != 0 || prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 || lock_down() != 0)
        return 1;
    static union {
        char buf[CMSG_SPACE(sizeof(int) * (MAX_FDS + 1))];
        struct cmsghdr align;
    } control;
    for (;;) {
        struct request req;
        struct iovec iov = {&req, sizeof req};
        struct msghdr msg = {0};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.buf;
        msg.msg_controllen = sizeof control.buf;
        ssize_t n = recvmsg(SOCK, &msg, MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            _exit(0);
        int fds[MAX_FDS + 1];
        int nfds = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                continue;
            size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < count && nfds <= MAX_FDS; i++)
                memcpy(&fds[nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        }
        int64_t result = (size_t)n != sizeof req || msg.msg_flags & MSG_CTRUNC ? -ENOBUFS
                                                                             : send_one(shared, &req, fds, nfds);
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
        reply(result);
    }
}
