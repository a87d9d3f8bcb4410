"""``warren cp``: copies between the host and a sandbox, whose host end no sandbox can
turn against the host.

The sandbox's end goes through the files API (resolved inside the sandbox, with its
rights; a write there is all or nothing). The host end treats the paths as hostile
where a sandbox could write them: the path the user typed is walked by ``hostpath``
(no link a sandbox could have planted is followed), and everything beneath it is
reached only from directory descriptors with ``openat2(RESOLVE_BENEATH |
RESOLVE_NO_SYMLINKS)`` (``safepath``). So an entry swapped for a link while the copy
runs fails the copy instead of being followed: out of a sandbox no host file outside
the destination is written, into one no host file outside the source is read. Each
host file is written whole (``safepath.write_atomic``: a random name beside it,
synced, renamed over it), so a failed or killed copy leaves the old file, and an
existing destination keeps its mode. Links, FIFOs, sockets and devices inside a copied
tree are skipped with a note; a file larger than one message (256 MiB) is an error
before anything is written.
"""

from __future__ import annotations

import errno
import os
import stat
import sys

from .. import names, wire
from .._core import safepath
from ..client.sandbox import Sandbox
from ..errors import SandboxFileNotFound, WarrenError
from ..models import FileInfo
from . import hostpath
from .progress import Progress

LIMIT = wire.MAX_PAYLOAD  # what one file request carries


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _note(message: str) -> None:
    print(f"warren cp: {message}", file=sys.stderr)


class _Tally:
    """What a copy of a tree has moved so far, shown on a terminal (``Progress``)."""

    def __init__(self, total: int | None = None) -> None:
        self.progress = Progress()
        self.files = self.size = 0
        self.total = total

    def add(self, size: int) -> None:
        self.files += 1
        self.size += size
        files = f"{self.files} file" + ("s" if self.files != 1 else "")
        self.progress(f"warren cp: {files}", self.size, self.total)

    def end(self) -> None:
        self.progress.end()


def _checked_name(name: str, where: str) -> str:
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        raise hostpath.cp_error(
            f"{where} lists an entry named {name!r}, which is not a file name",
            where,
            "nothing was copied past it",
        )
    return name


# --- into the sandbox --------------------------------------------------------------------


def to_sandbox(sb: Sandbox, src: str, dest: str, recursive: bool) -> None:
    where = hostpath.resolve(src)
    try:
        st = where.lstat()
        if st is None:
            raise hostpath.error("read", src, FileNotFoundError(errno.ENOENT, "missing"))
        target = _into(sb, dest, os.path.basename(os.path.normpath(src)))
        if stat.S_ISDIR(st.st_mode):
            if not recursive:
                raise hostpath.cp_error(f"{src} is a directory", src, "copy directories with -r")
            _tree_to_sandbox(sb, where, target)
        elif stat.S_ISREG(st.st_mode):
            try:
                data, mode = _read_host(where.dirfd, where.name, src)
            except _NotAFile as e:  # it changed since the walk looked at it
                raise hostpath.cp_error(
                    f"{src} is {e} now", src, "something is changing it; nothing was read"
                ) from None
            sb.files.write(target, data, mode=mode)
        else:
            raise hostpath.cp_error(f"{src} is not a regular file or a directory", src, "copy files")
    finally:
        where.close()


def _into(sb: Sandbox, dest: str, name: str) -> str:
    """Where a copy named ``name`` lands in the sandbox (cp's rule for directories)."""
    if dest.endswith("/"):
        return dest + name
    try:
        if sb.files.stat(dest).type == "dir":
            return dest.rstrip("/") + "/" + name
    except SandboxFileNotFound:
        pass
    return dest


