"""Who asks, as a sandbox's trail records it (``server.trail``): ``"library"`` unless
the front end in use says otherwise (the CLI ``"cli"``, ``warren serve`` the token's id
per request, ``warren mcp`` ``"mcp"``, the E2B API ``"e2b"``).

A context variable, so ``warren serve`` can name the caller of each request while its
requests share one transport. It is what the asking process says of itself (the same
user's, as every client of the supervisor is); the trail records beside it the peer's
pid and uid, which the supervisor reads from the socket.
"""

from __future__ import annotations

import contextvars

ORIGIN: contextvars.ContextVar[str | None] = contextvars.ContextVar("warren_origin", default=None)
_process = ["library"]


def current() -> str:
    return ORIGIN.get() or _process[0]


def set_default(origin: str) -> None:
    """Name the front end of this whole process, every thread of it (the CLI, ``warren mcp``)."""
    _process[0] = origin
