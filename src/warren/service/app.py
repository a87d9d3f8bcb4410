"""The HTTP API v1 as a Starlette application over a ``Transport``.

Every route checks its input (unknown keys, types, sizes) and calls the same
transport methods the SDK calls, in a worker thread: the service adds no sandbox
logic of its own, so a sandbox behaves the same from Python, HTTP and MCP. Errors
are ``WarrenError``s turned into ``codec.error_body`` with ``codec.status_of``.

Auth and the request log are one small ASGI wrapper (``Guard``) around everything,
so nothing runs for a request without the token.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hmac
import json
import sys
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import anyio
import anyio.to_thread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import protocol, wire
from ..client import checks
from ..client.transport import Transport
from ..errors import WarrenError
from ..names import check_name
from ..output import DEFAULT_OUTPUT_LIMIT
from ..policy.spec import KNOWN, from_mapping
from . import codec
from .codec import HttpError
from .conn import RateLimited

MAX_JSON = 16 * 1024 * 1024
MAX_FILE = wire.MAX_PAYLOAD
POLL = 0.05

Handler = Callable[[Request], Awaitable[Response]]


# --- input -------------------------------------------------------------------------------------


async def body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HttpError(
            413, f"request body of {declared} bytes is over the limit of {limit}", hint=_big(limit)
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HttpError(413, f"request body is over the limit of {limit} bytes", hint=_big(limit))
        chunks.append(chunk)
    return b"".join(chunks)


def _big(limit: int) -> str:
    return f"send at most {limit} bytes per request (large files: write them in parts with append)"


async def json_body(
    request: Request, fields: Mapping[str, str], required: tuple[str, ...] = (), empty_ok: bool = True
) -> dict[str, Any]:
    """The request's JSON object with only ``fields`` (name -> what it must be); an
    empty body is ``{}`` when ``empty_ok``."""
    raw = await body(request, MAX_JSON)
    if not raw and not empty_ok:
        raise HttpError(
            400,
            "request body is empty",
            hint='send a JSON object, e.g. {"workspace": "/path"} (without one the sandbox would '
            "get the service's working directory)",
        )
    try:
        data = json.loads(raw or b"{}")
    except (ValueError, UnicodeDecodeError) as e:
        raise HttpError(400, f"request body is not valid JSON: {e}", hint="send a JSON object") from None
    if not isinstance(data, dict):
        raise HttpError(400, "request body must be a JSON object", hint="send a JSON object {...}")
    for key in data:
        if key not in fields:
            raise HttpError(
                400, f"unknown key {key!r} in request body", hint=f"known keys: {', '.join(sorted(fields))}"
            )
    for key in required:
        if key not in data:
            raise HttpError(400, f"request body lacks {key!r}", hint=f"{key}: {fields[key]}")
    return data


def _stdin(data: Mapping[str, Any]) -> bytes | None:
    value = data.get("stdin")
    if value is None:
        return None
    if not isinstance(value, str):
        raise HttpError(400, "stdin must be a string", hint='text, or base64 with "stdin_encoding": "base64"')
    if data.get("stdin_encoding") == "base64":
        try:
            return base64.b64decode(value, validate=True)
        except ValueError:
            raise HttpError(400, "stdin is not valid base64", hint="encode with standard base64") from None
    return value.encode()


def _stdin_json(data: Mapping[str, Any]) -> tuple[bytes, bool]:
    """(data, eof) of a JSON body for a process's stdin."""
    text, encoding, eof = data.get("data", ""), data.get("encoding", "utf-8"), data.get("eof", False)
    if not isinstance(text, str):
        raise HttpError(400, "data must be a string", hint='text, or base64 with "encoding": "base64"')
    if encoding not in ("utf-8", "base64"):
        raise HttpError(
            400,
            f"encoding must be 'utf-8' or 'base64', not {encoding!r}",
            hint="other bytes: base64, or a raw body with Content-Type application/octet-stream",
        )
    if not isinstance(eof, bool):
        raise HttpError(400, f"eof must be true or false, not {eof!r}", hint="true closes stdin after data")
    if encoding == "utf-8":
        return text.encode(), eof
    try:
        return base64.b64decode(text, validate=True), eof
    except ValueError:
        raise HttpError(400, "data is not valid base64", hint="encode with standard base64") from None


