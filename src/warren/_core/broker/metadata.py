"""Metadata calls (chmod, utimensat, xattrs) for a sandboxed process.

Landlock does not cover them, and a shared mount exposes the ancestors of the writable
roots (``chmod 0777 ~``). They are allowed on objects inside the writable roots and on
the private tmpfs only; elsewhere ``EROFS`` on a read-only mount, else ``EPERM``. The
broker resolves the path (or copies the fd) once, judges that object and changes that
object itself: nothing the process changes afterwards (its memory, its fd table) is
read again. The old ``utime``/``utimes``/``futimesat`` calls get ``ENOSYS`` (libc
uses ``utimensat``). None of this waits on anything the sandbox controls (``O_PATH``
opens, no reads of files), so it runs on the broker's own thread.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable

from .. import _sys
from .call import AT_EMPTY_PATH, AT_FDCWD, AT_SYMLINK_NOFOLLOW, Call, Outcome
from .places import Places

MAX_XATTR = 64 << 10


def _meta(places: Places, fd: int, act: str, *rest: object) -> Outcome:
    try:
        if not places.inside(fd):
            return places.refusal(fd)
        target = f"/proc/self/fd/{fd}"
        if act == "chmod":
            os.chmod(target, int(rest[0]))  # type: ignore[call-overload]
        elif act == "utimens":
            # Through the magic link to the object itself: the fd was opened with or
            # without O_NOFOLLOW as the call asked (a link itself: ``_link_times``).
            _sys.utimensat(target.encode(), rest[0], 0)  # type: ignore[arg-type]
        elif act == "setxattr":
            name, value, flags = rest
            os.setxattr(target, name, value, int(flags))  # type: ignore[arg-type, call-overload]
        elif act == "removexattr":
            os.removexattr(target, rest[0])  # type: ignore[arg-type]
        return 0
    except OSError as e:
        return -(e.errno or errno.EIO)
    finally:
        os.close(fd)


def _at_fd(places: Places, call: Call, fd_arg: int, act: str, *rest: object) -> Outcome:
    fd = call.their_fd(fd_arg)
    if fd < 0:
        return fd
    return _meta(places, fd, act, *rest)


def _at_path(
    places: Places, call: Call, dirfd: int, path_ptr: int, flags: int, act: str, *rest: object
) -> Outcome:
    path = call.string(path_ptr)
    if path is None:
        return -errno.EFAULT
    if not path:
        if not flags & AT_EMPTY_PATH:
            return -errno.ENOENT
        return _at_fd(places, call, dirfd, act, *rest)
    try:
        fd = os.open(
            call.resolve(dirfd, path),
            os.O_PATH | os.O_CLOEXEC | (os.O_NOFOLLOW if flags & AT_SYMLINK_NOFOLLOW else 0),
        )
    except OSError as e:
        return -(e.errno or errno.EIO)
    return _meta(places, fd, act, *rest)


def chmod(places: Places, call: Call) -> Outcome:
    return _at_path(places, call, AT_FDCWD, call.args[0], 0, "chmod", call.args[1] & 0o7777)


def fchmod(places: Places, call: Call) -> Outcome:
    return _at_fd(places, call, call.args[0], "chmod", call.args[1] & 0o7777)


def fchmodat(places: Places, call: Call) -> Outcome:
    return _at_path(places, call, call.args[0], call.args[1], 0, "chmod", call.args[2] & 0o7777)


def fchmodat2(places: Places, call: Call) -> Outcome:
    flags = call.args[3] & 0xFFFFFFFF
    return _at_path(places, call, call.args[0], call.args[1], flags, "chmod", call.args[2] & 0o7777)


def utimensat(places: Places, call: Call) -> Outcome:
    dirfd, path_ptr, times_ptr = call.args[:3]
    flags = call.args[3] & 0xFFFFFFFF
    times = call.read(times_ptr, 32) if times_ptr else None
    if times_ptr and times is None:
        return -errno.EFAULT
    if not path_ptr:  # futimens(dirfd, times)
        return _at_fd(places, call, dirfd, "utimens", times)
    if flags & AT_SYMLINK_NOFOLLOW:
        path = call.string(path_ptr)
        if path:
            done = _link_times(places, call, dirfd, path, times)
            if done is not None:
                return done
    return _at_path(places, call, dirfd, path_ptr, flags, "utimens", times)


def _link_times(places: Places, call: Call, dirfd: int, path: bytes, times: bytes | None) -> Outcome | None:
    """``utimensat(..., AT_SYMLINK_NOFOLLOW)`` on a symlink: its own times, set by name
    in its directory (the magic link of an fd would follow it). None: not a link."""
    try:
        fd = os.open(call.resolve(dirfd, path), os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        return -(e.errno or errno.EIO)
    try:
        if not stat.S_ISLNK(os.fstat(fd).st_mode):
            return None
        if not places.inside(fd):
            return places.refusal(fd)
    finally:
        os.close(fd)
    found = call.parent(dirfd, path)
    if found is None:
        return -errno.EINVAL
    pfd, name = found
    try:
        if not places.inside(pfd):
            return places.refusal(pfd)
        _sys.utimensat(f"/proc/self/fd/{pfd}/".encode() + name, times, AT_SYMLINK_NOFOLLOW)
        return 0
    except OSError as e:
        return -(e.errno or errno.EIO)
    finally:
        os.close(pfd)


def utime(places: Places, call: Call) -> Outcome:
    return -errno.ENOSYS


def setxattr(places: Places, call: Call, nofollow: int = 0) -> Outcome:
    name, value = call.string(call.args[1]), call.read(call.args[2], min(call.args[3], MAX_XATTR))
    if name is None or value is None:
        return -errno.EFAULT
    return _at_path(places, call, AT_FDCWD, call.args[0], nofollow, "setxattr", name, value, call.args[4])


def lsetxattr(places: Places, call: Call) -> Outcome:
    return setxattr(places, call, AT_SYMLINK_NOFOLLOW)


def fsetxattr(places: Places, call: Call) -> Outcome:
    name, value = call.string(call.args[1]), call.read(call.args[2], min(call.args[3], MAX_XATTR))
    if name is None or value is None:
        return -errno.EFAULT
    return _at_fd(places, call, call.args[0], "setxattr", name, value, call.args[4])


def removexattr(places: Places, call: Call, nofollow: int = 0) -> Outcome:
    name = call.string(call.args[1])
    if name is None:
        return -errno.EFAULT
    return _at_path(places, call, AT_FDCWD, call.args[0], nofollow, "removexattr", name)


def lremovexattr(places: Places, call: Call) -> Outcome:
    return removexattr(places, call, AT_SYMLINK_NOFOLLOW)


def fremovexattr(places: Places, call: Call) -> Outcome:
    name = call.string(call.args[1])
    if name is None:
        return -errno.EFAULT
    return _at_fd(places, call, call.args[0], "removexattr", name)


HANDLERS: dict[str, Callable[[Places, Call], Outcome]] = {
    "chmod": chmod,
    "fchmod": fchmod,
    "fchmodat": fchmodat,
    "fchmodat2": fchmodat2,
    "utimensat": utimensat,
    "utime": utime,
    "utimes": utime,
    "futimesat": utime,
    "setxattr": setxattr,
    "lsetxattr": lsetxattr,
    "fsetxattr": fsetxattr,
    "removexattr": removexattr,
    "lremovexattr": lremovexattr,
    "fremovexattr": fremovexattr,
}
