"""``AsyncSandbox``: the long-lived sandbox API for asyncio callers.

It is the same core as ``warren.sandbox.Sandbox`` (one protocol, one set of result
and error types); each blocking call runs in a worker thread, so many execs can be
awaited at once without blocking the event loop. Callbacks (``on_stdout``) are
called from that worker thread.
"""

from __future__ import annotations

import asyncio
import builtins
import os
import signal as _signal
from collections.abc import Callable, Sequence
from typing import Any

from . import registry
from .netpolicy import NetEvent
from .output import DEFAULT_OUTPUT_LIMIT, Result
from .policy import Policy
from .sandbox import FileInfo, Output, Process, ProcessInfo, Sandbox


class AsyncProcess:
    def __init__(self, process: Process) -> None:
        self.sync = process
        self.pid = process.pid
        self.id = process.id

    @property
    def running(self) -> bool:
        return self.sync.running

    async def wait(self, timeout: float | None = None) -> int:
        return await asyncio.to_thread(self.sync.wait, timeout)

    async def kill(self, signal: int = _signal.SIGTERM) -> None:
        await asyncio.to_thread(self.sync.kill, signal)

    async def output(self) -> Output:
        return await asyncio.to_thread(self.sync.output)


class AsyncFiles:
    def __init__(self, sandbox: Sandbox) -> None:
        self._files = sandbox.files

    async def read(self, path: str | os.PathLike[str]) -> bytes:
        return await asyncio.to_thread(self._files.read, path)

    async def read_text(self, path: str | os.PathLike[str], encoding: str = "utf-8") -> str:
        return await asyncio.to_thread(self._files.read_text, path, encoding)

    async def write(self, path: str | os.PathLike[str], data: bytes | str, **kw: Any) -> None:
        await asyncio.to_thread(lambda: self._files.write(path, data, **kw))

    async def list(self, path: str | os.PathLike[str] = ".") -> builtins.list[FileInfo]:
        return await asyncio.to_thread(self._files.list, path)

    async def stat(self, path: str | os.PathLike[str], follow_symlinks: bool = True) -> FileInfo:
        return await asyncio.to_thread(self._files.stat, path, follow_symlinks)

    async def exists(self, path: str | os.PathLike[str]) -> bool:
        return await asyncio.to_thread(self._files.exists, path)

    async def mkdir(self, path: str | os.PathLike[str], **kw: Any) -> None:
        await asyncio.to_thread(lambda: self._files.mkdir(path, **kw))

    async def remove(self, path: str | os.PathLike[str], *, recursive: bool = False) -> None:
        await asyncio.to_thread(lambda: self._files.remove(path, recursive=recursive))

    async def rename(self, src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        await asyncio.to_thread(self._files.rename, src, dst)


class AsyncSandbox:
    """``async with await AsyncSandbox.create(policy) as sb: await sb.exec([...])``"""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sync = sandbox
        self.files = AsyncFiles(sandbox)

    @property
    def name(self) -> str:
        return self.sync.name

    @classmethod
    async def create(
        cls,
        policy: Policy | None = None,
        name: str | None = None,
        *,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
    ) -> AsyncSandbox:
        sb = await asyncio.to_thread(lambda: Sandbox.create(policy, name, output_limit=output_limit))
        return cls(sb)

    @classmethod
    async def get(cls, name: str) -> AsyncSandbox:
        return cls(await asyncio.to_thread(Sandbox.get, name))

    @classmethod
    async def list(cls) -> builtins.list[registry.Entry]:
        return await asyncio.to_thread(Sandbox.list)

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.remove()

    async def exec(
        self,
        cmd: Sequence[str],
        cwd: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
        stdin: bytes | str | None = None,
        timeout: float | None = None,
        on_stdout: Callable[[bytes], None] | None = None,
        on_stderr: Callable[[bytes], None] | None = None,
    ) -> Result:
        return await asyncio.to_thread(
            lambda: self.sync.exec(
                cmd, cwd=cwd, env=env, stdin=stdin, timeout=timeout, on_stdout=on_stdout, on_stderr=on_stderr
            )
        )

    async def spawn(self, cmd: Sequence[str], **kw: Any) -> AsyncProcess:
        return AsyncProcess(await asyncio.to_thread(lambda: self.sync.spawn(cmd, **kw)))

    async def processes(self) -> builtins.list[ProcessInfo]:
        return await asyncio.to_thread(self.sync.processes)

    async def expose(self, port: int, host_port: int = 0) -> str:
        return await asyncio.to_thread(self.sync.expose, port, host_port)

    async def net_log(self) -> builtins.list[NetEvent]:
        return await asyncio.to_thread(self.sync.net_log)

    async def stop(self) -> None:
        await asyncio.to_thread(self.sync.stop)

    async def remove(self) -> None:
        await asyncio.to_thread(self.sync.remove)
