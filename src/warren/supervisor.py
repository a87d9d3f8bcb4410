"""The supervisor: one small process per user that holds every long-lived sandbox.

Why one per user, not one per sandbox: a fresh Python supervisor per sandbox costs
30+ ms to start and ~8 MiB of private memory; here a sandbox costs one clone (its
PID 1, copy-on-write from this process: measured in bench/bench_sandbox.py) and
create stays within a few milliseconds. The price — a crashed supervisor takes all
of the user's sandboxes down — is bounded: it runs no user code, and a crash leaves
nothing behind (see below) and is recorded in the registry by the next client.

Owns: creating sandboxes (clone PID 1 straight into new namespaces with
PR_SET_PDEATHSIG(SIGKILL), as a one-shot launch does), noticing when a PID 1 dies,
stopping sandboxes, and writing their state to the registry. Exec and file requests
never pass through here: clients talk to each sandbox's PID 1 directly.

If this process is SIGKILLed, every PID 1 gets SIGKILL from the kernel (parent death
signal); a pid namespace whose init dies is killed whole, and its mount namespace
goes with its last process. Single-threaded on purpose: the parent-death signal
fires when the *thread* that cloned PID 1 exits.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pickle
import select
import selectors
import signal
import socket
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import _sys, launch, netd, netns, registry, sandbox_init, wire
from .errors import WarrenError
from .plan import Plan

IDLE_EXIT = 5.0  # seconds without any sandbox before the supervisor exits
STOP_KILL_AFTER = sandbox_init.STOP_GRACE + 1.0


@dataclass
class _Sandbox:
    name: str
    id: str
    workspace: str
    pid1: int
    sock_path: str
    ready_fd: int
    alive_fd: int
    creator: socket.socket | None
    ready: bool = False
    buf: bytes = b""
    stopping: list[socket.socket] = field(default_factory=list)
    kill_at: float | None = None
    remove: bool = False
    netd: socket.socket | None = None  # control socket of its network helper
    netd_pidfd: int = -1
    pasta: netns.Pasta | None = None
    plan: Plan | None = None


class Supervisor:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.registry = registry.Registry(root)
        self.boxes: dict[str, _Sandbox] = {}
        self.by_pid: dict[int, _Sandbox] = {}
        self.sel = selectors.DefaultSelector()
        self.start_time = registry.process_start_time(os.getpid()) or 0
        self.idle_since = time.monotonic()
        self.wake_r, self.wake_w = socket.socketpair()

    def serve(self, listener: socket.socket) -> None:
        for s in (listener, self.wake_r, self.wake_w):
            s.setblocking(False)
        signal.set_wakeup_fd(self.wake_w.fileno(), warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: None)
        for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_IGN)
        self.sel.register(listener, selectors.EVENT_READ, ("accept", None))
        self.sel.register(self.wake_r, selectors.EVENT_READ, ("wake", None))
        while True:
            for key, _ in self.sel.select(0.25):
                kind, box = key.data
                if kind == "accept":
                    self._accept(listener)
                elif kind == "wake":
                    with contextlib.suppress(BlockingIOError):
                        while self.wake_r.recv(4096):
                            pass
                elif kind == "ready":
                    self._on_ready(box)
                else:
                    self.sel.unregister(key.fileobj)
                    self._handle(key.fileobj)  # type: ignore[arg-type]
            self._reap()
            now = time.monotonic()
            for box in list(self.boxes.values()):
                if box.kill_at is not None and now > box.kill_at:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(box.pid1, signal.SIGKILL)
                    box.kill_at = None
            if self.boxes:
                self.idle_since = now
            elif now - self.idle_since > IDLE_EXIT:
                return

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            conn.setblocking(True)
            conn.settimeout(10)
            if wire.peer_uid(conn) != os.getuid():
                conn.close()
                continue
            self.sel.register(conn, selectors.EVENT_READ, ("conn", None))

    def _handle(self, conn: socket.socket) -> None:
        try:
            msg, payload, fds = wire.recv(conn)
        except (wire.ConnectionClosed, OSError, ValueError):
            conn.close()
            return
        for fd in fds:
            os.close(fd)
        keep = False
        try:
            op = msg.get("op")
            if op == "create":
                keep = self._create(conn, msg, payload)
            elif op == "stop":
                keep = self._stop(conn, str(msg["name"]), bool(msg.get("remove")))
            elif op == "expose":
                wire.send(conn, self._expose(msg))
            else:
                wire.send(conn, {"ok": True, "pid": os.getpid()})
        except OSError:
            pass
        finally:
            if not keep:
                conn.close()

    # --- create -------------------------------------------------------------------

    def _create(self, conn: socket.socket, msg: dict[str, Any], payload: bytes) -> bool:
        name = str(msg["name"])
        existing = self.registry.get(name)
        if name in self.boxes or (existing is not None and existing.state == registry.RUNNING):
            wire.send(
                conn,
                _error(
                    "SandboxExists",
                    f"a sandbox named {name} is already running",
                    name,
                    f"use it (warren exec {name} -- ...), or stop it first (warren stop {name})",
                ),
            )
            return False
        plan: Plan = pickle.loads(payload)
        workspace = str(msg["workspace"])
        box_id = uuid.uuid4().hex[:12]
        sock_path = str(self.root / "run" / f"{box_id}.sock")
        listener = wire.listen(sock_path)
        launch.seccomp_program(plan)
        ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
        alive_r, alive_w = os.pipe2(os.O_CLOEXEC)
        channel = netns.Channel(plan)
        try:
            pid = _sys.clone_process(launch.NS_FLAGS)
        except OSError as e:
            for fd in (ready_r, ready_w, alive_r, alive_w):
                os.close(fd)
            channel.close()
            listener.close()
            os.unlink(sock_path)
            wire.send(
                conn,
                _error(
                    "SetupError",
                    "cannot create the sandbox's namespaces",
                    None,
                    "unprivileged user namespaces may be disabled: run `warren doctor`",
                    e.errno,
                ),
            )
            return False
        if pid == 0:
            self._in_pid1(plan, workspace, listener, ready_w, alive_r, channel)
        listener.close()
        os.close(ready_w)
        os.close(alive_r)
        net_ours = channel.in_parent()
        box = _Sandbox(name, box_id, workspace, pid, sock_path, ready_r, alive_w, conn, plan=plan)
        self.boxes[name] = box
        self.by_pid[pid] = box
        self.sel.register(ready_r, selectors.EVENT_READ, ("ready", box))
        if net_ours is not None:
            try:
                net = netns.complete(plan, net_ours, pid)
            except WarrenError as e:
                # PID 1 gives up; its end is reaped as a sandbox that never got ready.
                box.creator = None
                wire.send(conn, e.to_dict())
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                return False
            if isinstance(net, netns.Pasta):
                box.pasta = net
            elif net is not None:
                self._start_netd(box, plan, net)
        return True

    def _start_netd(self, box: _Sandbox, plan: Plan, proxy_listener: socket.socket | None) -> None:
        """Fork the sandbox's network helper (``netd``): a fork of this small,
        single-threaded process costs about a millisecond, an interpreter 30+."""
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.set_wakeup_fd(-1)
                keep = [theirs.fileno()] + ([proxy_listener.fileno()] if proxy_listener is not None else [])
                launch.close_all_but(*keep)
                code = netd.serve(
                    theirs,
                    plan,
                    name=box.name,
                    pid1=box.pid1,
                    pid1_socket=box.sock_path,
                    log_path=self.root / "sandboxes" / box.name / "net.jsonl",
                    proxy_listener=proxy_listener,
                )
            finally:
                os._exit(code)
        theirs.close()
        if proxy_listener is not None:
            proxy_listener.close()
        ours.settimeout(10)
        box.netd, box.netd_pidfd = ours, os.pidfd_open(pid)  # before any reaping

    def _expose(self, msg: dict[str, Any]) -> dict[str, Any]:
        name = str(msg["name"])
        box = self.boxes.get(name)
        if box is None or not box.ready:
            return _error("SandboxNotFound", f"no running sandbox named {name}", name, "see `warren ls`")
        if box.netd is None:
            assert box.plan is not None
            self._start_netd(box, box.plan, None)
        assert box.netd is not None
        try:
            wire.send(box.netd, {"op": "expose", "port": int(msg["port"]), "host_port": msg.get("host_port")})
            reply, _, _ = wire.recv(box.netd)
        except (wire.ConnectionClosed, OSError) as e:
            return _error(
                "SandboxError",
                f"the network helper of sandbox {name} did not answer",
                name,
                "the sandbox may be ending; check `warren ls`",
                getattr(e, "errno", None),
            )
        return reply

    def _in_pid1(
        self,
        plan: Plan,
        workspace: str,
        listener: socket.socket,
        ready_w: int,
        alive_r: int,
        channel: netns.Channel,
    ) -> None:
        """The cloned child: never returns into the supervisor's loop."""
        code = 125
        try:
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            net = channel.in_child()  # before close_all_but, which closes our end's fd
            launch.close_all_but(listener.fileno(), ready_w, alive_r, *channel.child_fds())
            code = sandbox_init.pid1_main(plan, workspace, listener, ready_w, alive_r, net)
        except launch.Failure as f:
            launch.report(ready_w, f.record)
        except BaseException as e:
            launch.report(
                ready_w,
                {"error": "SetupError", "message": f"sandbox PID 1 crashed: {e!r}", "operation": "setup"},
            )
        os._exit(code)

    def _on_ready(self, box: _Sandbox) -> None:
        chunk = os.read(box.ready_fd, 65536)
        box.buf += chunk
        if chunk and b"\n" not in box.buf:
            return
        self.sel.unregister(box.ready_fd)
        os.close(box.ready_fd)
        import json

        lines = [json.loads(line) for line in box.buf.decode(errors="replace").splitlines() if line.strip()]
        record = lines[0] if lines else {}
        creator = box.creator
        box.creator = None
        if record.get("ready"):
            box.ready = True
            self.registry.add(
                registry.Entry(
                    name=box.name,
                    id=box.id,
                    state=registry.RUNNING,
                    reason="",
                    workspace=box.workspace,
                    created=registry.now(),
                    supervisor_pid=os.getpid(),
                    supervisor_start=self.start_time,
                    pid1=box.pid1,
                    socket=box.sock_path,
                )
            )
            reply: dict[str, Any] = {"ok": True, "id": box.id, "socket": box.sock_path, "pid1": box.pid1}
        else:
            reply = record or _error(
                "SetupError", "the sandbox ended during setup without a report", None, "run `warren doctor`"
            )
            with contextlib.suppress(ProcessLookupError):
                os.kill(box.pid1, signal.SIGKILL)
        if creator is not None:
            with contextlib.suppress(OSError):
                wire.send(creator, reply)
            creator.close()

    # --- stop and death -----------------------------------------------------------

    def _stop(self, conn: socket.socket, name: str, remove: bool) -> bool:
        box = self.boxes.get(name)
        if box is None:
            entry = self.registry.get(name)
            if entry is None:
                wire.send(
                    conn, _error("SandboxNotFound", f"no sandbox named {name}", name, "see `warren ls`")
                )
                return False
            if remove:
                self.registry.remove(name)
            wire.send(conn, {"ok": True, "state": entry.state})
            return False
        box.stopping.append(conn)
        box.remove = box.remove or remove
        if box.kill_at is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(box.pid1, signal.SIGTERM)
            box.kill_at = time.monotonic() + STOP_KILL_AFTER
        return True

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            box = self.by_pid.pop(pid, None)
            if box is not None:
                self._ended(box, status)

    def _ended(self, box: _Sandbox, status: int) -> None:
        self.boxes.pop(box.name, None)
        os.close(box.alive_fd)
        # Its network helper and pasta end before anyone hears the sandbox ended, so
        # an exposed port is closed by the time stop/rm returns.
        if box.netd is not None:
            box.netd.close()
            # A pidfd, not the pid: the helper may already be reaped and its pid reused.
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(box.netd_pidfd, signal.SIGKILL)
                select.select([box.netd_pidfd], [], [], 2.0)
            os.close(box.netd_pidfd)
        if box.pasta is not None:
            box.pasta.stop()
        with contextlib.suppress(OSError):
            os.unlink(box.sock_path)
        if box.creator is not None:  # died during setup
            self._on_ready(box)
        if box.stopping:
            if box.remove:
                self.registry.remove(box.name)
            else:
                self.registry.set_state(box.name, box.id, registry.STOPPED, "stopped on request")
        elif box.ready:
            how = (
                f"killed by signal {signal.Signals(os.WTERMSIG(status)).name}"
                if os.WIFSIGNALED(status)
                else f"exited with status {os.waitstatus_to_exitcode(status)}"
            )
            self.registry.set_state(
                box.name, box.id, registry.DEAD, f"the sandbox's PID 1 ({box.pid1}) was {how}"
            )
        for conn in box.stopping:
            with contextlib.suppress(OSError):
                wire.send(conn, {"ok": True, "state": registry.STOPPED})
            conn.close()


def _error(kind: str, message: str, path: str | None, hint: str, err: int | None = None) -> dict[str, Any]:
    return {
        "error": kind,
        "message": message,
        "operation": "supervisor",
        "path": path,
        "errno": err,
        "hint": hint,
    }


def main(argv: list[str]) -> int:
    root = registry.ensure_state_dir(Path(argv[0]))
    ready_fd = int(argv[1]) if len(argv) > 1 else -1
    os.chdir("/")
    lock = os.open(root / "supervisor.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        # Another supervisor serves this state directory; wait until it is gone or
        # answering, then let the client connect to whichever is up.
        if ready_fd >= 0:
            os.write(ready_fd, b"other\n")
        return 0
    listener = wire.listen(str(root / "supervisor.sock"))
    if ready_fd >= 0:
        os.write(ready_fd, b"ready\n")
        os.close(ready_fd)
    sup = Supervisor(root)
    try:
        sup.serve(listener)
    finally:
        # Stop accepting before releasing the lock, so a racing client either
        # reached us (and gets an answer) or starts the next supervisor.
        with contextlib.suppress(OSError):
            os.unlink(root / "supervisor.sock")
        listener.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
