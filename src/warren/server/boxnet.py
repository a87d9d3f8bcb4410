"""A sandbox's networking as the supervisor runs it: its network helper (``netd``),
pasta for ``--network host``, ports exposed on request, and its network log.

Only starting, asking and stopping these helpers; what they do is ``netd``'s and
``net``'s. Nothing here knows of clients or the registry.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from dataclasses import dataclass
from pathlib import Path

from .. import protocol, wire
from .._core import _sys, cgroups
from ..errors import SandboxError, WarrenError
from ..net import log as netlog
from ..net.pasta import Pasta
from ..plan import Plan
from . import netd

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..net.intercept import Interception

NETLOG_FILE = "net.jsonl"  # in a long-lived sandbox's state directory
NETLOG_MAX = 5000  # events in one reply (the newest)


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
    """Fork the sandbox's network helper: a fork of the small, single-threaded
    supervisor costs about a millisecond, an interpreter 30+. It gets its connector
    into the sandbox with the first port exposed (``expose``), not here: a connector
    is a helper of the sandbox's keeper, which stays while one lives. With
    ``leave_after`` it ends once idle that long (``netd.serve``).

    The helper starts in the sandbox's cgroups (``cgroup_dirs``, when it has any): its
    memory and threads grow with what the sandbox asks of it, so they count against the
    sandbox's limits, not the supervisor's (which a sandbox's flood would otherwise
    fill). It is a new process entering them, not one moved out of where it started."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            if cgroup_dirs:
                _enter(cgroup_dirs)
            keep = [theirs.fileno(), pid1_pidfd]
            keep += [proxy_listener.fileno()] if proxy_listener is not None else []
            keep += [events] if events is not None else []
            _sys.close_all_but(*keep)
            code = netd.serve(
                theirs,
                plan.net,
                name=name,
                pid1_pidfd=pid1_pidfd,
                log=netlog.Writer(Path(log_path) if log_path is not None else None, events),
                proxy_listener=proxy_listener,
                intercept=intercept,
                attended=attended,
                pid1=pid1,
                ask_name=ask_name,
                leave_after=leave_after,
            )
        finally:
            os._exit(code)
    theirs.close()
    if proxy_listener is not None:
        proxy_listener.close()
    ours.settimeout(5)
    return Netd(pid, os.pidfd_open(pid), ours)


def _enter(dirs: list[str]) -> None:
    """The forked helper (single-threaded still) moves itself into ``dirs``. If it cannot
    (a cgroup removed meanwhile) it serves from the supervisor's: its own memory is
    bounded by construction (``net.log``, the proxy's caps), only no longer charged."""
    with contextlib.suppress(OSError):
        cgroups.enter_self(cgroups.open_tasks(dirs))


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
