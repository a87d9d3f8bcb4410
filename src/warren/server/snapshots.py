"""Snapshots of sandboxes on an image: their own layer, kept as a read-only layer.

A sandbox on an image keeps all of its filesystem state in its own layer (the
overlay's upper directory, on a tmpfs in its namespaces; PID 1 hands the supervisor a
descriptor of it with ``Ready``). A snapshot is a copy of that layer, taken while
the sandbox is paused, into ``snapshots/ID/layer`` of the state directory, in the
same format as the image's layers (0/0 whiteouts, ``user.overlay.opaque``); a sandbox
made from it runs on the image's layers with the snapshot's on top, under a fresh
layer of its own. The workspace is included when it lives in the layer; a host
workspace is not (it is the host's directory: ``workspace`` in the record says so).
Processes and memory are never part of a snapshot.

The layer is the sandbox's: every name in it is walked from directory descriptors
without following a link (``O_NOFOLLOW``), links are copied as links, devices other
than whiteouts and sockets are left out, set-id bits are dropped. The copy costs time
in proportion to what the sandbox changed, never to the image's unchanged data.

The copy is budgeted: it writes only a file's data extents (a hole stays a hole, so a
sparse 50G file costs what it holds), never more than the sandbox's layer uses (its
tmpfs: the bound is read there, not from the names in it), and only while the state
directory's disk keeps a reserve free (checked before the copy and as it goes). A copy
that would not fit is refused with a typed error before a byte is written; one that
fails midway (ENOSPC included) leaves nothing: the partial layer is removed, and so is
the record, or (a copy in the background) the record says why.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from .._core import extents, safepath
from ..errors import ImageError, SetupError, SnapshotError, SnapshotNotFound, WarrenError
from ..images.ref import ImageRef
from ..policy import config
from ..policy.limits import show_size
from . import review
from .envroot import image_store

DIR = "snapshots"
_RD = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_DIRFLAGS = _RD | os.O_DIRECTORY
_META = "snapshot.json"
_ID_CHARS = frozenset("0123456789abcdef")
RESERVE_MAX = 256 << 20  # kept free on the state directory's disk: the registry, logs
RECHECK = 16 << 20  # the disk's free space is read again after this much is written
_INODE_COST = 4096  # a name in the copy costs at least a block of the state disk


@dataclass(frozen=True)
class Snapshot:
    id: str
    sandbox: str  # the sandbox it was taken of
    image: str  # the image's name
    image_id: str
    layers: tuple[str, ...]  # the image's layers, lowest first (this snapshot's not among them)
    created: float
    size: int  # bytes of file data copied
    workspace: str  # "included" or "not included: host directory PATH"
    seconds: float  # how long the copy took (the sandbox was paused meanwhile)
    host_workspace: str = ""  # the host directory bound at /workspace ("" when in the layer)
    store: str = ""  # the image store holding ``layers`` for it ("" for a root directory)
    saved: bool = True  # its layer is all in the state directory (False: being copied there)
    error: str = ""  # why its layer could not be copied there
    cost: int = 0  # charged to the user's budget: the bound while copied, then what the copy holds

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["layers"] = list(self.layers)
        return data


def _dir(root: str) -> str:
    path = os.path.join(root, DIR)
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def layer_path(root: str, snap_id: str) -> str:
    return os.path.join(root, DIR, snap_id, "layer")


def take(
    root: str,
    sandbox: str,
    layer_fd: int,
    image: ImageRef,
    host_workspace: str | None,
    store: str | None = None,
    below: list[int] | None = None,
) -> Snapshot:
    """Copy the layer behind ``layer_fd`` (the caller pauses the sandbox), over its
    frozen layers ``below`` (lowest first: earlier snapshots without a copy), into a new
    snapshot, holding the image's layers in ``store`` for it; a failure leaves nothing
    behind."""
    started = time.monotonic()
    layers = [*(below or []), layer_fd]
    need = layer_bound(layers)
    check_room(root, sandbox, need)
    snap = begin(root, sandbox, image, host_workspace, store, need)
    try:
        size, cost = _fill(root, snap, layers, need)
    except OSError as e:
        discard(root, snap)
        raise _cannot(sandbox, e) from None
    except BaseException:
        discard(root, snap)
        raise
    return _finish(root, snap, size, cost, time.monotonic() - started)


def layer_bound(layers: list[int]) -> int:
    """What copying ``layers`` can cost at most: the space their filesystems use (a
    sandbox's layers are on its own tmpfs: what it holds there is all they can hold),
    each filesystem counted once, and a block per name on it."""
    seen: dict[int, int] = {}
    for fd in layers:
        dev = os.fstat(fd).st_dev
        if dev not in seen:
            st = os.fstatvfs(fd)
            seen[dev] = (st.f_blocks - st.f_bfree) * st.f_frsize + (st.f_files - st.f_ffree) * _INODE_COST
    return sum(seen.values())


def reserve(total: int) -> int:
    """The part of the state directory's disk a snapshot leaves free: 5%, at most
    ``RESERVE_MAX`` (the registry and the logs must still be writable)."""
    return min(RESERVE_MAX, total // 20)


def room(path_or_fd: str | int) -> tuple[int, int]:
    """(bytes free to this user, bytes kept in reserve) on the disk of ``path_or_fd``."""
    st = os.fstatvfs(path_or_fd) if isinstance(path_or_fd, int) else os.statvfs(path_or_fd)
    return st.f_bavail * st.f_frsize, reserve(st.f_blocks * st.f_frsize)


def check_room(root: str, sandbox: str, need: int, snap_id: str = "") -> None:
    """Refuse, typed, a copy of ``need`` bytes that would eat into the reserve of the
    state directory's disk, or take the user's snapshots past their budget (the user's
    ``snapshot_budget``): one sandbox snapshotted again and again must not take the
    whole disk from the user's other sandboxes and programs."""
    free, keep = room(root)
    if need > free - keep:
        raise _no_room(root, sandbox, need, free, keep, snap_id)
    st = os.statvfs(root)
    budget, origin = config.snapshot_budget(st.f_blocks * st.f_frsize, os.environ, Path.home())
    if budget is None:
        return
    held = charged(root)
    if held + need > budget:
        raise SnapshotError(
            f"a snapshot of sandbox {sandbox} would pass your snapshot budget: its layer holds up to "
            f"{show_size(need)}, your snapshots hold {show_size(held)} of {show_size(budget)} "
            f"({origin})",
            operation="snapshot",
            path=os.path.join(root, DIR),
            errno=errno.EDQUOT,
            hint="remove snapshots you no longer need (`warren snapshot ls`, `warren snapshot rm ID`), "
            'or raise snapshot_budget in ~/.config/warren/config.toml (a size such as "20G", a share '
            'of the state disk such as "50%", or "none")',
        )


def charged(root: str) -> int:
    """What the user's snapshots hold against the budget: each one's ``cost`` (its
    bound while it is being copied), none for one whose copy failed (its layer went);
    and what review workspaces' checkpoints hold (their frozen upper directories)."""
    return sum(0 if s.error else s.cost or s.size for s in all_snapshots(root)) + review.held_bytes(root)


def _no_room(root: str, sandbox: str, need: int, free: int, keep: int, snap_id: str = "") -> SnapshotError:
    what = f"snapshot {snap_id} of sandbox {sandbox}" if snap_id else f"a snapshot of sandbox {sandbox}"
    return SnapshotError(
        f"{what} does not fit on the state directory's disk: its layer holds up to "
        f"{show_size(need)}, the disk has {show_size(max(free, 0))} free and "
        f"{show_size(keep)} of it is kept in reserve",
        operation="snapshot",
        path=os.path.join(root, DIR),
        errno=errno.ENOSPC,
        hint="free space on that disk (old snapshots: `warren snapshot ls`, `warren snapshot rm ID`) "
        "or remove what the sandbox does not need from its layer, then snapshot again",
    )


class _Budget:
    """What a copy may still write: at most what its layers hold (the sandbox is paused
    or its layers frozen: more means something is wrong), and only while the state
    directory's disk keeps its reserve, read again every ``RECHECK`` bytes written
    (between two readings, a disk filled by someone else is ENOSPC: a failure too)."""

    def __init__(self, root: str, snap_id: str, sandbox: str, dst: int, need: int) -> None:
        self.root, self.snap_id, self.sandbox, self.dst = root, snap_id, sandbox, dst
        self.need, self.left, self.since = need, need, 0
        self.names = 0  # entries written to the copy

    def charge(self, n: int) -> None:
        self.left -= n
        self.since += n
        if self.left < 0:
            raise SnapshotError(
                f"snapshot {self.snap_id} of sandbox {self.sandbox}: its layer held more than the "
                f"{show_size(self.need)} its filesystem said it used",
                operation="snapshot",
                path=self.snap_id,
                errno=errno.EFBIG,
                hint="take the snapshot again",
            )
        if self.since >= RECHECK:
            self.since = 0
            free, keep = room(self.dst)
            if free - keep < min(self.left, RECHECK):
                raise _no_room(self.root, self.sandbox, self.need, free, keep, self.snap_id)


def begin(
    root: str, sandbox: str, image: ImageRef, host_workspace: str | None, store: str | None, need: int
) -> Snapshot:
    """A new snapshot's record and directory, its layer still to be filled
    (``saved`` False), the image's layers held for it; ``need`` (its bound) is charged
    to the budget until the copy says what it holds."""
    snap_id = secrets.token_hex(6)
    base = safepath.open_dir(_dir(root))
    held = False
    try:
        os.mkdir(snap_id, 0o700, dir_fd=base)
        top = os.open(snap_id, _DIRFLAGS, dir_fd=base)
        try:
            if store:
                image_store(store).hold_for_snapshot(
                    snap_id, os.path.join(root, DIR, snap_id), image.name, image.layers
                )
                held = True
            os.mkdir("layer", 0o755, dir_fd=top)
            snap = Snapshot(
                id=snap_id,
                sandbox=sandbox,
                image=image.name,
                image_id=image.id,
                layers=tuple(str(p) for p in image.layers),
                created=time.time(),
                size=0,
                workspace="included"
                if host_workspace is None
                else f"not included: host directory {host_workspace}",
                seconds=0.0,
                host_workspace=host_workspace or "",
                store=store or "",
                saved=False,
                cost=need,
            )
            safepath.write_atomic(top, _META, json.dumps(snap.to_dict()).encode())
        finally:
            os.close(top)
    except (OSError, ImageError) as e:
        with contextlib.suppress(OSError):
            safepath.remove_tree(base, snap_id)
        if held:
            image_store(store or "").release_snapshot(snap_id)
        if isinstance(e, ImageError):
            raise
        raise _cannot(sandbox, e) from None
    finally:
        os.close(base)
    return snap


def save(root: str, snap: Snapshot, layers: list[int], paused: float) -> Snapshot:
    """Fill ``snap``'s layer from ``layers`` (lowest first: frozen, nobody writes them;
    closed here) and mark it saved; a failure removes what was copied and is written
    into the record."""
    try:
        size, cost = _fill(root, snap, layers, layer_bound(layers))
    except (OSError, WarrenError) as e:
        why = _cannot(snap.sandbox, e) if isinstance(e, OSError) else e
        failed = replace(snap, error=why.message, cost=0)
        _empty_layer(root, snap.id)
        with contextlib.suppress(OSError):
            _write_meta(root, failed)
        return failed
    finally:
        for fd in layers:
            with contextlib.suppress(OSError):
                os.close(fd)
    return _finish(root, snap, size, cost, paused)


def discard(root: str, snap: Snapshot) -> None:
    base = safepath.open_dir(_dir(root))
    try:
        with contextlib.suppress(OSError):
            safepath.remove_tree(base, snap.id)
    finally:
        os.close(base)
    if snap.store:
        with contextlib.suppress(ImageError):
            image_store(snap.store).release_snapshot(snap.id)


def _empty_layer(root: str, snap_id: str) -> None:
    """A copy that failed: its partial layer goes (the disk it filled is freed)."""
    with contextlib.suppress(OSError):
        top = safepath.open_dir(os.path.join(root, DIR, snap_id))
        try:
            with contextlib.suppress(OSError):
                safepath.remove_tree(top, "layer")
        finally:
            os.close(top)


def _finish(root: str, snap: Snapshot, size: int, cost: int, seconds: float) -> Snapshot:
    done = replace(snap, size=size, seconds=round(seconds, 3), saved=True, cost=cost)
    try:
        _write_meta(root, done)
    except OSError as e:
        discard(root, snap)
        raise _cannot(snap.sandbox, e) from None
    return done


def _write_meta(root: str, snap: Snapshot) -> None:
    top = safepath.open_dir(os.path.join(root, DIR, snap.id))
    try:
        safepath.write_atomic(top, _META, json.dumps(snap.to_dict()).encode())
    finally:
        os.close(top)


def _cannot(sandbox: str, e: OSError) -> SetupError:
    return SetupError.from_os(
        e,
        f"cannot snapshot sandbox {sandbox}: {e.strerror}",
        "snapshot",
        e.filename if isinstance(e.filename, str) else None,
        hint=f"move what lies deeper than {safepath.MAX_DEPTH} directories up in the sandbox, "
        "then snapshot again"
        if e.errno == errno.ELOOP
        else "a file the sandbox made unreadable to you (chmod 000) cannot be copied; "
        "the state directory's disk may be full",
    )


def _fill(root: str, snap: Snapshot, layers: list[int], need: int) -> tuple[int, int]:
    """Copy ``layers`` (lowest first) into the snapshot's layer, each over the ones
    before it as the overlay would show them; returns the bytes of file data copied
    and what the copy costs the budget (that data and a block per name).
    The snapshot's ``layers`` (the image's) are where a removed name is
    looked for: a whiteout stays only where it hides something there (elsewhere the
    overlay would list it as a device). ``need``: the bound of ``layer_bound``, which
    the copy may not exceed."""
    dst = safepath.open_dir(layer_path(root, snap.id))
    below: list[int] = []
    budget = _Budget(root, snap.id, snap.sandbox, dst, need)
    try:
        for path in snap.layers:
            with contextlib.suppress(OSError):
                below.append(os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
        size = 0
        for i, layer in enumerate(layers):
            src = os.open(".", _DIRFLAGS, dir_fd=layer)
            try:
                size += _walk(src, dst, {}, None if i == 0 else list(below), budget)
            finally:
                os.close(src)
        return size, size + budget.names * _INODE_COST
    finally:
        os.close(dst)
        for fd in below:
            os.close(fd)


class _Level:
    """One directory of the walk in ``_walk``: the layer's and the copy's, the names in
    it still to visit, the source's stat to apply once it is done (None for the top),
    and, while a layer is applied over the copy, this directory in the image's layers
    (``below``: None when copying a directory the copy did not have)."""

    def __init__(
        self, src: int, dst: int, rel: str, st: os.stat_result | None, below: list[int] | None
    ) -> None:
        self.src, self.dst, self.rel, self.st, self.below = src, dst, rel, st, below
        self.names = os.listdir(src)

    def close(self) -> None:
        if self.st is None:
            return  # the caller's
        for fd in (self.src, self.dst, *(self.below or [])):
            os.close(fd)


def _walk(
    src: int, dst: int, seen: dict[tuple[int, int], str], below: list[int] | None, budget: _Budget
) -> int:
    """Every entry of the layer ``src`` into the copy ``dst``; returns bytes copied.
    ``below`` None: ``dst`` is empty, a plain copy. Else ``src`` is a layer above the
    one copied in ``dst``, applied to it: its entries replace theirs, its whiteouts
    remove them (and stay where ``below``, this directory in the image's layers, has
    the name), its opaque directories replace whole directories, others are merged.
    ``seen``: files with several names, by (dev, ino), and where their first copy is
    (relative to ``dst``), so hard links stay hard links. Iterative, at most
    ``safepath.MAX_DEPTH`` levels deep: a sandbox nests directories as deep as it likes."""
    size = 0
    levels = [_Level(src, dst, "", None, below)]
    try:
        while levels:
            level = levels[-1]
            if not level.names:
                levels.pop()
                try:
                    if level.st is not None:
                        _metadata(level.src, level.dst, level.st)
                finally:
                    level.close()
                continue
            name = level.names.pop()
            budget.names += 1
            st = os.stat(name, dir_fd=level.src, follow_symlinks=False)
            here = f"{level.rel}/{name}" if level.rel else name
            if level.below is not None:
                try:
                    old = os.stat(name, dir_fd=level.dst, follow_symlinks=False)
                except FileNotFoundError:
                    old = None
                merge = stat.S_ISDIR(st.st_mode) and old is not None and stat.S_ISDIR(old.st_mode)
                if merge and not _opaque(level.src, name):
                    levels.append(_descend(levels, level, name, here, st, _subdirs(level.below, name)))
                    continue
                if old is not None:
                    if stat.S_ISDIR(old.st_mode):
                        safepath.remove_tree(level.dst, name)
                    else:
                        os.unlink(name, dir_fd=level.dst)
                if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0 and not _has(level.below, name):
                    continue  # removed, and nothing below has it: no whiteout needed
            if stat.S_ISDIR(st.st_mode):
                os.mkdir(name, 0o700, dir_fd=level.dst)
                levels.append(_descend(levels, level, name, here, st, None))
            else:
                size += _copy_entry(level.src, level.dst, name, st, dst, here, seen, budget)
    finally:
        for level in levels:
            level.close()
    return size


def _descend(
    levels: list[_Level], level: _Level, name: str, here: str, st: os.stat_result, below: list[int] | None
) -> _Level:
    try:
        if len(levels) > safepath.MAX_DEPTH:
            raise safepath.too_deep(here)
        s = os.open(name, _DIRFLAGS, dir_fd=level.src)
        try:
            d = os.open(name, _DIRFLAGS, dir_fd=level.dst)
            try:
                return _Level(s, d, here, st, below)
            except BaseException:
                os.close(d)
                raise
        except BaseException:
            os.close(s)
            raise
    except BaseException:
        for fd in below or []:
            os.close(fd)
        raise


def _subdirs(dirs: list[int], name: str) -> list[int]:
    out = []
    for fd in dirs:
        with contextlib.suppress(OSError):
            out.append(os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd))
    return out


def _has(dirs: list[int], name: str) -> bool:
    for fd in dirs:
        with contextlib.suppress(OSError):
            os.stat(name, dir_fd=fd, follow_symlinks=False)
            return True
    return False


def _opaque(directory: int, name: str) -> bool:
    fd = os.open(name, _DIRFLAGS, dir_fd=directory)
    try:
        return os.getxattr(fd, "user.overlay.opaque") == b"y"
    except OSError:
        return False
    finally:
        os.close(fd)


def _copy_entry(
    src: int,
    dst: int,
    name: str,
    st: os.stat_result,
    top: int,
    here: str,
    seen: dict[tuple[int, int], str],
    budget: _Budget,
) -> int:
    """One entry that is not a directory."""
    mode = st.st_mode
    if stat.S_ISREG(mode):
        key = (st.st_dev, st.st_ino)
        if st.st_nlink > 1 and key in seen:
            os.link(seen[key], name, src_dir_fd=top, dst_dir_fd=dst, follow_symlinks=False)
            return 0
        size = _copy_file(src, dst, name, st, budget)
        if st.st_nlink > 1:
            seen[key] = here
        return size
    if stat.S_ISLNK(mode):
        os.symlink(os.readlink(name, dir_fd=src), name, dir_fd=dst)
    elif stat.S_ISCHR(mode) and st.st_rdev == 0:
        os.mknod(name, stat.S_IFCHR, 0, dir_fd=dst)  # a whiteout: the name was removed
    elif stat.S_ISFIFO(mode):
        os.mkfifo(name, stat.S_IMODE(mode) & 0o777, dir_fd=dst)
    # Sockets and devices cannot be made unprivileged, nor would they mean anything.
    return 0


def _copy_file(src: int, dst: int, name: str, st: os.stat_result, budget: _Budget) -> int:
    s = os.open(name, _RD | os.O_NONBLOCK, dir_fd=src)
    try:
        if not stat.S_ISREG(os.fstat(s).st_mode):
            return 0  # replaced meanwhile (the sandbox is paused: it was not)
        d = os.open(
            name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dst
        )
        try:
            done = extents.copy_data(s, d, budget.charge)
            _metadata(s, d, st)
            return done
        finally:
            os.close(d)
    finally:
        os.close(s)


def _metadata(src: int, dst: int, st: os.stat_result) -> None:
    with contextlib.suppress(OSError):
        for attr in os.listxattr(src):
            if attr == "user.overlay.opaque" or not attr.startswith("user.overlay."):
                with contextlib.suppress(OSError):
                    os.setxattr(dst, attr, os.getxattr(src, attr))
    os.chmod(dst, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))


