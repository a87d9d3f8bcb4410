"""Hard links into and out of a repository's shared git data: links, as on the host.

Inside a sandbox every repository's ``.git`` is warren's tree with the host's own
``objects``, ``refs``, ... bound in (``server.gitstore``). Each bind is a mount of its
own, and ``link()`` never crosses a mount: a local ``git clone`` of such a repository
got ``EXDEV`` and silently copied every object, where on the host it hardlinks them.
Both names lie on one host mount, though — the writable root's — where the git
directory's own directory is still reachable from a descriptor PID 1 opened before
warren's tree covered it (``mounts.git_under``). So for a link whose source or
destination directory is one of those bound directories, the broker makes the link
there: the same directory, reached on the mount the other name is on.

It grants nothing the caller lacks: both directories must be in a writable root (where
Landlock gives the caller link and refer rights), the directory it acts in must be
the very one the caller named (same device and inode, reached beneath the git
directory without following a link), and the file it links must be the one the
caller sees under that name (a file masked there — a denied file's stand-in over it —
is another inode, and is let go to the kernel, which refuses as before). Anything
else (no git data involved, a flag it does not handle) is the caller's own call.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable

from .. import safepath
from .call import AT_FDCWD, Call, Outcome
from .places import Places

AT_SYMLINK_FOLLOW = 0x400


class GitData:
    """The repositories' git directories: path inside -> (descriptor on the writable
    root's mount, the names of the subdirectories bound from the host)."""

    def __init__(self, dirs: dict[str, tuple[int, tuple[str, ...]]]) -> None:
        self.dirs = dirs

    def same_dir_beneath(self, fd: int) -> int | None:
        """An fd of the directory of ``fd``, reached on its git directory's own mount,
        when it lies in bound git data; None otherwise."""
        path = os.readlink(f"/proc/self/fd/{fd}")
        for top, (under, shared) in self.dirs.items():
            if not path.startswith(top + "/"):
                continue
            rel = path[len(top) + 1 :]
            if rel.split("/", 1)[0] not in shared:
                return None
            try:
                found = safepath.dir_beneath(under, rel)
            except OSError:
                return None
            a, b = os.fstat(found), os.fstat(fd)
            if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
                os.close(found)
                return None
            return found
        return None


def _same_file(dir_a: int, dir_b: int, name: bytes) -> bool:
    try:
        a = os.stat(name, dir_fd=dir_a, follow_symlinks=False)
        b = os.stat(name, dir_fd=dir_b, follow_symlinks=False)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _link(
    places: Places, git: GitData, call: Call, olddir: int, oldptr: int, newdir: int, newptr: int, flags: int
) -> Outcome:
    if flags:
        return None  # AT_SYMLINK_FOLLOW, AT_EMPTY_PATH: the kernel's own
    old, new = call.string(oldptr), call.string(newptr)
    if old is None or new is None:
        return -errno.EFAULT
    src = call.parent(olddir, old)
    if src is None:
        return None
    dst = call.parent(newdir, new)
    if dst is None:
        os.close(src[0])
        return None
    opened: list[int] = [src[0], dst[0]]
    try:
        src_under, dst_under = git.same_dir_beneath(src[0]), git.same_dir_beneath(dst[0])
        opened += [fd for fd in (src_under, dst_under) if fd is not None]
        if src_under is None and dst_under is None:
            return None  # no git data: the caller's own call, under Landlock
        if not (places.inside(src[0]) and places.inside(dst[0])):
            return None
        sdir = src[0] if src_under is None else src_under
        ddir = dst[0] if dst_under is None else dst_under
        if src_under is not None and not _same_file(src[0], src_under, src[1]):
            return None  # not what the caller sees there (a mask): the kernel answers
        try:
            os.link(src[1], dst[1], src_dir_fd=sdir, dst_dir_fd=ddir, follow_symlinks=False)
        except OSError as e:
            return -(e.errno or errno.EIO)
        return 0
    finally:
        for fd in opened:
            with contextlib.suppress(OSError):
                os.close(fd)


def handlers(git: GitData) -> dict[str, Callable[[Places, Call], Outcome]]:
    def link(places: Places, call: Call) -> Outcome:
        return _link(places, git, call, AT_FDCWD, call.args[0], AT_FDCWD, call.args[1], 0)

    def linkat(places: Places, call: Call) -> Outcome:
        a = call.args
        return _link(places, git, call, a[0], a[1], a[2], a[3], a[4] & 0xFFFFFFFF)

    return {"link": link, "linkat": linkat}
