"""The registry of long-lived sandboxes: one SQLite table in the state directory.

Only the supervisor reads or writes it (clients ask the supervisor). It records each
sandbox's state and, when it died, why; its schema carries a version
(``PRAGMA user_version``) so a newer layout is never misread and an older one is
migrated. When a supervisor starts, every sandbox still marked running belonged to a
supervisor that is gone, and is marked dead with that reason at once.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sqlite3
import time
from dataclasses import dataclass, field

from ..errors import SetupError
from ..names import check_name

__all__ = ["DEAD", "RUNNING", "STOPPED", "Entry", "Registry", "check_name", "now", "process_start_time"]

SCHEMA_VERSION = 2

RUNNING = "running"
STOPPED = "stopped"
DEAD = "dead"


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), None if gone.
    With the pid it identifies one process across pid reuse."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
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
    warnings: tuple[str, ...] = field(default=())


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
    warnings TEXT NOT NULL DEFAULT '[]'
)
"""
_COLUMNS = "name, id, state, reason, workspace, created, supervisor_pid, supervisor_start, pid1, warnings"


def _entry(row: tuple[object, ...]) -> Entry:
    name, box_id, state, reason, workspace, created, sup_pid, sup_start, pid1, warnings = row
    try:
        notes = tuple(str(w) for w in json.loads(str(warnings)))
    except ValueError:
        notes = ()
    return Entry(
        name=str(name),
        id=str(box_id),
        state=str(state),
        reason=str(reason),
        workspace=str(workspace),
        created=float(created),  # type: ignore[arg-type]
        supervisor_pid=int(sup_pid),  # type: ignore[call-overload]
        supervisor_start=int(sup_start),  # type: ignore[call-overload]
        pid1=int(pid1),  # type: ignore[call-overload]
        warnings=notes,
    )


class Registry:
    def __init__(self, root: str) -> None:
        self.path = os.path.join(root, "registry.sqlite")
        try:
            self._db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            with contextlib.suppress(sqlite3.OperationalError):
                self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._migrate()
        except sqlite3.Error as e:
            raise SetupError(
                f"cannot open warren's registry {self.path}: {e}",
                operation="registry",
                path=self.path,
                hint="if it is damaged, move it aside; warren starts a new one (forgetting dead sandboxes)",
            ) from None

    def _migrate(self) -> None:
        version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise SetupError(
                f"warren's registry {self.path} was written by a newer warren (schema {version})",
                operation="registry",
                path=self.path,
                hint="use that warren version, or move the file aside",
            )
        if version < SCHEMA_VERSION:
            tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            old: list[tuple[object, ...]] = []
            if "sandboxes" in tables:
                old = self._db.execute("SELECT name, id, workspace, created FROM sandboxes").fetchall()
                self._db.execute("DROP TABLE sandboxes")
            self._db.execute(_SCHEMA)
            for name, box_id, workspace, created in old:
                self._db.execute(
                    f"INSERT OR REPLACE INTO sandboxes ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, 0, 0, 0, '[]')",
                    (
                        name,
                        box_id,
                        DEAD,
                        "created by an older warren; it ended when that warren's supervisor did",
                        workspace,
                        created,
                    ),
                )
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def close(self) -> None:
        self._db.close()

    def get(self, name: str) -> Entry | None:
        row = self._db.execute(f"SELECT {_COLUMNS} FROM sandboxes WHERE name = ?", (name,)).fetchone()
        return _entry(row) if row else None

    def all(self) -> list[Entry]:
        rows = self._db.execute(f"SELECT {_COLUMNS} FROM sandboxes ORDER BY created").fetchall()
        return [_entry(row) for row in rows]

    def _write(self, sql: str, args: tuple[object, ...]) -> None:
        """A change of the registry; one the disk cannot take (full, read-only) is a typed
        error for the request that made it, never the supervisor's end."""
        try:
            self._db.execute(sql, args)
        except sqlite3.Error as e:
            full = isinstance(e, sqlite3.OperationalError) and "full" in str(e)
            raise SetupError(
                f"cannot write warren's registry {self.path}: {e}",
                operation="registry",
                path=self.path,
                errno=errno.ENOSPC if full else None,
                hint="free space on the disk of warren's state directory (old snapshots: "
                "`warren snapshot ls`)"
                if full
                else "check that warren's state directory is writable",
            ) from None

    def add(self, entry: Entry) -> None:
        self._write(
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
                json.dumps(list(entry.warnings)),
            ),
        )

    def set_state(self, name: str, sandbox_id: str, state: str, reason: str, warnings: list[str]) -> None:
        self._write(
            "UPDATE sandboxes SET state = ?, reason = ?, warnings = ? WHERE name = ? AND id = ?",
            (state, reason, json.dumps(warnings), name, sandbox_id),
        )

    def remove(self, name: str) -> None:
        self._write("DELETE FROM sandboxes WHERE name = ?", (name,))

    def orphaned(self, supervisor_pid: int, supervisor_start: int) -> None:
        """Called by a starting supervisor: every sandbox still marked running was held
        by a supervisor that is gone (this one holds the lock now), and died with it."""
        for entry in self.all():
            if entry.state != RUNNING:
                continue
            if (entry.supervisor_pid, entry.supervisor_start) == (supervisor_pid, supervisor_start):
                continue
            reason = (
                f"supervisor (pid {entry.supervisor_pid}) was killed or crashed; the sandbox's "
                "processes and mounts went down with it (a file its commands were writing may be "
                "incomplete; a write through warren's files API is whole or not made)"
            )
            self.set_state(entry.name, entry.id, DEAD, reason, list(entry.warnings))


def now() -> float:
    return time.time()
