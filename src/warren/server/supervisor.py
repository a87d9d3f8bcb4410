"""The supervisor: one small process per user that plans and holds every sandbox.

Clients (the CLI, the library) send it a policy *spec* and their context; it resolves
the policy for that caller, plans with the host facts it keeps warm, launches the
sandbox through the one launch path (``launch``), and either answers itself (create,
list, stop, logs) or hands the client's connection to the sandbox's PID 1 (exec,
spawn, files, processes), which forks a helper to serve it. A one-shot ``run`` is a
sandbox that serves exactly one exec: the supervisor relays its start and exit so it
can tear the sandbox down (network helper, pasta, the ancestor guard) before telling
the client the command's status.

Security: the listening socket is abstract (only the host's network namespace can
name it; every sandbox has its own), every peer is verified (``peer``), every message
is typed and bounded (``protocol``, ``wire``), and nothing here ever waits on a client:
headers are assembled without blocking and with a deadline, replies are queued.
A malformed message costs its sender the connection and nothing else.

Single-threaded on purpose: PID 1s get a parent-death signal, which fires when the
*thread* that cloned them exits. If this process dies, every sandbox dies with it;
the next supervisor records why (``registry.orphaned``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import selectors
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import protocol, wire
from .._core import cgroups, clone
from ..errors import (
    ProtocolError,
    SandboxDead,
    SandboxError,
    SandboxExists,
    SandboxNotFound,
    SandboxPaused,
    SetupError,
    WarrenError,
)
from ..net import log as netlog
from ..net.pasta import Pasta
from ..plan import CallerFacts, Plan, make_plan, tmpdir
from ..plan.facts import gather, paths_of
from ..plan.mounts import strip_nested, within
from ..policy import build, config
from ..policy.spec import from_mapping
from . import follow, gitkeeper, launch, links, netd, pause, peer, registry, spawns, statedir, stdin, usage

HEADER_DEADLINE = 10.0  # a client has this long to send a whole request header
MAX_CLIENTS = 1024
ACCEPT_BATCH = 64  # connections accepted per turn of the loop: the others' requests are read between
LINKS_FILE = "links.cache"  # the hardlink scan's memory, for the next supervisor
STOP_KILL_AFTER = 3.0  # after SIGTERM, PID 1's grace (2 s) and a margin
NETLOG_MAX = 5000  # events in one reply (the newest)
GIT_SYNC_EVERY = 0.5  # seconds between rounds of keeping live sandboxes' git directories in step
_R, _W = selectors.EVENT_READ, selectors.EVENT_WRITE
_SUPERVISOR_REQUESTS = (
    protocol.RunRequest,
    protocol.PlanRequest,
    protocol.CreateRequest,
    protocol.GetRequest,
    protocol.ListRequest,
    protocol.StopRequest,
    protocol.ExecRequest,
    protocol.SpawnRequest,
    protocol.PsRequest,
    protocol.SignalRequest,
    protocol.FileRequest,
    protocol.ExposeRequest,
    protocol.NetLogRequest,
    protocol.StatsRequest,
    protocol.ProcessRequest,
    protocol.PauseRequest,
    protocol.StdinRequest,
    protocol.ShutdownRequest,
)
# Requests that are not a use of the sandbox: they do not reset its idle timeout.
_NOT_USE = (protocol.GetRequest, protocol.ListRequest, protocol.StatsRequest, protocol.NetLogRequest)


def _client_cgroups(sock: socket.socket) -> tuple[str | None, WarrenError | None]:
    """The connected peer's /proc/PID/cgroup, read through the pidfd SO_PEERPIDFD gives
    (``cgroups.peer_cgroups``), or why it cannot be had."""
    pid, _uid, _gid = wire.peer_creds(sock)
    pidfd = wire.peer_pidfd(sock)
    if pidfd is None and pid > 0:
        # Before Linux 6.5: pinned at accept, as ``peer.verify`` does.
        with contextlib.suppress(OSError):
            pidfd = os.pidfd_open(pid)
    if pidfd is None:
        return None, SandboxError(
            "cannot tell which cgroups the client is in: it is gone or in another pid namespace",
            operation="cgroup",
            hint="sandboxes are placed in their caller's cgroups; ask again from a live process",
        )
    try:
        return cgroups.peer_cgroups(pid, pidfd), None
    except WarrenError as e:
        return None, e
    finally:
        os.close(pidfd)


class Client:
    def __init__(self, sock: socket.socket, uid: int, gid: int) -> None:
        self.sock = sock
        self.uid, self.gid = uid, gid
        # The peer's cgroups as the kernel has them at accept (read through the pidfd
        # of the process that connected): its sandboxes go beneath them.
        self.cgroups, self.cgroups_error = _client_cgroups(sock)
        self.inbox = wire.Inbox(sock)
        self.outbox = wire.Outbox(sock)
        self.deadline: float | None = time.monotonic() + HEADER_DEADLINE
        self.box: Box | None = None  # the one-shot sandbox running this client's command
        self.busy = False  # its request is being served: it may only wait or hang up
        self.closing = False  # close once the outbox is flushed
        self.stdin: protocol.StdinRequest | None = None  # its payload is still arriving
        self.stdin_len = 0


@dataclass
class Run:
    client: Client
    command: protocol.Command
    stdio: list[int]
    events: int | None
    relay: socket.socket | None = None
    relay_inbox: wire.Inbox | None = None
    relay_outbox: wire.Outbox | None = None
    exited: protocol.Exited | None = None
    answered: bool = False


@dataclass
class Netd:
    pid: int
    pidfd: int
    ctl: socket.socket


@dataclass
class Box:
    name: str
    id: str
    plan: Plan
    launched: launch.Launched
    oneshot: bool
    inbox: wire.Inbox
    outbox: wire.Outbox
    created: float = field(default_factory=time.time)
    ready: bool = False
    creator: Client | None = None
    run: Run | None = None
    failure: WarrenError | None = None
    netd: Netd | None = None
    pasta: Pasta | None = None
    stoppers: list[Client] = field(default_factory=list)
    remove: bool = False
    kill_at: float | None = None
    search_path: str | None = None  # the caller's PATH: where helper programs (pasta) are found
    roots: dict[str, follow.Identity] = field(default_factory=dict)  # writable roots as launched
    ns: tuple[int, int] | None = None  # fds of the sandbox's user and mount namespaces
    git: gitkeeper.Lease | None = None  # its repositories (server.gitkeeper)
    paused: pause.Paused | None = None  # how it was paused, while it is
    last_active: float = field(default_factory=time.time)  # a request reached it, or an exec ended
    active: set[int] = field(default_factory=set)  # read ends of running execs' "active" pipes
    stopped_why: str = ""  # the supervisor stopped it on its own (idle timeout)

    @property
    def pid(self) -> int:
        return self.launched.pid


class Supervisor:
    def __init__(self, root: str | None, listener: socket.socket | None, idle: float) -> None:
        self.root = root
        self.listener = listener
        self.idle = idle
        self.registry = registry.Registry(root) if root is not None else None
        self.start_time = registry.process_start_time(os.getpid()) or 0
        self.sel = selectors.DefaultSelector()
        self.clients: dict[Client, None] = {}  # oldest first
        self.boxes: dict[str, Box] = {}  # long-lived, by name
        self.oneshots: dict[str, Box] = {}  # by id
        self.by_pid: dict[int, Box] = {}
        self.netd_pids: set[int] = set()
        self.idle_since = time.monotonic()
        self.shutdown = False
        self.notes: dict[str, tuple[float, int]] = {}  # rate-limited log lines: kind -> (last, dropped)
        self.links = links.LinkScanner()
        self.git = gitkeeper.GitKeeper()
        self.git_sync_at = 0.0
        if root is not None:
            self.links.load(os.path.join(root, LINKS_FILE))
        self.wake_r, self.wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.cgroup_records = os.path.join(root, "cgroups") if root is not None else None
        self.tmp_records = os.path.join(root, "tmpdirs") if root is not None else None
        self.stdin_pipes = stdin.StdinPipes(root, self.sel) if root is not None else None
        if self.registry is not None:
            self.registry.orphaned(os.getpid(), self.start_time)
        if self.cgroup_records is not None:
            cgroups.sweep(self.cgroup_records)
        if self.tmp_records is not None:
            launch.sweep_scratch(self.tmp_records)

    # --- the loop ----------------------------------------------------------------------

    def serve(self) -> None:
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self._on_term)
        for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_IGN)
        if self.listener is not None:
            self.listener.setblocking(False)
            self.sel.register(self.listener, _R, ("accept", None))
        self.sel.register(self.wake_r, _R, ("wake", None))
        while True:
            for key, mask in self.sel.select(0.25):
                kind, obj = key.data
                try:
                    self._event(kind, obj, mask)
                except Exception as e:  # a bug must not take every sandbox down
                    print(f"warren supervisor: {kind}: {e!r}", file=sys.stderr, flush=True)
                    if isinstance(obj, Client):
                        self._drop(obj)
            self._reap()
            self._timers()
            if self._done():
                return

    def _event(self, kind: str, obj: object, mask: int) -> None:
        if kind == "accept":
            self._accept()
        elif kind == "wake":
            with contextlib.suppress(BlockingIOError):
                while os.read(self.wake_r, 4096):
                    pass
        elif kind == "client":
            assert isinstance(obj, Client)
            self._on_client(obj, mask)
        elif kind == "control":
            assert isinstance(obj, Box)
            self._on_control(obj, mask)
        elif kind == "relay":
            assert isinstance(obj, Box)
            self._on_relay(obj, mask)
        elif kind == "active":
            assert isinstance(obj, tuple)
            self._exec_ended(*obj)
        elif kind == "stdin":
            assert isinstance(obj, stdin.Pipe) and self.stdin_pipes is not None
            self.stdin_pipes.flush(obj)
        elif kind == "pasta":
            assert isinstance(obj, Box)
            self.sel.unregister(key_fd(obj.pasta))
            if not obj.ready:
                self._fail(obj, obj.pasta.failure() if obj.pasta else SetupError("pasta ended"))

    def _done(self) -> bool:
        now = time.monotonic()
        if self.boxes or self.oneshots or self.clients:
            self.idle_since = now
            return False
        if self.listener is None:  # inline: the one client has gone
            return True
        return self.shutdown or now - self.idle_since > self.idle

    def _on_term(self, _signum: int, _frame: object) -> None:
        self.shutdown = True
        for box in [*self.boxes.values(), *self.oneshots.values()]:
            self._terminate(box)

    def _timers(self) -> None:
        now = time.monotonic()
        for c in list(self.clients):
            if c.deadline is not None and now > c.deadline:
                self._drop(c)  # too slow to send its request: it holds up nobody
        for box in [*self.boxes.values(), *self.oneshots.values()]:
            if box.kill_at is not None and now > box.kill_at:
                self._signal(box, signal.SIGKILL)
                box.kill_at = None
        if now >= self.git_sync_at:
            self.git_sync_at = now + GIT_SYNC_EVERY
            self.git.tick()
        for box in list(self.boxes.values()):
            self._idle_check(box)
        if self.stdin_pipes is not None:
            self.stdin_pipes.sweep()

    def _idle_check(self, box: Box) -> None:
        """Stop a sandbox nobody used for its idle timeout (an exec still running is use;
        background processes are not)."""
        limit = box.plan.limits.limits.idle_timeout if box.plan.limits else None
        if not limit or not box.ready or box.kill_at is not None or box.active:
            return
        idle = time.time() - box.last_active
        if idle < limit:
            return
        from ..policy.limits import show_duration

        box.stopped_why = f"stopped after {show_duration(limit)} without a request (idle timeout)"
        self._terminate(box)

    # --- clients -------------------------------------------------------------------------

    def _accept(self) -> None:
        """Take new connections, a batch per turn. At ``MAX_CLIENTS`` the oldest client
        that has sent nothing (its request head is not complete and no byte waits
        unread) makes room and is told why: a flood of idle connections cannot lock a
        client out, since a client sends its request as soon as it connects. When none
        can make room the new connection is told so, and closed."""
        assert self.listener is not None
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # out of descriptors: the client retries
            why = peer.verify(sock)
            if why is not None:
                self._note("refused", f"refused a connection: {why}")
                sock.close()
                continue
            if len(self.clients) >= MAX_CLIENTS and not self._make_room():
                self._note("full", f"refused a connection: {MAX_CLIENTS} clients, all busy")
                _tell(sock, _full(f"all {MAX_CLIENTS} of its connections are busy"))
                continue
            _pid, uid, gid = wire.peer_creds(sock)
            self.add_client(sock, uid, gid)

    def _make_room(self) -> bool:
        for c in self.clients:
            if c.deadline is None or c.busy or c.box is not None or c.stdin is not None:
                continue
            try:
                if c.sock.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK):
                    continue  # its request is there, to be read this turn
            except OSError:
                pass  # nothing waits (BlockingIOError), or it is gone: either way it goes
            self._note("evicted", f"closed an idle connection to make room ({MAX_CLIENTS} clients)")
            with contextlib.suppress(OSError, WarrenError):
                c.sock.send(
                    wire.frame(_full("this connection sent nothing and made room")), socket.MSG_DONTWAIT
                )
            self._drop(c)
            return True
        return False

    def _note(self, kind: str, line: str) -> None:
        """A line in the log, at most one per kind every 5 seconds (with a count)."""
        now = time.monotonic()
        last, dropped = self.notes.get(kind, (-1e9, 0))
        if now - last < 5:
            self.notes[kind] = (last, dropped + 1)
            return
        self.notes[kind] = (now, 0)
        more = f" (and {dropped} more since the last such line)" if dropped else ""
        print(f"warren supervisor: {line}{more}", file=sys.stderr, flush=True)

    def add_client(self, sock: socket.socket, uid: int, gid: int) -> Client:
        c = Client(sock, uid, gid)
        self.clients[c] = None
        self.sel.register(sock, _R, ("client", c))
        return c

    def _drop(self, c: Client, handed_off: bool = False) -> None:
        """Forget a client; a one-shot sandbox running its command is killed. A
        connection handed to a sandbox is only let go of: its helper reads on."""
        if c not in self.clients:
            return
        self.clients.pop(c, None)
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(c.sock)
        c.inbox.close_fds()
        c.outbox.close()
        # Unread input makes the kernel reset the connection, and the client would
        # lose the error it was just sent: discard a bounded amount first.
        with contextlib.suppress(OSError):
            for _ in range(0 if handed_off else 16):
                if not c.sock.recv(65536, socket.MSG_DONTWAIT):
                    break
        c.sock.close()
        if c.box is not None and c.box.run is not None and not c.box.run.answered:
            c.box.run.answered = True
            self._signal(c.box, signal.SIGKILL)

    def _reply(
        self, c: Client, message: protocol.Message, payload: bytes = b"", fds: list[int] | None = None
    ) -> None:
        """Queue ``message`` and close the connection once it is written."""
        c.outbox.put(message, payload, fds or [])
        c.closing = True
        c.deadline = None
        self._flush(c)

    def _flush(self, c: Client) -> None:
        try:
            done = c.outbox.flush()
        except OSError:
            self._drop(c)
            return
        if done and c.closing:
            self._drop(c)
        elif c in self.clients:
            self.sel.modify(c.sock, _R if done else _R | _W, ("client", c))

    def _on_client(self, c: Client, mask: int) -> None:
        if mask & _W:
            self._flush(c)
            if c not in self.clients:
                return
        if not mask & _R:
            return
        if c.box is not None:
            self._from_running_client(c)
            return
        if c.stdin is not None:
            self._stdin_payload(c)
            return
        if c.busy or c.closing:
            # Nothing more is expected: a client that hangs up or keeps talking is dropped.
            try:
                data = c.sock.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data or c.busy:
                self._drop(c)
            return
        try:
            got = c.inbox.read(_SUPERVISOR_REQUESTS)
        except wire.ConnectionClosed:
            self._drop(c)
            return
        except WarrenError as e:
            self._reply(c, protocol.error_message(e))
            return
        except OSError:
            self._drop(c)
            return
        if got is None:
            return
        c.deadline = None
        c.busy = True
        msg, payload_len, fds = got
        try:
            self._request(c, msg, payload_len, fds)
        except WarrenError as e:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            if c in self.clients and not c.closing:
                self._reply(c, protocol.error_message(e))

    def _from_running_client(self, c: Client) -> None:
        """A one-shot run's client may only send signals for its command, or hang up."""
        box = c.box
        assert box is not None and box.run is not None
        try:
            got = c.inbox.read((protocol.Signal,))
        except (wire.ConnectionClosed, OSError, WarrenError):
            self._drop(c)
            return
        if got is None:
            return
        msg, _n, fds = got
        for fd in fds:
            os.close(fd)
        if box.run.relay_outbox is not None:
            box.run.relay_outbox.put(msg)
            with contextlib.suppress(OSError):
                box.run.relay_outbox.flush()

    # --- requests ------------------------------------------------------------------------

    def _request(self, c: Client, msg: protocol.Message, payload_len: int, fds: list[int]) -> None:
        if isinstance(msg, protocol.RunRequest):
            self._run(c, msg, fds)
            return
        if isinstance(msg, protocol.PlanRequest):
            for fd in fds:
                os.close(fd)
            from ..plan.render import render

            plan, _ = self._plan(
                msg.spec.to_mapping(), self._caller(c, msg.caller), msg.caller, msg.cwd, dry=True
            )
            self._reply(c, protocol.PlanReply(text=render(plan), plan=json_safe(plan.to_dict())))
            return
        if self.root is None:
            raise SandboxError(
                "long-lived sandboxes need warren's state directory, which is not usable here",
                operation=msg.TAG,
                hint="fix the state directory (see the error of `warren ls`), or use `warren run`",
            )
        if not isinstance(msg, _NOT_USE):
            used = self.boxes.get(str(getattr(msg, "sandbox", getattr(msg, "name", ""))))
            if used is not None:
                used.last_active = time.time()
        if isinstance(
            msg,
            (
                protocol.ExecRequest,
                protocol.SpawnRequest,
                protocol.FileRequest,
                protocol.PsRequest,
                protocol.SignalRequest,
            ),
        ):
            self._handoff(c, msg, payload_len, fds)
            return
        for fd in fds:
            os.close(fd)
        if isinstance(msg, protocol.StdinRequest):
            self._stdin(c, msg, payload_len)
            return
        if payload_len:
            raise ProtocolError(f"a {msg.TAG} request carries no payload", operation="decode")
        if isinstance(msg, protocol.CreateRequest):
            self._create(c, msg)
        elif isinstance(msg, protocol.GetRequest):
            self._reply(c, self._info(msg.name))
        elif isinstance(msg, protocol.ListRequest):
            assert self.registry is not None
            self._reply(c, protocol.SandboxList(items=[self._info(e.name) for e in self.registry.all()]))
        elif isinstance(msg, protocol.StopRequest):
            self._stop(c, msg)
        elif isinstance(msg, protocol.ExposeRequest):
            self._reply(c, self._expose(msg))
        elif isinstance(msg, protocol.NetLogRequest):
            self._reply(c, self._netlog(msg))
        elif isinstance(msg, protocol.StatsRequest):
            live = self._live(msg.sandbox, paused_ok=True)
            self._reply(c, usage.measure(live.pid, live.launched.cgroups, live.plan.limits))
        elif isinstance(msg, protocol.ProcessRequest):
            box = self._known(msg.sandbox)
            reply, data = spawns.state(self.root, msg.sandbox, msg, alive=box is not None and box.ready)
            self._reply(c, reply, data)
        elif isinstance(msg, protocol.PauseRequest):
            self._reply(c, self._pause(msg.sandbox, msg.paused))
        elif isinstance(msg, protocol.ShutdownRequest):
            # It exits once no sandbox is left: the caller hears which still hold it.
            self.shutdown = True
            self._reply(c, protocol.SandboxList(items=[self._info(name) for name in self.boxes]))

    def _stdin(self, c: Client, msg: protocol.StdinRequest, payload_len: int) -> None:
        """Data for a background process's stdin: its payload is read here, without
        blocking (``_stdin_payload``), then queued for the process (``stdin``)."""
        protocol.check_stdin_size(payload_len, msg.process)
        c.stdin, c.stdin_len = msg, payload_len
        c.deadline = time.monotonic() + HEADER_DEADLINE
        self._stdin_payload(c)

    def _stdin_payload(self, c: Client) -> None:
        assert c.stdin is not None and self.stdin_pipes is not None
        try:
            data = c.inbox.read_payload(c.stdin_len)
        except (wire.ConnectionClosed, OSError):
            self._drop(c)
            return
        if data is None:
            return  # the rest comes with a later readable event
        msg, c.stdin = c.stdin, None
        try:
            self._live(msg.sandbox)
            reply: protocol.Message = self.stdin_pipes.write(msg, data)
        except WarrenError as e:
            reply = protocol.error_message(e)
        self._reply(c, reply)

    def _caller(self, c: Client, caller: protocol.Caller) -> CallerFacts:
        return CallerFacts(
            uid=c.uid,
            gid=c.gid,
            home=caller.env.get("HOME") or os.path.expanduser("~"),
            env=caller.env,
            cwd=caller.cwd,
            cgroups=self._peer_cgroups(c),
        )

    def _peer_cgroups(self, c: Client) -> str:
        """The client's cgroups, from the kernel: its sandboxes count against them."""
        if c.cgroups is None:
            raise c.cgroups_error or SandboxError("the client's cgroups are unknown", operation="cgroup")
        return c.cgroups

    def _plan(
        self,
        spec_map: dict[str, object],
        caller: CallerFacts,
        msg_caller: protocol.Caller,
        cwd: str | None,
        long_lived: bool = False,
        dry: bool = False,
    ) -> tuple[Plan, gitkeeper.Lease | None]:
        """``long_lived``: commands start in the workspace (not wherever the sandbox
        happened to be created from). ``dry``: only to show (``warren plan``): nothing
        on disk changes, no lease on git directories is taken."""
        spec = from_mapping(spec_map, "the request's policy", skip=())
        home = Path(caller.home)
        here = Path(caller.cwd)
        if msg_caller.config:
            workspace = Path(os.path.realpath(here / spec.workspace)) if spec.workspace else here.resolve()
            if workspace.is_dir():  # else build() names the precise error
                spec = config.load_spec(workspace, msg_caller.profile, env=caller.env, home=home).merged(spec)
        elif msg_caller.profile:
            raise SetupError("a profile needs the config files", operation="policy", hint="set config=True")
        policy = build(spec, cwd=here, env=caller.env, home=home)
        state_dir = self.root or statedir.location(caller.env)
        paths = [r.path for r in (*policy.writable, *policy.readable, *policy.denied)]
        roots = strip_nested([str(r.path) for r in policy.writable])
        # A read-only workspace is walked too: a denied file linked into it must stay
        # unreadable there (nothing in it needs a copy: it cannot be written).
        found = [
            o
            for o in self.links.scan(
                strip_nested([*roots, str(policy.workspace)]),
                shared=[str(r.path) for r in policy.writable if r.source != "workspace"],
                denied=[*(str(r.path) for r in policy.denied), state_dir],
            )
            if o.secret or any(within(o.path, r) for r in roots)
        ]
        # Repositories in the workspace and the --write roots (a preset's caches are
        # the tool's, shared with the host on purpose: docs/known-limits.md).
        git_roots = strip_nested(
            [str(r.path) for r in policy.writable if r.source in ("workspace", "--write")]
        )
        gitdirs, git_files, lease = self.git.plan(
            git_roots, caller.env, dry=dry, readonly=tuple(str(r.path) for r in policy.readable)
        )
        try:
            ws_path = str(policy.workspace)
            host = gather(
                [*paths_of(paths, caller), *tmpdir.candidates(ws_path, caller.env, caller.home)],
                state_dir=state_dir,
                outside_links=tuple((o.path, o.dev, o.ino, o.secret) for o in found),
                git=gitdirs,
                git_files=git_files,
                workspace=ws_path,
                caller_cgroups=caller.cgroups,
            )
            plan = make_plan(
                policy,
                host,
                caller,
                cwd=str(policy.workspace) if long_lived else cwd,
                scratch_id=secrets.token_hex(12),
            )
        except BaseException:
            self.git.release(lease)
            raise
        return plan, lease

    def _launch(self, plan: Plan, lease: gitkeeper.Lease | None, name: str, oneshot: bool) -> Box:
        try:
            launched = launch.launch(
                plan, oneshot=oneshot, record_dir=self.cgroup_records, tmp_records=self.tmp_records
            )
        except BaseException:
            self.git.release(lease)
            raise
        box = Box(
            name=name,
            id=secrets.token_hex(6),
            plan=plan,
            launched=launched,
            oneshot=oneshot,
            inbox=wire.Inbox(launched.control),
            outbox=wire.Outbox(launched.control),
        )
        box.roots = follow.identities(plan)
        box.git = lease
        self.by_pid[box.pid] = box
        (self.oneshots if oneshot else self.boxes)[box.id if oneshot else name] = box
        self.sel.register(launched.control, _R, ("control", box))
        return box

    def _run(self, c: Client, msg: protocol.RunRequest, fds: list[int]) -> None:
        stdio = sum(1 for attached in msg.command.stdio[:3] if attached)
        if len(fds) != stdio + (1 if msg.net_events else 0):
            raise ProtocolError(
                f"a run request declared {stdio} stdio descriptors"
                f"{' and an event pipe' if msg.net_events else ''} but carried {len(fds)}",
                operation="decode",
            )
        caller = self._caller(c, msg.caller)
        plan, lease = self._plan(msg.spec.to_mapping(), caller, msg.caller, msg.command.cwd)
        box = self._launch(plan, lease, "run", oneshot=True)
        box.search_path = caller.env.get("PATH")
        box.run = Run(c, msg.command, fds[:stdio], fds[stdio] if msg.net_events else None)
        c.box = box

    def _create(self, c: Client, msg: protocol.CreateRequest) -> None:
        assert self.registry is not None
        name = registry.check_name(msg.name)
        existing = self.registry.get(name)
        if name in self.boxes or (existing is not None and existing.state == registry.RUNNING):
            raise SandboxExists(
                f"a sandbox named {name} is already running",
                operation="create",
                path=name,
                hint=f"use it (warren exec {name} CMD), or remove it first (warren rm -f {name})",
            )
        caller = self._caller(c, msg.caller)
        plan, lease = self._plan(msg.spec.to_mapping(), caller, msg.caller, None, long_lived=True)
        box = self._launch(plan, lease, name, oneshot=False)
        box.search_path = caller.env.get("PATH")
        box.creator = c
        c.deadline = None

    # --- PID 1's control channel -----------------------------------------------------------

    def _on_control(self, box: Box, mask: int) -> None:
        if mask & _W:
            with contextlib.suppress(OSError):
                if box.outbox.flush():
                    self.sel.modify(box.launched.control, _R, ("control", box))
        if not mask & _R:
            return
        while True:
            try:
                got = box.inbox.read(
                    (
                        protocol.Ready,
                        protocol.Failed,
                        protocol.NetProxy,
                        protocol.NetReady,
                        protocol.NetUp,
                        protocol.GitChanged,
                    )
                )
            except (wire.ConnectionClosed, OSError):
                # PID 1 is ending; its exit (SIGCHLD) finishes the job.
                with contextlib.suppress(KeyError, ValueError):
                    self.sel.unregister(box.launched.control)
                return
            except WarrenError as e:
                self._fail(box, e)
                return
            if got is None:
                return
            msg, _n, fds = got
            try:
                self._control_message(box, msg, fds)
            except WarrenError as e:
                self._fail(box, e)

    def _control_message(self, box: Box, msg: protocol.Message, fds: list[int]) -> None:
        if isinstance(msg, protocol.NetProxy):
            if not fds:
                raise SetupError("PID 1 sent no proxy socket", operation="network")
            self._start_netd(box, socket.socket(fileno=fds.pop(0)))
        elif isinstance(msg, protocol.NetReady):
            try:
                box.pasta = Pasta.spawn(box.pid, box.search_path)
            except SetupError:
                self._control_send(box, protocol.NetGo(go=False))
                raise
            self.sel.register(box.pasta.pidfd or -1, _R, ("pasta", box))
            self._control_send(box, protocol.NetGo(go=True))
        elif isinstance(msg, protocol.NetUp):
            if not msg.ok:
                raise box.pasta.failure() if box.pasta else SetupError("the network did not come up")
        elif isinstance(msg, protocol.Ready):
            if len(fds) >= 2 and box.ns is None:
                box.ns = (fds.pop(0), fds.pop(0))
            self._on_ready(box)
        elif isinstance(msg, protocol.Failed):
            protocol.raise_error(msg.error)
        elif isinstance(msg, protocol.GitChanged):
            self._git_changed(box, msg.gitdir)
        for fd in fds:
            os.close(fd)

    def _git_changed(self, box: Box, _gitdir: str) -> None:
        self.git.sync(box.git)

    def _control_send(self, box: Box, msg: protocol.Message, fds: list[int] | None = None) -> None:
        box.outbox.put(msg, fds=fds or [])
        try:
            if not box.outbox.flush():
                self.sel.modify(box.launched.control, _R | _W, ("control", box))
        except OSError:
            pass  # PID 1 is gone; its exit is handled by the reaper

    def _on_ready(self, box: Box) -> None:
        if box.pasta is not None and box.pasta.pidfd is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(box.pasta.pidfd)
        box.ready = True
        if box.run is not None:
            run = box.run
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            request = protocol.ExecRequest(sandbox=box.id, command=run.command)
            counters = box.launched.counters
            self._control_send(
                box,
                protocol.Handoff(request=request.to_dict(), extra=[name for name, _fd in counters]),
                [theirs.fileno(), *run.stdio, *(fd for _name, fd in counters)],
            )
            theirs.close()
            for fd in run.stdio:
                os.close(fd)
            run.stdio = []
            run.relay, run.relay_inbox, run.relay_outbox = ours, wire.Inbox(ours), wire.Outbox(ours)
            self.sel.register(ours, _R, ("relay", box))
        if box.creator is not None:
            assert self.registry is not None
            self.registry.add(
                registry.Entry(
                    name=box.name,
                    id=box.id,
                    state=registry.RUNNING,
                    reason="",
                    workspace=box.plan.workspace,
                    created=box.created,
                    supervisor_pid=os.getpid(),
                    supervisor_start=self.start_time,
                    pid1=box.pid,
                    warnings=box.plan.warnings,
                )
            )
            os.makedirs(statedir.sandbox_dir(self.root or "", box.name), mode=0o700, exist_ok=True)
            creator, box.creator = box.creator, None
            self._reply(creator, self._info(box.name))

    def _on_relay(self, box: Box, mask: int) -> None:
        run = box.run
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
            client = run.client
            if isinstance(msg, protocol.Exited):
                run.exited = msg  # answered once the sandbox is gone
            elif client in self.clients and not run.answered:
                if isinstance(msg, protocol.Started):
                    msg.warnings = [*box.plan.warnings, *msg.warnings]
                    client.outbox.put(msg, fds=fds)
                    self._flush(client)
                else:
                    run.answered = True
                    self._reply(client, msg, fds=fds)
            for fd in fds:
                os.close(fd)

    # --- network helpers -----------------------------------------------------------------------

    def _start_netd(self, box: Box, proxy_listener: socket.socket | None) -> None:
        """Fork the sandbox's network helper: a fork of this small, single-threaded
        process costs about a millisecond, an interpreter 30+."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        conn_ours: socket.socket | None = None
        conn_theirs: socket.socket | None = None
        if not box.oneshot:
            conn_ours, conn_theirs = socket.socketpair(
                socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC
            )
        events = box.run.events if box.run is not None else None
        log_path = (
            None if box.oneshot else Path(statedir.sandbox_dir(self.root or "", box.name)) / "net.jsonl"
        )
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.set_wakeup_fd(-1)
                keep = [theirs.fileno(), box.launched.pidfd]
                keep += [s.fileno() for s in (proxy_listener, conn_ours) if s is not None]
                keep += [events] if events is not None else []
                clone.close_all_but(*keep)
                code = netd.serve(
                    theirs,
                    box.plan.net,
                    name=box.name if not box.oneshot else f"run-{box.id}",
                    pid1_pidfd=box.launched.pidfd,
                    log=netlog.Writer(log_path, events),
                    proxy_listener=proxy_listener,
                    connector=conn_ours,
                )
            finally:
                os._exit(code)
        theirs.close()
        if proxy_listener is not None:
            proxy_listener.close()
        if conn_ours is not None:
            conn_ours.close()
        ours.settimeout(5)
        box.netd = Netd(pid, os.pidfd_open(pid), ours)
        self.netd_pids.add(pid)
        if conn_theirs is not None:
            self._control_send(
                box, protocol.Handoff(request=protocol.ConnectorRequest().to_dict()), [conn_theirs.fileno()]
            )
            conn_theirs.close()

    def _expose(self, msg: protocol.ExposeRequest) -> protocol.Message:
        box = self._live(msg.sandbox)
        for value, what, low in ((msg.port, "port", 1), (msg.host_port, "host_port", 0)):
            if not low <= value <= 65535:
                raise SandboxError(
                    f"{what} must be a TCP port number, got {value!r}",
                    operation="expose",
                    hint="ports are 1-65535 (host_port 0 picks a free one)",
                )
        if box.netd is None:
            self._start_netd(box, None)
        assert box.netd is not None
        try:
            wire.send(box.netd.ctl, msg)
            reply, _, fds = wire.recv(box.netd.ctl, (protocol.Exposed, protocol.Error), max_payload=0)
        except (wire.ConnectionClosed, OSError, WarrenError) as e:
            raise SandboxError(
                f"the network helper of sandbox {box.name} did not answer",
                operation="expose",
                path=box.name,
                errno=getattr(e, "errno", None),
                hint="the sandbox may be ending; check `warren ls`",
            ) from None
        for fd in fds:
            os.close(fd)
        return reply

    def _netlog(self, msg: protocol.NetLogRequest) -> protocol.Message:
        if self._known(msg.sandbox) is None:
            self._entry(msg.sandbox)  # raises SandboxNotFound when there is no such sandbox
        events = netlog.read(Path(statedir.sandbox_dir(self.root or "", msg.sandbox)) / "net.jsonl")
        return protocol.NetLog(events=[protocol.NetEventRecord(**e.to_dict()) for e in events[-NETLOG_MAX:]])

    # --- handing a request to PID 1 ---------------------------------------------------------------

    def _handoff(self, c: Client, msg: protocol.Message, payload_len: int, fds: list[int]) -> None:
        assert isinstance(
            msg,
            (
                protocol.ExecRequest,
                protocol.SpawnRequest,
                protocol.FileRequest,
                protocol.PsRequest,
                protocol.SignalRequest,
            ),
        )
        assert self.root is not None
        box = self._live(msg.sandbox)
        changed = follow.replaced(box.roots)
        if changed:
            follow.rebind(box.ns, box.name, changed)
            box.roots.update(changed)
            self._control_send(box, protocol.Refresh())
        declared = sum(1 for a in msg.command.stdio[:3] if a) if isinstance(msg, protocol.ExecRequest) else 0
        if len(fds) != declared:
            raise ProtocolError(
                f"a {msg.TAG} request declared {declared} descriptors but carried {len(fds)}",
                operation="decode",
            )
        if payload_len and not isinstance(msg, protocol.FileRequest):
            raise ProtocolError(f"a {msg.TAG} request carries no payload", operation="decode")
        handoff = protocol.Handoff(request=msg.to_dict(), payload=payload_len)
        extra: list[int] = []
        named: list[int] = []  # handoff.extra's descriptors: ours, not closed here
        if isinstance(msg, protocol.SpawnRequest):
            handoff.spawn_id, extra = spawns.create(self.root, box.name)
            if msg.stdin:
                assert self.stdin_pipes is not None
                extra.append(self.stdin_pipes.open(box.name, handoff.spawn_id))
        elif isinstance(msg, protocol.PsRequest):
            handoff.spawned = spawns.running(self.root, box.name)
        if isinstance(msg, protocol.ExecRequest):
            # The exec's helper holds the write end until it exits: the end of the
            # exec is an event here (the idle timeout counts from it).
            active_r, active_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
            box.active.add(active_r)
            self.sel.register(active_r, _R, ("active", (box, active_r)))
            handoff.extra.append("active")
            extra.append(active_w)
        if isinstance(msg, (protocol.ExecRequest, protocol.SpawnRequest)):
            handoff.extra.extend(name for name, _fd in box.launched.counters)
            named = [fd for _name, fd in box.launched.counters]
        self._control_send(box, handoff, [c.sock.fileno(), *fds, *extra, *named])
        for fd in [*fds, *extra]:
            os.close(fd)
        # PID 1's helper has the connection now; this process lets go of its copy.
        self._drop(c, handed_off=True)

    # --- lookups ---------------------------------------------------------------------------------------

    def _known(self, name: str) -> Box | None:
        return self.boxes.get(name)

    def _entry(self, name: str) -> registry.Entry:
        assert self.registry is not None
        entry = self.registry.get(name)
        if entry is None:
            raise SandboxNotFound(
                f"no sandbox named {name}",
                operation="lookup",
                path=name,
                hint="see `warren ls`; create one with `warren create NAME`",
            )
        return entry

    def _live(self, name: str, paused_ok: bool = False) -> Box:
        box = self.boxes.get(name)
        if box is not None and box.ready and box.kill_at is None:
            if box.paused is not None and not paused_ok:
                raise SandboxPaused(
                    f"sandbox {name} is paused: nothing runs in it until it is resumed",
                    operation="lookup",
                    path=name,
                    hint=f"resume it with `warren resume {name}` (Sandbox.resume())",
                )
            return box
        entry = self._entry(name)
        raise SandboxDead(
            f"sandbox {name} is {entry.state if box is None else 'stopping'}"
            + (f": {entry.reason}" if entry.reason and box is None else ""),
            operation="lookup",
            path=name,
            hint=f"remove it with `warren rm {name}` and create it again",
        )

    def _info(self, name: str) -> protocol.SandboxInfo:
        box = self.boxes.get(name)
        entry = self._entry(name)
        state = entry.state
        if box is not None and box.kill_at is not None:
            state = "stopping"
        elif box is not None and box.paused is not None:
            state = "paused"
        limits = box.plan.limits if box is not None else None
        return protocol.SandboxInfo(
            idle_timeout=(limits.limits.idle_timeout or None) if limits else None,
            last_active=box.last_active if box is not None else 0.0,
            name=entry.name,
            id=entry.id,
            state=state,
            reason=entry.reason,
            workspace=entry.workspace,
            created=entry.created,
            pid1=entry.pid1,
            warnings=list(entry.warnings),
        )

    # --- stopping and ending ------------------------------------------------------------------------

    def _stop(self, c: Client, msg: protocol.StopRequest) -> None:
        assert self.registry is not None and self.root is not None
        box = self.boxes.get(msg.name)
        if box is not None:
            box.stoppers.append(c)
            box.remove = box.remove or msg.remove
            c.deadline = None
            if box.kill_at is None:
                self._terminate(box)
            return
        info = self._info(msg.name)
        if msg.remove:
            self.registry.remove(msg.name)
            shutil.rmtree(statedir.sandbox_dir(self.root, msg.name), ignore_errors=True)
        self._reply(c, info)

    # --- pause and resume -------------------------------------------------------------------------

    def _pause(self, name: str, paused: bool) -> protocol.SandboxInfo:
        """Freeze every process of the sandbox, or thaw them (``pause``)."""
        box = self._live(name, paused_ok=True)
        if paused and box.paused is None:
            box.paused = pause.pause(name, box.pid, box.launched.cgroups)
        elif not paused and box.paused is not None:
            pause.resume(name, box.pid, box.paused)
            box.paused = None
        return self._info(name)

    def _terminate(self, box: Box) -> None:
        """Stop a sandbox: thawed first (frozen tasks cannot act on SIGTERM), SIGTERM to
        PID 1 (which passes it on), SIGKILL after its grace if it is still there."""
        self._thaw(box)
        self._signal(box, signal.SIGTERM)
        box.kill_at = box.kill_at or time.monotonic() + STOP_KILL_AFTER

    def _thaw(self, box: Box) -> None:
        if box.paused is not None:
            with contextlib.suppress(WarrenError):
                pause.resume(box.name, box.pid, box.paused)
            pause.release(box.paused)
            box.paused = None

    def _exec_ended(self, box: Box, fd: int) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(fd)
        os.close(fd)
        box.active.discard(fd)
        box.last_active = time.time()
        self.git.sync(box.git)

    def _signal(self, box: Box, sig: int) -> None:
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(box.launched.pidfd, sig)

    def _fail(self, box: Box, error: WarrenError) -> None:
        """Setup went wrong: remember why (the waiting client hears it when PID 1 is
        gone) and end the sandbox."""
        box.failure = box.failure or error
        self._signal(box, signal.SIGKILL)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.netd_pids.discard(pid)
            box = self.by_pid.pop(pid, None)
            if box is not None:
                self._ended(box, status)

    def _ended(self, box: Box, status: int) -> None:
        """PID 1 exited: the whole sandbox is gone. Clean up after it, then tell
        whoever waits."""
        # Before anyone hears it ended: what it committed is on the host by then.
        self.git.release(box.git)
        box.git = None
        if box.run is not None and box.run.relay is not None and box.run.exited is None:
            # What the command's helper said before the end may not have been read yet
            # (the loop was busy when both arrived).
            self._on_relay(box, _R)
        (self.oneshots if box.oneshot else self.boxes).pop(box.id if box.oneshot else box.name, None)
        for sock in (box.launched.control, box.run.relay if box.run else None):
            if sock is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self.sel.unregister(sock)
                sock.close()
        # Network helpers end before anyone hears the sandbox ended, so an exposed port
        # is closed by the time stop/rm returns.
        if box.netd is not None:
            box.netd.ctl.close()
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(box.netd.pidfd, signal.SIGKILL)
            os.close(box.netd.pidfd)
        if box.pasta is not None:
            if box.pasta.pidfd is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self.sel.unregister(box.pasta.pidfd)
            box.pasta.stop()
        os.close(box.launched.pidfd)
        for fd in [*(box.ns or ()), *box.active]:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(fd)
            os.close(fd)
        box.ns = None
        box.active.clear()
        if box.paused is not None:
            pause.release(box.paused)
        if self.stdin_pipes is not None and not box.oneshot:
            self.stdin_pipes.close_sandbox(box.name)
        repairs = launch.restore(box.launched)
        if box.run is not None:
            self._end_run(box, repairs)
            return
        if box.creator is not None:
            creator, box.creator = box.creator, None
            error = box.failure or SetupError(
                "the sandbox ended during setup without a report",
                operation="create",
                hint="run `warren doctor`",
            )
            self._reply(creator, protocol.error_message(error))
            return
        assert self.registry is not None
        warnings = [*box.plan.warnings, *repairs]
        if box.stoppers:
            if box.remove:
                self.registry.remove(box.name)
                shutil.rmtree(statedir.sandbox_dir(self.root or "", box.name), ignore_errors=True)
            else:
                self.registry.set_state(box.name, box.id, registry.STOPPED, "stopped on request", warnings)
        elif box.stopped_why:
            self.registry.set_state(box.name, box.id, registry.STOPPED, box.stopped_why, warnings)
        elif self.shutdown:
            self.registry.set_state(
                box.name, box.id, registry.STOPPED, "the supervisor was stopped", warnings
            )
        else:
            how = (
                f"killed by signal {signal.Signals(os.WTERMSIG(status)).name}"
                if os.WIFSIGNALED(status)
                else f"exited with status {os.waitstatus_to_exitcode(status)}"
            )
            self.registry.set_state(
                box.name, box.id, registry.DEAD, f"the sandbox's PID 1 ({box.pid}) was {how}", warnings
            )
        for c in box.stoppers:
            if c in self.clients:
                self._reply(
                    c,
                    protocol.SandboxInfo(
                        name=box.name,
                        id=box.id,
                        state="removed" if box.remove else registry.STOPPED,
                        workspace=box.plan.workspace,
                        created=box.created,
                        warnings=repairs,
                    ),
                )

    def _end_run(self, box: Box, repairs: list[str]) -> None:
        run = box.run
        assert run is not None
        for fd in [*run.stdio, *([run.events] if run.events is not None else [])]:
            with contextlib.suppress(OSError):
                os.close(fd)
        client = run.client
        client.box = None
        if run.answered or client not in self.clients:
            self._drop(client)
            return
        run.answered = True
        if run.exited is not None:
            run.exited.warnings = [*run.exited.warnings, *repairs]
            self._reply(client, run.exited)
            return
        error = box.failure or SetupError(
            "the sandbox ended before its command reported",
            operation="run",
            hint="something outside killed it; run `warren doctor` if this repeats",
        )
        self._reply(client, protocol.error_message(error))


def _full(why: str) -> protocol.Message:
    return protocol.error_message(
        SandboxError(
            f"the warren supervisor is at its connection limit: {why}",
            operation="connect",
            hint="too many connections at once (is a program opening many and sending nothing?); retry",
        )
    )


def _tell(sock: socket.socket, message: protocol.Message) -> None:
    """Send ``message`` if the socket takes it now, and close: never waits."""
    with contextlib.suppress(OSError, WarrenError):
        sock.send(wire.frame(message), socket.MSG_DONTWAIT)
    sock.close()


def json_safe(value: object) -> dict[str, object]:
    """A plan's dictionary as plain JSON values (tuples become lists, and so on)."""
    import json

    result: dict[str, object] = json.loads(json.dumps(value, default=str))
    return result


