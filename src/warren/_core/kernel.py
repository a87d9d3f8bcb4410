"""The few kernel calls the layers above ``_core`` need, each a small named function
over ``_sys``, so that nothing outside ``_core`` makes a raw system call.

Probes for the planner (``plan.facts``): the Landlock ABI and whether this machine's
system-call table is known. For the supervisor's helpers: dying with the parent
(``server.netd``) and joining a sandbox's namespaces from outside (``server.follow``).
"""

from __future__ import annotations

import signal

from . import _sys


def landlock_abi() -> int:
    """The Landlock ABI version, or 0 when Landlock is absent or disabled."""
    return _sys.landlock_abi()


def machine_supported() -> bool:
    """warren knows this architecture's system-call numbers (seccomp, the broker)."""
    return _sys.supported_machine()


def die_with_parent() -> None:
    """SIGKILL this process when the thread that forked it exits."""
    _sys.prctl(_sys.PR_SET_PDEATHSIG, signal.SIGKILL)


def join_namespaces(user_ns: int, mount_ns: int) -> None:
    """Enter a sandbox's user namespace, then its mount namespace (descriptors of
    /proc/PID/ns/user and /proc/PID/ns/mnt): the order the kernel requires for an
    unprivileged caller."""
    _sys.setns(user_ns, _sys.CLONE_NEWUSER)
    _sys.setns(mount_ns, _sys.CLONE_NEWNS)
