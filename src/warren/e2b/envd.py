"""E2B's in-sandbox daemon, envd, answered from the host: the Connect RPC services
``process.Process`` and ``filesystem.Filesystem`` and the REST routes ``/files``,
``/health`` and ``/envs``.

The Connect protocol (framing, codecs, errors, deadlines) is connect-python's
(``connectrpc``); the messages and the service stubs are the ones the ``e2b`` SDK ships
(generated from E2B's public ``.proto`` files), imported, not copied. What is ours is the
mapping onto warren's live-sandbox operations:

- every command is a background process (``spawn``), so ``Start`` streams its output by
  following it, ``Connect`` attaches later, ``SendInput``/``StreamInput``/``CloseStdin``
  feed its stdin pipe and ``SendSignal`` kills it;
- a PTY is util-linux ``script`` around the command, relaying the terminal over those
  pipes; ``Update`` resizes it with ``stty`` (``in_terminal``);
- file operations are warren's (run inside the sandbox, so a path leads only where the
  sandbox itself could go); a relative path is relative to the sandbox's home;
- watching a directory is a poll of its listing (warren's files API has no inotify), so
  events come within ``WATCH_EVERY`` and a rename shows as a removal and a creation.

Which sandbox a request is for, and that the caller may use it, is ``front``'s job: the
``E2b-Sandbox-Id`` header here has already been matched against ``X-Access-Token``.
"""

from __future__ import annotations

import asyncio
import grp
import os
import posixpath
import pwd
import shlex
import signal as _signal
import stat as _stat
import sys
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from connectrpc.code import Code
from connectrpc.codec import Codec, proto_binary_codec, proto_json_codec
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from e2b.envd.filesystem import filesystem_pb as fs
from e2b.envd.filesystem.filesystem_connect import FilesystemASGIApplication
from e2b.envd.process import process_pb as pb
from e2b.envd.process.process_connect import ProcessASGIApplication
from protobuf import Oneof as _Oneof
from protobuf.wkt import Timestamp
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from .. import wire
from ..errors import SandboxFileError, SandboxNotFound, WarrenError
from ..models import FileInfo, FileOp, FileResult, ProcessState, SandboxInfo
from .core import Core, E2BError, message_of, status_of
from .records import Record

T = TypeVar("T")

# The generated messages type each oneof case with its literal field name; one untyped
# constructor spares a cast per case (the message checks the field name when built).
Oneof: Callable[[str, object], Any] = _Oneof

POLL = 0.05
KEEPALIVE = 30.0
WATCH_EVERY = 0.2
# What a process's output buffer keeps per stream (its reader follows it as it comes).
OUTPUT_LIMIT = 64 * 1024 * 1024
MAX_FILE = wire.MAX_PAYLOAD
MAX_LIST = 100_000

CODES = {
    400: Code.INVALID_ARGUMENT,
    401: Code.UNAUTHENTICATED,
    403: Code.PERMISSION_DENIED,
    404: Code.NOT_FOUND,
    409: Code.FAILED_PRECONDITION,
    413: Code.RESOURCE_EXHAUSTED,
    422: Code.INVALID_ARGUMENT,
    429: Code.RESOURCE_EXHAUSTED,
    501: Code.UNIMPLEMENTED,
    504: Code.DEADLINE_EXCEEDED,
}


def connect_error(error: BaseException) -> ConnectError:
    if isinstance(error, ConnectError):
        return error
    if isinstance(error, SandboxFileError) and error.errno == 17:  # EEXIST
        return ConnectError(Code.ALREADY_EXISTS, message_of(error))
    if not isinstance(error, (E2BError, WarrenError)):
        traceback.print_exc(file=sys.stderr)
    return ConnectError(CODES.get(status_of(error), Code.INTERNAL), message_of(error))


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


@dataclass
class Watcher:
    sandbox_id: str
    path: str
    recursive: bool
    seen: dict[str, tuple[str, int, float]] = field(default_factory=dict)


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


