"""Processes inside a sandbox, read from its own /proc: the table, one process's tree,
killing a tree, and telling warren's own processes from the user's.

warren's own (PID 1 and its helpers) are the only processes in a sandbox without a
seccomp filter: every command installs one before execve and cannot remove it, so
that mark cannot be forged.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from . import execstub


def table() -> list[tuple[int, int, str]]:
    """(pid, ppid, state) of every process in this pid namespace."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out.append((int(name), int(fields[1]), fields[0]))
    return out


def state(pid: int) -> str:
    """The one-letter state of ``pid`` ("R", "S", "T", ...); "" when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2 :].split(maxsplit=1)[0]


def running(pid: int) -> bool:
    """True while a thread of ``pid`` is neither stopped nor dead. The process's own
    state is its main thread's: a leader that called ``pthread_exit`` reads as a zombie
    while its other threads go on, so each task is read."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2 :].split(maxsplit=1)[0] not in ("T", "t", "Z", "X"):
            return True
    return False


PF_EXITING = 0x4  # a task's flags (/proc/PID/stat, field 9): it is on its way out


def exiting(pid: int) -> bool:
    """True when every thread of ``pid`` is on its way out (in the kernel's exit, or
    dead): it runs no instruction of its own again, so it writes nothing more."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split(maxsplit=7)
        if fields[0] not in ("Z", "X") and not int(fields[6]) & PF_EXITING:
            return False
    return True


def describe_task(tid: int) -> tuple[str, bool] | None:
    """How a task (a thread, by its id in this /proc) reads for a message: ``"12 (sh)
    S do_wait"`` (its state letter; where it sleeps in the kernel, when this process
    may read that), and whether it is in the kernel's exit. None when it is gone."""
    try:
        with open(f"/proc/{tid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2 :].split(maxsplit=7)
    wchan = ""
    with contextlib.suppress(OSError, UnicodeDecodeError), open(f"/proc/{tid}/wchan") as f:
        wchan = f.read().strip()
    in_exit = fields[0] not in ("Z", "X") and bool(int(fields[6]) & PF_EXITING)
    where = "in its exit" if in_exit else wchan if wchan not in ("", "0") else ""
    words = [f"{tid} ({comm})", fields[0], where]
    return " ".join(w for w in words if w), in_exit


_own_filters: int | None = None


def status_number(pid: int | str, key: str) -> int | None:
    """A number of /proc/PID/status (``Tgid``, ``Seccomp_filters``: the kernel has it
    since 5.9), or None when the line is not there."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return None


def is_warren(pid: int) -> bool:
    """True for PID 1 and warren's helpers, and for a command's process made ahead of
    time while it waits (as the exec stub, or in Python); False for commands.

    Asked in PID 1 or a helper. warren's processes have the filters PID 1 has (its
    broker's, when it has one) and no more; a command has its own filter on top, and
    cannot shed one. The stub is confined already, so it is told by its program: a
    command that made a memfd of that name and exec'd it would pass for it, which only
    hides it from ``warren ps``."""
    global _own_filters
    try:
        if _own_filters is None:
            _own_filters = status_number("self", "Seccomp_filters")
        theirs = status_number(pid, "Seccomp_filters")
        if _own_filters is None or theirs is None:
            return False
        if theirs <= _own_filters:
            return True
        return os.readlink(f"/proc/{pid}/exe") == execstub.MEMFD_NAME
    except (OSError, ValueError):
        return False


def cmdline(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0")[:-1]]
    except OSError:
        return None


def signal_member(pid: int, sig: int, root: int) -> bool:
    """Send ``sig`` to ``pid`` only if it is ``root`` or one of its descendants: pinned
    by a pidfd first and its ancestry read after, so a pid that was freed and taken by
    a process of the host meanwhile is never the one signalled (a host process is
    never a descendant of a sandbox's PID 1). False when nothing was sent."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        if not _descends(pid, root):
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _descends(pid: int, root: int) -> bool:
    for _ in range(4096):
        if pid == root:
            return True
        if pid <= 1:
            return False
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            return False
        pid = int(stat[stat.rindex(")") + 2 :].split()[1])
    return False


def descendants(root: int) -> list[int]:
    return _below(table(), root)


def has_children() -> bool:
    me = os.getpid()
    return any(ppid == me for _pid, ppid, _state in table())


def kill_tree(main: int) -> int:
    """SIGKILL every descendant of this process until none is left; the wait status
    of ``main``. As a child subreaper this process inherits the orphans of everything
    it kills, so repeating "kill all descendants, reap" converges even for processes
    that fork, setsid or ignore SIGTERM."""
    status = 0x9  # killed by SIGKILL, if it was reaped before we saw it
    while True:
        for pid in descendants(os.getpid()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return status
            if pid == 0:
                break
            if pid == main:
                status = st
        time.sleep(0.002)


def kill_all_but(spared: set[int]) -> None:
    """SIGKILL every process of this pid namespace but ``spared``, again until none is
    left (a process forked meanwhile is caught by the next round; each round leaves
    fewer, the pids limit bounding the forks). The caller reaps what comes to it."""
    for _round in range(1000):
        left = [pid for pid, _ppid, state in table() if pid not in spared and state not in ("Z", "X")]
        if not left:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        time.sleep(0.001)


class Members:
    """The processes of one sandbox, as its PID 1 sees them. In its own pid namespace:
    every process there. Without one (the degraded mode): PID 1's descendants, and
    only they — PID 1 is their child subreaper, so an orphan comes back to it instead
    of leaving for the host's init, and a process of the host is never one of them."""

    def __init__(self, own_namespace: bool) -> None:
        self.own_namespace = own_namespace
        self.root = os.getpid()  # PID 1, also when a helper it forked asks

    def table(self) -> list[tuple[int, int, str]]:
        rows = table()
        if self.own_namespace:
            return rows
        mine = set(_below(rows, self.root))
        return [row for row in rows if row[0] in mine]

    def has(self, pid: int) -> bool:
        return self.own_namespace or _descends(pid, self.root)

    def signal_group(self, pgid: int, sig: int) -> bool:
        """``sig`` to every member in process group ``pgid``, each pinned by a pidfd and
        checked to descend from PID 1 (a recycled pid is never signalled); False when
        none was there."""
        sent = False
        for pid in _below(table(), self.root):
            with contextlib.suppress(OSError):
                if os.getpgid(pid) == pgid:
                    sent = signal_member(pid, sig, self.root) or sent
        return sent

    def kill(self, sig: int) -> None:
        """``sig`` to every process of the sandbox but PID 1. In the degraded mode a
        SIGKILL is repeated until none is left (one that forks meanwhile is caught by
        the next round: its children are descendants too)."""
        if self.own_namespace:
            with contextlib.suppress(ProcessLookupError):
                os.kill(-1, sig)
            return
        for _round in range(1000):
            left = _below(table(), self.root)
            for pid in left:
                signal_member(pid, sig, self.root)
            if sig != signal.SIGKILL or not left:
                return
            # Reap what died (PID 1 is its parent, or inherits it as subreaper).
            with contextlib.suppress(ChildProcessError):
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            time.sleep(0.001)


def _below(rows: list[tuple[int, int, str]], root: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for pid, ppid, _state in rows:
        kids.setdefault(ppid, []).append(pid)
    out, todo = [], list(kids.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out
