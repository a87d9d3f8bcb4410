"""The probes: small checks of the filesystem semantics developer tools rely on.

Each probe is a function that works inside a scratch directory it was given (named
``.warren-doctor-XXXXXXXX``, created and removed by the runner) and either returns a
short detail or raises ``ProbeFailure`` naming the step that failed. The runner turns
that into a ``ProbeResult``. Probes never touch anything they did not create, and they
decide nothing about causes: that is ``diagnose.py``'s job.
"""

from __future__ import annotations

import errno as _errno
import fcntl
import mmap
import os
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import TypeVar

from . import _kernel
from .evidence import Evidence, Location

SCRATCH_PREFIX = ".warren-doctor-"
T = TypeVar("T")


@dataclass(frozen=True)
class ProbeResult:
    id: str
    title: str
    location: str  # a role ("workspace", "cache", "tool-cache:uv", "tmpdir", "process") or "src->dst"
    status: str  # "pass", "fail", "skip", "error" (the probe itself crashed)
    required: bool  # does a developer tool need this to work?
    operation: str | None = None  # the step that failed: "rename", "link", "open", ...
    errno: int | None = None
    message: str = ""
    kind: str | None = None  # what the failed step moved or linked: "file" or "dir"
    src: str | None = None  # role of the source location of a step between two locations
    dst: str | None = None
    detail: str = ""
    # What a probe measured beyond pass or fail, as plain JSON values (the limit probes:
    # the cgroup it tried, the mechanism pause will use). Empty for filesystem probes.
    facts: dict[str, object] = field(default_factory=dict)

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(r for r in (self.src, self.dst) if r) or (self.location,)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class ProbeFailure(Exception):
    """A step of a probe failed: an OSError, or a semantic check that did not hold."""

    def __init__(self, operation: str, message: str, err: int | None = None, kind: str | None = None):
        super().__init__(message)
        self.operation = operation
        self.message = message
        self.errno = err
        self.kind = kind


class ProbeSkipped(Exception):
    """The probe cannot run here (a tool is not installed); not a failure."""


def _op(operation: str, fn: Callable[..., T], *args: object, kind: str | None = None, **kw: object) -> T:
    try:
        return fn(*args, **kw)
    except OSError as e:
        raise ProbeFailure(operation, describe(e), e.errno, kind) from e


def describe(e: OSError) -> str:
    name = _errno.errorcode.get(e.errno or 0, str(e.errno))
    where = " -> ".join(str(p) for p in (e.filename, e.filename2) if p is not None)
    return f"{name}: {e.strerror or e}" + (f" ({where})" if where else "")


def _check(ok: bool, operation: str, message: str) -> None:
    if not ok:
        raise ProbeFailure(operation, message)


