"""PID 1's system-call broker: calls the kernel cannot judge by their arguments alone.

Every process of a sandbox carries a second seccomp filter that sends a few calls here,
to PID 1, as user notifications (``plan.seccomp.notify_program``). PID 1 reads what the
process asked for, resolves it as the process would (its cwd, its fds, the same mount
view), decides, and answers. Where allowing a call could be turned into something else
by the process changing its memory after the check (another thread rewriting the path
or address), PID 1 does not let the kernel re-read it: it performs the call itself on
what it checked — a copy of the process's fd (``pidfd_getfd``) or an ``O_PATH`` fd of
the resolved object — and returns the result. ``CONTINUE`` is used only where nothing
the process controls can change the outcome.

- **Unix sockets** (``connect``; ``sendto``/``sendmsg`` with an address): Landlock
  covers pathname sockets only from ABI 9, so a sandbox could reach a host socket
  outside the hidden directories. A socket not of ``AF_UNIX`` goes on unchanged (its
  family is fixed at creation). For ``AF_UNIX`` a pathname socket may be reached only
  inside the writable roots or the sandbox's private ``/tmp`` and ``/dev/shm``;
  anything else gets ``EACCES``. Abstract addresses stay in the sandbox's own network
  namespace. ``sendmsg`` with ancillary data on an unconnected datagram socket, and
  ``sendmmsg`` on unix datagram sockets, are refused (``EPERM``): they are not brokered.
- **Metadata** (chmod, utimensat, xattrs): Landlock does not cover them, and a shared
  mount exposes the ancestors of the writable roots (``chmod 0777 ~``). They are allowed
  on objects inside the writable roots and on the private tmpfs only; elsewhere
  ``EROFS`` on a read-only mount, else ``EPERM``. The old ``utime``/``utimes``/
  ``futimesat`` calls get ``ENOSYS`` (libc uses ``utimensat``).
- **Renames onto a protected git config** (``server.gitstore``): the kernel refuses a
  rename onto a mount point; PID 1 writes the source's content into the protected file
  (the store) and removes the source, then tells the supervisor. Any other rename goes
  on unchanged: the mount is what protects, so a changed path cannot gain anything.

The broker is a thread of PID 1 started before the filter is installed: a filter
installed without TSYNC binds only the installing thread (PID 1's main thread, which
forks everything else) and its later children, so the broker's own calls — the ones
it makes for the sandbox — are never brokered. PID 1's own calls and those of its
helpers (warren's code) are answered "go on".
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
import struct
import threading
from collections.abc import Callable, Iterator

from ..plan import seccomp as _seccomp
from ..plan.model import Plan
from . import _sys
from .mounts import DENIED_FILE

AT_FDCWD = -100
AT_SYMLINK_NOFOLLOW = 0x100
AT_EMPTY_PATH = 0x1000
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
MAX_CONFIG = 4 << 20
MAX_DATAGRAM = 4 << 20
MAX_XATTR = 64 << 10

Outcome = int | None  # None: let the kernel run it; >= 0: its result; < 0: -errno


_FILTERS: dict[bool, _sys.SeccompProgram] = {}


def notify_filter(renames: bool) -> _sys.SeccompProgram:
    """The notification filter, packed once per process: the supervisor packs it
    before cloning (``prepare``), so PID 1 only installs its copy."""
    packed = _FILTERS.get(renames)
    if packed is None:
        groups = ("sockets", "metadata", *(("renames",) if renames else ()))
        packed = _FILTERS[renames] = _sys.SeccompProgram(_seccomp.notify_program(groups))
    return packed


def prepare(plan: Plan) -> None:
    """In the supervisor: pack the filters PID 1 may need (renames are brokered only
    when a protected git config exists, which PID 1 sees for itself)."""
    notify_filter(False)


class Broker:
    def __init__(
        self,
        listener: int,
        protected: dict[tuple[int, int], str],
        roots: list[str],
        private: set[int],
    ) -> None:
        self.listener = listener
        self.protected = protected  # (dev, ino) of a protected file inside -> its git directory
        self.roots = [r.rstrip("/") or "/" for r in roots]  # writable roots, as seen inside
        self.private = private  # st_dev of the sandbox's own tmpfs (/tmp, /dev/shm)
        self.names = {v: k for k, v in _seccomp.BROKERED[os.uname().machine].items()}
        self.changed: str | None = None
        self.sealed: set[tuple[int, int]] = set()  # objects whose metadata nobody may change
        with contextlib.suppress(OSError):
            st = os.stat(DENIED_FILE)
            self.sealed.add((st.st_dev, st.st_ino))

    @classmethod
    def start(cls, plan: Plan, helpers: set[int], changed_w: int) -> Broker:
        """In PID 1 after setup (no_new_privs already set): the broker's thread, then
        the notification filter on PID 1's main thread, inherited by everything it
        forks. A git directory whose config was replaced is written, one line each, to
        ``changed_w``."""
        # Git configs are no longer mount points a rename must be brokered onto (a
        # sandbox-side git directory holds them: server.gitstore).
        protected: dict[tuple[int, int], str] = {}
        private = set()
        for path in ("/tmp", "/dev/shm"):
            with contextlib.suppress(OSError):
                private.add(os.stat(path).st_dev)
        roots = sorted({r for _at, group in plan.groups for r in group})
        program = notify_filter(bool(protected))
        box: list[Broker] = []
        ready = threading.Event()

        def serve() -> None:
            ready.wait()
            broker = box[0]
            while True:
                gitdir = broker.handle(helpers)  # PID 1's live set of helpers
                if gitdir is not None:
                    with contextlib.suppress(OSError):
                        os.write(changed_w, gitdir.encode() + b"\n")

        thread = threading.Thread(target=serve, name="warren-broker", daemon=True)
        thread.start()
        listener = program.install_listener()
        box.append(cls(listener, protected, roots, private))
        ready.set()
        return box[0]

    def handle(self, helpers: set[int] | frozenset[int] = frozenset()) -> str | None:
        """Answer one notification; the git directory whose config it replaced, if any.
        ``helpers``: PID 1's own helpers (warren's code, not the sandbox's): their calls
        go on unchanged."""
        try:
            nid, pid, nr, args = _sys.notif_recv(self.listener)
        except OSError:
            return None  # the caller died (or was interrupted) before we read it
        self.changed = None
        name = self.names.get(nr, "")
        outcome: Outcome = None
        try:
            call = Call(self.listener, nid, pid, args)
            with call:
                if pid in helpers or pid == os.getpid() or not name:
                    outcome = None
                elif call.pin():
                    outcome = getattr(self, "_" + name)(call)
                elif _sys.notif_valid(self.listener, nid) and name not in _seccomp.RENAMES:
                    # Alive but closed to inspection (it made itself not dumpable):
                    # what cannot be checked is refused.
                    outcome = -errno.EPERM
        except Exception:
            # Anything unexpected: refuse what is guarded, let the rest run.
            outcome = None if name in _seccomp.RENAMES else -errno.EPERM
        with contextlib.suppress(OSError):
            if outcome is None:
                _sys.notif_send(self.listener, nid, cont=True)
            elif outcome < 0:
                _sys.notif_send(self.listener, nid, error=-outcome)
            else:
                _sys.notif_send(self.listener, nid, val=outcome)
        return self.changed if outcome == 0 else None

    # --- where a process may act ---------------------------------------------------------

    def _inside(self, fd: int) -> bool:
        """Is the object of ``fd`` in a writable root or on the sandbox's own tmpfs?"""
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) in self.sealed:
            return False  # a denied file's stand-in
        if st.st_dev in self.private:
            return True
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.endswith(" (deleted)"):
            path = path[: -len(" (deleted)")]
        return any(path == r or path.startswith(r + "/") or r == "/" for r in self.roots)

    def _refusal(self, fd: int) -> int:
        with contextlib.suppress(OSError):
            if os.fstatvfs(fd).f_flag & os.ST_RDONLY:
                return -errno.EROFS
        return -errno.EPERM

    # --- metadata ------------------------------------------------------------------------

    def _meta(self, call: Call, fd: int, act: str, *rest: object) -> Outcome:
        try:
            if not self._inside(fd):
                return self._refusal(fd)
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

    def _chmod(self, call: Call) -> Outcome:
        return self._at_path(call, AT_FDCWD, call.args[0], 0, "chmod", call.args[1] & 0o7777)

    def _fchmod(self, call: Call) -> Outcome:
        return self._at_fd(call, call.args[0], "chmod", call.args[1] & 0o7777)

    def _fchmodat(self, call: Call) -> Outcome:
        return self._at_path(call, call.args[0], call.args[1], 0, "chmod", call.args[2] & 0o7777)

    def _fchmodat2(self, call: Call) -> Outcome:
        flags = call.args[3] & 0xFFFFFFFF
        return self._at_path(call, call.args[0], call.args[1], flags, "chmod", call.args[2] & 0o7777)

    def _utimensat(self, call: Call) -> Outcome:
        dirfd, path_ptr, times_ptr = call.args[:3]
        flags = call.args[3] & 0xFFFFFFFF
        times = call.read(times_ptr, 32) if times_ptr else None
        if times_ptr and times is None:
            return -errno.EFAULT
        nofollow = flags & AT_SYMLINK_NOFOLLOW
        if not path_ptr:  # futimens(dirfd, times)
            return self._at_fd(call, dirfd, "utimens", times, nofollow)
        return self._at_path(call, dirfd, path_ptr, flags, "utimens", times, nofollow)

    def _utime(self, call: Call) -> Outcome:
        return -errno.ENOSYS

    _utimes = _futimesat = _utime

    def _setxattr(self, call: Call, nofollow: int = 0) -> Outcome:
        name, value = call.string(call.args[1]), call.read(call.args[2], min(call.args[3], MAX_XATTR))
        if name is None or value is None:
            return -errno.EFAULT
        return self._at_path(call, AT_FDCWD, call.args[0], nofollow, "setxattr", name, value, call.args[4])

    def _lsetxattr(self, call: Call) -> Outcome:
        return self._setxattr(call, AT_SYMLINK_NOFOLLOW)

    def _fsetxattr(self, call: Call) -> Outcome:
        name, value = call.string(call.args[1]), call.read(call.args[2], min(call.args[3], MAX_XATTR))
        if name is None or value is None:
            return -errno.EFAULT
        return self._at_fd(call, call.args[0], "setxattr", name, value, call.args[4])

    def _removexattr(self, call: Call, nofollow: int = 0) -> Outcome:
        name = call.string(call.args[1])
        if name is None:
            return -errno.EFAULT
        return self._at_path(call, AT_FDCWD, call.args[0], nofollow, "removexattr", name)

    def _lremovexattr(self, call: Call) -> Outcome:
        return self._removexattr(call, AT_SYMLINK_NOFOLLOW)

    def _fremovexattr(self, call: Call) -> Outcome:
        name = call.string(call.args[1])
        if name is None:
            return -errno.EFAULT
        return self._at_fd(call, call.args[0], "removexattr", name)

    def _at_fd(self, call: Call, fd_arg: int, act: str, *rest: object) -> Outcome:
        fd = call.their_fd(fd_arg)
        if fd < 0:
            return fd
        return self._meta(call, fd, act, *rest)

    def _at_path(self, call: Call, dirfd: int, path_ptr: int, flags: int, act: str, *rest: object) -> Outcome:
        path = call.string(path_ptr)
        if path is None:
            return -errno.EFAULT
        if not path:
            if not flags & AT_EMPTY_PATH:
                return -errno.ENOENT
            return self._at_fd(call, dirfd, act, *rest)
        try:
            fd = os.open(
                call.resolve(dirfd, path),
                os.O_PATH | os.O_CLOEXEC | (os.O_NOFOLLOW if flags & AT_SYMLINK_NOFOLLOW else 0),
            )
        except OSError as e:
            return -(e.errno or errno.EIO)
        return self._meta(call, fd, act, *rest)

    # --- unix sockets --------------------------------------------------------------------

    def _unix_peer(self, call: Call, raw: bytes) -> tuple[str | bytes, int] | int:
        """Where an AF_UNIX address leads: (address to use, fd to close or -1), or -errno."""
        if len(raw) < 2 or struct.unpack_from("=H", raw)[0] != socket.AF_UNIX:
            return -errno.EINVAL
        sun_path = raw[2:]
        if not sun_path:
            return -errno.EINVAL
        if sun_path[0] == 0:
            return sun_path, -1  # abstract: in the sandbox's own network namespace
        path = sun_path.split(b"\0", 1)[0]
        try:
            fd = os.open(call.resolve(AT_FDCWD, path), os.O_PATH | os.O_CLOEXEC)
        except OSError as e:
            return -(e.errno or errno.EIO)
        if not self._inside(fd):
            os.close(fd)
            return -errno.EACCES
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            os.close(fd)
            return -errno.ECONNREFUSED
        return f"/proc/self/fd/{fd}", fd

    def _to_peer(
        self, call: Call, addr_ptr: int, addr_len: int, act: Callable[[str | bytes], int]
    ) -> Outcome:
        """Read the AF_UNIX address the process passed, resolve and judge it, then
        ``act`` on what was judged: its result, or -errno."""
        raw = call.read(addr_ptr, min(addr_len & 0xFFFFFFFF, 110))
        if raw is None:
            return -errno.EFAULT
        peer = self._unix_peer(call, raw)
        if isinstance(peer, int):
            return peer
        address, fd = peer
        try:
            return act(address)
        except OSError as e:
            return -(e.errno or errno.EIO)
        finally:
            if fd >= 0:
                os.close(fd)

    def _connect(self, call: Call) -> Outcome:
        with call.socket(call.args[0]) as sock:
            if isinstance(sock, int):
                return sock
            if sock.family != socket.AF_UNIX:
                return None  # its family is fixed: the address cannot lead to a unix socket

            def connect(address: str | bytes) -> int:
                sock.connect(address)
                return 0

            return self._to_peer(call, call.args[1], call.args[2], connect)

    def _sendto(self, call: Call) -> Outcome:
        with call.socket(call.args[0]) as sock:
            if isinstance(sock, int):
                return sock
            if sock.family != socket.AF_UNIX:
                return None
            length = call.args[2]
            if length > MAX_DATAGRAM:
                return -errno.EMSGSIZE
            data = call.read(call.args[1], length)
            if data is None:
                return -errno.EFAULT
            flags = call.args[3] & 0xFFFFFFFF
            return self._to_peer(
                call, call.args[4], call.args[5], lambda address: sock.sendto(data, flags, address)
            )

    def _sendmsg(self, call: Call) -> Outcome:
        with call.socket(call.args[0]) as sock:
            if isinstance(sock, int):
                return sock
            if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_DGRAM:
                return None  # connection-oriented: an address in the message is not used
            hdr = call.read(call.args[1], 56)
            if hdr is None:
                return -errno.EFAULT
            name, namelen, iov, iovlen, _control, controllen = struct.unpack_from("=QI4xQQQQ", hdr)
            if controllen:
                return -errno.EPERM  # ancillary data on a unix datagram socket: not brokered
            vec = call.read(iov, 16 * min(iovlen, 1024)) if iovlen else b""
            if vec is None:
                return -errno.EFAULT
            parts = []
            for i in range(min(iovlen, 1024)):
                base, size = struct.unpack_from("=QQ", vec, 16 * i)
                part = call.read(base, min(size, MAX_DATAGRAM)) if size else b""
                if part is None:
                    return -errno.EFAULT
                parts.append(part)
            flags = call.args[2] & 0xFFFFFFFF
            if name:
                return self._to_peer(
                    call, name, namelen, lambda address: sock.sendmsg(parts, [], flags, address)
                )
            try:
                return sock.sendmsg(parts, [], flags)
            except OSError as e:
                return -(e.errno or errno.EIO)

    def _sendmmsg(self, call: Call) -> Outcome:
        with call.socket(call.args[0]) as sock:
            if isinstance(sock, int):
                return sock
            if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_DGRAM:
                return None
            return -errno.EPERM  # several unix datagrams at once: not brokered

    # --- renames onto a protected git config ---------------------------------------------

    def _rename(self, call: Call) -> Outcome:
        return self._renameat2(call, (AT_FDCWD, call.args[0], AT_FDCWD, call.args[1], 0))

    def _renameat(self, call: Call) -> Outcome:
        return self._renameat2(call, (*call.args[:4], 0))

    def _renameat2(self, call: Call, args: tuple[int, ...] | None = None) -> Outcome:
        old_dir, old_ptr, new_dir, new_ptr, flags = args or call.args[:5]
        if not self.protected:
            return None
        old, new = call.string(old_ptr), call.string(new_ptr)
        if old is None or new is None:
            return None
        dst = call.parent(new_dir, new)
        if dst is None:
            return None
        dst_fd, dst_name = dst
        try:
            try:
                st = os.stat(dst_name, dir_fd=dst_fd, follow_symlinks=False)
            except OSError:
                return None
            gitdir = self.protected.get((st.st_dev, st.st_ino))
            if gitdir is None:
                return None
            if flags & RENAME_EXCHANGE:
                return -errno.EBUSY
            if flags & RENAME_NOREPLACE:
                return -errno.EEXIST
            result = self._replace(call, old_dir, old, dst_fd, dst_name)
            if result == 0:
                self.changed = gitdir
            return result
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


