"""``Service``: what every handler of API v1 works with — the ``Transport`` the SDK
uses too, and the bounded thread pool its blocking calls run in (so a slow sandbox
holds a worker thread, never the event loop)."""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread

from ..client.transport import Transport


class Service:
    def __init__(self, transport: Transport, threads: int = 256) -> None:
        self.transport = transport
        self.limiter = anyio.CapacityLimiter(threads)

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        # The request's context (its caller, ``client.origin``) goes with it to the thread.
        context = contextvars.copy_context()
        return await anyio.to_thread.run_sync(lambda: context.run(fn, *args, **kwargs), limiter=self.limiter)
