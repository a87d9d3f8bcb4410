"""Handlers of API v1 for processes in a sandbox: start one in the background, feed
its stdin, list them, read a background process's state and output (once, or as
SSE that resumes from offsets), signal one."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .. import codec, protocol
from ..client import checks
from ..errors import WarrenError
from ..models import ProcessState
from . import fields
from .body import MAX_JSON, body, command_of, flag, json_body, name_of, offsets, query_int, stdin_json
from .core import Service
from .sse import chunk, event_stream, sse
from .status import HttpError, bad_request, error_body

POLL = 0.05  # seconds between looks at a background process that printed nothing new


def process_state(state: ProcessState) -> dict[str, Any]:
    return {
        "pid": state.pid,
        "argv": list(state.argv),
        "running": state.status is None and state.running,
        "alive": state.running,
        "status": state.status,
        "exit_code": None if state.status is None else protocol.exit_code(state.status),
        "timed_out": state.timed_out,
        "limit": state.limit,
    }


async def spawn(svc: Service, request: Request) -> Response:
    name = name_of(request)
    data = await json_body(request, fields.SPAWN)
    stdin = data.pop("stdin", False)
    if not isinstance(stdin, bool):
        raise HttpError(
            400,
            f"stdin of a background process must be true or false, not {stdin!r}",
            hint="true gives it a pipe: send data with POST .../processes/{id}/stdin",
        )
    with bad_request():
        command = dataclasses.replace(command_of(data, "spawn"), stdin_pipe=stdin)
    spawn_id, pid = await svc.call(svc.transport.spawn, name, command)
    return JSONResponse({"id": spawn_id, "pid": pid}, status_code=201)


async def stdin(svc: Service, request: Request) -> Response:
    """Data for a background process's stdin: a raw body (Content-Type
    application/octet-stream, ``?eof=true`` to close after it), or JSON ``{"data",
    "encoding", "eof"}``."""
    name, ident = name_of(request), request.path_params["id"]
    if request.headers.get("content-type", "").startswith("application/octet-stream"):
        # Up to the JSON bound: a body over what stdin may queue is the transport's
        # StdinFull (413), as for the SDK.
        data = await body(request, MAX_JSON)
        eof = flag(request, "eof")
    else:
        data, eof = stdin_json(await json_body(request, fields.STDIN))
    queued = await svc.call(svc.transport.write_stdin, name, ident, data, eof=eof)
    return JSONResponse({"queued": queued, "closed": eof})


async def list_all(svc: Service, request: Request) -> Response:
    items = await svc.call(svc.transport.processes, name_of(request))
    return JSONResponse({"processes": [codec.encode(p) for p in items]})


async def spawns(svc: Service, request: Request) -> Response:
    items = await svc.call(svc.transport.spawns, name_of(request))
    return JSONResponse({"spawns": [codec.encode(s) for s in items]})


async def get(svc: Service, request: Request) -> Response:
    name, spawn_id = name_of(request), request.path_params["id"]
    out_off, err_off = query_int(request, "offset", 0), query_int(request, "stderr_offset", 0)
    state, out, err = await svc.call(svc.transport.process, name, spawn_id, out_off, err_off)
    data = process_state(state)
    codec.put_bytes(data, "stdout", out)
    codec.put_bytes(data, "stderr", err)
    data["next_offset"], data["next_stderr_offset"] = out_off + len(out), err_off + len(err)
    return JSONResponse(data)


async def output(svc: Service, request: Request) -> Response:
    """SSE of a background process's output from a pair of offsets; each event's id
    is "STDOUT_OFFSET:STDERR_OFFSET" after it, so a client resumes with
    ``Last-Event-ID`` (or ``?offset=&stderr_offset=``) and loses nothing."""
    name, spawn_id = name_of(request), request.path_params["id"]
    out_off, err_off = query_int(request, "offset", 0), query_int(request, "stderr_offset", 0)
    last = request.headers.get("last-event-id")
    if last:
        first, _, second = last.partition(":")
        if not (first.isascii() and first.isdigit() and second.isascii() and second.isdigit()) or (
            len(first) > 19 or len(second) > 19
        ):
            raise HttpError(400, f"Last-Event-ID {last[:80]!r} is not STDOUT_OFFSET:STDERR_OFFSET")
        out_off, err_off = offsets(int(first), int(second))
    state, out, err = await svc.call(svc.transport.process, name, spawn_id, out_off, err_off)

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
                state, out, err = await svc.call(svc.transport.process, name, spawn_id, out_off, err_off)
            except WarrenError as e:
                yield sse("error", error_body(e))
                return

    return event_stream(events())


async def signal(svc: Service, request: Request) -> Response:
    name = name_of(request)
    data = await json_body(request, fields.SIGNAL)
    with bad_request():
        sig = checks.signal(data.get("signal", 15), "signal")
    pid = await _pid(svc, name, request.path_params["id"])
    await svc.call(svc.transport.signal, name, pid, sig)
    return JSONResponse({"ok": True})


async def _pid(svc: Service, name: str, ident: str) -> int:
    if ident.isascii() and ident.lstrip("-").isdigit():
        return checks.pid(int(ident) if len(ident) < 20 else ident[:30], "signal")
    end = checks.MAX_OFFSET
    state, _, _ = await svc.call(svc.transport.process, name, ident, end, end)
    return int(state.pid)
