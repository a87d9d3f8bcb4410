"""Calls that change another process: its limits (``prlimit64``), priority
(``setpriority``, ``ioprio_set``) and scheduling (``sched_set*``).

Landlock has no hook for them and the kernel lets a process change any process of the
same uid: in the degraded mode the user's supervisor, in the full mode the exec stub
waiting for the next command, or PID 1. They may act on the caller only. The filter
lets the usual form through without asking (pid 0, and ``prlimit64`` without a new
limit, a read); what comes here names a pid, and is allowed when that pid is the
calling thread or its own process, else ``EPERM``.

Why ``CONTINUE`` is safe here, unlike for a path or a socket: the verdict depends on
the call's register arguments, which no other thread can change, and on the caller's
own thread and process ids, which cannot be reused while the caller waits in this very
call. Any other pid could be: a child or another thread could exit and its number be
given to a process of warren's between the check and the kernel's lookup, so a pid that
is not the caller's is refused rather than checked ("is it a descendant?").
"""

from __future__ import annotations

import errno
from collections.abc import Callable

from .call import Call, Outcome, fd_arg_int

PRIO_PROCESS = 0  # setpriority's "which" for one process
IOPRIO_WHO_PROCESS = 1


def _own_ids(pid: int) -> set[int] | None:
    """The caller's thread and process ids as it sees them (the innermost pid namespace
    of ``NSpid``/``NStgid``: a nested one, where allowed, numbers differently)."""
    ids: set[int] = set()
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, values = line.partition(":")
                if key in ("NSpid", "NStgid") and values.split():
                    ids.add(int(values.split()[-1]))
    except (OSError, ValueError):
        return None
    return ids or None


def _only_own(call: Call, target_arg: int, which_arg: int | None = None, which: int = 0) -> Outcome:
    if which_arg is not None and fd_arg_int(call.args[which_arg]) != which:
        return -errno.EPERM  # a process group or a user: more than the caller
    target = fd_arg_int(call.args[target_arg])
    if target < 0:
        return None  # names no process: the kernel's own error
    ids = _own_ids(call.pid)
    # Read after the status: the notification still pending means the pid read was
    # the caller's (not a process given its number after it died).
    if ids is None or not call.valid():
        return -errno.EPERM
    return None if target == 0 or target in ids else -errno.EPERM


def by_pid(call: Call) -> Outcome:
    """prlimit64, sched_setaffinity, sched_setscheduler, sched_setparam, sched_setattr:
    the pid is the first argument."""
    return _only_own(call, 0)


def setpriority(call: Call) -> Outcome:
    return _only_own(call, 1, 0, PRIO_PROCESS)


def ioprio_set(call: Call) -> Outcome:
    return _only_own(call, 1, 0, IOPRIO_WHO_PROCESS)


HANDLERS: dict[str, Callable[[Call], Outcome]] = {
    "prlimit64": by_pid,
    "sched_setaffinity": by_pid,
    "sched_setscheduler": by_pid,
    "sched_setparam": by_pid,
    "sched_setattr": by_pid,
    "setpriority": setpriority,
    "ioprio_set": ioprio_set,
}
