"""A long-lived sandbox's audit trail: what was asked of it (commands, background
processes, signals, file operations through the API) and how each command ended, as
JSON lines in its state directory; read back merged with its network log.

Written by the supervisor only, at the point each request is handed to the sandbox
(``handoff``) and where the supervisor sees an exec end (``Box.exec_ended``): nothing
the sandbox runs can write here (the state directory is never in a sandbox's view).
The network decisions stay in the network log the network helper writes
(``net.log``): one source of truth, merged with this file by time when read, so the
trail of a sandbox is both, in order.

Bounded as the network log is: rotated at the user's ``trail_budget`` (4 MiB by
default) into one older generation
(at most twice that on disk), a record never longer than ``LINE_MAX`` (a long argv is
cut, and says so), nothing kept in memory per record. What a command's environment
holds is never written (its names only): values are where secrets travel.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import protocol
from ..net import log as netlog
from ..policy import config
from .boxnet import NETLOG_FILE

TRAIL_FILE = "trail.jsonl"  # in a long-lived sandbox's state directory
LINE_MAX = 8192
ARG_MAX = 1024  # one argument, or the path of a file operation, at most this many characters
READ_MAX = 5000  # records in one reply (a follower asks again for the rest) ...
PAGE_BYTES = 1 << 20  # ... and their size together, far below a message's bound
_ids = itertools.count(1)


def budget() -> int:
    """The size of one generation: the user's ``trail_budget`` (config.toml), read when a
    sandbox's trail is opened."""
    return config.trail_budget(os.environ, Path.home())


def now() -> str:
    """The time as the network log writes it (``net.proxy``): ISO UTC to the
    millisecond, so the two files merge by comparing these strings."""
    return stamp(time.time())


def stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


def _cut(text: str) -> str:
    return text if len(text) <= ARG_MAX else text[:ARG_MAX] + f"... ({len(text):,} characters)"


def _dumps(data: dict[str, Any]) -> bytes:
    return (json.dumps(data, separators=(",", ":")) + "\n").encode()


def reported_at(report: bytes) -> float:
    """When an exec's helper says it ended (``shim``'s report: its monotonic time); 0
    when it does not say."""
    try:
        at = json.loads(report).get("mono")
    except (ValueError, AttributeError):
        return 0.0
    return at if isinstance(at, float) else 0.0


@dataclass
class Started:
    """An exec the trail holds open until it ends."""

    id: str
    at: float  # monotonic: its duration


