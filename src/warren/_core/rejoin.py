"""A keeper for a sandbox whose last one left (stage 2 of the sandbox without Python
while idle; a spike): made in the spawner, it joins the sandbox from outside.

A long-lived sandbox's keeper (``pid1.Init`` under the native init) leaves once the
sandbox is idle (``protocol.Leaving``). The next request has the supervisor ask the
spawner for a new one: a child of the spawner (the *joiner*, not dumpable) enters the
sandbox's cgroups, then all seven of its namespaces at once through PID 1's pidfd, and
forks the keeper, which is in the sandbox's pid namespace from its first instruction.
The joiner ends at once (the keeper's parent becomes the init); the keeper tells the
init it serves now (SIGUSR2), sets itself up as PID 1 did after its mounts (the
Landlock ruleset, the seccomp program, the credentials sender, its hardening, the
broker) and serves its channel (``pid1.keeper_main``).

Owns: the join, in the spawner.
"""

from __future__ import annotations

import os
import socket
import struct

from ..plan.model import Plan
from . import _sys, cgroups
from .clone import NS_FLAGS  # the namespaces PID 1 was cloned into: all of them joined
from .harden import PR_SET_DUMPABLE

keepers: set[int] = set()  # joined keepers, the spawner's children


def reap_keepers(*_args: object) -> None:
    """In the spawner (its SIGCHLD handler): reap the keepers that have ended."""
    for pid in list(keepers):
        try:
            done, _status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            keepers.discard(pid)


def join(
    plan: Plan,
    control: socket.socket,
    tasks: list[tuple[str, int]],
    pidfd: int,
    ruleset: int = -1,
    git: dict[str, int] | None = None,
) -> int:
    """In the spawner: the new keeper's pid as the host sees it (``OSError`` if none).
    ``ruleset`` and ``git``: the last keeper's (``pid1.keeper_main``)."""
    r, w = os.pipe2(os.O_CLOEXEC)
    joiner = os.fork()
    if joiner == 0:
        os.close(r)
        code = 125
        try:
            code = _joiner(plan, control, tasks, pidfd, w, ruleset, git or {})
        finally:
            os._exit(code)
    os.close(w)
    try:
        got = b""
        while len(got) < 8:
            chunk = os.read(r, 8 - len(got))
            if not chunk:
                break
            got += chunk
    finally:
        os.close(r)
        os.waitpid(joiner, 0)
    if len(got) != 8:
        raise OSError(5, "the joiner ended before it forked a keeper")
    (value,) = struct.unpack("!q", got)
    if value < 0:
        raise OSError(-value, f"join: {os.strerror(-value)}")
    keepers.add(int(value))
    reap_keepers()
    return int(value)


def _joiner(
    plan: Plan,
    control: socket.socket,
    tasks: list[tuple[str, int]],
    pidfd: int,
    w: int,
    ruleset: int,
    git: dict[str, int],
) -> int:
    try:
        _sys.prctl(PR_SET_DUMPABLE, 0)
        cgroups.enter_self(tasks)
        _sys.setns(pidfd, NS_FLAGS)
        # CLONE_PARENT: the spawner's child (it reaps it, ``reap_keepers``), not one
        # the host's init inherits when the joiner ends.
        keeper = _sys.clone_process(_sys.CLONE_PARENT)
    except OSError as e:
        os.write(w, struct.pack("!q", -(e.errno or 5)))
        return 125
    if keeper == 0:
        from . import pid1

        code = 125
        try:
            os.close(w)
            code = pid1.keeper_main(plan, control, ruleset, git)
        finally:
            os._exit(code)
    os.write(w, struct.pack("!q", keeper))
    return 0