def _tree_to_sandbox(sb: Sandbox, where: hostpath.Where, target: str) -> None:
    try:
        root = where.open_dir()
    except OSError as e:
        raise _changed(where.path, e) from None
    tally = _Tally()
    try:
        entries = _host_tree(root, where.path)  # all listed first: a copy into itself ends
        sb.files.mkdir(target, parents=True, exist_ok=True)
        for rel, is_dir in entries:
            out = f"{target.rstrip('/')}/{rel}"
            if not names.is_utf8(rel):
                _note(f"skipped {os.path.join(where.path, rel)!r}: its name is not UTF-8")
                continue
            if is_dir:
                sb.files.mkdir(out, exist_ok=True)
                continue
            shown = os.path.join(where.path, rel)
            parent, name = os.path.split(rel)
            fd = _open_host_dir(root, parent, where.path)
            try:
                data, mode = _read_host(fd, name, shown)
            except _NotAFile as e:
                _note(f"skipped {shown}: {e}")
                continue
            finally:
                os.close(fd)
            sb.files.write(out, data, mode=mode)
            tally.add(len(data))
    finally:
        tally.end()
        os.close(root)


def _host_tree(root: int, shown: str) -> list[tuple[str, bool]]:
    """(relative path, is a directory) of everything beneath ``root``, parents first;
    each directory opened afresh beneath ``root``, never through a link."""
    found: list[tuple[str, bool]] = []
    todo = [""]
    while todo:
        rel = todo.pop(0)
        fd = _open_host_dir(root, rel, shown)
        try:
            with os.scandir(fd) as it:
                listed = sorted((e.name, e.is_dir(follow_symlinks=False)) for e in it)
        finally:
            os.close(fd)
        for name, is_dir in listed:
            found.append((os.path.join(rel, name), is_dir))
            if is_dir and names.is_utf8(name):
                todo.append(os.path.join(rel, name))
    return found


def _open_host_dir(root: int, rel: str, shown: str) -> int:
    try:
        return safepath.dir_beneath(root, rel)
    except OSError as e:
        raise _changed(os.path.join(shown, rel), e) from None


def _changed(path: str, e: OSError) -> WarrenError:
    if e.errno in (errno.ELOOP, errno.EXDEV, errno.ENOTDIR):
        return hostpath.cp_error(
            f"{path} became a symbolic link or left the tree while it was being copied",
            path,
            "something (a sandbox?) is changing it: the copy stopped there and followed nothing",
            e.errno,
        )
    return hostpath.error("read", path, e)


class _NotAFile(Exception):
    pass


