"""The supervisor: one small process per user that plans and holds every sandbox.

Clients (the CLI, the library) send it a policy *spec* and their context; it resolves
the policy for that caller, plans with the host facts it keeps warm, launches the
sandbox through the one launch path (``launch``), and either answers itself (create,
list, stop, logs) or hands the client's connection to the sandbox's PID 1 (exec,
spawn, files, processes), which forks a helper to serve it. A one-shot ``run`` is a
sandbox that serves exactly one exec: the supervisor relays its start and exit so it
can tear the sandbox down (network helper, pasta, the ancestor guard) before telling
the client the command's status.

This module is the loop, the clients and the dispatch of requests. A sandbox is a
``box.Box`` (its PID 1, relay, teardown; its networking in ``boxnet``), the set of
them and their registry records ``sandboxes``, a request's plan ``planning``, the
handing of a request to PID 1 ``handoff``, and start-up ``daemon``.

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
import signal
import socket
import sys
import time

from .. import protocol, wire
from .._core import guard
from ..errors import ProtocolError, SandboxError, SandboxExists, SetupError, WarrenError
from ..plan import CallerFacts
from . import (
    ahead,
    clients,
    gitkeeper,
    handoff,
    links,
    marks,
    peer,
    planning,
    registry,
    sandboxes,
    stdin,
)
from .box import Box, Run
from .clients import HEADER_DEADLINE, Client

MAX_CLIENTS = 1024
ACCEPT_BATCH = 64  # connections accepted per turn of the loop: the others' requests are read between
LINKS_FILE = "links.cache"  # the hardlink scan's memory, for the next supervisor
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
    protocol.SnapshotRequest,
    protocol.SnapshotListRequest,
    protocol.SnapshotRemoveRequest,
)
# Requests that are not a use of the sandbox: they do not reset its idle timeout.
_NOT_USE = (protocol.GetRequest, protocol.ListRequest, protocol.StatsRequest, protocol.NetLogRequest)


class Supervisor:
    def __init__(self, root: str | None, listener: socket.socket | None, idle: float) -> None:
        self.root = root
        self.listener = listener
        self.idle = idle
        self.sel = selectors.DefaultSelector()
        self.git = gitkeeper.GitKeeper()
        self.sandboxes = sandboxes.Sandboxes(root, self.sel, self.git, self)
        self.registry = self.sandboxes.registry
        self.clients: dict[Client, None] = {}  # oldest first
        self.idle_since = time.monotonic()
        self.shutdown = False
        self.notes = clients.Notes()
        self.links = links.LinkScanner()
        self.planner = planning.Planner(root, self.links, self.git)
        self.ahead = ahead.Pool()  # one-shot sandboxes booted for the next run of a request
        self.to_boot: dict[ahead.Key, ahead.Request] = {}  # booted once nothing else is asked
        self.asked_at = 0.0  # the last connection accepted or let go, or exec ended
        self.git_sync_at = 0.0
        if root is not None:
            self.links.load(os.path.join(root, LINKS_FILE))
        self.wake_r, self.wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.stdin_pipes = stdin.StdinPipes(root, self.sel) if root is not None else None

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
            for key, mask in self.sel.select(ahead.QUIET if self.to_boot else 0.25):
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
            obj.on_control(mask)
        elif kind == "relay":
            assert isinstance(obj, Box)
            obj.on_relay(mask)
        elif kind == "active":
            assert isinstance(obj, tuple)
            box, fd = obj
            box.exec_ended(fd)
            self.asked_at = time.monotonic()
        elif kind == "stdin":
            assert isinstance(obj, stdin.Pipe) and self.stdin_pipes is not None
            self.stdin_pipes.flush(obj)
        elif kind == "pasta":
            assert isinstance(obj, Box)
            obj.on_pasta()

    def _done(self) -> bool:
        now = time.monotonic()
        if self.sandboxes.all() or self.clients:
            self.idle_since = now
            return False
        if self.listener is None:  # inline: the one client has gone
            return True
        return self.shutdown or now - self.idle_since > self.idle

    def _on_term(self, _signum: int, _frame: object) -> None:
        self.shutdown = True
        for box in self.sandboxes.all():
            box.terminate()

    def _timers(self) -> None:
        now = time.monotonic()
        for c in list(self.clients):
            if c.deadline is not None and now > c.deadline:
                self._drop(c)  # too slow to send its request: it holds up nobody
        for box in self.sandboxes.all():
            if box.kill_at is not None and now > box.kill_at:
                box.signal(signal.SIGKILL)
                box.kill_at = None
        if now >= self.git_sync_at:
            self.git_sync_at = now + GIT_SYNC_EVERY
            self.git.tick()
        for box in list(self.sandboxes.boxes.values()):
            if box.idle_expired():
                box.terminate()
        for box in self.ahead.expired(now):
            box.terminate()
        if self.to_boot and now - self.asked_at >= ahead.QUIET and self._quiet():
            # One at a time, while nobody waits: a boot holds this loop for a few ms.
            key = next(iter(self.to_boot))
            self._boot_ahead(self.to_boot.pop(key))
        if self.stdin_pipes is not None:
            self.stdin_pipes.sweep()

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
                self.notes.log("refused", f"refused a connection: {why}")
                sock.close()
                continue
            if len(self.clients) >= MAX_CLIENTS and not self._make_room():
                self.notes.log("full", f"refused a connection: {MAX_CLIENTS} clients, all busy")
                clients.tell(sock, clients.full(f"all {MAX_CLIENTS} of its connections are busy"))
                continue
            _pid, uid, gid = wire.peer_creds(sock)
            self.add_client(sock, uid, gid)
            self.asked_at = time.monotonic()

    def _make_room(self) -> bool:
        for c in self.clients:
            if c.deadline is None or c.busy or c.box is not None or c.stdin is not None:
                continue
            try:
                if c.sock.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK):
                    continue  # its request is there, to be read this turn
            except OSError:
                pass  # nothing waits (BlockingIOError), or it is gone: either way it goes
            self.notes.log("evicted", f"closed an idle connection to make room ({MAX_CLIENTS} clients)")
            with contextlib.suppress(OSError, WarrenError):
                c.sock.send(
                    wire.frame(clients.full("this connection sent nothing and made room")),
                    socket.MSG_DONTWAIT,
                )
            self._drop(c)
            return True
        return False

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
        c.release()
        self.asked_at = time.monotonic()
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
            c.box.signal(signal.SIGKILL)

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
        box.relay_signal(msg)

    # --- requests ------------------------------------------------------------------------

    def _request(self, c: Client, msg: protocol.Message, payload_len: int, fds: list[int]) -> None:
        if isinstance(msg, protocol.RunRequest):
            self._run(c, msg, fds)
            return
        if isinstance(msg, protocol.PlanRequest):
            for fd in fds:
                os.close(fd)
            from ..plan.render import render

            request = ahead.Request(msg.spec.to_mapping(), c.facts(msg.caller), msg.caller, msg.cwd, None)
            plan = self.planner.plan(request, dry=True)[0]
            self._reply(c, protocol.PlanReply(text=render(plan), plan=planning.json_safe(plan.to_dict())))
            return
        if self.root is None:
            raise SandboxError(
                "long-lived sandboxes need warren's state directory, which is not usable here",
                operation=msg.TAG,
                hint="fix the state directory (see the error of `warren ls`), or use `warren run`",
            )
        if not isinstance(msg, _NOT_USE):
            used = self.sandboxes.known(str(getattr(msg, "sandbox", getattr(msg, "name", ""))))
            if used is not None:
                used.last_active = time.time()
        if isinstance(msg, handoff.HANDED):
            box = self.sandboxes.live(msg.sandbox)
            handoff.hand_over(
                box, c.sock, msg, payload_len, fds, root=self.root, stdin_pipes=self.stdin_pipes
            )
            # PID 1's helper has the connection now; this process lets go of its copy.
            self._drop(c, handed_off=True)
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
            return
        answer = self.sandboxes.answer(msg)
        if answer is not None:
            self._reply(c, *answer)
        elif isinstance(msg, protocol.StopRequest):
            self._stop(c, msg)
        elif isinstance(msg, protocol.ShutdownRequest):
            # It exits once no sandbox is left: the caller hears which still hold it.
            self.shutdown = True
            self.to_boot.clear()
            for box in self.ahead.expired(float("inf")):
                box.terminate()
            self._reply(c, protocol.SandboxList(items=[self.sandboxes.info(n) for n in self.sandboxes.boxes]))

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
            self.sandboxes.live(msg.sandbox)
            reply: protocol.Message = self.stdin_pipes.write(msg, data)
        except WarrenError as e:
            reply = protocol.error_message(e)
        self._reply(c, reply)

    def _run(self, c: Client, msg: protocol.RunRequest, fds: list[int]) -> None:
        stdio = sum(1 for attached in msg.command.stdio[:3] if attached)
        if len(fds) != stdio + (1 if msg.net_events else 0):
            raise ProtocolError(
                f"a run request declared {stdio} stdio descriptors"
                f"{' and an event pipe' if msg.net_events else ''} but carried {len(fds)}",
                operation="decode",
            )
        caller = c.facts(msg.caller)
        request = ahead.Request(
            msg.spec.to_mapping(), caller, msg.caller, msg.command.cwd, caller.env.get("PATH")
        )
        run = Run(c, msg.command, fds[:stdio], fds[stdio] if msg.net_events else None)
        began = time.process_time()
        found = self._booted_for(request)
        if found is None:
            box = self._launch_run(request, run)
        else:
            box, booted = found
            box.run = run
            self._take(box, booted, request)
        box.request = self._again(request, caller, began)  # once it is answered, the next one is booted
        c.box = box

    def _launch_run(self, request: ahead.Request, run: Run) -> Box:
        plan, git, _host = self.planner.plan(request)
        box = self.sandboxes.launch(
            plan, git, "run", request.search_path, oneshot=True, caller=request.caller
        )
        box.run = run
        return box

    def _launch_create(self, request: ahead.Request, name: str, creator: Client) -> Box:
        plan, git, _host = self.planner.plan(request)
        box = self.sandboxes.launch(
            plan, git, name, request.search_path, oneshot=False, caller=request.caller
        )
        box.creator = creator
        return box

    def _booted_for(self, request: ahead.Request) -> tuple[Box, ahead.Booted] | None:
        """The sandbox booted ahead for this request, if the request planned now gets
        exactly it (``ahead.fits``); a stale one is stopped. The caller gives it its run
        or its creator, then ``_take``."""
        booted = self.ahead.take(request.key())
        if booted is None:
            return None
        plan, git, host = self.planner.plan(request, scratch_id=booted.scratch_id)
        git.close()  # the booted sandbox holds its repositories' lease
        box = booted.box
        if not ahead.fits(booted, plan, host):
            self.notes.log("ahead", "a sandbox booted ahead was not used: the request or the host changed")
            box.terminate()
            return None
        # The host's own changes since the boot are not the sandbox's to be undone.
        box.launched.guard = guard.snapshot(box.plan.guarded)
        return box, booted

    def _take(self, box: Box, booted: ahead.Booted, request: ahead.Request) -> None:
        """Its run or creator given: used at once when it is ready, else once it is
        (``_booted_ready``)."""
        if booted.checked:
            self._adopt(box)
        else:
            booted.waiting = request

    def _adopt(self, box: Box) -> None:
        """A sandbox booted ahead takes its run's command, or becomes its creator's
        sandbox; its repositories are brought in step first."""
        box.booted = None
        self.git.sync(box.git)
        if box.run is not None:
            box.start_run()
            return
        box.created = box.last_active = time.time()
        self.box_ready(box)

    def _quiet(self) -> bool:
        """No exec runs and no client waits for anything but a sandbox to stop: booting
        one ahead now holds up nobody's command."""
        stopping = {c for box in self.sandboxes.boxes.values() for c in box.stoppers}
        return all(c in stopping for c in self.clients) and not any(
            box.active for box in self.sandboxes.boxes.values()
        )

    def _boot_ahead(self, request: ahead.Request) -> None:
        """After a run or a create: the next sandbox for the same request, booted now."""
        key = request.key()
        if self.shutdown or self.ahead.get(key) is not None:
            return
        scratch_id = secrets.token_hex(12)
        try:
            plan, git, host = self.planner.plan(request, scratch_id=scratch_id)
        except WarrenError:
            return
        if not ahead.eligible(plan):
            git.close()
            return
        try:
            box = self.sandboxes.launch(
                plan,
                git,
                f"ahead-{scratch_id}",
                request.search_path,
                oneshot=not request.long_lived,
                caller=request.caller,
                ahead=True,
            )
        except WarrenError:
            return
        assert box.launched.marks is not None
        box.booted = ahead.Booted(box, host, box.launched.marks, scratch_id)
        for old in self.ahead.add(key, box.booted):
            old.terminate()

    def _again(self, request: ahead.Request, caller: CallerFacts, began: float) -> ahead.Request | None:
        """``request`` if the next one like it is to be booted ahead (``ahead.Pool.again``,
        ``ahead.lingers_anyway``; planned and launched within ``ahead.SLOW`` of this
        process's CPU time since ``began``), else None."""
        if self.listener is None or not self.ahead.again(request.key(), time.monotonic()):
            return None
        if time.process_time() - began > ahead.SLOW:
            return None
        with open("/proc/self/cgroup") as f:
            return request if ahead.lingers_anyway(caller.cgroups, f.read()) else None

    def _create(self, c: Client, msg: protocol.CreateRequest) -> None:
        assert self.registry is not None
        name = registry.check_name(msg.name)
        existing = self.registry.get(name)
        if name in self.sandboxes.boxes or (existing is not None and existing.state == registry.RUNNING):
            raise SandboxExists(
                f"a sandbox named {name} is already running",
                operation="create",
                path=name,
                hint=f"use it (warren exec {name} CMD), or remove it first (warren rm -f {name})",
            )
        caller = c.facts(msg.caller)
        request = ahead.Request(
            msg.spec.to_mapping(), caller, msg.caller, None, caller.env.get("PATH"), long_lived=True
        )
        began = time.process_time()
        found = self._booted_for(request)
        c.deadline = None
        if found is None:
            box = self._launch_create(request, name, c)
            box.request = self._again(request, caller, began)  # once it is ready, the next one is booted
        else:
            box, booted = found
            self.sandboxes.adopt(box, name)
            box.creator = c
            box.request = self._again(request, caller, began)
            self._take(box, booted, request)

    # --- stopping, and what the sandboxes tell (box.Waiter) ------------------------------------

    def _stop(self, c: Client, msg: protocol.StopRequest) -> None:
        box = self.sandboxes.known(msg.name)
        if box is not None:
            box.stoppers.append(c)
            box.remove = box.remove or msg.remove
            c.deadline = None
            if box.kill_at is None:
                box.terminate()
            return
        info = self.sandboxes.info(msg.name)
        if msg.remove:
            self.sandboxes.forget(msg.name)
        self._reply(c, info)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            box = self.sandboxes.by_pid.pop(pid, None)
            if box is not None:
                box.ended(status)

    def box_ready(self, box: Box) -> None:
        if box.booted is not None:
            self._booted_ready(box, box.booted)
            return
        if box.creator is not None:
            self.sandboxes.record_ready(box)
            creator, box.creator = box.creator, None
            self._reply(creator, self.sandboxes.info(box.name))
            if box.request is not None:
                self.to_boot[box.request.key()] = box.request
                box.request = None

    def _booted_ready(self, box: Box, booted: ahead.Booted) -> None:
        """A sandbox booted ahead is ready: what PID 1 set up from must be what the
        launch saw, or it is no copy of a fresh one (a run waiting for it launches one)."""
        if marks.still(booted.marks, marks.take(box.plan)):
            booted.checked = True
            if booted.waiting is not None:
                self._adopt(box)
            return
        self.ahead.forget(box)
        run, creator, box.run, box.creator = box.run, box.creator, None, None
        again, box.request = box.request, None
        box.booted = booted  # still unused: nothing of its end is anyone's
        box.terminate()
        request = booted.waiting
        if request is None:
            return
        try:
            if run is not None:
                fresh = self._launch_run(request, run)
                run.client.box = fresh
            elif creator is not None:
                fresh = self._launch_create(request, box.name, creator)
            else:
                return
        except WarrenError as e:
            if run is not None:
                for fd in [*run.stdio, *([run.events] if run.events is not None else [])]:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                run.client.box = None
            waiting = run.client if run is not None else creator
            assert waiting is not None
            self._reply(waiting, protocol.error_message(e))
            return
        fresh.request = again

    def run_said(self, box: Box, msg: protocol.Message, fds: list[int]) -> None:
        run = box.run
        assert run is not None
        client = run.client
        if client not in self.clients or run.answered:
            return
        if isinstance(msg, protocol.Started):
            msg.warnings = [*box.plan.warnings, *msg.warnings]
            client.outbox.put(msg, fds=fds)
            self._flush(client)
        else:
            run.answered = True
            self._reply(client, msg, fds=fds)

    def box_ended(self, box: Box, status: int, repairs: list[str]) -> None:
        self.sandboxes.discard(box)
        self.ahead.forget(box)
        if box.unused:
            return  # booted ahead, and never used: nobody to tell, nothing recorded
        if self.stdin_pipes is not None and not box.oneshot:
            self.stdin_pipes.close_sandbox(box.name)
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
        self.sandboxes.record_end(box, status, [*box.plan.warnings, *repairs], self.shutdown)
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
            if box.request is not None:
                self.to_boot[box.request.key()] = box.request
            return
        error = box.failure or SetupError(
            "the sandbox ended before its command reported",
            operation="run",
            hint="something outside killed it; run `warren doctor` if this repeats",
        )
        self._reply(client, protocol.error_message(error))


def main(argv: list[str]) -> int:
    """The entry point the client starts a supervisor through (``client.connect``);
    start-up is ``daemon``'s."""
    from . import daemon

    return daemon.main(argv)
