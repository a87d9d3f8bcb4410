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

Here: the REST routes and the two Connect applications; the services are
``envd_process`` and ``envd_filesystem``, on what ``envd_base`` shares. Which sandbox a
request is for, and that the caller may use it, is ``front``'s job: the
``E2b-Sandbox-Id`` header here has already been matched against ``X-Access-Token``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import posixpath
import time
import zlib
from typing import Any, TypeVar

from connectrpc.code import Code
from connectrpc.codec import Codec, proto_binary_codec, proto_json_codec
from connectrpc.errors import ConnectError
from e2b.envd.filesystem.filesystem_connect import FilesystemASGIApplication
from e2b.envd.process.process_connect import ProcessASGIApplication
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from .. import wire
from ..models import SandboxInfo
from . import metadata
from .core import Core, E2BError
from .envd_base import EnvdService
from .envd_filesystem import FILESYSTEM_METHODS, FilesystemService
from .envd_process import PROCESS_METHODS, ProcessService
from .records import Record
from .rest import body, error, handled

T = TypeVar("T")

MAX_FILE = wire.MAX_PAYLOAD


class Envd(EnvdService):
    """envd: its REST routes here, its Connect services in ``process`` and ``filesystem``."""

    def __init__(self, core: Core) -> None:
        super().__init__(core)
        self.process = ProcessService(core)
        self.filesystem = FilesystemService(core)

    async def rest_sandbox(self, request: Request, operation: str) -> tuple[SandboxInfo, Record]:
        headers: Any = request.headers
        if "e2b-sandbox-id" not in request.headers:
            headers = {"e2b-sandbox-id": await self.core.call(self.signer, request, operation)}
        try:
            return await self.sandbox(headers)
        except ConnectError as e:
            raise E2BError(502, e.message) from None

    def signer(self, request: Request, operation: str) -> str:
        """The sandbox whose access token signed this URL (the SDK's ``download_url`` and
        ``upload_url``: ``v1_`` and the base64 SHA-256 of path, operation, user, token and
        expiry). The URL names no sandbox: the signature picks the one whose token made
        it, so a URL is as good as the token, and for nothing else."""
        query = request.query_params
        given = query.get("signature", "")
        path, user = query.get("path", ""), query.get("username", "")
        expiry = query.get("signature_expiration")
        if expiry is not None and not expiry.lstrip("-").isdigit():
            raise E2BError(400, "signature_expiration must be whole seconds since the epoch")
        records = self.core.records
        for sandbox_id in records.ids():
            token = records.access_token(sandbox_id)
            raw = f"{path}:{operation}:{user}:{token}" + ("" if expiry is None else f":{expiry}")
            digest = base64.b64encode(hashlib.sha256(raw.encode()).digest()).rstrip(b"=").decode()
            if hmac.compare_digest(f"v1_{digest}".encode(), given.encode()):
                if expiry is not None and int(expiry) < time.time():
                    raise E2BError(401, "signature is already expired")
                return sandbox_id
        raise E2BError(401, f"invalid signature for {operation} of this path")

    async def health(self, request: Request) -> Response:
        """204 ("up") to anyone, as envd answers; but to a caller that names a sandbox with
        its access token, 502 once that sandbox is paused, killed or past its end, as E2B's
        proxy answers for a sandbox it cannot reach: the SDK's ``is_running`` reads that."""
        sandbox_id = request.headers.get("e2b-sandbox-id") or ""
        token = request.headers.get("x-access-token") or ""
        mine = bool(sandbox_id and token) and self.core.records.token_matches(sandbox_id, token)
        if mine and not await self.core.call(self.core.running, sandbox_id):
            # E2B's proxy words it so, and the SDK reads "was not found" as "not running"
            return error(
                502, f"the sandbox {sandbox_id!r} was not found running (paused, killed or past its end)"
            )
        return Response(status_code=204)

    async def envs(self, request: Request) -> Response:
        _, record = await self.rest_sandbox(request, "read")
        return JSONResponse(record.envs)

    async def files_get(self, request: Request) -> Response:
        info, record = await self.rest_sandbox(request, "read")
        path = self.core.resolve(record, query_path(request))
        reply, _ = await self.file(info.name, "stat", path)
        assert reply.stat is not None
        if reply.stat.type == "dir":
            raise E2BError(400, f"{path} is a directory")
        _, data = await self.file(info.name, "read", path, max_bytes=MAX_FILE)
        return Response(data, media_type="application/octet-stream")

    async def files_post(self, request: Request) -> Response:
        info, record = await self.rest_sandbox(request, "write")
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > MAX_FILE + 64 * 1024:
            raise E2BError(413, f"upload of {declared} bytes is over the limit of {MAX_FILE}")
        given = request.query_params.get("path")
        # A link signed for one path writes that path only: its signature covers ``path``,
        # not the names of a form's parts (a form of several files would write each by its
        # own name, anywhere the sandbox can write).
        signed_for = given if "e2b-sandbox-id" not in request.headers else None
        uploads: list[tuple[str, bytes]] = []
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            form = await request.form(max_files=1000, max_part_size=MAX_FILE)
            if signed_for is not None and len(form) != 1:
                raise E2BError(
                    400, f"this upload link writes {signed_for} alone: send one file, not {len(form)}"
                )
            for key, value in form.multi_items():
                one = given if given is not None and len(form) == 1 else None
                if isinstance(value, str):
                    # a plain field is the content of the one file ?path= names, as envd takes it
                    if one is None:
                        raise E2BError(400, f"form field {key!r} is not a file and no ?path= names one")
                    uploads.append((one, value.encode()))
                    continue
                name = one or value.filename
                if not name:
                    raise E2BError(400, "a file part has no file name and no ?path= names it")
                uploads.append((name, await value.read()))
        else:
            # read first: a refusal mid-upload would reset the connection
            data = await body(request, MAX_FILE, f"upload is over the limit of {MAX_FILE} bytes")
            if given is None:
                raise E2BError(400, "query parameter path is required")
            uploads.append((given, decoded(data, request.headers.get("content-encoding"))))
        # every upload replaces the file's metadata with the request's (none clears it)
        meta = metadata.from_headers(request.headers.items())
        written = []
        for raw, data in uploads:
            path = self.core.resolve(record, raw)
            await self.file(
                info.name,
                "write",
                path,
                data,
                mode=0o644,
                parents=True,
                xattrs=metadata.XATTR_PREFIX,
                set_xattrs=meta,
            )
            self.core.note_upload(info.name, path)
            item: dict[str, Any] = {"name": posixpath.basename(path), "type": "file", "path": path}
            if meta:
                item["metadata"] = meta
            written.append(item)
        return JSONResponse(written)

    # --- the ASGI apps ---------------------------------------------------------------------------

    def rpc_apps(self) -> dict[str, ASGIApp]:
        """path prefix -> the Connect application serving it."""
        process = _Service(self.process, PROCESS_METHODS)
        filesystem = _Service(self.filesystem, FILESYSTEM_METHODS)
        return {
            "/process.Process/": ProcessASGIApplication(process, codecs=CODECS),  # type: ignore[arg-type]
            "/filesystem.Filesystem/": FilesystemASGIApplication(filesystem, codecs=CODECS),  # type: ignore[arg-type]
        }

    def routes(self) -> list[Route]:
        return [
            Route("/health", handled(self.health), methods=["GET"]),
            Route("/envs", handled(self.envs), methods=["GET"]),
            Route("/files", handled(self.files_get), methods=["GET"]),
            Route("/files", handled(self.files_post), methods=["POST"]),
        ]


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

    def __init__(self, service: EnvdService, methods: dict[str, str]) -> None:
        for name, attr in methods.items():
            setattr(self, name, getattr(service, attr))


def decoded(data: bytes, encoding: str | None) -> bytes:
    """An upload's bytes as the file holds them: a ``Content-Encoding: gzip`` body is
    inflated (within the file size limit, so a small bomb cannot grow past it); any other
    encoding is refused rather than stored as sent."""
    name = (encoding or "identity").strip().lower()
    if name == "identity":
        return data
    if name not in ("gzip", "x-gzip"):
        raise E2BError(415, f"Content-Encoding {name[:40]!r} is not supported (gzip or none)")
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflate.decompress(data, MAX_FILE + 1)
    except zlib.error as e:
        raise E2BError(400, f"the gzip body cannot be decompressed: {e}") from None
    if len(out) > MAX_FILE or inflate.unconsumed_tail:
        raise E2BError(413, f"the decompressed upload is over the limit of {MAX_FILE} bytes")
    if not inflate.eof:
        raise E2BError(400, "the gzip body is truncated")
    return out


def query_path(request: Request) -> str:
    path = request.query_params.get("path")
    if path is None:
        raise E2BError(400, "query parameter path is required")
    return path
