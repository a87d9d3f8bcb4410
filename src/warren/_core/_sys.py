"""Raw Linux system calls through ctypes: the only module in warren that touches ctypes.

Owns: syscall numbers per architecture, the C structs the kernel expects, and thin
wrappers that raise ``OSError`` with the real errno. It must not decide anything:
no policy, no paths, no fallbacks. Callers above turn ``OSError`` into ``WarrenError``.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import struct

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long

_MACHINE = os.uname().machine

# Numbers that differ per architecture; the 4xx range is shared by all since Linux 5.1.
_ARCH_NR: dict[str, dict[str, int]] = {
    "x86_64": {
        "mount": 165,
        "umount2": 166,
        "pivot_root": 155,
        "capset": 126,
        "capget": 125,
        "seccomp": 317,
        "renameat2": 316,
    },
    "aarch64": {
        "mount": 40,
        "umount2": 39,
        "pivot_root": 41,
        "capset": 91,
        "capget": 90,
        "seccomp": 277,
        "renameat2": 276,
    },
}
_COMMON_NR = {
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "close_range": 436,
    "mount_setattr": 442,
    "setns": 308 if _MACHINE == "x86_64" else 268,
    "pidfd_getfd": 438,
    "openat2": 437,
    "utimensat": 280 if _MACHINE == "x86_64" else 88,
    "landlock_create_ruleset": 444,
    "landlock_add_rule": 445,
    "landlock_restrict_self": 446,
}


def supported_machine() -> bool:
    return _MACHINE in _ARCH_NR


def _nr(name: str) -> int:
    if name in _COMMON_NR:
        return _COMMON_NR[name]
    try:
        return _ARCH_NR[_MACHINE][name]
    except KeyError:
        raise OSError(38, f"{name}: no syscall number known for {_MACHINE}") from None


def _check(result: int, what: str, path: str | None = None) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}", path)
    return result


def _b(path: str | bytes | None) -> bytes | None:
    if path is None:
        return None
    return os.fsencode(path)


# --- namespaces -----------------------------------------------------------------

CLONE_PARENT = 0x00008000
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000


def setns(fd: int, nstype: int) -> None:
    """Join the namespaces ``fd`` names (a pidfd joins several at once)."""
    _check(_syscall(_nr("setns"), ctypes.c_int(fd), ctypes.c_int(nstype)), "setns")


# --- mounts ---------------------------------------------------------------------

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
MNT_DETACH = 0x2

AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
OPEN_TREE_CLONE = 0x1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
MOVE_MOUNT_F_EMPTY_PATH = 0x4

MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    r = _syscall(
        _nr("mount"),
        _b(source),
        _b(target),
        _b(fstype),
        ctypes.c_ulong(flags),
        _b(data),
    )
    _check(r, "mount", target)


def umount2(target: str, flags: int) -> None:
    _check(_syscall(_nr("umount2"), _b(target), ctypes.c_int(flags)), "umount2", target)


def pivot_root(new_root: str, put_old: str) -> None:
    _check(_syscall(_nr("pivot_root"), _b(new_root), _b(put_old)), "pivot_root", new_root)


def open_tree(path: str, flags: int, dirfd: int = AT_FDCWD) -> int:
    r = _syscall(_nr("open_tree"), ctypes.c_int(dirfd), _b(path), ctypes.c_uint(flags))
    return _check(r, "open_tree", path)


MOVE_MOUNT_T_EMPTY_PATH = 0x40


def move_mount_onto(from_fd: int, to_fd: int) -> None:
    """Attach the detached tree ``from_fd`` on what ``to_fd`` (an ``O_PATH`` descriptor)
    is: no path looked up, no link followed."""
    r = _syscall(
        _nr("move_mount"),
        ctypes.c_int(from_fd),
        b"",
        ctypes.c_int(to_fd),
        b"",
        ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH),
    )
    _check(r, "move_mount", f"/proc/self/fd/{to_fd}")


def move_mount(from_fd: int, to_path: str) -> None:
    r = _syscall(
        _nr("move_mount"),
        ctypes.c_int(from_fd),
        b"",
        ctypes.c_int(AT_FDCWD),
        _b(to_path),
        ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH),
    )
    _check(r, "move_mount", to_path)


def move_mount_at(from_dir: int, from_path: str, to_dir: int, to_path: str) -> None:
    """Move the mount at ``from_path`` (beneath ``from_dir``) onto ``to_path`` (beneath
    ``to_dir``); neither final component may be a link (none is followed)."""
    r = _syscall(
        _nr("move_mount"),
        ctypes.c_int(from_dir),
        _b(from_path),
        ctypes.c_int(to_dir),
        _b(to_path),
        ctypes.c_uint(0),
    )
    _check(r, "move_mount", to_path)


FSCONFIG_SET_FLAG = 0
FSCONFIG_SET_FD = 5
FSCONFIG_CMD_CREATE = 6
FSOPEN_CLOEXEC = 1
FSMOUNT_CLOEXEC = 1
MOUNT_ATTR_NODEV_NOSUID = 0x6


def overlay_from_fds(lowers: list[int], upper: int, work: int) -> int:
    """An overlay (``userxattr``) whose layers are named by descriptor (Linux >= 6.13:
    no path is looked up, so layers held as detached mounts work from any namespace
    that may use them); returns the detached mount, nosuid and nodev."""
    fs = _check(_syscall(_nr("fsopen"), b"overlay", ctypes.c_uint(FSOPEN_CLOEXEC)), "fsopen", "overlay")
    try:
        for key, fd in [*(("lowerdir+", f) for f in lowers), ("upperdir", upper), ("workdir", work)]:
            r = _syscall(
                _nr("fsconfig"),
                ctypes.c_int(fs),
                ctypes.c_uint(FSCONFIG_SET_FD),
                _b(key),
                None,
                ctypes.c_int(fd),
            )
            _check(r, "fsconfig", key)
        r = _syscall(
            _nr("fsconfig"),
            ctypes.c_int(fs),
            ctypes.c_uint(FSCONFIG_SET_FLAG),
            b"userxattr",
            None,
            ctypes.c_int(0),
        )
        _check(r, "fsconfig", "userxattr")
        r = _syscall(
            _nr("fsconfig"), ctypes.c_int(fs), ctypes.c_uint(FSCONFIG_CMD_CREATE), None, None, ctypes.c_int(0)
        )
        _check(r, "fsconfig", "create")
        r = _syscall(
            _nr("fsmount"),
            ctypes.c_int(fs),
            ctypes.c_uint(FSMOUNT_CLOEXEC),
            ctypes.c_uint(MOUNT_ATTR_NODEV_NOSUID),
        )
        return _check(r, "fsmount", "overlay")
    finally:
        os.close(fs)


def mount_setattr(fd: int, attr_set: int, attr_clr: int = 0, recursive: bool = False) -> None:
    attr = _MountAttr(attr_set, attr_clr, 0, 0)
    flags = AT_EMPTY_PATH | (AT_RECURSIVE if recursive else 0)
    r = _syscall(
        _nr("mount_setattr"),
        ctypes.c_int(fd),
        b"",
        ctypes.c_uint(flags),
        ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
    )
    _check(r, "mount_setattr")


# --- landlock -------------------------------------------------------------------

LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The Landlock ABI version, or 0 when Landlock is absent or disabled."""
    r = _syscall(
        _nr("landlock_create_ruleset"),
        None,
        ctypes.c_size_t(0),
        ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION),
    )
    return max(int(r), 0)


