"""Snapshots without a copy, on the supervisor's side.

A snapshot of a sandbox on an image freezes its layer where it is, in the sandbox's
memory, and stacks the sandbox's root again above it (``_core.restack``): the sandbox
writes to a fresh layer from then on, the frozen one is never written again, and a
sandbox made from the snapshot gets that frozen layer as a lower layer of its own (a
detached copy of the mount, given to its PID 1 by descriptor). Nothing is copied on
the way, so the time does not depend on how much the sandbox changed; the copy to the
state directory, which lets the snapshot outlive the sandbox and the supervisor, runs
afterwards in a thread (``snapshots.save``), reading the frozen layer.

Only while PID 1 is the sandbox's only process (between commands: no ``exec`` running,
no process started in the background): a process's open files, working directory and
mappings point into the old root, and a write through one of them would land in the
frozen layer, under the snapshot's feet. Otherwise the caller copies the layer with the
sandbox paused, as before. The work in the sandbox's namespaces is done by a process
forked from the supervisor that joins them (the supervisor's user owns them), as
``follow`` does: PID 1 has no capability left to mount anything.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from .. import protocol
from .._core import restack as core
from ..errors import SandboxError
from ..plan.facts import MountEntry, parse_mountinfo
from . import joined
from .box import Box

MAX_STACK = 32  # frozen layers per sandbox; past that, snapshots copy
QUIET_TIMEOUT = 5.0


@dataclass
class Stack:
    """What the supervisor holds of a sandbox's root (from ``Ready``): the layer tmpfs
    and the lower layers as detached mounts, top first; its own frozen layers among
    them, by snapshot id."""

    tmpfs: int
    lowers: list[int]
    own: list[tuple[str, int]] = field(default_factory=list)  # (snapshot id, layer), top first
    upper: str = "upper"  # the live upper directory's name on the tmpfs
    made: int = 0  # upper directories made since launch (the next is ``upper.{made + 1}``)
    names: dict[int, str] = field(default_factory=dict)  # a frozen layer's directory on the tmpfs

    def next_upper(self) -> str:
        self.made += 1
        return f"upper.{self.made}"

    def close(self) -> None:
        for fd in (self.tmpfs, *self.lowers):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.lowers, self.own = [], []


def freeze(box: Box, snap_id: str) -> int | None:
    """Freeze ``box``'s layer for snapshot ``snap_id`` and stack its root again above it;
    returns the supervisor's descriptor of the frozen layer (the box's: do not close),
    or None when it cannot be done now (a process is running; the caller copies)."""
    stack = box.stack
    if stack is None or box.ns is None or box.paused is not None or len(stack.own) >= MAX_STACK:
        return None
    box.send(protocol.Quiesce(untaken=box.drop_spare(), seen=box.spare_seen))
    box.quiescing = True
    try:
        quiet = box.await_pid1(protocol.Quiet, QUIET_TIMEOUT)
        box.quiescing = False
        if not isinstance(quiet, protocol.Quiet) or not quiet.alone:
            why = quiet.why if isinstance(quiet, protocol.Quiet) else "PID 1 did not answer"
            print(f"warren supervisor: snapshot of {box.name}: copied ({why})", file=sys.stderr, flush=True)
            return None
        old, new = stack.upper, stack.next_upper()
        try:
            # The mounts as PID 1 sees them (read here: the joined process is not in its
            # /proc); nothing mounts meanwhile, PID 1 being alone.
            with open(f"/proc/{box.pid}/mountinfo") as f:
                children = root_children(parse_mountinfo(f.read()))
        except (OSError, ValueError):
            return None
        try:
            frozen, upper = box.helper_ready().call(
                "restack", {"old": old, "new": new, "children": children}, [stack.tmpfs, *stack.lowers]
            )
        except OSError as e:
            if e.errno == errno.ENOTRECOVERABLE:
                # The root was half moved: nothing can run in it any more. Said, not hidden.
                broken = SandboxError(
                    f"sandbox {box.name} could not be stacked again for a snapshot: {e.filename}",
                    operation="snapshot",
                    path=box.name,
                    hint=f"remove it (`warren rm -f {box.name}`) and create it again",
                )
                box.fail(broken)
                raise broken from None
            return None
        stack.lowers.insert(0, frozen)
        stack.own.insert(0, (snap_id, frozen))
        stack.names[frozen], stack.upper = old, new
        if box.layer is not None:
            os.close(box.layer)
        box.layer = upper
        return frozen
    finally:
        box.quiescing = False
        box.send(protocol.Refresh())  # PID 1 forks spares again (with rules for the new root)


@joined.op("restack")
def _restack_in(args: dict[str, Any], fds: list[int]) -> list[int]:
    """In the sandbox's namespaces (``joined.Helper``): the root stacked again above
    its layer frozen (``_core.restack.restack``); the frozen layer and the new upper
    (``freeze`` false, a rollback: the new upper only)."""
    old, new, children = str(args["old"]), str(args["new"]), list(args["children"])
    got = core.restack(fds[0], fds[1:], old, new, children, bool(args.get("freeze", True)))
    return [fd for fd in got if fd >= 0]


def root_children(mounts: tuple[MountEntry, ...]) -> list[str]:
    """The mount points of the mounts directly on the root, in the order they were
    made. ValueError when the root is not one mount, or a mount is stacked on one of
    them at the same point (moving the lower one would leave the other behind)."""
    roots = [m for m in mounts if m.mount_point == "/"]
    if len(roots) != 1:
        raise ValueError(f"{len(roots)} mounts at the root")
    root_id = roots[0].mount_id
    children = {m.mount_id: m.mount_point for m in mounts if m.parent_id == root_id and m.mount_id != root_id}
    for m in mounts:
        if children.get(m.parent_id) == m.mount_point:
            raise ValueError(f"mounts stacked at {m.mount_point}")
    return list(children.values())


def clone_own(box: Box, snap_id: str) -> list[int] | None:
    """Detached copies of the frozen layers that make snapshot ``snap_id`` of ``box``
    (its own, from that one down), top first; None when the box does not hold it."""
    stack = box.stack
    if stack is None or box.ns is None:
        return None
    ids = [sid for sid, _fd in stack.own]
    if snap_id not in ids:
        return None
    layers = [fd for _sid, fd in stack.own[ids.index(snap_id) :]]
    try:
        return joined.run(box.ns, core.clone_layers, layers)
    except OSError:
        return None
