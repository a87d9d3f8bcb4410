"""The one way a sandbox starts: clone PID 1 straight into new namespaces.

One raw ``clone()`` with CLONE_NEWUSER|NEWNS|NEWPID|NEWIPC|NEWUTS|NEWNET|NEWCGROUP
from the single-threaded process that plans (the supervisor): the child is PID 1 of
the sandbox at once (no intermediate fork), a copy-on-write image of a process that
holds no caller's secrets beyond the request it is serving. The child keeps only its
control channel to the parent and runs ``pid1.main``; it never returns here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket

from .. import protocol, wire
from ..errors import SetupError
from ..plan.model import Plan
from . import _sys, broker, cgroups, harden

NS_FLAGS = (
    _sys.CLONE_NEWUSER
    | _sys.CLONE_NEWNS
    | _sys.CLONE_NEWPID
    | _sys.CLONE_NEWIPC
    | _sys.CLONE_NEWUTS
    | _sys.CLONE_NEWNET
    | _sys.CLONE_NEWCGROUP
)


def close_all_but(*keep: int) -> None:
    """A cloned child inherits every descriptor of its parent (other sandboxes'
    channels among them): keep only ``keep`` and stdio."""
    low = 3
    for fd in sorted(keep):
        _sys.close_range(low, fd - 1)
        low = fd + 1
    _sys.close_range(low, 0xFFFFFFFF)


# The descriptor limit (soft) sandboxes start with when the caller raised its own (the
# supervisor does, to hold thousands of connections): they keep the limit it was
# started with, as the host's tools would have.
sandbox_nofile: int | None = None


def start_pid1(
    plan: Plan, control: socket.socket, *, oneshot: bool, cgroup_tasks: list[tuple[str, int]] | None = None
) -> int:
    """Clone PID 1 for ``plan``; ``control`` is the child's end of its channel to the
    caller (the caller closes its copy). Returns PID 1's pid as the caller sees it.
    ``cgroup_tasks`` (``cgroups.open_tasks``): PID 1 enters these cgroups before it
    does anything else, so nothing it forks escapes them; the caller closes its copies."""
    from . import pid1

    harden.seccomp_program(plan)  # packed here, so the clone only copies them
    broker.prepare(plan)
    # A stop (SIGTERM) that comes early waits, blocked, until PID 1 has its own
    # handler: before that it would run the parent's.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        pid = _sys.clone_process(NS_FLAGS)
    except OSError as e:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        raise SetupError(
            "cannot create the sandbox's namespaces",
            operation="clone",
            errno=e.errno,
            hint="unprivileged user namespaces may be disabled: check "
            "/proc/sys/user/max_user_namespaces and kernel.apparmor_restrict_unprivileged_userns",
        ) from None
    if pid == 0:
        code = 125
        try:
            if not _enter_cgroups(cgroup_tasks or [], control):
                os._exit(125)
            devnull = os.open("/dev/null", os.O_RDWR)
            for target in (0, 1, 2):
                os.dup2(devnull, target)
            close_all_but(control.fileno())
            if sandbox_nofile is not None:
                import resource

                _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
                resource.setrlimit(resource.RLIMIT_NOFILE, (min(sandbox_nofile, hard), hard))
            code = pid1.main(plan, control, oneshot=oneshot)
        finally:
            os._exit(code)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    return pid


def _enter_cgroups(tasks: list[tuple[str, int]], control: socket.socket) -> bool:
    """In the new PID 1, still single-threaded: join its cgroups, or tell the
    supervisor why not (it then ends the sandbox and passes the error on)."""
    try:
        cgroups.enter_self(tasks)
    except OSError as e:
        error = SetupError(
            f"cannot move the sandbox into its cgroup: {e.strerror}",
            operation="cgroup",
            path=e.filename,
            errno=e.errno,
            hint="run `warren plan` to see how each limit is enforced",
        )
        with contextlib.suppress(OSError):
            wire.send(control, protocol.Failed(error=protocol.error_message(error).error))
        return False
    return True
