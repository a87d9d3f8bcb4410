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
            times, flags = rest
            _sys.utimensat(target.encode(), times, int(flags))  # type: ignore[arg-type, call-overload]
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
    nofollow = flags & AT_SYMLINK_NOFOLLOW
    if not path_ptr:  # futimens(dirfd, times)
        return _at_fd(places, call, dirfd, "utimens", times, nofollow)
    return _at_path(places, call, dirfd, path_ptr, flags, "utimens", times, nofollow)


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