def landlock_create_ruleset(handled_fs: int, handled_net: int = 0, scoped: int = 0) -> int:
    attr = _RulesetAttr(handled_fs, handled_net, scoped)
    # The kernel accepts a shorter struct from older callers; send only what is set.
    size = 24 if scoped else (16 if handled_net else 8)
    r = _syscall(
        _nr("landlock_create_ruleset"),
        ctypes.byref(attr),
        ctypes.c_size_t(size),
        ctypes.c_uint32(0),
    )
    return _check(r, "landlock_create_ruleset")


def landlock_add_path_rule(ruleset_fd: int, path_fd: int, access: int, path: str = "") -> None:
    attr = _PathBeneathAttr(access, path_fd)
    r = _syscall(
        _nr("landlock_add_rule"),
        ctypes.c_int(ruleset_fd),
        ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH),
        ctypes.byref(attr),
        ctypes.c_uint32(0),
    )
    _check(r, "landlock_add_rule", path)


def landlock_restrict_self(ruleset_fd: int) -> None:
    r = _syscall(_nr("landlock_restrict_self"), ctypes.c_int(ruleset_fd), ctypes.c_uint32(0))
    _check(r, "landlock_restrict_self")


# --- process hardening ----------------------------------------------------------

PR_SET_PDEATHSIG = 1
PR_SET_SECCOMP = 22
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_RAISE = 2
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2

