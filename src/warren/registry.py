"""The per-user registry of long-lived sandboxes, and where their state lives.

Owns the state directory layout (``$XDG_STATE_HOME/warren``, default
``~/.local/state/warren``: ``registry.sqlite``, ``supervisor.sock``, ``run/`` for
sandbox sockets, ``sandboxes/<name>/`` for logs of background processes) and the
SQLite table that records each sandbox's state and, when it died, why. It must not
start or signal processes; it only reads ``/proc`` to tell whether a recorded
supervisor is still the same live process.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from .errors import PolicyError

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")

RUNNING = "running"
STOPPED = "stopped"
DEAD = "dead"


def state_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    base = env.get("XDG_STATE_HOME") or ""
    if not base.startswith("/"):
        base = os.path.join(env.get("HOME") or os.path.expanduser("~"), ".local", "state")
    return Path(base) / "warren"


def ensure_state_dir(path: Path) -> Path:
    for sub in (path, path / "run", path / "sandboxes"):
        sub.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise PolicyError(
            f"invalid sandbox name {name!r}",
            operation="create",
            hint="use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit",
        )
    return name


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), None if gone.
    With the pid it identifies one process across pid reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


@dataclass(frozen=True)
class Entry:
    name: str
    id: str
    state: str
    reason: str
    workspace: str
    created: float
    supervisor_pid: int
    supervisor_start: int
    pid1: int
    socket: str

    @property
    def alive(self) -> bool:
        return self.state == RUNNING

    def supervisor_gone(self) -> bool:
        return process_start_time(self.supervisor_pid) != self.supervisor_start


_SCHEMA = """
CREATE TABLE IF NOT EXISTS sandboxes (
    name TEXT PRIMARY KEY,
    id TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    workspace TEXT NOT NULL,
    created REAL NOT NULL,
    supervisor_pid INTEGER NOT NULL,
    supervisor_start INTEGER NOT NULL,
    pid1 INTEGER NOT NULL,
    socket TEXT NOT NULL
)
"""
_COLUMNS = "name, id, state, reason, workspace, created, supervisor_pid, supervisor_start, pid1, socket"


class Registry:
    def __init__(self, root: Path) -> None:
        self.root = ensure_state_dir(root)
        self.path = root / "registry.sqlite"
        self._db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        with contextlib.suppress(sqlite3.OperationalError):
            self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def get(self, name: str) -> Entry | None:
        row = self._db.execute(f"SELECT {_COLUMNS} FROM sandboxes WHERE name = ?", (name,)).fetchone()
        return Entry(*row) if row else None

    def all(self) -> list[Entry]:
        rows = self._db.execute(f"SELECT {_COLUMNS} FROM sandboxes ORDER BY created").fetchall()
        return [Entry(*row) for row in rows]

    def add(self, entry: Entry) -> None:
        self._db.execute(
            f"INSERT OR REPLACE INTO sandboxes ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                entry.name,
                entry.id,
                entry.state,
                entry.reason,
                entry.workspace,
                entry.created,
                entry.supervisor_pid,
                entry.supervisor_start,
                entry.pid1,
                entry.socket,
            ),
        )

    def set_state(self, name: str, sandbox_id: str, state: str, reason: str) -> None:
        self._db.execute(
            "UPDATE sandboxes SET state = ?, reason = ? WHERE name = ? AND id = ?",
            (state, reason, name, sandbox_id),
        )

    def remove(self, name: str) -> None:
        self._db.execute("DELETE FROM sandboxes WHERE name = ?", (name,))

    def refresh(self, entry: Entry) -> Entry:
        """A running entry whose supervisor is gone is dead: record that and why."""
        if entry.state != RUNNING or not entry.supervisor_gone():
            return entry
        reason = (
            f"supervisor (pid {entry.supervisor_pid}) was killed or crashed; the sandbox's "
            "processes and mounts went down with it (workspace files are untouched)"
        )
        self.set_state(entry.name, entry.id, DEAD, reason)
        with contextlib.suppress(OSError):
            os.unlink(entry.socket)
        return Entry(**{**entry.__dict__, "state": DEAD, "reason": reason})

    def entries(self) -> Iterator[Entry]:
        for entry in self.all():
            yield self.refresh(entry)


def now() -> float:
    return time.time()
