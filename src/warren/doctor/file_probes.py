"""The filesystem probes: the semantics developer tools rely on within one location
(create, rename, link, lock, map, xattrs, long and non-ASCII names) and between two
(hardlink or rename a file from a cache into the workspace).

Each works only inside the scratch directory it is given. Standard library only.
"""

from __future__ import annotations

import errno as _errno
import fcntl
import mmap
import os
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from . import _kernel
from .probe_base import ProbeFailure, _check, _mkdirs, _op, _read, _write, describe, j

# --- probes within one location ---------------------------------------------------


def create_file(d: str) -> str:
    _write(j(d, "f"))
    _check(_read(j(d, "f")) == b"warren-doctor\n", "read", "read back different bytes")
    return ""


def create_dir(d: str) -> str:
    _op("mkdir", os.mkdir, j(d, "sub"))
    _op("rmdir", os.rmdir, j(d, "sub"))
    return ""


def o_tmpfile(d: str) -> str:
    fd = _op("open(O_TMPFILE)", os.open, d, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    try:
        _op("write", os.write, fd, b"x")
        if not os.path.isdir("/proc/self/fd"):
            return "created; linking it into place not tried (/proc is not mounted)"
        # linkat(AT_SYMLINK_FOLLOW) through /proc/self/fd, as open(2) documents; plain
        # link() would try to link the /proc symlink itself and fail with EXDEV.
        procfd = os.open("/proc/self/fd", os.O_PATH | os.O_CLOEXEC)
        try:
            _op(
                "linkat(O_TMPFILE)", os.link, str(fd), j(d, "linked"), src_dir_fd=procfd, follow_symlinks=True
            )
        finally:
            os.close(procfd)
    finally:
        os.close(fd)
    return "created and linked into place"


def rename_same_dir(d: str) -> str:
    _write(j(d, "a"))
    _op("rename", os.rename, j(d, "a"), j(d, "b"), kind="file")
    return ""


def _file_across_dirs(d: str, operation: str, fn: Callable[[str, str], None]) -> str:
    """``fn`` (a rename or a link) from one directory into another."""
    _mkdirs(j(d, "x"), j(d, "y"))
    _write(j(d, "x", "f"))
    _op(operation, fn, j(d, "x", "f"), j(d, "y", "f"), kind="file")
    return ""


def rename_across_dirs(d: str) -> str:
    return _file_across_dirs(d, "rename", os.rename)


def renameat2_noreplace(d: str) -> str:
    _write(j(d, "a"))
    _write(j(d, "b"))
    try:
        _kernel.renameat2(j(d, "a"), j(d, "b"), _kernel.RENAME_NOREPLACE)
    except OSError as e:
        if e.errno != _errno.EEXIST:
            raise ProbeFailure("renameat2(NOREPLACE)", describe(e), e.errno, "file") from e
    else:
        raise ProbeFailure("renameat2(NOREPLACE)", "replaced an existing file it must not replace")
    _op(
        "renameat2(NOREPLACE)", _kernel.renameat2, j(d, "a"), j(d, "c"), _kernel.RENAME_NOREPLACE, kind="file"
    )
    return ""


def renameat2_exchange(d: str) -> str:
    _write(j(d, "a"), b"a")
    _write(j(d, "b"), b"b")
    _op("renameat2(EXCHANGE)", _kernel.renameat2, j(d, "a"), j(d, "b"), _kernel.RENAME_EXCHANGE, kind="file")
    _check(_read(j(d, "a")) == b"b", "renameat2(EXCHANGE)", "reported success but did not swap the files")
    return ""


def dir_rename(d: str) -> str:
    _mkdirs(j(d, "a"))
    _write(j(d, "a", "f"))
    _op("rename", os.rename, j(d, "a"), j(d, "b"), kind="dir")
    return ""


def dir_rename_across_dirs(d: str) -> str:
    _mkdirs(j(d, "x"), j(d, "x", "sub"), j(d, "y"))
    _write(j(d, "x", "sub", "f"))
    _op("rename", os.rename, j(d, "x", "sub"), j(d, "y", "sub"), kind="dir")
    return ""


def hardlink_same_dir(d: str) -> str:
    _write(j(d, "a"))
    _op("link", os.link, j(d, "a"), j(d, "b"), kind="file")
    _check(os.stat(j(d, "a")).st_nlink == 2, "stat", "link() succeeded but the link count is not 2")
    return ""


def hardlink_across_dirs(d: str) -> str:
    return _file_across_dirs(d, "link", os.link)


def symlink(d: str) -> str:
    _write(j(d, "target"))
    _op("symlink", os.symlink, "target", j(d, "link"))
    _check(os.readlink(j(d, "link")) == "target", "readlink", "the link reads back differently")
    _check(_read(j(d, "link")) == b"warren-doctor\n", "open", "opening through the link gave other bytes")
    return ""


def fsync(d: str) -> str:
    fd = _op("create", os.open, j(d, "f"), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        _op("write", os.write, fd, b"x")
        _op("fsync", os.fsync, fd)
    finally:
        os.close(fd)
    dfd = _op("open(dir)", os.open, d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _op("fsync(dir)", os.fsync, dfd)
    finally:
        os.close(dfd)
    return "file and directory"


@contextmanager
def _two_fds(path: str) -> Iterator[tuple[int, int]]:
    _write(path)
    a = _op("open", os.open, path, os.O_RDWR | os.O_CLOEXEC)
    b = _op("open", os.open, path, os.O_RDWR | os.O_CLOEXEC)
    try:
        yield a, b
    finally:
        os.close(a)
        os.close(b)


def flock(d: str) -> str:
    with _two_fds(j(d, "lock")) as (a, b):
        _op("flock", fcntl.flock, a, fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            fcntl.flock(b, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return "exclusive lock held and enforced"
        raise ProbeFailure("flock", "a second exclusive lock was granted: locks are not enforced here")


# struct flock: short l_type, short l_whence, off_t l_start, off_t l_len, pid_t l_pid (+ padding)
_FLOCK = "hhqqi4x"
_F_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", 37)


def fcntl_lock(d: str) -> str:
    with _two_fds(j(d, "lock")) as (a, b):
        _op("fcntl(F_SETLK)", fcntl.lockf, a, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.lockf(a, fcntl.LOCK_UN)
        wrlck = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        _op("fcntl(F_OFD_SETLK)", fcntl.fcntl, a, _F_OFD_SETLK, wrlck)
        try:
            fcntl.fcntl(b, _F_OFD_SETLK, wrlck)
        except OSError as e:
            if e.errno in (_errno.EAGAIN, _errno.EACCES):
                return "POSIX and OFD locks, conflicts enforced"
            raise ProbeFailure("fcntl(F_OFD_SETLK)", describe(e), e.errno) from e
        raise ProbeFailure(
            "fcntl(F_OFD_SETLK)", "a conflicting lock was granted: locks are not enforced here"
        )


def mmap_shared(d: str) -> str:
    with _two_fds(j(d, "map")) as (a, b):
        _op("ftruncate", os.ftruncate, a, mmap.PAGESIZE)
        m = _op(
            "mmap(MAP_SHARED)", mmap.mmap, a, mmap.PAGESIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE
        )
        try:
            m[:6] = b"mapped"
            _op("msync", m.flush)
        finally:
            m.close()
        _check(
            os.pread(b, 6, 0) == b"mapped", "pread", "writes through the mapping are not visible to read()"
        )
    return ""


def xattr_user(d: str) -> str:
    _write(j(d, "f"))
    _op("setxattr", os.setxattr, j(d, "f"), "user.warren-doctor", b"1")
    _check(os.getxattr(j(d, "f"), "user.warren-doctor") == b"1", "getxattr", "read back another value")
    return ""


def chmod_utimes(d: str) -> str:
    p = j(d, "f")
    _write(p)
    _op("chmod", os.chmod, p, 0o750)
    _check(os.stat(p).st_mode & 0o777 == 0o750, "stat", "chmod succeeded but the mode did not change")
    _op("utimes", os.utime, p, ns=(1_000_000_000, 1_500_000_000))
    _check(os.stat(p).st_mtime_ns == 1_500_000_000, "stat", "utimes succeeded but mtime did not change")
    return ""


def sparse_file(d: str) -> str:
    size = 8 << 20
    fd = _op("create", os.open, j(d, "sparse"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        _op("pwrite", os.pwrite, fd, b"x", size - 1)
        allocated = os.fstat(fd).st_blocks * 512
    finally:
        os.close(fd)
    _check(allocated < size // 2, "stat", f"an 8 MiB file with 1 byte written allocates {allocated} bytes")
    return f"8 MiB file allocates {allocated} bytes"


def long_path(d: str) -> str:
    # Six 199-byte components: the path below d is > 1,024 bytes (PATH_MAX is 4,096).
    parts = [f"{i}" + "p" * 198 for i in range(6)]
    fd = _op("open(dir)", os.open, d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            _op("mkdir", os.mkdir, part, dir_fd=fd)
            nfd = _op("open(dir)", os.open, part, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nfd
    finally:
        os.close(fd)
    full = j(d, *parts, "f")
    _write(full)
    _check(_read(full) == b"warren-doctor\n", "open", "read back different bytes through the long path")
    return f"{len(os.fsencode(full))}-byte path"


NON_ASCII = "naïve-Ünïcødé-日本語-🦀.txt"


def non_ascii_name(d: str) -> str:
    _write(j(d, NON_ASCII))
    _check(NON_ASCII in os.listdir(d), "readdir", "the name lists back differently")
    _op("rename", os.rename, j(d, NON_ASCII), j(d, "ß-" + NON_ASCII), kind="file")
    return ""


# --- probes between two locations -------------------------------------------------


def hardlink_between(src: str, dst: str) -> str:
    _write(j(src, "blob"))
    _op("link", os.link, j(src, "blob"), j(dst, "linked"), kind="file")
    return ""


def rename_between(src: str, dst: str) -> str:
    _write(j(src, "moving"))
    _op("rename", os.rename, j(src, "moving"), j(dst, "moved"), kind="file")
    return ""
