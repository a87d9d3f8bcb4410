"""Renames onto a protected git config (``server.gitstore``).

The kernel refuses a rename onto a mount point; PID 1 writes the source's content into
the protected file (the store) and removes the source, then tells the supervisor. Any
other rename goes on unchanged (``CONTINUE``): the mount is what protects, and the
kernel judges that itself when it runs the call, so a path or fd changed after the
broker looked cannot gain anything. Runs on the broker's own thread (one at a time:
two replacements never interleave their writes).
"""

from __future__ import annotations

import errno
import os
import stat

from .call import AT_FDCWD, Call, Outcome

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
MAX_CONFIG = 4 << 20


class Renames:
    def __init__(self, protected: dict[tuple[int, int], str]) -> None:
        self.protected = protected  # (dev, ino) of a protected file inside -> its git directory

    def handle(self, name: str, call: Call) -> tuple[Outcome, str | None]:
        """The outcome, and the git directory whose config was replaced, if any."""
        args: tuple[int, ...]
        if name == "rename":
            args = (AT_FDCWD, call.args[0], AT_FDCWD, call.args[1], 0)
        elif name == "renameat":
            args = (*call.args[:4], 0)
        else:
            args = tuple(call.args[:5])
        return self._renameat2(call, args)

    def _renameat2(self, call: Call, args: tuple[int, ...]) -> tuple[Outcome, str | None]:
        old_dir, old_ptr, new_dir, new_ptr, flags = args
        if not self.protected:
            return None, None
        old, new = call.string(old_ptr), call.string(new_ptr)
        if old is None or new is None:
            return None, None
        dst = call.parent(new_dir, new)
        if dst is None:
            return None, None
        dst_fd, dst_name = dst
        try:
            try:
                st = os.stat(dst_name, dir_fd=dst_fd, follow_symlinks=False)
            except OSError:
                return None, None
            gitdir = self.protected.get((st.st_dev, st.st_ino))
            if gitdir is None:
                return None, None
            if flags & RENAME_EXCHANGE:
                return -errno.EBUSY, None
            if flags & RENAME_NOREPLACE:
                return -errno.EEXIST, None
            result = self._replace(call, old_dir, old, dst_fd, dst_name)
            return result, gitdir if result == 0 else None
        finally:
            os.close(dst_fd)

    def _replace(self, call: Call, old_dir: int, old: bytes, dst_fd: int, dst_name: bytes) -> int:
        src = call.parent(old_dir, old)
        if src is None:
            return -errno.ENOENT
        src_fd, src_name = src
        try:
            a, b = os.fstat(src_fd), os.fstat(dst_fd)
            if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
                return -errno.EBUSY  # what the kernel says for a rename onto a mount point
            fd = os.open(src_name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=src_fd)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    return -errno.EBUSY
                if st.st_size > MAX_CONFIG:
                    return -errno.EFBIG
                data = os.read(fd, MAX_CONFIG + 1)
            finally:
                os.close(fd)
            out = os.open(dst_name, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dst_fd)
            try:
                os.write(out, data)
            finally:
                os.close(out)
            os.unlink(src_name, dir_fd=src_fd)
            return 0
        except OSError as e:
            return -(e.errno or errno.EIO)
        finally:
            os.close(src_fd)
