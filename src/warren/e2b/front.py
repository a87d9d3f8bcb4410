"""Which requests are E2B's, and who may make them.

``warren serve`` answers E2B's control plane and envd on the same address as ``/v1``
(E2B's paths do not overlap warren's), so one URL serves as both ``E2B_API_URL`` and
``E2B_SANDBOX_URL``. Authentication differs by plane, as in E2B:

- control plane (``/sandboxes``, ``/v2/sandboxes``): ``X-API-Key`` is the service's token
  (``Authorization: Bearer TOKEN`` works too);
- envd (Connect RPC, ``/files``, ``/envs``): ``E2b-Sandbox-Id`` names the sandbox and
  ``X-Access-Token`` must be that sandbox's own access token, so a token handed to code
  working in one sandbox opens no other. ``/health`` says only "up", to anyone.

Comparisons are constant-time. The Host/Origin check and the request log are warren's
``Guard``, wrapped around the E2B side with no bearer check of its own.
"""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..service import conn
from .envd_base import CUT, Cut
from .records import Records

# The rest of E2B's API (templates, snapshots, volumes, secrets): answered "not offered".
ELSEWHERE = (
    "/templates",
    "/v2/templates",
    "/v3/templates",
    "/default-templates",
    "/snapshots",
    "/volumes",
    "/secrets",
)
CONTROL = ("/sandboxes", "/v2/sandboxes", *ELSEWHERE)
RPC = ("/process.Process/", "/filesystem.Filesystem/")
REST = ("/files", "/envs", "/health")


def plane(path: str) -> str | None:
    """Which plane of E2B's a path is on: "control", "rpc", "rest", or None (warren's own)."""
    if any(path == p or path.startswith(p + "/") for p in CONTROL):
        return "control"
    if path.startswith(RPC):
        return "rpc"
    if path in REST:
        return "rest"
    return None


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


ENVD_PORT = b"49983"
KERNEL_PORT = b"49999"  # e2b-code-interpreter's (interpreter)


def port_of(scope: Scope) -> bytes | None:
    """The sandbox port an E2B request is for, when it names one other than envd's: the
    SDKs send ``E2b-Sandbox-Port`` (the code interpreter's Jupyter kernel is 49999)."""
    port = header(scope, b"e2b-sandbox-port")
    return port if port is not None and port.strip() != ENVD_PORT else None


class Front:
    """Sends E2B's requests to ``e2b`` and everything else (lifespan included) to
    ``warren``. A request naming a sandbox (``E2b-Sandbox-Id``) is E2B's whatever its
    path, so that an E2B client never gets an answer of warren's own API."""

    def __init__(self, warren: ASGIApp, e2b: ASGIApp) -> None:
        self.warren = warren
        self.e2b = e2b

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (
            plane(scope["path"]) is not None or header(scope, b"e2b-sandbox-id") is not None
        ):
            await self.e2b(scope, receive, send)
        else:
            await self.warren(scope, receive, send)


class Access:
    """The checks above, then ``rpc`` (path prefix -> Connect app) or ``rest``."""

    def __init__(
        self,
        rest: ASGIApp,
        rpc: dict[str, ASGIApp],
        token: str | None,
        records: Records,
        kernel: ASGIApp | None = None,
    ) -> None:
        self.rest = rest
        self.rpc = rpc
        self.kernel = kernel  # the code interpreter's port (interpreter.KernelPort)
        self.token = None if token is None else token.encode()
        self.records = records

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        port = port_of(scope)
        if port is not None and plane(path) != "control":
            if port.strip() == KERNEL_PORT and self.kernel is not None:
                refusal = self.refusal(scope, "rest")
                if refusal is not None:
                    await _send_json(send, 401, {"code": 401, "message": refusal})
                    return
                await self.kernel(scope, receive, send)
                return
            # E2B's proxy words a port nothing listens on so; the SDKs read "port is not open"
            message = (
                f"the sandbox port {port.decode('latin-1')[:8]} is not open: warren's E2B API serves envd "
                "and the code interpreter's kernel port (49999), no other port (see docs/e2b.md)"
            )
            await _send_json(send, 502, {"code": 502, "message": message})
            return
        kind = plane(path) or "rest"
        refusal = self.refusal(scope, kind)
        if refusal is not None:
            body: dict[str, object] = {"code": 401, "message": refusal}
            if kind == "rpc":
                body["code"] = "unauthenticated"
            await _send_json(send, 401, body)
            return
        for prefix, app in self.rpc.items():
            if path.startswith(prefix):
                await _cuttable(app, scope, receive, send)
                return
        await self.rest(scope, receive, send)

    def refusal(self, scope: Scope, kind: str) -> str | None:
        if kind == "control":
            if self.token is None:
                return None
            given = header(scope, b"x-api-key")
            if given is None:
                scheme, _, bearer = (header(scope, b"authorization") or b"").partition(b" ")
                given = bearer.strip() if scheme.lower() == b"bearer" else None
            if given is not None and hmac.compare_digest(given, self.token):
                return None
            return "missing or wrong API key: send X-API-Key with the token `warren serve` was started with"
        if scope["path"] == "/health":
            return None
        if (
            scope["path"] == "/files"
            and header(scope, b"e2b-sandbox-id") is None
            and b"signature=" in scope.get("query_string", b"")
        ):
            return None  # a signed URL: the route finds the one sandbox whose token signed it
        sandbox = (header(scope, b"e2b-sandbox-id") or b"").decode("latin-1")
        token = (header(scope, b"x-access-token") or b"").decode("latin-1")
        if not sandbox or not token or not self.records.token_matches(sandbox, token):
            return "missing or wrong access token for this sandbox (E2b-Sandbox-Id and X-Access-Token)"
        return None


class _Dropped(Exception):
    pass


async def _cuttable(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
    """``app``, except that once it marked its stream cut (``envd_base.sandbox_gone``) the
    response is never completed: the server resets the connection (``conn.Guarded.reset``),
    as a sandbox's end resets its stream on E2B."""
    cut = Cut()
    token = CUT.set(cut)

    async def guarded(message: Message) -> None:
        last = message["type"] == "http.response.trailers" or (
            message["type"] == "http.response.body" and not message.get("more_body", False)
        )
        if cut.cut and last:
            # (the app may catch this and return: the connection is reset either way)
            reset = scope.get("extensions", {}).get(conn.RESET)
            if reset is not None:
                reset["call"]()  # read as a connection failure, never as a broken protocol
            raise _Dropped
        await send(message)

    try:
        await app(scope, receive, guarded)
    except _Dropped:
        return
    finally:
        CUT.reset(token)


async def _send_json(send: Send, status: int, body: object) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": data})
