"""The walk's window: while the supervisor walks the workspace for files hard-linked
from outside the writable roots (``server.linkwalk``, beside the launch), no command
may change a file or give one another name. The supervisor starts no command before
the walk has ended (``server.box.Box._to_pid1``); this window is the second line, for
whatever PID 1 forks meanwhile.

A filter can only be added, never taken off, and a process's filters may have one
listener only: so the window has a second lineage in PID 1. A thread of PID 1 (this
module's), started before PID 1's main thread installs its filter, installs the
window's: the broker's calls (``plan.seccomp.notify_program``) and the ``window``
group — writing opens, truncate, chown, renames, links, the metadata calls and the
filesystem ioctls — with a listener of its own, served by the broker beside PID 1's.
Every helper PID 1 forks while the window is open is forked by that thread
(``fork``), so its command inherits the window's filter; once the walk is done, PID 1
forks from its main thread again, and later commands have exactly today's filter.

The broker holds each such call of a command (a process with a filter of its own on
top of PID 1's: warren's helpers and a command's process before it hardens itself
have none, and cannot gain one while stopped in a call) until the supervisor says the
walk is done (``protocol.Walked``). Then no inode in the workspace has a name outside
the writable roots and the sandbox cannot make one (links across mounts are EXDEV,
Landlock refuses the rest): the held calls go on, judged as any other. If the walk
failed (a file that had to be masked, or could not be copied), they fail with
``EACCES``, as does every such call of the sandbox's commands from then on (PID 1
keeps forking with the window's filter).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import threading
from collections.abc import Callable

from .. import _sys

OPEN, DONE, FAILED = "open", "done", "failed"


class Window:
    def __init__(self, program: _sys.SeccompProgram) -> None:
        self.state = OPEN
        self.wake_r, self.wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.listener = -1
        self._jobs: queue.SimpleQueue[tuple[Callable[[], int], queue.SimpleQueue[int | BaseException]]] = (
            queue.SimpleQueue()
        )
        ready: queue.SimpleQueue[int | BaseException] = queue.SimpleQueue()

        def run() -> None:
            try:
                ready.put(program.install_listener())
            except BaseException as e:  # told to the main thread
                ready.put(e)
                return
            while True:
                job, answer = self._jobs.get()
                try:
                    answer.put(job())
                except BaseException as e:
                    answer.put(e)

        threading.Thread(target=run, name="warren-window", daemon=True).start()
        got = ready.get()
        if isinstance(got, BaseException):
            raise got
        self.listener = got

    @property
    def open(self) -> bool:
        return self.state != DONE

    def fork(self, child: Callable[[], None]) -> int:
        """``os.fork`` on the window's thread, with the caller's signal mask; ``child``
        runs in the child (and never returns)."""
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())

        def job() -> int:
            before = signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            try:
                pid = os.fork()
                if pid == 0:
                    child()
                    os._exit(1)  # never reached: the child exits
                return pid
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, before)

        answer: queue.SimpleQueue[int | BaseException] = queue.SimpleQueue()
        self._jobs.put((job, answer))
        got = answer.get()
        if isinstance(got, BaseException):
            raise got
        return got

    def finish(self, ok: bool) -> None:
        """From PID 1's main thread: the walk is done (``ok``) or failed."""
        if self.state != OPEN:
            return
        self.state = DONE if ok else FAILED
        with contextlib.suppress(OSError):
            os.write(self.wake_w, b"x")


def is_command(pid: int, own_filters: int) -> bool:
    """A process with a filter of its own on top of PID 1's (a command hardened): asked
    while it is stopped in the call, so the count cannot change under us."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Seccomp_filters:"):
                    return int(line.split()[1]) > own_filters
    except (OSError, ValueError, IndexError):
        pass
    return True  # unknown: held (never let through unseen)


def own_filters() -> int:
    """PID 1's main thread's filters (``/proc/self`` is the thread group's leader): what
    its helpers have."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Seccomp_filters:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0
