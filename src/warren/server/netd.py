"""The network helper of one sandbox: its allowlist proxy and its exposed ports.

Started for the supervisor by its spawner (``boxnet.start_netd``: a clone that
shares the spawner's quiet pages; a fork of the supervisor, which stays
single-threaded for the parent-death signal's sake, where no spawner can be had)
when a sandbox in ``--network allow`` starts, or on its first ``expose``:

    supervisor ── netd (this: the host's network namespace, threads)
                   ├─ proxy: accepts on the socket PID 1 made inside the sandbox
                   │   (``net.proxy``); each decision goes to the sandbox's net log
                   │   and, for a one-shot run, to the client's event pipe
                   └─ exposes: a listening socket on the host's 127.0.0.1 per port; each
                       connection is joined to a socket a connector (a helper of the
                       sandbox's keeper, given with the first port and let go with the
                       last) opens to 127.0.0.1:PORT *inside* the sandbox

It ends when the sandbox's PID 1 does (a pidfd), or when the supervisor does (its
control socket closes; also the parent-death signal), closing every port with it; a
long-lived sandbox's also once idle (``leave_after``), the next started by the
supervisor when a connection waits for the proxy.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import select
import selectors
import signal
import socket
import threading
import time

from .. import protocol, wire
from .._core import kernel
from ..errors import PolicyError, PortUnavailable, ProtocolError, SandboxError, WarrenError
from ..net import asker
from ..net import log as netlog
from ..net.allowlist import Allowlist, NetEvent
from ..net.live import LivePolicy
from ..net.proxy import Proxy, now, relay
from ..plan.model import NetPlan

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..net.intercept import Interception


class _Connector:
    """Sockets connected inside the sandbox, one request at a time, through a helper of
    the sandbox's keeper: held while a port is exposed (``attach``), none otherwise (a
    connector keeps the keeper, so an idle sandbox could not shed it)."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.lock = threading.Lock()

    def attach(self, sock: socket.socket | None) -> None:
        """Connect through ``sock`` from now on; None: through nothing (the helper at the
        other end sees its connection close and ends)."""
        with self.lock:
            old, self.sock = self.sock, sock
        if old is not None:
            old.close()

    def connect(self, port: int) -> socket.socket | None:
        with self.lock:
            if self.sock is None:
                return None
            wire.send(self.sock, protocol.ConnectRequest(port=port))
            reply, _, fds = wire.recv(self.sock, (protocol.Connected,), max_payload=0)
        for extra in fds[1:]:
            os.close(extra)
        assert isinstance(reply, protocol.Connected)
        return socket.socket(fileno=fds[0]) if reply.ok and fds else None


NAME = "warren-netd"
MAX_EXPOSED_CONNECTIONS = 512  # open at once per exposed port: each is a thread here


class _Expose:
    """127.0.0.1:host_port on the host -> 127.0.0.1:port inside the sandbox. Any local
    user can connect to it, so open connections are capped: past the cap a new one is
    reset at once (as a full server would), not given a thread."""

    def __init__(self, port: int, host_port: int, connector: _Connector) -> None:
        self.port = port
        self.connector = connector
        self.slots = threading.BoundedSemaphore(MAX_EXPOSED_CONNECTIONS)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", host_port))
        self.listener.listen(128)
        self.host_port = int(self.listener.getsockname()[1])
        self.address = f"127.0.0.1:{self.host_port}"
        threading.Thread(target=self._accept_loop, daemon=True).start()

    def close(self) -> None:
        """No new connection: shutting the listener down wakes its accept (a close alone
        would not); connections already relayed run until either end closes."""
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    time.sleep(0.05)  # out of descriptors for now: connections wait in the backlog
                    continue
                return
            if not self.slots.acquire(blocking=False):
                _reset(client)
                continue
            try:
                threading.Thread(target=self._serve, args=(client,), daemon=True).start()
            except RuntimeError:  # no thread to be had: the sandbox's pids limit counts this helper
                self.slots.release()
                _reset(client)

    def _serve(self, client: socket.socket) -> None:
        inside: socket.socket | None = None
        try:
            inside = self.connector.connect(self.port)
            if inside is None:
                # Nothing listens inside: refuse the way a closed port would.
                _reset(client)
                return
            relay(client, inside)
        except (OSError, WarrenError, wire.ConnectionClosed):
            pass
        finally:
            client.close()
            if inside is not None:
                inside.close()
            self.slots.release()


