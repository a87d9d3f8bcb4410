"""``process.v1.ProcessService`` over the sandbox: Execute, Start (streamed, with a
PTY on request), WriteStdin, SendSignal, ResizeTTY.

Every command is the sandbox's: ``Execute`` is an exec, ``Start`` a background process
(``spawn`` with a stdin pipe) whose output is followed as it comes and sent as
``stdout``/``stderr`` events between the contract's ``init`` and ``exit``. A PTY is
util-linux ``script`` around the command (warren's processes have pipes), its size set
with ``stty``; ``ResizeTTY`` runs ``stty`` on that terminal again. There, SIGINT is the
terminal's ^C (the kernel signals the foreground group, as the contract's daemon signals
the command's group), and SIGTERM or SIGKILL go to ``script``, which ends the command and
its terminal (and says so on the output). A client that goes
away before the end takes its process with it (SIGKILL to its group), as the
contract's daemon does. Exit codes are the contract's: the command's own, -1 when a
signal ended it.

Errors are the contract's gRPC codes: NOT_FOUND (an unknown process id, a missing
command or cwd), PERMISSION_DENIED (a cwd out of the workspace), INVALID_ARGUMENT (no
command, an unsupported signal), FAILED_PRECONDITION (resizing a process without a
PTY, stdin already closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shlex
import signal as _signal
import sys
import traceback
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc

from .. import errors
from ..client.sandbox import feed_stdin
from ..models import ProcessState
from .runtime import Proc, Runtime

POLL = 0.05  # seconds between looks at a process that printed nothing new
CHUNK = 1 << 20  # bytes per stdout/stderr event: well under a client's 4 MiB message limit
OUTPUT_LIMIT = 64 * 1024 * 1024  # what warren keeps of a Start's output per stream, followed as it comes
SIGNALS = {2: _signal.SIGINT, 9: _signal.SIGKILL, 15: _signal.SIGTERM}

# The gRPC status of a warren error: the first whose classes it is an instance of (the
# more specific come first: StdinFull is a StdinError, CommandNotFound an ExecError).
CODES: dict[grpc.StatusCode, tuple[type[errors.WarrenError], ...]] = {
    grpc.StatusCode.NOT_FOUND: (
        errors.CommandNotFound,
        errors.CwdNotFound,
        errors.SandboxFileNotFound,
        errors.ProcessNotFound,
        errors.ProcessEnded,
    ),
    grpc.StatusCode.PERMISSION_DENIED: (errors.SandboxPermissionDenied,),
    grpc.StatusCode.DEADLINE_EXCEEDED: (errors.SandboxTimeout,),
    grpc.StatusCode.UNAVAILABLE: (errors.SandboxDead, errors.SandboxPaused),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (errors.StdinFull,),
    grpc.StatusCode.FAILED_PRECONDITION: (errors.StdinError,),
    grpc.StatusCode.INVALID_ARGUMENT: (errors.ExecError, errors.PolicyError),
}


def status_of(error: BaseException) -> grpc.StatusCode:
    for code, kinds in CODES.items():
        if isinstance(error, kinds):
            return code
    return grpc.StatusCode.INTERNAL


def message_of(error: BaseException) -> str:
    if isinstance(error, errors.WarrenError):
        return error.message + (f" (hint: {error.hint})" if error.hint else "")
    return f"{type(error).__name__}: {error}"


def exit_code(status: int | None) -> int:
    """The contract's exit code of a wait status: -1 for a signal (or none known)."""
    if status is None or os.WIFSIGNALED(status):
        return -1
    return os.waitstatus_to_exitcode(status)


def in_terminal(argv: list[str], rows: int, cols: int, tty_file: str) -> list[str]:
    """``argv`` in a terminal of its own (``script``), sized with ``stty``; the terminal's
    name goes to ``tty_file`` in the sandbox's private /tmp, for ``ResizeTTY``."""
    inner = (
        f"tty > {shlex.quote(tty_file)}; stty rows {rows} cols {cols} 2>/dev/null; exec {shlex.join(argv)}"
    )
    return ["script", "--quiet", "--flush", "--return", "--command", inner, "/dev/null"]


