"""Pausing a sandbox: freeze every one of its processes (PID 1 and warren's helpers
too: nothing runs, memory stays), or thaw them.

By the mechanism the plan chose for this caller (``plan.limits``: ``pause``): the
sandbox's freezer cgroup (v1 ``freezer.state`` or cgroup2 ``cgroup.freeze``), else
SIGSTOP/SIGCONT to each process. Frozen tasks cannot die, not even of the parent-death
signal, until thawed: a pause by freezer leaves a small guard process that thaws the
sandbox if the supervisor dies. The supervisor keeps the state (which sandbox is
paused, its guard); this module does the work.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time

from .._core import cgroups, clone, procs, programs, spawner
from ..errors import SandboxError, WarrenError

GUARD = "thaw-guard"  # its name among the spawner's helpers
NAME = "warren-thaw"  # its process's name, as ``ps`` and the tests see it; its program's too


class Paused:
    """How one sandbox was paused: what ``resume`` undoes."""

    def __init__(self, freezer: str | None, guard: int | None) -> None:
        self.freezer = freezer
        self.guard = guard  # write end of the pipe the guard waits on


def pause(name: str, roots: list[int], groups: list[str]) -> Paused:
    """``roots``: the sandbox's processes whose trees are all of it (``Box.process_roots``),
    stopped by signals where there is no freezer."""
    freezer = cgroups.freezer_of(groups)
    with _as_sandbox_error(name, "pause"):
        if freezer is None:
            _stop_signals(roots, True)
            return Paused(None, None)
        cgroups.freeze(freezer, True)
        return Paused(freezer, _thaw_guard(freezer))


def resume(name: str, roots: list[int], paused: Paused) -> None:
    with _as_sandbox_error(name, "resume"):
        if paused.freezer is None:
            _stop_signals(roots, False)
        else:
            cgroups.freeze(paused.freezer, False)
    release(paused)


def release(paused: Paused) -> None:
    """The sandbox is thawed (or gone): its guard may exit without doing anything."""
    if paused.guard is not None:
        with contextlib.suppress(OSError):
            os.write(paused.guard, b"r")
        os.close(paused.guard)
        paused.guard = None


@contextlib.contextmanager
def _as_sandbox_error(name: str, what: str):  # type: ignore[no-untyped-def]
    try:
        yield
    except OSError as e:
        raise SandboxError.from_os(
            e,
            f"cannot {what} sandbox {name}: {e.strerror}",
            what,
            e.filename or name,
            hint="see `warren plan` (pause) for the mechanism this host offers you",
        ) from None


def program() -> str | None:
    """The native guard (``native/thaw.c``, compiled at install); None without it or with
    ``WARREN_NATIVE_THAW=0`` (the Python guard, ``_guard``)."""
    return programs.find(NAME, "WARREN_NATIVE_THAW")


def _thaw_guard(freezer: str) -> int:
    """A small process that thaws a frozen sandbox if this supervisor dies: nobody else
    would before the next supervisor's sweep. It waits on a socket whose other end only
    this process holds: its end without a word means this process is gone. A paused
    sandbox may stay paused for hours: the guard is the native program (``program``, a
    few pages, spawned from a sealed memfd in a session of its own), else the Python
    guard cloned by the spawner (``spawner.HELPERS``: a fork of the supervisor would come
    to own every page the supervisor writes meanwhile, several MB), else forked here.
    Returns this end."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        if not _spawn_native(theirs):
            clone.start_helper(GUARD, theirs, [], [])
        with contextlib.suppress(OSError):  # it died at once: paused all the same, unguarded
            ours.sendall(os.fsencode(freezer) + b"\n")
    finally:
        theirs.close()
    return ours.detach()


def _spawn_native(channel: socket.socket) -> bool:
    """The native guard with ``channel`` as its fd 3 (this process's child: the
    supervisor reaps it as any); False where there is none, or it cannot be spawned."""
    fd = programs.load(NAME, program)
    if fd is None:
        return False
    try:
        os.posix_spawn(
            f"/proc/self/fd/{fd}",
            [NAME],
            {},
            file_actions=[(os.POSIX_SPAWN_DUP2, channel.fileno(), 3)],
            setsigmask=(),
            setsigdef=(signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE, signal.SIGCHLD),
            setsid=True,
        )
    except OSError:
        return False
    return True


def _guard(channel: socket.socket) -> None:
    """The guard: the freezer's path, then one word ("r": thawed or gone, nothing to
    do) or the channel's end (the supervisor died: thaw)."""
    with contextlib.suppress(OSError), open("/proc/thread-self/comm", "w") as comm:
        comm.write(NAME)
    said = b""
    try:
        while b"\n" not in said:
            chunk = channel.recv(4096)
            if not chunk:
                return  # never told what it guards
            said += chunk
    except OSError:
        return
    freezer, _, word = said.partition(b"\n")
    if not word:
        with contextlib.suppress(OSError):
            word = channel.recv(1)
    if not word:
        with contextlib.suppress(OSError, WarrenError):
            cgroups.freeze(os.fsdecode(freezer), False)


def _guard_in_spawner(channel: socket.socket, _tasks: list[tuple[str, int]], _fds: list[int]) -> int:
    _guard(channel)
    return 0


spawner.HELPERS[GUARD] = _guard_in_spawner


STOP_WITHIN = 2.0  # seconds: every process of the sandbox stopped by then, or the pause fails


def _stop_signals(roots: list[int], stopped: bool) -> None:
    """Pause without a freezer: SIGSTOP every process of the sandbox, again until none
    has a thread left running (one forking at the moment of the first pass has a child
    the next pass stops); resume sends SIGCONT to all. A process is judged by each of
    its threads, not by its main thread's state: a leader that exited reads as a zombie
    while its other threads run, and the signal to its pid stops them all (a group
    stop)."""
    sig = signal.SIGSTOP if stopped else signal.SIGCONT
    # Signalled by pidfd, and only while still a descendant of its root: a pid read
    # from the process table may be freed and reused by a host process before the kill.
    # A stop takes effect when the process is next scheduled: on a loaded host that is
    # tens of milliseconds, so the passes go on for a while of time, not a count.
    deadline = time.monotonic() + (STOP_WITHIN if stopped else 0)
    pause = 0.001
    while True:
        running = 0
        for root in roots:
            for pid in [root, *procs.descendants(root)]:
                if stopped and not procs.running(pid):
                    continue
                running += 1
                procs.signal_member(pid, sig, root)
        if not running or time.monotonic() > deadline:
            break
        time.sleep(pause)
        pause = min(pause * 2, 0.02)
    if not running or not stopped:
        return
    _stop_signals(roots, False)  # not half paused
    raise SandboxError(
        "the sandbox's processes kept starting new ones while being stopped",
        operation="pause",
        hint="try again; a host with a freezer cgroup (root, or delegated cgroup2) pauses atomically",
    )
