"""Review mode's layer, host side: made at launch, read for ``warren diff``, written
to the host workspace by ``warren apply``, dropped by ``warren discard``.

A review sandbox's workspace is an overlay (``plan.mounts``): the host's workspace
read-only beneath ``<state>/review/<random>/upper``, which takes every change. The
upper directory is written by the sandbox, so it is hostile: it is read only from
descriptors (``_core.safepath``: ``openat2`` with ``RESOLVE_BENEATH |
RESOLVE_NO_SYMLINKS``, ``O_NOFOLLOW``), a link in it is read as a link and written to
the host as a link, never followed. The host workspace is reached the same way.

What the overlay records (``userxattr``, as in a user namespace): a character device
0:0 is a whiteout (removed), a directory with ``user.overlay.opaque`` replaces the
host's (whatever the host has there and the layer does not is removed), anything else
is added or modified (compared with the host's copy now).

``started``, a file made in the layer when the sandbox is launched, has the ctime every
host file changed since then is newer than or equal to: ``apply`` refuses such a file
unless forced. ``workspace``, written with it, names the host workspace (a sandbox
may see it elsewhere, ``workspace_at``; the registry names that path). Must not:
decide what is reviewed (the plan does), follow a link.

Checkpoints (``server.checkpoints``) freeze the upper directory where it is and stack
the workspace again above it with a fresh one (``upper.N``): the layer is then a stack
of upper directories, recorded oldest first in ``stack.json`` (written by the host
only; the sandbox never sees the layer's own directory), the last one the sandbox's
live upper. What the sandbox sees is their union, newest first, as the overlay makes
it: an entry in a newer directory hides the older ones and the host's, a whiteout
removes, an opaque directory hides everything older beneath it. ``diff`` and ``apply``
read that union. Merged bases (``server.bases``: the union of the oldest directories
made of hard links) are recorded beside them; only mounts use them.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field

from .. import protocol
from .._core import safepath
from ..errors import ReviewConflict, ReviewError, SetupError

UPPER, WORK, STARTED, STACK = "upper", "work", "started", "stack.json"
WORKSPACE = "workspace"  # the host workspace's path (seen elsewhere inside with workspace_at)
_LAYER_NAME = re.compile(r"upper(\.[1-9][0-9]{0,8})?")
_BASE_NAME = re.compile(r"base\.[1-9][0-9]{0,8}")
POINTER = "review-layer"  # in the sandbox's state directory: the layer's name
_OPAQUE = ("user.overlay.opaque", "trusted.overlay.opaque")
_PATCH_LIMIT = 4 << 20  # a file larger than this is named in a patch, not shown
_CHUNK = 1 << 20


def make_layer(layer: str, workspace: str) -> None:
    """The layer's directories, mode 0700 (the upper's root takes the workspace's mode:
    it is the mode the sandbox sees at the workspace), the ``started`` mark and the
    host workspace's path (``workspace_of``)."""
    try:
        os.makedirs(os.path.dirname(layer), mode=0o700, exist_ok=True)
        os.mkdir(layer, 0o700)
        os.mkdir(os.path.join(layer, WORK), 0o700)
        os.mkdir(os.path.join(layer, UPPER), 0o700)
        os.chmod(os.path.join(layer, UPPER), stat.S_IMODE(os.stat(workspace).st_mode) & 0o777)
        os.close(os.open(os.path.join(layer, STARTED), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        fd = safepath.open_dir(layer)
        try:
            safepath.write_atomic(fd, WORKSPACE, workspace.encode(), mode=0o600)
        finally:
            os.close(fd)
    except OSError as e:
        remove_layer(layer)
        raise SetupError.from_os(
            e,
            f"cannot make the review layer {layer}: {e.strerror}",
            "mkdir",
            layer,
            hint="free space on the disk of warren's state directory",
        ) from None


def remove_layer(layer: str) -> None:
    """The layer goes, whatever the sandbox left in it: links are removed as entries,
    directories closed by their mode (and the overlay's own work directory, mode 000)
    are opened first."""
    try:
        pfd = safepath.open_dir(os.path.dirname(layer))
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            safepath.remove_tree(pfd, os.path.basename(layer))
    finally:
        os.close(pfd)


def write_pointer(sandbox_dir: str, layer: str) -> None:
    fd = safepath.open_dir(sandbox_dir)
    try:
        safepath.write_atomic(fd, POINTER, os.path.basename(layer).encode())
    finally:
        os.close(fd)


def layer_of(sandbox_dir: str, state_dir: str, name: str) -> str:
    """The layer of review sandbox ``name`` (its state directory names it)."""
    try:
        fd = safepath.open_dir(sandbox_dir)
        try:
            token = safepath.read_file(fd, POINTER, 64).decode()
        finally:
            os.close(fd)
    except (OSError, UnicodeDecodeError):
        raise ReviewError(
            f"sandbox {name} is not a review sandbox",
            operation="review",
            path=name,
            hint=f"create one with `warren create {name} --review`",
        ) from None
    if not token or not all(c in "0123456789abcdef" for c in token):
        raise ReviewError(f"sandbox {name}'s review layer is unreadable", operation="review", path=name)
    return os.path.join(state_dir, "review", token)


def workspace_of(layer: str, seen: str) -> str:
    """The host workspace a layer is of: the path recorded at launch (a sandbox may see
    its workspace elsewhere, ``workspace_at``); ``seen``, the registry's, for a layer
    made before it was recorded (then the two were one)."""
    try:
        fd = safepath.open_dir(layer)
        try:
            return safepath.read_file(fd, WORKSPACE, 1 << 16).decode()
        finally:
            os.close(fd)
    except FileNotFoundError:
        return seen
    except (OSError, UnicodeDecodeError):
        raise ReviewError(
            f"the review layer's record {os.path.join(layer, WORKSPACE)} is unreadable",
            operation="review",
            path=os.path.join(layer, WORKSPACE),
            hint="warren wrote it; remove the sandbox (`warren rm`) if it was changed by hand",
        ) from None


@dataclass
class Checkpoint:
    id: int
    layer: str  # the upper directory frozen by it: the workspace is the union up to it
    time: float
    bytes: int  # what that directory holds (charged to the snapshot budget)
    commands: list[str] = field(default_factory=list)  # the commands that followed it

    def message(self) -> protocol.CheckpointInfo:
        return protocol.CheckpointInfo(
            id=self.id, time=self.time, bytes=self.bytes, command="; ".join(self.commands)
        )


@dataclass
class Base:
    """A merged base (``server.bases``): one directory that is, as a lower layer, the
    union of the upper directories up to ``covers`` (a frozen one, the last it holds)."""

    name: str
    covers: str


@dataclass
class LayerStack:
    """A review layer's upper directories, oldest first (the last is the sandbox's live
    upper), its checkpoints, oldest first, and its merged bases, oldest first."""

    next: int = 1
    layers: list[str] = field(default_factory=lambda: [UPPER])
    checkpoints: list[Checkpoint] = field(default_factory=list)
    bases: list[Base] = field(default_factory=list)

    def dump(self) -> bytes:
        return json.dumps(
            {
                "next": self.next,
                "layers": self.layers,
                "checkpoints": [
                    {"id": c.id, "layer": c.layer, "time": c.time, "bytes": c.bytes, "commands": c.commands}
                    for c in self.checkpoints
                ],
                "bases": [{"name": b.name, "covers": b.covers} for b in self.bases],
            }
        ).encode()


def work_of(upper: str) -> str:
    return upper.replace(UPPER, WORK, 1)


def read_stack(layer: str) -> LayerStack:
    """The layer's stack (one upper directory and no checkpoint when none was taken)."""
    fd = safepath.open_dir(layer)
    try:
        raw = safepath.read_file(fd, STACK, 1 << 22)
    except FileNotFoundError:
        return LayerStack()
    finally:
        os.close(fd)
    try:
        data = json.loads(raw)
        stack = LayerStack(
            next=int(data["next"]),
            layers=[str(n) for n in data["layers"]],
            checkpoints=[
                Checkpoint(
                    id=int(c["id"]),
                    layer=str(c["layer"]),
                    time=float(c["time"]),
                    bytes=int(c["bytes"]),
                    commands=[str(x) for x in c["commands"]],
                )
                for c in data["checkpoints"]
            ],
            bases=[Base(name=str(b["name"]), covers=str(b["covers"])) for b in data.get("bases", [])],
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        stack = LayerStack(layers=[])
    names_ok = stack.layers and all(_LAYER_NAME.fullmatch(n) for n in stack.layers)
    frozen = set(stack.layers[:-1])
    bases_ok = all(_BASE_NAME.fullmatch(b.name) and b.covers in frozen for b in stack.bases)
    if not names_ok or not bases_ok or any(c.layer not in frozen for c in stack.checkpoints):
        raise ReviewError(
            f"the review layer's record {os.path.join(layer, STACK)} is unreadable",
            operation="review",
            path=os.path.join(layer, STACK),
            hint="warren wrote it; remove the sandbox (`warren rm`) if it was changed by hand",
        )
    return stack


def write_stack(layer: str, stack: LayerStack) -> None:
    fd = safepath.open_dir(layer)
    try:
        # no fsync: a supervisor killed leaves the page cache; a crash of the host may
        # lose the last checkpoint's record, never the layers it names
        safepath.write_atomic(fd, STACK, stack.dump(), mode=0o600, fsync=False)
    finally:
        os.close(fd)


def held_bytes(state_dir: str) -> int:
    """What the checkpoints of every review layer under ``state_dir`` hold."""
    total = 0
    base = os.path.join(state_dir, "review")
    try:
        names = os.listdir(base)
    except OSError:
        return 0
    for name in names:
        with contextlib.suppress(OSError, ReviewError):
            total += sum(c.bytes for c in read_stack(os.path.join(base, name)).checkpoints)
    return total


@dataclass
class Change:
    path: str  # relative to the workspace
    kind: str  # added | modified | removed | mode | renamed
    type: str  # file | dir | symlink | other
    old_mode: int | None = None
    new_mode: int | None = None
    renamed_from: str | None = None
    held: str = ""  # why apply never writes it (git metadata, a device)
    src: int = 0  # the upper directory its content is read from (newest first)

    def message(self) -> protocol.ReviewChange:
        return protocol.ReviewChange(
            path=self.path,
            kind=self.kind,
            type=self.type,
            old_mode=self.old_mode,
            new_mode=self.new_mode,
            renamed_from=self.renamed_from,
            held=self.held,
        )


def _type(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def _held(rel: str, mode: int) -> str:
    if ".git" in rel.split("/"):
        return "git metadata: host git would read it (commits made inside stay in the layer)"
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
        return "not a file, directory or link"
    return ""


def _lstat(dirfd: int, rel: str) -> os.stat_result | None:
    try:
        return safepath.lstat_beneath(dirfd, rel)
    except (NotADirectoryError, FileNotFoundError):
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:  # a link on the way: nothing of the host's beneath it
            return None
        raise


def _is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _opaque(dirfd: int, rel: str) -> bool:
    fd = safepath.dir_beneath(dirfd, rel)
    try:
        for key in _OPAQUE:
            with contextlib.suppress(OSError):
                if os.getxattr(fd, key) == b"y":
                    return True
        return False
    finally:
        os.close(fd)


def _chunks(dirfd: int, rel: str) -> Iterator[bytes]:
    fd = safepath.open_beneath(dirfd, rel, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", rel)
        while chunk := os.read(fd, _CHUNK):
            yield chunk
    finally:
        os.close(fd)


def _same_content(a_fd: int, b_fd: int, rel_a: str, rel_b: str) -> bool:
    a, b = _chunks(a_fd, rel_a), _chunks(b_fd, rel_b)
    buf_a = buf_b = b""
    while True:
        if not buf_a:
            buf_a = next(a, b"")
        if not buf_b:
            buf_b = next(b, b"")
        if not buf_a or not buf_b:
            return not buf_a and not buf_b
        n = min(len(buf_a), len(buf_b))
        if buf_a[:n] != buf_b[:n]:
            return False
        buf_a, buf_b = buf_a[n:], buf_b[n:]


def _removed_under(lower: int, rel: str, out: list[Change]) -> None:
    """Everything of the host's beneath ``rel`` (removed with it), deepest last."""
    stack = [rel]
    while stack:
        cur = stack.pop()
        with safepath.listed(lower, cur) as (_fd, names):
            for name in sorted(names):
                child = f"{cur}/{name}"
                st = _lstat(lower, child)
                if st is None:
                    continue
                out.append(Change(child, "removed", _type(st.st_mode), old_mode=stat.S_IMODE(st.st_mode)))
                if stat.S_ISDIR(st.st_mode):
                    stack.append(child)


@contextlib.contextmanager
def _opened(layer: str, workspace: str) -> Iterator[tuple[list[int], int]]:
    """The layer's upper directories (newest first) and the host workspace, open."""
    fds: list[int] = []
    try:
        for name in reversed(read_stack(layer).layers):
            fds.append(safepath.open_dir(os.path.join(layer, name)))
        lower = safepath.open_dir(workspace)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    try:
        yield fds, lower
    finally:
        for fd in (*fds, lower):
            os.close(fd)


def changes(layer: str, workspace: str) -> list[Change]:
    """What the layer (the union of its upper directories) changes in the workspace,
    parents before their entries."""
    with _opened(layer, workspace) as (uppers, lower):
        return _changes(uppers, lower)


def _chain(uppers: list[int], chain: list[int], rel: str) -> tuple[list[int], bool]:
    """The upper directories (of ``chain``, newest first) that make directory ``rel``
    in the union, and whether what lies below them (the host's) shows through: a
    whiteout or a non-directory hides everything older, an opaque directory what lies
    below it."""
    out: list[int] = []
    for i in chain:
        st = _lstat(uppers[i], rel)
        if st is None:
            continue
        if not stat.S_ISDIR(st.st_mode):
            return out, False
        out.append(i)
        try:
            opaque = _opaque(uppers[i], rel)
        except PermissionError:
            opaque = False  # closed by its mode: its listing fails next, and it is held back
        if opaque:
            return out, False
    return out, True


def _changes(uppers: list[int], lower: int) -> list[Change]:
    out: list[Change] = []
    # (directory, the upper directories that make it, newest first; the host's shows)
    stack: list[tuple[str, list[int], bool]] = [("", list(range(len(uppers))), True)]
    while stack:
        cur, chain, host_shows = stack.pop()
        top: dict[str, int] = {}
        try:
            for i in chain:
                for name in _names(uppers[i], cur):
                    top.setdefault(name, i)
        except PermissionError:
            # a directory the sandbox closed with its mode (chmod 000): what it holds
            # cannot be read without changing the layer; it is held back whole
            for c in out:
                if c.path == cur:
                    c.held = "its mode keeps its entries from being read (chmod u+rx inside, then diff)"
            continue
        if cur and not host_shows:
            # the host's entries the union does not have are removed
            host = _lstat(lower, cur)
            if host is not None and stat.S_ISDIR(host.st_mode):
                with safepath.listed(lower, cur) as (_l, host_names):
                    for name in sorted(set(host_names) - set(top)):
                        _host_removed(lower, f"{cur}/{name}", out)
        for name in sorted(top):
            rel = f"{cur}/{name}" if cur else name
            src = top[name]
            upper = uppers[src]
            st = _lstat(upper, rel)
            if st is None:
                continue
            host = _lstat(lower, rel)
            if _is_whiteout(st):
                if host is not None:
                    _host_removed(lower, rel, out)
                continue
            mode = stat.S_IMODE(st.st_mode)
            kind = _type(st.st_mode)
            held = _held(rel, st.st_mode)
            below: list[int] = []
            shows = False
            if kind == "dir":
                below, shows = _chain(uppers, chain[chain.index(src) :], rel)
                shows = shows and host_shows
            if host is None or _type(host.st_mode) != kind:
                if host is not None:
                    _host_removed(lower, rel, out)
                out.append(Change(rel, "added", kind, new_mode=mode, held=held, src=src))
                if kind == "dir":
                    stack.append((rel, below, False))
                continue
            old = stat.S_IMODE(host.st_mode)
            if kind == "dir":
                if old != mode:
                    out.append(Change(rel, "mode", kind, old, mode, held=held, src=src))
                stack.append((rel, below, shows))
            elif kind == "symlink":
                if _readlink(upper, rel) != _readlink(lower, rel):
                    out.append(Change(rel, "modified", kind, old, mode, held=held, src=src))
            elif kind == "file":
                if host.st_size != st.st_size or not _same_content(upper, lower, rel, rel):
                    out.append(Change(rel, "modified", kind, old, mode, held=held, src=src))
                elif old != mode:
                    out.append(Change(rel, "mode", kind, old, mode, held=held, src=src))
            elif old != mode:
                out.append(Change(rel, "mode", kind, old, mode, held=held, src=src))
    return _renames(out, uppers, lower)


def _names(dirfd: int, rel: str) -> list[str]:
    with safepath.listed(dirfd, rel) as (_fd, names):
        return names


def _host_removed(lower: int, rel: str, out: list[Change]) -> None:
    st = _lstat(lower, rel)
    if st is None:
        return
    mode, held = stat.S_IMODE(st.st_mode), _held(rel, st.st_mode)
    out.append(Change(rel, "removed", _type(st.st_mode), old_mode=mode, held=held))
    if stat.S_ISDIR(st.st_mode):
        _removed_under(lower, rel, out)


def _readlink(dirfd: int, rel: str) -> str:
    with safepath.entry(dirfd, rel) as (pfd, name):
        return os.readlink(name, dir_fd=pfd)


def _renames(out: list[Change], uppers: list[int], lower: int) -> list[Change]:
    """A removed file and an added one of the same content are one rename (shown so;
    applied as the two changes it is made of)."""
    removed = {c.path: c for c in out if c.kind == "removed" and c.type == "file" and not c.held}
    for c in out:
        if c.kind != "added" or c.type != "file" or c.held:
            continue
        st = _lstat(uppers[c.src], c.path)
        for path in list(removed):
            old = _lstat(lower, path)
            if st is None or old is None or old.st_size != st.st_size:
                continue
            if _same_content(uppers[c.src], lower, c.path, path):
                c.kind, c.renamed_from = "renamed", path
                c.old_mode = removed.pop(path).old_mode
                break
    sources = {c.renamed_from for c in out if c.renamed_from}
    return [c for c in out if not (c.kind == "removed" and c.path in sources)]


def _at(c: Change, want: str) -> bool:
    if want in ("", "."):
        return True
    return c.path == want or c.path.startswith(want + "/") or c.renamed_from == want


def select(found: list[Change], paths: list[str]) -> list[Change]:
    """The changes at or beneath ``paths`` (relative to the workspace); all without."""
    if not paths:
        return found
    wanted = [p.strip("/") for p in paths]
    for want in wanted:
        if not any(_at(c, want) for c in found):
            raise ReviewError(
                f"no change at {want} in the review layer",
                operation="apply",
                path=want,
                hint="`warren diff NAME` lists the changes; paths are relative to the workspace",
            )
    return [c for c in found if any(_at(c, w) for w in wanted)]


def patch(layer: str, workspace: str, found: list[Change]) -> str:
    """The changes as a git-style patch; binary and large files are named."""
    with _opened(layer, workspace) as (uppers, lower):
        parts: list[str] = []
        for c in found:
            if c.type == "dir" or c.held:
                continue
            old_path = c.renamed_from or c.path
            parts.append(f"diff --git a/{old_path} b/{c.path}\n")
            if c.kind == "added":
                parts.append(f"new file mode {_git_mode(c.type, c.new_mode)}\n")
            elif c.kind == "removed":
                parts.append(f"deleted file mode {_git_mode(c.type, c.old_mode)}\n")
            elif c.old_mode != c.new_mode:
                old, new = _git_mode(c.type, c.old_mode), _git_mode(c.type, c.new_mode)
                parts.append(f"old mode {old}\nnew mode {new}\n")
            if c.kind == "renamed":
                parts.append(f"rename from {old_path}\nrename to {c.path}\n")
                continue
            if c.kind == "mode":
                continue
            before = b"" if c.kind == "added" else _content(lower, old_path, c.type)
            after = b"" if c.kind == "removed" else _content(uppers[c.src], c.path, c.type)
            if before is None or after is None or b"\0" in before or b"\0" in after:
                parts.append(f"Binary files a/{old_path} and b/{c.path} differ\n")
                continue
            try:
                a, b = before.decode(), after.decode()
            except UnicodeDecodeError:
                parts.append(f"Binary files a/{old_path} and b/{c.path} differ\n")
                continue
            lines = difflib.unified_diff(
                a.splitlines(keepends=True),
                b.splitlines(keepends=True),
                "/dev/null" if c.kind == "added" else f"a/{old_path}",
                "/dev/null" if c.kind == "removed" else f"b/{c.path}",
            )
            for line in lines:
                parts.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
        return "".join(parts)


def _git_mode(kind: str, mode: int | None) -> str:
    if kind == "symlink":
        return "120000"
    return "100755" if (mode or 0) & 0o111 else "100644"


def _content(dirfd: int, rel: str, kind: str) -> bytes | None:
    """None: too large for a patch."""
    if kind == "symlink":
        return _readlink(dirfd, rel).encode()
    try:
        return safepath.read_file(dirfd, rel, _PATCH_LIMIT)
    except OSError as e:
        if e.errno == errno.EFBIG:
            return None
        raise


def apply(layer: str, workspace: str, chosen: list[Change], force: bool) -> list[str]:
    """Write ``chosen`` to the host workspace; returns the paths written. Every change is
    checked first: one whose host copy changed since the sandbox started refuses them
    all (``ReviewConflict``) unless ``force``. Each file is written atomically (a fresh
    temporary name in its directory, synced, renamed over), as the caller, without its
    set-id bits; a link is made as a link, and a file with several names in the layer
    is written once and linked to its other names."""
    started = os.stat(os.path.join(layer, STARTED)).st_ctime_ns
    with _opened(layer, workspace) as (uppers, lower):
        return _apply(uppers, lower, workspace, chosen, force, started)


def _apply(
    uppers: list[int], lower: int, workspace: str, chosen: list[Change], force: bool, started: int
) -> list[str]:
    try:
        todo = [c for c in chosen if not c.held]
        if not force:
            changed = [c.path for c in todo for p in _touched(c) if _newer(lower, p, started)]
            if changed:
                raise ReviewConflict(
                    f"{len(changed)} file(s) changed on the host since the sandbox started: "
                    + ", ".join(sorted(set(changed))[:10]),
                    operation="apply",
                    path=changed[0],
                    hint="look at them (`warren diff NAME --patch`), then apply with --force to overwrite "
                    "them, or apply the others by path",
                )
        done: list[str] = []
        # removals deepest first, then the rest parents first
        for c in sorted((c for c in todo if c.kind == "removed"), key=lambda c: -c.path.count("/")):
            _apply_one(uppers[c.src], lower, c)
            done.append(c.path)
        # A file the sandbox gave several names (a hard link within the workspace) is
        # written once; its other names are linked to it, as in the sandbox.
        written: dict[tuple[int, int], str] = {}
        for c in todo:
            if c.kind == "removed":
                continue
            if c.renamed_from:
                safepath.remove_tree(lower, c.renamed_from)
            key = _inode_of(uppers[c.src], c)
            _apply_one(uppers[c.src], lower, c, link_from=written.get(key) if key else None)
            if key is not None:
                written.setdefault(key, c.path)
            done.append(c.path)
        return done
    except OSError as e:
        where = e.filename if isinstance(e.filename, str) else workspace
        raise ReviewError.from_os(
            e,
            f"cannot apply {where}: {e.strerror}",
            "apply",
            where,
            hint="a link or a missing directory on the way in the host workspace is never followed; "
            "fix it on the host and apply again (what was written stays written)",
        ) from None


def _touched(c: Change) -> list[str]:
    return [c.path, c.renamed_from] if c.renamed_from else [c.path]


def _newer(lower: int, rel: str, started: int) -> bool:
    try:
        st = _lstat(lower, rel)
    except OSError:
        return True
    if st is None:
        return False
    return st.st_ctime_ns >= started and not stat.S_ISDIR(st.st_mode)


def _inode_of(upper: int, c: Change) -> tuple[int, int] | None:
    """The layer's inode of a file written whole, when it has other names."""
    if c.type != "file" or c.kind == "mode":
        return None
    st = _lstat(upper, c.path)
    return (st.st_dev, st.st_ino) if st is not None and st.st_nlink > 1 else None


def _link_over(lower: int, source: str, rel: str) -> None:
    """``rel`` made another name of ``source`` (both beneath ``lower``, neither followed),
    atomically: a fresh name linked, then renamed over."""
    with safepath.entry(lower, source) as (spfd, sname), safepath.entry(lower, rel) as (pfd, name):
        tmp = safepath.temp_name(name)
        os.link(sname, tmp, src_dir_fd=spfd, dst_dir_fd=pfd, follow_symlinks=False)
        try:
            os.rename(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=pfd)
            raise


def _apply_one(upper: int, lower: int, c: Change, link_from: str | None = None) -> None:
    if c.kind == "removed":
        safepath.remove_tree(lower, c.path)
        return
    mode = (c.new_mode or 0) & 0o777
    host = _lstat(lower, c.path)
    if c.type == "dir":
        if host is not None and not stat.S_ISDIR(host.st_mode):
            safepath.remove_tree(lower, c.path)
            host = None
        if host is None:
            with safepath.entry(lower, c.path) as (pfd, name):
                os.mkdir(name, 0o700, dir_fd=pfd)
        fd = safepath.dir_beneath(lower, c.path)
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        return
    if host is not None and stat.S_ISDIR(host.st_mode):
        safepath.remove_tree(lower, c.path)
    if c.type == "symlink":
        target = _readlink(upper, c.path)
        with safepath.entry(lower, c.path) as (pfd, name):
            tmp = safepath.temp_name(name)
            os.symlink(target, tmp, dir_fd=pfd)
            try:
                os.rename(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=pfd)
                raise
        return
    if c.kind == "mode":
        fd = safepath.open_beneath(lower, c.path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        return
    if link_from is not None:
        _link_over(lower, link_from, c.path)
        return
    safepath.write_atomic(lower, c.path, _chunks(upper, c.path), mode=mode)


def discard(layer: str) -> None:
    """Empty the layer (the sandbox, stopped, keeps a layer with nothing in it): its
    checkpoints and every upper directory but the first go, the first is emptied."""
    fd = safepath.open_dir(layer)
    try:
        # the record first: what it no longer names is only left over
        with contextlib.suppress(FileNotFoundError):
            os.unlink(STACK, dir_fd=fd)
        with safepath.listed(fd, "") as (_d, names):
            for name in names:
                if name not in (UPPER, WORK, STARTED, WORKSPACE):
                    with contextlib.suppress(FileNotFoundError):  # a rollback's, removed meanwhile
                        safepath.remove_tree(fd, name)
        with safepath.listed(fd, UPPER) as (ufd, names):
            for name in names:
                safepath.remove_tree(ufd, name)
    finally:
        os.close(fd)
