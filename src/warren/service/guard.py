"""The one ASGI wrapper around all of API v1 (``Guard``): the Host/Origin check (TCP
on loopback: a web page cannot reach the service through DNS rebinding), the bearer
token (constant-time compare), and one log line per request — refusals' lines
rate-limited. Nothing runs for a request this refuses.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..client import origin
from .conn import RateLimited
from .status import HttpError, error_body


class Guard:
    """Host/Origin check (TCP on loopback), bearer-token check (constant time), and one
    log line per request; refused requests' lines are rate-limited."""

    def __init__(
        self,
        app: ASGIApp,
        token: str | None,
        log: Callable[[str], None] | None,
        hosts: frozenset[str] | None = None,
        front: str = "http",
    ) -> None:
        self.app = app
        self.token = None if token is None else token.encode()
        # Who asks, in the sandboxes' trails: the token's id (a digest's first digits,
        # which say nothing of the token), never the token.
        digest = None if token is None else hashlib.sha256(self.token or b"").hexdigest()[:12]
        self.origin = front if digest is None else f"{front} token {digest}"
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
                response = JSONResponse(error_body(refusal), status_code=refusal.status, headers=headers)
                await response(scope, receive, send_logged)
            else:
                origin.ORIGIN.set(self.origin)
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
