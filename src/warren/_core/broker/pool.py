"""The broker's workers: calls that may wait, done off the broker's own thread.

A socket call done for a sandbox can block as long as the sandbox likes (a listener
with a full backlog, a TCP handshake to a silent peer, a full send buffer). The broker's
thread only receives notifications and hands such calls here; a worker makes the call
(blocking or not, as the socket says) and answers the notification itself. So PID 1 —
whose own calls pass through the same listener — and every other process of the
sandbox are never queued behind a wait.

Bounds: at most ``LIMIT`` workers (threads of PID 1, started on demand from the
broker's own thread, which carries no seccomp filter, so neither do they; all but
``KEEP`` leave after ``IDLE`` seconds without work). When all are busy and no more can
be started (the bound, or the sandbox's pids limit, which PID 1's threads count
against), the call is refused at once with ``ENOBUFS``: a clean "no resources", never a
wait. A caller that stops waiting (it got a signal, or died) makes its notification
invalid; the broker's thread checks the busy workers' notifications every ``TICK``
seconds and interrupts a worker whose caller is gone (``SIGURG`` to that thread, whose
handler does nothing, so the raw call returns ``EINTR``); the worker then closes its
copies and is free again. No fd and no thread outlive an abandoned call.
"""

from __future__ import annotations

import collections
import contextlib
import signal
import threading
from collections.abc import Callable

LIMIT = 32
KEEP = 1
IDLE = 10.0
TICK = 0.1
INTERRUPT = signal.SIGURG

Job = Callable[[], None]


def install_interrupt() -> None:
    """On PID 1's main thread (only it may set handlers): a handler that does nothing,
    without SA_RESTART, so a worker's blocking call returns EINTR when signalled."""
    signal.signal(INTERRUPT, lambda *_: None)
    signal.siginterrupt(INTERRUPT, True)


class Workers:
    def __init__(self, limit: int = LIMIT, keep: int = KEEP, idle: float = IDLE) -> None:
        self.limit, self.keep, self.idle = limit, keep, idle
        self.cond = threading.Condition()
        self.jobs: collections.deque[tuple[int, Job]] = collections.deque()
        self.threads = 0
        self.active = 0  # workers on a job; the others are free or about to be
        self.busy: dict[int, int] = {}  # notification id -> worker's thread ident

    def start(self) -> None:
        """The workers kept warm; call from a thread without the seccomp filter (PID 1's
        main thread before it installs it), so they carry none."""
        with self.cond:
            while self.threads < self.keep:
                self._spawn()

    def submit(self, nid: int, job: Job) -> bool:
        """Run ``job`` (which answers notification ``nid``) on a worker; False at the
        bound (the caller answers ENOBUFS)."""
        with self.cond:
            if self.threads - self.active <= len(self.jobs):
                if self.threads >= self.limit:
                    return False
                try:
                    self._spawn()
                except RuntimeError:  # no thread to be had (the pids limit)
                    return False
            self.jobs.append((nid, job))
            self.cond.notify()
            return True

    def in_flight(self) -> bool:
        return bool(self.busy) or bool(self.jobs)

    def interrupt_abandoned(self, valid: Callable[[int], bool]) -> None:
        """Interrupt every worker whose caller no longer waits; again on each tick
        until it is done (the signal may land just before its call blocks)."""
        with self.cond:
            busy = list(self.busy.items())
        for nid, ident in busy:
            if not valid(nid):
                with self.cond:
                    if self.busy.get(nid) != ident:
                        continue  # finished meanwhile: that thread may be on other work
                    with contextlib.suppress(ProcessLookupError, OSError):
                        signal.pthread_kill(ident, INTERRUPT)

    def answered(self, nid: int) -> None:
        """On the worker, once its call no longer waits: free from here on (what is
        left, answering and closing copies, takes no time), so the caller's next call
        finds it free rather than starting another worker; no interruption is sent
        for it any more."""
        with self.cond:
            if self.busy.pop(nid, None) is not None:
                self.active -= 1

    def _spawn(self) -> None:
        thread = threading.Thread(target=self._work, name="warren-broker-worker", daemon=True)
        thread.start()
        self.threads += 1

    def _work(self) -> None:
        ident = threading.get_ident()
        while True:
            with self.cond:
                while not self.jobs:
                    if not self.cond.wait(self.idle) and not self.jobs and self.threads > self.keep:
                        self.threads -= 1
                        return
                nid, job = self.jobs.popleft()
                self.active += 1
                self.busy[nid] = ident
            try:
                job()
            except Exception:  # a job answers its own call; nothing may end a worker
                pass
            finally:
                self.answered(nid)
