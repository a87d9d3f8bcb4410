"""Where every PID 1 is cloned from: a small process that holds only warren's code.

A PID 1 is a copy-on-write image of the process that clones it, and a page stays
shared only while neither side writes it. Cloned from the supervisor, whose heap
changes with every client it serves, each PID 1 soon held a private copy of most of
the supervisor's pages: 5-6 MiB of memory per idle sandbox, measured after 20 s. The
spawner is forked from the supervisor once (as it starts, before it has read any
request: ``clone.start_spawner``; one started later, to replace one that died, is a
new interpreter: ``Spawner.start_fresh``), drops everything but its channel, takes
its objects out of the garbage collector's reach (``gc.freeze``: a collection writes
to every object it visits), and then only clones: its pages stay as they were, so
every PID 1 shares them with every other. It also holds no client's request beyond
the one it is cloning for.

Each PID 1 is cloned with CLONE_PARENT: its parent is the supervisor, as if the
supervisor had cloned it — the supervisor reaps it, and PID 1's parent-death signal
follows the supervisor. The channel carries the plan as a pickle: both ends are
warren's own processes, one forked from the other, and nothing else holds it.

The supervisor's other long-running helpers that run Python (the network helper) come
from here too, for the same reason (``Request.helper``): a fork of the supervisor soon
owns every page the supervisor writes after it (6 MB for a network helper), a child of
the spawner shares them. Such a helper is registered by name before the spawner starts
(``HELPERS``: the spawner is a fork of the supervisor, so it knows every one the
supervisor registered at import), and what it needs beyond descriptors travels in a
descriptor of its own that only the helper reads (secrets among it: the spawner, whose
memory every later keeper copies, never holds them).
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import signal
import socket
import struct
import sys
from collections.abc import Callable
from typing import NoReturn

from . import _sys

_HEAD = struct.Struct("!Q")
MAX_FDS = 64  # the control channel, a cgroup tasks file per controller, layers given


class Request:
    """What one clone needs besides its descriptors (which travel beside it)."""

    def __init__(
        self,
        plan: object,
        oneshot: bool,
        cgroups: list[str],
        ahead: bool = False,
        layers: list[tuple[int, int]] | None = None,
        join: bool = False,
        ruleset: bool = False,
        git: list[str] | None = None,
    ) -> None:
        self.plan, self.oneshot, self.cgroups, self.ahead = plan, oneshot, cgroups, ahead
        self.layers = layers or []  # (index of an overlay layer, how many descriptors give it)
        # A keeper that joins a live sandbox (``rejoin``): PID 1's pidfd comes after the
        # cgroups, then the last keeper's ruleset (if ``ruleset``) and its git
        # directories' descriptors (``git``: their paths, in order).
        self.join = join
        self.ruleset = ruleset
        self.git = git or []
        # A helper of the supervisor's (``HELPERS``) rather than a PID 1: its channel
        # first, its cgroups' tasks after it, then the descriptors it takes.
        self.helper: str | None = None


# A helper's body, in its child of the spawner: (its channel, its cgroups' tasks
# descriptors, the other descriptors it was given) -> its exit code.
Helper = Callable[[socket.socket, list[tuple[str, int]], list[int]], int]
HELPERS: dict[str, Helper] = {}
# Modules a helper needs besides its own (``joined``'s operations), imported by a
# spawner started as a new interpreter (``Spawner.start_fresh``).
NEEDS: set[str] = set()


Clone = Callable[[object, socket.socket, bool, list[tuple[str, int]], bool, dict[int, list[int]]], int]


class Spawner:
    """The supervisor's end: ``clone`` hands a request over and returns PID 1's pid,
    or raises the ``OSError`` the clone raised there."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid, self.sock = pid, sock

    @classmethod
    def start(cls, clone: Clone) -> Spawner:
        """Forked: only by a supervisor that has served nothing yet, whose memory holds
        no client's request (``clone.start_spawner``)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        pid = os.fork()
        if pid == 0:
            ours.close()
            _serve(theirs, clone)
        theirs.close()
        return cls(pid, ours)

    @classmethod
    def start_fresh(cls, nofile: int | None) -> Spawner:
        """A new interpreter running the spawner (``main``): any spawner started after
        the supervisor has served requests (one that died, replaced). A fork then
        would copy whatever the supervisor holds by then — the secrets of the sandboxes
        it serves among it — into the spawner and every keeper it joins. It imports
        the modules that registered ``HELPERS`` here, which register them there;
        ``nofile``: ``clone.sandbox_nofile``. About 0.1 s, once."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        modules = sorted({body.__module__ for body in HELPERS.values()} | NEEDS)
        package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package, env.get("PYTHONPATH", "")) if p)
        argv = [sys.executable, "-c", "from warren._core.spawner import main; main()"]
        argv += [str(theirs.fileno()), str(nofile or 0), *modules]
        try:
            os.set_inheritable(theirs.fileno(), True)
            pid = os.posix_spawn(sys.executable, argv, env)
        finally:
            theirs.close()
        return cls(pid, ours)

    def clone(self, request: Request, fds: list[int]) -> int:
        payload = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        socket.send_fds(self.sock, [_HEAD.pack(len(payload))], fds)
        self.sock.sendall(payload)
        answer = _recv_exactly(self.sock, 8)
        value = int(struct.unpack("!q", answer)[0])
        if value < 0:
            raise OSError(-value, f"clone: {os.strerror(-value)}")
        return value

    def close(self) -> None:
        self.sock.close()


