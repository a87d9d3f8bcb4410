"""The one launch path: prepare the host for a plan, then clone its PID 1.

Used for every sandbox, one-shot or long-lived, so whatever is added here (the
directories a preset needs, the ancestor guard, cgroups next) is added once. Order
matters: warren creates what it must create *before* snapshotting the ancestors'
metadata, so its own mkdir is never reported as the sandbox's doing.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from .._core import clone, guard
from ..errors import SetupError
from ..plan.model import Plan


@dataclass
class Launched:
    pid: int  # PID 1, as the host sees it
    pidfd: int
    control: socket.socket  # the supervisor's end of PID 1's control channel
    guard: list[guard.DirState]


def launch(plan: Plan, *, oneshot: bool) -> Launched:
    for path in plan.create_dirs:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            raise SetupError(
                f"cannot create tool cache {path}",
                operation="mkdir",
                path=path,
                errno=e.errno,
                hint="create it yourself or drop the preset",
            ) from None
    states = guard.snapshot(plan.guarded)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        pid = clone.start_pid1(plan, theirs, oneshot=oneshot)
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return Launched(pid, os.pidfd_open(pid), ours, states)


def restore(launched: Launched) -> list[str]:
    """After the sandbox ended: put the guarded directories' metadata back."""
    return guard.restore(launched.guard)
