"""Output capture: the cap and its visible truncation marker, shared by one-shot runs
and sandbox execs (and the shim's logs of background processes). No processes; its
only I/O is the stdin feed below and a caller's callback.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from .protocol import DEFAULT_OUTPUT_LIMIT

__all__ = ["DEFAULT_OUTPUT_LIMIT", "Capture", "feed", "truncation_marker"]


def truncation_marker(dropped: int) -> bytes:
    return f"\n[warren: output truncated, {dropped} more bytes dropped]\n".encode()


class Capture:
    def __init__(self, limit: int, callback: Callable[[bytes], None] | None) -> None:
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = 0
        self.dropped = 0
        self.callback = callback

    def feed(self, chunk: bytes) -> None:
        if self.callback is not None:
            self.callback(chunk)
        room = self.limit - self.size
        if room > 0:
            keep = chunk[:room]
            self.parts.append(keep)
            self.size += len(keep)
        self.dropped += max(0, len(chunk) - max(room, 0))

    def value(self) -> bytes:
        data = b"".join(self.parts)
        return data + truncation_marker(self.dropped) if self.dropped else data


def feed(fd: int, pending: memoryview) -> memoryview:
    """Write what a non-blocking stdin pipe takes now; return what is left (empty once
    everything is written or the reader has gone)."""
    try:
        return pending[os.write(fd, pending[:65536]) :]
    except BrokenPipeError:
        return pending[:0]
