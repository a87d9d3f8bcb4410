"""Progress of a long operation (an image build or import, a big copy): one line on
stderr, rewritten, only when stderr is a terminal — nothing in a pipe or a log."""

from __future__ import annotations

import sys
import time


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class Progress:
    """One line on stderr, rewritten at most ten times a second; nothing off a terminal."""

    def __init__(self) -> None:
        self.on = sys.stderr.isatty()
        self.last = 0.0
        self.shown = False

    def __call__(self, label: str, done: int, total: int | None) -> None:
        now = time.monotonic()
        if not self.on or now - self.last < 0.1:
            return
        self.last = now
        of = f" of {human_size(total)}" if total else ""
        pct = f" {100 * done // total:3d}%" if total else ""
        sys.stderr.write(f"\r\x1b[K{label}:{pct} {human_size(done)}{of}")
        sys.stderr.flush()
        self.shown = True

    def end(self) -> None:
        if self.shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self.shown = False