def _reset(sock: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0), the way a closed or full port answers."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()


def serve(
    ctl: socket.socket,
    net: NetPlan,
    *,
    name: str,
    pid1_pidfd: int,
    log: netlog.Writer,
    proxy_listener: socket.socket | None,
    intercept: Interception | None = None,
    attended: bool = True,
    pid1: int = 0,
    ask_name: str | None = None,
    leave_after: float | None = None,
) -> int:
    """The helper's main loop; returns its exit code. ``attended``: a sandbox a request
    can name (``warren net NAME``), so an ``--network ask`` connection may wait;
    ``pid1``: its PID 1 as this host numbers it (who asked, ``net.asker``); ``ask_name``:
    a one-shot run that asks on its client's terminal, the name ``warren net`` reaches it
    by (said to the client first, a record of kind "ask"). ``leave_after``: end once
    that long without a connection (none open), a port exposed, a change to the live
    policy or a message waiting (``_may_leave``); the supervisor starts the next helper
    when the proxy's listener has a connection for it (``server.box``)."""
    kernel.die_with_parent()
    with contextlib.suppress(OSError), open("/proc/thread-self/comm", "w") as comm:
        comm.write(NAME)  # how `ps` and the tests tell it from the supervisor
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    live = LivePolicy(net.rules, ask_timeout=net.ask_timeout, attended=attended)
    if ask_name is not None and live.asks:
        log(NetEvent(now(), ask_name, "ASK", ask_name, 0, True, "answered on the terminal", kind="ask"))
    proxy: Proxy | None = None
    if proxy_listener is not None:
        proxy = Proxy(
            proxy_listener,
            Allowlist(net.rules),
            sandbox=name,
            resolve=dict(net.resolve),
            on_event=log,
            intercept=intercept,
            live=live,
            asker=functools.partial(asker.of_connection, pid1, proxy_listener.getsockname()[1])
            if pid1 and net.ask_timeout is not None
            else None,
        ).start()
    exposes: dict[int, _Expose] = {}
    conn = _Connector()
    ctl.setblocking(True)
    # selectors (epoll), not select(): the supervisor may hold thousands of descriptors,
    # and this helper's copies of them can be numbered past select()'s limit of 1024.
    sel = selectors.DefaultSelector()
    sel.register(pid1_pidfd, selectors.EVENT_READ, "pid1")
    sel.register(ctl, selectors.EVENT_READ, "ctl")
    while True:
        ready = {key.data for key, _ in sel.select(None if leave_after is None else leave_after / 2)}
        if "pid1" in ready:
            log.close()
            return 0
        if not ready:
            if leave_after is not None and _may_leave(ctl, exposes, live, proxy, leave_after):
                log.close()
                return 0
            continue
        try:
            msg, _, fds = wire.recv(
                ctl,
                (
                    protocol.ExposeRequest,
                    protocol.UnexposeRequest,
                    protocol.NetPolicyRequest,
                    protocol.NetEvents,
                ),
                max_payload=0,
            )
        except (wire.ConnectionClosed, OSError, ProtocolError):
            log.close()
            return 0
        if isinstance(msg, protocol.NetEvents) and fds:
            log.attach(fds.pop(0))
            wire.send(ctl, protocol.Ok())
        if isinstance(msg, protocol.ExposeRequest) and fds:
            conn.attach(socket.socket(fileno=fds.pop(0)))
        for fd in fds:
            os.close(fd)
        if isinstance(msg, protocol.NetEvents):
            continue
        if isinstance(msg, protocol.UnexposeRequest):
            closed = exposes.pop(msg.port, None)
            if closed is not None:
                closed.close()
            if not exposes:
                conn.attach(None)
            wire.send(ctl, protocol.Ok())
            continue
        if isinstance(msg, protocol.NetPolicyRequest):
            try:
                reply: protocol.Message = _policy(msg, live, log, name)
            except WarrenError as e:
                reply = protocol.error_message(e)
            wire.send(ctl, reply)
            continue
        assert isinstance(msg, protocol.ExposeRequest)
        reply = _expose(msg, exposes, conn)
        if not exposes:
            conn.attach(None)  # the first port refused: no connector held for none
        wire.send(ctl, reply)


