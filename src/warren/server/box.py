"""One sandbox as the supervisor holds it: its PID 1's control channel, the relay of a
one-shot run, pause, stop and the teardown once PID 1 has exited.

A ``Box`` owns the descriptors of its sandbox (the control channel, PID 1's pidfd, the
namespaces, the exec pipes, its network helpers) and closes every one of them in
``ended``. It knows nothing of clients, the registry or other sandboxes: what the
supervisor must act on (the sandbox is ready, the run's command said something, the
sandbox is gone) it hears through ``Waiter``, so this module never imports the
supervisor. Networking (netd, pasta, expose) is ``boxnet``'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import select
import selectors
import signal
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from .. import durations, protocol, wire
from .._core import cgroups, execstub, idletime, procs, shim
from ..errors import PolicyError, PortNotForwarded, SandboxError, SetupError, WarrenError, from_record
from ..plan import Plan
from ..plan.limits import V2
from . import boxnet, follow, gitkeeper, joined, launch, linkwalk, pause, repowatch, spawns, trail, usage
from .trail import Started, Trail

if TYPE_CHECKING:
    from ..images.store import Lease
    from ..net.intercept import Interception
    from ..net.pasta import Pasta
    from .ahead import Booted, Request
    from .clients import Client
    from .restack import Stack
    from .review import Base
    from .rootpoints import RootPoint

STOP_KILL_AFTER = 3.0  # after SIGTERM, PID 1's grace (2 s) and a margin
DEGRADED_KILL_AFTER = 0.5
# After an exec of a review sandbox ends, its changes are frozen ahead this much later:
# its helper, which answers the client after reporting the end, is gone by then (PID 1
# must be alone: ``checkpoints.quiesce``), and the next command of a burst comes before.
FREEZE_AFTER = 0.05
LEAVE_NOW_WAIT = 0.5  # seconds a pause waits for an idle sandbox's keeper to leave (``shed_keeper``)
_R, _W = selectors.EVENT_READ, selectors.EVENT_WRITE
DIRECT_MAX = 64 << 10  # a larger request (a long argv or environment) goes through PID 1
# Requests held while a sandbox's hard-link walk runs (``Box._to_pid1``), each with copies
# of its descriptors in this process: more at once are refused (``Box.can_hold``).
HELD_MAX = 128
_FROM_PID1 = (
    protocol.Ready,
    protocol.Failed,
    protocol.NetProxy,
    protocol.NetReady,
    protocol.NetUp,
    protocol.Spare,
    protocol.Layers,
    protocol.Quiet,  # late (``await_pid1`` gave up waiting): nothing to do
    protocol.Emptied,
    protocol.Leaving,
    protocol.Staying,  # late (``shed_keeper`` gave up waiting): nothing to do
)


def _ended(pidfd: int, wait: float = 0.0) -> bool:
    """Whether the process of ``pidfd`` has ended (its pidfd readable), waiting up to
    ``wait`` seconds for it."""
    waiting = select.poll()
    waiting.register(pidfd, select.POLLIN)
    return bool(waiting.poll(int(wait * 1000)))


def _ready(stub: socket.socket) -> bool:
    """The spare's command process is the exec stub, and waits for a command: its first
    byte (``execstub.READY``), looked at and left for the helper."""
    try:
        return stub.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == execstub.READY
    except OSError:
        return False


def _give(spare: socket.socket, data: bytes, fds: list[int]) -> bool:
    """The handoff (``data``, framed; at most ``DIRECT_MAX``: far below a socket's
    buffer, so taken whole or refused) to the spare helper; False when it is gone
    (nothing sent)."""
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))]
    try:
        sent = spare.sendmsg([data], ancillary if fds else [])
    except OSError:
        return False
    if sent and sent != len(data):
        raise SandboxError(
            "the sandbox's helper took part of a request",
            operation="handoff",
            hint="this is a bug in warren; please report it. Ask again: the next helper serves it",
        )
    return sent == len(data)


def _stub_stdio(attached: list[bool], given: list[int]) -> tuple[list[int], list[int]] | None:
    """The command's three stdio descriptors for the exec stub (``shim.stub_request``):
    the client's, in order, where it attached one, else ``/dev/null`` opened here (the
    host's device, which the sandbox's ``/dev/null`` is bound from). With the ones
    opened here, for the caller to close once sent; None when ``/dev/null`` cannot be
    opened (the helper then gives the command its stdio)."""
    client = iter(given)
    stdio: list[int] = []
    opened: list[int] = []
    try:
        for i in range(3):
            if i < len(attached) and attached[i]:
                stdio.append(next(client))
            else:
                fd = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
                opened.append(fd)
                stdio.append(fd)
    except (OSError, StopIteration):
        for fd in opened:
            os.close(fd)
        return None
    return stdio, opened


def _send_all(sock: socket.socket, data: bytes, fds: list[int]) -> None:
    """``data`` with ``fds`` on a stream socket whose buffer is empty: at once, or
    (never seen: the buffer holds far more) within a second. Never by making it
    non-blocking: the helper holds the same open socket, blocking. poll(), not select():
    the supervisor may hold descriptors past select()'s limit."""
    sent = socket.send_fds(sock, [data], fds, socket.MSG_DONTWAIT)
    deadline = time.monotonic() + 1.0
    poller = select.poll()
    poller.register(sock, select.POLLOUT)
    while sent < len(data) and time.monotonic() < deadline:
        poller.poll(100)
        with contextlib.suppress(BlockingIOError):
            sent += sock.send(data[sent:], socket.MSG_DONTWAIT)


class Waiter(Protocol):
    """Whoever waits on a sandbox (the supervisor)."""

    def box_ready(self, box: Box) -> None:
        """PID 1 finished setting up (a run's command has been handed over)."""

    def run_said(self, box: Box, msg: protocol.Message, fds: list[int]) -> None:
        """A run's command started (``Started``) or could not (``Error``)."""

    def run_over(self, box: Box, repairs: list[str]) -> None:
        """A one-shot's command ended and nothing of the sandbox is left but PID 1 on its
        way out (``Box.run_over``): its run is answered now; ``repairs`` as below."""

    def box_ended(self, box: Box, status: int, repairs: list[str]) -> None:
        """PID 1 exited and everything of the sandbox is closed; ``repairs``: what the
        ancestor guard put back."""


@dataclass
class Run:
    """The one command of a one-shot sandbox, and the client waiting for it."""

    client: Client
    command: protocol.Command
    stdio: list[int]
    events: int | None
    relay: socket.socket | None = None
    relay_inbox: wire.Inbox | None = None
    relay_outbox: wire.Outbox | None = None
    exited: protocol.Exited | None = None
    answered: bool = False
    ask: bool = False  # --network ask: its client asks on a terminal (``RunRequest.net_ask``)

    def close_fds(self) -> None:
        """Close the client's stdio and event pipe that this process still holds (once:
        the numbers may name other files after)."""
        for fd in [*self.stdio, *([self.events] if self.events is not None else [])]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.stdio, self.events = [], None