def key_fd(pasta: Pasta | None) -> int:
    return -1 if pasta is None or pasta.pidfd is None else pasta.pidfd


# --- entry points ------------------------------------------------------------------------------------

DEFAULT_IDLE = 60.0


def _idle() -> float:
    try:
        return max(0.5, float(os.environ.get("WARREN_SUPERVISOR_IDLE", DEFAULT_IDLE)))
    except ValueError:
        return DEFAULT_IDLE


def _raise_nofile() -> None:
    """Room for MAX_CLIENTS connections beside every sandbox's descriptors: the soft
    descriptor limit up to the hard one (sandboxes get the old one back: ``clone``)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
    if want > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            clone.sandbox_nofile = soft


def daemon(root: str, ready_fd: int) -> int:
    """The per-user supervisor: one per state directory (a lock decides), reachable at
    the abstract address it publishes there."""
    import fcntl

    os.chdir("/")
    try:
        statedir.prepare(root)
    except WarrenError as e:
        os.write(ready_fd, f"error {e.message}\n".encode())
        return 1
    lock = os.open(os.path.join(root, statedir.LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.write(ready_fd, b"other\n")  # another supervisor serves this state directory
        return 0
    _raise_nofile()
    token = secrets.token_hex(16)
    listener = wire.listen_abstract(wire.abstract_name(token))
    try:
        sup = Supervisor(root, listener, _idle())
    except WarrenError as e:
        os.write(ready_fd, f"error {e.message}\n".encode())
        return 1
    statedir.write_address(root, token)
    os.write(ready_fd, b"ready\n")
    os.close(ready_fd)
    try:
        sup.serve()
    finally:
        # Unpublish before releasing the lock, so a racing client either reached this
        # supervisor (and gets an answer) or starts the next one.
        statedir.clear_address(root, token)
        listener.close()
        sup.links.save(os.path.join(root, LINKS_FILE))
    return 0


def inline(fd: int) -> int:
    """A supervisor for one client on an inherited socket, without state: the
    fallback that runs one-shot sandboxes when the state directory is unusable."""
    os.chdir("/")
    sock = socket.socket(fileno=fd)
    sup = Supervisor(None, None, 0)
    sup.add_client(sock, os.getuid(), os.getgid())
    sup.serve()
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "daemon":
        return daemon(argv[1], int(argv[2]))
    if len(argv) == 2 and argv[0] == "inline":
        return inline(int(argv[1]))
    print("usage: python -m warren.server.supervisor daemon ROOT READY_FD | inline FD", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
