/* warren-continuer: a thread in a sandbox's PID 1 that answers "go on" to the calls a
 * command started during the hard-link walk still sends once the walk is done.
 *
 * A command started while the walk ran carries the walk's window filter for its life
 * (a filter cannot be taken off): each of its writing opens, truncates and file
 * ioctls stops in the kernel and waits for PID 1's answer, which after the walk is
 * always "go on" (SECCOMP_USER_NOTIF_FLAG_CONTINUE). Answered by PID 1's Python broker
 * that costs about 50 microseconds a call; here, a few. Calls the broker judges (a
 * connect, a chmod, a rename: syscall numbers outside the set given) are passed to it
 * whole, one struct seccomp_notif per packet on a pipe, and it answers them as ever.
 *
 * Built at install as a shared object and loaded (ctypes) by the process every PID 1 is
 * cloned from, before any clone: PID 1 calls warren_continuer_start once its window
 * is done (src/warren/_core/continuer.py). Without it, the Python broker answers. */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#ifndef SECCOMP_IOCTL_NOTIF_SET_FLAGS
#define SECCOMP_IOCTL_NOTIF_SET_FLAGS SECCOMP_IOW(4, __u64)
#endif
#ifndef SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP
#define SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP (1UL << 0)
#endif

#define MAX_NR 1024 /* syscall numbers below this may be answered here */

struct job {
    int listener; /* the window's notification descriptor */
    int forward;  /* a pipe (packet mode) to the Python broker, for the calls it judges */
    int stop;     /* readable (or closed) when this thread is to end */
    uint64_t go_on[MAX_NR / 64];
};

/* The size of the records on the pipe, for the Python side to check. */
int warren_continuer_record_size(void) { return (int)sizeof(struct seccomp_notif); }

static void *serve(void *arg) {
    struct job job = *(struct job *)arg;
    free(arg);
    for (;;) {
        struct pollfd p[2] = {{job.listener, POLLIN, 0}, {job.stop, POLLIN, 0}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (p[1].revents)
            break;
        if (p[0].revents & (POLLHUP | POLLERR | POLLNVAL))
            break; /* no process holds the filter any more */
        if (!(p[0].revents & POLLIN))
            continue;
        struct seccomp_notif req;
        memset(&req, 0, sizeof req);
        if (ioctl(job.listener, SECCOMP_IOCTL_NOTIF_RECV, &req) < 0)
            continue; /* its caller died (or was interrupted) before we read it */
        unsigned nr = (unsigned)req.data.nr;
        if (nr < MAX_NR && (job.go_on[nr / 64] >> (nr % 64)) & 1) {
            struct seccomp_notif_resp resp;
            memset(&resp, 0, sizeof resp);
            resp.id = req.id;
            resp.flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
            ioctl(job.listener, SECCOMP_IOCTL_NOTIF_SEND, &resp); /* its caller may be gone */
            continue;
        }
        ssize_t n;
        do {
            n = write(job.forward, &req, sizeof req);
        } while (n < 0 && errno == EINTR);
        if (n != (ssize_t)sizeof req)
            break; /* the broker is gone: PID 1 is ending */
    }
    return NULL;
}

/* Start the thread; 0 when it runs, else -1 (errno set). ``go_on``: MAX_NR / 64 words,
 * bit N set for the syscall numbers answered "go on" here. Every signal is blocked in
 * the thread: PID 1's handlers run on its Python threads. */
int warren_continuer_start(int listener, int forward, int stop, const uint64_t *go_on) {
    struct job *job = malloc(sizeof *job);
    if (job == NULL)
        return -1;
    job->listener = listener;
    job->forward = forward;
    job->stop = stop;
    memcpy(job->go_on, go_on, sizeof job->go_on);
    uint64_t flags = SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP;
    ioctl(listener, SECCOMP_IOCTL_NOTIF_SET_FLAGS, flags); /* a faster wake-up where the kernel has it */
    pthread_attr_t attr;
    sigset_t all, old;
    pthread_t thread;
    int err = pthread_attr_init(&attr);
    if (err == 0) {
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 64 * 1024);
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        err = pthread_create(&thread, &attr, serve, job);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_attr_destroy(&attr);
        if (err == 0)
            pthread_setname_np(thread, "warren-continue");
    }
    if (err != 0) {
        free(job);
        errno = err;
        return -1;
    }
    return 0;
}
