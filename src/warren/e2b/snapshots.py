"""E2B's snapshots of sandboxes made through the E2B API: what a sandbox's files are at
one moment, from which new sandboxes start (``Sandbox.create(snapshot_id)``).

An E2B sandbox of warren changes nothing but its home (the workspace), its private
``/tmp`` and a preset's caches; a snapshot is a copy of the home, with the template and
environment the sandbox was created with. Processes and memory are not in it, nor
``/tmp``: a sandbox made from a snapshot starts with the snapshot's files in its home and
no process of the old one (E2B's snapshots keep memory too: see docs/e2b.md).

Snapshots live beside the sandboxes' root (``ROOT-snapshots/ID``, a directory of this
user that nobody lists, ``records.UNLISTED``): ``meta.json`` and the copy of the home,
under a random name kept in ``meta.json``. The home is copied from a directory the
sandbox can write, so only with ``safepath.copy_tree`` (no link followed, no special
file, no setuid bit, data extents only), while the sandbox is paused so that the copy is
one moment. A copy is bounded as ``warren snapshot``'s are: by MAX_BYTES, by the reserve
kept free on its disk, and by the user's snapshot budget (``snapshot_budget``, charged
with what the E2B snapshots on that disk hold); past a bound it stops and leaves nothing.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .._core import safepath
from ..policy import config
from ..policy.limits import show_size
from .records import UNLISTED, ensure_root

META = "meta.json"
HOME = "home"  # the copy's name in snapshots made before it was random
# A snapshot is a copy on this machine's disk: bounded, so that a sandbox filling its
# home cannot have the service fill the disk twice over by snapshotting it.
MAX_BYTES = 8 * 1024**3


@dataclass
class Snapshot:
    snapshot_id: str
    sandbox_id: str
    template: str
    created: float
    name: str = ""
    envs: dict[str, str] = field(default_factory=dict)
    size: int = 0  # what its home costs the disk: file data and a block per name
    # the copy's name in its directory: random, in a directory nobody lists (as a
    # sandbox's home, ``records.UNLISTED``)
    home: str = HOME

    @property
    def names(self) -> list[str]:
        return [f"{self.name or self.snapshot_id}:default"]

    def answer(self) -> dict[str, Any]:
        return {"snapshotID": self.snapshot_id, "names": self.names}


class Snapshots:
    def __init__(self, sandboxes_root: str) -> None:
        self.root = f"{sandboxes_root}-snapshots"
        self._root_lock = threading.Lock()  # making a snapshot in the root vs removing it when empty
        # One copy at a time: a copy's bound counts the finished snapshots only, so two at
        # once could each take what is left of the budget.
        self._copy_lock = threading.Lock()

    def take(
        self, sandbox_id: str, template: str, envs: dict[str, str], workspace: str, name: str
    ) -> Snapshot:
        """Copy ``workspace`` (the caller has paused its sandbox) into a new snapshot."""
        snap = Snapshot(f"snap-{secrets.token_hex(8)}", sandbox_id, template, time.time(), name, envs)
        snap.home = secrets.token_hex(16)
        top = os.path.join(self.root, snap.snapshot_id)
        with self._root_lock:
            ensure_root(self.root)
            os.mkdir(top, 0o700)
        try:
            os.mkdir(os.path.join(top, snap.home), 0o700)
            with self._copy_lock:
                limit, why = self._bound(snap.snapshot_id)
                src = safepath.open_dir(workspace)
                dst = safepath.open_dir(os.path.join(top, snap.home))
                try:
                    snap.size = safepath.copy_tree(src, dst, limit)
                    os.chmod(dst, 0o755)
                except OSError as e:
                    if e.errno == errno.EFBIG:
                        raise OSError(errno.EFBIG, f"the home holds more than {why}") from None
                    raise
                finally:
                    os.close(src)
                    os.close(dst)
                with open(os.path.join(top, META), "x", encoding="utf-8") as f:
                    json.dump(asdict(snap), f)
                os.chmod(top, UNLISTED)
        except BaseException:
            self.remove(snap.snapshot_id)
            raise
        return snap

    def _bound(self, taking: str) -> tuple[int, str]:
        """What the copy of a new snapshot may hold, and a phrase saying which bound
        that is: MAX_BYTES, the disk's free space above its reserve, or what is left of
        the user's snapshot budget (the other snapshots here charged what they hold)."""
        from ..server.snapshots import room

        st = os.statvfs(self.root)
        free, keep = room(self.root)
        bounds = [(MAX_BYTES, f"the {show_size(MAX_BYTES)} a snapshot may hold")]
        bounds.append((max(free - keep, 0), f"the disk's {show_size(max(free, 0))} free less its reserve"))
        budget, origin = config.snapshot_budget(st.f_blocks * st.f_frsize, os.environ, Path.home())
        if budget is not None:
            held = sum(s.size for s in self.all() if s.snapshot_id != taking)
            bounds.append(
                (
                    max(budget - held, 0),
                    f"what is left of your snapshot budget ({show_size(held)} of {show_size(budget)} "
                    f"held; {origin}): remove snapshots (delete_snapshot) or raise snapshot_budget",
                )
            )
        return min(bounds)

    def seed(self, snap: Snapshot, workspace: str) -> None:
        """Fill a new sandbox's empty workspace with the snapshot's home."""
        src = safepath.open_dir(os.path.join(self.root, snap.snapshot_id, snap.home))
        dst = safepath.open_dir(workspace)
        try:
            safepath.copy_tree(src, dst, MAX_BYTES)
        finally:
            os.close(src)
            os.close(dst)

    def get(self, snapshot_id: str) -> Snapshot | None:
        if not snapshot_id.startswith("snap-") or "/" in snapshot_id:
            return None
        try:
            with open(os.path.join(self.root, snapshot_id, META), encoding="utf-8") as f:
                return Snapshot(**json.load(f))
        except (OSError, ValueError, TypeError):
            return None

    def all(self) -> list[Snapshot]:
        try:
            names = os.listdir(self.root)
        except OSError:
            return []
        found = [self.get(name) for name in names]
        return sorted(
            (s for s in found if s is not None), key=lambda s: (s.created, s.snapshot_id), reverse=True
        )

    def remove(self, snapshot_id: str) -> bool:
        if not snapshot_id.startswith("snap-") or "/" in snapshot_id:
            return False
        removed = False
        with contextlib.suppress(FileNotFoundError):
            root = safepath.open_dir(self.root)
            try:
                with contextlib.suppress(OSError):  # listable again to be removed
                    os.chmod(snapshot_id, 0o700, dir_fd=root, follow_symlinks=False)
                removed = safepath.remove_tree(root, snapshot_id)
            finally:
                os.close(root)
        with self._root_lock, contextlib.suppress(OSError):
            os.rmdir(self.root)  # the last one leaves no litter (not empty: kept)
        return removed
