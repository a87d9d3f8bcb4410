"""Checkpoints of a sandbox's root on an image, and rollback to one.

A sandbox on an image writes its root to a layer in its own memory (the layer tmpfs);
a snapshot without a copy freezes that layer and stacks the root again above it
(``server.restack``). A checkpoint is the same freeze, kept by the supervisor for the
sandbox's life (the layer is in the sandbox's memory: its checkpoints end with it): a
rollback stacks the root again on the frozen layers up to the checkpoint, with a fresh
upper directory, by a ``pivot_root`` in the sandbox's namespaces (the sandbox's helper,
``joined.Helper``); the newer layers are let go and their directories removed from the
tmpfs in a thread. Nothing is copied either way.

What a command changes in a host workspace bound into the sandbox is the host's, not
the root's: it is in no checkpoint (a review workspace is, ``server.checkpoints``).
Only while PID 1 is the sandbox's only process (``checkpoints.quiesce``). A sandbox
holds ``restack.MAX_STACK`` frozen layers at most, its snapshots' among them.
Must not: follow a link in the tmpfs, keep a layer a rollback dropped in the root.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import sys
import threading
import time
from dataclasses import dataclass, field

from .. import protocol
from .._core import safepath
from ..errors import CheckpointError, SandboxError
from ..plan.facts import parse_mountinfo
from . import checkpoints, restack
from .box import Box

_COMMANDS_KEPT = 8


@dataclass
class RootPoint:
    id: int
    frozen: int  # the frozen layer, a detached mount (the stack's: ``Stack.own``)
    time: float
    bytes: int
    commands: list[str] = field(default_factory=list)  # the commands that followed it

    def message(self) -> protocol.CheckpointInfo:
        return protocol.CheckpointInfo(
            id=self.id, time=self.time, bytes=self.bytes, command="; ".join(self.commands)
        )


def usable(box: Box) -> bool:
    """A sandbox on an image whose root can be stacked again."""
    return box.stack is not None and box.ns is not None


def take(box: Box) -> RootPoint:
    stack = box.stack
    assert stack is not None
    if len(stack.own) >= restack.MAX_STACK:
        raise CheckpointError(
            f"sandbox {box.name} holds {restack.MAX_STACK} frozen layers (checkpoints and snapshots), "
            "the most a root on an image takes",
            operation="checkpoint",
            path=box.name,
            hint=f"roll back to an earlier checkpoint (`warren rollback {box.name} ID`)",
        )
    if box.paused is not None:
        raise CheckpointError(
            f"cannot take a checkpoint of sandbox {box.name} now: it is paused",
            operation="checkpoint",
            path=box.name,
            hint=f"resume it (`warren resume {box.name}`)",
        )
    ident = box.root_next
    frozen = restack.freeze(box, f"checkpoint-{ident}")
    if frozen is None:
        raise CheckpointError(
            f"cannot take a checkpoint of sandbox {box.name} while processes run in it",
            operation="checkpoint",
            path=box.name,
            hint=f"wait for them or end them (`warren ps {box.name}`), then take the checkpoint again",
        )
    box.root_next += 1
    point = RootPoint(id=ident, frozen=frozen, time=time.time(), bytes=_bytes(frozen))
    box.root_points.append(point)
    return point


def noted(box: Box, argv: list[str]) -> None:
    """A command about to run: listed with the last checkpoint."""
    if box.root_points and len(box.root_points[-1].commands) < _COMMANDS_KEPT:
        box.root_points[-1].commands.append(shlex.join(argv)[:200] or "(empty)")


def rollback(box: Box, ident: int, keep_running: bool) -> tuple[RootPoint, str]:
    """Stack ``box``'s root again on checkpoint ``ident`` (0: the last one): what was
    written since goes. Returns it and the processes stopped first."""
    stack = box.stack
    assert stack is not None
    if not box.root_points:
        raise CheckpointError(
            f"sandbox {box.name} has no checkpoint to roll back to",
            operation="rollback",
            path=box.name,
            hint=f"take one with `warren checkpoint {box.name}`",
        )
    chosen = next((p for p in box.root_points if p.id == ident), None) if ident else box.root_points[-1]
    if chosen is None:
        raise CheckpointError(
            f"sandbox {box.name} has no checkpoint {ident}",
            operation="rollback",
            path=f"{box.name}:{ident}",
            hint=f"`warren checkpoints {box.name}` lists them",
        )
    frozen = [fd for _sid, fd in stack.own]
    at = frozen.index(chosen.frozen)
    stopped = checkpoints.quiesce(box, stop=not keep_running, refuse=True, action="rollback")
    assert stopped is not None
    new = stack.next_upper()
    try:
        try:
            with open(f"/proc/{box.pid}/mountinfo") as f:
                children = restack.root_children(parse_mountinfo(f.read()))
        except (OSError, ValueError) as e:
            raise CheckpointError(
                f"cannot stack sandbox {box.name}'s root again: {e}", operation="rollback", path=box.name
            ) from None
        lowers = stack.lowers[at:]
        try:
            (upper,) = box.helper_ready().call(
                "restack",
                {"old": stack.upper, "new": new, "children": children, "freeze": False},
                [stack.tmpfs, *lowers],
            )
        except OSError as e:
            if e.errno == errno.ENOTRECOVERABLE:
                broken = SandboxError(
                    f"sandbox {box.name}'s root could not be stacked again: {e.filename}",
                    operation="rollback",
                    path=box.name,
                    hint=f"remove it (`warren rm -f {box.name}`) and create it again",
                )
                box.fail(broken)
                raise broken from None
            raise CheckpointError.from_os(
                e,
                f"cannot stack sandbox {box.name}'s root again: {e.filename}",
                "rollback",
                box.name,
                hint="nothing changed in the sandbox; try again",
            ) from None
    finally:
        box.send(protocol.Refresh())  # PID 1 forks spares again (with rules for the new root)
    dropped = [stack.upper, *(stack.names.pop(fd, "") for fd in frozen[:at])]
    for fd in frozen[:at]:
        os.close(fd)
    stack.own, stack.lowers, stack.upper = stack.own[at:], lowers, new
    if box.layer is not None:
        os.close(box.layer)
    box.layer = upper
    box.root_points = box.root_points[: box.root_points.index(chosen) + 1]
    _remove(stack.tmpfs, [d for d in dropped if d])
    return chosen, stopped


def _remove(tmpfs: int, names: list[str]) -> None:
    """The dropped upper directories (and their work directories) out of the sandbox's
    memory, in a thread."""
    try:
        fd = os.dup(tmpfs)
    except OSError:
        return

    def remove() -> None:
        try:
            for name in names:
                for each in (name, name.replace("upper", "work", 1)):
                    with contextlib.suppress(OSError):
                        safepath.remove_tree(fd, each)
        except BaseException as e:  # a thread's failure is said, never raised
            print(f"warren supervisor: rollback's layers left: {e}", file=sys.stderr, flush=True)
        finally:
            os.close(fd)

    threading.Thread(target=remove, name="warren-root-rollback", daemon=True).start()


def _bytes(frozen: int) -> int:
    """What a frozen layer holds in the sandbox's memory (its entries' blocks), read
    by descriptor, no link followed."""
    total = 0
    try:
        top = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=frozen)
    except OSError:
        return 0
    try:
        for _dir, _dirs, files, dfd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
            total += os.fstat(dfd).st_blocks * 512
            for f in files:
                with contextlib.suppress(OSError):
                    total += os.stat(f, dir_fd=dfd, follow_symlinks=False).st_blocks * 512
    finally:
        os.close(top)
    return total