def checked_size(rows: int, cols: int) -> tuple[int, int]:
    """A terminal size; 0 (unset) means the usual 24x80."""
    rows, cols = rows or 24, cols or 80
    if not (rows <= 10_000 and cols <= 10_000):
        raise errors.ExecError(
            f"terminal size {rows}x{cols} is out of range",
            operation="pty",
            hint="1 to 10000 rows and columns",
        )
    return rows, cols


def _unary(
    method: Callable[[ProcessService, Any, grpc.aio.ServicerContext], Awaitable[Any]],
) -> Callable[[ProcessService, Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    """A unary RPC whose every failure reaches the caller as the contract's status
    (``status_of``). The streamed ``Start`` answers its own: it yields in between."""

    @functools.wraps(method)
    async def call(self: ProcessService, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(self, request, context)
        except Exception as e:
            await self._fail(context, e)

    return call


class ProcessService:
    """The servicer; its methods are named as the contract's RPCs."""

    def __init__(self, runtime: Runtime, pb: Any) -> None:
        self.rt = runtime
        self.pb = pb

    async def _fail(self, context: grpc.aio.ServicerContext, error: BaseException) -> NoReturn:
        if not isinstance(error, errors.WarrenError):
            traceback.print_exc(file=sys.stderr)
        await context.abort(status_of(error), message_of(error))
        raise AssertionError("abort returns only by raising")

    def _config(self, config: Any) -> tuple[list[str], str, dict[str, str]]:
        argv = list(config.command)
        if not argv:
            raise errors.ExecError("command is required", operation="process", hint="give config.command")
        cwd = self.rt.confine(config.cwd, "cwd") if config.HasField("cwd") and config.cwd else self.rt.root
        return argv, cwd, dict(config.env_vars)

    @_unary
    async def Execute(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        argv, cwd, env = self._config(request.config)
        remaining = context.time_remaining()
        result = await self.rt.call(self.rt.sandbox.exec, argv, cwd=cwd, env=env, timeout=remaining)
        if result.timed_out:
            raise errors.SandboxTimeout(
                f"{argv[0]} ran past the call's deadline", operation="execute", hint="a longer deadline"
            )
        code = -1 if result.signal is not None else result.exit_code
        return self.pb.ExecuteResponse(exit_code=code, stdout=result.stdout, stderr=result.stderr)

    async def Start(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        pb = self.pb
        try:
            argv, cwd, env = self._config(request.config)
            tty_file = None
            if request.HasField("pty"):
                rows, cols = checked_size(request.pty.rows, request.pty.cols)
                tty_file = f"/tmp/.sandboxd-pty-{uuid.uuid4().hex}"
                argv = in_terminal(argv, rows, cols, tty_file)
            process = await self.rt.call(
                self.rt.sandbox.spawn, argv, cwd=cwd, env=env, output_limit=OUTPUT_LIMIT, stdin=True
            )
        except Exception as e:
            await self._fail(context, e)
        proc = self.rt.add(process.id, process.pid, tty_file)
        ended = False
        try:
            yield pb.StartResponse(init=pb.InitEvent(process_id=proc.ident))
            try:
                async for kind, data, state in self._follow(proc):
                    if state is not None:
                        ended = True
                        code = -1 if proc.ended_by_signal else exit_code(state.status)
                        yield pb.StartResponse(exit=pb.ExitEvent(exit_code=code))
                        return
                    for at in range(0, len(data), CHUNK):
                        yield pb.StartResponse(**{kind: data[at : at + CHUNK]})
            except errors.WarrenError as e:  # the sandbox ended under it: a status, not a traceback
                await self._fail(context, e)
        finally:
            self.rt.procs.pop(proc.ident, None)
            if not ended:  # the client left (or the stream failed): the process goes too
                self._kill(proc, _signal.SIGKILL)

    async def _follow(self, proc: Proc) -> AsyncIterator[tuple[str, bytes, ProcessState | None]]:
        """("stdout"|"stderr", data, None) as output comes (all of a PTY's is stdout),
        then ("", b"", final state)."""
        out_off = err_off = 0
        name = self.rt.sandbox.name
        while True:
            state, out, err = await self.rt.call(
                self.rt.transport.process, name, proc.spawn_id, out_off, err_off
            )
            out_off, err_off = out_off + len(out), err_off + len(err)
            if out:
                yield "stdout", out, None
            if err:
                yield ("stdout" if proc.tty_file else "stderr"), err, None
            if out or err:
                continue
            if state.status is not None or not state.running:
                yield "", b"", state
                return
            await asyncio.sleep(POLL)

    def _kill(self, proc: Proc, sig: int) -> None:
        with contextlib.suppress(errors.WarrenError):  # already ended
            self.rt.transport.signal(self.rt.sandbox.name, proc.pid, sig)

    def _proc(self, ident: int) -> Proc:
        proc = self.rt.procs.get(ident)
        if proc is None:
            raise errors.ProcessNotFound(
                f"process {ident} not found", operation="process", hint="ids come from Start's init event"
            )
        return proc

    @_unary
    async def WriteStdin(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        proc = self._proc(request.process_id)
        name = self.rt.sandbox.name
        if request.HasField("eof"):
            await self.rt.call(self.rt.transport.write_stdin, name, proc.spawn_id, b"", eof=True)
        elif request.input:
            await self.rt.call(feed_stdin, self.rt.transport, name, proc.spawn_id, request.input)
        return self.pb.WriteStdinResponse()

    @_unary
    async def SendSignal(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        proc = self._proc(request.process_id)
        sig = SIGNALS.get(request.signal)
        if sig is None:
            raise errors.ExecError(
                f"unsupported or unspecified signal {request.signal}",
                operation="signal",
                hint="SIGNAL_SIGINT, SIGNAL_SIGTERM or SIGNAL_SIGKILL",
            )
        name = self.rt.sandbox.name
        if proc.tty_file is not None and sig == _signal.SIGINT:
            # The terminal's ^C: the line discipline signals its foreground group.
            await self.rt.call(feed_stdin, self.rt.transport, name, proc.spawn_id, b"\x03")
        else:
            await self.rt.call(self.rt.transport.signal, name, proc.pid, int(sig))
            proc.ended_by_signal = proc.tty_file is not None
        return self.pb.SendSignalResponse()

    @_unary
    async def ResizeTTY(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        proc = self._proc(request.process_id)
        if proc.tty_file is None:
            raise errors.StdinError(
                f"process {proc.ident} has no PTY to resize",
                operation="resize",
                hint="start it with a pty",
            )
        rows, cols = checked_size(request.rows, request.cols)
        resize = f'stty -F "$(cat {shlex.quote(proc.tty_file)})" rows {rows} cols {cols}'
        result = await self.rt.call(
            self.rt.sandbox.exec, ["/bin/sh", "-c", resize], cwd="/", timeout=10, output_limit=4096
        )
        if result.exit_code != 0:
            raise errors.StdinError(
                f"cannot resize the terminal of process {proc.ident}: {result.stderr[:200]!r}",
                operation="resize",
                hint="it may have ended",
            )
        return self.pb.ResizeTTYResponse()


def register(server: grpc.aio.Server, runtime: Runtime) -> None:
    from . import stubs

    pb, pb_grpc = stubs.load()
    # The generated registration looks the five methods up by name on any object.
    pb_grpc.add_ProcessServiceServicer_to_server(ProcessService(runtime, pb), server)
