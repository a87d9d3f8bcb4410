"""The native tree walk (``native/walk.c``, compiled at install as ``warren-walk``):
the supervisor's two walks of a writable root — the hard-link scan (``server.links``)
and the repository walk (``server.gitfind``) — in one pass of getdents64 and fstatat,
from a descriptor of the root, never through a link.

Without the program (no C compiler at install, ``WARREN_NATIVE_WALK=0``), or when it
fails, ``walk`` answers None and the callers walk in Python, which gives the same
answers (``tests/test_treewalk.py`` runs both on the same trees). A launch's walks
(``Walks``) are native only for a tree of more than ``SMALL`` entries: starting the
program costs about a millisecond, what Python takes to walk a thousand entries.
``WARREN_NATIVE_WALK=1`` walks every tree natively (the tests of small trees). On more
than one CPU the program walks with a thread per CPU (at most four); ``THREADS`` sets
the count instead (the tests run both the single walk and the threaded one).

Owns: finding and running the program, and reading its output.
"""

from __future__ import annotations

import contextlib
import os
import resource
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, field

from . import programs, safepath

NAME = "warren-walk"
# what a 'G' record's kind byte means (gitfind's names for them)
KINDS = {1: "bare", 2: "dotgit", 3: "dotfile"}
_LINK = struct.Struct("<QQQI")
_GIT = struct.Struct("<BI")
_program: str | bool | None = False  # False: not looked for yet
_spent = 0.0  # CPU seconds the walks' processes took, in all
BACKGROUND_NICE = 10  # a walk that may be given up (``Stop``) runs at this niceness (walk.c's too)
SMALL = 1000  # entries: a tree with at most these is walked in Python (see above)
THREADS: int | None = None  # the program's threads; None: one per CPU (the tests set it)


@dataclass
class Tree:
    """What the walk reported, paths relative to the root ("" is the root itself)."""

    # dev, ino, nlink, path of each regular file with more than one link
    linked: list[tuple[int, int, int, str]] = field(default_factory=list)
    # path, kind ("bare", "dotgit", "dotfile") of each directory git would look at
    git: list[tuple[str, str]] = field(default_factory=list)


def program() -> str | None:
    """Where the compiled walk is: among this Python's scripts, or beside the interpreter
    (where ``_core.execstub`` looks for its program)."""
    global _program
    if os.environ.get("WARREN_NATIVE_WALK") == "0":
        return None
    if _program is False:
        _program = programs.find(NAME, "WARREN_NATIVE_WALK")
    return _program if isinstance(_program, str) else None


class Stopped(Exception):
    """A walk given up (``Stop.stop``): its sandbox ended before it did."""


class Stop:
    """A walk that may be given up from another thread (``server.linkwalk``)."""

    def __init__(self) -> None:
        self.stopped = threading.Event()
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None

    def stop(self) -> None:
        with self._lock:
            self.stopped.set()
            if self._proc is not None:
                with contextlib.suppress(OSError):
                    self._proc.kill()

    def check(self) -> None:
        if self.stopped.is_set():
            raise Stopped

    def started(self, proc: subprocess.Popen[bytes] | None) -> None:
        with self._lock:
            self._proc = proc
            if proc is not None and self.stopped.is_set():
                with contextlib.suppress(OSError):
                    proc.kill()


def walk(root_fd: int, *, links: bool, git: bool, stop: Stop | None = None) -> Tree | None:
    """The tree beneath ``root_fd``: its multiply-linked files (``links``), the
    directories git would take for repositories or that hold one (``git``). None when
    the native walk is not there or did not finish: walk in Python instead. ``stop``:
    given up when asked (``Stopped``)."""
    global _spent
    exe = program()
    if exe is None or not (links or git):
        return None
    before = resource.getrusage(resource.RUSAGE_CHILDREN) if stop is None else None
    try:
        # "b": in the background (a walk that may be given up; see below)
        mode = ("l" if links else "") + ("g" if git else "") + ("b" if stop is not None else "")
        proc = subprocess.Popen(
            [exe, mode, str(root_fd)] + ([str(THREADS)] if THREADS is not None else []),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            pass_fds=(root_fd,),
            env={},
        )
    except OSError:
        return None
    try:
        if stop is not None:
            stop.started(proc)
            # A walk after launch runs beside the sandbox's own start and commands: it
            # yields the CPU to them (the calls that wait for it are writes alone). The
            # program takes ``BACKGROUND_NICE`` itself ("b"), before it makes its threads:
            # set from here once it had started, one walk in two had a worker at 0 unless
            # the caller's thread was niced already (``server.linkwalk``'s is).
        out, _ = proc.communicate()
    finally:
        if stop is not None:
            stop.started(None)
        if before is not None:  # (another thread's walks would count here too)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            _spent += after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    if stop is not None:
        stop.check()
    if proc.returncode != 0:
        return None
    return parse(out)


