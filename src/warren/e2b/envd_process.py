"""envd's ``process.Process`` service: every command is a background process of warren's
(``spawn``), so ``Start`` streams its output by following it, ``Connect`` attaches
later, ``SendInput``/``StreamInput``/``CloseStdin`` feed its stdin pipe and
``SendSignal`` kills it. A PTY is util-linux ``script`` around the command, relaying the
terminal over those pipes; ``Update`` resizes it with ``stty`` (``in_terminal``).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal as _signal
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from e2b.envd.process import process_pb as pb

from ..client.transport import Command
from ..models import ProcessState, SandboxInfo
from . import standins
from .core import HOME, Core, E2BError
from .envd_base import KEEPALIVE, POLL, EnvdService, Oneof, connect_error, rpc, sandbox_gone

# What a process's output buffer keeps per stream (its reader follows it as it comes).
OUTPUT_LIMIT = 64 * 1024 * 1024


@dataclass
class Proc:
    """A process started through envd: what E2B's ``List`` shows of it."""

    spawn_id: str
    pid: int
    cmd: str
    args: list[str]
    envs: dict[str, str]
    cwd: str
    tag: str | None = None
    pty: str | None = None  # in a PTY: the file in the sandbox naming its terminal


def end_event(state: ProcessState) -> pb.ProcessEvent.EndEvent:
    """Go's ``ProcessState`` as envd reports it: an exit code and "exit status N", or
    -1 and "signal: NAME" for a process killed by a signal; a failure's status is also
    its error (what Go's ``cmd.Wait`` returns)."""
    status = state.status
    if status is None:
        return pb.ProcessEvent.EndEvent(exit_code=-1, exited=False, status="unknown", error="process lost")
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = {9: "killed", 15: "terminated", 2: "interrupt"}.get(sig) or _signal.Signals(sig).name.lower()
        text = f"signal: {name}"
        return pb.ProcessEvent.EndEvent(exit_code=-1, exited=False, status=text, error=text)
    code = os.waitstatus_to_exitcode(status)
    text = f"exit status {code}"
    return pb.ProcessEvent.EndEvent(exit_code=code, exited=True, status=text, error=text if code else None)


def checked_size(size: pb.PTY.Size) -> tuple[int, int]:
    rows, cols = size.rows, size.cols
    if not (0 < rows <= 10_000 and 0 < cols <= 10_000):
        raise E2BError(400, f"terminal size {rows}x{cols} is out of range (1 to 10000 rows and columns)")
    return rows, cols


def in_terminal(argv: list[str], size: pb.PTY.Size | None, tty_file: str) -> list[str]:
    """``argv`` in a terminal of its own: util-linux ``script`` gives it a PTY and relays
    it over plain pipes (warren's processes have pipes), after ``stty`` set its size. The
    terminal's name goes to ``tty_file`` (in the sandbox's private /tmp) for resizing:
    another exec may not look into this one's /proc (each has its own Landlock domain)."""
    rows, cols = checked_size(size) if size is not None else (24, 80)
    inner = (
        f"tty > {shlex.quote(tty_file)}; stty rows {rows} cols {cols} 2>/dev/null; exec {shlex.join(argv)}"
    )
    return ["script", "--quiet", "--flush", "--return", "--command", inner, "/dev/null"]


