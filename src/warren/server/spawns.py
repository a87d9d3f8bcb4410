"""Background processes' records: the files the supervisor keeps for each ``spawn``.

For each, in the sandbox's state directory: ``ID.out`` and ``ID.err`` (output, capped
by the shim with a visible marker), ``ID.status`` (the wait status once it ended) and
``ID.json`` (pid, argv, when it started). Made here, written by the sandbox's shim
through descriptors (never by path), read back here for clients, in chunks from an
offset so a client that reconnects loses and repeats nothing.
"""

from __future__ import annotations

import json
import os
import secrets

from .. import protocol
from ..errors import ProcessNotFound, SandboxError
from . import statedir

_SUFFIXES = (".out", ".err", ".status", ".json")


def _dir(root: str, name: str) -> str:
    path = os.path.join(statedir.sandbox_dir(root, name), "procs")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def create(root: str, name: str) -> tuple[str, list[int]]:
    """A new record: its id and descriptors for (out, err, status, meta)."""
    # Never all digits: where an id or a pid may be given (HTTP), it reads as the id.
    spawn_id = "p" + secrets.token_hex(6)
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    fds: list[int] = []
    try:
        base = os.path.join(_dir(root, name), spawn_id)
        for suffix in _SUFFIXES:
            fds.append(os.open(base + suffix, flags, 0o600))
    except OSError as e:
        for fd in fds:
            os.close(fd)
        # A full state disk is this request's failure, not the supervisor's.
        raise SandboxError.from_os(
            e,
            f"cannot keep the records of a background process of sandbox {name}: {e.strerror}",
            "spawn",
            statedir.sandbox_dir(root, name),
            hint="free space on the disk of warren's state directory (old snapshots: `warren snapshot ls`)",
        ) from None
    return spawn_id, fds


def _read_json(path: str) -> dict[str, object] | None:
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 20)
    except OSError:
        return None
    if not data:
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def running(root: str, name: str) -> dict[str, str]:
    """pid (as text) -> spawn id, for background processes still running."""
    out: dict[str, str] = {}
    base = _dir(root, name)
    for entry in os.listdir(base):
        if not entry.endswith(".json"):
            continue
        spawn_id = entry[:-5]
        meta = _read_json(os.path.join(base, entry))
        if meta is None or _read_json(os.path.join(base, spawn_id + ".status")) is not None:
            continue
        out[str(meta.get("pid"))] = spawn_id
    return out


LISTED_MAX = 1000  # records in one listing: the newest (a reply has a size bound)
LISTED_ARGV = 4096  # characters of one record's command line in a listing


def listing(root: str, name: str, alive: bool) -> protocol.SpawnList:
    """The background processes of sandbox ``name`` on record (the newest LISTED_MAX),
    oldest first, each command line cut at LISTED_ARGV characters; ``alive``: whether the
    sandbox still runs (an unended record of a dead one is not running)."""
    items = []
    base = _dir(root, name)
    for entry in os.listdir(base):
        if not entry.endswith(".json") or not entry[:-5].isalnum():
            continue
        meta = _read_json(os.path.join(base, entry))
        if meta is None:
            continue
        status = _read_json(os.path.join(base, entry[:-5] + ".status"))
        pid, argv, started = meta.get("pid"), meta.get("argv"), meta.get("started")
        code = status.get("status") if status else None
        limit = status.get("limit") if status else None
        items.append(
            protocol.SpawnRecord(
                spawn_id=entry[:-5],
                pid=pid if isinstance(pid, int) else 0,
                argv=_cut([str(a) for a in argv] if isinstance(argv, list) else []),
                started=float(started) if isinstance(started, (int, float)) else 0.0,
                running=status is None and alive,
                status=code if isinstance(code, int) else None,
                timed_out=bool(status and status.get("timed_out")),
                limit=limit if isinstance(limit, str) else None,
            )
        )
    items.sort(key=lambda r: (r.started, r.spawn_id))
    return protocol.SpawnList(items=items[-LISTED_MAX:])


def _cut(argv: list[str]) -> list[str]:
    out, left = [], LISTED_ARGV
    for arg in argv:
        if left <= 0:
            out.append("...")
            break
        out.append(arg if len(arg) <= left else arg[:left] + "...")
        left -= len(arg)
    return out


def _chunk(path: str, offset: int, limit: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, offset))
            return f.read(max(0, limit))
    except OSError:
        return b""


def _not_found(name: str, ident: str, operation: str) -> ProcessNotFound:
    return ProcessNotFound(
        f"no background process {ident!r} in sandbox {name}",
        operation=operation,
        path=ident,
        hint="give the id (or pid) that spawn returned; list them with `warren ps NAME`",
    )


def resolve(root: str, name: str, ident: str, operation: str) -> str:
    """The spawn id ``ident`` names: itself, or, if it is a pid (decimal), the latest
    background process started with that pid. ProcessNotFound otherwise."""
    base = _dir(root, name)
    if ident.isalnum() and _read_json(os.path.join(base, ident + ".json")) is not None:
        return ident
    if ident.isdigit():
        latest: tuple[float, str] | None = None
        for entry in os.listdir(base):
            meta = _read_json(os.path.join(base, entry)) if entry.endswith(".json") else None
            if meta is not None and str(meta.get("pid")) == ident:
                started = meta.get("started")
                when = float(started) if isinstance(started, (int, float)) else 0.0
                if latest is None or when > latest[0]:
                    latest = (when, entry[:-5])
        if latest is not None:
            return latest[1]
    raise _not_found(name, ident, operation)


def ended(root: str, name: str, spawn_id: str) -> bool:
    """Whether the background process has ended (its status is recorded)."""
    return _read_json(os.path.join(_dir(root, name), spawn_id + ".status")) is not None


def state(
    root: str, name: str, req: protocol.ProcessRequest, alive: bool
) -> tuple[protocol.ProcessState, bytes]:
    if not req.spawn_id.isalnum():
        raise _not_found(name, req.spawn_id, "process")
    base = os.path.join(_dir(root, name), req.spawn_id)
    meta = _read_json(base + ".json")
    if meta is None:
        raise _not_found(name, req.spawn_id, "process")
    status = _read_json(base + ".status")
    half = max(0, min(req.max_bytes, 64 * 1024 * 1024)) // 2
    out = _chunk(base + ".out", req.stdout_offset, half)
    err = _chunk(base + ".err", req.stderr_offset, half)
    pid = meta.get("pid")
    argv = meta.get("argv")
    code = status.get("status") if status else None
    limit = status.get("limit") if status else None
    return (
        protocol.ProcessState(
            pid=pid if isinstance(pid, int) else 0,
            argv=[str(a) for a in argv] if isinstance(argv, list) else [],
            running=status is None and alive,
            status=code if isinstance(code, int) else None,
            timed_out=bool(status and status.get("timed_out")),
            limit=limit if isinstance(limit, str) else None,
            stdout_len=len(out),
            stderr_len=len(err),
        ),
        out + err,
    )
