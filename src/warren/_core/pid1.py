"""PID 1 of a sandbox — one-shot or long-lived alike — and the helpers it forks.

    supervisor ══ control channel (a socketpair: the only way in) ══ PID 1
                                                                      ├─ shim: one per exec/spawn
                                                                      ├─ file helper: one per call
                                                                      └─ ps / signal / connector

The preamble (``main``) is the same for every sandbox: parent-death signal, the id
maps and the mount plan, the network handshake, the Landlock ruleset built once, then
PID 1 settles: no capabilities, no way to regain any, not dumpable, outside every
Landlock domain. It runs no user code. Requests arrive only from the supervisor, as
``Handoff`` messages carrying the client's connection; PID 1 forks a helper for each
and never reads from a client itself, so no client can stall or crash it. A one-shot
sandbox serves exactly one exec and ends when it does, killing what is left.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import select
import signal
import socket
import time
from dataclasses import dataclass, field
from typing import NoReturn, assert_never

from .. import protocol, wire
from ..errors import LimitReached, ProcessNotFound, SandboxError, SetupError, WarrenError
from ..net.handshake import pid1_network
from ..net.proxy import listen_inside
from ..plan.model import Plan
from . import _sys, again, credsend, execstub, fileops, harden, idletime, kernel, mounts, nativeinit, procs
from .broker import Broker
from .broker.window import Window
from .shim import Launcher, Shim, warm

STOP_GRACE = 2.0
# The degraded mode's SIGKILL: without a pid namespace nothing dies with PID 1, so the
# supervisor asks it to kill every process of the sandbox at once and exit
# (``server.box.Box.signal``), and kills it only if it has not done so soon after.
KILL_NOW = signal.SIGUSR1
PR_SET_CHILD_SUBREAPER = 36
# A keeper's exit status when it leaves an idle sandbox (native/init.c: the sandbox goes on)
LEAVING = 86
LOOK_AGAIN = 5.0  # seconds between looks for an idle sandbox while a process of it runs
# How long a keeper asked to leave before a pause (``protocol.LeaveNow``) waits for the
# helpers it let go to end before it answers (seconds).
LEAVE_NOW_WAIT = 0.25
# ... and, its helpers ended, for the processes they leave as they end (a spare's
# command process, made ahead) before it takes one still there for the sandbox's own.
LEAVE_NOW_SETTLE = 0.03
MAX_HELPERS = 4096
# PID 1 forks the next spare once the helper that took the last request has ended (its
# client has its answer), or when that request has run this long (a long command: the
# spare is forked beside it). Not sooner: PID 1's fork (~1.7 ms of CPU) on the core of a
# helper still serving kept that helper from answering (an exec of ``true`` 0.3 s after
# the last took 5 ms instead of 3: the fork ran between the command's end and the answer).
SPARE_BESIDE_MS = 20
# ... except in a burst: a request that came within ``BURST_GAP`` seconds of the one
# before (commands back to back, a framework's several calls in one turn) has the next
# spare forked ``BURST_BESIDE_MS`` after it was taken, beside it: the next request comes
# a moment after its answer, long before a spare forked after its helper's end is ready
# (about 7 ms: a request finding none waits for a helper forked for it, and back to back
# every request did, so none ever found one).
BURST_GAP = 0.5
BURST_BESIDE_MS = 1


def spare_wait_ms(burst: bool, serving: bool, again: bool = False) -> int:
    """How long PID 1 waits, with nothing happening, before it forks the next spare:
    none once the helper given the last request has ended (``serving`` False); beside a
    request still served, ``BURST_BESIDE_MS`` in a burst, else ``SPARE_BESIDE_MS``,
    which is also the wait where that helper may serve again (``again``: it is the next
    spare, unless its command runs long)."""
    if not serving:
        return 0
    return BURST_BESIDE_MS if burst and not again else SPARE_BESIDE_MS


def in_burst(last: float, now: float) -> bool:
    """Whether a request at ``now`` came in a burst: within ``BURST_GAP`` of the last."""
    return now - last < BURST_GAP


SPARE_IDLE = idletime.spare_idle()
# A helper that answered an exec serves the next request (``again``), in a burst or not;
# ``WARREN_SERVE_AGAIN=0`` in the supervisor's environment turns it off (each helper
# serves one request, as before; ``bench/bench_burst.py`` compares the two).
SERVE_AGAIN = os.environ.get("WARREN_SERVE_AGAIN", "1") != "0"
BUSY_GRACE = 0.015  # how long a process found running in ``_quiesce`` may take to go (default)
INLINE_REPLY_MAX = 64 * 1024  # what PID 1 writes to a client itself: its buffer takes it at once
# How long a one-shot's PID 1 waits for the broker to finish a call it is making when
# the run's helper says the sandbox is empty (seconds): longer, and the run is answered
# after PID 1's exit instead.
EMPTIED_WAIT = 0.05


def main(plan: Plan, control: socket.socket, *, oneshot: bool, ahead: bool = False) -> int:
    """Run as the freshly cloned PID 1; returns its exit code. ``ahead``: a one-shot
    sandbox booted before its command is known, whose spare helper is forked at once."""
    kernel.die_with_parent()
    # The parent is outside this pid namespace (getppid() is 0): a hung-up channel
    # means it died before the parent-death signal was armed.
    poller = select.poll()
    poller.register(control, select.POLLRDHUP)
    if poller.poll(0):
        return 125
    try:
        if plan.namespaces:
            harden.limit_user_ns(plan)  # the host's /proc still: the new one may be read-only
            mounts.enter_new_root(plan)
            if not pid1_network(plan, control):
                return 125
        else:
            # No pid namespace: orphans of the sandbox come back to PID 1 (its
            # descendants are the sandbox: ``procs.Members``), never to the host's init.
            _sys.prctl(PR_SET_CHILD_SUBREAPER, 1)
            if plan.net.mode == "allow":
                _proxy_on_host(plan, control)
        os.chdir("/")
        ruleset = harden.landlock_ruleset(plan.landlock) if plan.landlock is not None else None
        harden.seccomp_program(plan)
        # Spawned while PID 1 still holds CAP_SYS_ADMIN over the sandbox's namespaces:
        # the sender's one capability, for naming a command in its unix sends.
        sender = credsend.start() if plan.namespaces else None
        harden.settle_pid1(plan)
        helpers: set[int] = set()
        native = nativeinit.loaded() if plan.namespaces else None
        if native is not None:
            _keep_as_keeper(native)
        broker = _start_broker(plan, helpers, sender)
    except WarrenError as e:
        with contextlib.suppress(OSError):
            wire.send(control, protocol.Failed(error=protocol.error_message(e).error))
        return 125
    # The sandbox's user and mount namespaces, for the supervisor to join later (to
    # follow a replaced workspace, to bind a git store again): PID 1 is not dumpable
    # from here on, so they cannot be opened through /proc afterwards. None in the
    # degraded mode: they would be the host's.
    kinds = ("user", "mnt") if plan.namespaces else ()
    ns = [os.open(f"/proc/self/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC) for kind in kinds]
    # On an image, the sandbox's own layer too (for snapshots), and before Ready the
    # layer tmpfs and the lower layers as detached mounts (for stacking the root again:
    # snapshots without a copy, ``server.restack``); in review mode the host's workspace
    # as a detached mount (checkpoints, ``server.checkpoints``). PID 1 keeps none.
    layer = mounts.layer_fd[:1]
    held = mounts.held[:] if layer or plan.review is not None else []
    mounts.layer_fd.clear()
    mounts.held.clear()
    for at in range(0, len(held), wire.MAX_FDS):
        wire.send(control, protocol.Layers(), fds=held[at : at + wire.MAX_FDS])
    wire.send(control, protocol.Ready(), fds=ns + layer)
    for fd in ns + layer + held:
        os.close(fd)
    return _serve(plan, control, ruleset, broker, helpers, sender, oneshot=oneshot, ahead=ahead)


def _serve(
    plan: Plan,
    control: socket.socket,
    ruleset: int | None,
    broker: Broker | None,
    helpers: set[int],
    sender: credsend.Sender | None,
    *,
    oneshot: bool = False,
    ahead: bool = False,
) -> int:
    """PID 1's service, or a joined keeper's, until it ends; its exit code."""
    try:
        init = Init(plan, control, ruleset, oneshot, broker, helpers, ahead)
        init.sender = sender.pid if sender is not None else 0
        return init.serve()
    except Exception as e:
        # A bug of warren's: PID 1's stderr is /dev/null, so the supervisor's log says
        # where it was (the sandbox ends with it, and its clients hear that).
        with contextlib.suppress(OSError, WarrenError):
            control.setblocking(True)
            wire.send(control, protocol.Failed(error=protocol.error_message(_crashed(e)).error))
        return 125


def _keep_as_keeper(init: int) -> None:
    """Fork the keeper, which goes on serving the sandbox (it returns here); this
    process, PID 1, becomes the native init (``nativeinit``). The keeper is the child
    subreaper of everything it starts, as PID 1 was their reaper: a command's orphans
    still come back to it. A failed fork leaves PID 1 the Python one, as without the
    program."""
    try:
        keeper = os.fork()
    except OSError:
        return
    if keeper != 0:
        nativeinit.become(init, keeper)
    _sys.prctl(PR_SET_CHILD_SUBREAPER, 1)
    nativeinit.forget()  # the keeper's helpers hold no copy of it


def keeper_main(plan: Plan, control: socket.socket, kept: int = -1, git: dict[str, int] | None = None) -> int:
    """A keeper joined from outside (``rejoin``), in the sandbox's namespaces and
    cgroups, the spawner's child in its pid namespace: set up as PID 1 did once its
    mounts and network were made, tell the init it serves now, and serve. ``kept``:
    the last keeper's ruleset; ``git``: its ``mounts.git_under``, for the broker."""
    from .clone import keep_only

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the spawner's (``rejoin.reap_keepers``)
    try:
        nativeinit.forget()  # the init's program: not the keeper's to hold
        mounts.git_under.clear()
        mounts.git_under.update(git or {})
        keep_only(control.fileno(), *([kept] if kept >= 0 else []), *mounts.git_under.values())
        os.chdir("/")
        os.kill(1, signal.SIGUSR2)  # the init's next keeper: this process
        _sys.prctl(PR_SET_CHILD_SUBREAPER, 1)
        # The last keeper's, given back by the supervisor, else built anew as PID 1 did
        ruleset: int | None = kept if kept >= 0 else None
        if ruleset is None and plan.landlock is not None:
            ruleset = harden.landlock_ruleset(plan.landlock)
        harden.seccomp_program(plan)
        sender = credsend.start()
        harden.settle_pid1(plan)
        helpers: set[int] = set()
        broker = _start_broker(plan, helpers, sender)
    except WarrenError as e:
        with contextlib.suppress(OSError):
            wire.send(control, protocol.Failed(error=protocol.error_message(e).error))
        return 125
    return _serve(plan, control, ruleset, broker, helpers, sender)