def main() -> NoReturn:
    """The spawner as a process of its own (``Spawner.start_fresh``): argv is its
    channel's descriptor, the sandboxes' descriptor limit (0: none), and the modules
    whose import registers its helpers."""
    import importlib

    from . import clone

    fd, nofile, *modules = sys.argv[1:]
    for name in modules:
        importlib.import_module(name)
    clone.sandbox_nofile = int(nofile) or None
    _serve(socket.socket(fileno=int(fd)), clone.clone_in_spawner)


def _start_helper(name: str, control: socket.socket, tasks: list[tuple[str, int]], fds: list[int]) -> int:
    """In the spawner: the helper ``name`` cloned with CLONE_PARENT (the supervisor's
    child, as PID 1 is: it reaps it, and names it by a pidfd it opens before reaping
    anything, so the pid cannot be another's by then); its pid."""
    if name not in HELPERS:
        raise OSError(38, f"no helper named {name!r} in the spawner")
    pid = _sys.clone_process(_sys.CLONE_PARENT)
    if pid == 0:
        run_helper(name, control, tasks, fds)
    return pid


def run_helper(name: str, control: socket.socket, tasks: list[tuple[str, int]], fds: list[int]) -> NoReturn:
    """In a helper's new process (a clone of the spawner's, or a fork of the
    supervisor's where no spawner can be had: ``clone.start_helper``): nothing kept but
    what it was given, then its body, then its exit."""
    code = 125
    try:
        with contextlib.suppress(ValueError):
            signal.set_wakeup_fd(-1)  # a forked supervisor's, numbered for a descriptor it closes
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the spawner's (``rejoin.reap_keepers``)
        _sys.close_all_but(control.fileno(), *(fd for _path, fd in tasks), *fds)
        code = HELPERS[name](control, tasks, fds)
    finally:
        os._exit(code)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(n - len(chunks))
        if not chunk:
            raise ConnectionResetError("the spawner's channel closed")
        chunks += chunk
    return bytes(chunks)


def _serve(sock: socket.socket, clone: Clone) -> NoReturn:
    """In the spawner: nothing but its channel, then one clone per request, until the
    supervisor closes the channel (or dies: the parent-death signal)."""
    code = 0
    try:
        _sys.prctl(_sys.PR_SET_PDEATHSIG, signal.SIGKILL)
        with contextlib.suppress(ValueError):
            signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        from .clone import preload
        from .rejoin import reap_keepers

        signal.signal(signal.SIGCHLD, reap_keepers)

        _sys.close_all_but(sock.fileno())
        preload()  # shared by every PID 1, and nothing left to import inside
        gc.collect()
        gc.freeze()
        while True:
            try:
                head, fds, _flags, _addr = socket.recv_fds(sock, _HEAD.size, MAX_FDS)
            except OSError:
                break
            if not head:
                break
            try:
                (size,) = _HEAD.unpack(head + _recv_exactly(sock, _HEAD.size - len(head)))
                request = pickle.loads(_recv_exactly(sock, size))
                assert isinstance(request, Request)
                ntasks = len(request.cgroups)
                control, tasks = (
                    socket.socket(fileno=fds[0]),
                    list(zip(request.cgroups, fds[1 : 1 + ntasks], strict=True)),
                )
                given, rest = {}, fds[1 + ntasks :]
                for index, count in request.layers:
                    given[index], rest = rest[:count], rest[count:]
                try:
                    if request.helper is not None:
                        value = _start_helper(request.helper, control, tasks, rest)
                    elif request.join:
                        from . import rejoin

                        pidfd, kept = rest[0], rest[1:]
                        ruleset = kept.pop(0) if request.ruleset else -1
                        git = dict(zip(request.git, kept, strict=True))
                        value = rejoin.join(request.plan, control, tasks, pidfd, ruleset, git)  # type: ignore[arg-type]
                    else:
                        value = clone(request.plan, control, request.oneshot, tasks, request.ahead, given)
                except OSError as e:
                    value = -(e.errno or 5)
                finally:
                    control.close()
                    for fd in fds[1:]:
                        os.close(fd)
                sock.sendall(struct.pack("!q", value))
            except (OSError, ValueError, AssertionError):
                break
    except BaseException:
        code = 1
    os._exit(code)
