"""The supervisor: one small process per user that plans and holds every sandbox.

Clients (the CLI, the library) send it a policy *spec* and their context; it resolves
the policy for that caller, plans with the host facts it keeps warm, launches the
sandbox through the one launch path (``launch``), and either answers itself (create,
list, stop, logs) or hands the client's connection to the sandbox's PID 1 (exec,
spawn, files, processes), which forks a helper to serve it. A one-shot ``run`` is a
sandbox that serves exactly one exec: the supervisor relays its start and exit so it
can tear the sandbox down (network helper, pasta, the ancestor guard) before telling
the client the command's status.

This module is the loop, the clients and the dispatch of requests. Taking, answering
and letting go of connections is ``connections``'; a sandbox is a ``box.Box`` (its
PID 1, relay, teardown; its networking in ``boxnet``), the set of them and their
registry records ``sandboxes``, a request's plan ``planning``, where a run's or a
create's sandbox comes from (a launch, or one booted ahead) ``booting``, the handing
of a request to PID 1 ``handoff``, and start-up ``daemon``.

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
import math
import os
import selectors
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable

from .. import protocol, wire
from ..errors import ProtocolError, SandboxError, SandboxExists, SetupError, WarrenError
from . import (
    ahead,
    booting,
    checkpoints,
    clients,
    connections,
    gitkeeper,
    handoff,
    launch,
    links,
    linkwalk,
    markwatch,
    planning,
    registry,
    sandboxes,
    stdin,
)
from .box import Box, Run
from .clients import HEADER_DEADLINE, Client

LINKS_FILE = "links.cache"  # the hardlink scan's memory, for the next supervisor
GIT_SYNC_EVERY = 0.5  # seconds between rounds of keeping live sandboxes' git directories in step
STOP_QUICK = 0.2  # seconds a stop is waited for before a sandbox is booted ahead (``_quiet``)
TICK = 0.25  # seconds between the loop's rounds of its timers when nothing comes (``_wait``)
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
    protocol.ExposeListRequest,
    protocol.UnexposeRequest,
    protocol.NetLogRequest,
    protocol.EventsRequest,
    protocol.NetPolicyRequest,
    protocol.ReviewRequest,
    protocol.CheckpointRequest,
    protocol.StatsRequest,
    protocol.ProcessRequest,
    protocol.SpawnListRequest,
    protocol.PauseRequest,
    protocol.StdinRequest,
    protocol.ShutdownRequest,
    protocol.SnapshotRequest,
    protocol.SnapshotListRequest,
    protocol.SnapshotRemoveRequest,
)
# Requests that are not a use of the sandbox: they do not reset its idle timeout.
_NOT_USE = (
    protocol.GetRequest,
    protocol.ListRequest,
    protocol.StatsRequest,
    protocol.NetLogRequest,
    protocol.EventsRequest,
    protocol.NetPolicyRequest,
    protocol.SpawnListRequest,
    protocol.ExposeListRequest,
)


class Supervisor:
    def __init__(self, root: str | None, listener: socket.socket | None, idle: float) -> None:
        self.root = root
        self.listener = listener
        self.idle = idle
        self.sel = selectors.DefaultSelector()
        self.git = gitkeeper.GitKeeper(root)
        self.git.recover()  # what sandboxes of a supervisor that died made: adopted first
        self.sandboxes = sandboxes.Sandboxes(root, self.sel, self.git, self)
        self.registry = self.sandboxes.registry
        self.idle_since = time.monotonic()
        self.shutdown = False
        self.notes = clients.Notes()
        self.git.note = self.notes.log
        self.clients = connections.Connections(self.sel, listener, self.notes)
        self.links = links.LinkScanner()
        self.planner = planning.Planner(root, self.links, self.git)
        self.boots = booting.Booter(
            self.planner, self.sandboxes, self.git, self.notes, self.clients, listener is None
        )
        self.git_sync_at = 0.0
        if root is not None:
            self.links.load(os.path.join(root, LINKS_FILE))
        self.wake_r, self.wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.stdin_pipes = stdin.StdinPipes(root, self.sel) if root is not None else None

    # --- the loop ----------------------------------------------------------------------

    def serve(
        self, unpublish: Callable[[], None] | None = None, publish: Callable[[], None] | None = None
    ) -> None:
        """Serve until done (``_done``). ``unpublish``/``publish``: take this supervisor's
        address away, and give it back (``_last_look``)."""
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
            for key, mask in self.sel.select(self._wait()):
                if not self._registered(key):
                    continue  # let go of by an event before it in this turn (its number may be reused)
                kind, obj = key.data
                try:
                    self._event(kind, obj, mask)
                except Exception as e:  # a bug must not take every sandbox down
                    self._bug(kind, obj, e)
            self._guarded("reaping", self._reap)
            self._timers()
            if self._done() and not self._last_look(unpublish, publish):
                return

    def _registered(self, key: selectors.SelectorKey) -> bool:
        try:
            return self.sel.get_key(key.fileobj) is key
        except (KeyError, ValueError):
            return False

    def _bug(self, kind: str, obj: object, e: Exception) -> None:
        """An event's handler raised (a bug of warren's): said in the log, and a client's
        connection dropped; everything else goes on."""
        print(f"warren supervisor: {kind}: {e!r}", file=sys.stderr, flush=True)
        if isinstance(obj, Client):
            self.clients.drop(obj)

    def _guarded(self, name: str, step: Callable[[], object]) -> None:
        """One of the loop's own steps (reaping, a timer's): a bug there (warren's) is
        said in the log, at most once every few seconds per step, and the loop and the
        other steps go on. Raised out of the loop, it ended the supervisor with every
        sandbox, as an event's handler must not (``_bug``)."""
        try:
            step()
        except Exception as e:
            where = traceback.extract_tb(e.__traceback__)[-1]
            self.notes.log(
                f"bug {name}", f"{name}: {e!r} ({os.path.basename(where.filename)}:{where.lineno})"
            )

    def _event(self, kind: str, obj: object, mask: int) -> None:
        if kind == "accept":
            # A client sends its request as soon as it connects: read now what has come,
            # not after another turn of the loop (nothing waits: an incomplete request
            # is read on as more comes, as always).
            for c in self.clients.accept():
                if c in self.clients:
                    try:
                        self._on_client(c, _R)
                    except Exception as e:  # as in the loop: a bug drops this client only
                        self._bug("client", c, e)
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
        elif kind == "spare":
            assert isinstance(obj, Box)
            obj.drop_spare()  # its helper went unused (PID 1 let it go)
        elif kind == "relay":
            assert isinstance(obj, Box)
            obj.on_relay(mask)
        elif kind == "active":
            assert isinstance(obj, tuple)
            box, fd = obj
            if fd in box.answered:
                box.exec_ended(fd)  # the sync its client waits for
            else:
                box.take_reports(fd)  # its helper exited: with any other reported before it
            self.clients.asked_at = time.monotonic()
        elif kind == "stdin":
            assert isinstance(obj, stdin.Pipe) and self.stdin_pipes is not None
            self.stdin_pipes.flush(obj)
        elif kind == "walked":
            assert isinstance(obj, linkwalk.Job)
            obj.on_end()
        elif kind == "pasta":
            assert isinstance(obj, Box)
            obj.on_pasta()
        elif kind == "netd":
            assert isinstance(obj, Box)
            obj.on_netd()
        elif kind == "proxy":
            assert isinstance(obj, Box)
            obj.on_proxy()

    def _done(self) -> bool:
        now = time.monotonic()
        if self.sandboxes.all() or self.clients or self.sandboxes.saving:
            # (``saving``: snapshots whose copy is under way in a thread: it would be lost.)
            self.idle_since = now
            return False
        if self.listener is None:  # inline: the one client has gone
            return True
        return self.shutdown or now - self.idle_since > self.idle

    def _last_look(self, unpublish: Callable[[], None] | None, publish: Callable[[], None] | None) -> bool:
        """Done: whether to go on after all. The address is taken away first (a client
        from now on starts the next supervisor, which waits for this one's lock), then a
        connection already made (a client that read the address a moment before: a
        `warren run` right after `warren shutdown`, or the idle time running out) is
        taken rather than reset by the exit, and the address given back while it is
        served."""
        if self.listener is None or unpublish is None or publish is None:
            return False
        unpublish()
        self.clients.accept()
        if not self.clients:
            return False
        publish()
        return True

    def _on_term(self, _signum: int, _frame: object) -> None:
        self.shutdown = True
        for box in self.sandboxes.all():
            box.terminate()

    def _timers(self) -> None:
        now = time.monotonic()
        self._guarded("expiry", lambda: self._expire(now))
        if now >= self.git_sync_at:
            self.git_sync_at = now + GIT_SYNC_EVERY
            self._guarded("git sync", self.git.tick)
        self._guarded("idle ends", lambda: self._idle_ends(now))
        if self.boots.to_boot and now - self.clients.asked_at >= ahead.QUIET and self._quiet():
            # One at a time, while nobody waits: a boot holds this loop for a few ms.
            self._guarded(
                "boot ahead", lambda: self.boots.boot_next(self.shutdown, now - self.clients.asked_at)
            )
        self._guarded("review", lambda: self._review_rounds(now))
        if self.stdin_pipes is not None:
            self._guarded("stdin sweep", self.stdin_pipes.sweep)
        if markwatch.due(now) and self._quiet():
            self._guarded("mark sweep", lambda: markwatch.sweep(now))

    def _expire(self, now: float) -> None:
        self.clients.expire(now)
        launch.retry_busy()
        for box in self.sandboxes.all():
            if box.kill_at is not None and now > box.kill_at:
                # Stopping still, with nothing more to send (it was None after the
                # SIGKILL: until PID 1 was reaped the sandbox counted as live again, and
                # the degraded mode's own SIGKILL, timed by ``signal``, never came).
                box.kill_at = math.inf
                box.signal(signal.SIGKILL)

    def _idle_ends(self, now: float) -> None:
        for box in list(self.sandboxes.boxes.values()):
            if box.idle_expired():
                box.terminate()
        for box in self.boots.pool.expired(now):
            box.terminate()
        self.boots.drop_replaced()

    def _review_rounds(self, now: float) -> None:
        boxes = self.sandboxes.boxes.values()
        frozen = [b for b in boxes if b.freeze_due is not None and now >= b.freeze_due]
        if frozen and self.root is not None and self._quiet():
            # A review sandbox's last command's changes, frozen while nobody waits: the
            # next command's checkpoint is then only recorded (a few ms of this loop).
            box = frozen[0]
            box.freeze_due = None
            checkpoints.freeze_ahead(box, self.root)
        wanting = [box for box in boxes if box.wants_helper or box.base_due]
        if wanting and self._quiet():
            # A review sandbox's helper for its checkpoints (a fork: a few ms), or the
            # start of a merged base's build, one at a time while nobody waits.
            box = wanting[0]
            if box.base_due is not None:
                checkpoints.build_due(box)
            else:
                with contextlib.suppress(OSError):
                    box.helper_ready()

    def _wait(self) -> float:
        """How long the loop sleeps when nothing comes: ``TICK`` (the timers' rounds), or
        until a boot ahead or a review sandbox's freeze ahead (``Box.freeze_due``) is due.
        While an exec runs or a client waits for anything but a stop, no boot is: their
        end is an event, and the turn after it looks again. (It woke
        every ``ahead.QUIET`` while a boot was pending: 200 times a second for as long as
        any exec ran, a long build's or a server's.)"""
        now = time.monotonic()
        frozen = [b.freeze_due for b in self.sandboxes.boxes.values() if b.freeze_due is not None]
        tick = min([TICK, *(due - now for due in frozen if due > now)])  # a freeze ahead's moment
        if not self.boots.to_boot or any(box.active for box in self.sandboxes.boxes.values()):
            return tick
        held = self._stops_held()
        if any(c not in held for c in self.clients):
            return tick
        due = self.clients.asked_at + min(ahead.quiet_for(r) for r in self.boots.to_boot.values())
        due = max([due, *(held[c] for c in self.clients)])
        return min(tick, max(0.0, due - now))

    def _quiet(self) -> bool:
        """No exec runs and no client waits, but for a sandbox slow to stop: booting one
        ahead now holds up nobody. A stop is waited for its first ``STOP_QUICK`` seconds:
        most take a few milliseconds, and a boot then (tens of milliseconds of this loop
        on a small machine) delayed their answer by all of it (`Sandbox.remove` right
        after an exec: 30-50 ms instead of 8). One that takes longer (a command that
        ignores SIGTERM has seconds of grace) holds no boot back."""
        now = time.monotonic()
        held = self._stops_held()
        return all(c in held and now > held[c] for c in self.clients) and not any(
            box.active for box in self.sandboxes.boxes.values()
        )

    def _stops_held(self) -> dict[Client, float]:
        """Each client waiting for a stop, and until when its wait holds boots back:
        ``STOP_QUICK`` after the first of its sandboxes was asked to stop (``_quiet``)."""
        held: dict[Client, float] = {}
        for box in self.sandboxes.boxes.values():
            if box.stop_asked is not None:
                for c in box.stoppers:
                    held[c] = min(held.get(c, math.inf), box.stop_asked + STOP_QUICK)
        return held

    # --- clients -------------------------------------------------------------------------

    def _on_client(self, c: Client, mask: int) -> None:
        if mask & _W:
            self.clients.flush(c)
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
                self.clients.drop(c)
            return
        try:
            got = c.inbox.read(_SUPERVISOR_REQUESTS)
        except wire.ConnectionClosed:
            self.clients.drop(c)
            return
        except WarrenError as e:
            self.clients.reply(c, protocol.error_message(e))
            return
        except OSError:
            self.clients.drop(c)
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
                self.clients.reply(c, protocol.error_message(e))

    def _from_running_client(self, c: Client) -> None:
        """A one-shot run's client may only send signals for its command, answer the
        pending requests of its ``--network ask`` (no reply: its connection carries the
        command's events), or hang up."""
        box = c.box
        assert box is not None and box.run is not None
        try:
            got = c.inbox.read((protocol.Signal, protocol.NetPolicyRequest))
        except (wire.ConnectionClosed, OSError, WarrenError):
            self.clients.drop(c)
            return
        if got is None:
            return
        msg, _n, fds = got
        for fd in fds:
            os.close(fd)
        if isinstance(msg, protocol.NetPolicyRequest):
            if box.run.ask and msg.action in ("approve", "reject"):
                msg.by = c.who(msg.via)
                with contextlib.suppress(WarrenError):  # answered meanwhile, timed out: nothing to do
                    box.net_policy(msg)
            return
        assert isinstance(msg, protocol.Signal)
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
            self.clients.reply(
                c, protocol.PlanReply(text=render(plan), plan=planning.json_safe(plan.to_dict()))
            )
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
            pid, uid, _gid = wire.peer_creds(c.sock)
            handoff.hand_over(
                box,
                c.sock,
                msg,
                payload_len,
                fds,
                root=self.root,
                stdin_pipes=self.stdin_pipes,
                peer={"peer_pid": pid, "uid": uid},
            )
            # PID 1's helper has the connection now; this process lets go of its copy.
            self.clients.drop(c, handed_off=True)
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
        if isinstance(msg, protocol.NetPolicyRequest):
            msg.by = c.who(msg.via)
            self.clients.reply(c, self.sandboxes.with_net(msg.sandbox).net_policy(msg))
            return
        answer = self.sandboxes.answer(msg)
        if answer is not None:
            self.clients.reply(c, *answer)
        elif isinstance(msg, protocol.StopRequest):
            self._stop(c, msg)
        elif isinstance(msg, protocol.ShutdownRequest):
            # It exits once no sandbox is left: the caller hears which still hold it.
            self.shutdown = True
            self.boots.stop()
            self.clients.reply(
                c, protocol.SandboxList(items=[self.sandboxes.info(n) for n in self.sandboxes.boxes])
            )

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
            self.clients.drop(c)
            return
        if data is None:
            return  # the rest comes with a later readable event
        msg, c.stdin = c.stdin, None
        try:
            self.sandboxes.live(msg.sandbox)
            reply: protocol.Message = self.stdin_pipes.write(msg, data)
        except WarrenError as e:
            reply = protocol.error_message(e)
        self.clients.reply(c, reply)

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
        run = Run(
            c,
            msg.command,
            fds[:stdio],
            fds[stdio] if msg.net_events else None,
            ask=msg.net_ask and msg.net_events,
        )
        c.box = self.boots.run(request, run)

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
        c.deadline = None
        self.boots.create(request, name, c)

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
        self.clients.reply(c, info)

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
            self.boots.ready(box, box.booted)
            return
        if box.creator is not None:
            try:
                self.sandboxes.record_ready(box)
            except WarrenError as e:
                # Not recorded (the state disk is full): the creator hears why, and the
                # sandbox nobody could find again ends (its end tells the creator).
                box.fail(e)
                return
            creator, box.creator = box.creator, None
            self.clients.reply(creator, self.sandboxes.info(box.name))
            if box.request is not None:
                self.boots.later(box.request)
                box.request = None

    def run_said(self, box: Box, msg: protocol.Message, fds: list[int]) -> None:
        run = box.run
        assert run is not None
        client = run.client
        if client not in self.clients or run.answered:
            return
        if isinstance(msg, protocol.Started):
            msg.warnings = [*box.plan.warnings, *msg.warnings]
            msg.ask_name = box.ask_name()
            client.outbox.put(msg, fds=fds)
            self.clients.flush(client)
        else:
            run.answered = True
            self.clients.reply(client, msg, fds=fds)

    def run_over(self, box: Box, repairs: list[str]) -> None:
        run = box.run
        assert run is not None and run.exited is not None
        if run.answered or run.client not in self.clients:
            return  # its end drops the client (``_end_run``)
        self._answer_run(box, run.exited, repairs)

    def box_ended(self, box: Box, status: int, repairs: list[str]) -> None:
        self.sandboxes.discard(box)
        self.boots.pool.forget(box)
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
            self.clients.reply(creator, protocol.error_message(error))
            return
        try:
            died = self.sandboxes.record_end(box, status, [*box.plan.warnings, *repairs], self.shutdown)
            if died is not None:
                # Nobody asked for its end (a failure, a bug, or killed from outside): its
                # clients heard "lost" (and why, asking: ``connect.lost_command``); the log
                # says what is known.
                self.notes.log("ended", f"sandbox {box.name}: {died}")
        except WarrenError as e:
            # The record keeps its old state (a full state disk): the supervisor goes on.
            print(f"warren supervisor: {box.name} ended: {e.message}", file=sys.stderr, flush=True)
        for c in box.stoppers:
            if c in self.clients:
                self.clients.reply(
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
        run.close_fds()
        client = run.client
        client.box = None
        if run.answered or client not in self.clients:
            if not client.closing:  # an answer still being written is finished (``flush``)
                self.clients.drop(client)
            return
        if run.exited is not None:
            self._answer_run(box, run.exited, repairs)
            return
        run.answered = True
        error = box.failure or SetupError(
            "the sandbox ended before its command reported",
            operation="run",
            hint="something outside killed it; run `warren doctor` if this repeats",
        )
        self.clients.reply(client, protocol.error_message(error))

    def _answer_run(self, box: Box, exited: protocol.Exited, repairs: list[str]) -> None:
        """How a run's command ended, to its client (who hears it once: ``answered``),
        and the next sandbox for the same request booted ahead once things are quiet."""
        run = box.run
        assert run is not None
        run.answered = True
        run.close_fds()
        run.client.box = None
        exited.warnings = [*exited.warnings, *repairs]
        self.clients.reply(run.client, exited)
        if box.request is not None:
            self.boots.later(box.request)
            box.request = None


def main(argv: list[str]) -> int:
    """The entry point the client starts a supervisor through (``client.connect``);
    start-up is ``daemon``'s."""
    from . import daemon

    return daemon.main(argv)
