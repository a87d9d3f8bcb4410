"""The few kernel calls the layers above ``_core`` need, each a small named function
over ``_sys``, so that nothing outside ``_core`` makes a raw system call.

Probes for the planner (``plan.facts``): the Landlock ABI and whether this machine's
system-call table is known. For the supervisor's helpers: dying with the parent
(``server.netd``) and joining a sandbox's namespaces from outside (``server.follow``).
"""

from __future__ import annotations

import os
import signal

from . import _sys


def landlock_abi() -> int:
    """The Landlock ABI version, or 0 when Landlock is absent or disabled."""
    return _sys.landlock_abi()


def machine_supported() -> bool:
    """warren knows this architecture's system-call numbers (seccomp, the broker)."""
    return _sys.supported_machine()


def userns_probe() -> tuple[str, int]:
    """Can this process make a user namespace that holds rights over its own mounts?
    ("usable", 0); ("unavailable", errno) when the clone is refused (a container that
    forbids them: ENOSPC, EPERM; disabled: EINVAL); ("powerless", errno) when it is
    made but a mount in it fails (Ubuntu's AppArmor restriction leaves it without
    capabilities). Judged by the effect, in a child that only makes system calls."""
    try:
        pid = _sys.clone_process(_sys.CLONE_NEWUSER | _sys.CLONE_NEWNS)
    except OSError as e:
        return "unavailable", e.errno or 0
    if pid == 0:
        code = 0
        try:
            _sys.mount(None, "/", None, _sys.MS_REC | _sys.MS_PRIVATE)
        except OSError as e:
            code = min(e.errno or 1, 255)
        finally:
            os._exit(code)
    _pid, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return ("usable", 0) if code == 0 else ("powerless", code if code > 0 else 0)


def die_with_parent() -> None:
    """SIGKILL this process when the thread that forked it exits."""
    _sys.prctl(_sys.PR_SET_PDEATHSIG, signal.SIGKILL)


def join_namespaces(user_ns: int, mount_ns: int) -> None:
    """Enter a sandbox's user namespace, then its mount namespace (descriptors of
    /proc/PID/ns/user and /proc/PID/ns/mnt): the order the kernel requires for an
    unprivileged caller."""
    _sys.setns(user_ns, _sys.CLONE_NEWUSER)
    _sys.setns(mount_ns, _sys.CLONE_NEWNS)


def file_handle(path: str) -> bytes | None:
    """The filesystem's handle of ``path`` itself (a link is not followed): it tells a
    file from a later one given the same inode number (ext4, xfs and btrfs put the
    inode's generation in it). None where the filesystem has none (or ``path`` is gone)."""
    try:
        return _sys.name_to_handle_at(path)
    except OSError:
        return None
