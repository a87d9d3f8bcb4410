"""The network log of a sandbox: every proxy decision as one JSON line, within a budget.

Written by the sandbox's network helper (``server.netd``): to a file for a long-lived
sandbox (``warren logs --net``, kept until ``rm``), and/or to a pipe the client of a
one-shot run reads as the decisions happen. Read back by the supervisor only.

A sandbox decides how much is logged (each request it makes is an event), so nothing
it does may grow the log or the helper without bound:

- the file is rotated at ``FILE_BUDGET`` bytes into one older generation
  (``net.jsonl.1``): at most twice that on disk, the newest events kept;
- refusals are rate-limited: in each ``WINDOW`` a target (method, host, port, reason)
  is logged ``PER_TARGET`` times and all refusals together ``PER_WINDOW`` times; the
  rest are counted and, when the window ends, logged as one line per target ("and
  4,812 more refusals of this in 10 s"), for at most ``TARGETS`` targets (the others in
  one line). Allowed requests are always logged one by one (the rotation bounds them).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .allowlist import NetEvent

MAX_READ = 64 * 1024 * 1024
FILE_BUDGET = 4 * 1024 * 1024  # bytes per generation; two generations
WINDOW = 10.0  # seconds
PER_TARGET = 5  # refusals of one target logged one by one in a window
PER_WINDOW = 100  # refusals logged one by one in a window, all targets together
TARGETS = 64  # targets counted one by one in a window (memory of the helper)
_LINE_MAX = 4096  # a longer line is cut (its reason): an event is never a budget of its own

_Key = tuple[str, str, int, str]


def older(path: Path) -> Path:
    """The previous generation of the log at ``path``."""
    return path.with_name(path.name + ".1")


class Writer:
    """Appends decisions as JSON lines to a file (opened on the first one) and/or a
    pipe; a gone reader of the pipe loses its copy, never the file's."""

    def __init__(
        self,
        path: Path | None,
        pipe: int | None = None,
        *,
        budget: int = FILE_BUDGET,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.clock = clock
        self.pipe = pipe
        self.budget = budget
        self.lock = threading.Lock()
        self.fd = -1
        self.size = 0
        self.window_start = 0.0
        self.logged = 0  # refusals logged one by one in this window
        self.per_key: dict[_Key, int] = {}  # ... per target (at most TARGETS)
        self.held: dict[_Key, tuple[NetEvent, int]] = {}  # refusals not logged: the first, a count
        self.held_other = 0  # ... of targets past TARGETS
        self.other_first: NetEvent | None = None
        self.flusher: threading.Timer | None = None

    def __call__(self, event: NetEvent) -> None:
        with self.lock:
            # A policy record is the owner's act, never the sandbox's: not rate-limited.
            if not event.allowed and event.kind != "policy" and not self._admit(event, self.clock()):
                return
            self._write(event)

    def _admit(self, event: NetEvent, now: float) -> bool:
        """Whether a refusal is logged now; else it is counted for the window's summary."""
        if now - self.window_start >= WINDOW:
            self._summarize()
            self.window_start = now
        key = (event.method, event.host, event.port, event.reason)
        seen = self.per_key.get(key)
        if seen is None and len(self.per_key) >= TARGETS:
            seen = PER_TARGET  # a new target past the cap: counted, not remembered
        if (seen is not None and seen >= PER_TARGET) or self.logged >= PER_WINDOW:
            if key in self.held or len(self.held) < TARGETS:
                first, count = self.held.get(key, (event, 0))
                self.held[key] = (first, count + 1)
            else:
                self.held_other += 1
                self.other_first = self.other_first or event
            if self.flusher is None:
                self.flusher = threading.Timer(max(0.0, self.window_start + WINDOW - now), self._flush)
                self.flusher.daemon = True
                self.flusher.start()
            return False
        if key in self.per_key or len(self.per_key) < TARGETS:
            self.per_key[key] = (seen or 0) + 1
        self.logged += 1
        return True

    def attach(self, pipe: int) -> None:
        """Write to ``pipe`` from now on (a run that took a sandbox booted ahead: its
        client's), in place of the one before, if any."""
        with self.lock:
            if self.pipe is not None:
                os.close(self.pipe)
            self.pipe = pipe

    def _flush(self) -> None:
        with self.lock:
            self.flusher = None
            self._summarize()
            self.window_start = self.clock()

    def close(self) -> None:
        """The helper ends: what is counted is logged now, not at a window's end."""
        with self.lock:
            if self.flusher is not None:
                self.flusher.cancel()
                self.flusher = None
            self._summarize()

    def _summarize(self) -> None:
        """The counted refusals of the window that ended, one line per target."""
        secs = f"{WINDOW:g} s"
        for first, count in self.held.values():
            why = f"{first.reason} (and {count:,} more refusals of this in {secs}, not logged one by one)"
            self._write(NetEvent(first.time, first.sandbox, first.method, first.host, first.port, False, why))
        other = self.other_first
        if self.held_other and other is not None:
            why = f"{self.held_other:,} more refusals of other targets in {secs}, not logged one by one"
            self._write(NetEvent(other.time, other.sandbox, "*", "*", 0, False, why))
        self.held.clear()
        self.held_other = 0
        self.other_first = None
        self.per_key.clear()
        self.logged = 0

    def _write(self, event: NetEvent) -> None:
        data = event.to_dict()
        line = (json.dumps(data, separators=(",", ":")) + "\n").encode()
        if len(line) > _LINE_MAX:
            data["reason"] = str(data["reason"])[: _LINE_MAX // 2] + "..."
            line = (json.dumps(data, separators=(",", ":")) + "\n").encode()
        if self.path is not None:
            self._append(line)
        if self.pipe is not None:
            try:
                os.write(self.pipe, line)
            except OSError:
                os.close(self.pipe)
                self.pipe = None

    def _append(self, line: bytes) -> None:
        assert self.path is not None
        if self.fd >= 0 and self.size + len(line) > self.budget:
            # The state directory is warren's, never the sandbox's: plain names are safe.
            os.close(self.fd)
            self.fd = -1
            os.replace(self.path, older(self.path))
        if self.fd < 0:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
            self.fd = os.open(self.path, flags, 0o600)
            self.size = os.fstat(self.fd).st_size
        os.write(self.fd, line)
        self.size += len(line)


def parse(text: str) -> list[NetEvent]:
    events = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            events.append(NetEvent.from_dict(json.loads(line)))
    return events


def read(path: Path) -> list[NetEvent]:
    """The events of the log at ``path``, its older generation first."""
    events: list[NetEvent] = []
    for p in (older(path), path):
        try:
            with open(p, "rb") as f:
                events += parse(f.read(MAX_READ).decode(errors="replace"))
        except FileNotFoundError:
            pass
    return events
