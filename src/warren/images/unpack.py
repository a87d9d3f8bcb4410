"""Unpacking one layer tar into a fresh directory, trusting nothing in the archive.

A layer is a tar stream (plain, gzip, bzip2 or xz) from an archive someone else made.
Every member is judged before anything is written for it:

- its name is normalized; an absolute name or one with a ``..`` component is refused;
- everything is created from a descriptor of the layer's own directory with
  ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`` (``safepath``), so a symlink the
  archive planted earlier (``lib -> /etc``) is never passed through: a later
  ``lib/x`` is refused, not written to the host;
- a symlink is kept as it is: its target is data inside the image (an absolute target
  means the image's own root), and the unpacker never follows one;
- a hard link may only name an earlier member of the same layer;
- device nodes are made only for a root caller that allows them (else skipped, with a
  warning line); setuid/setgid bits are kept only for root; the archive's owners are
  kept for no one: everything belongs to the caller, as a sandbox maps one id (its
  root, or the image's user) to the caller (as rootless containers do) and a file of
  any other owner would be nobody's inside, unreadable where its mode says so (apt's
  ``_apt``-owned lists);
- file sizes count against a budget (``Budget``): a member larger than what is left is
  refused before its data is read; runs of zeros are written as holes (a file of zeros
  costs the store nothing);
- ``user.overlay.*`` attributes in the archive are dropped (they would steer the
  overlay mount); only the whiteouts below set one.

OCI whiteouts become what an unprivileged overlay mount (``userxattr``) reads:
``.wh.NAME`` a 0/0 character device ``NAME`` (any user may make one since Linux 5.8),
``.wh..wh..opq`` the attribute ``user.overlay.opaque=y`` on its directory.

Directories are made owner-writable while the layer is unpacked and get their modes
and times last (deepest first). ``unpack`` returns the sha256 of the uncompressed tar
(the layer's diff id) and of the bytes read (the blob's digest): the caller compares
them with what the archive's config and manifest say.
"""

from __future__ import annotations

import bz2
import contextlib
import errno
import gzip
import hashlib
import io
import lzma
import os
import queue
import stat
import tarfile
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from .._core import safepath
from ..errors import ImageError

DEFAULT_MAX_SIZE = 32 << 30  # bytes of file data in one import: larger than any sane image
MAX_ENTRIES = 2_000_000
CHUNK = 1 << 20
# A run of zeros this long in a member's data is left a hole: a layer of a file of zeros
# (a disk image, or a gzip bomb: 32 GiB of zeros is 32 MiB of gzip) costs the store what
# it holds, not its size, as a snapshot's copy does (``_core.extents``).
HOLE = 1 << 16
_ZEROS = bytes(HOLE)
OPAQUE = ".wh..wh..opq"
WHITEOUT = ".wh."
_DIR_MODE = 0o700
HINT = "the archive is damaged or was made to escape: get the image from its source again"


@dataclass
class Budget:
    """What one import may still write: bytes of file data and entries."""

    max_size: int = DEFAULT_MAX_SIZE
    used: int = 0
    entries: int = 0

    def take(self, name: str, size: int) -> None:
        self.entries += 1
        if self.entries > MAX_ENTRIES:
            raise ImageError(
                f"the image has more than {MAX_ENTRIES} entries",
                operation="image import",
                path=name,
                hint=HINT,
            )
        if size > self.max_size - self.used:
            raise ImageError(
                f"layer entry {name!r} is {size} bytes: the image would exceed --max-size "
                f"({self.max_size} bytes, {self.used} used)",
                operation="image import",
                path=name,
                errno=errno.EFBIG,
                hint="raise --max-size if you trust this image",
            )
        self.used += size


@dataclass
class Digests:
    diff_id: str  # sha256 of the uncompressed tar: "sha256:<hex>"
    blob: str  # sha256 of the bytes read (the compressed blob)
    size: int  # bytes of file data written
    warnings: list[str] = field(default_factory=list)