def _may_leave(
    ctl: socket.socket, exposes: dict[int, _Expose], live: LivePolicy, proxy: Proxy | None, after: float
) -> bool:
    """Nothing here a new helper could not start from: no port exposed, the live policy
    as it started (nothing added, denied or waiting), no message from the supervisor
    waiting, and the proxy idle (then it accepts no more: a connection waits in the
    backlog for the next helper)."""
    if exposes or live.added or live.denied or live.waiting():
        return False
    waiting = select.poll()
    waiting.register(ctl, select.POLLIN)
    if waiting.poll(0):
        return False
    return proxy is None or proxy.leave_if_idle(after)


def _policy(
    msg: protocol.NetPolicyRequest, live: LivePolicy, log: netlog.Writer, name: str
) -> protocol.NetPolicy:
    """Show or change the live policy, or answer a pending request; every change is a
    record of the network log (kind "policy"), with who asked."""
    changed = False

    def record(action: str, target: str, allowed: bool, reason: str) -> None:
        log(NetEvent(now(), name, action, target, 0, allowed, reason, kind="policy", by=msg.by))

    if msg.action in ("allow", "deny"):
        rule, changed = (live.allow if msg.action == "allow" else live.deny)(msg.rule)
        if changed:
            what = "allowed from now on" if msg.action == "allow" else "refused from now on"
            record(msg.action.upper(), rule.text, msg.action == "allow", what)
    elif msg.action in ("approve", "reject"):
        approve = msg.action == "approve"
        asked = live.answer(msg.id, approve, msg.always)
        action = ("APPROVE-ALWAYS" if msg.always else "APPROVE") if approve else "REJECT"
        reason = f"request {asked.id} ({asked.method}, {asked.waiting} connection(s) waiting)"
        if approve and msg.always:
            reason += "; allowed for the sandbox's life"
        record(action, asked.target, approve, reason)
        changed = True
    elif msg.action not in ("show", "pending"):
        raise PolicyError(
            f"unknown network policy action {msg.action!r}",
            operation="net",
            hint="use show, allow, deny, pending, approve or reject",
        )
    base, added, denied = live.rules()
    at = time.monotonic()
    return protocol.NetPolicy(
        mode="ask" if live.ask_timeout is not None else "allow",
        allowed=base,
        added=added,
        denied=denied,
        ask_timeout=live.ask_timeout or 0.0,
        pending=[
            protocol.NetPendingRecord(
                id=p.id,
                method=p.method,
                host=p.host,
                port=p.port,
                age=round(at - p.since, 3),
                waiting=p.waiting,
                process=p.process,
            )
            for p in live.waiting()
        ],
        changed=changed,
    )


def _expose(msg: protocol.ExposeRequest, exposes: dict[int, _Expose], conn: _Connector) -> protocol.Message:
    current = exposes.get(msg.port)
    if current is not None and msg.host_port in (0, current.host_port):
        return protocol.Exposed(address=current.address)
    try:
        expose = _Expose(msg.port, msg.host_port, conn)
    except OSError as e:
        # In use, or privileged (below 1024 for an ordinary user): the request's port,
        # not a failure of warren's. Anything else (no descriptor left) is.
        unavailable = e.errno in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL)
        return protocol.error_message(
            (PortUnavailable if unavailable else SandboxError).from_os(
                e,
                f"cannot listen on 127.0.0.1:{msg.host_port} on the host: {os.strerror(e.errno or 0)}",
                "expose",
                hint="choose another host port, or pass none to get a free one",
            )
        )
    if current is not None:
        current.close()  # moved to another host port: the old one is no longer a way in
    exposes[msg.port] = expose
    return protocol.Exposed(address=expose.address)