class ProcessService(EnvdService):
    def __init__(self, core: Core) -> None:
        super().__init__(core)
        self.procs: dict[tuple[str, int], Proc] = {}

    @rpc
    async def list_processes(self, request: pb.ListRequest, ctx: RequestContext[Any, Any]) -> pb.ListResponse:
        info, record = await self.sandbox(ctx.request_headers)
        items = await self.core.call(self.core.transport.processes, info.name)
        live = {p.pid for p in items}
        for key in [k for k in self.procs if k[0] == info.name and k[1] not in live]:
            del self.procs[key]  # ended unfollowed (nobody saw its end)
        out = []
        for p in items:
            if p.spawn_id is None:
                continue
            known = self.procs.get((info.name, p.pid))
            if known is None:
                argv = list(p.argv) or ["?"]
                known = Proc(p.spawn_id, p.pid, argv[0], argv[1:], {}, record.inside)
            config = pb.ProcessConfig(cmd=known.cmd, args=known.args, envs=known.envs, cwd=known.cwd)
            out.append(pb.ProcessInfo(config=config, pid=p.pid, tag=known.tag))
        return pb.ListResponse(processes=out)

    async def start(
        self, request: pb.StartRequest, ctx: RequestContext[Any, Any]
    ) -> AsyncIterator[pb.StartResponse]:
        try:
            info, record = await self.sandbox(ctx.request_headers)
            config = request.process or pb.ProcessConfig()
            if not config.cmd:
                raise E2BError(400, "process.cmd is empty")
            # E2B's home is the sandbox's own (its workspace), where relative paths lead too.
            home = {"HOME": record.inside} if self.core.records.get(info.name) else {}
            cwd = self.core.resolve(record, config.cwd) if config.cwd else record.inside
            # /home/user is a link to the home's host path: a shell's pwd says the path
            # asked for, as after `cd` on E2B (the kernel's getcwd names the host path)
            envs = {**home, "PWD": cwd, **record.envs, **dict(config.envs)}
            args = list(config.args)
            if record.home == HOME:  # E2B's home: not an image, which has its own tools
                args = standins.login_script(config.cmd, args)
            argv = [config.cmd, *args]
            tty_file = f"/tmp/.e2b-pty-{uuid.uuid4().hex}"
            if request.pty is not None:
                argv = in_terminal(argv, request.pty.size, tty_file)
            pipe = bool(request.stdin) or request.pty is not None
            command = Command(argv, cwd, envs, output_limit=OUTPUT_LIMIT, stdin_pipe=pipe)
            spawn_id, pid = await self.core.call(self.core.transport.spawn, info.name, command)
        except Exception as e:
            raise connect_error(e) from None
        pty = tty_file if request.pty is not None else None
        self.procs[(info.name, pid)] = Proc(
            spawn_id, pid, config.cmd, list(config.args), dict(config.envs), cwd, request.tag, pty
        )
        yield pb.StartResponse(event=self.started(pid))
        async for event in self.follow(info.name, spawn_id, 0, 0, pty is not None, ctx.timeout_ms):
            yield pb.StartResponse(event=event)

    async def connect(
        self, request: pb.ConnectRequest, ctx: RequestContext[Any, Any]
    ) -> AsyncIterator[pb.ConnectResponse]:
        try:
            info, proc = await self.target(ctx, request.process)
            # E2B's Connect streams what comes from now on, not what came before.
            _, out, err = await self.core.call(self.core.transport.process, info.name, proc.spawn_id)
        except Exception as e:
            raise connect_error(e) from None
        yield pb.ConnectResponse(event=self.started(proc.pid))
        following = self.follow(
            info.name, proc.spawn_id, len(out), len(err), proc.pty is not None, ctx.timeout_ms
        )
        async for event in following:
            yield pb.ConnectResponse(event=event)

    def started(self, pid: int) -> pb.ProcessEvent:
        return pb.ProcessEvent(event=Oneof("start", pb.ProcessEvent.StartEvent(pid=pid)))

    async def follow(
        self,
        sandbox_id: str,
        spawn_id: str,
        out_off: int,
        err_off: int,
        pty: bool = False,
        timeout_ms: float | None = None,
    ) -> AsyncIterator[pb.ProcessEvent]:
        """The output of a background process as it comes (all of it the terminal's, for a
        process in a PTY), then its end; or, past the caller's ``Connect-Timeout-Ms``, a
        ``deadline_exceeded`` end as envd's (the process itself keeps running)."""
        quiet_since = time.monotonic()
        deadline = None if timeout_ms is None else quiet_since + timeout_ms / 1000
        while True:
            if deadline is not None and time.monotonic() >= deadline:
                raise ConnectError(
                    Code.DEADLINE_EXCEEDED, "the stream's deadline (Connect-Timeout-Ms) passed"
                )
            try:
                state, out, err = await self.core.call(
                    self.core.transport.process, sandbox_id, spawn_id, out_off, err_off
                )
            except Exception as e:
                if not await self.core.call(self.core.running, sandbox_id):
                    raise sandbox_gone(sandbox_id) from None
                raise connect_error(e) from None
            for kind, data in (("stdout", out), ("stderr", err)):
                kind = "pty" if pty else kind
                if data:
                    yield pb.ProcessEvent(
                        event=Oneof("data", pb.ProcessEvent.DataEvent(output=Oneof(kind, data)))
                    )
            out_off, err_off = out_off + len(out), err_off + len(err)
            if out or err:
                quiet_since = time.monotonic()
                continue
            lost = state.status is None and not state.running
            if lost and not await self.core.call(self.core.running, sandbox_id):
                raise sandbox_gone(sandbox_id)
            if state.status is not None or not state.running:
                self.procs.pop((sandbox_id, state.pid), None)
                yield pb.ProcessEvent(event=Oneof("end", end_event(state)))
                return
            if time.monotonic() - quiet_since > KEEPALIVE:
                quiet_since = time.monotonic()
                yield pb.ProcessEvent(event=Oneof("keepalive", pb.ProcessEvent.KeepAlive()))
            await asyncio.sleep(POLL)

    async def target(
        self, ctx: RequestContext[Any, Any], selector: pb.ProcessSelector | None
    ) -> tuple[SandboxInfo, Proc]:
        """The sandbox a request is for and the process of it the request selects."""
        info, _ = await self.sandbox(ctx.request_headers)
        return info, await self.find(info.name, selector)

    async def find(self, sandbox_id: str, selector: pb.ProcessSelector | None) -> Proc:
        chosen = selector.selector if selector is not None else None
        if chosen is None:
            raise E2BError(400, "process selector is empty: give a pid or a tag")
        for (sid, pid), proc in self.procs.items():
            if sid == sandbox_id and (
                (chosen.field == "pid" and pid == chosen.value)
                or (chosen.field == "tag" and proc.tag == chosen.value)
            ):
                return proc
        if chosen.field == "pid":
            for p in await self.core.call(self.core.transport.processes, sandbox_id):
                if p.pid == chosen.value and p.spawn_id is not None:
                    argv = list(p.argv) or ["?"]
                    return Proc(p.spawn_id, p.pid, argv[0], argv[1:], {}, "/")
        raise E2BError(404, f"process {chosen.field} {chosen.value!r} not found")

    @rpc
    async def update(self, request: pb.UpdateRequest, ctx: RequestContext[Any, Any]) -> pb.UpdateResponse:
        """Resize a process's terminal: ``stty`` on the terminal its child holds (the
        kernel then sends SIGWINCH to the terminal's foreground processes)."""
        info, proc = await self.target(ctx, request.process)
        size = request.pty.size if request.pty is not None else None
        if proc.pty is None or size is None:
            raise E2BError(400, f"process {proc.pid} has no terminal to resize (or no size given)")
        rows, cols = checked_size(size)
        resize = f'stty -F "$(cat {shlex.quote(proc.pty)})" rows {rows} cols {cols}'
        command = Command(["/bin/sh", "-c", resize], "/", timeout=10, output_limit=4096)
        result = await self.core.call(self.core.transport.exec, info.name, command)
        if result.exit_code != 0:
            raise E2BError(409, f"cannot resize the terminal of process {proc.pid}: {result.stderr!r}")
        return pb.UpdateResponse()

    @rpc
    async def send_input(
        self, request: pb.SendInputRequest, ctx: RequestContext[Any, Any]
    ) -> pb.SendInputResponse:
        info, proc = await self.target(ctx, request.process)
        await self.write(info.name, proc, request.input)
        return pb.SendInputResponse()

    async def write(self, sandbox_id: str, proc: Proc, given: pb.ProcessInput | None) -> None:
        chosen = given.input if given is not None else None
        if chosen is None:
            return
        in_pty = proc.pty is not None
        if (chosen.field == "pty") != in_pty:
            raise E2BError(400, f"process {proc.pid} takes {'pty' if in_pty else 'stdin'} input")
        await self.core.call(self.core.transport.write_stdin, sandbox_id, proc.spawn_id, chosen.value)

    @rpc
    async def stream_input(
        self, request: AsyncIterator[pb.StreamInputRequest], ctx: RequestContext[Any, Any]
    ) -> pb.StreamInputResponse:
        info, _ = await self.sandbox(ctx.request_headers)
        proc: Proc | None = None
        async for message in request:
            chosen = message.event
            if chosen is None or chosen.field == "keepalive":
                continue
            if chosen.field == "start":
                proc = await self.find(info.name, chosen.value.process)
            elif proc is None:
                raise E2BError(400, "the input stream must begin with a start event naming the process")
            else:
                await self.write(info.name, proc, chosen.value.input)
        return pb.StreamInputResponse()

    @rpc
    async def close_stdin(
        self, request: pb.CloseStdinRequest, ctx: RequestContext[Any, Any]
    ) -> pb.CloseStdinResponse:
        info, proc = await self.target(ctx, request.process)
        await self.core.call(self.core.transport.write_stdin, info.name, proc.spawn_id, b"", eof=True)
        return pb.CloseStdinResponse()

    @rpc
    async def send_signal(
        self, request: pb.SendSignalRequest, ctx: RequestContext[Any, Any]
    ) -> pb.SendSignalResponse:
        info, proc = await self.target(ctx, request.process)
        sig = request.signal.value if request.signal is not None else 0
        if sig not in (_signal.SIGKILL, _signal.SIGTERM):
            raise E2BError(400, f"signal {sig} is neither SIGKILL (9) nor SIGTERM (15)")
        await self.core.call(self.core.transport.signal, info.name, proc.pid, sig)
        return pb.SendSignalResponse()


# The generated service protocols name the process service's ``list`` like the
# filesystem's ``stat`` and ``list_dir``: the stub calls these methods by these names.
PROCESS_METHODS = {
    "list": "list_processes",
    "start": "start",
    "connect": "connect",
    "update": "update",
    "send_input": "send_input",
    "stream_input": "stream_input",
    "close_stdin": "close_stdin",
    "send_signal": "send_signal",
}
