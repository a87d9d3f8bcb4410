"""Checkpoints of a review workspace, and rollback to one, on the supervisor's side.

A review sandbox's workspace is an overlay whose upper directory lies in its review
layer (``server.review``). A checkpoint freezes that upper directory where it is: the
workspace is stacked again (``_core.restack.restack_dir``, by a process of the
supervisor's forked ahead and joined to the sandbox's namespaces, ``joined.Helper``:
PID 1 can no longer mount) with the frozen directory as its
topmost lower layer and a fresh upper directory above it. Nothing is copied, so the
time does not depend on the workspace's size or on what changed. A rollback stacks the
workspace again on the frozen directories up to the checkpoint, with a fresh upper
directory; the newer ones are moved aside at once (a rename) and removed afterwards,
in a thread.

A workspace seen elsewhere too (``workspace_at``) has a copy of the overlay there, with
its mounts (the plan's ``MIRROR`` step): each stacking replaces that copy with one of the
new overlay (``mirror_of``), or the sandbox would go on writing the old one.

Only while PID 1 is the sandbox's only process: a process's open files, working
directory and mappings point into the old overlay, and its writes would land in the
frozen directory. A checkpoint taken on request while something runs is refused with
the processes named; the one taken before each command is skipped then (the listing
shows no checkpoint before that command). A rollback stops the processes first, or is
refused with them named (``keep_running``).

Layers are named by descriptor: the host's workspace and the layer's own directory are
detached mounts PID 1 made at launch (``Box.review_lower``, ``review_layer``; the
overlay takes a layer only from a mount of the namespace that makes it, or a detached
one), the upper directories are opened beneath the latter by the names the supervisor
made (the sandbox never sees the layer's own directory). What the record says
(``stack.json``) is written before the new stack is mounted (and written back if the
mount fails), and the layers a rollback drops are removed only after it: a supervisor
killed in between (the sandbox ends with it) leaves the record naming the state before
or after, never a layer that is gone. A full disk refuses a rollback before any
process is stopped.
Must not: decide what is reviewed, read what the sandbox wrote by a path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import stat
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import protocol
from .._core import restack as core
from .._core import safepath
from ..errors import CheckpointError, SandboxError, WarrenError
from ..plan.facts import MountEntry, parse_mountinfo
from ..plan.model import MountKind
from ..policy import config
from ..policy.limits import show_size
from . import bases, joined, review, snapshots
from .box import Box

# Frozen upper directories per workspace (their record is read whole at each one); the
# workspace is mounted on the newest merged base and those above it (``server.bases``).
MAX_LAYERS = 4096
QUIET_TIMEOUT = 5.0
_PATH_DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_COMMANDS_KEPT = 8


def target_of(box: Box) -> str:
    """Where the sandbox sees its reviewed workspace (the overlay's mount point)."""
    for op in box.plan.mounts:
        if op.kind is MountKind.REVIEW:
            return op.target
    raise CheckpointError(
        f"sandbox {box.name} is not a review sandbox",
        operation="checkpoint",
        path=box.name,
        hint=f"checkpoints are of review workspaces: `warren create {box.name} --review`",
    )


def mirror_of(box: Box, target: str) -> str | None:
    """Where the sandbox sees its reviewed workspace too (``workspace_at``: a copy of the
    overlay at ``target`` with its mounts), or None."""
    for op in box.plan.mounts:
        if op.kind is MountKind.MIRROR and op.source == target:
            return op.target
    return None


def take(box: Box, layer: str, root: str, command: str = "") -> review.Checkpoint | None:
    """Freeze ``box``'s upper directory as a checkpoint. ``command``: the one about to
    run (a checkpoint taken before each command); then nothing is raised: None when it
    cannot be taken now, and an upper directory with nothing in it is no new checkpoint
    (the command is added to the last one's). Where the last command's changes were
    frozen ahead (``freeze_ahead``) and nothing was written since, they are the
    checkpoint: it is only recorded."""
    auto = bool(command)
    target = target_of(box)
    stack = review.read_stack(layer)
    live = stack.layers[-1]
    ahead = _frozen_ahead(stack)
    if (ahead is not None or (auto and stack.checkpoints)) and _empty(layer, live):
        if ahead is not None:
            return _record_frozen(box, layer, root, stack, ahead, command)
        last = stack.checkpoints[-1]
        if len(last.commands) < _COMMANDS_KEPT:
            last.commands.append(command)
            review.write_stack(layer, stack)
        return None
    unused = _adopt(box, layer, stack)
    n = stack.next
    new = f"{review.UPPER}.{n}"
    layers = [*stack.layers, new]
    if len(stack.layers) > MAX_LAYERS or bases.mount_plan(stack, layers) is None:
        if auto:
            return None
        raise CheckpointError(
            f"sandbox {box.name} has {len(stack.layers) - 1} checkpoints, the most it takes now"
            if len(stack.layers) > MAX_LAYERS
            else f"sandbox {box.name}'s checkpoints are more than its workspace can stand on until their "
            "merged base is built",
            operation="checkpoint",
            path=box.name,
            hint=f"roll back to an earlier one (`warren rollback {box.name} ID`), or apply or discard "
            "the changes and start a new review sandbox"
            if len(stack.layers) > MAX_LAYERS
            else "try again in a moment",
        )
    # What was frozen ahead and what was written since are this one checkpoint's.
    size = layer_bytes(layer, live) + (layer_bytes(layer, ahead) if ahead is not None else 0)
    _check_budget(root, box.name, size)
    point = review.Checkpoint(
        id=n, layer=live, time=time.time(), bytes=size, commands=[command] if auto else []
    )
    after = review.LayerStack(
        next=n + 1, layers=layers, checkpoints=[*stack.checkpoints, point], bases=list(stack.bases)
    )
    if not _stack_again(box, layer, target, stack, after, unused, refuse=not auto):
        print(
            f"warren supervisor: no checkpoint of {box.name} before {command}: a process of the "
            f"sandbox still ran, {box.busy} (the next command's checkpoint holds these changes too)",
            file=sys.stderr,
            flush=True,
        )
        return None
    return point


def freeze_ahead(box: Box, root: str) -> None:
    """After a command of a review sandbox, while nobody waits (``Supervisor._timers``):
    what it changed frozen where it is, the workspace stacked again on it with a fresh
    upper directory, so that the checkpoint before the next command is only recorded
    (``take``) and that command finds a spare ready instead of waiting for the stacking
    and a helper forked after it. No checkpoint is made here: until the next command (or
    ``warren checkpoint``) names it, the frozen directory is one more layer of the
    workspace, dropped by a rollback to any checkpoint as the live one is. Nothing
    happens when the command changed nothing or a process still runs, and a failure is
    only logged: the next command's checkpoint is then taken as before. Found a process
    running, no freeze is tried again (``Box.freeze_held``) until a checkpoint or a
    rollback stacks the workspace again."""
    if box.home is None or box.ns is None or box.failure is not None or box.kill_at is not None:
        return
    try:
        layer = review.layer_of(box.home, root, box.name)
        target = target_of(box)
        stack = review.read_stack(layer)
        if _empty(layer, stack.layers[-1]):
            return
        unused = _adopt(box, layer, stack)
        layers = [*stack.layers, f"{review.UPPER}.{stack.next}"]
        if len(stack.layers) > MAX_LAYERS or bases.mount_plan(stack, layers) is None:
            return
        after = review.LayerStack(
            next=stack.next + 1, layers=layers, checkpoints=list(stack.checkpoints), bases=list(stack.bases)
        )
        box.freeze_held = not _stack_again(box, layer, target, stack, after, unused, refuse=False)
    except (OSError, WarrenError) as e:
        print(f"warren supervisor: {box.name}'s changes not frozen ahead: {e}", file=sys.stderr, flush=True)


def _frozen_ahead(stack: review.LayerStack) -> str | None:
    """The upper directory ``freeze_ahead`` froze that no checkpoint names yet (the
    newest frozen one, when none is of it)."""
    if len(stack.layers) < 2:
        return None
    top = stack.layers[-2]
    return None if any(c.layer == top for c in stack.checkpoints) else top


def _record_frozen(
    box: Box, layer: str, root: str, stack: review.LayerStack, frozen: str, command: str
) -> review.Checkpoint:
    """The checkpoint of a directory frozen ahead, nothing written since: recorded, and
    charged to the snapshot budget as any checkpoint (refused past it, typed: it then
    stays the workspace's changes)."""
    size = layer_bytes(layer, frozen)
    _check_budget(root, box.name, size)
    point = review.Checkpoint(
        id=stack.next, layer=frozen, time=time.time(), bytes=size, commands=[command] if command else []
    )
    after = review.LayerStack(
        next=stack.next + 1,
        layers=list(stack.layers),
        checkpoints=[*stack.checkpoints, point],
        bases=list(stack.bases),
    )
    _record(layer, after, box.name)
    return point


def _stack_again(
    box: Box,
    layer: str,
    target: str,
    stack: review.LayerStack,
    after: review.LayerStack,
    unused: list[str],
    *,
    refuse: bool,
) -> bool:
    """The workspace stacked as ``after`` says (its last layer the fresh upper made
    here), the record written first and put back as ``stack`` on any failure. False
    (nothing changed) when a process of the sandbox runs and not ``refuse``; with it,
    the typed error ``quiesce`` raises."""
    new = after.layers[-1]
    _fresh(layer, new, stack.layers[-1], box.name)
    try:
        _record(layer, after, box.name)
        with _restored_on_failure(layer, stack):
            stopped = quiesce(box, stop=False, refuse=refuse, action="checkpoint")
            if stopped is None:
                review.write_stack(layer, stack)
                _drop(layer, [new])
                return False
            _restack(box, target, after)
    except BaseException:
        _drop(layer, [new])
        raise
    box.freeze_held = False
    _set_aside(layer, unused)
    box.base_due = bases.wanted(after)  # built ahead (``build_due``) when nobody waits
    return True


def _adopt(box: Box, layer: str, stack: review.LayerStack) -> list[str]:
    """The merged base built ahead recorded in ``stack`` if it is complete; the names
    of the bases to remove once the workspace is stacked again (``bases.adopt``)."""
    pending = box.base_pending
    if pending is not None and os.path.isdir(os.path.join(layer, pending.name)):
        box.base_pending = None
    elif pending is not None:
        since, pid = box.base_asked
        alive = box.helper is not None and not box.helper.closed and box.helper.pid == pid
        if bases.failed(layer, pending, since, alive):
            print(f"warren supervisor: merged base {pending.name} of {box.name} not built", file=sys.stderr)
            box.base_pending = pending = None  # asked again at the next checkpoint
            box.base_due = bases.wanted(stack)
    return bases.adopt(layer, stack, pending)


def build_due(box: Box) -> None:
    """Start building the merged base a checkpoint found due (``Supervisor._timers``,
    while nobody waits): in a process the sandbox's helper forks, not waited for."""
    due, box.base_due = box.base_due, None
    if due is None or box.base_pending is not None or box.review_layer is None or box.home is None:
        return
    try:
        layer = review.layer_of(box.home, os.path.dirname(os.path.dirname(box.home)), box.name)
        stack = review.read_stack(layer)
        if due.covers not in stack.layers[:-1]:
            return
        helper = box.helper_ready()
        bases.build_ahead(helper, box.review_layer, stack, due)
        box.base_pending, box.base_asked = due, (time.monotonic(), helper.pid)
    except (OSError, SandboxError) as e:
        print(f"warren supervisor: no merged base for {box.name}: {e}", file=sys.stderr, flush=True)


def before_command(box: Box, root: str, argv: list[str]) -> None:
    """The checkpoint taken before each command of a review sandbox: skipped (and the
    command runs) when it cannot be taken now; never raises but for a workspace left
    broken (``SandboxError``: the sandbox ends)."""
    command = shlex.join(argv)[:200] or "(empty)"
    try:
        take(box, review.layer_of(box.home or "", root, box.name), root, command)
    except SandboxError as e:
        if box.failure is not None:
            raise
        print(
            f"warren supervisor: no checkpoint of {box.name} before {command}: {e}",
            file=sys.stderr,
            flush=True,
        )
    except OSError as e:
        print(
            f"warren supervisor: no checkpoint of {box.name} before {command}: {e}",
            file=sys.stderr,
            flush=True,
        )


def _plan_rollback(
    name: str, layer: str, ident: int, stack: review.LayerStack
) -> tuple[review.LayerStack, review.LayerStack, review.Checkpoint, list[str]]:
    """The stack now, the stack after rolling back to ``ident`` (0: the last one), that
    checkpoint, and the directories it drops (upper ones, bases); the fresh upper made."""
    if not stack.checkpoints:
        raise CheckpointError(
            f"sandbox {name} has no checkpoint to roll back to",
            operation="rollback",
            path=name,
            hint=f"take one with `warren checkpoint {name}` (one is taken before each command)",
        )
    chosen = next((c for c in stack.checkpoints if c.id == ident), None) if ident else stack.checkpoints[-1]
    if chosen is None:
        raise CheckpointError(
            f"sandbox {name} has no checkpoint {ident}",
            operation="rollback",
            path=f"{name}:{ident}",
            hint=f"`warren checkpoints {name}` lists them",
        )
    keep = stack.layers[: stack.layers.index(chosen.layer) + 1]
    new = f"{review.UPPER}.{stack.next}"
    after = review.LayerStack(
        next=stack.next + 1,
        layers=[*keep, new],
        checkpoints=[c for c in stack.checkpoints if c.id <= chosen.id],
        bases=[b for b in stack.bases if b.covers in keep],
    )
    _fresh(layer, new, chosen.layer, name)
    unbased = [b.name for b in stack.bases if b.covers not in keep]
    return stack, after, chosen, [*stack.layers[len(keep) :], *unbased]


def rollback_stopped(name: str, layer: str, ident: int) -> review.Checkpoint:
    """A stopped review sandbox's layer back to checkpoint ``ident``: only the record
    and the layer's directories change (nothing is mounted)."""
    stack = review.read_stack(layer)
    unused = bases.adopt(layer, stack, None)
    _stack, after, chosen, gone = _plan_rollback(name, layer, ident, stack)
    gone += unused
    try:
        _record(layer, after, name)
    except BaseException:
        _drop(layer, [after.layers[-1]])
        raise
    _set_aside(layer, gone)
    return chosen


def rollback(box: Box, layer: str, ident: int, keep_running: bool) -> tuple[review.Checkpoint, str]:
    """Stack ``box``'s workspace again on checkpoint ``ident`` (0: the last one): what
    was written since goes. Returns the checkpoint and the processes stopped first."""
    target = target_of(box)
    stack = review.read_stack(layer)
    unused = _adopt(box, layer, stack)
    stack, after, chosen, gone = _plan_rollback(box.name, layer, ident, stack)
    gone += unused
    new = after.layers[-1]
    try:
        _record(layer, after, box.name)  # first: a full disk refuses before anything is stopped
        with _restored_on_failure(layer, stack):
            stopped = quiesce(box, stop=not keep_running, refuse=True, action="rollback")
            assert stopped is not None
            _restack(box, target, after, layer)
    except BaseException:
        _drop(layer, [new])
        raise
    box.freeze_held = False
    # The dropped layers go once the workspace no longer stands on them.
    _set_aside(layer, gone)
    return chosen, stopped


def listing(layer: str) -> list[review.Checkpoint]:
    return review.read_stack(layer).checkpoints


def layer_bytes(layer: str, name: str) -> int:
    """What an upper directory holds on the disk (its entries' blocks), read by
    descriptor; what the sandbox closed with its mode counts as nothing."""
    total = 0
    try:
        top = safepath.open_dir(os.path.join(layer, name))
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


def _check_budget(root: str, sandbox: str, size: int) -> None:
    """A checkpoint's bytes are charged as a snapshot's: refused, typed (EDQUOT), past
    the user's ``snapshot_budget``. They are on the disk already: refusing keeps them
    the sandbox's live changes, out of the budget."""
    st = os.statvfs(root)
    budget, origin = config.snapshot_budget(st.f_blocks * st.f_frsize, os.environ, Path.home())
    if budget is None:
        return
    held = snapshots.charged(root)
    if held + size > budget:
        raise CheckpointError(
            f"a checkpoint of sandbox {sandbox} would pass your snapshot budget: its changes since "
            f"the last one hold {show_size(size)}, your snapshots and checkpoints hold "
            f"{show_size(held)} of {show_size(budget)} ({origin})",
            operation="checkpoint",
            path=sandbox,
            errno=errno.EDQUOT,
            hint="roll back, or apply or discard review sandboxes you are done with; remove snapshots "
            "(`warren snapshot rm ID`), or raise snapshot_budget in ~/.config/warren/config.toml",
        )


def _empty(layer: str, name: str) -> bool:
    try:
        return not os.listdir(os.path.join(layer, name))
    except OSError:
        return False


def _fresh(layer: str, new: str, like: str, sandbox: str) -> None:
    """The fresh upper directory ``new`` and its work directory, made in ``layer``; the
    upper takes the mode and times of ``like`` (the overlay's root takes them from its
    upper directory)."""
    try:
        fd = safepath.open_dir(layer)
    except OSError as e:
        raise _disk_error(e, sandbox, layer) from None
    try:
        for name in (new, review.work_of(new)):
            with contextlib.suppress(FileNotFoundError):
                safepath.remove_tree(fd, name)  # left by an attempt that failed
            os.mkdir(name, 0o700, dir_fd=fd)
        st = os.stat(like, dir_fd=fd, follow_symlinks=False)
        os.chmod(new, stat.S_IMODE(st.st_mode), dir_fd=fd, follow_symlinks=False)
        os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=fd, follow_symlinks=False)
    except OSError as e:
        _drop(layer, [new])
        raise _disk_error(e, sandbox, os.path.join(layer, new)) from None
    finally:
        os.close(fd)