def _crashed(e: Exception) -> SandboxError:
    import traceback

    frames = traceback.extract_tb(e.__traceback__)[-3:]
    where = " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in reversed(frames))
    return SandboxError(
        f"PID 1 failed: {e!r} at {where}",
        operation="pid1",
        hint="this is a bug in warren; please report it with the command you ran",
    )


def _kill_spare(pid: int) -> set[int]:
    """SIGKILL a spare helper nobody was given (``Init._quiesce``) and its command's
    process (its only child: the exec stub, waiting for a command); their pids, which
    no longer count as the sandbox's processes (PID 1 reaps them as they go). Stopped
    first, so that a child it is forking now is in the table when it is read; neither
    pid can be reused meanwhile (the spare is PID 1's child, not reaped yet, and its
    child is its own, which it does not reap while stopped)."""
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGSTOP)
        os.waitid(os.P_PID, pid, os.WSTOPPED | os.WEXITED | os.WNOWAIT)
    doomed = {pid} | {p for p, ppid, _st in procs.table() if ppid == pid}
    for each in sorted(doomed, reverse=True):
        with contextlib.suppress(OSError):
            os.kill(each, signal.SIGKILL)
    return doomed


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "gone"


def _proxy_on_host(plan: Plan, control: socket.socket) -> None:
    """The degraded mode's network allow: the proxy listens on the port of the host's
    loopback chosen when planning (the only address the broker lets a command reach)."""
    try:
        listener = listen_inside(plan.net.proxy_port)
    except OSError as e:
        raise SetupError.from_os(
            e,
            f"cannot listen for the sandbox's proxy on 127.0.0.1:{plan.net.proxy_port}: {e.strerror}",
            "bind",
            hint="another program took the port chosen for it: run the command again",
        ) from None
    with listener:
        wire.send(control, protocol.NetProxy(), fds=[listener.fileno()])


def _start_broker(plan: Plan, helpers: set[int], sender: credsend.Sender | None) -> Broker | None:
    try:
        return Broker.start(plan, helpers, sender)
    except OSError as e:
        raise SetupError.from_os(
            e,
            f"sandbox setup failed: seccomp user notification (the syscall broker): {e.strerror}",
            "seccomp",
            hint="this kernel lacks seccomp user notification (Linux >= 5.5 has it)",
        ) from None