def _write(path: str, data: bytes = b"warren-doctor\n") -> None:
    fd = _op("create", os.open, path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        _op("write", os.write, fd, data)
    finally:
        os.close(fd)


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ProbeFailure("open", describe(e), e.errno) from e


def _mkdirs(*paths: str) -> None:
    for p in paths:
        _op("mkdir", os.mkdir, p)


j = os.path.join

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


def rename_across_dirs(d: str) -> str:
    _mkdirs(j(d, "x"), j(d, "y"))
    _write(j(d, "x", "f"))
    _op("rename", os.rename, j(d, "x", "f"), j(d, "y", "f"), kind="file")
    return ""


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
    _mkdirs(j(d, "x"), j(d, "y"))
    _write(j(d, "x", "f"))
    _op("link", os.link, j(d, "x", "f"), j(d, "y", "f"), kind="file")
    return ""


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


def unix_socket(d: str) -> str:
    path = j(d, "sock")
    dfd = None
    # sun_path holds 108 bytes: reach a deep directory through its /proc/self/fd link.
    if len(os.fsencode(path)) > 100 and os.path.isdir("/proc/self/fd"):
        dfd = os.open(d, os.O_PATH | os.O_CLOEXEC)
        path = f"/proc/self/fd/{dfd}/sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        _op("bind", server.bind, path)
        server.listen(1)
        _op("connect", client.connect, path)
        conn, _ = server.accept()
        with conn:
            client.sendall(b"!")
            _check(conn.recv(1) == b"!", "recv", "no data arrived through the socket")
    finally:
        client.close()
        server.close()
        if dfd is not None:
            os.close(dfd)
    return ""


def fifo(d: str) -> str:
    path = j(d, "fifo")
    _op("mkfifo", os.mkfifo, path, 0o600)
    r = _op("open(fifo)", os.open, path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        w = _op("open(fifo)", os.open, path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            os.write(w, b"!")
            _check(os.read(r, 1) == b"!", "read", "no data arrived through the FIFO")
        finally:
            os.close(w)
    finally:
        os.close(r)
    return ""


def inotify(d: str) -> str:
    fd = _op("inotify_init1", _kernel.inotify_init)
    try:
        _op("inotify_add_watch", _kernel.inotify_add_watch, fd, d, _kernel.IN_CREATE | _kernel.IN_MOVED_TO)
        _write(j(d, "watched"))
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        _check(bool(poller.poll(2000)), "read(inotify)", "no event within 2 s of creating a file")
        _check(b"watched" in os.read(fd, 4096), "read(inotify)", "the event does not name the created file")
    finally:
        os.close(fd)
    return ""


def _git_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    # The user's own config (hooks, signing) is not filesystem semantics: leave it out.
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_AUTHOR_NAME="warren doctor",
        GIT_AUTHOR_EMAIL="doctor@warren.invalid",
        GIT_COMMITTER_NAME="warren doctor",
        GIT_COMMITTER_EMAIL="doctor@warren.invalid",
    )
    return env


_STRERRORS = {
    os.strerror(e): e for e in (_errno.EXDEV, _errno.EACCES, _errno.EPERM, _errno.EROFS, _errno.ENOSPC)
}


def git_commit(d: str) -> str:
    git = shutil.which("git")
    if git is None:
        raise ProbeSkipped("git is not installed")
    repo = j(d, "repo")
    _op("mkdir", os.mkdir, repo)
    _write(j(repo, "README"))
    for step in (["init", "-q"], ["add", "README"], ["commit", "-q", "--no-gpg-sign", "-m", "doctor"]):
        try:
            p = subprocess.run(
                [git, *step], cwd=repo, env=_git_env(), capture_output=True, text=True, timeout=60
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ProbeFailure(f"git {step[0]}", str(e)) from e
        if p.returncode != 0:
            out = (p.stderr or p.stdout).strip().splitlines()
            msg = out[-1] if out else f"exit status {p.returncode}"
            err = next((n for s, n in _STRERRORS.items() if s in msg), None)
            raise ProbeFailure(f"git {step[0]}", msg, err)
    return ""


def _cwd() -> str:
    try:
        cwd = os.getcwd()
    except OSError as e:
        raise ProbeFailure("getcwd", describe(e), e.errno) from e
    _op("stat", os.stat, ".")
    return cwd


# --- probes between two locations -------------------------------------------------


def hardlink_between(src: str, dst: str) -> str:
    _write(j(src, "blob"))
    _op("link", os.link, j(src, "blob"), j(dst, "linked"), kind="file")
    return ""


def rename_between(src: str, dst: str) -> str:
    _write(j(src, "moving"))
    _op("rename", os.rename, j(src, "moving"), j(dst, "moved"), kind="file")
    return ""


# --- the catalogue ----------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    id: str
    title: str
    required: bool
    fn: Callable[[str], str]


FILE_PROBES: tuple[Probe, ...] = (
    Probe("create_file", "create, write and read a file", True, create_file),
    Probe("create_dir", "create and remove a directory", True, create_dir),
    Probe("o_tmpfile", "O_TMPFILE, then link it into place", False, o_tmpfile),
    Probe("rename_same_dir", "rename a file within one directory", True, rename_same_dir),
    Probe("rename_across_dirs", "rename a file into another directory", True, rename_across_dirs),
    Probe("renameat2_noreplace", "renameat2(RENAME_NOREPLACE)", False, renameat2_noreplace),
    Probe("renameat2_exchange", "renameat2(RENAME_EXCHANGE)", False, renameat2_exchange),
    Probe("dir_rename", "rename a directory within its parent", True, dir_rename),
    Probe("dir_rename_across_dirs", "move a directory into another directory", True, dir_rename_across_dirs),
    Probe("hardlink_same_dir", "hardlink within one directory", True, hardlink_same_dir),
    Probe("hardlink_across_dirs", "hardlink into another directory", True, hardlink_across_dirs),
    Probe("symlink", "create and follow a symlink", True, symlink),
    Probe("fsync", "fsync a file and its directory", True, fsync),
    Probe("flock", "flock, enforced between open files", True, flock),
    Probe("fcntl_lock", "fcntl POSIX and OFD locks", True, fcntl_lock),
    Probe("mmap_shared", "shared writable mmap", True, mmap_shared),
    Probe("xattr_user", "user.* extended attributes", False, xattr_user),
    Probe("chmod_utimes", "chmod and utimes", True, chmod_utimes),
    Probe("sparse_file", "sparse file", False, sparse_file),
    Probe("long_path", "path longer than 1,024 bytes", True, long_path),
    Probe("non_ascii_name", "non-ASCII file names", True, non_ascii_name),
)
WORKSPACE_PROBES: tuple[Probe, ...] = (
    Probe("unix_socket", "unix socket: bind, connect, send", True, unix_socket),
    Probe("fifo", "FIFO: mkfifo, open, write, read", True, fifo),
    Probe("inotify", "inotify sees a new file", False, inotify),
    Probe("git_commit", "git init, add, commit in a scratch repo", True, git_commit),
)
WRITABLE_PROBES: tuple[Probe, ...] = (FILE_PROBES[0], FILE_PROBES[1])


# --- the runner -------------------------------------------------------------------


def _result(
    probe_id: str,
    title: str,
    location: str,
    required: bool,
    fn: Callable[[], str],
    src: str | None = None,
    dst: str | None = None,
) -> ProbeResult:
    base = ProbeResult(probe_id, title, location, "pass", required, src=src, dst=dst)
    try:
        detail = fn()
    except ProbeFailure as f:
        return replace(
            base, status="fail", operation=f.operation, errno=f.errno, message=f.message, kind=f.kind
        )
    except ProbeSkipped as s:
        return replace(base, status="skip", message=str(s))
    except Exception as e:  # a probe that crashes is reported, never raised
        return replace(base, status="error", message=f"{type(e).__name__}: {e}")
    return replace(base, detail=detail)


def _probe_in_subdir(probe: Probe, scratch: str, n: int) -> Callable[[], str]:
    def run() -> str:
        d = j(scratch, f"{n:02d}-{probe.id}")
        _op("mkdir", os.mkdir, d)
        return probe.fn(d)

    return run


def _between(fn: Callable[[str, str], str], src: str, dst: str, n: int) -> Callable[[], str]:
    def run() -> str:
        s, t = j(src, f"{n:02d}-src"), j(dst, f"{n:02d}-dst")
        _mkdirs(s, t)
        return fn(s, t)

    return run


def _dir_into_root(scratch: str, root: str) -> Callable[[], str]:
    """Move a new directory into the workspace root itself, as tools do when they
    unpack into a temporary directory and move it into place. On overlayfs the root is
    often a directory of a lower (image) layer, and overlay must mark the moved directory
    opaque with an xattr, which it cannot do without xattr support (userxattr)."""

    def run() -> str:
        src = j(scratch, "dir-into-root")
        _mkdirs(src, j(src, "sub"))
        target = j(root, os.path.basename(scratch) + "-moved")
        _op("rename", os.rename, j(src, "sub"), target, kind="dir")
        _op("rmdir", os.rmdir, target)
        return ""

    return run


def _skip_all(probes: tuple[Probe, ...], role: str, why: str) -> list[ProbeResult]:
    return [ProbeResult(p.id, p.title, role, "skip", p.required, message=why) for p in probes]


_INTO_WORKSPACE = ("hardlink_into_workspace", "rename_into_workspace")


def run_probes(evidence: Evidence, *, full_suite_roles: frozenset[str]) -> list[ProbeResult]:
    """Run every probe for every location of ``evidence``; return one result each.

    Locations in ``full_suite_roles`` get every file probe; the workspace also gets
    sockets, FIFOs, inotify and git; tool caches only whether they are writable; and
    every cache gets hardlink and rename into the workspace.
    """
    results: list[ProbeResult] = [_result("cwd", "the working directory exists", "process", True, _cwd)]
    scratch: dict[str, str] = {}
    counter = iter(range(10_000))
    for loc in evidence.locations:
        if loc.role == "workspace":
            probes = FILE_PROBES + WORKSPACE_PROBES
        elif loc.role in full_suite_roles:
            probes = FILE_PROBES
        else:
            probes = WRITABLE_PROBES
        made = _make_scratch(loc)
        if isinstance(made, ProbeResult):
            results.append(made)
            rest = tuple(p for p in probes if p.id != "create_dir")
            results.extend(_skip_all(rest, loc.role, "no scratch directory could be created"))
            continue
        scratch[loc.role] = made
        for probe in probes:
            results.append(
                _result(
                    probe.id,
                    probe.title,
                    loc.role,
                    probe.required,
                    _probe_in_subdir(probe, made, next(counter)),
                )
            )
        if loc.role == "workspace":
            results.append(
                _result(
                    "dir_rename_into_root",
                    "move a new directory into the workspace root",
                    "workspace",
                    True,
                    _dir_into_root(made, loc.path),
                )
            )
    ws = scratch.get("workspace")
    for loc in evidence.locations:
        if loc.role == "workspace" or loc.role not in scratch:
            continue
        src = scratch[loc.role]
        where = f"{loc.role}->workspace"
        if ws is None:
            why = "the workspace could not be probed"
            ids = ("rename_into_workspace",) if loc.role == "tmpdir" else _INTO_WORKSPACE
            for probe_id in ids:
                results.append(
                    ProbeResult(probe_id, probe_id.replace("_", " "), where, "skip", True, message=why)
                )
            continue
        if loc.role == "tmpdir":
            results.append(
                _result(
                    "rename_into_workspace",
                    "rename a temp file into the workspace",
                    where,
                    False,
                    _between(rename_between, src, ws, next(counter)),
                    src=loc.role,
                    dst="workspace",
                )
            )
            for other in evidence.locations:
                if other.role.startswith(("cache", "tool-cache")) and other.role in scratch:
                    results.append(
                        _result(
                            "rename_into_cache",
                            "rename a temp file into the cache",
                            f"tmpdir->{other.role}",
                            False,
                            _between(rename_between, src, scratch[other.role], next(counter)),
                            src="tmpdir",
                            dst=other.role,
                        )
                    )
            continue
        results.append(
            _result(
                "hardlink_into_workspace",
                "hardlink a cached file into the workspace",
                where,
                True,
                _between(hardlink_between, src, ws, next(counter)),
                src=loc.role,
                dst="workspace",
            )
        )
        results.append(
            _result(
                "rename_into_workspace",
                "rename a cached file into the workspace",
                where,
                True,
                _between(rename_between, src, ws, next(counter)),
                src=loc.role,
                dst="workspace",
            )
        )
    for role, path in scratch.items():
        results.extend(_cleanup(role, path))
    return results


def _make_scratch(loc: Location) -> str | ProbeResult:
    title = "create the scratch directory"
    try:
        return tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=loc.probe_dir)
    except OSError as e:
        return ProbeResult("create_dir", title, loc.role, "fail", True, "mkdir", e.errno, describe(e), "dir")


def _cleanup(role: str, path: str) -> list[ProbeResult]:
    errors: list[str] = []
    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=lambda _f, p, e: errors.append(f"{p}: {e}"))
    else:
        shutil.rmtree(path, onerror=lambda _f, p, ei: errors.append(f"{p}: {ei[1]}"))
    if os.path.lexists(path) or errors:
        msg = "; ".join(errors[:3]) or "the scratch directory is still there"
        title = "remove the scratch directory"
        return [ProbeResult("cleanup", title, role, "error", True, message=f"left {path}: {msg}")]
    return []
