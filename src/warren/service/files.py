"""Handlers of API v1 for files in a sandbox: read a file or list a directory, stat,
write (all or nothing, or append), remove, mkdir, move. Each is one ``FileOp``
to the transport, run inside the sandbox as the SDK's file operations are."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .. import codec
from ..client import checks
from ..models import FileOp, FileResult
from . import fields
from .body import MAX_FILE, body, flag, int_field, json_body, name_of, path_of, query_int
from .core import Service
from .status import HttpError, bad_request


async def _file(svc: Service, name: str, op: str, path: str, data: bytes = b"", **extra: Any) -> FileResult:
    result: FileResult = await svc.call(svc.transport.file, name, FileOp(op=op, path=path, **extra), data)
    return result


async def get(svc: Service, request: Request) -> Response:
    name, path = name_of(request), path_of(request)
    want = request.query_params.get("type")
    if want not in (None, "file", "dir"):
        raise HttpError(400, f"type={want!r}: expected 'file' or 'dir'")
    if want is None:
        stat = (await _file(svc, name, "stat", path)).stat
        assert stat is not None
        want = "dir" if stat.type == "dir" else "file"
    if want == "dir":
        entries = (await _file(svc, name, "list", path)).entries
        return JSONResponse({"path": path, "entries": [codec.encode(e) for e in entries]})
    max_bytes = query_int(request, "max_bytes", 64 * 1024 * 1024)
    if max_bytes > MAX_FILE:
        raise HttpError(413, f"max_bytes {max_bytes} is over {MAX_FILE}", hint="read a part with exec")
    read = await _file(svc, name, "read", path, max_bytes=max_bytes)
    return Response(read.data, media_type="application/octet-stream")


async def stat(svc: Service, request: Request) -> Response:
    name, path = name_of(request), path_of(request)
    if flag(request, "exists"):
        found = await _file(svc, name, "exists", path)
        return JSONResponse({"exists": found.exists})
    follow = request.query_params.get("follow", "1").lower() not in ("0", "false", "no")
    stat = (await _file(svc, name, "stat", path, follow=follow)).stat
    assert stat is not None
    return JSONResponse(codec.encode(stat))


async def put(svc: Service, request: Request) -> Response:
    name, path = name_of(request), path_of(request)
    raw_mode = request.query_params.get("mode", "644")
    if not raw_mode or any(ch not in "01234567" for ch in raw_mode):
        raise HttpError(400, f"mode={raw_mode!r} is not an octal number", hint="e.g. mode=644")
    with bad_request():
        mode = checks.mode(int(raw_mode, 8), "write")
    data = await body(request, MAX_FILE)
    await _file(
        svc,
        name,
        "write",
        path,
        data,
        mode=mode,
        parents=flag(request, "parents"),
        append=flag(request, "append"),
    )
    return JSONResponse({"path": path, "size": len(data)}, status_code=201)


async def delete(svc: Service, request: Request) -> Response:
    name, path = name_of(request), path_of(request)
    await _file(svc, name, "remove", path, recursive=flag(request, "recursive"))
    return JSONResponse({"ok": True})


async def mkdir(svc: Service, request: Request) -> Response:
    name = name_of(request)
    data = await json_body(request, fields.MKDIR)
    with bad_request():
        mode = checks.mode(int_field(data.get("mode"), "mode", 0o755), "mkdir")
    await _file(
        svc,
        name,
        "mkdir",
        path_of(request, value=data["path"]),
        parents=bool(data.get("parents")),
        exist_ok=bool(data.get("exist_ok")),
        mode=mode,
    )
    return JSONResponse({"ok": True}, status_code=201)


async def move(svc: Service, request: Request) -> Response:
    name = name_of(request)
    data = await json_body(request, fields.MOVE)
    src, dst = path_of(request, value=data["src"]), path_of(request, value=data["dst"])
    await _file(svc, name, "rename", src, dst=dst)
    return JSONResponse({"ok": True})