@dataclass(eq=False, repr=False)
class Init:
    plan: Plan
    control: socket.socket
    ruleset: int | None
    oneshot: bool
    broker: Broker | None
    helpers: set[int]  # the broker thread reads it too
    ahead: bool = False
    # A request reached it (through PID 1, or a one-shot's through its spare), or, booted
    # ahead for a create, its creator took it (``protocol.Adopted``).
    served: bool = field(default=False, init=False)
    sender: int = field(default=0, init=False)  # the credentials sender's pid (``credsend``), 0 none
    spare: socket.socket | None = field(default=None, init=False)  # a helper forked ahead of the next request
    # ... given to the supervisor (``protocol.Spare``), which hands it the next request
    # itself; PID 1 then never hands it one (a long-lived sandbox's spares are given)
    advertised: bool = field(default=False, init=False)
    poller: select.poll | None = field(default=None, init=False)
    want_spare: bool = field(default=False, init=False)  # fork the next spare once things are quiet
    serving: int = field(default=0, init=False)  # the helper given the last request (``SPARE_BESIDE_MS``)
    last_request: float = field(default_factory=time.monotonic, init=False)
    burst: bool = field(default=False, init=False)  # the last request came soon after the one before
    stopping: float | None = field(default=None, init=False)
    kill_now: bool = field(default=False, init=False)
    forked: int = field(default=0, init=False)  # the pid of the helper forked last
    window_spare: bool = field(default=False, init=False)  # ... forked with the walk's window filter
    in_window: bool = field(default=False, init=False)  # in a helper: forked with that filter
    spare_pid: int = field(default=0, init=False)
    # Helpers serving the network helper's connections (``_connector``): long-lived, they
    # hold no file of the sandbox's root (sockets only), so a snapshot need not wait
    # for them (``_quiesce``).
    connectors: set[int] = field(default_factory=set, init=False)
    let_go: set[int] = field(default_factory=set, init=False)  # spares let go, not yet reaped
    # A one-shot's channel to the helper of its run, kept after the request: the helper
    # says there when every process of the sandbox is gone ("d", ``shim.end_sandbox``).
    last: socket.socket | None = field(default=None, init=False)
    generation: int = field(default=0, init=False)  # ``Refresh`` and ``Walked`` read (``Spare``)
    spare_gen: int = field(default=0, init=False)  # ... when the spare was forked
    # The helper given the last exec, which may serve again (``again``),
    # and a request that waits for it meanwhile (with its descriptors, and until when).
    serving_again: again.Serving | None = field(default=None, init=False)
    pending: tuple[protocol.Handoff, list[int], float] | None = field(default=None, init=False)
    held_back: bool = field(default=False, init=False)  # quiesced: no helper serves again until ``Refresh``
    received: int = field(default=0, init=False)  # messages read from the supervisor (``Leaving``)
    leaving: bool = field(default=False, init=False)  # ``Leaving`` said, ``LeaveOk`` awaited
    looked: float = field(default=0.0, init=False)  # when ``_alone`` last looked (monotonic)
    # Asked to leave now (``protocol.LeaveNow``), answered by then (monotonic) at the latest.
    leave_by: float | None = field(default=None, init=False)
    drained: float | None = field(default=None, init=False)  # ... when its helpers had all ended

    @property
    def ready_run(self) -> bool:
        """A one-shot sandbox booted ahead, waiting for its run."""
        return self.ahead and self.oneshot and not self.served

    @property
    def keeps_spare(self) -> bool:
        """A sandbox booted ahead, not yet given to its run or its creator
        (``protocol.Adopted``): its spare stays however long it waits, so that the
        run, or the create's first exec, finds one."""
        return self.ahead and not self.served

    def __post_init__(self) -> None:
        self.wake_r, self.wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.members = procs.Members(self.plan.namespaces)

    def serve(self) -> int:
        self.control.setblocking(False)
        inbox = wire.Inbox(self.control, max_fds=wire.HANDOFF_MAX_FDS)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(KILL_NOW, self._on_kill_now)
        for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, KILL_NOW})  # blocked since the clone
        poller = self.poller = select.poll()
        poller.register(self.control, select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        if (self.ahead or not self.oneshot) and self.stopping is None:
            if not self.oneshot and wire.readable(self.control.fileno(), 0):
                # Something waits already: a keeper joined for a request (``rejoin``) has
                # it on its channel. Its helper is the one fork it waits for; a spare
                # forked first (and given to the supervisor) would make it wait for two.
                # The spare comes once things are quiet, as after any request.
                self.want_spare = True
            else:
                self._try_spare()
        while True:
            timeout: float | None = None
            if self.stopping is not None:
                timeout = 50
                # Each exits when its channel closes, signal or not.
                self._drop_spare()
                self._end_serving()
                self._dispatch_pending()
            elif self.want_spare:
                again_soon = self.serving_again is not None
                timeout = spare_wait_ms(self.burst, self.serving in self.helpers, again_soon)
            elif self.spare is not None and not self.keeps_spare:
                timeout = max(0.0, (self.last_request + SPARE_IDLE - time.monotonic()) * 1000)
            elif self._may_leave():
                timeout = max(0.0, (self._leave_at() - time.monotonic()) * 1000)
            if self.leave_by is not None:
                timeout = 10 if timeout is None else min(timeout, 10)
            due = self._again_due()
            if due is not None:
                left = max(0.0, (due - time.monotonic()) * 1000)
                timeout = left if timeout is None else min(timeout, left)
            events = poller.poll(timeout)
            if due is not None and time.monotonic() >= due:
                self._again_timed_out()
            if not events and self.want_spare and self.stopping is None and self.leave_by is None:
                # The last request answered (its helper ended), or running long: the
                # next spare now, not while that request's helper still needs the CPU.
                self.want_spare = False
                self._try_spare()
            elif (
                self.spare is not None
                and not self.keeps_spare
                and time.monotonic() - self.last_request > SPARE_IDLE
            ):
                # Nobody uses this sandbox now: its spare goes (it exits when its
                # channel closes), and the memory it held with it. Not a sandbox booted
                # ahead still waiting: it is there only to serve its run (or its
                # creator's first exec) at once, with its spare, and the supervisor
                # stops it whole when unused (``ahead.IDLE``).
                self._drop_spare()
            elif (
                self.leave_by is None
                and self._may_leave()
                and time.monotonic() >= self._leave_at()
                and self._alone()
            ):
                self._say_leaving()
            given = self.spare.fileno() if self.spare is not None and self.advertised else -1
            for fd, _ev in events:
                if fd == given:
                    # The supervisor handed the given spare a request (it says so), or
                    # it died: the next one is forked once things are quiet.
                    if self.spare is not None and self.spare.fileno() == given:
                        # A one-shot's run taken by its spare ("t"): served, and over
                        # once that helper is gone (it may be gone already).
                        taken = _said_taken(self.spare)
                        run_taken = self.oneshot and taken
                        if run_taken and self.plan.namespaces:
                            self._keep_last(self.spare)
                            self.spare, self.advertised = None, False
                        self._requested()
                        chan = self.spare
                        keep = taken and self._serves_again() and self.stopping is None
                        if keep and chan is not None:
                            # Kept: it may serve the next request too (``again``).
                            self.spare, self.advertised = None, False
                            self._keep_serving(chan, self.spare_pid, self.spare_gen, self.window_spare)
                        self._drop_spare(taken=True)
                        self.serving = self.spare_pid
                        self.want_spare = not self.oneshot and self.stopping is None
                        if run_taken:
                            self.served = True
                            if self.spare_pid not in self.helpers:
                                self.members.kill(signal.SIGKILL)
                                return 0
                    continue
                if fd == self.wake_r:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(self.wake_r, 4096):
                            pass
                    continue
                if self.last is not None and fd == self.last.fileno():
                    self._last_said()
                    continue
                if self.serving_again is not None and fd == self.serving_again.chan.fileno():
                    self._heard_again()
                    continue
                try:
                    while (
                        got := inbox.read(
                            (
                                protocol.Handoff,
                                protocol.Refresh,
                                protocol.Quiesce,
                                protocol.Walked,
                                protocol.Adopted,
                                protocol.LeaveOk,
                                protocol.LeaveNow,
                            )
                        )
                    ) is not None:
                        self.received += 1
                        if isinstance(got[0], protocol.LeaveOk):
                            if self.leaving:
                                # Nothing came after our word: the sandbox is idle. The
                                # init hears it first (a joined keeper is not its child).
                                with contextlib.suppress(OSError):
                                    os.kill(1, signal.SIGUSR1)
                                return LEAVING
                            continue
                        self.leaving = False  # a request, or word of a change: staying
                        if isinstance(got[0], protocol.Adopted):
                            # Its creator's now: idle from here on, as if asked now.
                            self.served = True
                            self.last_request = time.monotonic()
                        elif isinstance(got[0], protocol.Refresh):
                            self._new_rules()
                            self._refresh()
                            self._dispatch_pending()
                        elif isinstance(got[0], protocol.Walked):
                            self._new_rules()
                            self._walked(got[0].ok)
                            self._dispatch_pending()
                        elif isinstance(got[0], protocol.Quiesce):
                            self._quiesce(got[0])
                        elif isinstance(got[0], protocol.LeaveNow):
                            self._asked_to_leave()
                        else:
                            self._dispatch(*got)
                except (wire.ConnectionClosed, OSError):
                    return 0  # the supervisor is gone; the parent-death signal follows
                except WarrenError:
                    return 125  # the supervisor speaks nonsense: it is not ours any more
            if self.kill_now:
                self.members.kill(signal.SIGKILL)
                return 137
            if self.leave_by is not None:
                self._answer_leave_now()
            done = self._reap()
            if self.oneshot and self.served and done and not self.helpers:
                # The one command ended: nothing of this sandbox outlives it.
                self.members.kill(signal.SIGKILL)
                return 0
            if self.stopping is not None and (not procs.has_children() or time.monotonic() > self.stopping):
                if not self.plan.namespaces:
                    # No pid namespace dies with PID 1 here: what is left goes now.
                    self.members.kill(signal.SIGKILL)
                return 0

    def _say_leaving(self) -> None:
        """Tell the supervisor this keeper leaves the idle sandbox (``LeaveOk`` lets it
        go), with its ruleset (the next keeper's, unless a host change rebuilds it) and
        what no later process can open (``mounts.git_under``)."""
        self.leaving = True
        with contextlib.suppress(OSError):
            kept = [self.ruleset] if self.ruleset is not None else []
            git = sorted(mounts.git_under)
            wire.send(
                self.control,
                protocol.Leaving(received=self.received, ruleset=bool(kept), git=git),
                fds=kept + [mounts.git_under[path] for path in git],
            )

    def _asked_to_leave(self) -> None:
        """``LeaveNow``: the sandbox is being paused. Its spare and a helper that might
        serve again go now (the supervisor let its end of the spare go already), no new
        one is forked, and the answer comes once they have ended (``_answer_leave_now``)."""
        self._drop_spare()
        self._end_serving()
        self.want_spare = False
        self.leave_by, self.drained = time.monotonic() + LEAVE_NOW_WAIT, None
        self._answer_leave_now()

    def _answer_leave_now(self) -> None:
        """``Leaving`` once the sandbox is idle (its helpers ended, nothing of it runs);
        ``Staying`` once a process of the sandbox's own still runs after they ended
        (``LEAVE_NOW_SETTLE``), by ``leave_by`` at the latest, or at once where it cannot
        leave at all (PID 1)."""
        assert self.leave_by is not None
        self._reap()
        now = time.monotonic()
        if self.drained is None and not (self.helpers - self.connectors):
            self.drained = now
        if self._may_leave() and self._alone():
            self.leave_by = None
            self._say_leaving()
        elif (
            os.getpid() == 1
            or now >= self.leave_by
            or (self.drained is not None and now - self.drained >= LEAVE_NOW_SETTLE)
        ):
            # No spare forked now: the sandbox is being paused, by signals perhaps, which
            # a process forking meanwhile would outrun. The next request forks its own
            # helper, and the spares come back after it.
            self.leave_by = None
            with contextlib.suppress(OSError):
                wire.send(self.control, protocol.Staying())

    def _may_leave(self) -> bool:
        """A long-lived sandbox under the native init (this process is its keeper, not
        PID 1), with nothing forked or waiting: it may leave once idle (``Leaving``)."""
        return (
            os.getpid() != 1
            and self.plan.namespaces
            and not self.oneshot
            and not self.keeps_spare
            # (said already: said again every LOOK_AGAIN until an answer comes. The
            # supervisor answers only when it agrees, and may not have yet: its copy of
            # the spare let go, its end not seen closed when our word came)
            and self.stopping is None
            and self.spare is None
            and not self.helpers
            and not self.connectors
            and self.serving_again is None
            and self.pending is None
            # the hard-link walk's window open (held calls wait for its ``Walked``) or
            # failed (every such call refused from then on): a new keeper has neither
            and not self._in_window()
        )

    def _leave_at(self) -> float:
        """When to look whether the sandbox is idle (``SPARE_IDLE`` after the last
        request), or again (``LOOK_AGAIN`` after a look found a process running)."""
        return max(self.last_request + SPARE_IDLE, self.looked + LOOK_AGAIN)

    def _alone(self) -> bool:
        """No process in the sandbox but the init, this keeper and the sender."""
        self._reap()
        self.looked = time.monotonic()
        mine = {1, os.getpid(), self.sender}
        return not any(p[0] not in mine for p in procs.table())

    def _requested(self) -> None:
        """A request came (taken by the spare, or handed here): noted, and whether it
        came in a burst (``BURST_GAP``)."""
        now = time.monotonic()
        self.burst = in_burst(self.last_request, now)
        self.last_request = now

    def _keep_last(self, channel: socket.socket) -> None:
        """Keep a one-shot's channel to the helper of its run (see ``_last_said``)."""
        self.last = channel
        if self.poller is not None:
            with contextlib.suppress(KeyError):
                self.poller.unregister(channel)
            self.poller.register(channel, select.POLLIN)

    def _last_said(self) -> None:
        """The one-shot's helper said every process of the sandbox is gone ("d"), or
        ended without saying so. Said: once no call the broker makes for the sandbox is
        under way, the supervisor hears it (``protocol.Emptied``) and answers the run
        before this process's exit. Not said (the helper failed, its client left, a
        process it could not kill): the run is answered once PID 1 has exited, as ever."""
        assert self.last is not None
        try:
            said = self.last.recv(16, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            said = b""
        if self.poller is not None:
            with contextlib.suppress(KeyError):
                self.poller.unregister(self.last)
        self.last.close()
        self.last = None
        if said.startswith(b"d") and (self.broker is None or self.broker.quiet(EMPTIED_WAIT)):
            with contextlib.suppress(OSError):
                wire.send(self.control, protocol.Emptied())

    def _new_rules(self) -> None:
        """A ``Refresh`` or ``Walked``: what comes next runs under other rules (a host
        file replaced, a root moved, the hard-link walk over). A helper that might serve
        again holds the old ones, and its command's process was confined by them: it
        goes (a request that waited for it gets a helper of the new rules, forked once
        they are made)."""
        self.generation += 1
        self._end_serving()

    def _walked(self, ok: bool) -> None:
        """The supervisor's hard-link walk ended: the held calls go on (or fail), and a
        spare forked with the window's filter makes way for one with today's."""
        window = self._window()
        if window is None:
            return
        window.finish(ok)
        if (
            ok
            and self.spare is not None
            and self.window_spare
            and not self.ready_run
            and self.stopping is None
        ):
            self._drop_spare()
            self.want_spare = True

    def _refresh(self) -> None:
        """A writable root now names another directory: rules for the new one (the
        spare holds the old ruleset, so it goes)."""
        if self.plan.landlock is not None:
            old, self.ruleset = self.ruleset, harden.landlock_ruleset(self.plan.landlock)
            if old is not None:
                os.close(old)
        self._drop_spare()
        self.held_back = False
        # A run's sandbox booted ahead still waiting for its run gets one too.
        self.want_spare = not self.oneshot or self.ready_run

    def _quiesce(self, asked: protocol.Quiesce) -> None:
        """Let the spare go, wait for warren's helpers that are ending (3 s at most),
        then say whether PID 1 is the sandbox's only process (but for the
        network helper's connectors: sockets only). A command, a background process or
        a daemon left by one answers at once: not alone, unless ``stop``: then each is
        killed (named in the answer) until none is left. No spare is forked until the
        supervisor's ``Refresh``. A spare the supervisor let go unused, or never heard
        of (``protocol.Quiesce``), is killed with its command's process, which then
        count as gone; so do warren's helpers already in the kernel's exit."""
        stop, grace = asked.stop, asked.grace
        spare = self.spare_pid if self.spare is not None and self.advertised else 0
        self._drop_spare()
        # No helper serves again until the ``Refresh`` (it would hold the old rules), and
        # a request that waited for one has its own now.
        self.held_back = True
        self._end_serving()
        self._dispatch_pending()
        unused = spare and (asked.untaken == spare or asked.seen != spare)
        doomed = _kill_spare(spare) if unused else set()
        # Spares let go end, and their command's processes with them; a connector's only
        # child is the command's process it was forked with, ending too.
        ending = (self.let_go & self.helpers) | self.connectors
        self.want_spare = False
        deadline = time.monotonic() + 3.0  # ending helpers end in milliseconds; a loaded host
        alone = False
        busy: list[int] = []
        stopped: dict[int, str] = {}
        judged: set[int] = set()  # named or not when first seen, killed
        seen_busy = 0.0
        while True:
            self._reap()
            gone = self.connectors | doomed | {self.sender}
            # PID 1, and the keeper where PID 1 is the native init (this process)
            others = [p for p in procs.table() if p[0] not in (1, os.getpid()) and p[0] not in gone]
            if not others:
                alone = True
                break
            # Anything but a helper (and the spare's own command process, which goes with
            # it) is the sandbox's: it may hold files of the root open. A zombie is on its
            # way out, unless only its main thread exited and the others run on.
            busy = [
                pid
                for pid, ppid, st in others
                if pid not in self.helpers and ppid not in ending and (st != "Z" or procs.running(pid))
            ]
            if not busy and all(pid in self.helpers and procs.exiting(pid) for pid, _pp, _st in others):
                alone = True  # helpers that served their request, in their exit
                break
            now = time.monotonic()
            if stop and busy and now <= deadline:
                for pid in busy:
                    comm = _comm(pid)
                    # A command's process made ahead, still there: warren's, killed
                    # unsaid. Its helper ended (it is PID 1's now) before it ran as far
                    # as naming itself (its name a number: it was spawned by a
                    # /proc/self/fd path; its exe tells), or it is on its way out (its
                    # exe gone: its name tells). A command run from a memfd of the
                    # stub's name is killed all the same, its name not said. Each is
                    # judged once, before its kill: in its exit after it, its exe is
                    # gone while its name stays (a process freeing much memory is seen
                    # again then), and it would pass for a command.
                    if pid not in judged:
                        judged.add(pid)
                        if comm not in ("gone", execstub.COMM) and not procs.is_warren(pid):
                            stopped[pid] = comm
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
            elif busy and now <= deadline and all(procs.exiting(pid) for pid in busy):
                # In the kernel's exit, each of them: it runs nothing of its own again and
                # is gone soon, however long freeing its memory takes (a process that
                # touched 2 GiB about 0.2 s): waited for, never counted as running.
                pass
            elif busy and now < (seen_busy := seen_busy or now) + min(max(grace, 0.0), 1.0):
                # An exec's processes may still be on their way out when its answer came
                # (their helper reaped first, they are PID 1's for a moment): busy is
                # what is still there after the grace.
                pass
            elif busy or now > deadline:
                busy = busy or [pid for pid, _ppid, _st in others]
                break
            time.sleep(0.002)
        if alone:
            why = ", ".join(f"{pid} ({comm})" for pid, comm in list(stopped.items())[:8])
        else:
            why = ", ".join(f"{pid} ({_comm(pid)})" for pid in busy[:4])
        with contextlib.suppress(OSError):
            wire.send(self.control, protocol.Quiet(alone=alone, why=why))

    def _on_kill_now(self, _signum: int, _frame: object) -> None:
        self.kill_now = True

    def _on_term(self, _signum: int, _frame: object) -> None:
        # Stop: every process gets SIGTERM and a grace period; PID 1 exiting then
        # SIGKILLs whatever is left (the kernel tears the pid namespace down).
        if self.stopping is None:
            self.stopping = time.monotonic() + STOP_GRACE
            self.members.kill(signal.SIGTERM)
            # The spare, and a helper that might serve again, go at the top of the
            # loop (``serve``), not here: this handler runs between any two steps of
            # PID 1's, a spare's fork and its registration included.

    def _reap(self) -> bool:
        reaped = False
        while True:
            # Look first, reap after: a helper leaves the broker's set of warren's own
            # processes (whose calls go on unchecked) while its pid still names its
            # zombie, so no new process can be given that pid while it is in the set.
            try:
                seen = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return reaped
            if seen is None:
                return reaped
            if seen.si_pid in self.helpers:
                self.helpers.discard(seen.si_pid)
                self.connectors.discard(seen.si_pid)
                self.let_go.discard(seen.si_pid)
                reaped = True
            with contextlib.suppress(ChildProcessError):
                os.waitpid(seen.si_pid, 0)

    def _try_spare(self) -> None:
        """Fork a spare ahead of time, unless the sandbox is at its pids (or memory)
        limit: then the next request forks its own, and hears why if it cannot."""
        if self.spare is not None or len(self.helpers) >= MAX_HELPERS or (self.oneshot and self.served):
            return
        with contextlib.suppress(OSError):
            self._fork_spare(warm_up=True)

    def _drop_spare(self, taken: bool = False) -> None:
        """Close PID 1's end of the spare (it exits unless it was ``taken``: given a
        request by the supervisor, which it serves)."""
        if self.spare is None:
            return
        if not taken:
            self.let_go.add(self.spare_pid)
        if self.advertised and self.poller is not None:
            with contextlib.suppress(KeyError):
                self.poller.unregister(self.spare)
        self.spare.close()
        self.spare, self.advertised = None, False

    def _dispatch(self, msg: protocol.Message, _payload: int, fds: list[int]) -> None:
        """Hand a request to the spare helper (forked ahead of time), then fork the
        next spare while this one works: no fork on a request's path. With none, in a
        burst whose last helper is readying itself again (``again``), the request
        waits for it (``again.PENDING_WAIT`` at most). So does one that came before
        that helper's "r" was heard, once its command is over (no child left): the
        client's next request can overtake the word the helper says right after the
        answer (it loses its core to the client, or to the supervisor syncing a
        repository), and a helper forked for it takes twice as long."""
        assert isinstance(msg, protocol.Handoff)
        self._requested()
        serving = self.serving_again
        if (
            fds
            and self.pending is None
            and (self.spare is None or self.advertised)
            and serving is not None
            and serving.generation == self.generation
            and self.stopping is None
        ):
            if not serving.going:
                self._heard_again()  # its "r", when it is there already
                serving = self.serving_again
            if serving is not None and serving.offer:  # (an offer: it was told to go)
                self._hand_offer(serving, msg, fds)
            elif serving is not None and (serving.going or again.answered(serving.pid)):
                self.pending = (msg, fds, time.monotonic() + again.PENDING_WAIT)
            else:
                self._give(msg, fds)
            return
        self._give(msg, fds)

    def _give(self, msg: protocol.Handoff, fds: list[int]) -> None:
        try:
            if not fds or len(self.helpers) >= MAX_HELPERS or (self.oneshot and self.served):
                return
            if self.spare is not None and not self.advertised:
                spare, self.spare = self.spare, None
                pid, gen, window = self.spare_pid, self.spare_gen, self.window_spare
                with contextlib.suppress(OSError):
                    wire.send(spare, msg, fds=fds)
            else:  # none, or the supervisor's (it had not heard of it yet)
                try:
                    # The request waits: forked with it in hand (its descriptors are the
                    # child's by the fork, and kept there: ``_keep_own``), so that nothing
                    # is sent to it, a send of PID 1's being a call its own broker is
                    # asked to pass (a wake of the broker's thread on the request's path).
                    spare, _, _ = self._fork_helper(warm_up=False, given=False, request=(msg, fds))
                    pid, gen, window = self.forked, self.generation, self.window_spare
                except OSError as e:
                    self._without_helper(msg, fds[0], e)
                    self.served = True
                    return
            self.serving = pid
            if isinstance(msg.request, protocol.ConnectorRequest):
                self.connectors.add(pid)
            if self.oneshot and self.plan.namespaces and isinstance(msg.request, protocol.ExecRequest):
                self._keep_last(spare)
            elif self._serves_again() and isinstance(msg.request, protocol.ExecRequest):
                self._keep_serving(spare, pid, gen, window)
            else:
                spare.close()
            self.served = True
            if self.oneshot:
                # A spare given to the supervisor (booted ahead) was not used: the run
                # came here. It goes, or PID 1 would wait for it to end.
                self._drop_spare()
        finally:
            for fd in fds:
                os.close(fd)
        self.want_spare = not self.oneshot

    def _serves_again(self) -> bool:
        """Whether the helper given the request just taken may serve again: in a
        long-lived sandbox (an exec, as the helper alone knows on the supervisor's path:
        it serves again only after one), whether or not the request came in a burst: the
        next may follow its answer at once (the first of a burst follows a pause), and
        a helper that serves again is the next spare sooner than a fork of PID 1."""
        return SERVE_AGAIN and not self.oneshot

    def _dispatch_pending(self) -> None:
        """The request that waited for a helper to serve again, handed now as any."""
        if self.pending is not None:
            msg, fds, _until = self.pending
            self.pending = None
            self._give(msg, fds)

    def _again_due(self) -> float | None:
        """When the loop must act for a helper serving again: a request waiting for it
        gives up, or its offer, held back, goes to the supervisor."""
        dues = [self.pending[2]] if self.pending is not None else []
        if self.serving_again is not None and self.serving_again.offer:
            dues.append(self.serving_again.until)
        return min(dues, default=None)

    def _again_timed_out(self) -> None:
        now = time.monotonic()
        if self.pending is not None and now >= self.pending[2]:
            # The helper before it did not come back in time: one of its own.
            self._dispatch_pending()
        serving = self.serving_again
        if serving is not None and serving.offer and now >= serving.until:
            self._advertise_offer(serving)

    def _keep_serving(self, chan: socket.socket, pid: int, generation: int, window: bool) -> None:
        """Keep PID 1's end of the channel to the helper just given a request in a
        burst, and tell it so ("b"): once answered, it may serve again. The helper kept
        before is let be (it ends once answered, as ever)."""
        self._end_serving()
        serving = self.serving_again = again.Serving(chan, pid, generation, window)
        if self.poller is not None:
            with contextlib.suppress(KeyError):
                self.poller.unregister(chan)
            self.poller.register(chan, select.POLLIN)
        if not serving.tell(again.BURST):
            self._end_serving()

    def _end_serving(self) -> None:
        """Close the channel to the helper that might have served again: it ends. One
        told to go on holds only its fresh command's process (the stub), which ends
        with it: both count as ending (``_quiesce``)."""
        serving, self.serving_again = self.serving_again, None
        if serving is None:
            return
        if serving.going:
            self.let_go.add(serving.pid)
        for fd in serving.offer:
            os.close(fd)
        serving.offer = []
        if self.poller is not None:
            with contextlib.suppress(KeyError):
                self.poller.unregister(serving.chan)
        serving.chan.close()

    def _heard_again(self) -> None:
        """A word of the helper that may serve again (see ``again``)."""
        serving = self.serving_again
        assert serving is not None
        while True:
            word, fds = serving.heard()
            if word == b"?":
                return
            if word == again.TAKEN:
                continue  # it took the request that waited for it (``_offered``)
            if word == again.ASK and not serving.going and self._may_serve_again(serving):
                serving.going = serving.tell(again.GO)
                if serving.going:
                    # It is the next spare: none forked beside it.
                    self.want_spare = False
                    continue
            elif (
                word == again.AGAIN
                and serving.going
                and not serving.offer
                and fds
                and self._may_serve_again(serving)
            ):
                self._offered(serving, fds)
                return
            # Refused, or it ended: the next spare, and a request that waited, as ever.
            for fd in fds:
                os.close(fd)
            self._end_serving()
            self._dispatch_pending()
            self.want_spare = not self.oneshot and self.stopping is None
            return

    def _may_serve_again(self, serving: again.Serving) -> bool:
        return (
            serving.generation == self.generation
            and self.stopping is None
            and not self.held_back
            and (self.spare is None or self.pending is not None)
        )

    def _offered(self, serving: again.Serving, fds: list[int]) -> None:
        """The helper is ready again (``fds``: the supervisor's end of its new direct
        channel, and a copy of its new stub's): the request that waited is written to
        it; else the offer is held a moment (``again.HOLD``) for a request the
        supervisor sent before it could hear of it, then given to the supervisor."""
        serving.offer = fds
        serving.until = time.monotonic() + again.HOLD
        if self.pending is not None:
            msg, given, _until = self.pending
            self.pending = None
            self._hand_offer(serving, msg, given)

    def _hand_offer(self, serving: again.Serving, msg: protocol.Handoff, given: list[int]) -> None:
        """A request to the helper that offered itself again, written to its direct
        channel (it reads it as from the supervisor: "t"); told "b" again."""
        direct, *stub = serving.offer
        serving.offer = []
        serving.going = False
        for fd in stub:
            os.close(fd)
        self.serving = serving.pid
        if isinstance(msg.request, protocol.ConnectorRequest):
            self.connectors.add(serving.pid)
        try:
            with socket.socket(fileno=direct) as sock:
                wire.send(sock, msg, fds=given)
        except OSError:
            pass
        finally:
            for fd in given:
                os.close(fd)
        exec_ = isinstance(msg.request, protocol.ExecRequest)
        if not (self._serves_again() and exec_ and serving.tell(again.BURST)):
            self._end_serving()
        self.want_spare = not self.oneshot and self.stopping is None

    def _advertise_offer(self, serving: again.Serving) -> None:
        """No request came for the offer held back: the helper is the spare, given to
        the supervisor as any (``protocol.Spare``)."""
        if self.spare is not None:
            self._end_serving()  # one was forked meanwhile: a single spare at a time
            return
        fds, serving.offer = serving.offer, []
        self.serving_again = None
        self.spare, self.spare_pid, self.spare_gen = serving.chan, serving.pid, serving.generation
        self.window_spare = serving.window
        spare = protocol.Spare(pid=serving.pid, generation=serving.generation)
        try:
            wire.send(self.control, spare, fds=fds)
        except OSError:
            self._drop_spare()
            return
        finally:
            for fd in fds:
                os.close(fd)
        self.advertised = True

    def _without_helper(self, handoff: protocol.Handoff, conn: int, cannot: OSError) -> None:
        """No helper can be forked (the sandbox is at its pids limit). Listing and
        signalling processes are served here all the same — they are how a user makes
        room again — when the answer fits the connection's buffer at once (PID 1 never
        waits on a client); any other request is told why it cannot run."""
        reply: protocol.Message = protocol.error_message(
            fork_failed(cannot, self.plan, "start a helper for the request")
        )
        request = handoff.request
        try:
            if isinstance(request, protocol.SignalRequest):
                _signal(request.pid, request.signal, self.members)
                reply = protocol.Ok()
            elif isinstance(request, protocol.PsRequest):
                listing = protocol.ProcessList(items=_ps(handoff.spawned, self.members))
                if len(listing.encode()) <= INLINE_REPLY_MAX:
                    reply = listing
        except WarrenError as e:
            reply = protocol.error_message(e)
        with contextlib.suppress(OSError):
            os.set_blocking(conn, False)
            os.write(conn, wire.frame(reply))

    def _fork_spare(self, warm_up: bool) -> None:
        """The next spare, given to the supervisor, which hands it the next request
        itself (a wake-up of PID 1 less per exec, and with the exec stub ready, the
        command straight to its process): a long-lived sandbox's, and a one-shot's booted
        ahead for its run (a fresh one-shot forks none: its run comes with its launch)."""
        self.spare, direct, stub = self._fork_helper(warm_up, given=not self.oneshot or self.ahead)
        self.spare_pid, self.spare_gen = self.forked, self.generation
        self.advertised = False
        if self.stopping is not None:
            # Asked to stop while it was forked (SIGTERM's handler runs between two steps
            # of this one): the stop's signal may have missed it, and its channels held
            # open would keep it, and PID 1 with it, for the whole grace (``STOP_GRACE``).
            self._drop_spare()
            for sock in (direct, stub):
                if sock is not None:
                    sock.close()
            return
        if direct is None:
            return
        with direct, stub or contextlib.nullcontext():
            try:
                given = [direct.fileno(), *([stub.fileno()] if stub else [])]
                spare = protocol.Spare(pid=self.spare_pid, generation=self.generation)
                wire.send(self.control, spare, fds=given)
            except OSError:
                # Not given: it would wait on an end nobody holds. It goes; the next
                # request forks its own (PID 1's channel is failing: PID 1 ends soon).
                self._drop_spare()
                return
        self.advertised = True
        if self.poller is not None:
            self.poller.register(self.spare, select.POLLIN)  # "taken", or its end

    def _window(self) -> Window | None:
        """The hard-link walk's window, where PID 1's broker keeps one (``broker.window``)."""
        return self.broker.window if self.broker is not None else None

    def _in_window(self) -> bool:
        """Whether that window is open: the walk not done (or failed)."""
        window = self._window()
        return window is not None and window.open

    def _stub_pair(self) -> tuple[socket.socket, socket.socket] | None:
        """The channel to a given spare's command process, through which the supervisor
        may hand the exec stub a command itself; None where there is no stub. Also while
        the hard-link walk's window is open (the stub then has the window's filter): the
        supervisor gives it every stdio descriptor, ``/dev/null`` included, so it opens
        nothing for writing, the one call of its that would wait for the walk
        (``shim.stub_request``)."""
        if execstub.loaded() is None:
            return None
        return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)

    def _fork_helper(
        self, warm_up: bool, given: bool, request: tuple[protocol.Handoff, list[int]] | None = None
    ) -> tuple[socket.socket, socket.socket | None, socket.socket | None]:
        """A helper: PID 1's end of its channel and, ``given``, the supervisor's end of
        the one it takes a request on directly, and (where the exec stub is loaded) a
        copy of the helper's end of its channel to its command's process, through which
        the supervisor may hand that process a command itself (``Launcher.launched``).
        What PID 1 holds for other requests never comes to the helper by the fork
        (``_keep_own``); ``request``, the one it is forked for, with its descriptors, does
        (they are kept, the rest closed), and nothing is sent to it."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        direct = inside = None
        pair: tuple[socket.socket, socket.socket] | None = None
        window = self._window()
        if given:
            direct, inside = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            pair = self._stub_pair()
        # SIGTERM (stop) stays blocked across the fork until the child has dropped PID
        # 1's handler: a helper must die of it, never run the stop sequence itself.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

        def child() -> NoReturn:
            ours.close()
            if direct is not None:
                direct.close()
            self._helper(theirs, warm_up, inside, pair, request)

        try:
            if window is not None and window.open:
                # The hard-link walk is still under way (or failed): forked on the
                # window's thread, with the window's filter (``broker.window``).
                pid = window.fork(child)
                self.window_spare = True
            else:
                pid = os.fork()
                self.window_spare = False
                if pid == 0:
                    child()
        except OSError:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            for sock in (ours, theirs, direct, inside, *(pair or ())):
                if sock is not None:
                    sock.close()
            raise
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        theirs.close()
        if inside is not None:
            inside.close()
        stub = None
        if pair is not None:
            stub = pair[0]
            pair[1].close()
        self.helpers.add(pid)
        self.forked = pid
        # Its calls are warren's from here on (the broker passes those of ``helpers``): it
        # makes none before this word (``_registered``).
        with contextlib.suppress(OSError):
            ours.send(REGISTERED, socket.MSG_NOSIGNAL)
        return ours, direct, stub

    def _helper(
        self,
        from_pid1: socket.socket,
        warm_up: bool,
        direct: socket.socket | None,
        pair: tuple[socket.socket, socket.socket] | None = None,
        first: tuple[protocol.Handoff, list[int]] | None = None,
    ) -> NoReturn:
        """A spare helper: ready (its command's process forked too), then serves the one
        request PID 1 hands it, or (``direct``) the supervisor; ``first``: the request
        it was forked for, in hand (``_fork_helper``)."""
        code = 0
        conn: socket.socket | None = None
        request: protocol.Message | None = None
        try:
            signal.set_wakeup_fd(-1)
            for sig in (
                signal.SIGCHLD,
                signal.SIGTERM,
                signal.SIGINT,
                signal.SIGHUP,
                signal.SIGPIPE,
                KILL_NOW,
            ):
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            self._keep_own(from_pid1, direct, pair, first[1] if first is not None else [])
            _sys.prctl(PR_SET_CHILD_SUBREAPER, 1)
            if not _registered(from_pid1):
                os._exit(0)  # PID 1 is gone: the sandbox ends, and a client hears why from it
            self.in_window = self._in_window()  # as it was at the fork
            launcher: Launcher | None = None
            cannot: OSError | None = None
            try:
                launcher = Launcher(self.plan, self.ruleset, warm_up, pair)
            except OSError as e:
                cannot = e  # at a limit: said to the request that comes
            if warm_up:
                warm(self.plan)
            while True:
                # What this helper holds of its own: whatever a request brings or leaves
                # open beyond it is closed before it serves again (never, in a one-shot
                # sandbox: no listing on a run's path).
                kept: set[int] = set()
                if not self.oneshot:
                    own = (direct, launcher.sock if launcher else None)
                    kept = again.open_fds() - {s.fileno() for s in own if s is not None}
                    kept -= set(first[1] if first is not None else [])  # the request's own
                got = first if first is not None else _await_handoff(from_pid1, direct)
                if got is None:
                    if launcher is not None:
                        launcher.discard()
                    os._exit(0)
                handoff, fds = got
                request = handoff.request
                # A one-shot's run: the sandbox ends with its command, and PID 1 hears
                # here when all of it is gone (``shim.end_sandbox``). A long-lived
                # sandbox's helper keeps the channel: PID 1 may say "serve again".
                last = None
                if self.oneshot and self.plan.namespaces and isinstance(request, protocol.ExecRequest):
                    last = from_pid1
                elif self.oneshot:
                    from_pid1.close()
                conn = socket.socket(fileno=fds[0])
                first = None  # taken: its connection is ``conn`` from here
                conn.setblocking(True)
                mine = len(fds) - len(handoff.extra)
                extra = dict(zip(handoff.extra, fds[mine:], strict=True))
                if not isinstance(request, (protocol.ExecRequest, protocol.SpawnRequest)):
                    if launcher is not None:
                        launcher.discard()
                elif launcher is None:
                    assert cannot is not None
                    if handoff.launched:
                        raise fork_failed(cannot, self.plan, "start the command")
                    # This helper was forked ahead while the sandbox was at a limit (a
                    # command before still ending, or its processes not yet reaped by
                    # PID 1): there may be room now. Asked again (a moment more for PID
                    # 1's reaping at the pids limit), then said.
                    launcher = _launcher_again(self.plan, self.ruleset)
                goes_on = None
                if not self.oneshot and isinstance(request, protocol.ExecRequest) and kept:
                    goes_on = _GoesOn(from_pid1)
                self._run(handoff, conn, fds[1:mine], extra, launcher, last, goes_on)
                if goes_on is None or not goes_on.asked:
                    break
                conn.close()
                if direct is not None:
                    direct.close()
                ready = self._serve_again(from_pid1, kept)
                if ready is None:
                    break
                launcher, direct = ready
                conn = request = None
        except WarrenError as e:
            if conn is not None:
                with contextlib.suppress(OSError):
                    wire.send(conn, protocol.error_message(e))
            code = 125
        except BaseException as e:
            if isinstance(e, OSError) and e.errno == errno.ENOSYS and _pid1_ends(PID1_END_WAIT):
                # A call of ours the broker held (the hard-link walk's window) let go as
                # PID 1 went: the sandbox is ending (the walk found a file linked from
                # outside, or a stop), and its client hears why from the supervisor, not a
                # "bug" from here. The namespace's end kills this helper meanwhile.
                os._exit(1)
            if conn is None and direct is None:
                # Failed before its request came, which PID 1 alone gives it (a helper
                # forked for a request, a one-shot's spare): take the request, so that its
                # client hears why instead of a connection lost. (A spare given to the
                # supervisor just ends: the next request goes to another helper.)
                with contextlib.suppress(BaseException):
                    got = first if first is not None else _await_handoff(from_pid1, None)
                    if got is not None:
                        conn = socket.socket(fileno=got[1][0])
                        request = got[0].request
                        for fd in got[1][1:]:
                            os.close(fd)
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.setblocking(True)
                    wire.send(
                        conn,
                        protocol.error_message(
                            SandboxError(
                                f"sandbox helper failed: {e!r}",
                                operation=request.TAG if request is not None else "handoff",
                                hint="this is a bug in warren; please report it with the command you ran",
                            )
                        ),
                    )
            code = 1
        os._exit(code)

    def _keep_own(
        self,
        from_pid1: socket.socket,
        direct: socket.socket | None,
        pair: tuple[socket.socket, socket.socket] | None,
        request: list[int],
    ) -> None:
        """In a new helper: every descriptor closed but its own (its channels, those of
        the ``request`` it was forked for, the Landlock ruleset, the exec stub's program)
        and stdio. The fork copied all PID 1 held at that moment, which is more than PID 1
        itself keeps: its control channel and broker, what it holds for other helpers and
        requests (a helper that may serve again, a request waiting for one, a one-shot's
        run), and what its broker's thread holds for a moment on a command's behalf (a
        copy of a command's socket while it connects it, ``pidfd_getfd``). A copy kept
        here would keep a channel open that its other end waits on to close (a stdin
        pipe's reader, and its writer never sees the process close it), or a command's
        connection in a process that is not the command (``warren net`` would name this
        helper as its process). Closed by what is kept, not by a list of what PID 1 may
        hold: nothing it adds later stays open here by being forgotten."""
        # Its Python objects let go of their numbers first: closed below, and a number
        # reused here must never be closed again by their finalizers. Whatever else holds
        # a descriptor of PID 1's is never finalized here either: every object there is
        # at the fork (garbage PID 1 had not collected yet included: a socket in a cycle
        # an exception made) is frozen, out of this process's collections.
        gc.freeze()
        for sock in (self.control, *([self.spare] if self.spare is not None else [])):
            sock.detach()
        keep = [from_pid1.fileno(), *(s.fileno() for s in (direct, *(pair or ())) if s is not None), *request]
        if self.ruleset is not None:
            keep.append(self.ruleset)
        stub = execstub.loaded()
        if stub is not None:
            keep.append(stub)
        _sys.close_all_but(*keep)

    def _serve_again(self, from_pid1: socket.socket, kept: set[int]) -> tuple[Launcher, socket.socket] | None:
        """Once an exec is answered (``_GoesOn``): everything the request
        brought closed, PID 1 asked, the command's process forked again and offered
        (``again``). The new launcher and the helper's end of the new direct channel;
        None when PID 1 said no or a step failed (the helper then ends, as ever)."""
        again.close_others(kept)
        if not again.went(from_pid1):
            return None
        direct, inside = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        pair = self._stub_pair()
        try:
            launcher = Launcher(self.plan, self.ruleset, False, pair)
        except OSError:
            for sock in (direct, inside, *(pair or ())):
                sock.close()
            return None
        with direct:
            offered = again.offer(from_pid1, [direct.fileno(), *([launcher.sock.fileno()] if pair else [])])
        if not offered:
            launcher.discard()
            inside.close()
            return None
        return launcher, inside

    def _run(
        self,
        handoff: protocol.Handoff,
        conn: socket.socket,
        fds: list[int],
        extra: dict[str, int],
        launcher: Launcher | None,
        last: socket.socket | None = None,
        goes_on: _GoesOn | None = None,
    ) -> None:
        req = handoff.request  # of the kinds PID 1 serves: the Handoff's decoding checked that
        if isinstance(req, (protocol.ExecRequest, protocol.SpawnRequest)):
            assert launcher is not None
            spawn_id = handoff.spawn_id if isinstance(req, protocol.SpawnRequest) else None
            stdin = isinstance(req, protocol.SpawnRequest) and req.stdin
            launched = handoff.before if handoff.launched and isinstance(req, protocol.ExecRequest) else None
            shim = Shim(self.plan, launcher, conn, req.command, fds, spawn_id, extra, stdin, launched, last)
            shim.goes_on = goes_on
            if self.in_window:
                shim.ends = _ends_with_pid1
            shim.run()
        elif isinstance(req, protocol.FileRequest):
            payload = wire.recv_payload(conn, handoff.payload)
            harden.harden(self.plan, self.ruleset)
            fileops.handle(conn, req, payload, self.plan.workspace)
        elif isinstance(req, protocol.PsRequest):
            wire.send(conn, protocol.ProcessList(items=_ps(handoff.spawned, self.members)))
        elif isinstance(req, protocol.SignalRequest):
            _signal(req.pid, req.signal, self.members)
            wire.send(conn, protocol.Ok())
        elif isinstance(req, protocol.ConnectorRequest):
            _connector(conn)
        else:
            assert_never(req)


class _GoesOn:
    """Asked by the shim just before its exec's answer is sent: whether this helper serves
    again (PID 1 said it may, "b", and nothing of the command is left), so that it
    does not yield its core as a helper that exits does; then, the answer sent, it
    asks PID 1 at once ("r": the next request may be on its way to PID 1 already,
    and waits for this helper only if PID 1 has heard this first)."""

    def __init__(self, from_pid1: socket.socket) -> None:
        self.from_pid1 = from_pid1
        self.said = False
        self.asked = False

    def __call__(self, answered: bool) -> bool:
        if answered:
            self.asked = self.said and again.ask(self.from_pid1)
            return self.asked
        self.said = again.told_burst(self.from_pid1) and again.alone()
        return self.said


# What PID 1 says to a helper it forked once the broker knows it as warren's
# (``Init._fork_helper``).
REGISTERED = b"k"


def _registered(from_pid1: socket.socket) -> bool:
    """In a new helper, first: wait for PID 1's word that its pid is among the helpers
    the broker passes the calls of. Until then a call of its that the broker judges (a
    send of descriptors: to its command's process, or ``shim.warm``'s) would be judged
    as a command's: a helper forked with its request in hand had some refused EPERM
    (found by a gate: 50 concurrent execs). False when PID 1 is gone."""
    try:
        return from_pid1.recv(1) == REGISTERED
    except OSError:
        return False


def _said_taken(spare: socket.socket) -> bool:
    """Whether a given spare said it took the supervisor's request ("t"), rather than
    ending without one."""
    try:
        return spare.recv(1, socket.MSG_DONTWAIT) == b"t"
    except OSError:
        return False


# Seconds a helper whose call failed with ENOSYS waits to know whether PID 1 is ending
# (``_pid1_ends``); a helper whose PID 1 goes on reports the failure after it.
PID1_END_WAIT = 1.0
# ... and one whose command failed, started in the hard-link walk's window: PID 1 closes
# its broker (the failed call's ENOSYS) just before it exits. Short, since a command
# that failed on its own, early in a large workspace's life, has its answer this late.
COMMAND_END_WAIT = 0.05


def _ends_with_pid1() -> bool:
    """Whether this helper's PID 1 is ending (``Shim.ends``)."""
    return _pid1_ends(COMMAND_END_WAIT)


def _pid1_ends(within: float) -> bool:
    """Whether this helper's parent, PID 1, exits within ``within`` seconds (gone
    already included). A call the broker held fails with ENOSYS once the broker's
    listener closes, which PID 1's exit does just before it ends the namespace."""
    try:
        fd = os.pidfd_open(os.getppid())
    except OSError as e:
        return e.errno == errno.ESRCH
    try:
        return wire.readable(fd, within)
    finally:
        os.close(fd)


def _await_handoff(
    from_pid1: socket.socket, direct: socket.socket | None
) -> tuple[protocol.Handoff, list[int]] | None:
    """In a spare helper: the one request, from PID 1 or (``direct``) the supervisor;
    None when neither will give one. A request from the supervisor is said to PID 1
    ("t": fork the next spare). When PID 1 lets the spare go (its channel ends), the
    supervisor's end is shut for reading first, so a request it sent before is still
    served and none can come after (its write fails, and it asks PID 1 instead)."""
    try:
        if direct is None:
            handoff, _, fds = wire.recv(
                from_pid1, (protocol.Handoff,), max_payload=0, max_fds=wire.HANDOFF_MAX_FDS
            )
            assert isinstance(handoff, protocol.Handoff)
            return handoff, fds
        poller = select.poll()
        poller.register(direct, select.POLLIN)
        poller.register(from_pid1, select.POLLIN)
        # Waiting as SCHED_BATCH: its wake-up does not preempt the supervisor, which
        # gives the command to the stub right after this request (the helper's own
        # Python ran first, about half a millisecond, before the command could start).
        # Back to the normal policy before anything else: what it forks, and the
        # command, run as any process does (both calls pass the filter: pid 0).
        _scheduled(os.SCHED_BATCH)
        try:
            ready = {fd for fd, _ in poller.poll()}
        finally:
            _scheduled(os.SCHED_OTHER)
        if direct.fileno() not in ready:
            direct.shutdown(socket.SHUT_RD)
        handoff, _, fds = wire.recv(direct, (protocol.Handoff,), max_payload=0, max_fds=wire.HANDOFF_MAX_FDS)
        assert isinstance(handoff, protocol.Handoff)
        with contextlib.suppress(OSError):
            # Not a signal if PID 1 let this spare go meanwhile (SIGPIPE is this
            # process's default): the request came first, and it is served.
            from_pid1.send(b"t", socket.MSG_NOSIGNAL)
        return handoff, fds
    except (wire.ConnectionClosed, OSError):
        return None


def _scheduled(policy: int) -> None:
    """This process's scheduling policy, SCHED_BATCH or SCHED_OTHER (which an
    unprivileged process may switch between at its nice value); left as it is where
    the kernel refuses."""
    with contextlib.suppress(OSError):
        os.sched_setscheduler(0, policy, os.sched_param(0))


def _launcher_again(plan: Plan, ruleset: int | None) -> Launcher:
    """The command's process, forked at the request by a helper whose own attempt, when
    it was forked ahead, met a limit: a few tries 50 ms apart at the pids limit (the
    processes of a command that just ended may still be waiting for PID 1 to reap
    them), then the limit is said."""
    for attempt in range(4):
        try:
            return Launcher(plan, ruleset, False)
        except OSError as e:
            if e.errno != errno.EAGAIN or attempt == 3:
                raise fork_failed(e, plan, "start the command") from None
            time.sleep(0.05)
    raise AssertionError("unreachable")


def fork_failed(e: OSError, plan: Plan, what: str) -> WarrenError:
    """A fork refused in the sandbox: at its pids limit (EAGAIN) or its memory limit
    (ENOMEM), said as such."""
    limits = plan.limits.limits if plan.limits is not None else None
    if e.errno == errno.EAGAIN:
        which = f"pids limit ({limits.pids})" if limits and limits.pids else "process limit"
        return LimitReached.from_os(
            e,
            f"cannot {what}: the sandbox is at its {which}",
            "fork",
            hint="see what runs with `warren ps NAME` / `warren stats NAME`; end some of it, or create the "
            "sandbox with a higher --pids",
        )
    if e.errno == errno.ENOMEM:
        return LimitReached.from_os(
            e,
            f"cannot {what}: the sandbox is out of memory",
            "fork",
            hint="see `warren stats NAME`; end what holds memory, or create the sandbox with more --memory",
        )
    return SandboxError.from_os(e, f"cannot {what}: {e.strerror}", "fork")


def _ps(spawned: dict[str, str], members: procs.Members) -> list[protocol.ProcInfo]:
    out = []
    # Every process, warren's own (PID 1, helpers, a command's process waiting as the
    # exec stub) included: ``warren ps`` shows those as one word.
    for pid, ppid, state in members.table():
        argv = procs.cmdline(pid)
        if not argv:
            continue  # gone, or a zombie (it has no command line left): nothing to show or signal
        out.append(
            protocol.ProcInfo(
                pid=pid, ppid=0 if ppid <= 1 else ppid, state=state, argv=argv, spawn_id=spawned.get(str(pid))
            )
        )
    return out


def _signal(pid: int, sig: int, members: procs.Members) -> None:
    """Signal a process of the sandbox (its group when it leads one); a pid that is not
    one of the sandbox's own processes (0, 1, warren's helpers, none) is ProcessNotFound."""
    if not 2 <= pid <= 1 << 22 or procs.is_warren(pid) or not members.has(pid):  # 1 << 22: PID_MAX_LIMIT
        raise _no_process(pid)
    if not 1 <= sig < signal.NSIG:
        raise SandboxError(
            f"no such signal: {sig}", operation="signal", hint="e.g. 15 (SIGTERM), 9 (SIGKILL)"
        )
    if not members.own_namespace:
        if members.signal_group(pid, sig) or procs.signal_member(pid, sig, members.root):
            return
        raise _no_process(pid)
    try:
        os.killpg(pid, sig)  # commands lead their own session: signal the whole group
    except ProcessLookupError:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            raise _no_process(pid) from None


def _no_process(pid: int) -> ProcessNotFound:
    return ProcessNotFound(
        f"no such process in the sandbox: {pid}",
        operation="signal",
        hint="list them with `warren ps NAME` / Sandbox.processes() (a process that ended is gone)",
    )


def _connector(conn: socket.socket) -> None:
    """For the network helper: sockets connected to 127.0.0.1:PORT inside."""
    while True:
        try:
            msg, _, fds = wire.recv(conn, (protocol.ConnectRequest,), max_payload=0)
        except (wire.ConnectionClosed, OSError):
            return
        for fd in fds:
            os.close(fd)
        assert isinstance(msg, protocol.ConnectRequest)
        inside = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            inside.connect(("127.0.0.1", msg.port))
        except OSError:
            wire.send(conn, protocol.Connected(ok=False))
        else:
            wire.send(conn, protocol.Connected(ok=True), fds=[inside.fileno()])
        finally:
            inside.close()
