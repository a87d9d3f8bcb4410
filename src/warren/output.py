"""Captured output and the result of one command: shared by one-shot runs
(``warren.run``) and long-lived sandboxes (``warren.sandbox``).

Owns the output cap and its visible truncation marker, and the ``Result`` type.
No processes; its only I/O is the stdin feed below and a caller's callback.
"""

from __future__ import annotations

import os
import signal as _signal
from collections.abc import Callable
from dataclasses import dataclass

from .netpolicy import NetEvent

DEFAULT_OUTPUT_LIMIT = 16 * 1024 * 1024


def truncation_marker(dropped: int) -> bytes:
    return f"\n[warren: output truncated, {dropped} more bytes dropped]\n".encode()


@dataclass(frozen=True)
class Result:
    exit_code: int
    stdout: bytes
    stderr: bytes
    duration: float
    signal: int | None = None
    timed_out: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    warnings: tuple[str, ...] = ()
    cwd: str | None = None
    net_log: tuple[NetEvent, ...] = ()  # --network allow: every proxy decision

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def signal_name(self) -> str | None:
        return _signal.Signals(self.signal).name if self.signal else None

    @property
    def text(self) -> str:
        return self.stdout.decode(errors="replace")


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
