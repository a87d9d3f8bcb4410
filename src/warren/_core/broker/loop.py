"""The broker's own thread: receive each notification, answer it or hand it on.

Owns the listener, the order of decisions for one call, and the thread layout. The
broker is a thread of PID 1 started before the filter is installed: a filter
installed without TSYNC binds only the installing thread (PID 1's main thread, which
forks everything else) and its later children, so the broker's own calls — the ones
it makes for the sandbox — are never brokered, and neither are those of the workers
it starts (``pool``). PID 1's own calls and those of its helpers (warren's code) are
answered "go on" at once, on this thread, which never waits on anything a sandbox
controls: a socket call is read and judged here and made here only when it cannot
wait (a send tried with ``MSG_DONTWAIT``), else on a worker, which answers it;
metadata calls are file operations on objects the broker opened itself (``O_PATH``),
done here.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import threading
import time
from collections.abc import Callable

from ...plan import seccomp as _seccomp
from ...plan.model import Plan
from ...plan.mounts import within
from .. import _sys, continuer, credsend, mounts
from ..mounts import DENIED_FILE
from . import links, metadata, pool, processes, renames, sockets
from . import window as _window
from .call import Call, Outcome
from .places import Places

_FILTER: dict[tuple[str, ...], _sys.SeccompProgram] = {}


def _groups(plan: Plan | None) -> tuple[str, ...]:
    groups: tuple[str, ...] = ("sockets", "metadata", "processes")
    if plan is not None and plan.renames:
        groups += ("renames",)
    if plan is not None and plan.namespaces and any(g.shared for g in plan.git):
        groups += ("links",)
    if plan is not None and not plan.namespaces and plan.net.mode != "open":
        groups += ("listeners",)
    return groups


def notify_filter(plan: Plan | None = None) -> _sys.SeccompProgram:
    """The notification filter, packed once per process: the supervisor packs it
    before cloning (``prepare``), so PID 1 only installs its copy. Renames go to the
    broker only on an image (``renames``), links only where git data is bound in."""
    groups = _groups(plan)
    if groups not in _FILTER:
        _FILTER[groups] = _sys.SeccompProgram(_seccomp.notify_program(groups))
    return _FILTER[groups]


def window_filter(plan: Plan) -> _sys.SeccompProgram:
    """The filter of commands started while the hard-link walk runs (``window``)."""
    groups = (*_groups(plan), "window")
    if groups not in _FILTER:
        _FILTER[groups] = _sys.SeccompProgram(_seccomp.notify_program(groups))
    return _FILTER[groups]


def prepare(plan: Plan) -> None:
    """In the supervisor: pack the filters PID 1 installs."""
    notify_filter(plan)
    if plan.link_walk is not None:
        window_filter(plan)


class Broker:
    def __init__(
        self,
        listener: int,
        roots: list[str],
        private: set[int],
        workers: pool.Workers | None = None,
        abstract: bool = True,
        inet: frozenset[tuple[str, int]] | None = None,
        git: links.GitData | None = None,
        loopback: bool = True,
    ) -> None:
        self.listener = listener
        machine = os.uname().machine
        self.names = {v: k for k, v in _seccomp.BROKERED[machine].items()}
        self.window: _window.Window | None = None
        self.held: list[tuple[int, int, int, int, tuple[int, ...]]] = []  # listener, nid, pid, nr, args
        # Held by the broker's thread from reading a notification to answering it (or
        # handing it to a worker): ``quiet`` waits for it.
        self.busy = threading.Lock()
        self.window_nrs = {v: k for k, v in _seccomp.window_calls(machine).items()}
        # the calls today's filter sends (a held call of another is let go as it is)
        self.own: set[str] = set()  # set in start()
        self._own_filters = -1
        # Once the window is done, the native continuer answers its calls and passes on
        # here those the broker judges (``_core.continuer``): the pipe they come on.
        self.forwarded = -1
        sealed: set[tuple[int, int]] = set()
        with contextlib.suppress(OSError):
            st = os.stat(DENIED_FILE)
            sealed.add((st.st_dev, st.st_ino))
        self.places = Places(roots, private, sealed, abstract, inet, loopback)
        self.workers = workers or pool.Workers()
        self.links = links.handlers(git or links.GitData({}))

    @classmethod
    def start(cls, plan: Plan, helpers: set[int], sender: credsend.Sender | None = None) -> Broker:
        """In PID 1 after setup (no_new_privs already set): the broker's thread, then
        the notification filter on PID 1's main thread, inherited by everything it
        forks."""
        private = set()
        # The degraded mode has no tmpfs of its own: /tmp and /dev/shm are the host's.
        for path in ("/tmp", "/dev/shm") if plan.namespaces else ():
            with contextlib.suppress(OSError):
                private.add(os.stat(path).st_dev)
        # On an image the whole root is the sandbox's own layer: writable everywhere.
        roots = ["/"] if plan.image is not None else sorted({r for _at, group in plan.groups for r in group})
        if plan.image is None and plan.host_workspace and any(within(plan.host_workspace, r) for r in roots):
            roots.append(plan.workspace)  # a writable workspace seen elsewhere (workspace_at)
        if plan.review is not None:
            roots.append(plan.workspace)  # review mode: an overlay, every change in its layer
        program = notify_filter(plan)
        box: list[Broker] = []
        ready = threading.Event()
        workers = pool.Workers()
        pool.install_interrupt()
        workers.start()  # before the filter: none on them (and their pids come before any helper's)

        def serve() -> None:
            ready.wait()
            box[0].serve(helpers)  # PID 1's live set of helpers

        thread = threading.Thread(target=serve, name="warren-broker", daemon=True)
        thread.start()
        # The window's thread installs its own filter before this thread does: its
        # filter is then PID 1's alone, not on top of this one.
        window = _window.Window(window_filter(plan)) if plan.link_walk is not None else None
        listener = program.install_listener()
        inet: frozenset[tuple[str, int]] | None = None
        if not plan.namespaces and plan.net.mode != "open":  # the host's network namespace
            inet = frozenset({("127.0.0.1", plan.net.proxy_port)} if plan.net.mode == "allow" else ())
        # network open there: anywhere but the host's own loopback (its services)
        loopback = plan.namespaces or plan.net.mode != "open"
        git = links.GitData(
            {g.path: (mounts.git_under[g.path], g.shared) for g in plan.git if g.path in mounts.git_under}
        )
        box.append(
            cls(
                listener,
                roots,
                private,
                workers,
                abstract=plan.namespaces,
                inet=inet,
                git=git,
                loopback=loopback,
            )
        )
        machine = os.uname().machine
        nrs = _seccomp.BROKERED[machine]
        box[0].own = {
            n
            for g, members in _seccomp.GROUPS.items()
            if g in _groups(plan)
            for n in members
            if _seccomp._brokered(n, nrs)
        }
        box[0].window = window
        box[0].places.sender = sender
        ready.set()
        return box[0]

    def serve(self, helpers: set[int] | frozenset[int]) -> None:
        poller = select.poll()
        poller.register(self.listener, select.POLLIN)
        if self.window is not None:
            poller.register(self.window.listener, select.POLLIN)
            poller.register(self.window.wake_r, select.POLLIN)
        tick: float | None = None
        while True:
            if self.workers.in_flight():
                # Wake each tick while workers are busy, to interrupt those whose
                # caller left (a signal, death).
                now = time.monotonic()
                if tick is None:
                    tick = now + pool.TICK
                elif now >= tick:
                    self.workers.interrupt_abandoned(self._valid)
                    tick = now + pool.TICK
                events = poller.poll(max(0.0, tick - now) * 1000)
            else:
                tick = None
                # Polled, not read blocking: a read holds ``busy`` (``quiet``), and a
                # notification polled here is gone by the read only if its caller died
                # meanwhile (the read then fails at once).
                events = poller.poll()
            for fd, _ev in events:
                if self.window is not None and fd == self.window.wake_r:
                    with contextlib.suppress(OSError):
                        os.read(fd, 64)
                    with self.busy:
                        self._release(helpers)
                    if self.window.state == _window.DONE and self.forwarded < 0:
                        # Its calls from now on: the native thread's (not read here
                        # again: a read here would wait for one the thread took).
                        forwarded = continuer.start(self.window.listener, self._go_on())
                        if forwarded is not None:
                            poller.unregister(self.window.listener)
                            poller.register(forwarded, select.POLLIN)
                            self.forwarded = forwarded
                elif fd == self.forwarded:
                    with self.busy:
                        self._forwarded(helpers)
                else:
                    with self.busy:
                        self.handle(helpers, fd)

    def quiet(self, timeout: float) -> bool:
        """Whether no call is being made for the sandbox: the broker's thread is not
        between reading a notification and answering it (waited for, at most ``timeout``
        seconds) and no worker has one. Once no process of the sandbox is left, nothing
        starts another: a notification not yet read went with its caller (the kernel
        drops it), and one read is answered before ``busy`` is let go."""
        if not self.busy.acquire(timeout=timeout):
            return False
        try:
            return not self.workers.in_flight()
        finally:
            self.busy.release()

    def _valid(self, nid: int) -> bool:
        if _sys.notif_valid(self.listener, nid):
            return True
        return self.window is not None and _sys.notif_valid(self.window.listener, nid)

    def _go_on(self) -> set[int]:
        """The window's calls answered "go on" once it is done (``_dispatch``): those
        today's filter does not send the broker too."""
        return {nr for nr in self.window_nrs if self.names.get(nr, "") not in self.own}

    def _forwarded(self, helpers: set[int] | frozenset[int]) -> None:
        """A call of the window's lineage the native continuer passed on: judged here."""
        assert self.window is not None
        try:
            record = os.read(self.forwarded, _sys.NOTIF_SIZE)
        except OSError:
            return
        if len(record) != _sys.NOTIF_SIZE:
            return
        nid, pid, nr, args = _sys.notif_parse(record)
        self._dispatch(helpers, self.window.listener, nid, pid, nr, args)

    def _release(self, helpers: set[int] | frozenset[int]) -> None:
        """The walk ended: the held calls go on (or fail, if it failed)."""
        assert self.window is not None
        if self.window.state == _window.OPEN:
            return
        held, self.held = self.held, []
        for listener, nid, pid, nr, args in held:
            self._dispatch(helpers, listener, nid, pid, nr, args)

    def handle(self, helpers: set[int] | frozenset[int] = frozenset(), listener: int = -1) -> None:
        """Answer one notification (or hand it to a worker, which answers it).
        ``helpers``: PID 1's own helpers (warren's code, not the sandbox's): their calls
        go on unchanged."""
        listener = self.listener if listener < 0 else listener
        try:
            nid, pid, nr, args = _sys.notif_recv(listener)
        except OSError:
            return  # the caller died (or was interrupted) before we read it
        self._dispatch(helpers, listener, nid, pid, nr, args)

    def _dispatch(
        self,
        helpers: set[int] | frozenset[int],
        listener: int,
        nid: int,
        pid: int,
        nr: int,
        args: tuple[int, ...],
    ) -> None:
        held_done = False
        window = self.window
        if window is not None and listener == window.listener and nr in self.window_nrs:
            # A call of the window's (``window``): a command's waits for the walk, or
            # fails if it failed; warren's own go on.
            if pid != os.getpid() and window.open:
                if self._own_filters < 0:
                    self._own_filters = _window.own_filters()
                if _window.is_command(pid, self._own_filters) and _sys.notif_valid(listener, nid):
                    if window.state == _window.OPEN:
                        self.held.append((listener, nid, pid, nr, args))
                    else:
                        self._answer(nid, -errno.EACCES, listener)  # the walk failed
                    return
            held_done = True
        name = self.names.get(nr, "")
        if held_done and name not in self.own:
            name = ""  # held only for the window: the kernel's own call from here on
        if pid in helpers or pid == os.getpid() or not name:
            self._answer(nid, None, listener)
            return
        call = Call(listener, nid, pid, args)
        if name in sockets.HANDLERS:
            self._socket(name, call)
            return
        if name in processes.HANDLERS:
            # Judged on the call's registers and the caller's own ids: nothing to pin.
            self._answer(
                nid, self._decide(name, call, lambda: processes.HANDLERS[name](call), pin=False), listener
            )
            return

        handler = metadata.HANDLERS.get(name) or renames.HANDLERS.get(name) or self.links[name]

        def act() -> Outcome:
            return handler(self.places, call)

        with call:
            outcome = self._decide(name, call, act)
        self._answer(nid, outcome, listener)

    def _socket(self, name: str, call: Call) -> None:
        """Read and judge here (nothing waits); make the call here if it cannot wait,
        else on a worker, which answers."""
        pending: sockets.Pending | None = None

        def prepare() -> Outcome:
            nonlocal pending
            got = sockets.HANDLERS[name](self.places, call)
            if isinstance(got, int):
                return got
            pending = got
            return pending.now()

        outcome = self._decide(name, call, prepare)
        if pending is None or outcome is not None:
            # Never "go on" for a socket call: the kernel would look at it again.
            self._finish(call, pending, -errno.EPERM if outcome is None else outcome)
            return
        waiting = pending  # for the closure

        def made() -> Outcome:
            return waiting.wait()

        def job() -> None:  # on a worker
            self._finish(call, waiting, self._decide(name, call, made, pin=False))

        if not self.workers.submit(call.nid, job):
            self._finish(call, pending, -errno.ENOBUFS)

    def _finish(self, call: Call, pending: sockets.Pending | None, outcome: Outcome) -> None:
        """Answer, then what follows the answer (a signal), then let go of the copies."""
        try:
            # On a worker: free from now on (nothing left waits), so the caller's next
            # call, which may come the moment it is answered, finds it free.
            self.workers.answered(call.nid)
            self._answer(call.nid, outcome, call.listener)
            if call.after is not None:
                call.after()
        finally:
            if pending is not None:
                pending.close()
            call.__exit__()

    def _decide(self, name: str, call: Call, act: Callable[[], Outcome], pin: bool = True) -> Outcome:
        """The outcome: ``act``'s for a call pinned to its process; anything else is
        refused."""
        try:
            if not pin or call.pin(writable=name == "sendmmsg"):
                return act()
            # Gone, or alive but closed to inspection (it made itself not dumpable):
            # what cannot be checked is refused.
            return -errno.EPERM
        except Exception:
            return -errno.EPERM  # anything unexpected: refused

    def _answer(self, nid: int, outcome: Outcome, listener: int = -1) -> None:
        listener = self.listener if listener < 0 else listener
        with contextlib.suppress(OSError):
            if outcome is None:
                _sys.notif_send(listener, nid, cont=True)
            elif outcome < 0:
                _sys.notif_send(listener, nid, error=-outcome)
            else:
                _sys.notif_send(listener, nid, val=outcome)
