"""The write ends of background processes' stdin pipes, which the supervisor holds.

A spawn asked with ``stdin`` gets a pipe: its read end goes to the command with the
handoff (it becomes the command's fd 0), its write end stays here, per (sandbox, spawn
id). The supervisor is single-threaded and serves every client, so nothing here may
wait on a process: the write end is non-blocking and enlarged (``F_SETPIPE_SZ``), what
the pipe does not take now waits in a queue that the event loop flushes when the pipe
is writable, and that queue is bounded (``protocol.STDIN_MAX_QUEUED``): beyond it a
write is refused with ``StdinFull``, since the process is not reading. A write end is
closed on eof (once its queue is flushed), when its process ends or closes its stdin,
and when its sandbox ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import selectors
import time
from collections import deque
from dataclasses import dataclass, field

from .. import protocol
from ..errors import ProcessEnded, StdinClosed, StdinFull, StdinNotOpen, WarrenError
from . import spawns

PIPE_SIZE = 1 << 20  # what the kernel holds for the command (a pipe has 64 KiB by default)
SWEEP_EVERY = 1.0  # seconds between looks for pipes whose process has gone


@dataclass(eq=False)
class Pipe:
    sandbox: str
    spawn_id: str
    fd: int  # the write end, non-blocking
    queue: deque[memoryview] = field(default_factory=deque)
    queued: int = 0
    eof: bool = False  # close once the queue is flushed
    watched: bool = False  # in the selector (for EVENT_WRITE) while the queue holds data


class StdinPipes:
    """Every open stdin pipe of the supervisor's sandboxes. ``sel`` is the supervisor's
    selector: a pipe with queued data is registered there as ``("stdin", pipe)``, and
    the supervisor calls ``flush`` when it is writable."""

    def __init__(self, root: str, sel: selectors.BaseSelector) -> None:
        self.root = root
        self.sel = sel
        self.pipes: dict[tuple[str, str], Pipe] = {}
        self.opened: set[tuple[str, str]] = set()  # every spawn given a pipe, closed since or not
        self.unread: set[tuple[str, str]] = set()  # closed because the process closed its end
        self.last_sweep = time.monotonic()

    def open(self, sandbox: str, spawn_id: str) -> int:
        """A pipe for a new spawn; returns its read end for the command (the caller
        closes this copy once it is handed over)."""
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        # EPERM when the user's pipe budget (fs.pipe-user-pages-soft) is spent: the
        # default size still works, the queue just takes more of the load.
        with contextlib.suppress(OSError):
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        os.set_blocking(write_end, False)  # the read end, the command's, stays blocking
        key = (sandbox, spawn_id)
        self.pipes[key] = Pipe(sandbox, spawn_id, write_end)
        self.opened.add(key)
        return read_end

    def write(self, req: protocol.StdinRequest, data: bytes) -> protocol.StdinState:
        """Take ``data`` (and eof) for the process ``req`` names, or raise why not."""
        spawn_id = spawns.resolve(self.root, req.sandbox, req.process, "stdin")
        key = (req.sandbox, spawn_id)
        where = f"process {req.process} in sandbox {req.sandbox}"
        if key not in self.opened:
            raise _refused("no stdin", where, req.process)
        pipe = self.pipes.get(key)
        if spawns.ended(self.root, req.sandbox, spawn_id):
            if pipe is not None:
                self.close(pipe)
            if data:
                raise _refused("ended", where, req.process)
            return protocol.StdinState(closed=True)  # closing what is gone is no error
        if pipe is None or pipe.eof:
            if data:
                raise _refused("closed by process" if key in self.unread else "closed", where, req.process)
            return protocol.StdinState(queued=0 if pipe is None else pipe.queued, closed=True)
        _check_room(pipe, len(data), where, req.process)
        if data:
            pipe.queue.append(memoryview(data))
            pipe.queued += len(data)
        pipe.eof = req.eof
        if not self.flush(pipe) and data:
            # The pipe broke under this very write: its reader is gone.
            ended = spawns.ended(self.root, req.sandbox, spawn_id)
            raise _refused("ended" if ended else "closed by process", where, req.process)
        return protocol.StdinState(queued=pipe.queued, closed=req.eof)

    def flush(self, pipe: Pipe) -> bool:
        """Write what the pipe takes now; False once its reader is gone (the pipe is
        then closed and what was queued is dropped, as a pipe drops it)."""
        while pipe.queue:
            head = pipe.queue[0]
            try:
                n = os.write(pipe.fd, head)
            except BlockingIOError:
                break
            except OSError:  # EPIPE: no reader is left
                self.close(pipe, unread=True)
                return False
            pipe.queued -= n
            if n < len(head):
                pipe.queue[0] = head[n:]
                break
            pipe.queue.popleft()
        if pipe.eof and not pipe.queue:
            self.close(pipe)
        else:
            self._watch(pipe, bool(pipe.queue))
        return True

    def _watch(self, pipe: Pipe, on: bool) -> None:
        if on and not pipe.watched:
            self.sel.register(pipe.fd, selectors.EVENT_WRITE, ("stdin", pipe))
        elif pipe.watched and not on:
            self.sel.unregister(pipe.fd)
        pipe.watched = on

    def close(self, pipe: Pipe, unread: bool = False) -> None:
        """The process reads end of file once it has read what the pipe holds;
        ``unread``: closed because no reader is left (what was queued is dropped)."""
        if self.pipes.get((pipe.sandbox, pipe.spawn_id)) is not pipe:
            return
        if unread:
            self.unread.add((pipe.sandbox, pipe.spawn_id))
        self._watch(pipe, False)
        del self.pipes[pipe.sandbox, pipe.spawn_id]
        os.close(pipe.fd)
        pipe.queue.clear()
        pipe.queued = 0

    def close_sandbox(self, sandbox: str) -> None:
        """The sandbox ended: every pipe of it goes (a new sandbox may take the name)."""
        for pipe in [p for p in self.pipes.values() if p.sandbox == sandbox]:
            self.close(pipe)
        self.opened = {key for key in self.opened if key[0] != sandbox}
        self.unread = {key for key in self.unread if key[0] != sandbox}

    def sweep(self) -> None:
        """Now and then: close the pipes whose process ended (its status is recorded)
        or whose every reader is gone (poll reports POLLERR on the write end), so a
        supervisor keeps no descriptor for processes nobody writes to any more."""
        now = time.monotonic()
        if now - self.last_sweep < SWEEP_EVERY or not self.pipes:
            return
        self.last_sweep = now
        poller = select.poll()
        by_fd = {pipe.fd: pipe for pipe in self.pipes.values()}
        for fd in by_fd:
            poller.register(fd, 0)  # POLLERR and POLLHUP are reported whatever is asked
        broken = {fd for fd, _ev in poller.poll(0)}
        for fd, pipe in by_fd.items():
            if fd in broken or spawns.ended(self.root, pipe.sandbox, pipe.spawn_id):
                self.close(pipe, unread=fd in broken)


# Why a write to a process's stdin is refused: the error, what it says of the process
# (``where``), and what the caller can do instead.
_REFUSALS: dict[str, tuple[type[WarrenError], str, str]] = {
    "no stdin": (
        StdinNotOpen,
        "{where} was started without stdin: its stdin is /dev/null",
        'start it with stdin enabled to write to it: spawn(..., stdin=True); HTTP and MCP: "stdin": true',
    ),
    "ended": (
        ProcessEnded,
        "{where} has ended; it reads no more input",
        "see its exit status and output (Process.wait(), Process.output())",
    ),
    "closed by process": (
        StdinClosed,
        "{where} closed its stdin; the data was not delivered",
        "the program stopped reading its input; start a new process to send more",
    ),
    "closed": (
        StdinClosed,
        "the stdin of {where} is closed",
        "it was closed with close_stdin() (eof), or by the process itself; start a new process to send more",
    ),
}


def _refused(why: str, where: str, ident: str) -> WarrenError:
    kind, message, hint = _REFUSALS[why]
    return kind(message.format(where=where), operation="stdin", path=ident, hint=hint)


def _check_room(pipe: Pipe, size: int, where: str, ident: str) -> None:
    protocol.check_stdin_size(size, ident)
    bound = protocol.STDIN_MAX_QUEUED
    if pipe.queued + size > bound:
        raise StdinFull(
            f"{where} is not reading its stdin: {pipe.queued} bytes already wait for it, "
            f"and {size} more would pass the bound of {bound}",
            operation="stdin",
            path=ident,
            hint="retry once it has read (Process.write waits by itself), write less at a time, "
            "or check that the program reads its stdin",
        )
