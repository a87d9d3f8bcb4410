"""Merged bases of a review workspace's checkpoints: the workspace mounted on a few layers
however many checkpoints it has.

Each checkpoint is a frozen upper directory, one more lower layer of the workspace's
overlay: the kernel takes 500, and every lookup that misses walks them all. Once
``BASE_EVERY`` frozen directories lie above the newest base, a new base is built: one
directory that is, as a lower layer, the union of every frozen directory up to the
newest (``_core.layermerge``: hard links to their files, whiteouts and opaque
directories applied; no file data copied). It is built off the command's path, by a
process the sandbox's helper forks (``joined.Helper``: in the sandbox's user namespace,
so what it makes is owned as the overlay's own entries are), under a temporary name
renamed into place when complete; the supervisor records it (``stack.json``'s
``bases``) at the next checkpoint or rollback that finds it there, and the next stack
mounted stands on it: ``mount_plan``. The frozen directories are all kept (a rollback
to any checkpoint needs them, ``diff`` and ``apply`` read them); the newest ``KEEP``
bases are kept, older ones removed.

A rollback to a checkpoint at or above a kept base mounts at once; one below them
mounts the frozen directories themselves when they are few enough, else builds a base
for it first, while the caller waits (``build_now``).
Must not: write a frozen directory, follow a link, name a directory the record does
not.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

from .._core import kernel, layermerge, safepath
from . import joined
from .review import Base, LayerStack

BASE_EVERY = 32  # frozen directories above the newest base before another is built
MAX_LOWERS = 500  # the overlay's lower layers at most, the host's workspace among them
KEEP = 2
BUILD_TIMEOUT = 600.0  # a base built while a rollback waits
STARTING = 5.0  # a build whose directory is not there this long after it was asked failed
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_FD = 1 << 20


def name_for(covers: str) -> str:
    """The base that holds the frozen directories up to ``covers`` (``upper.N``)."""
    return "base." + covers.rpartition(".")[2]


def newest(stack: LayerStack, frozen: list[str]) -> Base | None:
    """The recorded base covering the most of ``frozen`` (oldest first)."""
    usable = [b for b in stack.bases if b.covers in frozen]
    return max(usable, key=lambda b: frozen.index(b.covers), default=None)


def mount_plan(stack: LayerStack, layers: list[str]) -> list[str] | None:
    """What to mount for the stack ``layers`` (oldest first, the last the fresh upper):
    the directories of the review layer, oldest first, the newest base usable standing
    for the frozen directories it holds; None when they are more than the overlay
    takes (the host's workspace is one more)."""
    frozen = layers[:-1]
    base = newest(stack, frozen)
    rest = frozen[frozen.index(base.covers) + 1 :] if base is not None else frozen
    lowers = [base.name, *rest] if base is not None else rest
    if len(lowers) + 1 > MAX_LOWERS:
        return None
    return [*lowers, layers[-1]]


def wanted(stack: LayerStack) -> Base | None:
    """The base to build now: when ``BASE_EVERY`` frozen directories or more lie above
    the newest one, the one holding them all."""
    frozen = stack.layers[:-1]
    base = newest(stack, frozen)
    above = len(frozen) - (frozen.index(base.covers) + 1 if base is not None else 0)
    if above < BASE_EVERY or not frozen:
        return None
    return Base(name=name_for(frozen[-1]), covers=frozen[-1])


def sources(stack: LayerStack, covers: str) -> list[str]:
    """The directories a base up to ``covers`` is merged from, newest first: the frozen
    directories above the newest base below it, then that base."""
    frozen = stack.layers[: stack.layers.index(covers) + 1]
    below = newest(stack, frozen[:-1])
    if below is None:
        return list(reversed(frozen))
    return [*reversed(frozen[frozen.index(below.covers) + 1 :]), below.name]


def adopt(layer: str, stack: LayerStack, pending: Base | None) -> list[str]:
    """Record ``pending`` in ``stack`` if its build is complete (its directory is there)
    and it still holds frozen directories of the stack; keep the newest ``KEEP``.
    Returns the names of the bases no longer recorded (to remove once no stack stands
    on them), and ``pending`` too when it is there but no longer usable."""
    dropped: list[str] = []
    if pending is not None and os.path.isdir(os.path.join(layer, pending.name)):
        if pending.covers in stack.layers[:-1] and pending.name not in {b.name for b in stack.bases}:
            stack.bases.append(pending)
        elif pending.name not in {b.name for b in stack.bases}:
            dropped.append(pending.name)
    order = stack.layers[:-1]
    stack.bases.sort(key=lambda b: order.index(b.covers))
    while len(stack.bases) > KEEP:
        dropped.append(stack.bases.pop(0).name)
    return dropped


def building(name: str) -> str:
    """The name a base has while it is built (renamed to ``name`` when complete)."""
    return f".{name}.building"


def failed(layer: str, pending: Base, since: float, helper_alive: bool) -> bool:
    """A build asked for ``since`` (monotonic) that will not complete: its helper is
    gone, or neither the base nor its directory under construction is there after
    ``STARTING`` (it failed and removed what it made: a full disk, say)."""
    if os.path.isdir(os.path.join(layer, pending.name)):
        return False
    if not helper_alive:
        return True
    under_way = os.path.isdir(os.path.join(layer, building(pending.name)))
    return not under_way and time.monotonic() - since > STARTING


def build_ahead(helper: joined.Helper, layer_fd: int, stack: LayerStack, base: Base) -> None:
    """Start building ``base`` in a process of the sandbox's helper; returns at once."""
    helper.call(
        "review-base", {"from": sources(stack, base.covers), "name": base.name, "wait": False}, [layer_fd]
    )


def build_now(helper: joined.Helper, layer_fd: int, stack: LayerStack, base: Base) -> None:
    """Build ``base`` while the caller waits (a rollback below every kept base)."""
    helper.call(
        "review-base",
        {"from": sources(stack, base.covers), "name": base.name, "wait": True},
        [layer_fd],
        timeout=BUILD_TIMEOUT,
    )


@joined.op("review-base")
def _build(args: dict[str, Any], fds: list[int]) -> list[int]:
    """In the sandbox's helper: merge the directories ``from`` (newest first) of the
    review layer ``fds[0]`` into ``name`` (made under a temporary name, renamed when
    complete); ``wait``: here, else in a process of its own, niced, not waited for."""
    names, name = [str(n) for n in args["from"]], str(args["name"])
    if args.get("wait"):
        _merge_into(fds[0], names, name)
        return []
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            layer = fds[0]
            os.closerange(3, layer)
            os.closerange(layer + 1, _MAX_FD)
            kernel.die_with_parent()
            os.nice(10)
            _merge_into(layer, names, name)
            code = 0
        finally:
            os._exit(code)
    return []


def _merge_into(layer: int, names: list[str], name: str) -> None:
    tmp = building(name)
    srcs: list[int] = []
    try:
        for left in (name, tmp):  # by a build the record never took, or one cut short
            with contextlib.suppress(FileNotFoundError):
                safepath.remove_tree(layer, left)
        for each in names:
            srcs.append(os.open(each, _DIR, dir_fd=layer))
        layermerge.merge(srcs, layer, tmp)
        os.rename(tmp, name, src_dir_fd=layer, dst_dir_fd=layer)
    except BaseException:
        with contextlib.suppress(OSError):
            safepath.remove_tree(layer, tmp)
        raise
    finally:
        for fd in srcs:
            os.close(fd)