def entry(stat: FileInfo, path: str) -> fs.EntryInfo:
    kind = {"file": fs.FileType.FILE, "dir": fs.FileType.DIRECTORY, "symlink": fs.FileType.SYMLINK}
    return fs.EntryInfo(
        name=stat.name or posixpath.basename(path.rstrip("/")) or "/",
        type=kind.get(stat.type, fs.FileType.UNSPECIFIED),
        path=path,
        size=stat.size,
        mode=stat.mode & 0o7777,
        permissions=_stat.filemode(stat.mode),
        owner=_user(stat.uid),
        group=_group(stat.gid),
        modified_time=Timestamp.from_nanos(int(stat.mtime * 1e9)),
        is_symlink=stat.type == "symlink",
    )


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


class Envd:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.procs: dict[tuple[str, int], Proc] = {}
        self.watchers: dict[str, Watcher] = {}

    # --- shared --------------------------------------------------------------------------------

    async def sandbox(self, headers: Any) -> tuple[SandboxInfo, Record]:
        sandbox_id = headers.get("e2b-sandbox-id") or ""
        try:
            info = await self.core.call(self.core.transport.get, sandbox_id)
        except SandboxNotFound:
            raise E2BError(404, f"sandbox {sandbox_id!r} not found") from None
        if info.state != "running":
            raise ConnectError(Code.UNAVAILABLE, f"sandbox {sandbox_id!r} is {info.state}, not running")
        return info, self.core.record_of(info)

    async def file(
        self, sandbox_id: str, op: str, path: str, data: bytes = b"", **extra: Any
    ) -> tuple[FileResult, bytes]:
        result = await self.core.call(
            self.core.transport.file, sandbox_id, FileOp(op=op, path=path, **extra), data
        )
        return result, result.data

    async def stat(self, sandbox_id: str, path: str) -> fs.EntryInfo:
        reply, _ = await self.file(sandbox_id, "stat", path, follow=False)
        assert reply.stat is not None
        return entry(reply.stat, path)

    # --- process.Process -------------------------------------------------------------------------

    async def list_processes(self, request: pb.ListRequest, ctx: RequestContext[Any, Any]) -> pb.ListResponse:
        try:
            info, record = await self.sandbox(ctx.request_headers)
            items = await self.core.call(self.core.transport.processes, info.name)
        except Exception as e:
            raise connect_error(e) from None
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
                known = Proc(p.spawn_id, p.pid, argv[0], argv[1:], {}, record.workspace)
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
            home = {"HOME": record.workspace} if self.core.records.get(info.name) else {}
            envs = {**home, **record.envs, **dict(config.envs)}
            cwd = self.core.resolve(record, config.cwd) if config.cwd else record.workspace
            argv = [config.cmd, *config.args]
            tty_file = f"/tmp/.e2b-pty-{uuid.uuid4().hex}"
            if request.pty is not None:
                argv = in_terminal(argv, request.pty.size, tty_file)
            spawn_id, pid = await self.core.call(
                self.core.transport.spawn,
                info.name,
                argv,
                cwd=cwd,
                env=envs,
                timeout=None,
                output_limit=OUTPUT_LIMIT,
                stdin=bool(request.stdin) or request.pty is not None,
            )
        except Exception as e:
            raise connect_error(e) from None
        pty = tty_file if request.pty is not None else None
        self.procs[(info.name, pid)] = Proc(
            spawn_id, pid, config.cmd, list(config.args), dict(config.envs), cwd, request.tag, pty
        )
        yield pb.StartResponse(event=self.started(pid))
        async for event in self.follow(info.name, spawn_id, 0, 0, pty is not None):
            yield pb.StartResponse(event=event)

    async def connect(
        self, request: pb.ConnectRequest, ctx: RequestContext[Any, Any]
    ) -> AsyncIterator[pb.ConnectResponse]:
        try:
            info, _ = await self.sandbox(ctx.request_headers)
            proc = await self.find(info.name, request.process)
            # E2B's Connect streams what comes from now on, not what came before.
            _, out, err = await self.core.call(self.core.transport.process, info.name, proc.spawn_id)
        except Exception as e:
            raise connect_error(e) from None
        yield pb.ConnectResponse(event=self.started(proc.pid))
        async for event in self.follow(info.name, proc.spawn_id, len(out), len(err), proc.pty is not None):
            yield pb.ConnectResponse(event=event)

    def started(self, pid: int) -> pb.ProcessEvent:
        return pb.ProcessEvent(event=Oneof("start", pb.ProcessEvent.StartEvent(pid=pid)))

    async def follow(
        self, sandbox_id: str, spawn_id: str, out_off: int, err_off: int, pty: bool = False
    ) -> AsyncIterator[pb.ProcessEvent]:
        """The output of a background process as it comes (all of it the terminal's, for a
        process in a PTY), then its end."""
        quiet_since = time.monotonic()
        while True:
            try:
                state, out, err = await self.core.call(
                    self.core.transport.process, sandbox_id, spawn_id, out_off, err_off
                )
            except Exception as e:
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
            if state.status is not None or not state.running:
                self.procs.pop((sandbox_id, state.pid), None)
                yield pb.ProcessEvent(event=Oneof("end", end_event(state)))
                return
            if time.monotonic() - quiet_since > KEEPALIVE:
                quiet_since = time.monotonic()
                yield pb.ProcessEvent(event=Oneof("keepalive", pb.ProcessEvent.KeepAlive()))
            await asyncio.sleep(POLL)

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

    async def update(self, request: pb.UpdateRequest, ctx: RequestContext[Any, Any]) -> pb.UpdateResponse:
        """Resize a process's terminal: ``stty`` on the terminal its child holds (the
        kernel then sends SIGWINCH to the terminal's foreground processes)."""
        try:
            info, _ = await self.sandbox(ctx.request_headers)
            proc = await self.find(info.name, request.process)
            size = request.pty.size if request.pty is not None else None
            if proc.pty is None or size is None:
                raise E2BError(400, f"process {proc.pid} has no terminal to resize (or no size given)")
            rows, cols = checked_size(size)
            resize = f'stty -F "$(cat {shlex.quote(proc.pty)})" rows {rows} cols {cols}'
            result = await self.core.call(
                self.core.transport.exec,
                info.name,
                ["/bin/sh", "-c", resize],
                cwd="/",
                env={},
                stdin=None,
                timeout=10,
                output_limit=4096,
                on_stdout=None,
                on_stderr=None,
            )
            if result.exit_code != 0:
                raise E2BError(409, f"cannot resize the terminal of process {proc.pid}: {result.stderr!r}")
        except Exception as e:
            raise connect_error(e) from None
        return pb.UpdateResponse()

    async def send_input(
        self, request: pb.SendInputRequest, ctx: RequestContext[Any, Any]
    ) -> pb.SendInputResponse:
        try:
            info, _ = await self.sandbox(ctx.request_headers)
            proc = await self.find(info.name, request.process)
            await self.write(info.name, proc, request.input)
        except Exception as e:
            raise connect_error(e) from None
        return pb.SendInputResponse()

    async def write(self, sandbox_id: str, proc: Proc, given: pb.ProcessInput | None) -> None:
        chosen = given.input if given is not None else None
        if chosen is None:
            return
        in_pty = proc.pty is not None
        if (chosen.field == "pty") != in_pty:
            raise E2BError(400, f"process {proc.pid} takes {'pty' if in_pty else 'stdin'} input")
        await self.core.call(self.core.transport.write_stdin, sandbox_id, proc.spawn_id, chosen.value)

    async def stream_input(
        self, request: AsyncIterator[pb.StreamInputRequest], ctx: RequestContext[Any, Any]
    ) -> pb.StreamInputResponse:
        try:
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
        except Exception as e:
            raise connect_error(e) from None
        return pb.StreamInputResponse()

    async def close_stdin(
        self, request: pb.CloseStdinRequest, ctx: RequestContext[Any, Any]
    ) -> pb.CloseStdinResponse:
        try:
            info, _ = await self.sandbox(ctx.request_headers)
            proc = await self.find(info.name, request.process)
            await self.core.call(self.core.transport.write_stdin, info.name, proc.spawn_id, b"", eof=True)
        except Exception as e:
            raise connect_error(e) from None
        return pb.CloseStdinResponse()

    async def send_signal(
        self, request: pb.SendSignalRequest, ctx: RequestContext[Any, Any]
    ) -> pb.SendSignalResponse:
        try:
            info, _ = await self.sandbox(ctx.request_headers)
            proc = await self.find(info.name, request.process)
            sig = request.signal.value if request.signal is not None else 0
            if sig not in (_signal.SIGKILL, _signal.SIGTERM):
                raise E2BError(400, f"signal {sig} is neither SIGKILL (9) nor SIGTERM (15)")
            await self.core.call(self.core.transport.signal, info.name, proc.pid, sig)
        except Exception as e:
            raise connect_error(e) from None
        return pb.SendSignalResponse()

    # --- filesystem.Filesystem -------------------------------------------------------------------

    async def fs_stat(self, request: fs.StatRequest, ctx: RequestContext[Any, Any]) -> fs.StatResponse:
        try:
            info, record = await self.sandbox(ctx.request_headers)
            return fs.StatResponse(entry=await self.stat(info.name, self.core.resolve(record, request.path)))
        except Exception as e:
            raise connect_error(e) from None

    async def make_dir(self, request: fs.MakeDirRequest, ctx: RequestContext[Any, Any]) -> fs.MakeDirResponse:
        try:
            info, record = await self.sandbox(ctx.request_headers)
            path = self.core.resolve(record, request.path)
            exists, _ = await self.file(info.name, "exists", path)
            if exists.exists:
                raise ConnectError(Code.ALREADY_EXISTS, f"{path} already exists")
            await self.file(info.name, "mkdir", path, parents=True, exist_ok=False, mode=0o755)
            return fs.MakeDirResponse(entry=await self.stat(info.name, path))
        except Exception as e:
            raise connect_error(e) from None

    async def move(self, request: fs.MoveRequest, ctx: RequestContext[Any, Any]) -> fs.MoveResponse:
        try:
            info, record = await self.sandbox(ctx.request_headers)
            src = self.core.resolve(record, request.source)
            dst = self.core.resolve(record, request.destination)
            await self.file(info.name, "rename", src, dst=dst)
            return fs.MoveResponse(entry=await self.stat(info.name, dst))
        except Exception as e:
            raise connect_error(e) from None

    async def list_dir(self, request: fs.ListDirRequest, ctx: RequestContext[Any, Any]) -> fs.ListDirResponse:
        try:
            info, record = await self.sandbox(ctx.request_headers)
            path = self.core.resolve(record, request.path)
            found = await self.walk(info.name, path, max(1, request.depth))
            return fs.ListDirResponse(entries=[entry(s, p) for p, s in found])
        except Exception as e:
            raise connect_error(e) from None

    async def walk(self, sandbox_id: str, path: str, depth: int) -> list[tuple[str, FileInfo]]:
        out: list[tuple[str, FileInfo]] = []
        level = [path]
        for _ in range(depth):
            below: list[str] = []
            for directory in level:
                reply, _ = await self.file(sandbox_id, "list", directory)
                for item in reply.entries:
                    child = posixpath.join(directory, item.name)
                    out.append((child, item))
                    if item.type == "dir":
                        below.append(child)
                if len(out) > MAX_LIST:
                    raise E2BError(413, f"{path} holds over {MAX_LIST} entries at this depth")
            level = below
        return out

    async def remove(self, request: fs.RemoveRequest, ctx: RequestContext[Any, Any]) -> fs.RemoveResponse:
        try:
            info, record = await self.sandbox(ctx.request_headers)
            await self.file(info.name, "remove", self.core.resolve(record, request.path), recursive=True)
        except Exception as e:
            raise connect_error(e) from None
        return fs.RemoveResponse()

    async def snapshot(
        self, sandbox_id: str, path: str, recursive: bool
    ) -> dict[str, tuple[str, int, float]]:
        found = await self.walk(sandbox_id, path, 64 if recursive else 1)
        return {posixpath.relpath(p, path): (s.type, s.size, s.mtime) for p, s in found}

    @staticmethod
    def changes(
        before: dict[str, tuple[str, int, float]], after: dict[str, tuple[str, int, float]]
    ) -> list[fs.FilesystemEvent]:
        events = []
        for name in sorted(after.keys() - before.keys()):
            events.append(fs.FilesystemEvent(name=name, type=fs.EventType.CREATE))
        for name in sorted(after.keys() & before.keys()):
            if after[name] != before[name] and after[name][0] != "dir":
                events.append(fs.FilesystemEvent(name=name, type=fs.EventType.WRITE))
        for name in sorted(before.keys() - after.keys()):
            events.append(fs.FilesystemEvent(name=name, type=fs.EventType.REMOVE))
        return events

    async def watch_dir(
        self, request: fs.WatchDirRequest, ctx: RequestContext[Any, Any]
    ) -> AsyncIterator[fs.WatchDirResponse]:
        try:
            info, record = await self.sandbox(ctx.request_headers)
            path = self.core.resolve(record, request.path)
            seen = await self.snapshot(info.name, path, request.recursive)
        except Exception as e:
            raise connect_error(e) from None
        yield fs.WatchDirResponse(event=Oneof("start", fs.WatchDirResponse.StartEvent()))
        quiet_since = time.monotonic()
        while True:
            await asyncio.sleep(WATCH_EVERY)
            try:
                now = await self.snapshot(info.name, path, request.recursive)
            except Exception as e:
                raise connect_error(e) from None
            for event in self.changes(seen, now):
                quiet_since = time.monotonic()
                yield fs.WatchDirResponse(event=Oneof("filesystem", event))
            seen = now
            if time.monotonic() - quiet_since > KEEPALIVE:
                quiet_since = time.monotonic()
                yield fs.WatchDirResponse(event=Oneof("keepalive", fs.WatchDirResponse.KeepAlive()))

    async def create_watcher(
        self, request: fs.CreateWatcherRequest, ctx: RequestContext[Any, Any]
    ) -> fs.CreateWatcherResponse:
        try:
            info, record = await self.sandbox(ctx.request_headers)
            path = self.core.resolve(record, request.path)
            watcher = Watcher(info.name, path, request.recursive)
            watcher.seen = await self.snapshot(info.name, path, request.recursive)
        except Exception as e:
            raise connect_error(e) from None
        ident = uuid.uuid4().hex
        self.watchers[ident] = watcher
        return fs.CreateWatcherResponse(watcher_id=ident)

    async def get_watcher_events(
        self, request: fs.GetWatcherEventsRequest, ctx: RequestContext[Any, Any]
    ) -> fs.GetWatcherEventsResponse:
        try:
            info, _ = await self.sandbox(ctx.request_headers)
            watcher = self.watcher(info.name, request.watcher_id)
            now = await self.snapshot(info.name, watcher.path, watcher.recursive)
        except Exception as e:
            raise connect_error(e) from None
        events = self.changes(watcher.seen, now)
        watcher.seen = now
        return fs.GetWatcherEventsResponse(events=events)

    async def remove_watcher(
        self, request: fs.RemoveWatcherRequest, ctx: RequestContext[Any, Any]
    ) -> fs.RemoveWatcherResponse:
        try:
            info, _ = await self.sandbox(ctx.request_headers)
            self.watcher(info.name, request.watcher_id)
        except Exception as e:
            raise connect_error(e) from None
        del self.watchers[request.watcher_id]
        return fs.RemoveWatcherResponse()

    def watcher(self, sandbox_id: str, ident: str) -> Watcher:
        watcher = self.watchers.get(ident)
        if watcher is None or watcher.sandbox_id != sandbox_id:
            raise E2BError(404, f"watcher {ident!r} not found")
        return watcher

    # --- REST ------------------------------------------------------------------------------------

    async def rest_sandbox(self, request: Request) -> tuple[SandboxInfo, Record]:
        try:
            return await self.sandbox(request.headers)
        except ConnectError as e:
            raise E2BError(502, e.message) from None

    async def health(self, request: Request) -> Response:
        return Response(status_code=204)

    async def envs(self, request: Request) -> Response:
        _, record = await self.rest_sandbox(request)
        return JSONResponse(record.envs)

    async def files_get(self, request: Request) -> Response:
        info, record = await self.rest_sandbox(request)
        path = self.core.resolve(record, query_path(request))
        reply, _ = await self.file(info.name, "stat", path)
        assert reply.stat is not None
        if reply.stat.type == "dir":
            raise E2BError(400, f"{path} is a directory")
        _, data = await self.file(info.name, "read", path, max_bytes=MAX_FILE)
        return Response(data, media_type="application/octet-stream")

    async def files_post(self, request: Request) -> Response:
        info, record = await self.rest_sandbox(request)
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > MAX_FILE + 64 * 1024:
            raise E2BError(413, f"upload of {declared} bytes is over the limit of {MAX_FILE}")
        given = request.query_params.get("path")
        uploads: list[tuple[str, bytes]] = []
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            form = await request.form(max_files=1000, max_part_size=MAX_FILE)
            for key, value in form.multi_items():
                if isinstance(value, str):
                    raise E2BError(400, f"form field {key!r} is not a file")
                name = given if given is not None and len(form) == 1 else value.filename
                if not name:
                    raise E2BError(400, "a file part has no file name and no ?path= names it")
                uploads.append((name, await value.read()))
        else:
            data = await body(request)  # read first: a refusal mid-upload would reset the connection
            if given is None:
                raise E2BError(400, "query parameter path is required")
            uploads.append((given, data))
        written = []
        for raw, data in uploads:
            path = self.core.resolve(record, raw)
            await self.file(info.name, "write", path, data, mode=0o644, parents=True)
            written.append({"name": posixpath.basename(path), "type": "file", "path": path})
        return JSONResponse(written)

    # --- the ASGI apps ---------------------------------------------------------------------------

    def rpc_apps(self) -> dict[str, ASGIApp]:
        """path prefix -> the Connect application serving it."""
        process = _Service(self, PROCESS_METHODS)
        filesystem = _Service(self, FILESYSTEM_METHODS)
        return {
            "/process.Process/": ProcessASGIApplication(process, codecs=CODECS),  # type: ignore[arg-type]
            "/filesystem.Filesystem/": FilesystemASGIApplication(filesystem, codecs=CODECS),  # type: ignore[arg-type]
        }

    def routes(self) -> list[Route]:
        return [
            Route("/health", rest(self.health), methods=["GET"]),
            Route("/envs", rest(self.envs), methods=["GET"]),
            Route("/files", rest(self.files_get), methods=["GET"]),
            Route("/files", rest(self.files_post), methods=["POST"]),
        ]