_prctl = _libc.prctl
_prctl.restype = ctypes.c_int
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


PR_GET_DUMPABLE = 3


def prctl(option: int, arg2: int = 0, arg3: int = 0, arg4: int = 0, arg5: int = 0) -> int:
    return _check(_prctl(option, arg2, arg3, arg4, arg5), f"prctl({option})")


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


class SeccompProgram:
    """A BPF program packed into kernel layout once, so installing it is one call."""

    def __init__(self, program: tuple[tuple[int, int, int, int], ...]) -> None:
        self._filters = (_SockFilter * len(program))(*[_SockFilter(*ins) for ins in program])
        self._prog = _SockFprog(len(program), self._filters)
        self.address = ctypes.addressof(self._prog)
        self.hex = bytes(self._filters).hex()  # as the exec stub installs it (``execstub.confinement``)

    def install(self) -> None:
        r = _prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, self.address, 0, 0)
        _check(r, "seccomp")

    def install_listener(self) -> int:
        """Install with a user-notification listener; returns its fd (close-on-exec)."""
        r = _syscall(
            _nr("seccomp"),
            ctypes.c_uint(SECCOMP_SET_MODE_FILTER),
            ctypes.c_uint(SECCOMP_FILTER_FLAG_NEW_LISTENER),
            ctypes.c_void_p(self.address),
        )
        return _check(r, "seccomp")


# struct seccomp_notif (80 bytes) and seccomp_notif_resp (24 bytes); the ioctls on a
# listener: _IOWR('!', 0 | 1, ...) and _IOW('!', 2, __u64).
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
SECCOMP_USER_NOTIF_FLAG_CONTINUE = 1
_NOTIF_RECV = 0xC0502100
_NOTIF_SEND = 0xC0182101
_NOTIF_ID_VALID = 0x40082102
_NOTIF = struct.Struct("=QIIiIQ6Q")
_RESP = struct.Struct("=QqiI")


NOTIF_SIZE = _NOTIF.size  # struct seccomp_notif


def notif_recv(listener: int) -> tuple[int, int, int, tuple[int, ...]]:
    """The next notification: (id, pid, syscall number, args)."""
    buf = bytearray(_NOTIF.size)
    fcntl.ioctl(listener, _NOTIF_RECV, buf, True)
    return notif_parse(buf)


def notif_parse(buf: bytes | bytearray) -> tuple[int, int, int, tuple[int, ...]]:
    """A ``struct seccomp_notif`` as read: (id, pid, syscall number, args)."""
    nid, pid, _flags, nr, _arch, _ip, *args = _NOTIF.unpack(buf)
    return nid, pid, nr, tuple(args)


def notif_valid(listener: int, nid: int) -> bool:
    try:
        fcntl.ioctl(listener, _NOTIF_ID_VALID, bytearray(struct.pack("=Q", nid)), True)
    except OSError:
        return False
    return True


def notif_send(listener: int, nid: int, error: int = 0, cont: bool = False, val: int = 0) -> None:
    """Answer: let the kernel run the call (``cont``), or its result: ``val``, or -1
    with ``error`` as errno."""
    flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE if cont else 0
    resp = _RESP.pack(nid, 0 if error else val, -error if error else 0, flags)
    fcntl.ioctl(listener, _NOTIF_SEND, bytearray(resp), True)


def pidfd_getfd(pidfd: int, fd: int) -> int:
    """A copy of another process's fd (close-on-exec), as pidfd_getfd(2)."""
    r = _syscall(_nr("pidfd_getfd"), ctypes.c_int(pidfd), ctypes.c_int(fd), ctypes.c_uint(0))
    return _check(r, "pidfd_getfd")


# --- sockets, for PID 1's broker: it acts on a copy of a sandbox's socket with the
# raw address and bytes the process passed, so nothing is re-read or re-parsed. Each
# returns the result or -errno (never raises): the broker hands that back as it is.