def _check_id(snap_id: str) -> None:
    if not snap_id or len(snap_id) > 64 or not set(snap_id) <= _ID_CHARS:
        raise SnapshotNotFound(
            f"no snapshot {snap_id!r}",
            operation="snapshot",
            path=snap_id[:80],
            hint="see `warren snapshot ls`",
        )


def get(root: str, snap_id: str) -> Snapshot:
    _check_id(snap_id)
    try:
        base = safepath.open_dir(os.path.join(root, DIR, snap_id))
        try:
            data = json.loads(safepath.read_file(base, _META, 1 << 20))
        finally:
            os.close(base)
    except (OSError, ValueError):
        raise SnapshotNotFound(
            f"no snapshot {snap_id}", operation="snapshot", path=snap_id, hint="see `warren snapshot ls`"
        ) from None
    data["layers"] = tuple(data["layers"])
    return Snapshot(**data)


def all_snapshots(root: str) -> list[Snapshot]:
    out = []
    with contextlib.suppress(FileNotFoundError):
        for name in sorted(os.listdir(os.path.join(root, DIR))):
            with contextlib.suppress(SnapshotNotFound):
                out.append(get(root, name))
    return sorted(out, key=lambda s: s.created)


def id_of(root: str, layer: str) -> str | None:
    """The snapshot whose layer ``layer`` is, if it is one of ``root``'s."""
    head, tail = os.path.join(root, DIR) + "/", "/layer"
    if not (layer.startswith(head) and layer.endswith(tail)):
        return None
    snap_id = layer[len(head) : -len(tail)]
    return snap_id if snap_id and set(snap_id) <= _ID_CHARS else None


