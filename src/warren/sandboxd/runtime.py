"""The one sandbox behind ``warren sandboxd``, and what both listeners share.

One long-lived warren sandbox over the workspace (the pod's ``/workspace``) for the
daemon's whole life, as ``warren serve`` keeps its sandboxes: every command runs in it
and every file operation is done by it (warren's files API runs inside the sandbox), so
what a client reaches is what the sandbox itself may reach — never the pod's
service-account token under ``/var/run/secrets`` (``/run`` and ``/var/run`` are hidden
from every sandbox), never this daemon's listeners (the sandbox has no network unless
the policy gives it one).

On top of that, the contract confines a request path to the workspace: ``paths``
refuses ``..`` out and absolute paths elsewhere as text, and ``confine`` refuses a path
whose links lead out (checked beneath a descriptor of the workspace opened at start,
``safepath.stays_beneath``). That check precedes the operation; what makes a lost race
harmless is that the operation itself is the sandbox's.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import anyio
import anyio.to_thread

from .._core import safepath
from ..client.sandbox import Sandbox
from ..client.transport import Transport
from ..errors import SetupError
from ..policy import PolicySpec
from . import paths

T = TypeVar("T")
THREADS = 256  # calls at once (each Execute, Start's polls, file operations)


@dataclass
class Proc:
    """A process started with ``Start``: the contract's id for it, warren's spawn id,
    its pid, and the file in the sandbox's /tmp naming its terminal (PTY only)."""

    ident: int
    spawn_id: str
    pid: int
    tty_file: str | None = None
    ended_by_signal: bool = False  # a PTY's: SendSignal ended its terminal (``script``)


class Runtime:
    def __init__(self, sandbox: Sandbox, transport: Transport, root: str) -> None:
        self.sandbox = sandbox
        self.transport = transport
        self.root = root
        self.rootfd = safepath.open_dir(root)
        self.procs: dict[int, Proc] = {}
        self._ids = itertools.count(1)
        self.started = time.monotonic()
        self._limiter: anyio.CapacityLimiter | None = None  # made in the event loop, at first use
        self.ready = True

    @classmethod
    def create(cls, spec: PolicySpec, transport: Transport, name: str) -> Runtime:
        root = os.path.realpath(spec.workspace or "/workspace")
        try:
            os.makedirs(root, 0o755, exist_ok=True)
        except OSError as e:
            raise SetupError.from_os(
                e,
                f"workspace {root}: {os.strerror(e.errno or 0)}",
                "sandboxd",
                root,
                hint="pass --workspace DIR (a directory this user may write)",
            ) from None
        spec.workspace = root
        sandbox = Sandbox.create(spec, name, transport=transport)
        return cls(sandbox, transport, root)

    def close(self) -> None:
        self.ready = False
        try:
            self.sandbox.remove()
        finally:
            os.close(self.rootfd)

    async def call(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        """A blocking transport call in the bounded pool (as ``warren serve``'s): a long
        Execute holds a worker thread, never the event loop or the other calls."""
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(THREADS)
        result: T = await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs), limiter=self._limiter)
        return result

    def confine(self, raw: str, operation: str) -> str:
        """``raw`` as an absolute path in the workspace (as the sandbox names it), or
        OutsideWorkspace when it leads out, as text or through a link."""
        rel = paths.relative(self.root, raw, operation)
        if not safepath.stays_beneath(self.rootfd, rel):
            raise paths.outside(raw, self.root, operation)
        return os.path.join(self.root, rel) if rel else self.root

    def add(self, spawn_id: str, pid: int, tty_file: str | None) -> Proc:
        proc = Proc(next(self._ids), spawn_id, pid, tty_file)
        self.procs[proc.ident] = proc
        return proc