_SOL_SOCKET = 1
_SO_TYPE = 3
_SO_DOMAIN = 39
_SO_SNDTIMEO = 21


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _MsgHdr(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_void_p),
        ("namelen", ctypes.c_uint32),
        ("iov", ctypes.POINTER(_IoVec)),
        ("iovlen", ctypes.c_size_t),
        ("control", ctypes.c_void_p),
        ("controllen", ctypes.c_size_t),
        ("flags", ctypes.c_int),
    ]


_getsockopt = _libc.getsockopt
_connect = _libc.connect
_sendmsg = _libc.sendmsg
_sendmsg.restype = ctypes.c_ssize_t
_getsockopt.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
_connect.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint32]
_sendmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]


def socket_kind(fd: int) -> tuple[int, int] | int:
    """(domain, type) of a socket fd, or -errno (``ENOTSOCK`` for anything else)."""
    out = []
    for opt in (_SO_DOMAIN, _SO_TYPE):
        value = ctypes.c_int(0)
        size = ctypes.c_uint32(ctypes.sizeof(value))
        if _getsockopt(fd, _SOL_SOCKET, opt, ctypes.byref(value), ctypes.byref(size)) < 0:
            return -ctypes.get_errno()
        out.append(value.value)
    return out[0], out[1]


def send_timeout_ms(fd: int) -> int:
    """A socket's SO_SNDTIMEO in milliseconds as poll(2) takes it: -1 for none (or
    when it cannot be read)."""
    value = (ctypes.c_int64 * 2)()
    size = ctypes.c_uint32(ctypes.sizeof(value))
    if _getsockopt(fd, _SOL_SOCKET, _SO_SNDTIMEO, ctypes.byref(value), ctypes.byref(size)) < 0:
        return -1
    sec, usec = value[0], value[1]
    return -1 if not sec and not usec else sec * 1000 + (usec + 999) // 1000


def connect(fd: int, address: bytes) -> int:
    """connect(2) with a raw ``struct sockaddr``: 0 or -errno. Blocks as the socket
    says (its O_NONBLOCK); a signal to the calling thread interrupts it (EINTR)."""
    buf = ctypes.create_string_buffer(address, len(address)) if address else None
    if _connect(fd, buf, len(address)) < 0:
        return -ctypes.get_errno()
    return 0


def sendmsg(fd: int, name: bytes | None, parts: list[bytes], control: bytes, flags: int) -> int:
    """sendmsg(2) with a raw address (or none), the data and the raw control messages:
    the bytes sent, or -errno."""
    bufs = [ctypes.create_string_buffer(p, len(p)) for p in parts]
    iov = (_IoVec * max(1, len(parts)))()
    for i, (b, p) in enumerate(zip(bufs, parts, strict=True)):
        iov[i].base = ctypes.cast(b, ctypes.c_void_p)
        iov[i].len = len(p)
    name_buf = ctypes.create_string_buffer(name, len(name)) if name else None
    ctl_buf = ctypes.create_string_buffer(control, len(control)) if control else None
    msg = _MsgHdr(
        ctypes.cast(name_buf, ctypes.c_void_p) if name_buf is not None else None,
        len(name) if name else 0,
        iov,
        len(parts),
        ctypes.cast(ctl_buf, ctypes.c_void_p) if ctl_buf is not None else None,
        len(control),
        0,
    )
    r = _sendmsg(fd, ctypes.byref(msg), flags)
    if r < 0:
        return -ctypes.get_errno()
    return int(r)


PIDFD_GET_INFO = 0xC040FF0B  # _IOWR(0xFF, 11, struct pidfd_info), its first 64 bytes (Linux 6.13)
_PIDFD_INFO_PID = 1


def pidfd_tgid(pidfd: int) -> int | None:
    """The thread group of the task ``pidfd`` pins, in the caller's pid namespace
    (``PIDFD_GET_INFO``); None where the kernel has no such ioctl."""
    import fcntl

    info = bytearray(64)
    struct.pack_into("=Q", info, 0, _PIDFD_INFO_PID)
    try:
        fcntl.ioctl(pidfd, PIDFD_GET_INFO, info)
    except OSError:
        return None
    mask, _cgroup, _pid, tgid = struct.unpack_from("=QQII", info)
    return tgid if mask & _PIDFD_INFO_PID and tgid else None


class _PollFd(ctypes.Structure):
    _fields_ = [("fd", ctypes.c_int), ("events", ctypes.c_short), ("revents", ctypes.c_short)]


