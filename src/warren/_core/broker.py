"""PID 1's system-call broker: the renames a mount point refuses, done for the sandbox.

A repository's ``.git/config`` inside a sandbox is a bind of warren's store of it
(``server.gitstore``). Git replaces it by renaming ``config.lock`` onto it, and the
kernel refuses to rename onto a mount point (EBUSY). So every process of a sandbox
with a protected repository carries a second seccomp filter sending the rename family
here, to PID 1 (user notification):

- a rename whose target is not a protected file goes on as the kernel would do it
  (``CONTINUE``). This is safe even though the process could change the path in its
  memory after the check: the protection is the mount, which the kernel enforces for
  whatever path it then reads — the broker only adds fidelity, never grants access.
- a rename of a regular file in the same directory onto a protected file is performed
  here: its content is written into the protected file (the store) and the source is
  removed — what the rename would have shown. PID 1 reads the source as the process
  could (same directory, no symlinks followed, no capabilities: a file mode-000 to the
  caller stays unreadable), and then tells the supervisor, which brings the host's
  config in step with the keys that cannot run anything.

PID 1 itself makes no renames (it would wait on itself).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from ..plan import seccomp as _seccomp
from . import _sys

AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
MAX_CONFIG = 4 << 20


class Broker:
    def __init__(self, listener: int, protected: dict[tuple[int, int], str]) -> None:
        self.listener = listener
        self.protected = protected  # (dev, ino) of the file inside -> its git directory
        self.names = _seccomp.RENAME_NR[os.uname().machine]

    @classmethod
    def start(cls, gitdirs: list[str]) -> Broker | None:
        """In PID 1 after setup (no_new_privs already set): the notification filter on
        itself, inherited by everything it forks."""
        protected: dict[tuple[int, int], str] = {}
        for gitdir in gitdirs:
            with contextlib.suppress(OSError):
                st = os.stat(os.path.join(gitdir, "config"))
                protected[(st.st_dev, st.st_ino)] = gitdir
        if not protected:
            return None
        listener = _sys.SeccompProgram(_seccomp.notify_program()).install_listener()
        return cls(listener, protected)

    def handle(self) -> str | None:
        """Answer one notification; the git directory whose config it replaced, if any."""
        try:
            nid, pid, nr, args = _sys.notif_recv(self.listener)
        except OSError:
            return None  # the caller died (or was interrupted) before we read it
        error: int | None = None
        changed: str | None = None
        try:
            error, changed = self._rename(nid, pid, self.names.get(nr, ""), args)
        except Exception:
            error = None  # anything unexpected: the kernel decides, the mount protects
        with contextlib.suppress(OSError):
            if error is None:
                _sys.notif_send(self.listener, nid, cont=True)
            else:
                _sys.notif_send(self.listener, nid, error=error)
        return changed if error == 0 else None

    def _rename(self, nid: int, pid: int, name: str, args: tuple[int, ...]) -> tuple[int | None, str | None]:
        if name == "rename":
            old_dir, old_ptr, new_dir, new_ptr, flags = AT_FDCWD, args[0], AT_FDCWD, args[1], 0
        elif name in ("renameat", "renameat2"):
            old_dir, old_ptr, new_dir, new_ptr = _int(args[0]), args[1], _int(args[2]), args[3]
            flags = args[4] & 0xFFFFFFFF if name == "renameat2" else 0
        else:
            return None, None
        mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        try:
            old, new = _string(mem, old_ptr), _string(mem, new_ptr)
        finally:
            os.close(mem)
        if not _sys.notif_valid(self.listener, nid):
            return None, None  # not the same process any more: nothing to do for it
        if old is None or new is None:
            return None, None
        dst = _parent(pid, new_dir, new)
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
                return errno.EBUSY, None
            if flags & RENAME_NOREPLACE:
                return errno.EEXIST, None
            return self._replace(pid, old_dir, old, dst_fd, dst_name), gitdir
        finally:
            os.close(dst_fd)

    def _replace(self, pid: int, old_dir: int, old: bytes, dst_fd: int, dst_name: bytes) -> int:
        src = _parent(pid, old_dir, old)
        if src is None:
            return errno.ENOENT
        src_fd, src_name = src
        try:
            a, b = os.fstat(src_fd), os.fstat(dst_fd)
            if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
                return errno.EBUSY  # what the kernel says for a rename onto a mount point
            try:
                fd = os.open(src_name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=src_fd)
            except OSError as e:
                return e.errno or errno.EIO
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    return errno.EBUSY
                if st.st_size > MAX_CONFIG:
                    return errno.EFBIG
                data = os.read(fd, MAX_CONFIG + 1)
            finally:
                os.close(fd)
            out = os.open(dst_name, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW, dir_fd=dst_fd)
            try:
                os.write(out, data)
            finally:
                os.close(out)
            os.unlink(src_name, dir_fd=src_fd)
            return 0
        except OSError as e:
            return e.errno or errno.EIO
        finally:
            os.close(src_fd)


def _int(value: int) -> int:
    """A directory fd argument: the low 32 bits, signed."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _string(mem: int, address: int) -> bytes | None:
    out = b""
    try:
        while len(out) < 4096:
            chunk = os.pread(mem, 256, address + len(out))
            if not chunk:
                return None
            end = chunk.find(b"\0")
            if end >= 0:
                return out + chunk[:end]
            out += chunk
    except (OSError, OverflowError, ValueError):
        return None
    return None


def _parent(pid: int, dirfd: int, path: bytes) -> tuple[int, bytes] | None:
    """An fd of the directory ``path`` names its last component in, resolved as the
    process resolves it (its cwd or its dirfd), and that last component."""
    if not path:
        return None
    head, _, tail = path.rstrip(b"/").rpartition(b"/")
    if tail in (b"", b".", b".."):
        return None
    if path.startswith(b"/"):
        base = b"/"
    elif dirfd == AT_FDCWD:
        base = f"/proc/{pid}/cwd/".encode()
    else:
        base = f"/proc/{pid}/fd/{dirfd}/".encode()
    where = base + head if head or path.startswith(b"/") else base
    try:
        fd = os.open(where or b"/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    return fd, tail
