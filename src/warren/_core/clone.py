"""The one way a sandbox starts: clone PID 1 straight into new namespaces.

One raw ``clone()`` with CLONE_NEWUSER|NEWNS|NEWPID|NEWIPC|NEWUTS|NEWNET|NEWCGROUP
from the single-threaded process that plans (the supervisor): the child is PID 1 of
the sandbox at once (no intermediate fork), a copy-on-write image of a process that
holds no caller's secrets beyond the request it is serving. The child keeps only its
control channel to the parent and runs ``pid1.main``; it never returns here.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Callable

from ..errors import SetupError
from ..plan.model import Plan
from . import _sys, harden

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


def start_pid1(
    plan: Plan, control: socket.socket, *, oneshot: bool, before_start: Callable[[int], None] | None = None
) -> int:
    """Clone PID 1 for ``plan``; ``control`` is the child's end of its channel to the
    caller (the caller closes its copy). Returns PID 1's pid as the caller sees it.
    ``before_start(pid)`` runs in the caller while the child waits, before it does
    anything (the launch puts it into its cgroups there: nothing it forks escapes)."""
    from . import pid1

    harden.seccomp_program(plan)  # packed here, so the clone only copies it
    gate_r, gate_w = os.pipe2(os.O_CLOEXEC)
    # A stop (SIGTERM) that comes early waits, blocked, until PID 1 has its own
    # handler: before that it would run the parent's.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        pid = _sys.clone_process(NS_FLAGS)
    except OSError as e:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        os.close(gate_r)
        os.close(gate_w)
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
            os.close(gate_w)
            if os.read(gate_r, 1) != b"1":
                os._exit(125)  # the caller gave up on us (or died)
            devnull = os.open("/dev/null", os.O_RDWR)
            for target in (0, 1, 2):
                os.dup2(devnull, target)
            close_all_but(control.fileno())
            code = pid1.main(plan, control, oneshot=oneshot)
        finally:
            os._exit(code)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    os.close(gate_r)
    try:
        if before_start is not None:
            before_start(pid)
        os.write(gate_w, b"1")
    finally:
        os.close(gate_w)
    return pid
