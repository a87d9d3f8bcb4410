"""The hard-link walk of a large workspace, made beside its sandbox's launch.

A launch in a workspace of more than ``treewalk.SMALL`` entries, none of whose denied
files has a name outside the denied paths (``planning``), does not wait for this walk:
it runs on a thread of the supervisor — the scan of ``links`` (natively when it can,
from directory descriptors), then ``unshare`` for what it found. Meanwhile PID 1 forks
its helpers with a filter that holds every call that could change a file or give one
another name (``_core.broker.window``), until it hears the walk ended
(``protocol.Walked``).

Whether anything of the sandbox starts before the walk has ended is the box's
(``Box.start_walk``): by default nothing does (the box holds every handoff, a run's
command, an exec, a file request, until then), for a command started during the walk
could open a linked file for reading and, after it, again for writing through
``/proc/self/fd``. Where the walk is expected to find nothing (``server.repowatch``)
what is handed goes at once, this walk waits ``OPTIMISTIC_DELAY`` first, and a walk that
finds a linked file after something started ends the sandbox before any held call goes
on. A file found that must be masked rather than copied (the user cannot read it, or
replace it in its directory), or one that cannot be copied, fails the walk: the
sandbox's writing calls then fail with EACCES for its life, and the supervisor's log
says why. A walk whose sandbox ends first is given up.

``WARREN_LINK_WALK_DELAY`` (seconds, in the supervisor's environment) makes the walk
wait before it starts: the tests' way to ask for a command while it runs.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import sys
import threading
import time
from collections.abc import Callable

from .._core import treewalk
from ..errors import WarrenError
from ..plan.model import LinkWalk
from ..plan.mounts import within
from . import links, unshare

OPTIMISTIC_DELAY = 0.03  # seconds an optimistic walk waits before it starts (``Job``)


def _delay() -> float:
    try:
        return max(0.0, float(os.environ.get("WARREN_LINK_WALK_DELAY", "0")))
    except ValueError:
        return 0.0


class Job:
    """One sandbox's walk: a thread, and a pipe the supervisor's loop hears it end on."""

    def __init__(
        self,
        walk: LinkWalk,
        sel: selectors.BaseSelector,
        done: Callable[[Job], None],
        optimistic: bool = False,
    ) -> None:
        """``optimistic``: the sandbox's commands start beside the walk (``Box.start_walk``),
        which then waits ``OPTIMISTIC_DELAY`` first: a short command (an agent's ``cat``,
        ``grep`` or ``git status``) has ended by then, and its sandbox with it, and is not
        slowed by a walk on the other core; one that writes waits that much longer."""
        self.walk, self.sel, self.done = walk, sel, done
        self.delay = max(_delay(), OPTIMISTIC_DELAY if optimistic else 0.0)
        self.stop = treewalk.Stop()
        self.ok = False
        self.error = ""
        self.found = 0  # names given an inode of their own
        self.linked: list[str] = []  # every workspace name the scan found linked from outside
        self.began = time.monotonic()
        self.ended: float | None = None
        self._r, self._w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        sel.register(self._r, selectors.EVENT_READ, ("walked", self))
        threading.Thread(target=self._run, name="warren-link-walk", daemon=True).start()

    def _run(self) -> None:
        try:
            with contextlib.suppress(OSError):  # this thread alone (the Python walk, the copies)
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), treewalk.BACKGROUND_NICE)
            if self.stop.stopped.wait(self.delay):
                return
            walk = self.walk
            found = [
                o
                for o in links.LinkScanner().scan(
                    list(walk.roots),
                    shared=walk.shared,
                    denied=walk.denied,
                    walks=treewalk.Walks(stop=self.stop),
                )
                if o.secret or any(within(o.path, r) for r in walk.writable)
            ]
            self.stop.check()
            self.linked = [o.path for o in found]
            masked = [o.path for o in found if o.secret]
            if masked:
                self.error = (
                    f"{masked[0]} is a hard link to a file outside the writable roots that is denied or that "
                    "you cannot copy: it cannot be masked in a running sandbox, so its commands cannot "
                    "change files (EACCES); replace the link (cp --remove-destination) and start it again"
                )
                return
            self.found = unshare.own_inodes(walk.workspace, [(o.path, o.dev, o.ino) for o in found])
            self.ok = True
        except treewalk.Stopped:
            return
        except WarrenError as e:
            self.error = f"{e}" + (f" ({e.hint})" if getattr(e, "hint", None) else "")
        except Exception as e:  # a bug: the sandbox's writes stay refused, never let through
            self.error = f"the hard-link walk failed: {e!r}"
        finally:
            self.ended = time.monotonic()
            with contextlib.suppress(OSError):
                os.write(self._w, b"x")  # the thread's own end: closed by it alone
            os.close(self._w)

    def on_end(self) -> None:
        """In the supervisor's loop: the thread ended."""
        self._close()
        if self.stop.stopped.is_set():
            return
        if not self.ok:
            print(f"warren supervisor: {self.error}", file=sys.stderr, flush=True)
        self.done(self)

    def cancel(self) -> None:
        """The sandbox ended: the walk is given up (its native walk killed)."""
        self.stop.stop()
        self._close()

    def _close(self) -> None:
        if self._r < 0:
            return
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(self._r)
        with contextlib.suppress(OSError):
            os.close(self._r)
        self._r = -1
