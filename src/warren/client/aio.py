"""``AsyncSandbox``: the long-lived sandbox API for asyncio callers.

Exactly the methods and parameters of ``Sandbox`` (a test compares their signatures),
derived from them: each method is ``Sandbox``'s own run in a worker thread
(``_threaded``), so many execs can be awaited at once without blocking the event loop,
and nothing of a request is written twice. Callbacks (``on_stdout``) are called from
that worker thread. What hands back a handle (a sandbox, a process) hands back the
async one.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

from ..models import SandboxInfo
from ..output import DEFAULT_OUTPUT_LIMIT
from . import checks
from .sandbox import Files, Process, Sandbox
from .transport import Transport

P = ParamSpec("P")
T = TypeVar("T")
U = TypeVar("U")


def _same(value: T) -> T:
    return value


def _threaded(
    method: Callable[Concatenate[Any, P], T],
) -> Callable[Concatenate[Any, P], Coroutine[Any, Any, T]]:
    """``method`` of the synchronous object ``self.sync``, awaited: it runs in a worker
    thread. Its name, parameters and documentation are the synchronous method's."""
    return _threaded_into(method, _same)


def _threaded_into(
    method: Callable[Concatenate[Any, P], T], into: Callable[[T], U]
) -> Callable[Concatenate[Any, P], Coroutine[Any, Any, U]]:
    """``_threaded``, its result handed back through ``into`` (a handle made async)."""

    async def call(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> U:
        return into(await asyncio.to_thread(method, self.sync, *args, **kwargs))

    functools.update_wrapper(call, method)
    return call


def _in_thread(fn: Callable[P, T], into: Callable[[T], U]) -> Callable[P, Coroutine[Any, Any, U]]:
    """A class's constructor (``Sandbox.create``) awaited, its result through ``into``."""

    async def call(*args: P.args, **kwargs: P.kwargs) -> U:
        return into(await asyncio.to_thread(fn, *args, **kwargs))

    functools.update_wrapper(call, fn)
    return call


class AsyncProcess:
    def __init__(self, process: Process) -> None:
        self.sync = process
        self.id = process.id
        self.pid = process.pid
        self.argv = process.argv

    @property
    def running(self) -> bool:
        return self.sync.running

    @property
    def returncode(self) -> int | None:
        return self.sync.returncode

    @property
    def status(self) -> int | None:
        return self.sync.status

    wait = _threaded(Process.wait)
    kill = _threaded(Process.kill)
    output = _threaded(Process.output)
    write = _threaded(Process.write)
    close_stdin = _threaded(Process.close_stdin)


class AsyncFiles:
    def __init__(self, sandbox: Sandbox) -> None:
        self.sync = sandbox.files

    read = _threaded(Files.read)
    read_text = _threaded(Files.read_text)
    write = _threaded(Files.write)
    list = _threaded(Files.list)
    stat = _threaded(Files.stat)
    exists = _threaded(Files.exists)
    mkdir = _threaded(Files.mkdir)
    remove = _threaded(Files.remove)
    rename = _threaded(Files.rename)


class AsyncSandbox:
    """``async with await AsyncSandbox.create(policy) as sb: await sb.exec([...])``"""

    def __init__(
        self, info: SandboxInfo, transport: Transport | None = None, output_limit: int = DEFAULT_OUTPUT_LIMIT
    ) -> None:
        self.sync = Sandbox(info, transport, output_limit)
        self.files = AsyncFiles(self.sync)

    @classmethod
    def _wrap(cls, sandbox: Sandbox) -> AsyncSandbox:
        return cls(sandbox.info, sandbox._transport, sandbox.output_limit)

    @property
    def name(self) -> str:
        return self.sync.name

    @property
    def id(self) -> str:
        return self.sync.id

    @property
    def workspace(self) -> str:
        return self.sync.workspace

    @property
    def info(self) -> SandboxInfo:
        return self.sync.info

    @property
    def pid1(self) -> int:
        return self.sync.pid1

    @property
    def output_limit(self) -> int:
        return self.sync.output_limit

    @property
    def alive(self) -> bool:
        return self.sync.alive

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.remove()

    create = staticmethod(_in_thread(Sandbox.create, lambda sb: AsyncSandbox._wrap(sb)))
    get = staticmethod(_in_thread(Sandbox.get, lambda sb: AsyncSandbox._wrap(sb)))
    list = staticmethod(_in_thread(Sandbox.list, _same))
    stop = _threaded(Sandbox.stop)
    remove = _threaded(Sandbox.remove)
    exec = _threaded(Sandbox.exec)

    spawn = _threaded_into(Sandbox.spawn, AsyncProcess)
    process = _threaded_into(Sandbox.process, AsyncProcess)
    processes = _threaded(Sandbox.processes)
    spawns = _threaded(Sandbox.spawns)
    exposed = _threaded(Sandbox.exposed)
    unexpose = _threaded(Sandbox.unexpose)
    expose = _threaded(Sandbox.expose)
    pause = _threaded(Sandbox.pause)
    resume = _threaded(Sandbox.resume)
    stats = _threaded(Sandbox.stats)
    net_log = _threaded(Sandbox.net_log)

    async def events(self, *, follow: bool = False, poll: float = 0.25) -> AsyncIterator[dict[str, object]]:
        """``Sandbox.events``: each page asked for in a worker thread, the waits awaited."""
        poll = checks.poll(poll, "events")
        transport, after, skip = self.sync._transport, "", 0
        while True:
            page = await asyncio.to_thread(transport.events, self.name, after, skip)
            for record in page.records:
                yield record
            after, skip = page.after, page.skip
            if page.records:
                continue
            if not follow or not page.running:
                return
            await asyncio.sleep(poll)

    net_policy = _threaded(Sandbox.net_policy)
    net_allow = _threaded(Sandbox.net_allow)
    net_deny = _threaded(Sandbox.net_deny)
    net_pending = _threaded(Sandbox.net_pending)
    net_approve = _threaded(Sandbox.net_approve)
    net_reject = _threaded(Sandbox.net_reject)
    diff = _threaded(Sandbox.diff)
    apply = _threaded(Sandbox.apply)
    discard = _threaded(Sandbox.discard)
    checkpoint = _threaded(Sandbox.checkpoint)
    checkpoints = _threaded(Sandbox.checkpoints)
    rollback = _threaded(Sandbox.rollback)
    snapshot = _threaded(Sandbox.snapshot)
    fork = _threaded_into(Sandbox.fork, lambda sb: AsyncSandbox._wrap(sb))
    snapshots = staticmethod(_in_thread(Sandbox.snapshots, _same))
    remove_snapshot = staticmethod(_in_thread(Sandbox.remove_snapshot, _same))
