"""The contract's REST surface: ``/v1/files/{path}`` (GET a file or a directory
listing, HEAD, PUT, DELETE), ``/v1/health`` and ``/v1/metadata``.

Each file route confines its path to the workspace first (``Runtime.confine``: 403
``PERMISSION_DENIED`` for ``..`` out, an absolute path elsewhere, a link out), then asks
the sandbox (warren's files API, run inside it): a write is all or nothing (a new file
beside the target, synced and renamed over it), parents are created. Errors are the
contract's JSON ``{"code", "message"}``. ``/v1/metadata`` serves only the daemon's
variables with the configured prefix (``SANDBOX_``), never one whose name looks like a
credential (the contract's rule: a sandboxed command may ask for it).
"""

from __future__ import annotations

import errno as _errno
import os
import re
import sys
import time
import traceback
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .. import errors, wire
from ..models import FileInfo, FileOp, FileResult
from . import paths
from .runtime import Runtime

MAX_FILE = wire.MAX_PAYLOAD  # what one file operation of the sandbox carries
MODE = re.compile(r"^0[0-7]{3}$")
SENSITIVE = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CRED", "KEY", "AUTH", "BEARER", "PRIVATE", "CERT")


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def error_response(error: BaseException) -> JSONResponse:
    if isinstance(error, ApiError):
        status, code, message = error.status, error.code, error.message
    elif isinstance(error, errors.SandboxFileNotFound):
        status, code, message = 404, "NOT_FOUND", "path does not exist within the sandbox"
    elif isinstance(error, errors.SandboxPermissionDenied):
        status, code, message = 403, "PERMISSION_DENIED", error.message
    elif isinstance(error, errors.FileTooLarge):
        status, code, message = 413, "RESOURCE_EXHAUSTED", error.message
    elif isinstance(error, errors.SandboxFileError) and error.errno in (_errno.ENOTEMPTY, _errno.EEXIST):
        status, code, message = 409, "CONFLICT", "directory is not empty; pass recursive=true to remove it"
    elif (
        isinstance(error, errors.SandboxFileError) and error.errno in (_errno.EISDIR, _errno.EINVAL)
    ) or isinstance(error, (paths.BadPath, errors.PolicyError)):
        status, code, message = 400, "INVALID_ARGUMENT", error.message
    elif isinstance(error, (errors.SandboxDead, errors.SandboxPaused)):
        status, code, message = 503, "UNAVAILABLE", error.message
    elif isinstance(error, errors.WarrenError):
        status, code, message = 500, "INTERNAL", error.message
    else:
        traceback.print_exc(file=sys.stderr)
        status, code, message = 500, "INTERNAL", f"{type(error).__name__}: {error}"
    return JSONResponse({"code": code, "message": message}, status_code=status)


