"""Who holds which layers of an image store: one record per holder under ``holds/``.

A running sandbox's record (``sandbox-<random>.json``) is locked (shared) before it is
in place and is stale once nobody holds that lock, however the sandbox ended; a
snapshot's (``snapshot-<id>.json``) lives as long as the snapshot's directory. ``gc``
never removes a layer a live record names, and ``warren image rm`` is refused for one
(``ImageInUse``). Every record is reached beneath the store's descriptor, never by a
path a link could redirect.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .._core import safepath

_HOLD = re.compile(r"(sandbox|snapshot)-[0-9a-f]{1,64}\.json")
HEX = re.compile(r"[0-9a-f]{64}")  # a layer's diff id, as its directory is named
TMP = ".tmp-"  # a record (or blob) being written
RECORD_LIMIT = 4 << 20


@dataclass(frozen=True)
class Holder:
    """A live hold on layers of the store: who (``what``) and which (diff id hexes)."""

    key: str
    what: str
    image: str
    layers: frozenset[str]


def put(root: int, key: str, what: str, image: str, layers: Sequence[Path], check: str) -> int:
    """Write hold record ``key``, locked (shared) before it is in place; returns the
    locked descriptor."""
    with contextlib.suppress(FileExistsError):
        os.mkdir("holds", 0o700, dir_fd=root)
    holds = safepath.dir_beneath(root, "holds")
    tmp = TMP + secrets.token_hex(8)
    try:
        record = {"what": what, "image": image, "layers": [p.name for p in layers], "check": check}
        with safepath.new_file(holds, tmp) as fd:
            os.write(fd, json.dumps(record).encode())
            fcntl.flock(fd, fcntl.LOCK_SH)
            os.rename(tmp, f"{key}.json", src_dir_fd=holds, dst_dir_fd=holds)
        return fd
    finally:
        os.close(holds)


def read_all(root: int) -> list[tuple[Holder, bool]]:
    """Every hold record, and whether its holder is gone."""
    try:
        holds = safepath.dir_beneath(root, "holds")
    except FileNotFoundError:
        return []
    out: list[tuple[Holder, bool]] = []
    try:
        with os.scandir(holds) as entries:
            names = sorted(e.name for e in entries)
        for name in names:
            if not _HOLD.fullmatch(name):
                continue
            try:
                fd = safepath.open_beneath(holds, name, os.O_RDONLY)
            except OSError:
                continue
            try:
                rec = json.loads(os.read(fd, RECORD_LIMIT))
                layers = frozenset(str(d) for d in rec["layers"] if HEX.fullmatch(str(d)))
                holder = Holder(name[:-5], str(rec["what"]), str(rec["image"]), layers)
                if name.startswith("sandbox-"):
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        stale = True  # nobody holds it any more
                    except BlockingIOError:
                        stale = False
                else:
                    stale = not os.path.isdir(str(rec["check"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # damaged: holds nothing
            finally:
                os.close(fd)
            out.append((holder, stale))
    finally:
        os.close(holds)
    return out


def sweep_temps(root: int) -> None:
    """A hold record a crash left half written (the store lock is ours: nobody
    writes one now)."""
    try:
        holds = safepath.dir_beneath(root, "holds")
    except FileNotFoundError:
        return
    try:
        with os.scandir(holds) as entries:
            names = [e.name for e in entries if e.name.startswith(TMP)]
        for name in names:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=holds)
    finally:
        os.close(holds)