@dataclass
class Box:
    name: str
    id: str
    plan: Plan
    launched: launch.Launched
    oneshot: bool
    sel: selectors.BaseSelector
    waiter: Waiter
    keeper: gitkeeper.GitKeeper
    git: gitkeeper.Lease | None = None  # its repositories (server.gitkeeper)
    home: str | None = None  # its state directory (long-lived sandboxes): the net log is there
    search_path: str | None = None  # the caller's PATH: where helper programs (pasta) are found
    intercept: Interception | None = None  # secrets' values and CA, for the proxy (server.boxsecrets)
    created: float = field(default_factory=time.time)
    ready: bool = False
    creator: Client | None = None
    run: Run | None = None
    failure: WarrenError | None = None
    netd: boxnet.Netd | None = None
    # A long-lived sandbox's proxy listener, the supervisor's copy: its network helper
    # ends when idle, and a connection waiting here starts the next (``on_proxy``).
    proxy: socket.socket | None = None
    proxy_waits: bool = False  # registered: no helper runs
    exposed: dict[int, str] = field(default_factory=dict)  # its port -> the host address forwarding to it
    pasta: Pasta | None = None
    stoppers: list[Client] = field(default_factory=list)
    remove: bool = False
    kill_at: float | None = None  # asked to stop: when it is killed (inf: once it was)
    stop_asked: float | None = None  # when it was first asked to stop (``terminate``)
    killing: bool = False  # the degraded mode's SIGKILL was asked of PID 1 (``signal``)
    roots: dict[str, follow.Identity] = field(default_factory=dict)  # writable roots as launched
    ns: tuple[int, int] | None = None  # fds of the sandbox's user and mount namespaces
    layer: int | None = None  # on an image: its own layer (the overlay upper dir), for snapshots
    stack: Stack | None = None  # ... and its layers as detached mounts (``restack``)
    review_lower: int | None = None  # review mode: the host's workspace, detached (``checkpoints``)
    review_layer: int | None = None  # ... and its layer's directory, detached
    helper: joined.Helper | None = None  # in its namespaces, for checkpoints (``helper_ready``)
    # review mode: the merged base a checkpoint found due, and the one being built
    # (``server.bases``)
    base_due: Base | None = None
    base_pending: Base | None = None
    base_asked: tuple[float, int] = (0.0, 0)  # ... when its build was asked, of which helper
    # on an image: the checkpoints of its root (``server.rootpoints``), oldest first
    root_points: list[RootPoint] = field(default_factory=list)
    root_next: int = 1
    # PID 1 was asked to let its spare go (``restack.freeze``): one it gave meanwhile is
    # let go at once, or its helper would wait on our end and PID 1 for it
    quiescing: bool = False
    busy: str = ""  # ... what it found running when it was not alone: pids and names
    image_lease: Lease | None = None  # the store's image held while it runs (envroot.lease)
    paused: pause.Paused | None = None  # how it was paused, while it is
    # the hard-link walk made after launch (``server.linkwalk``), until it ends
    link_walk: linkwalk.Job | None = None
    walked: bool | None = None  # its outcome, told PID 1 once it is ready
    # Handoffs that start something in the sandbox (a command, a file request), held
    # while that walk runs, with copies of their descriptors: sent after ``Walked``.
    held: list[tuple[protocol.Message, list[int]]] = field(default_factory=list)
    # Booted ahead and taken: its walk (none at its boot: its window stays open until
    # then, so this walk may run beside its command) runs, or ran (``walk_before_use``).
    rewalked: bool = False
    # The walk running is expected to find nothing (``gitkeeper.link_walk_begins``): what
    # is handed to PID 1 meanwhile goes at once, its commands' writes waiting in the
    # window (``started_in_walk`` once one did).
    optimistic: bool = False
    started_in_walk: bool = False
    walk_token: tuple[repowatch.Token, int] | None = None
    last_active: float = field(default_factory=time.time)  # a request reached it, or an exec ended
    # A review sandbox's exec ended: its changes are frozen ahead from then (monotonic)
    # while nobody waits (``checkpoints.freeze_ahead``, ``Supervisor._timers``).
    freeze_due: float | None = None
    # ... none is tried while a process of it was found running (a server started in
    # the background): each try would let its spare go and wait for PID 1 in vain. A
    # checkpoint stacked again (PID 1 found alone) lets them be tried again.
    freeze_held: bool = False
    active: set[int] = field(default_factory=set)  # our ends of running execs' "active" pipes
    execs: dict[int, Started] = field(default_factory=dict)  # ... their records in the trail
    trail: Trail | None = None  # its audit trail (long-lived sandboxes: ``home``)
    answered: set[int] = field(default_factory=set)  # ... those of them that are "synced" sockets
    stopped_why: str = ""  # the supervisor stopped it on its own (idle timeout)
    request: Request | None = None  # a run's request, to boot the next one ahead (server.ahead)
    booted: Booted | None = None  # booted ahead and not yet checked ready or adopted (server.ahead)
    spare: socket.socket | None = None  # a helper PID 1 forked ahead, for the next request (``hand``)
    # ... and a copy of its end of the channel to its command's process (the exec stub):
    # an exec may go to that process directly (``hand``, ``Launcher.launched``)
    spare_stub: socket.socket | None = None
    spare_pid: int = 0  # ... its pid as the sandbox numbers it (``protocol.Spare``)
    spare_seen: int = 0  # the last spare PID 1 gave us, handed, dropped or held (``Quiesce.seen``)
    generation: int = 0  # ``Refresh`` and ``Walked`` sent to PID 1 (``protocol.Spare.generation``)
    emptied: bool = False  # a one-shot's PID 1 said nothing of the sandbox is left (``protocol.Emptied``)
    over: bool = False  # ... and its run was answered then (``run_over``), before PID 1's exit
    reading: bool = field(default=False, init=False)  # PID 1's word being read (``on_control``)
    # Messages sent on the control channel to its keeper (``protocol.Leaving.received``),
    # and whether that keeper left the idle sandbox (the next message brings a new one).
    sent: int = field(default=0, init=False)
    keeper_gone: bool = field(default=False, init=False)
    kept_ruleset: int | None = field(default=None, init=False)  # ... its Landlock ruleset, for the next
    kept_git: list[tuple[str, int]] = field(default_factory=list, init=False)  # ... and its git directories
    keeper_pid: int = field(default=0, init=False)  # a joined keeper's (not PID 1's descendant)
    keeper_pidfd: int = field(default=-1, init=False)  # ... pinning it (``joined_keeper``)
    keepers_cpu: float = field(default=0.0, init=False)  # the CPU time of joined keepers that left

    def __post_init__(self) -> None:
        self.inbox = wire.Inbox(self.launched.control)
        self.outbox = wire.Outbox(self.launched.control)
        self.roots = follow.identities(self.plan)
        self.sel.register(self.launched.control, _R, ("control", self))
        if self.git is not None:
            self.git.running = self.active  # no sync drains its watches while one runs

    @property
    def unused(self) -> bool:
        """Booted ahead (``server.ahead``) and given to no run or creator."""
        return self.booted is not None and self.run is None and self.creator is None

    @property
    def pid(self) -> int:
        return self.launched.pid

    # --- PID 1's control channel ---------------------------------------------------------

    def on_control(self, mask: int) -> None:
        if mask & _W:
            with contextlib.suppress(OSError):
                if self.outbox.flush():
                    self.sel.modify(self.launched.control, _R, ("control", self))
        if not mask & _R:
            return
        self.reading = True
        try:
            self._read_control()
        finally:
            self.reading = False

    def _read_control(self) -> None:
        while True:
            try:
                got = self.inbox.read(_FROM_PID1)
            except (wire.ConnectionClosed, OSError):
                # PID 1 is ending; its exit (SIGCHLD) finishes the job.
                with contextlib.suppress(KeyError, ValueError):
                    self.sel.unregister(self.launched.control)
                return
            except WarrenError as e:
                self.fail(e)
                return
            if got is None:
                return
            msg, _n, fds = got
            try:
                self._control_message(msg, fds)
            except WarrenError as e:
                self.fail(e)

    def _control_message(self, msg: protocol.Message, fds: list[int]) -> None:
        if isinstance(msg, protocol.NetProxy):
            if not fds:
                raise SetupError("PID 1 sent no proxy socket", operation="network")
            listener = socket.socket(fileno=fds.pop(0))
            if not self.oneshot:
                self.proxy = listener.dup()
            self.start_netd(listener)
        elif isinstance(msg, protocol.NetReady):
            try:
                self.pasta = boxnet.start_pasta(self.pid, self.search_path)
            except SetupError:
                self.send(protocol.NetGo(go=False))
                raise
            self.sel.register(self.pasta.pidfd or -1, _R, ("pasta", self))
            self.send(protocol.NetGo(go=True))
        elif isinstance(msg, protocol.NetUp):
            if not msg.ok:
                raise self.pasta.failure() if self.pasta else SetupError("the network did not come up")
        elif isinstance(msg, protocol.Ready):
            if len(fds) >= 2 and self.ns is None:
                self.ns = (fds.pop(0), fds.pop(0))
            if fds and self.plan.image is not None and self.layer is None:
                self.layer = fds.pop(0)  # the sandbox's own layer: server.snapshots
            self._on_ready()
        elif isinstance(msg, protocol.Layers):
            review = self.plan.review is not None and self.review_lower is None
            if not self.ready and len(fds) == 2 and review:
                # the host's workspace and the review layer, detached: server.checkpoints
                self.review_lower, self.review_layer = fds.pop(0), fds.pop(0)
            elif not self.ready and fds and self.plan.image is not None:
                from .restack import Stack

                if self.stack is None:
                    self.stack = Stack(tmpfs=fds[0], lowers=fds[1:])
                else:
                    self.stack.lowers.extend(fds)
                fds = []
        elif isinstance(msg, protocol.Spare):
            self.spare_seen = msg.pid
            # One forked before PID 1 read our last Refresh or Walked is let go as it
            # reads it: a request handed to it would race that (and it holds the old
            # rules). Its end closes here; the next spare comes with today's.
            # Nor is one advertised once the sandbox was asked to stop (``terminate``).
            if fds and not self.quiescing and msg.generation == self.generation and self.stop_asked is None:
                self.drop_spare()
                self.spare = socket.socket(fileno=fds.pop(0))
                self.spare_pid = msg.pid
                self.spare.setblocking(False)
                # Its end closes when it goes unused (PID 1 let it go): then ours of
                # its command's process too, or that process would wait on it.
                self.sel.register(self.spare, _R, ("spare", self))
                if fds:  # left blocking: the helper holds the same open socket
                    self.spare_stub = socket.socket(fileno=fds.pop(0))
        elif isinstance(msg, protocol.Failed):
            raise from_record(msg.error.to_fields())
        elif isinstance(msg, protocol.Emptied):
            self.emptied = True
            self.run_over()
        elif (
            isinstance(msg, protocol.Leaving)
            and msg.received == self.sent
            and not self.held
            and self.spare is None
            and not self.keeper_gone
        ):
            # The keeper leaves the idle sandbox: nothing sent since it last read,
            # nothing held back. Else it stays (what we sent since reaches it). A joined
            # one's CPU time, its helpers' and commands' included, is counted now: the
            # spawner reaps it, out of the sandbox's trees (``usage.measure``).
            if keeper := self.joined_keeper():
                self.keepers_cpu += usage.cpu_of(keeper)
            self._forget_keeper()
            self.outbox.put(protocol.LeaveOk())
            with contextlib.suppress(OSError):
                self.outbox.flush()
            self.keeper_gone = True
            self._let_helper_go()
            self.kept_ruleset = fds.pop(0) if msg.ruleset and fds else None
            self.kept_git = list(zip(msg.git, fds, strict=False))
            del fds[: len(self.kept_git)]
        for fd in fds:
            os.close(fd)

    def hand(
        self,
        handoff: protocol.Handoff,
        conn: int,
        given: list[int],
        tail: list[int],
        stub: bytes | None = None,
    ) -> None:
        """Hand a request to the sandbox: to the helper PID 1 forked ahead and gave us
        (``protocol.Spare``: a wake-up less than through PID 1), else through PID 1. The
        helper takes one request. Gone (PID 1 let it go: idle, a new ruleset, a stop),
        its end refuses the write, and PID 1 serves the request; a request in flight
        when it was let go is still served (``pid1.Init._await_handoff``).

        Descriptors: the client's connection, the request's own (``given``), then
        ``tail`` (named by ``handoff.extra``). ``stub``: the exec as the exec stub reads
        it (``execstub.request``), with ``given`` as the command's stdio and /dev/null
        for each stream the client attached none (``_stub_stdio``): when the spare's
        command process is a stub and ready, the helper gets the request without the
        stdio and that process gets the command, both from here."""
        held = self.link_walk is not None and not self.optimistic
        if self.spare is None and not held:
            self._heard_now()
        spare, stub_sock = self.spare, self.spare_stub
        data = b""
        stdio: tuple[list[int], list[int]] | None = None
        if not held and spare is not None:
            if (
                stub is not None
                and stub_sock is not None
                and isinstance(handoff.request, protocol.ExecRequest)
                and len(stub) <= DIRECT_MAX
                and _ready(stub_sock)
            ):
                stdio = _stub_stdio(handoff.request.command.stdio, given)
            if stdio is not None:
                handoff.launched = True
                counters = self.launched.counters
                handoff.before = {n: cgroups.read_counter(fd, n.partition(":")[2]) for n, fd in counters}
            data = wire.frame(handoff)  # once: an exec's path
        try:
            if held or spare is None or len(data) > DIRECT_MAX:
                # Through PID 1 once the walk is done; a long argv or environment: the spare stays
                handoff.launched, handoff.before = False, {}
                self._to_pid1(handoff, [conn, *given, *tail])
                return
            if self.link_walk is not None:
                # An optimistic walk: its spare was forked with the walk's window (PID 1 has
                # heard of no walk's end), so is what it starts.
                self.started_in_walk = True
            self._forget_spare()
            try:
                if _give(spare, data, [conn, *tail] if handoff.launched else [conn, *given, *tail]):
                    if handoff.launched:
                        assert stub is not None and stub_sock is not None and stdio is not None
                        # Into an empty buffer far larger than it: taken whole. Refused only
                        # if the process died (killed from inside): the helper then finds
                        # its end closed and reports the command killed.
                        with contextlib.suppress(OSError):
                            _send_all(stub_sock, stub, stdio[0])
                    return
            finally:
                spare.close()
                if stub_sock is not None:
                    stub_sock.close()
            handoff.launched, handoff.before = False, {}
            self.send(handoff, [conn, *given, *tail])
        finally:
            for fd in stdio[1] if stdio is not None else []:
                os.close(fd)

    def _heard_now(self) -> None:
        """Read what PID 1 said that the loop has not read yet, before a request goes
        through PID 1: the spare it gave may be there. The loop takes a client's request
        and PID 1's word in turn; with the request taken first, PID 1 forked a helper for
        it on its path while its spare waited (19 of 160 execs made as soon as a spare
        showed, beside eight busy loops). Not while that word is being read already (a
        run handed as its sandbox says it is ready)."""
        if not self.reading:
            self.on_control(_R)

    def _forget_spare(self) -> None:
        if self.spare is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(self.spare)
        self.spare = self.spare_stub = None
        self.spare_pid = 0

    def drop_spare(self) -> int:
        """Forget the helper PID 1 gave us (it exits when its end closes); its pid, 0
        when there was none (``protocol.Quiesce.untaken``: never handed a request)."""
        spare, stub, pid = self.spare, self.spare_stub, self.spare_pid
        self._forget_spare()
        for sock in (spare, stub):
            if sock is not None:
                sock.close()
        return pid if spare is not None else 0

    def helper_ready(self) -> joined.Helper:
        """The process in the sandbox's namespaces that stacks its layers again
        (``server.checkpoints``, ``server.restack``): the one forked ahead (a review
        sandbox's, ``Supervisor._timers``), or one forked now, kept for the next."""
        if self.helper is None or self.helper.closed:
            if self.ns is None:
                raise OSError(errno.EINVAL, "no namespaces to join", self.name)
            self.helper = joined.Helper.start(self.ns)
        return self.helper

    @property
    def wants_helper(self) -> bool:
        """A review sandbox, running and not idle (a keeper serves it), with no helper
        ready: one is forked ahead."""
        return (
            self.review_layer is not None
            and self.ns is not None
            and self.ready
            and not self.keeper_gone
            and (self.helper is None or self.helper.closed)
        )

    def _let_helper_go(self) -> None:
        """The sandbox is idle (its keeper left): its helper in the namespaces goes too, a
        fork of the supervisor that comes to own about 6 MB of its pages; the next
        checkpoint or snapshot forks another. Kept while a merged base it started is
        being built (its process's end is how that build is known to have failed)."""
        if self.helper is not None and self.base_pending is None and self.base_due is None:
            self.helper.close()
            self.helper = None

    def await_pid1(
        self, kind: type[protocol.Message], timeout: float, until: Callable[[], bool] | None = None
    ) -> protocol.Message | None:
        """Wait (``timeout`` at most) for PID 1's next message of ``kind``, handling the
        others meanwhile as they come; None when it does not come (or once ``until``
        holds after one was handled)."""
        deadline = time.monotonic() + timeout
        sock = self.launched.control
        while True:
            with contextlib.suppress(OSError):
                self.outbox.flush()
            try:
                got = self.inbox.read((*_FROM_PID1, kind))
            except (wire.ConnectionClosed, OSError, WarrenError):
                return None
            if got is not None:
                msg, _n, fds = got
                if isinstance(msg, kind):
                    for fd in fds:
                        os.close(fd)
                    return msg
                try:
                    self._control_message(msg, fds)
                except WarrenError as e:
                    self.fail(e)
                    return None
                if until is not None and until():
                    return None
                continue
            left = deadline - time.monotonic()
            if left <= 0 or not wire.readable(sock.fileno(), left):
                return None

    def send(self, msg: protocol.Message, fds: list[int] | None = None) -> None:
        """Queue a message for PID 1; never waits (but for a keeper to be made first, when
        the last one left the idle sandbox: ``rejoin``)."""
        if self.keeper_gone:
            self.rejoin()
        self.sent += 1
        if isinstance(msg, (protocol.Refresh, protocol.Walked)):
            self.generation += 1
            # Let go of the spare we hold too: PID 1 may let it go as it reads this.
            self.drop_spare()
        self.outbox.put(msg, fds=fds or [])
        try:
            if not self.outbox.flush():
                self.sel.modify(self.launched.control, _R | _W, ("control", self))
        except OSError:
            pass  # PID 1 is gone; its exit is handled by the reaper

    def rejoin(self) -> None:
        """A new keeper for the sandbox, joined from outside by the spawner
        (``_core.rejoin``), on a new control channel; the old one's end is let go."""
        from .._core import clone

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        joins = self.plan.limits.joins if self.plan.limits is not None else []
        try:
            tasks = cgroups.open_tasks([*self.launched.cgroups, *joins])
        except OSError as e:
            ours.close()
            theirs.close()
            raise cgroups.cannot_enter(e) from None
        try:
            # The last keeper left with its walk's window done (``pid1.Init._may_leave``):
            # the next has none, as a PID 1 whose walk is done forks under today's filter.
            plan = dataclasses.replace(self.plan, link_walk=None)
            self._forget_keeper()
            self.keeper_pid = clone.join_keeper(
                plan, theirs, tasks, self.launched.pidfd, self.kept_ruleset, self.kept_git
            )
            with contextlib.suppress(OSError):
                self.keeper_pidfd = os.pidfd_open(self.keeper_pid)
        except OSError as e:
            ours.close()
            raise SandboxError(
                f"sandbox {self.name}: cannot start the process that serves it again: {e.strerror or e}",
                operation="rejoin",
                hint="the sandbox may have ended meanwhile: see `warren ls`; if it still runs, "
                "remove it with `warren rm` and create it again",
            ) from None
        finally:
            theirs.close()
            if self.kept_ruleset is not None:
                os.close(self.kept_ruleset)
                self.kept_ruleset = None
            for _path, fd in self.kept_git:
                os.close(fd)
            self.kept_git = []
            for _path, fd in tasks:
                os.close(fd)
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(self.launched.control)
        self.launched.control.close()
        self.launched.control = ours
        self.inbox, self.outbox = wire.Inbox(ours), wire.Outbox(ours)
        self.sel.register(ours, _R, ("control", self))
        self.generation = self.sent = 0
        self.keeper_gone = False

    def joined_keeper(self) -> int:
        """The pid of the keeper serving the sandbox when it was joined from outside (the
        spawner's child, not PID 1's descendant: ``usage``, ``pause`` count its tree
        too) and still runs; 0 otherwise. Pinned by a pidfd taken at the join: a pid
        that ended is never named (the spawner reaps it at once, and the pid is free)."""
        if self.keeper_pidfd < 0 or _ended(self.keeper_pidfd):
            return 0
        return self.keeper_pid

    def process_roots(self) -> list[int]:
        """The sandbox's processes whose trees are all of its processes, as the host sees
        them: PID 1, and a keeper joined from outside (``joined_keeper``)."""
        keeper = self.joined_keeper()
        return [self.pid, keeper] if keeper else [self.pid]

    def _forget_keeper(self) -> None:
        if self.keeper_pidfd >= 0:
            os.close(self.keeper_pidfd)
        self.keeper_pid, self.keeper_pidfd = 0, -1

    def on_pasta(self) -> None:
        """pasta exited: before the sandbox was ready, that is a failed setup."""
        self.sel.unregister(boxnet.pasta_fd(self.pasta))
        if not self.ready:
            self.fail(self.pasta.failure() if self.pasta else SetupError("pasta ended"))

    def _on_ready(self) -> None:
        if self.pasta is not None and self.pasta.pidfd is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(self.pasta.pidfd)
        self.ready = True
        if self.walked is not None:
            self.send(protocol.Walked(ok=self.walked))
        if self.run is not None and self.booted is None:
            self.start_run()
        self.waiter.box_ready(self)

    def start_run(self) -> None:
        """Hand the run's command to the sandbox (once it is ready): to its spare (one
        booted ahead has one, given to us), else to PID 1; and follow it."""
        run = self.run
        assert run is not None and self.ready
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        request = protocol.ExecRequest(sandbox=self.id, command=run.command)
        counters = self.launched.counters
        handoff = protocol.Handoff(request=request, extra=[name for name, _fd in counters])
        stub = shim.stub_request(self.plan, run.command) if self.spare is not None else None
        self.hand(handoff, theirs.fileno(), list(run.stdio), [fd for _name, fd in counters], stub)
        theirs.close()
        for fd in run.stdio:
            os.close(fd)
        run.stdio = []
        run.relay, run.relay_inbox, run.relay_outbox = ours, wire.Inbox(ours), wire.Outbox(ours)
        self.sel.register(ours, _R, ("relay", self))

    # --- a one-shot run's relay ------------------------------------------------------------

    def on_relay(self, mask: int) -> None:
        """What the run's exec helper says: ``Exited`` is kept until the sandbox is gone,
        the rest goes to the waiter at once."""
        run = self.run
        assert run is not None and run.relay is not None and run.relay_inbox is not None
        while True:
            try:
                got = run.relay_inbox.read((protocol.Started, protocol.Exited, protocol.Error))
            except (wire.ConnectionClosed, OSError, WarrenError):
                with contextlib.suppress(KeyError, ValueError):
                    self.sel.unregister(run.relay)
                return
            if got is None:
                return
            msg, _n, fds = got
            if isinstance(msg, protocol.Exited):
                run.exited = msg  # answered once the sandbox is gone (``run_over``)
                self.run_over()
            else:
                self.waiter.run_said(self, msg, fds)
            for fd in fds:
                os.close(fd)

    def relay_signal(self, msg: protocol.Message) -> None:
        """A signal from the run's client, for its command."""
        if self.run is not None and self.run.relay_outbox is not None:
            self.run.relay_outbox.put(msg)
            with contextlib.suppress(OSError):
                self.run.relay_outbox.flush()

    # --- requests handed to PID 1 ------------------------------------------------------------

    def helper_cgroups(self) -> list[str]:
        """Of the sandbox's cgroups, those its network helper is charged to: memory (and
        cpu), which grow with what the sandbox asks of it. Not pids, whose budget is the
        sandbox's processes (the helper's threads are capped by the helper itself), nor
        the freezer (a paused sandbox's exposed ports still refuse or answer). A cgroup2
        group is one for every controller: the helper joins it."""
        planned = self.plan.limits.cgroups if self.plan.limits is not None else ()
        if len(planned) != len(self.launched.cgroups):
            return []
        charged = ("memory", "cpu", V2)
        return [d for g, d in zip(planned, self.launched.cgroups, strict=True) if g.controller in charged]

    def follow_roots(self) -> None:
        """A writable root replaced on the host since the last request is bound anew in
        the sandbox, and PID 1 rebuilds its rules (``follow``); so it does when a file
        its read rules name one by one was replaced or made (``hostwatch``)."""
        changed = follow.replaced(self.roots)
        if changed:
            if self.plan.namespaces:  # else nothing is bound: new rules are all it takes
                follow.rebind(self.ns, self.name, changed)
            self.roots.update(changed)
        watch = self.launched.host_watch
        if changed or (watch is not None and watch.changed()):
            # Its spare holds the old rules: let go of with it (``send``); PID 1 forks
            # the next with the new.
            self.send(protocol.Refresh())

    def recorded(self, msg: protocol.Message, peer: dict[str, int], end: int = -1, at: float = 0.0) -> None:
        """``msg``, handed to the sandbox at ``at`` (monotonic), in its trail (a
        long-lived sandbox has one); an exec's record kept with ``end``, ours of its
        "active" channel (``exec_started``), for its end to be written with."""
        if self.trail is None and self.home is not None and not self.oneshot:
            self.trail = Trail(self.home)
        record = None if self.trail is None else self.trail.handed(msg, peer, at)
        if record is not None and end >= 0:
            self.execs[end] = record

    def exec_started(self) -> tuple[str, int, list[int], int]:
        """The end the exec's helper holds until its command ended, its name, the
        repositories' watches, and ours (the trail's record is kept with it once the
        request is handed: ``recorded``). The end of the exec is an
        event here (the idle timeout counts from it). Where the sandbox
        has repositories it is ``synced``, a socket: the helper shuts its side when the
        command ended and tells its client only after the answer, which comes once the
        repositories are in step — host git sees the command's commit and index as soon
        as the exec returns. ``watches``: the repositories' watches (``dirwatch``), given
        to the helper with it: when none has anything queued once the command ended, the
        command changed nothing the sync carries, and the helper answers at once."""
        watches: list[int] = []
        if self.git is not None and self.git.shadows:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            ours.setblocking(False)
            mine, given, name = ours.detach(), theirs.detach(), "synced"
            self.answered.add(mine)
            watches = self.keeper.watches(self.git)
        else:
            mine, given = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
            name = "active"
        self.active.add(mine)
        # A socket's report (the sync the answer waits for) wakes the loop at once. A
        # pipe's does not: it is registered for writing, which a pipe's read end never
        # is, so only its end wakes the loop (the helper's exit; EPOLLHUP is always
        # reported). Its report, written before the client hears of the end, is read
        # then, or before anything later of this sandbox's is recorded
        # (``take_reports``): waking the supervisor on it preempted the helper on its
        # core, between the command's end and the client's answer.
        self.sel.register(mine, _R if name == "synced" else _W, ("active", (self, mine)))
        return name, given, watches, mine

    def take_reports(self, ended: int = -1) -> None:
        """The ends of execs whose helpers have reported and not exited yet: recorded
        before anything later of this sandbox's (a request handed, the trail read, its
        end), so the trail holds them in order; with ``ended``, an exec whose helper
        exited. Only execs the trail has recorded: one handed a moment ago is recorded
        after this, and may have ended already."""
        reports: list[tuple[int, bytes]] = []
        for fd in [fd for fd in self.active if fd == ended or (fd in self.execs and fd not in self.answered)]:
            try:
                reports.append((fd, os.read(fd, 4096)))
            except BlockingIOError:
                continue  # running still
            except OSError:
                reports.append((fd, b""))
        if len(reports) > 1:  # in the order they ended (each report is parsed again to record it)
            reports.sort(key=lambda taken: trail.reported_at(taken[1]))
        for fd, report in reports:
            self.exec_ended(fd, report)

    def exec_ended(self, fd: int, report: bytes | None = None) -> None:
        """An exec ended: its helper reported (``report``, read already, or to read now)
        or exited."""
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(fd)
        self.active.discard(fd)
        record = self.execs.pop(fd, None)
        if record is not None and self.trail is not None:
            if report is None:
                report = b""
                with contextlib.suppress(OSError):
                    report = os.read(fd, 4096)  # non-blocking: the helper's report, or its end
            stopping = "the sandbox was stopped while it ran" if self.kill_at is not None else ""
            self.trail.ended(record, report, stopping)
        self.last_active = time.time()
        if self.review_layer is not None and self.home is not None and not self.freeze_held:
            self.freeze_due = time.monotonic() + FREEZE_AFTER
        try:
            self.keeper.sync(self.git)
        finally:
            if fd in self.answered:
                self.answered.discard(fd)
                with contextlib.suppress(OSError):
                    os.write(fd, b"s")  # the helper tells its client once this comes
            os.close(fd)

    # --- network -----------------------------------------------------------------------------

    def start_netd(self, proxy_listener: socket.socket | None) -> None:
        """The sandbox's network helper (its connector into the sandbox comes with the
        first exposed port: ``expose``). A long-lived sandbox's ends once idle for
        ``WARREN_SPARE_IDLE`` (``on_netd``): about 3 MB of its own while it runs."""
        self.netd = boxnet.start_netd(
            self.plan,
            self.launched.pidfd,
            name=self.name if not self.oneshot else f"run-{self.id}",
            log_path=None if self.home is None else os.path.join(self.home, boxnet.NETLOG_FILE),
            events=self.run.events if self.run is not None else None,
            proxy_listener=proxy_listener,
            intercept=self.intercept,
            cgroup_dirs=self.helper_cgroups(),
            attended=not self.oneshot or (self.run is not None and self.run.ask),
            pid1=self.pid,
            ask_name=self.ask_name(),
            leave_after=None if self.oneshot else idletime.spare_idle(),
        )
        if not self.oneshot:
            self.sel.register(self.netd.pidfd, _R, ("netd", self))

    def on_netd(self) -> None:
        """The network helper ended (idle, or failed): the next connection to the proxy
        starts another (``on_proxy``), as does the next request for it (``_netd``).
        What it held ends with it: the ports it forwarded."""
        netd, self.netd = self.netd, None
        if netd is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(netd.pidfd)
        boxnet.stop_netd(netd)
        self.exposed.clear()
        if self.proxy is not None and not self.proxy_waits:
            self.sel.register(self.proxy, _R, ("proxy", self))
            self.proxy_waits = True

    def on_proxy(self) -> None:
        """A connection waits for the proxy and no network helper runs: start one."""
        self._netd()

    def _netd(self) -> boxnet.Netd:
        """The running network helper, started if none runs."""
        if self.netd is None:
            if self.proxy_waits:
                assert self.proxy is not None
                with contextlib.suppress(KeyError, ValueError):
                    self.sel.unregister(self.proxy)
                self.proxy_waits = False
            self.start_netd(self.proxy.dup() if self.proxy is not None else None)
        assert self.netd is not None
        return self.netd

    def _ask_netd(
        self,
        msg: protocol.ExposeRequest | protocol.UnexposeRequest | protocol.NetPolicyRequest,
        connector: socket.socket | None = None,
    ) -> protocol.Message:
        """One request to the network helper. One that ended idle as the request came
        (it looks for none waiting, then ends: the request unread) is started again and
        asked again."""
        netd = self._netd()
        try:
            return boxnet.expose(netd, self.name, msg, connector)
        except SandboxError:
            # (an exiting process closes its descriptors before its pidfd says it ended)
            if not _ended(netd.pidfd, wait=1.0):
                raise
        self.on_netd()
        return boxnet.expose(self._netd(), self.name, msg, connector)

    def ask_name(self) -> str | None:
        """A one-shot run whose ``--network ask`` connections are asked on its client's
        terminal: the name ``warren net`` reaches it by (None: nothing is asked there)."""
        if not self.oneshot or self.run is None or not self.run.ask or self.plan.net.ask_timeout is None:
            return None
        return f"run-{self.id}"

    def expose(self, msg: protocol.ExposeRequest) -> protocol.Message:
        """Forward a host port to ``msg.port`` inside. The network helper holds a
        connector (a helper of the keeper's, connecting inside) while it holds a port:
        given with the first, let go with the last (``unexpose``), so that a sandbox
        with no port forwarded can shed its keeper when idle."""
        boxnet.check_ports(msg)
        self._netd()  # (one that ended took its ports with it: ``on_netd``)
        ours: socket.socket | None = None
        if not self.exposed and not self.oneshot:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            with theirs:
                self.send(protocol.Handoff(request=protocol.ConnectorRequest()), [theirs.fileno()])
        try:
            reply = self._ask_netd(msg, ours)
        finally:
            if ours is not None:
                ours.close()
        if isinstance(reply, protocol.Exposed):
            self.exposed[msg.port] = reply.address
        return reply

    def net_policy(self, msg: protocol.NetPolicyRequest) -> protocol.Message:
        """Show or change the running sandbox's network policy (``warren net``): only a
        sandbox whose proxy runs has one to change."""
        if self.plan.net.mode != "allow" or (self.netd is None and self.proxy is None):
            raise PolicyError(
                f"sandbox {self.name} has network {self.plan.net.mode!r}: "
                "there is no proxy whose allowlist could change",
                operation="net",
                path=self.name,
                hint=f"recreate it with --network allow (or ask) and the hosts it needs: "
                f"warren rm -f {self.name} && warren create {self.name} --network allow --allow-host HOST",
            )
        return self._ask_netd(msg)

    def unexpose(self, port: int) -> protocol.Message:
        if port not in self.exposed:
            raise PortNotForwarded(
                f"port {port} of sandbox {self.name} is not forwarded",
                operation="unexpose",
                path=self.name,
                hint=f"`warren port {self.name}` lists its forwarded ports",
            )
        reply = self._ask_netd(protocol.UnexposeRequest(sandbox=self.name, port=port))
        if isinstance(reply, protocol.Ok):
            del self.exposed[port]
        return reply

    def exposes(self) -> protocol.ExposedList:
        return protocol.ExposedList(
            items=[protocol.ExposedPort(port=p, address=a) for p, a in sorted(self.exposed.items())]
        )

    def idle_expired(self) -> bool:
        """Nobody used the sandbox for its idle timeout (an exec still running is use;
        background processes are not): if so, why it is to stop is noted."""
        limit = self.plan.limits.limits.idle_timeout if self.plan.limits else None
        if not limit or not self.ready or self.kill_at is not None or self.active:
            return False
        if time.time() - self.last_active < limit:
            return False
        self.stopped_why = f"stopped after {durations.show(limit)} without a request (idle timeout)"
        return True

    # --- pause, stop ---------------------------------------------------------------------------

    def set_paused(self, paused: bool, shed_from: str | None = None) -> None:
        """Freeze every process of the sandbox, or thaw them (``pause``). Given the state
        directory (``shed_from``: a pause asked for, which may last), an idle long-lived
        sandbox's keeper leaves first (``shed_keeper``); not for a snapshot's moment."""
        if paused and self.paused is None:
            if shed_from is not None:
                self.shed_keeper(shed_from)
            self.paused = pause.pause(self.name, self.process_roots(), self.launched.cgroups)
        elif not paused and self.paused is not None:
            pause.resume(self.name, self.process_roots(), self.paused)
            self.paused = None

    def shed_keeper(self, root: str) -> None:
        """Before a pause: the keeper of an idle long-lived sandbox leaves (asked with
        ``LeaveNow``, agreed as any ``Leaving``) rather than stay frozen, with the spare
        it forked, for as long as the sandbox stays paused; the first request after the
        resume joins a new one. Not asked where it must stay (an exec running, a
        background process on record, a forwarded port, a request held); where it
        answers that it stays (a command left a process running), or says nothing
        within ``LEAVE_NOW_WAIT``, the pause goes on with it."""
        self.take_reports()  # execs answered just now: their helpers reported, not yet gone
        if (
            self.oneshot
            or self.keeper_gone
            or not self.plan.namespaces
            or not self.ready
            or self.active
            or self.held
            or self.exposed
            or spawns.running(root, self.name)
        ):
            return
        keeper = os.dup(self.keeper_pidfd) if self.joined_keeper() else -1

        def settled() -> bool:
            if self.spare is not None:
                self.drop_spare()  # one it gave before it read ``LeaveNow``: let go too
            return self.keeper_gone

        try:
            self.drop_spare()
            self.send(protocol.LeaveNow())
            self.await_pid1(protocol.Staying, LEAVE_NOW_WAIT, until=settled)
            if not self.keeper_gone:
                return
            # Gone from the sandbox before it is frozen: a keeper frozen as it exits
            # would hold its memory until the resume.
            deadline = time.monotonic() + LEAVE_NOW_WAIT
            while time.monotonic() < deadline:
                if (keeper < 0 or _ended(keeper)) and not procs.descendants(self.pid):
                    break
                time.sleep(0.002)
        finally:
            if keeper >= 0:
                os.close(keeper)

    def terminate(self) -> None:
        """Stop the sandbox: thawed first (frozen tasks cannot act on SIGTERM), SIGTERM to
        PID 1 (which passes it on), SIGKILL after its grace if it is still there."""
        self._thaw()
        self.signal(signal.SIGTERM)
        # Its spare (and its command's process) end when their channels close, ours and
        # PID 1's (it closes its own on SIGTERM): held here, PID 1 waited its whole grace
        # (2 s) for them, a `Sandbox.remove` in 20 taking 2 s. Nothing is handed to a
        # sandbox asked to stop.
        self.drop_spare()
        self.stop_asked = self.stop_asked or time.monotonic()
        self.kill_at = self.kill_at or time.monotonic() + STOP_KILL_AFTER

    def _thaw(self) -> None:
        if self.paused is not None:
            with contextlib.suppress(WarrenError):
                pause.resume(self.name, self.process_roots(), self.paused)
            pause.release(self.paused)
            self.paused = None

    def signal(self, sig: int) -> None:
        if sig == signal.SIGKILL and not self.plan.namespaces and not self.killing:
            # No pid namespace ends with PID 1 here: it kills the sandbox's processes
            # itself (pid1.KILL_NOW), and is killed only if it has not exited soon after.
            self.killing = True
            sig = signal.SIGUSR1
            self.kill_at = time.monotonic() + DEGRADED_KILL_AFTER
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(self.launched.pidfd, sig)

    @property
    def ending_why(self) -> str:
        """Why the supervisor ends it on its own, once it does: a failure (its message,
        then its hint) or an idle timeout; else ""."""
        if self.failure is not None:
            return self.failure.message + (f"; {self.failure.hint}" if self.failure.hint else "")
        return self.stopped_why

    def fail(self, error: WarrenError) -> None:
        """Setup went wrong: remember why (the waiting client hears it when PID 1 is
        gone) and end the sandbox."""
        self.failure = self.failure or error
        self.signal(signal.SIGKILL)

    # --- the end -------------------------------------------------------------------------------

    def start_walk(self) -> None:
        """The hard-link walk of its workspace, beside it (``linkwalk``): optimistic when
        the walk is expected to find nothing and PID 1 has heard of no walk's end yet
        (its window is open: the writes of what starts meanwhile wait for the walk)."""
        walk = self.plan.link_walk
        assert walk is not None
        root_fd = self.git.roots.get(walk.workspace) if self.git is not None else None
        expected, self.walk_token = self.keeper.link_walk_begins(walk.workspace, root_fd, walk.shared)
        self.optimistic = expected and self.walked is None
        self.started_in_walk = False
        self.link_walk = linkwalk.Job(walk, self.sel, self.walked_now, optimistic=self.optimistic)

    def walked_now(self, job: linkwalk.Job) -> None:
        """Its hard-link walk ended: PID 1 hears it (once ready), then what was held
        goes. An optimistic walk that found a file linked from outside after something
        had started ends the sandbox (what started may hold that file open, and write it
        through ``/proc/self/fd`` once its writes go on)."""
        self.link_walk = None
        walk = self.plan.link_walk
        assert walk is not None
        self.keeper.link_walk_ends(walk.workspace, self.walk_token, walk.shared, job.ok)
        if self.optimistic and self.started_in_walk and (job.linked or not job.ok):
            self.fail(
                SandboxError(
                    f"{job.linked[0] if job.linked else walk.workspace} is linked from outside the "
                    "workspace, which nothing since its last walk showed (a link made elsewhere to a "
                    "file of the workspace): the command was stopped before it changed a file"
                    + (", and such files have an inode of their own now" if job.ok else f": {job.error}"),
                    operation="walk",
                    path=walk.workspace,
                    hint="run the command again",
                )
            )
            return
        self.optimistic = False
        if self.rewalked and not job.ok:
            # A file that must be masked now cannot be: the sandbox is not used (its run
            # hears why when it is gone; the supervisor's log says it).
            self.fail(SandboxError(job.error or "the hard-link walk failed", operation="walk"))
            return
        self.walked = job.ok
        if self.ready:
            self.send(protocol.Walked(ok=job.ok))
        self._release_held()

    def walk_before_use(self) -> None:
        """A sandbox booted ahead is taken by a run or a create: its workspace is walked
        for hard links now, as at a launch (none was walked at its boot: a link the host
        makes into the workspace meanwhile, a host `uv sync` linking its cache into
        `.venv`, changes a link count, which nothing that checks a booted sandbox sees).
        PID 1 has heard of no walk's end, so its window is open: the walk may run beside
        what starts (``start_walk``)."""
        if self.plan.link_walk is None:
            return
        self.rewalked = True
        self.start_walk()

    def can_hold(self) -> None:
        """Raise unless a request handed now can wait for the hard-link walk: while it
        runs, at most ``HELD_MAX`` wait (each holds descriptors in the supervisor, which
        a client asking without end would exhaust for every sandbox)."""
        if self.link_walk is not None and len(self.held) >= HELD_MAX:
            raise SandboxError(
                f"sandbox {self.name} cannot take more requests now: {len(self.held)} already "
                "wait for the walk of its workspace for hard links, which runs once before its "
                "first command in a large workspace",
                operation="handoff",
                path=self.name,
                hint="ask again in a few seconds: the walk of a workspace of 100,000 files "
                "takes about one; fewer requests at once in the meantime",
            )

    def _to_pid1(self, handoff: protocol.Message, fds: list[int]) -> None:
        """A handoff that starts something in the sandbox, sent to PID 1 — or, while the
        hard-link walk runs, held until it has ended: a command started then could open a
        workspace file the walk has not yet given its own inode (for reading: nothing
        holds that) and, once the walk is done, open it again for writing through
        ``/proc/self/fd`` — the file outside. A held handoff waits here (copies of its
        descriptors with it) and goes after ``Walked``: every command's first call comes
        after the walk."""
        if self.link_walk is None:
            self.send(handoff, fds)
        elif self.optimistic:
            self.started_in_walk = True
            self.send(handoff, fds)
        else:
            self.held.append((handoff, [os.dup(fd) for fd in fds]))

    def _release_held(self) -> None:
        held, self.held = self.held, []
        for handoff, fds in held:
            try:
                self.send(handoff, fds)
            finally:
                for fd in fds:
                    os.close(fd)

    def run_over(self) -> None:
        """A one-shot's command ended (``Exited``) and PID 1 said nothing of the sandbox
        is left (``Emptied``): no process of it runs and the broker makes no call for it,
        so what the host must have before the client hears the end is made now (the
        repositories' last sync, the ancestors' metadata put back, its TMPDIR removed)
        and the run answered, without waiting for PID 1's exit and its helper's (each a
        Python process's memory let go). ``ended`` does the rest: its cgroups, network
        helpers and namespaces go a moment after the answer. Not in review mode, whose
        end is its own, nor on an image, held until its mounts are gone."""
        run = self.run
        if run is None or run.exited is None or not self.emptied or self.over:
            return
        if self.plan.review is not None or self.image_lease is not None:
            return  # a review's end is its own; an image is in use until PID 1 is gone
        self.over = True
        if self.link_walk is not None:
            self.link_walk.cancel()
            self.link_walk = None
        self.keeper.release(self.git)
        self.git = None
        self.waiter.run_over(self, launch.restore_host(self.launched))

    def ended(self, status: int) -> None:
        """PID 1 exited: the whole sandbox is gone. Clean up after it, then tell the
        waiter."""
        if self.link_walk is not None:
            self.link_walk.cancel()
            self.link_walk = None
        for _handoff, copies in self.held:  # their clients hear the sandbox is gone
            for each in copies:
                os.close(each)
        self.held.clear()
        # Before anyone hears it ended: what it committed is on the host by then.
        self.keeper.release(self.git)
        self.git = None
        if self.image_lease is not None:
            self.image_lease.release()
            self.image_lease = None
        if not self.ready and self.failure is None:
            # Why setup failed (PID 1's last message) may not have been read yet: its exit
            # was reaped first (a loaded host), and the run would hear "ended" without it.
            self.on_control(_R)
        if self.run is not None and self.run.relay is not None and self.run.exited is None:
            # What the command's helper said before the end may not have been read yet
            # (the loop was busy when both arrived).
            self.on_relay(_R)
        for sock in (self.launched.control, self.run.relay if self.run else None):
            if sock is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self.sel.unregister(sock)
                sock.close()
        # Network helpers end before anyone hears the sandbox ended, so an exposed port
        # is closed by the time stop/rm returns.
        if self.netd is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(self.netd.pidfd)
            boxnet.stop_netd(self.netd)
            self.netd = None
        if self.proxy is not None:
            if self.proxy_waits:
                with contextlib.suppress(KeyError, ValueError):
                    self.sel.unregister(self.proxy)
                self.proxy_waits = False
            self.proxy.close()
            self.proxy = None
        if self.pasta is not None:
            if self.pasta.pidfd is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self.sel.unregister(self.pasta.pidfd)
            self.pasta.stop()
        os.close(self.launched.pidfd)
        # What an idle sandbox's last keeper left with, for a next one that never came
        if self.kept_ruleset is not None:
            os.close(self.kept_ruleset)
        for _path, fd in self.kept_git:
            os.close(fd)
        self.kept_ruleset, self.kept_git = None, []
        self._forget_keeper()
        if self.launched.host_watch is not None:
            self.launched.host_watch.close()
        if self.launched.mark_watch is not None:
            self.launched.mark_watch.close()
            self.launched.mark_watch = None
        if self.booted is not None and self.booted.policy is not None:
            self.booted.policy.close()  # never used: its run or creator did not come
            self.booted.policy = None
        self.drop_spare()
        if self.helper is not None:
            self.helper.close()
            self.helper = None
        if self.layer is not None:
            os.close(self.layer)
            self.layer = None
        if self.stack is not None:
            self.stack.close()
            self.stack = None
        self.take_reports()
        if self.trail is not None:
            # A stop ends the sandbox with its commands: whichever comes first to the
            # supervisor (the exec's end or the sandbox's), the record says it was stopped.
            why = "the sandbox was stopped while it ran" if self.kill_at is not None else ""
            for record in self.execs.values():
                self.trail.ended(record, b"", why or "the sandbox ended while it ran")
            self.trail.record("end", status=status)
            self.trail.close()
        self.execs.clear()
        # Its namespaces and detached mounts, closed once the waiter has heard: the last
        # reference to a mount namespace (or a detached tree) unmounts what it holds, and
        # waits for the kernel's grace period (a fifth of a millisecond, and more under
        # load). Nothing of the sandbox runs by now (PID 1 has exited), so nobody waits
        # for them.
        late = [fd for fd in (*(self.ns or ()), self.review_lower, self.review_layer) if fd is not None]
        self.review_lower = self.review_layer = None
        self.ns = None
        for fd in self.active:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(fd)
            os.close(fd)
        self.active.clear()
        self.answered.clear()
        if self.paused is not None:
            pause.release(self.paused)
        if self.unused:
            # Booted ahead and never used: nothing of the sandbox ran, so whatever changed
            # the guarded directories since was the host's own doing, not to be undone.
            self.launched.guard = []
        try:
            self.waiter.box_ended(self, status, launch.restore(self.launched))
        finally:
            for fd in late:
                with contextlib.suppress(OSError):
                    os.close(fd)