_poll = _libc.poll
_poll.argtypes = [ctypes.c_void_p, ctypes.c_ulong, ctypes.c_int]
_POLLOUT = 0x4


def poll_out(fd: int, timeout_ms: int) -> int:
    """poll(2) for ``fd`` to take a write: 1 when it may (or has an error to say), 0 at
    the timeout (-1: none), -errno; a signal to the calling thread interrupts it (EINTR,
    never retried here)."""
    pfd = _PollFd(fd, _POLLOUT, 0)
    r = _poll(ctypes.byref(pfd), 1, timeout_ms)
    if r < 0:
        return -ctypes.get_errno()
    return int(r)


RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
_OPEN_HOW = struct.Struct("QQQ")


def openat2(dirfd: int, path: str | bytes, flags: int, mode: int, resolve: int) -> int:
    """openat2(2): open ``path`` relative to ``dirfd`` with ``resolve`` restrictions."""
    how = ctypes.create_string_buffer(_OPEN_HOW.pack(flags, mode, resolve), _OPEN_HOW.size)
    r = _syscall(_nr("openat2"), ctypes.c_int(dirfd), _b(path), how, ctypes.c_size_t(_OPEN_HOW.size))
    return _check(r, "openat2", os.fsdecode(path))


RENAME_EXCHANGE = 2


def renameat2(olddirfd: int, oldname: str, newdirfd: int, newname: str, flags: int) -> None:
    """renameat2(2) (RENAME_EXCHANGE: swap two names atomically; neither is followed)."""
    r = _syscall(
        _nr("renameat2"),
        ctypes.c_int(olddirfd),
        _b(oldname),
        ctypes.c_int(newdirfd),
        _b(newname),
        ctypes.c_uint(flags),
    )
    _check(r, "renameat2", newname)


def utimensat(path: bytes, times: bytes | None, flags: int = 0) -> None:
    """utimensat(AT_FDCWD, path, times, flags) with ``times`` as the raw two
    ``struct timespec`` a program passed (UTIME_NOW and UTIME_OMIT kept), or NULL."""
    buf = ctypes.create_string_buffer(times, len(times)) if times is not None else None
    r = _syscall(_nr("utimensat"), ctypes.c_int(-100), _b(path), buf, ctypes.c_int(flags))
    _check(r, "utimensat")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


_CAP_HEADER = _CapHeader(0x20080522, 0)
_CAP_EMPTY = (_CapData * 2)()


def capset_empty() -> None:
    r = _syscall(_nr("capset"), ctypes.byref(_CAP_HEADER), ctypes.byref(_CAP_EMPTY))
    _check(r, "capset")


def ambient_caps(caps: tuple[int, ...]) -> None:
    """Raise ``caps`` (held already) as ambient capabilities, inheritable first: what a
    child's execve then keeps, also as a non-root user (``_core.credsend``). The rest
    of the caller's capabilities stay as they are."""
    data = (_CapData * 2)()
    _check(_syscall(_nr("capget"), ctypes.byref(_CAP_HEADER), ctypes.byref(data)), "capget")
    for cap in caps:
        data[cap // 32].inheritable |= 1 << (cap % 32)
    _check(_syscall(_nr("capset"), ctypes.byref(_CAP_HEADER), ctypes.byref(data)), "capset")
    for cap in caps:
        prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap)


CLOSE_RANGE_CLOEXEC = 1 << 2


_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_AF_INET = 2
_SOCK_DGRAM = 2


def loopback_up() -> None:
    """Bring up ``lo`` in the current network namespace (a new one starts with it down)."""
    import fcntl
    import struct

    fd = _check(_libc.socket(_AF_INET, _SOCK_DGRAM | os.O_CLOEXEC, 0), "socket")
    try:
        req = bytearray(struct.pack("16sH22x", b"lo", 0))
        fcntl.ioctl(fd, _SIOCGIFFLAGS, req)
        flags = struct.unpack_from("16sH", req)[1] | _IFF_UP
        fcntl.ioctl(fd, _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags))
    finally:
        os.close(fd)


def sethostname(name: str) -> None:
    raw = name.encode()
    _check(_libc.sethostname(raw, ctypes.c_size_t(len(raw))), "sethostname")


