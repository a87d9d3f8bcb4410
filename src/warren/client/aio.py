"""``AsyncSandbox``: the long-lived sandbox API for asyncio callers.

Exactly the methods and parameters of ``Sandbox`` (a test compares their signatures),
over the same transport and core; each blocking call runs in a worker thread, so many
execs can be awaited at once without blocking the event loop. Callbacks
(``on_stdout``) are called from that worker thread.
"""

from __future__ import annotations

import asyncio
import builtins
import signal as _signal
from collections.abc import Callable, Sequence

from ..models import FileInfo, Output, ProcessInfo, Result, SandboxInfo, Stats
from ..net.allowlist import NetEvent
from ..output import DEFAULT_OUTPUT_LIMIT
from ..policy import Policy, PolicySpec
from .sandbox import DEFAULT_READ_LIMIT, PathArg, Process, Sandbox
from .transport import Transport


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

    async def wait(self, timeout: float | None = None) -> int:
        return await asyncio.to_thread(self.sync.wait, timeout)

    async def kill(self, signal: int = _signal.SIGTERM) -> None:
        await asyncio.to_thread(self.sync.kill, signal)

    async def output(self) -> Output:
        return await asyncio.to_thread(self.sync.output)

    async def write(self, data: bytes | str, timeout: float | None = None) -> None:
        await asyncio.to_thread(self.sync.write, data, timeout)

    async def close_stdin(self) -> None:
        await asyncio.to_thread(self.sync.close_stdin)


class AsyncFiles:
    def __init__(self, sandbox: Sandbox) -> None:
        self._files = sandbox.files

    async def read(self, path: PathArg, *, max_bytes: int = DEFAULT_READ_LIMIT) -> bytes:
        return await asyncio.to_thread(lambda: self._files.read(path, max_bytes=max_bytes))

    async def read_text(
        self, path: PathArg, encoding: str = "utf-8", *, max_bytes: int = DEFAULT_READ_LIMIT
    ) -> str:
        return await asyncio.to_thread(lambda: self._files.read_text(path, encoding, max_bytes=max_bytes))

    async def write(
        self,
        path: PathArg,
        data: bytes | str,
        *,
        mode: int = 0o644,
        append: bool = False,
        parents: bool = False,
    ) -> None:
        await asyncio.to_thread(
            lambda: self._files.write(path, data, mode=mode, append=append, parents=parents)
        )

    async def list(self, path: PathArg = ".") -> builtins.list[FileInfo]:
        return await asyncio.to_thread(self._files.list, path)

    async def stat(self, path: PathArg, follow_symlinks: bool = True) -> FileInfo:
        return await asyncio.to_thread(self._files.stat, path, follow_symlinks)

    async def exists(self, path: PathArg) -> bool:
        return await asyncio.to_thread(self._files.exists, path)

    async def mkdir(
        self, path: PathArg, *, parents: bool = False, exist_ok: bool = False, mode: int = 0o755
    ) -> None:
        await asyncio.to_thread(
            lambda: self._files.mkdir(path, parents=parents, exist_ok=exist_ok, mode=mode)
        )

    async def remove(self, path: PathArg, *, recursive: bool = False) -> None:
        await asyncio.to_thread(lambda: self._files.remove(path, recursive=recursive))

    async def rename(self, src: PathArg, dst: PathArg) -> None:
        await asyncio.to_thread(self._files.rename, src, dst)


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

    @classmethod
    async def create(
        cls,
        policy: PolicySpec | Policy | None = None,
        name: str | None = None,
        *,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        transport: Transport | None = None,
        remote: str | None = None,
        token: str | None = None,
    ) -> AsyncSandbox:
        sb = await asyncio.to_thread(
            lambda: Sandbox.create(
                policy, name, output_limit=output_limit, transport=transport, remote=remote, token=token
            )
        )
        return cls._wrap(sb)

    @classmethod
    async def get(
        cls,
        name: str,
        *,
        transport: Transport | None = None,
        remote: str | None = None,
        token: str | None = None,
    ) -> AsyncSandbox:
        sb = await asyncio.to_thread(
            lambda: Sandbox.get(name, transport=transport, remote=remote, token=token)
        )
        return cls._wrap(sb)

    @classmethod
    async def list(
        cls, *, transport: Transport | None = None, remote: str | None = None, token: str | None = None
    ) -> builtins.list[SandboxInfo]:
        return await asyncio.to_thread(lambda: Sandbox.list(transport=transport, remote=remote, token=token))

    async def stop(self) -> None:
        await asyncio.to_thread(self.sync.stop)

    async def remove(self) -> None:
        await asyncio.to_thread(self.sync.remove)

    async def exec(
        self,
        cmd: Sequence[str],
        cwd: PathArg | None = None,
        env: dict[str, str] | None = None,
        stdin: bytes | str | None = None,
        timeout: float | None = None,
        on_stdout: Callable[[bytes], None] | None = None,
        on_stderr: Callable[[bytes], None] | None = None,
        output_limit: int | None = None,
    ) -> Result:
        return await asyncio.to_thread(
            lambda: self.sync.exec(cmd, cwd, env, stdin, timeout, on_stdout, on_stderr, output_limit)
        )

    async def spawn(
        self,
        cmd: Sequence[str],
        cwd: PathArg | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        output_limit: int | None = None,
        stdin: bool = False,
    ) -> AsyncProcess:
        return AsyncProcess(
            await asyncio.to_thread(lambda: self.sync.spawn(cmd, cwd, env, timeout, output_limit, stdin))
        )

    async def process(self, spawn_id: str) -> AsyncProcess:
        return AsyncProcess(await asyncio.to_thread(self.sync.process, spawn_id))

    async def processes(self) -> builtins.list[ProcessInfo]:
        return await asyncio.to_thread(self.sync.processes)

    async def expose(self, port: int, host_port: int = 0) -> str:
        return await asyncio.to_thread(self.sync.expose, port, host_port)

    async def pause(self) -> None:
        await asyncio.to_thread(self.sync.pause)

    async def resume(self) -> None:
        await asyncio.to_thread(self.sync.resume)

    async def stats(self) -> Stats:
        return await asyncio.to_thread(self.sync.stats)

    async def net_log(self) -> builtins.list[NetEvent]:
        return await asyncio.to_thread(self.sync.net_log)
