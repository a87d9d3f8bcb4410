/* warren-init: a sandbox's PID 1 once its setup is done.

   PID 1 sets the sandbox up in Python (mounts, network, cgroups, its hardening), forks
   the keeper (the Python that serves the sandbox: its channel to the supervisor, the
   syscall broker, the helpers) and then execs this program, from a sealed memfd, with
   the keeper's pid as its one argument. What an init must do is left here: it reaps
   every process that comes to it (the keeper, what outlives its parent), passes the
   signals that ask the sandbox to stop on to the keeper, and ends with the keeper (its
   exit status), which ends the pid namespace as PID 1's exit always did. It holds no
   descriptor and writes nothing: a few pages of memory where a Python PID 1 held
   about 4 MB of its own.

   Not dumpable (an exec makes a process dumpable again): nothing in the sandbox may
   read or trace it. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* The keeper's exit status when it leaves an idle sandbox (pid1.LEAVING): the sandbox
   goes on, and a keeper joined from outside later (stage 2) says it is the next. */
#define LEAVING 86

static pid_t keeper;      /* the keeper serving now; 0 while the sandbox is idle */
static int joined = -1;   /* a pidfd of it when it was joined from outside (not our child) */
static int leaving;       /* it said it leaves (SIGUSR1 from it) */
static pid_t next_keeper; /* a joined keeper that said so before the last had gone */

static void gone(int status) {
    if (leaving || status == LEAVING) {
        keeper = next_keeper;
        next_keeper = 0;
        leaving = 0;
        if (keeper != 0) {
            joined = (int)syscall(SYS_pidfd_open, keeper, 0);
            if (joined < 0) _exit(0); /* it is gone already: the sandbox lost its keeper */
        }
        return;
    }
    _exit(status);
}

/* Reap every child that has ended; the keeper's end is the sandbox's, unless it left. */
static void reap(void) {
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid < 0 && errno == EINTR) continue;
        if (pid <= 0) return;
        if (pid == keeper && joined < 0)
            gone(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    }
}

static void adopt(pid_t pid) {
    if (keeper != 0) {
        next_keeper = pid;
        return;
    }
    keeper = pid;
    joined = (int)syscall(SYS_pidfd_open, pid, 0);
    if (joined < 0) _exit(0);
}

int main(int argc, char **argv) {
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    prctl(PR_SET_NAME, "warren-init", 0, 0, 0);
    if (argc != 2) return 125;
    char *end;
    long given = strtol(argv[1], &end, 10);
    if (*end != '\0' || given < 2) return 125;
    keeper = (pid_t)given;
    /* Every signal taken in turn through a signalfd, none by a handler: an init's
       signals from inside its namespace are ignored by the kernel unless handled or
       blocked, and SIGKILL from outside is the supervisor's. */
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, NULL);
    int sfd = signalfd(-1, &all, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0) return 125;
    reap(); /* the keeper may have ended before the mask */
    for (;;) {
        struct pollfd fds[2] = {{.fd = sfd, .events = POLLIN}, {.fd = joined, .events = POLLIN}};
        if (poll(fds, joined >= 0 ? 2 : 1, -1) < 0) continue;
        /* Every signal first: a joined keeper says it leaves (SIGUSR1) just before it
           ends, and both may be seen at once. */
        struct signalfd_siginfo info;
        while (read(sfd, &info, sizeof info) == sizeof info) {
            int sig = (int)info.ssi_signo;
            pid_t from = (pid_t)info.ssi_pid;
            int inside = from > 0 && info.ssi_code == SI_USER;
            if (sig == SIGCHLD) {
                reap();
            } else if (inside) {
                /* from a process of the sandbox: only a keeper's word counts */
                if (sig == SIGUSR2) adopt(from); /* a joined keeper serves now */
                else if (sig == SIGUSR1 && from == keeper) leaving = 1; /* it leaves an idle sandbox */
            } else if (from == 0 && (sig == SIGTERM || sig == SIGINT || sig == SIGHUP || sig == SIGUSR1 || sig == SIGUSR2)) {
                /* from the supervisor (outside): the keeper's; with none (it left an
                   idle sandbox), the sandbox ends now */
                if (keeper == 0) _exit(0);
                kill(keeper, sig);
            }
        }
        if (joined >= 0) {
            struct pollfd ended = {.fd = joined, .events = POLLIN};
            if (poll(&ended, 1, 0) == 1) {
                close(joined);
                joined = -1;
                gone(0);
            }
        }
    }
}