# The generated service protocols name the filesystem's ``stat`` and ``list_dir`` like the
# process service's ``list``: one ``Envd`` serves both under distinct method names.
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
FILESYSTEM_METHODS = {
    "stat": "fs_stat",
    "make_dir": "make_dir",
    "move": "move",
    "list_dir": "list_dir",
    "remove": "remove",
    "watch_dir": "watch_dir",
    "create_watcher": "create_watcher",
    "get_watcher_events": "get_watcher_events",
    "remove_watcher": "remove_watcher",
}


class _Checked:
    """A codec whose undecodable input is the caller's error (``invalid_argument``, HTTP
    400), not connect-python's catch-all ``unknown`` (HTTP 500)."""

    def __init__(self, inner: Codec[Any, Any]) -> None:
        self.inner = inner

    def name(self) -> str:
        return self.inner.name()

    def encode(self, message: Any) -> bytes:
        return self.inner.encode(message)

    def decode(self, data: bytes | bytearray, message_class: type[T]) -> T:
        try:
            decoded: T = self.inner.decode(data, message_class)
        except Exception as e:
            raise ConnectError(
                Code.INVALID_ARGUMENT, f"cannot decode {message_class.__name__}: {e}"
            ) from None
        return decoded


CODECS = [_Checked(proto_binary_codec()), _Checked(proto_json_codec())]


class _Service:
    """One service's methods of ``Envd`` under the names the generated stub calls."""

    def __init__(self, envd: Envd, methods: dict[str, str]) -> None:
        for name, attr in methods.items():
            setattr(self, name, getattr(envd, attr))


def query_path(request: Request) -> str:
    path = request.query_params.get("path")
    if path is None:
        raise E2BError(400, "query parameter path is required")
    return path


async def body(request: Request) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_FILE:
            raise E2BError(413, f"upload is over the limit of {MAX_FILE} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def rest(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    async def route(request: Request) -> Response:
        try:
            return await handler(request)
        except (E2BError, WarrenError) as e:
            return JSONResponse({"code": status_of(e), "message": message_of(e)}, status_code=status_of(e))
        except Exception as e:
            traceback.print_exc(file=sys.stderr)
            return JSONResponse({"code": 500, "message": message_of(e)}, status_code=500)

    return route