def _int(value: object, what: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise HttpError(400, f"{what} must be an integer, not {value!r}", hint=f"pass e.g. {default}")
    return value


def _query_int(request: Request, key: str, default: int) -> int:
    raw = request.query_params.get(key)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19 or int(raw) > checks.MAX_OFFSET:
        raise HttpError(
            400, f"query parameter {key}={raw[:40]!r} must be an integer from 0 to {checks.MAX_OFFSET}"
        )
    return int(raw)


def _offsets(out: int, err: int) -> tuple[int, int]:
    with codec.bad_request():
        return checks.offset(out, "offset", "process"), checks.offset(err, "stderr_offset", "process")


def command_args(data: Mapping[str, Any], op: str) -> tuple[list[str], dict[str, Any]]:
    """argv and the keyword arguments of ``Transport.exec`` from a request body."""
    limit = _int(data.get("output_limit"), "output_limit", DEFAULT_OUTPUT_LIMIT)
    return checks.argv(data["argv"], op), {
        "cwd": checks.cwd(data.get("cwd"), op),
        "env": checks.env(data.get("env"), op),
        "stdin": _stdin(data),
        "timeout": checks.timeout(data.get("timeout"), op),
        "output_limit": checks.limit(limit, op),
    }


def _flag(request: Request, key: str, default: bool = False) -> bool:
    raw = request.query_params.get(key)
    if raw is None:
        return default
    if raw.lower() in ("1", "true", "yes"):
        return True
    if raw.lower() in ("", "0", "false", "no"):
        return False
    raise HttpError(400, f"query parameter {key}={raw[:40]!r} must be true or false", hint=f"?{key}=true")


def _name(request: Request) -> str:
    with codec.bad_request():
        return check_name(request.path_params["name"])


def _path(request: Request, key: str = "path", value: object = None) -> str:
    raw = request.query_params.get(key) if value is None else value
    if raw is None:
        raise HttpError(400, f"query parameter {key!r} is required", hint=f"add ?{key}=PATH")
    # ``..`` and symlinks are resolved by the kernel inside the sandbox (as for the SDK):
    # a path leads only where the sandbox's own view and policy let it.
    with codec.bad_request():
        return checks.path(raw, "files")


# --- streaming ---------------------------------------------------------------------------------


def sse(event: str, data: object, event_id: str | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def chunk(data: bytes) -> dict[str, str]:
    return {"data": base64.b64encode(data).decode()}


def wants_sse(request: Request) -> bool:
    return "text/event-stream" in request.headers.get("accept", "")


class Service:
    def __init__(self, transport: Transport, threads: int = 256) -> None:
        self.transport = transport
        self.limiter = anyio.CapacityLimiter(threads)

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs), limiter=self.limiter)

    def streamed(self, start: Callable[[Callable[[bytes], None], Callable[[bytes], None]], Any]) -> Response:
        """SSE of a command's output as it comes, then ``exit`` (or ``error``)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        def feed(kind: str) -> Callable[[bytes], None]:
            def put(data: bytes) -> None:
                loop.call_soon_threadsafe(queue.put_nowait, (kind, data))

            return put

        task = asyncio.ensure_future(self.call(start, feed("stdout"), feed("stderr")))
        task.add_done_callback(lambda _: queue.put_nowait(("done", None)))

        async def events() -> AsyncIterator[bytes]:
            while True:
                kind, data = await queue.get()
                if kind != "done":
                    yield sse(kind, chunk(data))
                    continue
                error = task.exception()
                if isinstance(error, WarrenError):
                    yield sse("error", codec.error_body(error))
                elif error is not None:
                    yield sse("error", codec.error_body(_internal(error)))
                else:
                    yield sse("exit", codec.result(task.result()))
                return

        return StreamingResponse(
            events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    # --- routes -----------------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        from importlib.metadata import version

        return JSONResponse({"status": "ok", "version": version("warren"), "api": "v1"})

    async def openapi(self, request: Request) -> Response:
        from .openapi import document

        return JSONResponse(document())

    async def run(self, request: Request) -> Response:
        data = await json_body(request, RUN_FIELDS, ("argv",))
        with codec.bad_request():
            spec = from_mapping(data.get("policy") or {}, "request policy")
            argv, args = command_args(data, "run")
        args.update(config=False, profile=None, on_net_event=None)
        args.pop("env")
        if wants_sse(request):
            return self.streamed(
                lambda out, err: self.transport.run(argv, spec, on_stdout=out, on_stderr=err, **args)
            )
        result = await self.call(self.transport.run, argv, spec, on_stdout=None, on_stderr=None, **args)
        return JSONResponse(codec.result(result))

    async def create(self, request: Request) -> Response:
        data = await json_body(request, CREATE_FIELDS, empty_ok=False)
        name = data.pop("name", None)
        if name is None:
            import uuid

            name = f"sb-{uuid.uuid4().hex[:10]}"
        if not isinstance(name, str):
            raise HttpError(400, "name must be a string", hint="letters, digits, '-', '_', '.'")
        with codec.bad_request():
            spec = from_mapping(data, "request body")
            name = check_name(name)
        info = await self.call(self.transport.create, spec, name, config=False, profile=None)
        return JSONResponse(codec.sandbox(info), status_code=201)

    async def list(self, request: Request) -> Response:
        items = await self.call(self.transport.list)
        return JSONResponse({"sandboxes": [codec.sandbox(i) for i in items]})

    async def get(self, request: Request) -> Response:
        return JSONResponse(codec.sandbox(await self.call(self.transport.get, _name(request))))

    async def delete(self, request: Request) -> Response:
        name, remove = _name(request), _flag(request, "remove", True)
        info = await self.call(self.transport.stop, name, remove=remove)
        return JSONResponse(codec.sandbox(info))

    async def exec(self, request: Request) -> Response:
        name = _name(request)
        data = await json_body(request, EXEC_FIELDS, ("argv",))
        with codec.bad_request():
            argv, args = command_args(data, "exec")
        if wants_sse(request):
            return self.streamed(
                lambda out, err: self.transport.exec(name, argv, on_stdout=out, on_stderr=err, **args)
            )
        result = await self.call(self.transport.exec, name, argv, on_stdout=None, on_stderr=None, **args)
        return JSONResponse(codec.result(result))

    # --- processes ---------------------------------------------------------------------------------

    async def spawn(self, request: Request) -> Response:
        name = _name(request)
        data = await json_body(request, SPAWN_FIELDS, ("argv",))
        stdin = data.pop("stdin", False)
        if not isinstance(stdin, bool):
            raise HttpError(
                400,
                f"stdin of a background process must be true or false, not {stdin!r}",
                hint="true gives it a pipe: send data with POST .../processes/{id}/stdin",
            )
        with codec.bad_request():
            argv, args = command_args(data, "spawn")
        args["stdin"] = stdin
        spawn_id, pid = await self.call(self.transport.spawn, name, argv, **args)
        return JSONResponse({"id": spawn_id, "pid": pid}, status_code=201)

    async def stdin(self, request: Request) -> Response:
        """Data for a background process's stdin: a raw body (Content-Type
        application/octet-stream, ``?eof=true`` to close after it), or JSON ``{"data",
        "encoding", "eof"}``."""
        name, ident = _name(request), request.path_params["id"]
        if request.headers.get("content-type", "").startswith("application/octet-stream"):
            # Up to the JSON bound: a body over what stdin may queue is the transport's
            # StdinFull (413), as for the SDK.
            data = await body(request, MAX_JSON)
            eof = _flag(request, "eof")
        else:
            data, eof = _stdin_json(await json_body(request, STDIN_FIELDS))
        queued = await self.call(self.transport.write_stdin, name, ident, data, eof=eof)
        return JSONResponse({"queued": queued, "closed": eof})

    async def processes(self, request: Request) -> Response:
        items = await self.call(self.transport.processes, _name(request))
        return JSONResponse({"processes": [codec.process(p) for p in items]})

    async def process(self, request: Request) -> Response:
        name, spawn_id = _name(request), request.path_params["id"]
        out_off, err_off = _query_int(request, "offset", 0), _query_int(request, "stderr_offset", 0)
        state, out, err = await self.call(self.transport.process, name, spawn_id, out_off, err_off)
        data = process_state(state)
        codec.put_bytes(data, "stdout", out)
        codec.put_bytes(data, "stderr", err)
        data["next_offset"], data["next_stderr_offset"] = out_off + len(out), err_off + len(err)
        return JSONResponse(data)

    async def output(self, request: Request) -> Response:
        """SSE of a background process's output from a pair of offsets; each event's id
        is "STDOUT_OFFSET:STDERR_OFFSET" after it, so a client resumes with
        ``Last-Event-ID`` (or ``?offset=&stderr_offset=``) and loses nothing."""
        name, spawn_id = _name(request), request.path_params["id"]
        out_off, err_off = _query_int(request, "offset", 0), _query_int(request, "stderr_offset", 0)
        last = request.headers.get("last-event-id")
        if last:
            first, _, second = last.partition(":")
            if not (first.isascii() and first.isdigit() and second.isascii() and second.isdigit()) or (
                len(first) > 19 or len(second) > 19
            ):
                raise HttpError(400, f"Last-Event-ID {last[:80]!r} is not STDOUT_OFFSET:STDERR_OFFSET")
            out_off, err_off = _offsets(int(first), int(second))
        state, out, err = await self.call(self.transport.process, name, spawn_id, out_off, err_off)

        async def events() -> AsyncIterator[bytes]:
            nonlocal state, out, err, out_off, err_off
            while True:
                if out:
                    out_off += len(out)
                    yield sse("stdout", chunk(out), f"{out_off}:{err_off}")
                if err:
                    err_off += len(err)
                    yield sse("stderr", chunk(err), f"{out_off}:{err_off}")
                if not (out or err):
                    if state.status is not None or not state.running:
                        yield sse("exit", process_state(state), f"{out_off}:{err_off}")
                        return
                    await asyncio.sleep(POLL)
                try:
                    state, out, err = await self.call(
                        self.transport.process, name, spawn_id, out_off, err_off
                    )
                except WarrenError as e:
                    yield sse("error", codec.error_body(e))
                    return

        return StreamingResponse(
            events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    async def signal(self, request: Request) -> Response:
        name = _name(request)
        data = await json_body(request, {"signal": "a signal number or name (default SIGTERM)"})
        with codec.bad_request():
            sig = checks.signal(data.get("signal", 15), "signal")
        pid = await self._pid(name, request.path_params["id"])
        await self.call(self.transport.signal, name, pid, sig)
        return JSONResponse({"ok": True})

    async def _pid(self, name: str, ident: str) -> int:
        if ident.isascii() and ident.lstrip("-").isdigit():
            return checks.pid(int(ident) if len(ident) < 20 else ident[:30], "signal")
        end = checks.MAX_OFFSET
        state, _, _ = await self.call(self.transport.process, name, ident, end, end)
        return int(state.pid)

    # --- files ---------------------------------------------------------------------------------------

    async def _file(
        self, name: str, op: str, path: str, data: bytes = b"", **extra: Any
    ) -> tuple[protocol.FileReply, bytes]:
        request = protocol.FileRequest(sandbox=name, op=op, path=path, **extra)
        result: tuple[protocol.FileReply, bytes] = await self.call(self.transport.file, request, data)
        return result

    async def files_get(self, request: Request) -> Response:
        name, path = _name(request), _path(request)
        want = request.query_params.get("type")
        if want not in (None, "file", "dir"):
            raise HttpError(400, f"type={want!r}: expected 'file' or 'dir'")
        if want is None:
            reply, _ = await self._file(name, "stat", path)
            assert reply.stat is not None
            want = "dir" if reply.stat.type == "dir" else "file"
        if want == "dir":
            reply, _ = await self._file(name, "list", path)
            return JSONResponse({"path": path, "entries": [e.to_fields() for e in reply.entries]})
        max_bytes = _query_int(request, "max_bytes", 64 * 1024 * 1024)
        if max_bytes > MAX_FILE:
            raise HttpError(413, f"max_bytes {max_bytes} is over {MAX_FILE}", hint="read a part with exec")
        _, data = await self._file(name, "read", path, max_bytes=max_bytes)
        return Response(data, media_type="application/octet-stream")

    async def files_stat(self, request: Request) -> Response:
        name, path = _name(request), _path(request)
        if _flag(request, "exists"):
            reply, _ = await self._file(name, "exists", path)
            return JSONResponse({"exists": reply.exists})
        follow = request.query_params.get("follow", "1").lower() not in ("0", "false", "no")
        reply, _ = await self._file(name, "stat", path, follow=follow)
        assert reply.stat is not None
        return JSONResponse(reply.stat.to_fields())

    async def files_put(self, request: Request) -> Response:
        name, path = _name(request), _path(request)
        raw_mode = request.query_params.get("mode", "644")
        if not raw_mode or any(ch not in "01234567" for ch in raw_mode):
            raise HttpError(400, f"mode={raw_mode!r} is not an octal number", hint="e.g. mode=644")
        with codec.bad_request():
            mode = checks.mode(int(raw_mode, 8), "write")
        data = await body(request, MAX_FILE)
        await self._file(
            name,
            "write",
            path,
            data,
            mode=mode,
            parents=_flag(request, "parents"),
            append=_flag(request, "append"),
        )
        return JSONResponse({"path": path, "size": len(data)}, status_code=201)

    async def files_delete(self, request: Request) -> Response:
        name, path = _name(request), _path(request)
        await self._file(name, "remove", path, recursive=_flag(request, "recursive"))
        return JSONResponse({"ok": True})

    async def files_mkdir(self, request: Request) -> Response:
        name = _name(request)
        data = await json_body(request, MKDIR_FIELDS, ("path",))
        with codec.bad_request():
            mode = checks.mode(_int(data.get("mode"), "mode", 0o755), "mkdir")
        await self._file(
            name,
            "mkdir",
            _path(request, value=data["path"]),
            parents=bool(data.get("parents")),
            exist_ok=bool(data.get("exist_ok")),
            mode=mode,
        )
        return JSONResponse({"ok": True}, status_code=201)

    async def files_move(self, request: Request) -> Response:
        name = _name(request)
        data = await json_body(request, MOVE_FIELDS, ("src", "dst"))
        src, dst = _path(request, value=data["src"]), _path(request, value=data["dst"])
        await self._file(name, "rename", src, dst=dst)
        return JSONResponse({"ok": True})

    # --- network -----------------------------------------------------------------------------------

    async def expose(self, request: Request) -> Response:
        name = _name(request)
        data = await json_body(request, PORT_FIELDS, ("port",))
        host_port = data.get("host_port")
        with codec.bad_request():
            port = checks.port(data["port"], "port", "expose")
            host_port = checks.port(0 if host_port is None else host_port, "host_port", "expose", 0)
        address = await self.call(self.transport.expose, name, port, host_port)
        return JSONResponse({"address": address}, status_code=201)

    async def stats(self, request: Request) -> Response:
        stats = await self.call(self.transport.stats, _name(request))
        return JSONResponse(dataclasses.asdict(stats))

    async def pause(self, request: Request) -> Response:
        return JSONResponse(codec.sandbox(await self.call(self.transport.pause, _name(request), True)))

    async def resume(self, request: Request) -> Response:
        return JSONResponse(codec.sandbox(await self.call(self.transport.pause, _name(request), False)))

    async def net_log(self, request: Request) -> Response:
        events = await self.call(self.transport.net_log, _name(request))
        return JSONResponse({"events": [codec.net_event(e) for e in events]})


def process_state(state: protocol.ProcessState) -> dict[str, Any]:
    import os

    exit_code = None
    if state.status is not None:
        st = state.status
        exit_code = 128 + os.WTERMSIG(st) if os.WIFSIGNALED(st) else os.waitstatus_to_exitcode(st)
    return {
        "pid": state.pid,
        "argv": list(state.argv),
        "running": state.status is None and state.running,
        "alive": state.running,
        "status": state.status,
        "exit_code": exit_code,
        "timed_out": state.timed_out,
        "limit": state.limit,
    }


RUN_FIELDS = {
    "argv": "list of strings",
    "policy": "policy spec (the keys of warren.toml)",
    "cwd": "directory inside the sandbox",
    "stdin": "string",
    "stdin_encoding": "'utf-8' or 'base64'",
    "timeout": "seconds",
    "output_limit": "bytes per stream",
}
EXEC_FIELDS = {
    "argv": "list of strings",
    "cwd": "directory inside the sandbox",
    "env": "object of strings",
    "stdin": "string",
    "stdin_encoding": "'utf-8' or 'base64'",
    "timeout": "seconds",
    "output_limit": "bytes per stream",
}
SPAWN_FIELDS = {
    **{k: v for k, v in EXEC_FIELDS.items() if not k.startswith("stdin")},
    "stdin": "bool: a pipe fed by POST .../processes/{id}/stdin (default: /dev/null)",
}
STDIN_FIELDS = {
    "data": "string",
    "encoding": "'utf-8' (default) or 'base64'",
    "eof": "bool: close stdin after data",
}
MKDIR_FIELDS = {"path": "path", "parents": "bool", "exist_ok": "bool", "mode": "int (e.g. 493 = 0o755)"}
MOVE_FIELDS = {"src": "path", "dst": "path"}
PORT_FIELDS = {"port": "port in the sandbox", "host_port": "port on the host (0: a free one)"}


CREATE_FIELDS = {"name": "sandbox name", **{k: "a key of warren.toml" for k in KNOWN}}


def _internal(error: BaseException) -> WarrenError:
    return WarrenError(
        f"internal error: {type(error).__name__}: {error}",
        operation="http",
        hint="this is a bug in warren; the service log has the traceback",
    )


def _wrap(handler: Handler) -> Handler:
    async def route(request: Request) -> Response:
        try:
            return await handler(request)
        except WarrenError as e:
            return JSONResponse(codec.error_body(e), status_code=codec.status_of(e))
        except Exception as e:
            traceback.print_exc(file=sys.stderr)
            return JSONResponse(codec.error_body(_internal(e)), status_code=500)

    return route


def routes(service: Service) -> list[Route]:
    s = service
    prefix = "/v1/sandboxes/{name}"
    table: list[tuple[str, str, Handler]] = [
        ("/v1/health", "GET", s.health),
        ("/v1/openapi.json", "GET", s.openapi),
        ("/v1/run", "POST", s.run),
        ("/v1/sandboxes", "POST", s.create),
        ("/v1/sandboxes", "GET", s.list),
        (prefix, "GET", s.get),
        (prefix, "DELETE", s.delete),
        (f"{prefix}/exec", "POST", s.exec),
        (f"{prefix}/processes", "POST", s.spawn),
        (f"{prefix}/processes", "GET", s.processes),
        (f"{prefix}/processes/{{id}}", "GET", s.process),
        (f"{prefix}/processes/{{id}}/output", "GET", s.output),
        (f"{prefix}/processes/{{id}}/signal", "POST", s.signal),
        (f"{prefix}/processes/{{id}}/stdin", "POST", s.stdin),
        (f"{prefix}/files", "GET", s.files_get),
        (f"{prefix}/files", "PUT", s.files_put),
        (f"{prefix}/files", "DELETE", s.files_delete),
        (f"{prefix}/files/stat", "GET", s.files_stat),
        (f"{prefix}/files/mkdir", "POST", s.files_mkdir),
        (f"{prefix}/files/move", "POST", s.files_move),
        (f"{prefix}/ports", "POST", s.expose),
        (f"{prefix}/netlog", "GET", s.net_log),
        (f"{prefix}/stats", "GET", s.stats),
        (f"{prefix}/pause", "POST", s.pause),
        (f"{prefix}/resume", "POST", s.resume),
    ]
    by_path: dict[str, dict[str, Handler]] = {}
    for path, method, handler in table:
        by_path.setdefault(path, {})[method] = _wrap(handler)
    out = []
    for path, methods in by_path.items():
        out.append(Route(path, _dispatch(methods), methods=list(methods)))
    return out


def _dispatch(methods: dict[str, Handler]) -> Handler:
    async def route(request: Request) -> Response:
        return await methods[request.method](request)

    return route


class Guard:
    """Host/Origin check (TCP on loopback), bearer-token check (constant time), and one
    log line per request; refused requests' lines are rate-limited."""

    def __init__(
        self,
        app: ASGIApp,
        token: str | None,
        log: Callable[[str], None] | None,
        hosts: frozenset[str] | None = None,
    ) -> None:
        self.app = app
        self.token = None if token is None else token.encode()
        self.log = log
        self.hosts = hosts
        self.refusals = RateLimited(log, window=1.0) if log is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.monotonic()
        status = 0

        async def send_logged(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            refusal = self._refusal(scope)
            if refusal is not None:
                headers = {"WWW-Authenticate": "Bearer"} if refusal.status == 401 else {}
                response = JSONResponse(
                    codec.error_body(refusal), status_code=refusal.status, headers=headers
                )
                await response(scope, receive, send_logged)
            else:
                await self.app(scope, receive, send_logged)
        finally:
            if self.log is not None:
                took = (time.monotonic() - start) * 1000
                line = f"{scope['method']} {scope['path']} {status} {took:.1f}ms"
                if status in (401, 403) and self.refusals is not None:
                    self.refusals(str(status), line)
                else:
                    self.log(line)

    def _refusal(self, scope: Scope) -> HttpError | None:
        if self.hosts is not None:
            for key, value in scope["headers"]:
                if (
                    key in (b"host", b"origin")
                    and _hostname(bytes(value), key == b"origin") not in self.hosts
                ):
                    what = "Host" if key == b"host" else "Origin"
                    return HttpError(
                        403,
                        f"the {what} header does not name this service",
                        hint="use http://127.0.0.1:PORT or http://localhost:PORT (web pages are refused)",
                    )
        if self.token is not None and not self._authorized(scope):
            return HttpError(
                401,
                "missing or wrong bearer token",
                hint="send 'Authorization: Bearer TOKEN' with the token `warren serve` was started with",
            )
        return None

    def _authorized(self, scope: Scope) -> bool:
        assert self.token is not None
        for key, value in scope["headers"]:
            if key == b"authorization":
                scheme, _, given = bytes(value).partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.token)
        return False