def _read_host(dirfd: int, name: str, shown: str) -> tuple[bytes, int]:
    """The content and permission bits of the regular file ``name``, never through a
    link, never blocking on a FIFO, at most ``LIMIT`` bytes."""
    try:
        fd = safepath.open_beneath(dirfd, name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _NotAFile("a symbolic link (not followed)") from None
        raise hostpath.error("read", shown, e) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _NotAFile("not a regular file")
        chunks, size = [], st.st_size
        if size <= LIMIT:
            size = 0
            while chunk := os.read(fd, 1 << 20):
                size += len(chunk)
                if size > LIMIT:
                    break
                chunks.append(chunk)
        if size > LIMIT:
            raise hostpath.cp_error(
                f"{shown} is larger than {LIMIT} bytes (or grew past it while being read)",
                shown,
                "nothing of it was copied; move it through the workspace, or split it",
                errno.EFBIG,
            )
        return b"".join(chunks), stat.S_IMODE(st.st_mode) & 0o777
    except OSError as e:
        raise hostpath.error("read", shown, e) from None
    finally:
        os.close(fd)


# --- out of the sandbox ------------------------------------------------------------------


def from_sandbox(sb: Sandbox, src: str, dest: str, recursive: bool) -> None:
    info = sb.files.stat(src, follow_symlinks=False)
    if info.type == "dir" and not recursive:
        raise hostpath.cp_error(f"{src} is a directory", src, "copy directories with -r")
    if info.type not in ("dir", "file"):
        raise hostpath.cp_error(
            f"{src} is a {info.type} in the sandbox, not a file",
            src,
            "copy the file it points to by its own path",
        )
    name = os.path.basename(os.path.normpath(src)) or "copy"
    where = hostpath.resolve(dest)
    try:
        st = where.lstat()
        if dest.endswith("/") or (st is not None and stat.S_ISDIR(st.st_mode)):
            try:
                parent = where.open_dir()
            except OSError as e:
                raise _changed(dest, e) from None
            shown = os.path.join(dest, name)
        else:
            parent, name, shown = os.dup(where.dirfd), where.name, dest
        try:
            if info.type == "dir":
                _tree_from_sandbox(sb, src, parent, name, shown)
            else:
                _write_host(parent, name, shown, sb.files.read(src, max_bytes=LIMIT), info.mode)
        finally:
            os.close(parent)
    finally:
        where.close()


def _existing(dirfd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _write_host(dirfd: int, name: str, shown: str, data: bytes, mode: int) -> None:
    """``name`` in ``dirfd`` replaced whole by ``data``: an existing file keeps its
    permission bits, a new one gets ``mode`` less the umask."""
    old = _existing(dirfd, name)
    if old is not None and not stat.S_ISREG(old.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(old.st_mode) else "not a regular file"
        raise hostpath.cp_error(
            f"{shown} exists and is {kind}; warren cp does not write through it",
            shown,
            "remove it, or copy to another name",
        )
    keep = stat.S_IMODE(old.st_mode) & 0o1777 if old is not None else mode & 0o777 & ~_umask()
    try:
        safepath.write_atomic(dirfd, name, data, mode=keep)
    except OSError as e:
        raise hostpath.cp_error(
            f"cannot write {shown} on the host", shown, f"nothing was changed: {shown} is as it was", e.errno
        ) from None


def _mkdir_host(dirfd: int, name: str, shown: str) -> None:
    try:
        os.mkdir(name, 0o755, dir_fd=dirfd)
    except FileExistsError:
        st = _existing(dirfd, name)
        if st is None or not stat.S_ISDIR(st.st_mode):
            raise hostpath.cp_error(
                f"{shown} exists and is not a directory", shown, "copy elsewhere"
            ) from None
    except OSError as e:
        raise hostpath.error("create", shown, e) from None


def _tree_from_sandbox(sb: Sandbox, src: str, parent: int, name: str, shown: str) -> None:
    entries = _sandbox_tree(sb, src)  # all listed first: a copy into itself ends
    tally = _Tally(sum(e.size for _rel, e in entries if e.type == "file"))
    _mkdir_host(parent, name, shown)
    try:
        root = safepath.dir_beneath(parent, name)
    except OSError as e:
        raise _changed(shown, e) from None
    try:
        for rel, entry in entries:
            out, inner = os.path.join(shown, rel), f"{src.rstrip('/')}/{rel}"
            if entry.type not in ("dir", "file"):
                _note(f"skipped {inner} in the sandbox: a {entry.type}, not a file")
                continue
            where, child = os.path.split(rel)
            fd = _open_host_dir(root, where, shown)
            try:
                if entry.type == "dir":
                    _mkdir_host(fd, child, out)
                else:
                    data = sb.files.read(inner, max_bytes=LIMIT)
                    _write_host(fd, child, out, data, entry.mode)
                    tally.add(len(data))
            finally:
                os.close(fd)
    finally:
        tally.end()
        os.close(root)


def _sandbox_tree(sb: Sandbox, src: str) -> list[tuple[str, FileInfo]]:
    """(relative path, entry) of everything beneath ``src`` in the sandbox, parents first."""
    found: list[tuple[str, FileInfo]] = []
    todo = [""]
    while todo:
        rel = todo.pop(0)
        for entry in sb.files.list(f"{src.rstrip('/')}/{rel}" if rel else src):
            child = os.path.join(rel, _checked_name(entry.name, src))
            found.append((child, entry))
            if entry.type == "dir":
                todo.append(child)
    return found