def sweep_unsaved(root: str) -> None:
    """At a supervisor's start: a snapshot whose copy a predecessor did not finish
    cannot be finished (its frozen layer was in memory): say so in its record."""
    for snap in all_snapshots(root):
        if not snap.saved and not snap.error:
            with contextlib.suppress(OSError):
                _write_meta(root, replace(snap, error="the supervisor stopped before its layer was saved"))


def image_of(root: str, snap_id: str) -> ImageRef:
    """The image a sandbox made from snapshot ``snap_id`` runs on: the image's layers
    with the snapshot's on top."""
    snap = get(root, snap_id)
    if snap.error:
        raise SnapshotError(
            f"snapshot {snap_id} is not usable: {snap.error}",
            operation="snapshot",
            path=snap_id,
            hint=f"remove it (`warren snapshot rm {snap_id}`) and take another",
        )
    layers = (*snap.layers, layer_path(root, snap_id))
    for layer in layers:
        if not os.path.isdir(layer):
            raise SetupError(
                f"snapshot {snap_id}: its image layer {layer} is gone",
                operation="snapshot",
                path=layer,
                errno=errno.ENOENT,
                hint="the image it was taken on was removed; the snapshot cannot be used without it",
            )
    return ImageRef(name=f"{snap.image}+{snap_id}", id=snap.image_id, layers=tuple(Path(p) for p in layers))


def remove(root: str, snap_id: str, in_use: set[str]) -> Snapshot:
    """Remove a snapshot no sandbox and no other snapshot stands on (``in_use``:
    layer directories of the live sandboxes)."""
    snap = get(root, snap_id)
    layer = layer_path(root, snap_id)
    users = [s.id for s in all_snapshots(root) if layer in s.layers]
    if layer in in_use or users:
        raise SnapshotError(
            f"snapshot {snap_id} is in use"
            + (f" by snapshot(s) {', '.join(users)}" if users else " by a sandbox"),
            operation="snapshot rm",
            path=snap_id,
            errno=errno.EBUSY,
            hint="remove the sandboxes made from it (and the snapshots taken of them) first",
        )
    base = safepath.open_dir(os.path.join(root, DIR))
    try:
        safepath.remove_tree(base, snap_id)
    finally:
        os.close(base)
    if snap.store:
        with contextlib.suppress(ImageError):
            image_store(snap.store).release_snapshot(snap_id)
    return snap
