"""The few Linux calls the doctor needs that Python's standard library lacks, via ctypes.

The only module of the doctor that touches ctypes. The doctor must run anywhere with
nothing but the standard library, so it does not import ``warren._sys``; it prefers
glibc's wrappers (no syscall numbers) and returns ``None`` where a call is unavailable
instead of guessing. Raises ``OSError`` with the real errno; decides nothing.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long

AT_FDCWD = -100
STATX_MNT_ID = 0x1000
_STATX_SIZE = 256
_STATX_MNT_ID_OFFSET = 144

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2

IN_CREATE = 0x100
IN_MOVED_TO = 0x80
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_REC = 0x4000
MS_PRIVATE = 1 << 18

_NR_RENAMEAT2 = {"x86_64": 316, "aarch64": 276}
_NR_LANDLOCK_CREATE_RULESET = 444  # shared by every architecture since Linux 5.1
_LANDLOCK_CREATE_RULESET_VERSION = 1


def _raise(path: str | None = None, path2: str | None = None) -> None:
    err = ctypes.get_errno()
    raise OSError(err, os.strerror(err), path, None, path2)


def statx_mount_id(path: str) -> int | None:
    """The id of the mount ``path`` is on (as in /proc/self/mountinfo), or None."""
    fn = getattr(_libc, "statx", None)
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    buf = ctypes.create_string_buffer(_STATX_SIZE)
    if fn(AT_FDCWD, os.fsencode(path), 0, STATX_MNT_ID, buf) != 0:
        return None
    (mask,) = struct.unpack_from("I", buf, 0)
    if not mask & STATX_MNT_ID:
        return None
    (mnt_id,) = struct.unpack_from("Q", buf, _STATX_MNT_ID_OFFSET)
    return int(mnt_id)


def renameat2(old: str, new: str, flags: int) -> None:
    fn = getattr(_libc, "renameat2", None)
    o, n = os.fsencode(old), os.fsencode(new)
    if fn is not None:
        fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        fn.restype = ctypes.c_int
        r = int(fn(AT_FDCWD, o, AT_FDCWD, n, flags))
    else:
        nr = _NR_RENAMEAT2.get(platform.machine())
        if nr is None:
            raise OSError(38, "renameat2: no syscall number known for this architecture", old)
        r = int(_syscall(nr, AT_FDCWD, o, AT_FDCWD, n, ctypes.c_uint(flags)))
    if r != 0:
        _raise(old, new)


def landlock_abi() -> int:
    """The Landlock ABI the kernel offers, 0 when Landlock is absent or disabled."""
    r = _syscall(_NR_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(int(r), 0)


def inotify_init() -> int:
    fn = _libc.inotify_init1
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    fd = int(fn(IN_NONBLOCK | IN_CLOEXEC))
    if fd < 0:
        _raise()
    return fd


def inotify_add_watch(fd: int, path: str, mask: int) -> int:
    fn = _libc.inotify_add_watch
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    fn.restype = ctypes.c_int
    wd = int(fn(fd, os.fsencode(path), mask))
    if wd < 0:
        _raise(path)
    return wd


def unshare(flags: int) -> None:
    fn = _libc.unshare
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    if fn(flags) != 0:
        _raise()


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    fn = _libc.mount
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    fn.restype = ctypes.c_int
    enc = [None if v is None else os.fsencode(v) for v in (source, target, fstype, data)]
    if fn(enc[0], enc[1], enc[2], flags, enc[3]) != 0:
        _raise(target)