class Trail:
    """Appends records to ``dir/trail.jsonl``, rotating it at ``budget`` bytes. A record
    that cannot be written (a full state disk) is not raised: the sandbox goes on, and
    the next record that can be written is preceded by one saying how many were lost."""

    def __init__(self, directory: str, *, size: int | None = None) -> None:
        self.path = Path(directory) / TRAIL_FILE
        self.budget = budget() if size is None else size
        self.fd = -1
        self.size = 0
        self.lost = 0
        self.latest = 0.0  # the time of the last record: the file is in time order

    def record(self, kind: str, **fields: Any) -> None:
        self.record_at(time.time(), kind, **fields)

    def record_at(self, at: float, kind: str, **fields: Any) -> None:
        """A record of ``at`` (now, or an exec's end as its helper saw it), never before
        the record before it: the file stays in time order."""
        self.latest = max(at, self.latest)
        data = {"time": stamp(self.latest), "kind": kind, **fields}
        line = _dumps(data)
        if len(line) > LINE_MAX:
            for key in ("argv", "env"):
                many = data.get(key)
                if isinstance(many, list) and len(many) > 4:
                    data[key] = [*many[:4], f"... ({len(many):,} in all)"]
            line = _dumps(data)
        if len(line) > LINE_MAX:
            keep: dict[str, Any] = {k: data[k] for k in ("time", "kind", "id", "origin") if k in data}
            line = _dumps({**keep, "truncated": True})
        if self.lost:
            line = _dumps({"time": data["time"], "kind": "lost", "count": self.lost}) + line
        try:
            self._append(line)
        except OSError:
            self.lost += 1
        else:
            self.lost = 0

    def _append(self, line: bytes) -> None:
        if self.fd >= 0 and self.size + len(line) > self.budget:
            # The state directory is warren's, never a sandbox's: plain names are safe.
            os.close(self.fd)
            self.fd = -1
            os.replace(self.path, netlog.older(self.path))
        if self.fd < 0:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
            self.fd = os.open(self.path, flags, 0o600)
            self.size = os.fstat(self.fd).st_size
        try:
            written = os.write(self.fd, line)
        except OSError:
            written = -1
        if written != len(line):
            # A part of a line would glue the next to it: the file is cut back to whole lines.
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, self.size)
            raise OSError(errno.ENOSPC, "the trail's record was not written whole")
        self.size += written

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    # --- what is recorded ------------------------------------------------------------------

    def handed(self, msg: protocol.Message, peer: dict[str, int], at: float = 0.0) -> Started | None:
        """A request handed to the sandbox (``handoff.HANDED``) at ``at`` (monotonic;
        now if not given): an exec's record, whose end ``ended`` writes, is returned. The
        record is written after the handoff, and the command may have ended by then: its
        duration counts from the handoff."""
        who = {"origin": getattr(msg, "origin", "") or "unknown", **peer}
        # Stamped with the handoff's time, not this write's: the command may have run
        # meanwhile, and its network decisions (the proxy's log, merged by time) came
        # after the handoff, not before its record.
        wall = time.time() - (time.monotonic() - at) if at else time.time()
        if isinstance(msg, (protocol.ExecRequest, protocol.SpawnRequest)):
            cmd = msg.command
            started = Started(f"c{os.getpid()}-{next(_ids)}", at or time.monotonic())
            fields: dict[str, Any] = {
                "id": started.id,
                "argv": [_cut(a) for a in cmd.argv],
                "cwd": cmd.cwd,
                "env": sorted(_cut(k) for k in cmd.env),  # names only: values carry secrets
                "timeout": cmd.timeout,
                "tty": cmd.tty is not None,
            }
            if isinstance(msg, protocol.ExecRequest):
                self.record_at(wall, "exec", **fields, **who)
                return started
            self.record_at(wall, "spawn", **fields, **who)
        elif isinstance(msg, protocol.FileRequest):
            extra = {"dst": _cut(msg.dst)} if msg.dst is not None else {}
            self.record("file", op=msg.op, path=_cut(msg.path), **extra, **who)
        elif isinstance(msg, protocol.SignalRequest):
            self.record("signal", pid=msg.pid, signal=msg.signal, **who)
        elif isinstance(msg, protocol.PsRequest):
            pass  # a look, not an action
        return None

    def ended(self, started: Started, report: bytes, why: str = "") -> None:
        """An exec ended: ``report`` is what its helper wrote at the end (``shim``),
        empty when it ended without one (refused before it started, or killed). The
        end's time is the report's (it may be read a moment later: ``Box.take_reports``),
        never later than now."""
        at, mono = time.time(), time.monotonic()
        fields: dict[str, Any] = {"id": started.id}
        try:
            said = json.loads(report) if report else {}
            ended, wall = said.get("mono"), said.get("wall")
            if isinstance(ended, float) and isinstance(wall, float) and started.at <= ended <= mono:
                mono, at = ended, min(wall, at)
            status = said.get("status")
            if isinstance(status, int):
                fields.update(
                    exit=os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
                    signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                    timed_out=bool(said.get("timed_out")),
                    limit=str(said["limit"])[:ARG_MAX] if said.get("limit") else None,
                )
            else:
                fields["exit"] = None
                fields["note"] = (
                    why or "ended without a status: refused before it started, or its helper was killed"
                )
        except (ValueError, TypeError, AttributeError):
            fields["exit"] = None
            fields["note"] = "its helper's report was unreadable"
        fields["duration"] = round(mono - started.at, 3)
        self.record_at(at, "exec.end", **fields)


# --- reading ---------------------------------------------------------------------------------


_TIME_AT = b'{"time":"'  # both files write a record's time first: it is read without parsing
_TIME_LEN = len("2026-01-01T00:00:00.000Z")
_BLOCK = 64 * 1024