def _hostname(value: bytes, origin: bool) -> str:
    """The host name of a Host header (``name[:port]``) or an Origin (``scheme://name[:port]``),
    lower case; "" when it is not one."""
    text = value.decode("latin-1").strip().lower()
    if origin:
        scheme, sep, text = text.partition("://")
        if not sep or scheme not in ("http", "https"):
            return ""
    if text.startswith("["):
        end = text.find("]")
        rest = text[end + 1 :]
        ok = end > 0 and (rest == "" or (rest[:1] == ":" and rest[1:].isdigit()))
        return text[: end + 1] if ok else ""
    name, _, port = text.partition(":")
    return name if port == "" or port.isdigit() else ""


def make_app(
    transport: Transport,
    token: str | None,
    *,
    log: Callable[[str], None] | None = None,
    extra: list[BaseRoute] | None = None,
    lifespan: Any = None,
    hosts: frozenset[str] | None = None,
) -> ASGIApp:
    service = Service(transport)
    app = Starlette(routes=[*routes(service), *(extra or [])], lifespan=lifespan)

    async def not_found(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        error = HttpError(
            status, f"no route {request.method} {request.url.path}", hint="see GET /v1/openapi.json"
        )
        headers = getattr(exc, "headers", None) if status == 405 else None
        return JSONResponse(codec.error_body(error), status_code=status, headers=headers)

    app.add_exception_handler(404, not_found)
    app.add_exception_handler(405, not_found)
    return Guard(app, token, log, hosts)
