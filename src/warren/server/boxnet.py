"""A sandbox's networking as the supervisor runs it: its network helper (``netd``),
pasta for ``--network host``, ports exposed on request, and its network log.

Only starting, asking and stopping these helpers; what they do is ``netd``'s and
``net``'s. Nothing here knows of clients or the registry.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import socket
from dataclasses import dataclass
from pathlib import Path

from .. import protocol, wire
from .._core import cgroups, clone, spawner
from ..errors import SandboxError, WarrenError
from ..net import log as netlog
from ..net.pasta import Pasta
from ..net.secrets import HttpRule, PlacedSecret
from ..plan import Plan
from ..plan.model import NetPlan
from . import netd

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..net.intercept import Interception
    from ..net.tlsca import CA

NETLOG_FILE = "net.jsonl"  # in a long-lived sandbox's state directory
NETLOG_MAX = 5000  # events in one reply (the newest)
NETD_HELPER = "netd"  # its name among the spawner's helpers


@dataclass
class Netd:
    pid: int
    pidfd: int
    ctl: socket.socket


def start_netd(
    plan: Plan,
    pid1_pidfd: int,
    *,
    name: str,
    log_path: str | None,
    events: int | None,
    proxy_listener: socket.socket | None,
    intercept: Interception | None = None,
    cgroup_dirs: list[str] | None = None,
    attended: bool = True,
    pid1: int = 0,
    ask_name: str | None = None,
    leave_after: float | None = None,
) -> Netd:
    """Start the sandbox's network helper: a child of the spawner (``spawner.HELPERS``),
    whose pages it shares, unlike a fork of the supervisor, which soon owned about 6 MB
    of its own (every page the supervisor wrote after the fork); a fork of the
    supervisor where no spawner can be had. Either costs about a millisecond, an
    interpreter 30+. It gets its connector into the sandbox with the first port exposed
    (``expose``), not here: a connector is a helper of the sandbox's keeper, which
    stays while one lives. With ``leave_after`` it ends once idle that long
    (``netd.serve``).

    The helper starts in the sandbox's cgroups (``cgroup_dirs``, when it has any): its
    memory and threads grow with what the sandbox asks of it, so they count against the
    sandbox's limits, not the supervisor's (which a sandbox's flood would otherwise
    fill). It is a new process entering them, not one moved out of where it started."""
    start = _Start(
        net=plan.net,
        name=name,
        log_path=log_path,
        attended=attended,
        pid1=pid1,
        ask_name=ask_name,
        leave_after=leave_after,
        intercept=None if intercept is None else _Intercept.of(intercept),
        proxy=proxy_listener is not None,
        events=events is not None,
    )
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    given = [pid1_pidfd, *([proxy_listener.fileno()] if proxy_listener is not None else [])]
    given += [events] if events is not None else []
    try:
        pid = _started(start, theirs, given, cgroup_dirs or [])
    finally:
        theirs.close()
        if proxy_listener is not None:
            proxy_listener.close()
    ours.settimeout(5)
    return Netd(pid, os.pidfd_open(pid), ours)


@dataclass(frozen=True)
class _Intercept:
    """An ``Interception`` as it travels to its helper: its fields, not its caches."""

    secrets: tuple[PlacedSecret, ...]
    values: dict[str, bytes]
    rules: tuple[HttpRule, ...]
    ca: CA
    extra_cadata: str | None

    @classmethod
    def of(cls, i: Interception) -> _Intercept:
        return cls(tuple(i.secrets), dict(i.values), tuple(i.rules), i.ca, i.extra_cadata)

    def made(self) -> Interception:
        from ..net.intercept import Interception

        return Interception(list(self.secrets), self.values, list(self.rules), self.ca, self.extra_cadata)


@dataclass(frozen=True)
class _Start:
    """What a network helper starts with besides its descriptors (its channel, PID 1's
    pidfd, then the proxy's listener and the event pipe where ``proxy`` and ``events``)."""

    net: NetPlan
    name: str
    log_path: str | None
    attended: bool
    pid1: int
    ask_name: str | None
    leave_after: float | None
    intercept: _Intercept | None
    proxy: bool
    events: bool


def _started(start: _Start, theirs: socket.socket, given: list[int], cgroup_dirs: list[str]) -> int:
    """The helper started (``clone.start_helper``), its pid. ``start`` goes in a memfd
    only the helper reads: it holds the secrets' values, which the spawner (whose
    memory every joined keeper copies) must never have."""
    try:
        tasks = cgroups.open_tasks(cgroup_dirs)
    except OSError:
        tasks = []  # a cgroup removed meanwhile: it serves uncharged (its own caps bound it)
    try:
        args = os.memfd_create("warren-netd", os.MFD_CLOEXEC)
        try:
            with open(args, "wb", closefd=False) as out:
                pickle.dump(start, out, protocol=pickle.HIGHEST_PROTOCOL)
            os.lseek(args, 0, os.SEEK_SET)
            return clone.start_helper(NETD_HELPER, theirs, tasks, [args, *given])
        finally:
            os.close(args)
    finally:
        for _path, fd in tasks:
            os.close(fd)


def _netd_in_spawner(ctl: socket.socket, tasks: list[tuple[str, int]], fds: list[int]) -> int:
    """The helper's start in its child of the spawner (``spawner.HELPERS``)."""
    with contextlib.suppress(OSError):
        cgroups.enter_self(tasks)
    with open(fds[0], "rb") as source:
        start = pickle.load(source)
    assert isinstance(start, _Start)
    return _serve(start, ctl, fds[1:])


spawner.HELPERS[NETD_HELPER] = _netd_in_spawner


def _serve(start: _Start, ctl: socket.socket, given: list[int]) -> int:
    """In the helper: its descriptors named (``_Start``), then ``netd.serve``."""
    pid1_pidfd, rest = given[0], given[1:]
    proxy_listener = socket.socket(fileno=rest.pop(0)) if start.proxy else None
    events = rest.pop(0) if start.events else None
    return netd.serve(
        ctl,
        start.net,
        name=start.name,
        pid1_pidfd=pid1_pidfd,
        log=netlog.Writer(Path(start.log_path) if start.log_path is not None else None, events),
        proxy_listener=proxy_listener,
        intercept=None if start.intercept is None else start.intercept.made(),
        attended=start.attended,
        pid1=start.pid1,
        ask_name=start.ask_name,
        leave_after=start.leave_after,
    )


def stop_netd(helper: Netd) -> None:
    helper.ctl.close()
    with contextlib.suppress(OSError):
        signal.pidfd_send_signal(helper.pidfd, signal.SIGKILL)
    os.close(helper.pidfd)


def start_pasta(pid1: int, search_path: str | None) -> Pasta:
    return Pasta.spawn(pid1, search_path)


def pasta_fd(pasta: Pasta | None) -> int:
    return -1 if pasta is None or pasta.pidfd is None else pasta.pidfd


def check_ports(msg: protocol.ExposeRequest) -> None:
    for value, what, low in ((msg.port, "port", 1), (msg.host_port, "host_port", 0)):
        if not low <= value <= 65535:
            raise SandboxError(
                f"{what} must be a TCP port number, got {value!r}",
                operation="expose",
                hint="ports are 1-65535 (host_port 0 picks a free one)",
            )


def _ask(
    helper: Netd,
    name: str,
    msg: protocol.Message,
    expect: tuple[type[protocol.Message], ...],
    *,
    fds: list[int] | None = None,
    failed: str,
    operation: str,
    hint: str,
) -> protocol.Message:
    """One exchange with sandbox ``name``'s network helper: ``msg`` (with ``fds``), and
    its answer; a helper that does not answer is a ``SandboxError`` saying ``failed``."""
    try:
        wire.send(helper.ctl, msg, fds=fds or [])
        reply, _, got = wire.recv(helper.ctl, expect, max_payload=0)
    except (wire.ConnectionClosed, OSError, WarrenError) as e:
        raise SandboxError(
            f"the network helper of sandbox {name} {failed}",
            operation=operation,
            path=name,
            errno=getattr(e, "errno", None),
            hint=hint,
        ) from None
    for fd in got:
        os.close(fd)
    return reply


def expose(
    helper: Netd,
    name: str,
    msg: protocol.ExposeRequest | protocol.UnexposeRequest | protocol.NetPolicyRequest,
    connector: socket.socket | None = None,
) -> protocol.Message:
    """Ask sandbox ``name``'s network helper to expose a port, to close one, or about its
    live policy (``net.live``); its answer. ``connector``: with an ``ExposeRequest``
    when it holds no port yet, its way into the sandbox (it drops it again once it
    holds none)."""
    return _ask(
        helper,
        name,
        msg,
        (protocol.Exposed, protocol.Ok, protocol.NetPolicy, protocol.Error),
        fds=[connector.fileno()] if connector is not None else None,
        failed="did not answer",
        operation="net" if isinstance(msg, protocol.NetPolicyRequest) else "expose",
        hint="the sandbox may be ending; check `warren ls`",
    )


def attach_events(helper: Netd, name: str, events: int) -> None:
    """Give sandbox ``name``'s network helper the pipe its proxy's decisions go to from
    now on (a run's, when the run takes a sandbox booted ahead), and wait until it
    writes there: the run's command starts after this."""
    _ask(
        helper,
        name,
        protocol.NetEvents(),
        (protocol.Ok,),
        fds=[events],
        failed="did not take the run's event pipe",
        operation="network",
        hint="run the command again: it gets a fresh sandbox",
    )


def read_log(sandbox_dir: str) -> protocol.Message:
    """The newest events of a sandbox's network log."""
    events = netlog.read(Path(sandbox_dir) / NETLOG_FILE)
    return protocol.NetLog(events=[protocol.NetEventRecord(**e.to_dict()) for e in events[-NETLOG_MAX:]])
