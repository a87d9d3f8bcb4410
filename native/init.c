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
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static pid_t keeper;

/* Reap every child that has ended; the keeper's end is the sandbox's. */
static void reap(void) {
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid < 0 && errno == EINTR) continue;
        if (pid <= 0) return;
        if (pid == keeper) _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    }
}

int main(int argc, char **argv) {
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    prctl(PR_SET_NAME, "warren-init", 0, 0, 0);
    if (argc != 2) return 125;
    char *end;
    long given = strtol(argv[1], &end, 10);
    if (*end != '\0' || given < 2) return 125;
    keeper = (pid_t)given;
    /* Every signal taken in turn, none by a handler: an init's signals from inside its
       namespace are ignored by the kernel unless handled, and SIGKILL from outside is
       the supervisor's. */
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, NULL);
    reap(); /* the keeper may have ended before the mask */
    for (;;) {
        siginfo_t info;
        int sig = sigwaitinfo(&all, &info);
        if (sig < 0) continue;
        if (sig == SIGCHLD) {
            reap();
        } else if (sig == SIGTERM || sig == SIGINT || sig == SIGHUP || sig == SIGUSR1 || sig == SIGUSR2) {
            /* from the supervisor (outside: only it may signal this process): the keeper's */
            if (info.si_pid == 0) kill(keeper, sig);
        }
    }
}
