"""The network log of a sandbox: every proxy decision as one JSON line.

Written by the sandbox's network helper (``server.netd``): to a file for a long-lived
sandbox (``warren logs --net``, kept until ``rm``), and/or to a pipe the client of a
one-shot run reads as the decisions happen. Read back by the supervisor only.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path

from .allowlist import NetEvent

MAX_READ = 64 * 1024 * 1024


class Writer:
    """Appends decisions as JSON lines to a file (opened on the first one) and/or a
    pipe; a gone reader of the pipe loses its copy, never the file's."""

    def __init__(self, path: Path | None, pipe: int | None = None) -> None:
        self.path = path
        self.pipe = pipe
        self.lock = threading.Lock()
        self.fd = -1

    def __call__(self, event: NetEvent) -> None:
        line = (json.dumps(event.to_dict(), separators=(",", ":")) + "\n").encode()
        with self.lock:
            if self.path is not None:
                if self.fd < 0:
                    self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
                    self.fd = os.open(self.path, flags, 0o600)
                os.write(self.fd, line)
            if self.pipe is not None:
                try:
                    os.write(self.pipe, line)
                except OSError:
                    os.close(self.pipe)
                    self.pipe = None


def parse(text: str) -> list[NetEvent]:
    events = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            events.append(NetEvent.from_dict(json.loads(line)))
    return events


def read(path: Path) -> list[NetEvent]:
    try:
        with open(path, "rb") as f:
            return parse(f.read(MAX_READ).decode(errors="replace"))
    except FileNotFoundError:
        return []