def cpu() -> float:
    """This process's CPU time with its walks' (``time.process_time`` counts only its
    own: a walk in another process is work done for it all the same)."""
    return time.process_time() + _spent


def parse(data: bytes) -> Tree | None:
    """The records of ``native/walk.c``; None unless they end as a finished walk does."""
    tree = Tree()
    linked, git = tree.linked, tree.git
    decode = os.fsdecode
    pos, end = 0, len(data)
    try:
        while pos < end:
            tag = data[pos]
            if tag == 0x4C:  # L
                dev, ino, nlink, size = _LINK.unpack_from(data, pos + 1)
                pos += 1 + _LINK.size
                linked.append((dev, ino, nlink, decode(data[pos : pos + size])))
                pos += size
            elif tag == 0x47:  # G
                kind, size = _GIT.unpack_from(data, pos + 1)
                pos += 1 + _GIT.size
                git.append((decode(data[pos : pos + size]), KINDS[kind]))
                pos += size
            elif tag == 0x45 and pos + 1 == end:  # E: the walk ended
                return tree
            else:
                return None
    except (struct.error, KeyError):
        return None
    return None


class Walks:
    """A launch's walks of its roots: a root both walks need (the workspace, usually) is
    walked once for both, and the second asker gets that walk if its descriptor is of
    the same directory (else it is walked again). Each walk is handed out at most twice."""

    def __init__(
        self,
        both: set[str] | frozenset[str] = frozenset(),
        small: int = SMALL,
        native: bool = True,
        stop: Stop | None = None,
    ) -> None:
        """``native``: False walks every tree in Python (the repository walk's memory
        is warm there); ``stop``: the walks may be given up (``Stopped``)."""
        self.both = both
        self.small = 0 if os.environ.get("WARREN_NATIVE_WALK") == "1" else small
        self.native = native
        self.stop = stop
        self._kept: dict[tuple[str, int, int], Tree] = {}

    def python_first(self, root: str) -> int | None:
        """For a walk that can be made in Python: how many entries it may list before it
        gives up for the native walk (``tree`` with ``counted``), so that a small tree
        is listed once rather than counted (``_at_most``) and then walked. None: ``tree``
        decides as ever (no native walk, every tree native, or a root both walks share)."""
        if not self.native or self.small <= 0 or root in self.both or program() is None:
            return None
        return self.small

    def tree(self, root: str, root_fd: int, *, links: bool, git: bool, counted: bool = False) -> Tree | None:
        """The native walk of ``root`` (its descriptor ``root_fd``), or None: walk it in
        Python (a small tree, or no native walk). ``counted``: the caller's Python walk
        found it past ``python_first``'s count already."""
        try:
            st = os.fstat(root_fd)
        except OSError:
            return None
        key = (root, st.st_dev, st.st_ino)
        kept = self._kept.pop(key, None)
        if kept is not None:
            return kept
        if not self.native or program() is None or (not counted and _at_most(root_fd, self.small)):
            return None
        shared = root in self.both
        tree = walk(root_fd, links=links or shared, git=git or shared, stop=self.stop)
        if tree is not None and shared:
            self._kept[key] = tree
        return tree


def large(root_fd: int) -> bool:
    """Whether the tree beneath ``root_fd`` has more than ``SMALL`` entries (every tree
    does under ``WARREN_NATIVE_WALK=1``, which the tests of small trees set)."""
    return os.environ.get("WARREN_NATIVE_WALK") == "1" or not _at_most(root_fd, SMALL)


def _at_most(root_fd: int, limit: int) -> bool:
    """Whether the tree beneath ``root_fd`` has at most ``limit`` entries (listed only,
    beneath each parent's descriptor, never through a link; stops past the limit)."""
    if limit <= 0:
        return False
    count = 0
    stack = [os.dup(root_fd)]
    try:
        while stack:
            fd = stack.pop()
            try:
                with os.scandir(fd) as it:
                    subdirs = []
                    for e in it:
                        count += 1
                        if count > limit:
                            return False
                        try:
                            if e.is_dir(follow_symlinks=False):
                                subdirs.append(e.name)
                        except OSError:
                            continue
                for name in subdirs:
                    try:
                        stack.append(safepath.dir_beneath(fd, name))
                    except OSError:
                        continue
            except OSError:
                continue
            finally:
                os.close(fd)
    finally:
        for fd in stack:
            os.close(fd)
    return True
