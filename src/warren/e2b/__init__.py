"""An E2B-compatible API on ``warren serve``: the unmodified ``e2b`` SDK drives warren
sandboxes when ``E2B_API_URL`` and ``E2B_SANDBOX_URL`` both name the service.

``mount`` is the one hook: it puts E2B's routes in front of warren's application in the
same process (same token, as ``X-API-Key``). The package owns E2B's wire shapes and
nothing else: every sandbox operation is the ``Transport``'s. ``records`` keeps what E2B
adds to a sandbox, ``control`` is the REST control plane, ``envd`` the in-sandbox API,
``front`` the routing and authentication. See docs/e2b.md for what is not offered.

Importing this package needs the ``e2b`` SDK (for its generated messages); ``available``
says whether it is installed, so the service runs without it.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp

from ..client.transport import Transport


def available() -> bool:
    return importlib.util.find_spec("e2b") is not None and importlib.util.find_spec("connectrpc") is not None


def mount(
    app: ASGIApp,
    transport: Transport,
    token: str | None,
    *,
    log: Callable[[str], None] | None = None,
    hosts: frozenset[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> ASGIApp:
    """``app`` with E2B's control plane and envd in front of it."""
    from ..service.guard import Guard
    from .control import Control
    from .core import Core
    from .envd import Envd
    from .front import Access, Front
    from .interpreter import KernelPort
    from .records import Records, root_of

    records = Records(root_of(os.environ if env is None else env), token)
    core = Core(transport, records)
    core.start_reaper()
    control, envd = Control(core), Envd(core)

    async def not_found(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        message = f"no route {request.method} {request.url.path} in warren's E2B API"
        return JSONResponse({"code": status, "message": message}, status_code=status)

    rest = Starlette(routes=[*control.routes(), *envd.routes()])
    rest.add_exception_handler(404, not_found)
    rest.add_exception_handler(405, not_found)
    kernel = Starlette(routes=KernelPort(core, os.environ if env is None else env).routes())
    kernel.add_exception_handler(404, not_found)
    kernel.add_exception_handler(405, not_found)
    access = Access(rest, envd.rpc_apps(), token, records, kernel)
    return Front(app, Guard(access, None, log, hosts, front="e2b"))
