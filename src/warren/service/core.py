"""``Service``: what every handler of API v1 works with — the ``Transport`` the SDK
uses too, and the bounded thread pool its blocking calls run in (so a slow sandbox
holds a worker thread, never the event loop)."""

from __future__ import annotations

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
        return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs), limiter=self.limiter)
