"""The messages that carry work into a sandbox: the supervisor's handoff of a
client's request (and its connection) to PID 1, an exec helper telling the process
it forked ahead of time what to become, and the network helper's connector (sockets
connected inside the sandbox).
"""

from __future__ import annotations

from .base import Message
from .client import ExecRequest, FileRequest, PsRequest, SignalRequest, SpawnRequest


class Handoff(Message):
    """A request for PID 1 (a client's, or the network helper's ``ConnectorRequest``),
    then descriptors — the client's connection first, then the request's own.
    ``payload``: bytes of it still in the connection (a file to write).
    ``spawn_id``/``spawned``: what the supervisor knows of background processes (their
    logs are its)."""

    TAG = "handoff"
    request: ExecRequest | SpawnRequest | FileRequest | PsRequest | SignalRequest | ConnectorRequest
    payload: int = 0
    spawn_id: str | None = None
    spawned: dict[str, str] = {}
    # Descriptors after the request's own, by name: "active" (held while an exec runs:
    # the supervisor sees it end), or "synced" (the same where the sandbox has
    # repositories: the answer waits for their sync) and "gitwatch.N" (a watch on each
    # one's tree: nothing queued, no wait), "LIMIT:KEY" (a cgroup counter file, e.g.
    # "memory:oom_kill", read before and after the command to tell a limit it hit).
    extra: list[str] = []
    # An exec the supervisor gave the spare helper's command process itself (the exec
    # stub, with the command's stdio: a wake-up and the helper's work off the path):
    # the helper follows it. ``before``: the counters in ``extra``, read just before.
    launched: bool = False
    before: dict[str, int] = {}


class Launch(Message):
    """Inside a sandbox, from an exec helper to the process it forked ahead of time:
    become this command. Descriptors: the command's stdin, stdout and stderr;
    ``ctty`` names the one that is its controlling terminal (-1: none)."""

    TAG = "launch"
    path: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    ctty: int = -1


class ConnectorRequest(Message):
    """The sandbox's network helper asks PID 1 for a connector: on this connection,
    each ``ConnectRequest`` gets back a socket connected *inside* the sandbox."""

    TAG = "connector"


class ConnectRequest(Message):
    TAG = "connect"
    port: int


class Connected(Message):
    """The connected socket is attached (none when nothing listens on the port)."""

    TAG = "connected"
    ok: bool
