"""The supervisor's log: its standard output and error, a file in the state directory
(``statedir.LOG_FILE``, opened by the client that started it), written a whole line at
a time, within a budget, and never a reason for the supervisor to end.

- A line the disk cannot take (the state disk full, which a sandbox can bring about
  through a review layer or a snapshot) is dropped and counted, and the count said
  once a line gets through. A print that raised ENOSPC there, in a handler and again in
  the handler of a bug, ended the supervisor and every sandbox with it.
- Past ``LIMIT`` bytes the log is rotated (``supervisor.log.1``, the one before it
  gone): a sandbox can make lines come (git's repairs of what it plants, twice a second
  for as long as it lives), so the log it can grow is bounded, at twice ``LIMIT``.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import threading

LIMIT = 8 << 20


class Log(io.TextIOBase):
    def __init__(
        self, fd: int, path: str | None = None, limit: int = LIMIT, also: tuple[int, ...] = ()
    ) -> None:
        """``fd``: the log; ``path``: its name, for the rotation (None: never rotated);
        ``also``: descriptors the rotated log replaces too (standard output)."""
        super().__init__()
        self.fd, self.path, self.limit, self.also = fd, path, limit, also
        self.lock = threading.Lock()
        self.pending = ""
        self.dropped = 0
        self.size = 0
        with contextlib.suppress(OSError):
            self.size = os.fstat(fd).st_size

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        with self.lock:
            self.pending += s
            if "\n" in self.pending:
                whole, _, self.pending = self.pending.rpartition("\n")
                self._out(whole + "\n")
        return len(s)

    def flush(self) -> None:
        with self.lock:
            if self.pending:
                self._out(self.pending)
                self.pending = ""

    def _out(self, text: str) -> None:
        lines = text.count("\n") or 1
        if self.dropped:
            text = f"warren supervisor: {self.dropped} lines of this log were lost (disk full)\n{text}"
        data = memoryview(text.encode(errors="replace"))
        try:
            while data:
                n = os.write(self.fd, data)
                self.size += n
                data = data[n:]
            self.dropped = 0
        except OSError:
            self.dropped += lines  # (of a line cut short, the rest goes with it)
        if self.path is not None and self.size >= self.limit:
            self._rotate(self.path)

    def _rotate(self, path: str) -> None:
        """The next log made first (a failure leaves everything as it was, tried again
        after as many bytes), then put in place of the old, which becomes ``.1``."""
        self.size = 0
        fresh = f"{path}.new"
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(fresh)  # a rotation's left by a supervisor killed during it
            fd = os.open(fresh, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError:
            return
        try:
            os.replace(path, f"{path}.1")
            os.replace(fresh, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(fresh)
            os.close(fd)
            return
        for target in (self.fd, *self.also):
            os.dup2(fd, target)
        os.close(fd)


def install(path: str) -> Log:
    """The supervisor's ``sys.stdout`` and ``sys.stderr``: descriptor 2 (1 goes with it),
    rotated when it is the log at ``path`` (else, started by hand with its output
    elsewhere, never)."""
    rotated: str | None = None
    with contextlib.suppress(OSError):
        ours, there = os.fstat(2), os.stat(path)
        if (ours.st_dev, ours.st_ino) == (there.st_dev, there.st_ino):
            rotated = path
    log = Log(2, rotated, also=(1,))
    sys.stdout = sys.stderr = log
    return log