class Call:
    """One notified call: the process's memory, fds and paths, read as it sees them."""

    def __init__(self, listener: int, nid: int, pid: int, args: tuple[int, ...]) -> None:
        self.listener, self.nid, self.pid, self.args = listener, nid, pid, args
        self.pidfd = -1
        self.mem = -1

    def __enter__(self) -> Call:
        return self

    def __exit__(self, *_exc: object) -> None:
        for fd in (self.pidfd, self.mem):
            if fd >= 0:
                os.close(fd)

    def pin(self) -> bool:
        """Pin the process (a pidfd) and its memory, then check the notification still
        belongs to it: a pid reused meanwhile is not acted for."""
        try:
            # The notification names a thread; PIDFD_THREAD (= O_EXCL, Linux 6.9) pins
            # that thread, else its thread group leader is pinned.
            try:
                self.pidfd = os.pidfd_open(self.pid, PIDFD_THREAD)
            except OSError:
                self.pidfd = os.pidfd_open(_tgid(self.pid))
            self.mem = os.open(f"/proc/{self.pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        return _sys.notif_valid(self.listener, self.nid)

    def read(self, address: int, size: int) -> bytes | None:
        out = b""
        try:
            while len(out) < size:
                chunk = os.pread(self.mem, size - len(out), address + len(out))
                if not chunk:
                    return None
                out += chunk
        except (OSError, OverflowError, ValueError):
            return None
        return out

    def string(self, address: int, limit: int = 4096) -> bytes | None:
        out = b""
        try:
            while len(out) < limit:
                chunk = os.pread(self.mem, 256, address + len(out))
                if not chunk:
                    return None
                end = chunk.find(b"\0")
                if end >= 0:
                    return out + chunk[:end]
                out += chunk
        except (OSError, OverflowError, ValueError):
            return None
        return None

    def their_fd(self, fd_arg: int) -> int:
        """A copy of the process's fd, or -errno."""
        try:
            return _sys.pidfd_getfd(self.pidfd, _int(fd_arg))
        except OSError as e:
            return -(e.errno or errno.EBADF)

    @contextlib.contextmanager
    def socket(self, fd_arg: int) -> Iterator[socket.socket | int]:
        fd = self.their_fd(fd_arg)
        if fd < 0:
            yield fd
            return
        try:
            sock = socket.socket(fileno=fd)
        except OSError as e:
            os.close(fd)
            yield -errno.ENOTSOCK if e.errno == errno.ENOTSOCK else -(e.errno or errno.EBADF)
            return
        with sock:
            yield sock

    def resolve(self, dirfd_arg: int, path: bytes) -> bytes:
        """``path`` as the process would resolve it (from its cwd or the dirfd)."""
        if path.startswith(b"/"):
            return path
        dirfd = _int(dirfd_arg)
        base = f"/proc/{self.pid}/cwd/" if dirfd == AT_FDCWD else f"/proc/{self.pid}/fd/{dirfd}/"
        return base.encode() + path

    def parent(self, dirfd_arg: int, path: bytes) -> tuple[int, bytes] | None:
        """An fd of the directory holding ``path``'s last component, and that component."""
        if not path:
            return None
        head, _, tail = path.rstrip(b"/").rpartition(b"/")
        if tail in (b"", b".", b".."):
            return None
        where = self.resolve(dirfd_arg, head if head or path.startswith(b"/") else b".")
        try:
            fd = os.open(where or b"/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None
        return fd, tail


PIDFD_THREAD = os.O_EXCL


def _tgid(tid: int) -> int:
    with open(f"/proc/{tid}/status") as f:
        for line in f:
            if line.startswith("Tgid:"):
                return int(line.split()[1])
    return tid


def _int(value: int) -> int:
    """An fd argument: the low 32 bits, signed."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value