@contextlib.contextmanager
def _restored_on_failure(layer: str, stack: review.LayerStack) -> Iterator[None]:
    """The stack's record put back as ``stack`` if what runs within fails."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(OSError):
            review.write_stack(layer, stack)
        raise


def _record(layer: str, stack: review.LayerStack, sandbox: str) -> None:
    try:
        review.write_stack(layer, stack)
    except OSError as e:
        raise _disk_error(e, sandbox, os.path.join(layer, review.STACK)) from None


def _disk_error(e: OSError, sandbox: str, path: str) -> CheckpointError:
    return CheckpointError.from_os(
        e,
        f"cannot take a checkpoint of sandbox {sandbox}: {path}: {e.strerror}",
        "checkpoint",
        path,
        hint="free space on the disk of warren's state directory; the earlier checkpoints are unchanged",
    )


def _drop(layer: str, names: list[str]) -> None:
    with contextlib.suppress(OSError):
        fd = safepath.open_dir(layer)
        try:
            for name in names:
                for each in (name, review.work_of(name)):
                    with contextlib.suppress(OSError):
                        safepath.remove_tree(fd, each)
        finally:
            os.close(fd)


def _set_aside(layer: str, names: list[str]) -> None:
    """Remove the dropped directories (no longer named by the record, never named
    again: names are not reused) in a thread: their size is whatever the sandbox wrote,
    and a rollback far back drops hundreds."""
    if not names:
        return
    try:
        fd = safepath.open_dir(layer)
    except OSError:
        return

    def remove() -> None:
        try:
            for name in names:
                for each in {name, review.work_of(name)}:
                    with contextlib.suppress(OSError):
                        safepath.remove_tree(fd, each)
        finally:
            os.close(fd)

    threading.Thread(target=remove, name="warren-rollback-trash", daemon=True).start()


def quiesce(box: Box, *, stop: bool, refuse: bool, action: str) -> str | None:
    """PID 1 alone (its spare let go, no spare forked until the ``Refresh`` that ends
    ``_restack``): the processes stopped (``stop``), "" when none ran; None (or, with
    ``refuse``, a typed error naming them) when something else runs."""
    if box.ns is None or (box.review_lower is None and box.stack is None) or box.paused is not None:
        why = (
            "it is paused" if box.paused is not None else "its workspace was launched without a handle on it"
        )
        if not refuse:
            return None
        raise CheckpointError(
            f"cannot {action} sandbox {box.name} now: {why}",
            operation=action,
            path=box.name,
            hint=f"resume it (`warren resume {box.name}`)" if box.paused is not None else "create it again",
        )
    untaken = box.drop_spare()
    # Asked for (refuse): a quarter of a second for the last command's processes to end
    # on a loaded host; before each command (not refuse): a moment, paid by every
    # command while a background process runs.
    box.send(
        protocol.Quiesce(stop=stop, grace=0.25 if refuse else 0.015, untaken=untaken, seen=box.spare_seen)
    )
    box.quiescing = True
    try:
        quiet = box.await_pid1(protocol.Quiet, QUIET_TIMEOUT)
    finally:
        box.quiescing = False
    if isinstance(quiet, protocol.Quiet) and quiet.alone:
        return quiet.why
    box.busy = quiet.why if isinstance(quiet, protocol.Quiet) else "PID 1 did not answer"
    box.send(protocol.Refresh())
    if not refuse:
        return None
    raise CheckpointError(
        f"cannot {action} sandbox {box.name} while processes run in it: {box.busy}",
        operation=action,
        path=box.name,
        hint=f"`warren rollback {box.name}` stops them first; or end them (`warren ps {box.name}`, "
        f"`warren kill {box.name} PID`) and {action} again"
        if action == "rollback"
        else f"wait for them or end them (`warren ps {box.name}`), then take the checkpoint again",
    )


def _restack(box: Box, target: str, stack: review.LayerStack, layer: str = "") -> None:
    """Stack the workspace at ``target`` again: ``stack``'s upper directories (oldest
    first; the last one fresh, the sandbox's upper from now on) above the host's, on
    their newest merged base (``bases.mount_plan``; a rollback, given its ``layer``,
    below every kept base builds one first, and records it). PID 1 is alone
    (``quiesce``) and gets its ``Refresh`` here whatever happens."""
    assert box.ns is not None and box.review_lower is not None and box.review_layer is not None
    try:
        layers = bases.mount_plan(stack, stack.layers)
        if layers is None and layer:
            _base_now(box, layer, stack)
            layers = bases.mount_plan(stack, stack.layers)
        if layers is None:
            raise CheckpointError(
                f"sandbox {box.name}'s workspace stands on too many layers",
                operation="checkpoint",
                path=box.name,
                hint="try again in a moment (their merged base is being built)",
            )
        try:
            with open(f"/proc/{box.pid}/mountinfo") as f:
                children = mounts_on(parse_mountinfo(f.read()), target)
        except (OSError, ValueError) as e:
            raise CheckpointError(
                f"cannot stack sandbox {box.name}'s workspace again: {e}",
                operation="checkpoint",
                path=target,
                hint="mounts made beneath the workspace at the same point cannot be moved",
            ) from None
        try:
            box.helper_ready().call(
                "review-restack",
                {"target": target, "layers": layers, "children": children, "mirror": mirror_of(box, target)},
                [box.review_layer, box.review_lower],
            )
        except OSError as e:
            if e.errno == errno.ENOTRECOVERABLE:
                broken = SandboxError(
                    f"sandbox {box.name}'s workspace could not be stacked again: {e.filename}",
                    operation="checkpoint",
                    path=box.name,
                    hint=f"remove it (`warren rm -f {box.name}`) and create it again; its layer is in "
                    "warren's state directory until then",
                )
                box.fail(broken)
                raise broken from None
            print(f"warren supervisor: checkpoint of {box.name}: {e.filename}", file=sys.stderr, flush=True)
            raise CheckpointError.from_os(
                e,
                f"cannot stack sandbox {box.name}'s workspace again: {e.filename}",
                "checkpoint",
                target,
                hint="nothing changed in the workspace; try again",
            ) from None
    finally:
        box.send(protocol.Refresh())  # PID 1 forks spares again (with rules for the new workspace)


def _base_now(box: Box, layer: str, stack: review.LayerStack) -> None:
    """A rollback's base, built while it waits (below every kept one), recorded in
    ``stack`` and its record: the frozen directories up to the checkpoint."""
    assert box.review_layer is not None
    due = review.Base(name=bases.name_for(stack.layers[-2]), covers=stack.layers[-2])
    try:
        bases.build_now(box.helper_ready(), box.review_layer, stack, due)
    except OSError as e:
        raise CheckpointError.from_os(
            e,
            f"cannot merge sandbox {box.name}'s checkpoints to roll back that far: {e.strerror}",
            "rollback",
            box.name,
            hint="roll back to a later checkpoint; free space on the disk of warren's state directory",
        ) from None
    stack.bases.append(due)
    review.write_stack(layer, stack)


@joined.op("review-restack")
def _stack_in(args: dict[str, Any], given: list[int]) -> list[int]:
    """In the sandbox's namespaces (``joined.Helper``): the layers opened beneath the
    layer's detached mount (plain names made by the supervisor, no link followed),
    then stacked at ``target`` above the host's workspace."""
    target, layers, children = str(args["target"]), [str(n) for n in args["layers"]], list(args["children"])
    mirror = str(args["mirror"]) if args.get("mirror") else None
    layer, host = given
    fds: list[int] = []
    try:
        for name in [*layers, review.work_of(layers[-1])]:
            fds.append(os.open(name, _PATH_DIR, dir_fd=layer))
        lowers = [*reversed(fds[:-2]), host]
        joined.close_later(core.restack_dir(target, lowers, fds[-2], fds[-1], children, mirror))
    finally:
        for fd in fds:
            os.close(fd)
    return []


def mounts_on(mounts: tuple[MountEntry, ...], target: str) -> list[str]:
    """The mount points (relative to ``target``) of the mounts directly on the topmost
    mount at ``target``, in the order they were made. ValueError when there is none at
    ``target``, or a mount is stacked on one of them at the same point (moving the
    lower one would leave the other behind)."""
    at = [m for m in mounts if m.mount_point == target]
    ids = {m.mount_id for m in at}
    top = [m for m in at if not any(o.parent_id == m.mount_id and o.mount_point == target for o in at)]
    if len(top) != 1 or not ids or top[0].fstype != "overlay":
        raise ValueError(f"no single overlay at {target}")
    top_id = top[0].mount_id
    children = {m.mount_id: m.mount_point for m in mounts if m.parent_id == top_id and m.mount_id != top_id}
    for m in mounts:
        if children.get(m.parent_id) == m.mount_point:
            raise ValueError(f"mounts stacked at {m.mount_point}")
    prefix = target.rstrip("/") + "/"
    return [p[len(prefix) :] for p in children.values() if p.startswith(prefix)]