def iso(mtime: float) -> str:
    return datetime.fromtimestamp(mtime, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Files:
    def __init__(self, runtime: Runtime, metadata: dict[str, str]) -> None:
        self.rt = runtime
        self.metadata = metadata

    async def _op(self, op: str, path: str, data: bytes = b"", **extra: Any) -> FileResult:
        result: FileResult = await self.rt.call(
            self.rt.transport.file, self.rt.sandbox.name, FileOp(op=op, path=path, **extra), data
        )
        return result

    async def _stat(self, path: str) -> FileInfo:
        stat = (await self._op("stat", path, follow=True)).stat
        assert stat is not None
        return stat

    async def route(self, request: Request) -> Response:
        try:
            raw = request.path_params["path"]
            method = request.method
            path = self.rt.confine(raw, method.lower())
            if method in ("GET", "HEAD"):
                return await self.get(request, raw, path)
            if method == "PUT":
                return await self.put(request, path)
            return await self.delete(request, path)
        except Exception as e:
            return error_response(e)

    async def get(self, request: Request, raw: str, path: str) -> Response:
        if request.method == "HEAD":
            stat = await self._stat(path)
            if stat.type == "dir":
                return Response(b"", media_type="application/json")
            headers = {"content-length": str(stat.size), "last-modified": iso(stat.mtime)}
            return Response(b"", media_type="application/octet-stream", headers=headers)
        try:  # one operation for a file (the common case), a second for a directory
            data = (await self._op("read", path, max_bytes=MAX_FILE)).data
        except errors.SandboxFileError as e:
            if e.errno != _errno.EISDIR:
                raise
            listing = {"path": "/" + raw.lstrip("/"), "entries": await self._entries(path)}
            return JSONResponse(listing)
        return Response(data, media_type="application/octet-stream")

    async def _entries(self, path: str) -> list[dict[str, Any]]:
        """The contract's entries: a link shows as what it leads to, and is left out
        when it leads out of the workspace or nowhere."""
        out = []
        for entry in (await self._op("list", path)).entries:
            if entry.type == "symlink":
                try:
                    entry = await self._stat(self.rt.confine(os.path.join(path, entry.name), "list"))
                except errors.WarrenError:
                    continue
            if entry.type not in ("file", "dir"):
                continue
            out.append(
                {
                    "name": entry.name,
                    "size": entry.size,
                    "type": "directory" if entry.type == "dir" else "file",
                    "modified_at": iso(entry.mtime),
                    "mode": f"{entry.mode & 0o777:04o}",
                }
            )
        return out

    async def put(self, request: Request, path: str) -> Response:
        raw_mode = request.query_params.get("mode", "0644")
        if not MODE.match(raw_mode):
            raise ApiError(400, "INVALID_ARGUMENT", f"mode {raw_mode!r} must match ^0[0-7]{{3}}$")
        if path == self.rt.root:
            raise ApiError(400, "INVALID_ARGUMENT", "target path is a directory")
        data = await self._body(request)
        await self._op("write", path, data, mode=int(raw_mode, 8), parents=True)
        return Response(status_code=204)

    async def _body(self, request: Request) -> bytes:
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > MAX_FILE:
            raise ApiError(413, "RESOURCE_EXHAUSTED", f"a file of {size} bytes is over {MAX_FILE}")
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            form = await request.form(max_files=1, max_fields=16, max_part_size=MAX_FILE)
            part = form.get("file")
            if part is None or isinstance(part, str):
                raise ApiError(400, "INVALID_ARGUMENT", 'multipart body is missing the required "file" part')
            return await part.read()
        chunks, total = [], 0
        try:
            async for chunk in request.stream():
                total += len(chunk)
                if total > MAX_FILE:
                    raise ApiError(413, "RESOURCE_EXHAUSTED", f"the body is over {MAX_FILE} bytes")
                chunks.append(chunk)
        except ClientDisconnect:
            raise ApiError(400, "INVALID_ARGUMENT", "the client went away before the whole body") from None
        return b"".join(chunks)

    async def delete(self, request: Request, path: str) -> Response:
        raw = request.query_params.get("recursive", "false").lower()
        if raw not in ("1", "t", "true", "0", "f", "false"):
            raise ApiError(400, "INVALID_ARGUMENT", f"recursive {raw!r} must be a boolean")
        recursive = raw in ("1", "t", "true")
        await self._op("stat", path, follow=False)  # 404 for a missing path, before anything else
        if path != self.rt.root:
            await self._op("remove", path, recursive=recursive)
            return Response(status_code=204)
        if not recursive:
            raise ApiError(409, "CONFLICT", "cannot delete the workspace; pass recursive=true to clear it")
        for entry in (await self._op("list", path)).entries:  # the workspace stays, emptied
            await self._op("remove", os.path.join(path, entry.name), recursive=True)
        return Response(status_code=204)

    async def health(self, request: Request) -> Response:
        if not self.rt.ready:
            return JSONResponse({"code": "UNAVAILABLE", "message": "sandboxd is shutting down"}, 503)
        alive = await self.rt.call(lambda: self.rt.sandbox.alive)
        if not alive:
            info = self.rt.sandbox.info
            why = f": {info.reason}" if info.reason else ""
            return JSONResponse({"code": "UNAVAILABLE", "message": f"the sandbox has ended{why}"}, 503)
        return JSONResponse({"status": "ok", "uptime_seconds": int(time.monotonic() - self.rt.started)})

    async def metadata_route(self, request: Request) -> Response:
        return JSONResponse({"env": self.metadata})


def metadata(environ: Mapping[str, str], prefix: str) -> dict[str, str]:
    """The variables ``/v1/metadata`` shows: the prefix's, none named like a credential."""
    return {
        k: v
        for k, v in sorted(environ.items())
        if k.startswith(prefix) and not any(marker in k.upper() for marker in SENSITIVE)
    }


def app(runtime: Runtime, environ: Mapping[str, str], prefix: str) -> Starlette:
    files = Files(runtime, metadata(environ, prefix))
    return Starlette(
        routes=[
            Route("/v1/files/{path:path}", files.route, methods=["GET", "HEAD", "PUT", "DELETE"]),
            Route("/v1/health", files.health, methods=["GET"]),
            Route("/v1/metadata", files.metadata_route, methods=["GET"]),
        ]
    )