def _timed(path: Path, after: str) -> list[tuple[str, bytes]]:
    """The lines of the log at ``path`` (its older generation first) of ``after`` or
    later, each with its time. Read from the end back to the first line older than
    ``after`` (both files are written in time order): a follower's look at a large,
    unchanged trail reads a block, and the supervisor answers it on its own loop."""
    floor = after.encode()
    lines: list[tuple[bytes, bytes]] = []
    for p in (path, netlog.older(path)):
        try:
            fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except (FileNotFoundError, NotADirectoryError):
            continue
        try:
            found, complete = _back_to(fd, floor)
        finally:
            os.close(fd)
        lines[:0] = found
        if not complete:
            break  # this generation holds older lines: the older one has nothing for us
    return [(t.decode(errors="replace"), line) for t, line in lines]


def _back_to(fd: int, floor: bytes) -> tuple[list[tuple[bytes, bytes]], bool]:
    """The lines of ``fd`` from the first of time ``floor`` or later; and whether every
    line of it was (none older was seen)."""
    pos = min(os.fstat(fd).st_size, netlog.MAX_READ)
    blocks: list[bytes] = []
    while pos > 0:
        n = min(_BLOCK, pos)
        pos -= n
        block = os.pread(fd, n, pos)
        later = blocks[0][:64] if blocks else b""
        blocks.insert(0, block)
        # the first whole line starting in this block (a partial one at its start waits
        # for the block before it): its time prefix, which may reach into the next block
        first = block.find(b"\n") + 1 if pos > 0 else 0
        if first == 0 and pos > 0:
            continue  # no line starts here
        t = _time((block[first:] + later)[: len(_TIME_AT) + _TIME_LEN])
        if t and t < floor:
            break
    data = b"".join(blocks)
    skipped = data.find(b"\n") + 1 if pos > 0 else 0
    found: list[tuple[bytes, bytes]] = []
    complete = pos == 0
    for line in data[skipped:].splitlines():
        t = _time(line)
        if not t:
            continue
        if t < floor:
            complete = False
            continue
        found.append((t, line))
    return found, complete


def _time(line: bytes) -> bytes:
    if line.startswith(_TIME_AT):
        t = line[len(_TIME_AT) : len(_TIME_AT) + _TIME_LEN]
        return t if len(t) == _TIME_LEN else b""
    return _time_of(line)


def _time_of(line: bytes) -> bytes:
    try:
        data = json.loads(line)
    except ValueError:
        return b""
    t = data.get("time") if isinstance(data, dict) else None
    return t.encode() if isinstance(t, str) else b""


def _record(line: bytes, net: bool) -> dict[str, Any] | None:
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("time"), str):
        return None
    return net_record(data) if net else data


def net_record(data: dict[str, Any]) -> dict[str, Any]:
    """A network log line as a trail record: a proxy decision (``request``, or no kind:
    a log written before kinds) is ``net``; a record of another kind written there (a
    policy change, a connection waiting for approval) keeps its own."""
    kind = data.get("kind")
    return {**data, "kind": kind if isinstance(kind, str) and kind and kind != "request" else "net"}


def read(sandbox_dir: str, after: str = "", skip: int = 0) -> tuple[list[str], str, int]:
    """The trail's records later than the cursor (``after``: a record's time; ``skip``:
    how many records of that very time were had already), merged with the network log
    by time, as JSON text, at most ``READ_MAX`` of them and ``PAGE_BYTES`` together (a
    reply's bound); and the cursor after them. At a tie (both are to the millisecond)
    the network's come first: a decision is made while a command runs, and a command's
    end is recorded after its last connection's decision."""
    theirs = [(t, True, line) for t, line in _timed(Path(sandbox_dir) / NETLOG_FILE, after)]
    mine = [(t, False, line) for t, line in _timed(Path(sandbox_dir) / TRAIL_FILE, after)]
    merged = sorted(theirs + mine, key=lambda x: x[0])
    out: list[str] = []
    size = 0
    seen_at_after = 0
    last, at_last = after, skip
    for t, net, line in merged:
        if t == after:
            seen_at_after += 1
            if seen_at_after <= skip:
                continue
        record = _record(line, net)
        if record is None:
            continue
        text = line.decode() if not net else json.dumps(record, separators=(",", ":"))
        if out and (len(out) >= READ_MAX or size + len(text) > PAGE_BYTES):
            break
        out.append(text)
        size += len(text) + 8
        at_last = at_last + 1 if t == last else 1
        last = t
    return out, last, at_last