class _Hasher:
    """sha256 of what is fed in, computed on a thread of its own: ``hashlib`` lets go
    of the GIL while it hashes, so hashing overlaps the unpacking."""

    def __init__(self) -> None:
        self.hash = hashlib.sha256()
        self.queue: queue.Queue[bytes | None] = queue.Queue(maxsize=16)
        self.thread = threading.Thread(target=self._run, name="warren-sha256", daemon=True)
        self.thread.start()
        self.result = ""

    def _run(self) -> None:
        while (chunk := self.queue.get()) is not None:
            self.hash.update(chunk)

    def update(self, data: bytes) -> None:
        self.queue.put(data)

    def digest(self) -> str:
        if not self.result:
            self.close()
            self.result = "sha256:" + self.hash.hexdigest()
        return self.result

    def close(self) -> None:
        if self.thread.is_alive():
            self.queue.put(None)
            self.thread.join()


class _Hashing(io.RawIOBase):
    """A reader that hashes what passes through and counts it."""

    def __init__(self, inner: IO[bytes], on_read: Callable[[int], None] | None = None) -> None:
        self.inner = inner
        self.hash = _Hasher()
        self.count = 0
        self.on_read = on_read

    def readable(self) -> bool:
        return True

    def readinto(self, buf: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.inner.read(len(buf))
        n = len(data)
        buf[:n] = data
        if n:
            self.hash.update(data)
            self.count += n
            if self.on_read is not None:
                self.on_read(n)
        return n

    def drain(self) -> None:
        while self.read(CHUNK):
            pass

    def digest(self) -> str:
        return self.hash.digest()

    def close(self) -> None:
        self.hash.close()
        super().close()


class _Forward:
    """The layer stream, as a file tarfile may treat as seekable (its ``r:`` mode reads
    members with no copy through a buffer of its own, unlike its stream mode): reading
    members in order it only ever seeks forward, and the bytes a seek skips are read
    (so hashed). A seek backwards is refused."""

    def __init__(self, inner: IO[bytes]) -> None:
        self.inner = inner
        self.pos = 0

    def read(self, n: int | None = -1) -> bytes:
        data = self.inner.read(n if n is not None and n >= 0 else -1)
        self.pos += len(data)
        return data

    def tell(self) -> int:
        return self.pos

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        if whence == os.SEEK_CUR:
            pos += self.pos
        elif whence != os.SEEK_SET or pos < self.pos:
            raise OSError(errno.ESPIPE, "a layer is read once, in order")
        while self.pos < pos and self.read(min(CHUNK, pos - self.pos)):
            pass
        return self.pos


_HEADER_TYPES = (
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
)
MAX_HEADER = 1 << 20  # a pax or GNU long-name header is read whole: bounded
MAX_TRAILER = 1 << 20  # bytes after the end of the tar (hashed, so read) in one layer


class _TarInfo(tarfile.TarInfo):
    """tarfile's member, refusing an extended header larger than MAX_HEADER before
    tarfile reads it into memory."""

    def _proc_member(self, tf: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _HEADER_TYPES and self.size > MAX_HEADER:
            raise refuse(f"a tar header of {self.size} bytes (at most {MAX_HEADER})", self.name)
        return super()._proc_member(tf)  # type: ignore[misc,no-any-return]


def refuse(message: str, name: str, err: int | None = None) -> ImageError:
    return ImageError(message, operation="image import", path=name, errno=err, hint=HINT)


def clean_name(name: str) -> str:
    """The member's path relative to the layer ("" for its root); refuses an absolute
    name and any ``..``."""
    if name.startswith("/"):
        raise refuse(f"layer entry {name!r} has an absolute path", name)
    if "\0" in name:
        raise refuse(f"layer entry {name!r} has a NUL byte in its name", name)
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise refuse(f"layer entry {name!r} leaves the layer ('..')", name)
    return "/".join(parts)


def _decompressed(raw: io.BufferedReader[Any]) -> IO[bytes]:
    magic = raw.peek(6)[:6]
    if magic[:2] == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if magic[:3] == b"BZh":
        return bz2.BZ2File(raw)
    if magic[:6] == b"\xfd7zXZ\x00":
        return lzma.LZMAFile(raw)
    if magic[:4] == b"\x28\xb5\x2f\xfd":
        raise ImageError(
            "the layer is zstd-compressed, which warren cannot read yet",
            operation="image import",
            hint="save the image with gzip or uncompressed layers (podman save --format docker-archive)",
        )
    return raw


class _Layer:
    """The state of one layer being unpacked into ``root`` (a descriptor)."""

    def __init__(self, root: int, budget: Budget, as_root: bool, allow_devices: bool) -> None:
        self.root = root
        self.budget = budget
        self.as_root = as_root
        self.allow_devices = allow_devices
        self.dirs: dict[str, int] = {}  # open descriptors of directories made here
        self.dir_meta: dict[str, tarfile.TarInfo] = {}
        self.implicit: set[str] = {""}  # directories the tar only implies: 0755, like tar -x
        self.entries: set[str] = set()  # non-directories written, for hard links
        self.warnings: list[str] = []

    def close(self) -> None:
        for fd in self.dirs.values():
            os.close(fd)
        self.dirs.clear()

    # -- directories ------------------------------------------------------------------

    def dir(self, rel: str) -> int:
        """A descriptor of the directory ``rel`` of the layer, made (with its parents)
        if missing; never through a link."""
        if rel == "":
            return self.root
        fd = self.dirs.get(rel)
        if fd is not None:
            return fd
        parent, _, name = rel.rpartition("/")
        pfd = self.dir(parent)
        try:
            fd = _open_entry(pfd, name, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            os.mkdir(name, _DIR_MODE, dir_fd=pfd)
            fd = _open_entry(pfd, name, os.O_RDONLY | os.O_DIRECTORY)
            self.implicit.add(rel)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EXDEV):
                raise refuse(
                    f"layer entry {rel!r} is a link: nothing is written through it", rel, e.errno
                ) from None
            if e.errno == errno.ENOTDIR:
                raise refuse(f"layer entry {rel!r} is not a directory", rel, e.errno) from None
            raise
        self.dirs[rel] = fd
        return fd

    def forget(self, rel: str) -> None:
        """``rel`` was replaced: its descriptors (and those beneath it) are stale."""
        for key in [k for k in self.dirs if k == rel or k.startswith(rel + "/")]:
            os.close(self.dirs.pop(key))
        for key in [k for k in self.dir_meta if k == rel or k.startswith(rel + "/")]:
            del self.dir_meta[key]
        self.implicit -= {k for k in self.implicit if k == rel or k.startswith(rel + "/")}

    def clear(self, pfd: int, name: str, rel: str, keep_dir: bool = False) -> bool:
        """Make room for a new entry ``name``: an older one of the same name goes (tar's
        rule: the later member wins). True if a directory was kept."""
        try:
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if stat.S_ISDIR(st.st_mode):
            if keep_dir:
                return True
            self.forget(rel)
            remove_tree(pfd, name)
        else:
            os.unlink(name, dir_fd=pfd)
        self.entries.discard(rel)
        return False

    # -- members ----------------------------------------------------------------------

    def add(self, tf: tarfile.TarFile, m: tarfile.TarInfo) -> None:
        if len(self.dirs) > 256:
            self.close()  # only between members: no descriptor of this one is in use
        rel = clean_name(m.name)
        self.budget.take(rel or ".", m.size if m.isreg() else 0)
        if rel == "":
            if m.isdir():
                self.dir_meta[""] = m
            return
        parent, _, name = rel.rpartition("/")
        if name == OPAQUE:
            os.setxattr(self.dir(parent), "user.overlay.opaque", b"y")
            return
        if name.startswith(WHITEOUT):
            hidden = name[len(WHITEOUT) :]
            if hidden.startswith(WHITEOUT) or hidden in ("", ".", ".."):
                return  # aufs bookkeeping (.wh..wh.plnk ...): nothing of the image
            pfd = self.dir(parent)
            target = f"{parent}/{hidden}" if parent else hidden
            self.clear(pfd, hidden, target)
            os.mknod(hidden, stat.S_IFCHR | 0o000, os.makedev(0, 0), dir_fd=pfd)
            self.entries.add(target)
            return
        pfd = self.dir(parent)
        if m.isdir():
            if not self.clear(pfd, name, rel, keep_dir=True):
                os.mkdir(name, _DIR_MODE, dir_fd=pfd)
            self.dir_meta[rel] = m
            return
        if m.isreg():
            self.file(tf, m, pfd, name, rel)
        elif m.issym():
            self.clear(pfd, name, rel)
            os.symlink(m.linkname, name, dir_fd=pfd)
            self.finish(pfd, name, m, link=True)
        elif m.islnk():
            self.clear(pfd, name, rel)
            self.hardlink(m, pfd, name, rel)
        elif m.isfifo():
            self.clear(pfd, name, rel)
            os.mkfifo(name, self.mode(m), dir_fd=pfd)
            self.finish(pfd, name, m)
        elif m.ischr() or m.isblk():
            if not (self.as_root and self.allow_devices):
                why = "warren is not running as root" if not self.as_root else "devices were not allowed"
                self.warnings.append(f"skipped device node /{rel} ({why})")
                return
            kind = stat.S_IFCHR if m.ischr() else stat.S_IFBLK
            self.clear(pfd, name, rel)
            os.mknod(name, kind | self.mode(m), os.makedev(m.devmajor, m.devminor), dir_fd=pfd)
            self.finish(pfd, name, m)
        else:
            self.warnings.append(f"skipped /{rel}: tar member type {m.type!r} is not a file")
            return
        self.entries.add(rel)

    def file(self, tf: tarfile.TarFile, m: tarfile.TarInfo, pfd: int, name: str, rel: str) -> None:
        src = tf.extractfile(m)
        assert src is not None
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        try:
            fd = _open_entry(pfd, name, flags, 0o600)
        except FileExistsError:
            self.clear(pfd, name, rel)
            fd = _open_entry(pfd, name, flags, 0o600)
        try:
            left = m.size
            while left > 0:
                chunk = src.read(min(CHUNK, left))
                if not chunk:
                    raise refuse(f"layer entry {rel!r} is cut short", rel)
                _write_at(fd, m.size - left, chunk)
                left -= len(chunk)
            os.ftruncate(fd, m.size)  # a trailing hole
            os.fchmod(fd, self.mode(m))
            if m.pax_headers:
                _xattrs(fd, m, self.as_root)
            os.utime(fd, ns=(_ns(m), _ns(m)))
        finally:
            os.close(fd)

    def hardlink(self, m: tarfile.TarInfo, pfd: int, name: str, rel: str) -> None:
        target = clean_name(m.linkname)
        if target not in self.entries:
            raise refuse(
                f"layer entry {rel!r} is a hard link to {m.linkname!r}: not an earlier entry of the layer",
                rel,
            )
        tparent, _, tname = target.rpartition("/")
        os.link(tname, name, src_dir_fd=self.dir(tparent), dst_dir_fd=pfd, follow_symlinks=False)

    def mode(self, m: tarfile.TarInfo) -> int:
        return m.mode & (0o7777 if self.as_root else 0o1777)

    def finish(self, pfd: int, name: str, m: tarfile.TarInfo, link: bool = False) -> None:
        if not link:
            os.chmod(name, self.mode(m), dir_fd=pfd)
        os.utime(name, ns=(_ns(m), _ns(m)), dir_fd=pfd, follow_symlinks=False)

    def finish_dirs(self) -> None:
        """Modes, owners, attributes and times of directories, deepest first (a
        directory's time changes as entries are made in it; a mode without the owner's
        write bit would have stopped them)."""
        self.close()
        for rel in self.implicit - set(self.dir_meta):
            fd = safepath.dir_beneath(self.root, rel) if rel else os.dup(self.root)
            try:
                os.fchmod(fd, 0o755)
            finally:
                os.close(fd)
        for rel in sorted(self.dir_meta, key=lambda r: r.count("/") + (r != ""), reverse=True):
            m = self.dir_meta[rel]
            fd = safepath.dir_beneath(self.root, rel) if rel else os.dup(self.root)
            try:
                _xattrs(fd, m, self.as_root)
                os.fchmod(fd, self.mode(m))
                os.utime(fd, ns=(_ns(m), _ns(m)))
            finally:
                os.close(fd)


def _write_at(fd: int, offset: int, chunk: bytes) -> None:
    """``chunk`` at ``offset`` of a new file, its aligned blocks of zeros left holes."""
    start = 0
    while start < len(chunk):
        stop = min(start + HOLE - (offset + start) % HOLE, len(chunk))
        block = chunk[start:stop]
        if block != _ZEROS:
            view = memoryview(block)
            done = 0
            while done < len(view):
                done += os.pwrite(fd, view[done:], offset + start + done)
        start = stop


def _open_entry(pfd: int, name: str, flags: int, mode: int = 0) -> int:
    """``name``, one entry of the directory ``pfd`` (no "/" in it), never a link: a
    single component needs no ``openat2`` (``O_NOFOLLOW`` refuses a link there, and
    ``O_CREAT | O_EXCL`` never follows one)."""
    return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=pfd)


def _ns(m: tarfile.TarInfo) -> int:
    return int(m.mtime * 1_000_000_000)


def _xattrs(fd: int, m: tarfile.TarInfo, as_root: bool) -> None:
    for key, value in m.pax_headers.items():
        if not key.startswith("SCHILY.xattr."):
            continue
        attr = key[len("SCHILY.xattr.") :]
        if attr.startswith("user.overlay."):
            continue  # would steer the overlay mount: only our whiteouts set these
        if attr.startswith("user.") or (as_root and attr == "security.capability"):
            with contextlib.suppress(OSError):  # a filesystem without user xattrs: the data is still right
                os.setxattr(fd, attr, value.encode("utf-8", "surrogateescape"))


def unpack(
    stream: IO[bytes],
    root: int,
    budget: Budget,
    *,
    as_root: bool,
    allow_devices: bool = False,
    on_read: Callable[[int], None] | None = None,
) -> Digests:
    """Unpack the layer tar read from ``stream`` into the empty directory ``root`` (a
    descriptor). Raises ``ImageError`` for anything hostile or damaged; the caller
    removes the directory then."""
    blob = _Hashing(stream, on_read)
    raw = io.BufferedReader(blob, CHUNK)
    layer = _Layer(root, budget, as_root, allow_devices)
    plain = blob  # an uncompressed layer: its blob is its tar (hashed once)
    try:
        tar_in: IO[bytes] = raw
        decompressed = _decompressed(raw)
        if decompressed is not raw:
            plain = _Hashing(decompressed)
            tar_in = io.BufferedReader(plain, CHUNK)
        forward = _Forward(tar_in)
        with tarfile.open(fileobj=forward, mode="r:", tarinfo=_TarInfo) as tf:  # type: ignore[call-overload]
            for member in tf:
                try:
                    layer.add(tf, member)
                except (ImageError, gzip.BadGzipFile, EOFError):
                    raise
                except OSError as e:
                    if e.errno in (errno.ELOOP, errno.EXDEV):
                        raise refuse(
                            f"layer entry {member.name!r} would be written through a link",
                            member.name,
                            e.errno,
                        ) from None
                    raise ImageError.from_os(
                        e,
                        f"cannot unpack layer entry {member.name!r}",
                        "image import",
                        member.name,
                        hint="check free space in the image store, or the archive",
                    ) from None
        layer.finish_dirs()
        for stream_ in (forward, raw):  # what follows the end-of-archive blocks is hashed too
            trailer = 0
            while chunk := stream_.read(CHUNK):
                trailer += len(chunk)
                if trailer > MAX_TRAILER:
                    raise refuse(f"the layer goes on for more than {MAX_TRAILER} bytes after its end", "")
        return Digests(plain.digest(), blob.digest(), budget.used, layer.warnings)
    except (tarfile.TarError, EOFError, gzip.BadGzipFile, lzma.LZMAError, zlib.error) as e:
        raise refuse(f"the layer is not a valid tar stream: {e}", "") from None
    finally:
        layer.close()
        plain.close()
        blob.close()


def remove_tree(pfd: int, name: str) -> None:
    """Remove ``name`` beneath ``pfd`` and everything in it, never through a link, also
    where a layer's directory lacks the owner's write bit (0555 is common in images),
    however deep it nests (``safepath.remove_tree``)."""
    safepath.remove_tree(pfd, name)
