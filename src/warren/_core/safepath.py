"""Host-side file access to directories a sandbox can write: never through a link.

Everything a sandbox can write is hostile to the host side (the supervisor, ``warren
cp``, the service's file routes, TMPDIR clean-up, the git store): between two calls
it can replace any name there with a symlink to ``~/.bashrc``. So host code reaches
such places only from a directory descriptor it opened itself, with ``openat2``'s
``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`` (a path that leaves
the directory or passes a link fails with ``EXDEV``/``ELOOP`` instead of being
followed), names its temporary files with a random part (nothing to plant in advance),
and renames with both directory descriptors (the last component of a rename is never
followed).

Owns: those primitives. Must not decide what is trusted: the caller opens the root
directory it trusts (``open_dir``) and passes paths relative to it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterable, Iterator

from . import _sys

RESOLVE = _sys.RESOLVE_BENEATH | _sys.RESOLVE_NO_SYMLINKS | _sys.RESOLVE_NO_MAGICLINKS
_BASE = os.O_CLOEXEC | os.O_NOFOLLOW


def open_dir(path: str) -> int:
    """A descriptor of a directory the caller trusts by its full path (the workspace
    the user named, warren's own state directory). Its last component must not be a
    link."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | _BASE)


def open_beneath(dirfd: int, rel: str, flags: int, mode: int = 0o600) -> int:
    """``rel`` opened beneath ``dirfd``, never through a link or out of it.

    One entry of the directory (a name with no ``/``, not ``.`` or ``..``) is opened
    with plain ``openat`` and ``O_NOFOLLOW``: there is no component before it to pass
    through, so refusing a link as the last one is all the resolve flags would do, and
    the tree walks that open every directory of a workspace (the link scan, the
    repository walk) save a ctypes call per directory."""
    mode = mode if flags & os.O_CREAT else 0
    if rel and "/" not in rel and rel not in (".", ".."):
        return os.open(rel, flags | _BASE, mode, dir_fd=dirfd)
    return _sys.openat2(dirfd, rel or ".", flags | _BASE, mode, RESOLVE)


def dir_beneath(dirfd: int, rel: str) -> int:
    return open_beneath(dirfd, rel, os.O_RDONLY | os.O_DIRECTORY)


@contextlib.contextmanager
def listed(dirfd: int, rel: str) -> Iterator[tuple[int, list[str]]]:
    """The directory ``rel`` beneath ``dirfd``, open, and the names in it: listed before
    the block runs (which may then remove them), closed after it."""
    fd = dir_beneath(dirfd, rel)
    try:
        with os.scandir(fd) as entries:
            names = [e.name for e in entries]
        yield fd, names
    finally:
        os.close(fd)


def stays_beneath(dirfd: int, rel: str) -> bool:
    """Whether ``rel``, its links followed, stays beneath ``dirfd``: the deepest part of
    it that exists is opened ``O_PATH`` with ``RESOLVE_BENEATH`` (a link is followed only
    while it stays inside, never by an absolute target, never a magic link). A check,
    not an opening: what is then done with the path must be confined by other means
    (``warren sandboxd`` does it inside the sandbox)."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    while True:
        try:
            fd = _sys.openat2(
                dirfd,
                "/".join(parts) or ".",
                os.O_PATH | os.O_CLOEXEC,
                0,
                _sys.RESOLVE_BENEATH | _sys.RESOLVE_NO_MAGICLINKS,
            )
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR) and parts:
                parts.pop()
                continue
            if e.errno in (errno.EXDEV, errno.ELOOP):
                return False
            raise
        os.close(fd)
        return True


def split(rel: str) -> tuple[str, str]:
    """(parent, name) of a relative path; refuses names that are not one entry."""
    parent, _, name = rel.rstrip("/").rpartition("/")
    if name in ("", ".", ".."):
        raise OSError(errno.EINVAL, "not a file name", rel)
    return parent, name


@contextlib.contextmanager
def entry(dirfd: int, rel: str) -> Iterator[tuple[int, str]]:
    """The directory holding ``rel`` beneath ``dirfd``, open, and the entry's name in
    it (``split``): what acts on an entry itself, never through it; closed after."""
    parent, name = split(rel)
    pfd = dir_beneath(dirfd, parent)
    try:
        yield pfd, name
    finally:
        os.close(pfd)


def lstat_beneath(dirfd: int, rel: str) -> os.stat_result | None:
    """The entry ``rel`` itself (a link is not followed); None when it is missing."""
    with entry(dirfd, rel) as (pfd, name):
        try:
            return os.stat(name, dir_fd=pfd, follow_symlinks=False)
        except FileNotFoundError:
            return None


def read_file(dirfd: int, rel: str, limit: int) -> bytes:
    """The content of the regular file ``rel`` (at most ``limit`` bytes, else EFBIG).
    Its open never waits: a FIFO swapped in for the file after the caller looked
    (a sandbox may, in its workspace) is refused, not waited on by the supervisor."""
    fd = open_beneath(dirfd, rel, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", rel)
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            size += len(chunk)
            if size > limit:
                raise OSError(errno.EFBIG, f"larger than {limit} bytes", rel)
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def temp_name(name: str) -> str:
    """A name beside ``name`` that nobody can guess ahead."""
    return f".{name[:64]}.warren-{secrets.token_hex(8)}"


# A temporary file is claimed by its writer (``claim``: an flock held from just after
# its creation to its rename); the kernel drops the claim when the writer dies, however
# it dies. ``sweep`` removes the unclaimed ones a killed writer left beside ``name``
# (SIGKILL of a supervisor takes its sandboxes' helpers mid-write) when the next write
# of that name comes: across processes and pid namespaces alike, with no record kept.
# Only a file untouched for STALE_AFTER (mtime) is unclaimed for sure: its writer makes and
# claims it in two calls, and one frozen between them (a paused sandbox) must not lose
# its file; if one is, its rename fails and its write reports an error (the target is
# left as it was).
STALE_AFTER = 60.0


def claim(fd: int) -> None:
    """Hold the claim on a temporary file just created (released on close or death)."""
    import fcntl

    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def is_temp_of(entry: str, name: str) -> bool:
    prefix = f".{name[:64]}.warren-"
    rest = entry[len(prefix) :]
    return entry.startswith(prefix) and len(rest) == 16 and all(c in "0123456789abcdef" for c in rest)


def sweep(dirfd: int, name: str, opener: Callable[[str], int] | None = None) -> int:
    """Remove the unclaimed temporary files of ``name`` older than STALE_AFTER in the
    directory ``dirfd``; returns how many. ``opener`` opens an entry for reading (by
    default beneath ``dirfd``, never through a link)."""
    import fcntl
    import time

    removed = 0
    with contextlib.suppress(OSError), os.scandir(dirfd) as entries:
        stale = [e.name for e in entries if is_temp_of(e.name, name)]
    now = time.time()
    for entry in stale:
        try:
            fd = (opener or (lambda n: open_beneath(dirfd, n, os.O_RDONLY | os.O_NONBLOCK)))(entry)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or now - st.st_mtime < STALE_AFTER:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # claimed: its writer is alive
            now_there = os.stat(entry, dir_fd=dirfd, follow_symlinks=False)
            if (now_there.st_dev, now_there.st_ino) == (st.st_dev, st.st_ino):
                os.unlink(entry, dir_fd=dirfd)
                removed += 1
        except OSError:
            continue
        finally:
            os.close(fd)
    return removed


@contextlib.contextmanager
def new_file(dirfd: int, name: str) -> Iterator[int]:
    """A new file ``name`` in the directory ``dirfd`` (never there before: ``O_EXCL``,
    mode 0600), open read-write for the block to fill. If the block fails, the file is
    closed and removed; else its descriptor is the caller's to close."""
    fd = open_beneath(dirfd, name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        yield fd
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dirfd)
        raise


def write_atomic(
    dirfd: int,
    rel: str,
    data: bytes | Iterable[bytes],
    mode: int | None = None,
    fsync: bool = True,
) -> int:
    """Replace (or create) the file ``rel`` with ``data``: written to a fresh temporary
    file in the same directory, synced, then renamed over it. Any failure leaves the old
    file exactly as it was. The mode is ``mode``, else the old file's, else 0644.
    Returns the number of bytes written."""
    with entry(dirfd, rel) as (pfd, name):
        tmp = temp_name(name)
        if mode is None:
            try:
                old = os.stat(name, dir_fd=pfd, follow_symlinks=False)
                mode = stat.S_IMODE(old.st_mode) if stat.S_ISREG(old.st_mode) else 0o644
            except FileNotFoundError:
                mode = 0o644
        sweep(pfd, name)
        with new_file(pfd, tmp) as fd:
            claim(fd)
            written = _write_all(fd, data)
            os.fchmod(fd, mode)
            if fsync:
                os.fsync(fd)
        os.close(fd)
        try:
            os.rename(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=pfd)
            raise
        if fsync:
            with contextlib.suppress(OSError):
                os.fsync(pfd)
        return written


def write_in_place(dirfd: int, rel: str, data: bytes) -> None:
    """Overwrite the existing regular file ``rel`` keeping its inode (for a file some
    mount sits on, which a rename would detach). Not atomic: use ``write_atomic``
    wherever the inode may change."""
    fd = open_beneath(dirfd, rel, os.O_WRONLY)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", rel)
        _write_all(fd, data)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    finally:
        os.close(fd)


def unlink(dirfd: int, rel: str) -> bool:
    """Remove the entry ``rel`` (a link itself, never its target); False if missing."""
    with entry(dirfd, rel) as (pfd, name):
        try:
            os.unlink(name, dir_fd=pfd)
            return True
        except FileNotFoundError:
            return False


def remove_tree(dirfd: int, rel: str) -> bool:
    """Remove ``rel`` and everything beneath it without following any link (a link is
    removed as an entry). False if it was missing. A tree of any depth: see
    ``_empty_dir``."""
    with entry(dirfd, rel) as (pfd, name):
        try:
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if stat.S_ISDIR(st.st_mode):
            _empty_dir(pfd, name)
            os.rmdir(name, dir_fd=pfd)
        else:
            os.unlink(name, dir_fd=pfd)
        return True


# A sandbox can nest directories as deep as it likes (a loop of ``mkdir d; cd d`` knows
# no PATH_MAX). Host code walking such a tree therefore never recurses (Python stops at
# about a thousand frames: a RecursionError left the tree behind) and holds a bounded
# number of descriptors: removal moves what lies deeper than HELD levels up to the top
# of the tree it removes, copies refuse a tree deeper than MAX_DEPTH.
HELD = 64
MAX_DEPTH = 256
NAME_COST = 4096  # a name in a copy costs at least a block of its disk


def too_deep(rel: str) -> OSError:
    return OSError(errno.ELOOP, f"directories nested deeper than {MAX_DEPTH} levels", rel)


class _Level:
    """One directory of a removal: its descriptor, its name in the level above, and the
    names in it still to remove."""

    def __init__(self, fd: int, name: str) -> None:
        self.fd, self.name = fd, name
        self.names: list[str] = []


def _listing(fd: int) -> list[str]:
    with os.scandir(fd) as entries:
        return [e.name for e in entries]


def _open_to_empty(pfd: int, name: str) -> int:
    """The directory ``name`` of ``pfd`` opened for listing; one of the caller's that its
    mode keeps closed (a sandbox's ``chmod 000``, an overlay's work directory) is given
    the owner's rights first, through a descriptor of that very directory (a link put
    in its place is not opened: ``O_NOFOLLOW``)."""
    try:
        return open_beneath(pfd, name, os.O_RDONLY | os.O_DIRECTORY)
    except PermissionError:
        held = open_beneath(pfd, name, os.O_PATH | os.O_DIRECTORY)
        try:
            st = os.fstat(held)
            if st.st_uid != os.geteuid():
                raise
            os.chmod(f"/proc/self/fd/{held}", stat.S_IMODE(st.st_mode) | 0o700)
        finally:
            os.close(held)
        return open_beneath(pfd, name, os.O_RDONLY | os.O_DIRECTORY)


def _empty_dir(pfd: int, name: str) -> None:
    """Remove everything in the directory ``name`` of ``pfd`` (left there, empty)."""
    top = _open_to_empty(pfd, name)
    levels = [_Level(top, name)]
    try:
        _writable(top)
        levels[0].names = _listing(top)
        while levels:
            here = levels[-1]
            if not here.names:
                levels.pop()
                os.close(here.fd)
                if levels:  # ``here`` is empty now: its entry goes
                    with contextlib.suppress(FileNotFoundError):
                        os.rmdir(here.name, dir_fd=levels[-1].fd)
                continue
            child = here.names.pop()
            try:
                st = os.stat(child, dir_fd=here.fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if not stat.S_ISDIR(st.st_mode):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(child, dir_fd=here.fd)
                continue
            if len(levels) >= HELD:
                # Deeper than the descriptors held: the subtree moves up to the top
                # (a rename within the tree being removed) and is emptied from there.
                moved = temp_name(child)
                os.rename(child, moved, src_dir_fd=here.fd, dst_dir_fd=top)
                levels[0].names.append(moved)
                continue
            try:
                fd = _open_to_empty(here.fd, child)
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                    continue  # replaced meanwhile: it is an entry of ``here`` again
                raise
            level = _Level(fd, child)
            levels.append(level)
            _writable(fd)
            level.names = _listing(fd)
    finally:
        for level in levels:
            os.close(level.fd)


def _writable(fd: int) -> None:
    """A directory of the caller's whose mode keeps its own entries from being removed
    (a sandbox's ``chmod 500``, an image's 0555) is given the owner's rights first."""
    st = os.fstat(fd)
    if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o700 != 0o700:
        os.fchmod(fd, stat.S_IMODE(st.st_mode) | 0o700)


def copy_tree(src: int, dst: int, limit: int) -> int:
    """Copy what the directory ``src`` holds into the empty directory ``dst`` (one the
    caller made and nothing else writes) without following any link: directories and
    regular files are copied (modes without setuid/setgid, times kept; a file's data
    extents only: a hole stays a hole), a symlink is made again as a symlink, anything
    else (devices, sockets, fifos) is left out, and a file with several names becomes
    several files. Returns what the copy costs its disk: the data copied and a block
    (NAME_COST) per name made, so that a tree of a million empty files is not free;
    ``OSError`` (``EFBIG``) once that passes ``limit``, (``ELOOP``) for directories
    nested deeper than ``MAX_DEPTH``. A name replaced mid-copy is copied as what it then
    is, or left out: never followed."""
    from . import extents

    left = [limit]

    def charge(n: int) -> None:
        left[0] -= n
        if left[0] < 0:
            raise OSError(errno.EFBIG, "the tree is over the size limit of the copy")

    size = 0
    # Each level: (source, copy, names left, the source's stat to apply once done).
    levels: list[tuple[int, int, list[str], os.stat_result | None]] = [(src, dst, _listing(src), None)]
    try:
        while levels:
            s, d, names, st_dir = levels[-1]
            if not names:
                levels.pop()
                if st_dir is not None:
                    try:
                        os.chmod(d, stat.S_IMODE(st_dir.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
                        os.utime(d, ns=(st_dir.st_atime_ns, st_dir.st_mtime_ns))
                    finally:
                        os.close(s)
                        os.close(d)
                continue
            name = names.pop()
            try:
                st = os.stat(name, dir_fd=s, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                charge(NAME_COST)
                size += NAME_COST
            if stat.S_ISDIR(st.st_mode):
                if len(levels) > MAX_DEPTH:
                    raise too_deep(name)
                try:
                    sub = open_beneath(s, name, os.O_RDONLY | os.O_DIRECTORY)
                except OSError as e:
                    if e.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                        continue
                    raise
                try:
                    os.mkdir(name, 0o700, dir_fd=d)
                    copy = open_beneath(d, name, os.O_RDONLY | os.O_DIRECTORY)
                except BaseException:
                    os.close(sub)
                    raise
                levels.append((sub, copy, [], st))
                levels[-1][2].extend(_listing(sub))
            elif stat.S_ISREG(st.st_mode):
                size += _copy_file(s, d, name, extents.copy_data, charge)
            elif stat.S_ISLNK(st.st_mode):
                with contextlib.suppress(FileNotFoundError, OSError):
                    os.symlink(os.readlink(name, dir_fd=s), name, dir_fd=d)
    finally:
        for s, d, _names, st_dir in levels:
            if st_dir is not None:
                os.close(s)
                os.close(d)
    return size


def _copy_file(
    src: int,
    dst: int,
    name: str,
    copy_data: Callable[[int, int, Callable[[int], None]], int],
    charge: Callable[[int], None],
) -> int:
    try:
        s = open_beneath(src, name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ELOOP, errno.ENXIO):
            return 0
        raise
    try:
        st = os.fstat(s)
        if not stat.S_ISREG(st.st_mode):
            return 0  # replaced by something else meanwhile
        d = open_beneath(dst, name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            done = copy_data(s, d, charge)
            os.chmod(d, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
            os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns))
            return done
        finally:
            os.close(d)
    finally:
        os.close(s)


def _write_all(fd: int, data: bytes | Iterable[bytes]) -> int:
    chunks: Iterable[bytes] = (data,) if isinstance(data, bytes) else data
    total = 0
    for chunk in chunks:
        view = memoryview(chunk)
        while view:
            n = os.write(fd, view)
            view = view[n:]
            total += n
    return total


def exchange(dirfd: int, a: str, b: str) -> None:
    """Swap the entries ``a`` and ``b`` of the directory ``dirfd`` in one step
    (``renameat2(RENAME_EXCHANGE)``): neither is followed, and each name always names
    something — a caller can look at what it swapped out and swap back."""
    _sys.renameat2(dirfd, a, dirfd, b, _sys.RENAME_EXCHANGE)