_name_to_handle_at = _libc.name_to_handle_at
_MAX_HANDLE_SZ = 128


def name_to_handle_at(path: str, flags: int = 0) -> bytes:
    """The filesystem's handle of ``path`` (type and bytes; a final link is not
    followed unless ``flags`` says AT_SYMLINK_FOLLOW)."""
    buf = ctypes.create_string_buffer(8 + _MAX_HANDLE_SZ)
    struct.pack_into("=Ii", buf, 0, _MAX_HANDLE_SZ, 0)
    mount_id = ctypes.c_int(0)
    r = _name_to_handle_at(ctypes.c_int(AT_FDCWD), _b(path), buf, ctypes.byref(mount_id), ctypes.c_int(flags))
    _check(r, "name_to_handle_at", path)
    size, kind = struct.unpack_from("=Ii", buf, 0)
    return struct.pack("=i", kind) + buf.raw[8 : 8 + size]


_fstatfs = _libc.fstatfs
_fstatfs.argtypes = [ctypes.c_int, ctypes.c_void_p]


def fs_type(fd: int) -> int:
    """The magic number of the filesystem ``fd`` is on (``struct statfs``'s first
    field, ``f_type``)."""
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on 64-bit machines
    _check(_fstatfs(fd, buf), "fstatfs")
    return int(struct.unpack_from("=l", buf, 0)[0]) & 0xFFFFFFFF


IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF, IN_MOVE_SELF, IN_ONLYDIR = 0x400, 0x800, 0x1000000
IN_Q_OVERFLOW, IN_IGNORED = 0x4000, 0x8000
IN_UNMOUNT, IN_ISDIR, IN_DONT_FOLLOW, IN_MASK_ADD = 0x2000, 0x40000000, 0x2000000, 0x20000000
_inotify_init1 = _libc.inotify_init1
_inotify_init1.argtypes = [ctypes.c_int]
_inotify_add_watch = _libc.inotify_add_watch
_inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
_inotify_rm_watch = _libc.inotify_rm_watch
_inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]


def inotify_init1(flags: int) -> int:
    return _check(_inotify_init1(flags), "inotify_init1", None)


def inotify_add_watch(fd: int, path: str, mask: int) -> int:
    return _check(_inotify_add_watch(fd, _b(path), mask), "inotify_add_watch", path)


def inotify_rm_watch(fd: int, wd: int) -> None:
    _check(_inotify_rm_watch(fd, wd), "inotify_rm_watch", None)


def close_range(first: int, last: int, flags: int = 0) -> None:
    if first > last:
        return
    r = _syscall(_nr("close_range"), ctypes.c_uint(first), ctypes.c_uint(last), ctypes.c_uint(flags))
    _check(r, "close_range")


def close_all_but(*keep: int) -> None:
    """Close every descriptor but ``keep`` and stdio: a child forked or cloned inherits
    all its parent's (other sandboxes' channels, what another thread holds for a
    moment), and holds only what it is given."""
    low = 3
    for fd in sorted(set(keep)):
        if fd > low:
            close_range(low, fd - 1)
        low = max(low, fd + 1)
    close_range(low, 0xFFFFFFFF)


# syscall() through PyDLL keeps the GIL held across the call, so the child of a raw
# clone() resumes holding it (ctypes.CDLL would release it, and another thread could
# own it at the moment of the clone: the child would then deadlock).
_py_syscall = ctypes.PyDLL(None, use_errno=True).syscall
_py_syscall.restype = ctypes.c_long
_NR_CLONE = {"x86_64": 56, "aarch64": 220}
SIGCHLD = 17


def clone_process(flags: int) -> int:
    """fork() with namespace flags: the child starts inside the new namespaces
    (PID 1 of a new pid namespace). Returns 0 in the child, the pid in the parent.

    The child must only make system calls and exit or exec: Python's at-fork hooks do
    not run in it. x86_64 and aarch64 share the argument order used here (flags, stack,
    parent_tid, child_tid, tls) when stack and pointers are zero.
    """
    nr = _NR_CLONE.get(_MACHINE)
    if nr is None:
        raise OSError(38, f"clone: no syscall number known for {_MACHINE}")
    r = _py_syscall(nr, ctypes.c_ulong(flags | SIGCHLD), None, None, None, None)
    if r < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"clone: {os.strerror(err)}")
    return int(r)
