"""The sandboxes one supervisor holds, and their records in the registry.

Owns launching a planned sandbox into a ``Box``, the lookups a request needs (is there
such a sandbox, is it usable now, what is its state), the answers to requests about a
sandbox that need no client (state, list, stats, expose, pause, ...), and what the
registry is told when a long-lived sandbox becomes ready or ends. At start it sweeps
what a crashed predecessor left (registry entries, cgroups, TMPDIRs). No client
sockets: reading and answering clients is the supervisor's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import selectors
import shutil
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .. import protocol
from .._core import cgroups
from ..errors import (
    CheckpointError,
    PolicyError,
    ReviewError,
    SandboxDead,
    SandboxNotFound,
    SandboxPaused,
    SetupError,
    SnapshotError,
    WarrenError,
)
from ..images.ref import ImageRef
from ..plan import CallerFacts, Plan
from . import (
    boxnet,
    boxsecrets,
    checkpoints,
    envroot,
    gitkeeper,
    launch,
    registry,
    restack,
    review,
    rootpoints,
    snapshots,
    spawns,
    statedir,
    trail,
    usage,
)
from .box import Box, Waiter

RUN_PREFIX = "run-"  # a one-shot run as `warren net` names it (its id after it)


@dataclass
class Saving:
    """A snapshot taken without a copy, its layer being copied to the state directory."""

    sandbox: str  # whose namespaces hold its frozen layers meanwhile
    thread: threading.Thread


class Sandboxes:
    def __init__(
        self, root: str | None, sel: selectors.BaseSelector, keeper: gitkeeper.GitKeeper, waiter: Waiter
    ) -> None:
        self.root = root
        self.sel, self.keeper, self.waiter = sel, keeper, waiter
        self.registry = registry.Registry(root) if root is not None else None
        self.start_time = registry.process_start_time(os.getpid()) or 0
        self.boxes: dict[str, Box] = {}  # long-lived, by name
        self.oneshots: dict[str, Box] = {}  # by id
        self.by_pid: dict[int, Box] = {}
        self.cgroup_records = os.path.join(root, "cgroups") if root is not None else None
        self.tmp_records = os.path.join(root, "tmpdirs") if root is not None else None
        self.saving: dict[str, Saving] = {}
        if root is not None:
            snapshots.sweep_unsaved(root)
        if self.registry is not None:
            self.registry.orphaned(os.getpid(), self.start_time)
        if self.cgroup_records is not None:
            cgroups.sweep(self.cgroup_records)
        if self.tmp_records is not None:
            launch.sweep_scratch(self.tmp_records)

    def launch(
        self,
        plan: Plan,
        git: gitkeeper.Found,
        name: str,
        search_path: str | None,
        oneshot: bool,
        caller: CallerFacts | None = None,
        ahead: bool = False,
    ) -> Box:
        """Launch a planned sandbox: its repositories' stores first (the lease is the
        box's from here on, released here when the launch fails), then PID 1."""
        try:
            # The secrets' values first: a missing one is the caller's error, before anything starts.
            secret = boxsecrets.prepare(plan, caller) if caller is not None else None
            lease = self.keeper.lease(git)
            lease.idle = ahead
        except BaseException:
            git.close()
            raise
        try:
            image_lease = envroot.lease(plan, "a `warren run` sandbox" if oneshot else f"sandbox {name}")
        except BaseException:
            self.keeper.release(lease)
            raise
        layers: dict[int, list[int]] = {}
        try:
            if plan.review is not None:
                self._review_layer(plan, oneshot or ahead)
            layers = self._memory_layers(plan)
            launched = launch.launch(
                plan,
                layers=layers,
                oneshot=oneshot,
                ahead=ahead,
                record_dir=self.cgroup_records,
                tmp_records=self.tmp_records,
                trust=secret[1] if secret is not None else None,
            )
        except BaseException:
            self.keeper.release(lease)
            if image_lease is not None:
                image_lease.release()
            if plan.review is not None:
                review.remove_layer(plan.review)
            raise
        finally:
            for fds in layers.values():  # PID 1 has its copies (or never will)
                for fd in fds:
                    os.close(fd)
        box = Box(
            name=name,
            id=secrets.token_hex(6),
            plan=plan,
            launched=launched,
            oneshot=oneshot,
            sel=self.sel,
            waiter=self.waiter,
            keeper=self.keeper,
            git=lease,
            home=None if oneshot or ahead or self.root is None else statedir.sandbox_dir(self.root, name),
            search_path=search_path,
            image_lease=image_lease,
            intercept=secret[0] if secret is not None else None,
        )
        if plan.link_walk is not None and not ahead:
            box.start_walk()  # (a sandbox booted ahead is walked once taken)
        self.add(box, ahead)
        return box

    @staticmethod
    def _review_layer(plan: Plan, oneshot: bool) -> None:
        if oneshot:
            raise PolicyError(
                "review mode is for a sandbox created by name: a `warren run` keeps no layer to review",
                operation="run",
                path=plan.workspace,
                hint="`warren create NAME --review`, then `warren exec NAME ...`, `warren diff NAME`, "
                "`warren apply NAME`",
            )
        review.make_layer(plan.review or "", plan.host_workspace or plan.workspace)

    def review(self, msg: protocol.ReviewRequest) -> protocol.ReviewResult:
        """``warren diff`` / ``apply`` / ``discard`` of a review sandbox's layer. Apply and
        discard wait for the sandbox to stop: its layer then changes no more."""
        assert self.root is not None
        entry = self.entry(msg.sandbox)
        layer = review.layer_of(statedir.sandbox_dir(self.root, msg.sandbox), self.root, msg.sandbox)
        if msg.action not in ("diff", "apply", "discard"):
            raise ReviewError(f"unknown review action {msg.action!r}", operation="review", path=msg.sandbox)
        if msg.action != "diff" and (msg.sandbox in self.boxes or entry.state == registry.RUNNING):
            raise ReviewError(
                f"sandbox {msg.sandbox} is running: its layer may still change",
                operation=msg.action,
                path=msg.sandbox,
                hint=f"stop it first (`warren stop {msg.sandbox}`); `warren diff` works while it runs",
            )
        try:
            if msg.action == "discard":
                review.discard(layer)
                return protocol.ReviewResult()
            workspace = review.workspace_of(layer, entry.workspace)
            found = review.changes(layer, workspace)
        except OSError as e:
            where = e.filename if isinstance(e.filename, str) else layer
            raise ReviewError.from_os(
                e,
                f"cannot read sandbox {msg.sandbox}'s review layer at {where}: {e.strerror}",
                msg.action,
                where,
                hint="a sandbox still running may change its layer meanwhile: try again, or stop it first",
            ) from None
        if msg.action == "apply":
            chosen = review.select(found, msg.paths)
            return protocol.ReviewResult(
                changes=[c.message() for c in chosen],
                applied=review.apply(layer, workspace, chosen, msg.force),
            )
        try:
            patch = review.patch(layer, workspace, found) if msg.patch else ""
        except OSError as e:
            raise ReviewError.from_os(
                e,
                f"cannot make the patch of sandbox {msg.sandbox}'s changes: {e.strerror}",
                "diff",
                e.filename if isinstance(e.filename, str) else layer,
                hint="a sandbox still running may change its layer meanwhile: try again, or stop it first",
            ) from None
        return protocol.ReviewResult(changes=[c.message() for c in found], patch=patch)

    def checkpoint(self, msg: protocol.CheckpointRequest) -> protocol.CheckpointResult:
        """``warren checkpoint`` / ``checkpoints`` / ``rollback`` of a review sandbox, or
        of the root of a sandbox on an image (``rootpoints``)."""
        assert self.root is not None
        self.entry(msg.sandbox)
        try:
            layer = review.layer_of(statedir.sandbox_dir(self.root, msg.sandbox), self.root, msg.sandbox)
        except ReviewError:
            return self._root_checkpoint(msg)
        if msg.action == "list":
            return protocol.CheckpointResult(items=[c.message() for c in checkpoints.listing(layer)])
        if msg.action not in ("take", "rollback"):
            raise CheckpointError(
                f"unknown checkpoint action {msg.action!r}", operation="checkpoint", path=msg.sandbox
            )
        # stopped, or dead (its supervisor was killed: its processes went with it)
        at_rest = msg.sandbox not in self.boxes and self.entry(msg.sandbox).state in (
            registry.STOPPED,
            registry.DEAD,
        )
        if msg.action == "rollback" and at_rest:
            # nothing runs: only the layer's record and directories change
            back = checkpoints.rollback_stopped(msg.sandbox, layer, msg.id)
            return protocol.CheckpointResult(items=[back.message()])
        box = self.live(msg.sandbox)
        if msg.action == "take":
            point = checkpoints.take(box, layer, self.root)
            assert point is not None
            return protocol.CheckpointResult(items=[point.message()])
        chosen, stopped = checkpoints.rollback(box, layer, msg.id, msg.keep_running)
        return protocol.CheckpointResult(items=[chosen.message()], stopped=stopped)

    def _root_checkpoint(self, msg: protocol.CheckpointRequest) -> protocol.CheckpointResult:
        box = self.boxes.get(msg.sandbox)
        if box is None or not rootpoints.usable(box):
            on_image = box is not None and box.plan.image is not None
            raise CheckpointError(
                f"sandbox {msg.sandbox} has nothing to roll back to: "
                + (
                    "it is not running (the checkpoints of a root on an image end with the sandbox)"
                    if box is None
                    else "its root on an image cannot be stacked again"
                    if on_image
                    else "it writes your workspace itself, live, and has no image: no layer of its own "
                    "holds what it changed"
                ),
                operation="checkpoint" if msg.action != "rollback" else "rollback",
                path=msg.sandbox,
                hint="checkpoints are of a review workspace (`warren create NAME --review`: the sandbox "
                "writes a layer of its own, a checkpoint is taken before each command) or of the root of "
                "a sandbox on an image (`--image`)",
            )
        if msg.action == "list":
            return protocol.CheckpointResult(items=[p.message() for p in box.root_points])
        if msg.action == "take":
            return protocol.CheckpointResult(items=[rootpoints.take(box).message()])
        if msg.action != "rollback":
            raise CheckpointError(
                f"unknown checkpoint action {msg.action!r}", operation="checkpoint", path=msg.sandbox
            )
        chosen, stopped = rootpoints.rollback(box, msg.id, msg.keep_running)
        return protocol.CheckpointResult(items=[chosen.message()], stopped=stopped)

    def add(self, box: Box, ahead: bool = False) -> None:
        """``ahead``: booted for a create to come, held beside the one-shot ones (by id,
        nameless to every request) until it is given its name (``adopt``)."""
        self.by_pid[box.pid] = box
        if box.oneshot or ahead:
            self.oneshots[box.id] = box
        else:
            self.boxes[box.name] = box

    def adopt(self, box: Box, name: str) -> None:
        """A long-lived sandbox booted ahead becomes sandbox ``name``."""
        self.oneshots.pop(box.id, None)
        box.name = name
        if self.root is not None:
            box.home = statedir.sandbox_dir(self.root, name)
        self.boxes[name] = box

    def discard(self, box: Box) -> None:
        self.oneshots.pop(box.id, None)
        if self.boxes.get(box.name) is box:
            del self.boxes[box.name]

    def all(self) -> list[Box]:
        return [*self.boxes.values(), *self.oneshots.values()]

    def answer(self, msg: protocol.Message) -> tuple[protocol.Message, bytes] | None:
        """The answer to a request about sandboxes that needs no client, or None when
        ``msg`` is not one of those."""
        assert self.root is not None and self.registry is not None
        if isinstance(msg, protocol.GetRequest):
            return self.info(msg.name), b""
        if isinstance(msg, protocol.ListRequest):
            # One query for the whole listing (a query per sandbox cost ~20 ms with 1,000).
            return protocol.SandboxList(items=[self.info(e.name, e) for e in self.registry.all()]), b""
        if isinstance(msg, protocol.ExposeRequest):
            return self.live(msg.sandbox).expose(msg), b""
        if isinstance(msg, protocol.ExposeListRequest):
            return self.live(msg.sandbox, paused_ok=True).exposes(), b""
        if isinstance(msg, protocol.UnexposeRequest):
            return self.live(msg.sandbox, paused_ok=True).unexpose(msg.port), b""
        if isinstance(msg, protocol.ReviewRequest):
            return self.review(msg), b""
        if isinstance(msg, protocol.CheckpointRequest):
            return self.checkpoint(msg), b""
        if isinstance(msg, protocol.NetLogRequest):
            if self.known(msg.sandbox) is None:
                self.entry(msg.sandbox)  # raises SandboxNotFound when there is no such sandbox
            return boxnet.read_log(statedir.sandbox_dir(self.root, msg.sandbox)), b""
        if isinstance(msg, protocol.EventsRequest):
            box = self.known(msg.sandbox)
            if box is None:
                self.entry(msg.sandbox)  # raises SandboxNotFound when there is no such sandbox
            else:
                box.take_reports()  # an exec answered: its end is in the trail it reads
            lines, after, skip = trail.read(statedir.sandbox_dir(self.root, msg.sandbox), msg.after, msg.skip)
            return protocol.Events(records=lines, after=after, skip=skip, running=box is not None), b""
        if isinstance(msg, protocol.StatsRequest):
            live = self.live(msg.sandbox, paused_ok=True)
            roots, groups = live.process_roots(), live.launched.cgroups
            return usage.measure(roots, groups, live.plan.limits, live.keepers_cpu), b""
        if isinstance(msg, protocol.ProcessRequest):
            box = self.known(msg.sandbox)
            return spawns.state(self.root, msg.sandbox, msg, alive=box is not None and box.ready)
        if isinstance(msg, protocol.SpawnListRequest):
            box = self.known(msg.sandbox)
            if box is None:
                self.entry(msg.sandbox)  # raises SandboxNotFound when there is no such sandbox
            return spawns.listing(self.root, msg.sandbox, alive=box is not None and box.ready), b""
        if isinstance(msg, protocol.PauseRequest):
            self.live(msg.sandbox, paused_ok=True).set_paused(msg.paused, shed_from=self.root)
            return self.info(msg.sandbox), b""
        if isinstance(msg, protocol.SnapshotRequest):
            return _snapshot_info(self.snapshot(msg.sandbox)), b""
        if isinstance(msg, protocol.SnapshotListRequest):
            return protocol.SnapshotList(
                items=[_snapshot_info(s) for s in snapshots.all_snapshots(self.root)]
            ), b""
        if isinstance(msg, protocol.SnapshotRemoveRequest):
            saving = self.saving.get(msg.id)
            if saving is not None:
                saving.thread.join()
            in_use = {layer for b in self.all() for op in b.plan.mounts[:1] for layer in op.layers}
            return _snapshot_info(snapshots.remove(self.root, msg.id, in_use)), b""
        return None

    def snapshot(self, name: str) -> snapshots.Snapshot:
        """Snapshot sandbox ``name``'s own layer, paused meanwhile (unless it is already)."""
        assert self.root is not None
        box = self.live(name, paused_ok=True)
        if box.layer is None or box.plan.image is None:
            raise SnapshotError(
                f"sandbox {name} is not on an image: there is no layer of its own to snapshot",
                operation="snapshot",
                path=name,
                hint="create it with --image NAME; a sandbox on the host's root has no copy-on-write state",
            )
        image = ImageRef(
            name=box.plan.image,
            id=box.plan.image_id or "",
            layers=tuple(Path(p) for p in reversed(box.plan.mounts[0].layers)),
        )
        if box.stack is not None and box.paused is None:
            fast = self._freeze(box, image)
            if fast is not None:
                return fast
        below = [fd for _sid, fd in reversed(box.stack.own)] if box.stack is not None else []
        for earlier in self._saving_below(tuple(str(p) for p in image.layers)):
            earlier.join()
        was_paused = box.paused is not None
        box.set_paused(True)
        try:
            return snapshots.take(
                self.root, name, box.layer, image, box.plan.host_workspace, box.plan.image_store, below
            )
        finally:
            if not was_paused:
                box.set_paused(False)

    def _freeze(self, box: Box, image: ImageRef) -> snapshots.Snapshot | None:
        """The snapshot without a copy (``restack``): the layer frozen in the sandbox's
        memory, copied to the state directory in a thread; None when the sandbox runs a
        process now (the caller copies, paused)."""
        assert self.root is not None and box.stack is not None
        # Refused before anything is frozen: the copy that follows is bounded by the
        # sandbox's tmpfs, which holds all of its layers.
        need = snapshots.layer_bound([box.stack.tmpfs])
        snapshots.check_room(self.root, box.name, need)
        snap = snapshots.begin(
            self.root, box.name, image, box.plan.host_workspace, box.plan.image_store, need
        )
        started = time.monotonic()
        try:
            frozen = restack.freeze(box, snap.id)
        except BaseException:
            snapshots.discard(self.root, snap)
            raise
        if frozen is None:
            snapshots.discard(self.root, snap)
            return None
        stopped = time.monotonic() - started
        used = os.fstatvfs(box.stack.tmpfs)
        snap = dataclasses.replace(
            snap, size=(used.f_blocks - used.f_bfree) * used.f_frsize, seconds=round(stopped, 3)
        )
        layers = [os.dup(fd) for _sid, fd in reversed(box.stack.own)]  # lowest first
        root = self.root
        below = self._saving_below(snap.layers)

        def save() -> None:
            for earlier in below:  # the copy looks into them (whiteouts): whole first
                earlier.join()
            self._saved(snapshots.save(root, snap, layers, stopped))

        thread = threading.Thread(target=save, name=f"snapshot {snap.id}", daemon=True)
        self.saving[snap.id] = Saving(box.name, thread)
        thread.start()
        return snap

    def _saving_below(self, layers: tuple[str, ...]) -> list[threading.Thread]:
        """The copies under way of the snapshots among ``layers`` (a snapshot of a
        sandbox made from a snapshot that is still being saved)."""
        assert self.root is not None
        ids = [snapshots.id_of(self.root, layer) for layer in layers]
        return [self.saving[i].thread for i in ids if i is not None and i in self.saving]

    def _saved(self, snap: snapshots.Snapshot) -> None:
        self.saving.pop(snap.id, None)

    def _memory_layers(self, plan: Plan) -> dict[int, list[int]]:
        """Layers of the plan that are snapshots still being copied to the state
        directory: given by descriptor, copies of the frozen layers in the memory of
        the sandbox they were taken of (by index in the overlay's layers). Where that
        sandbox is gone, the copy is waited for and the layer taken by path."""
        out: dict[int, list[int]] = {}
        if self.root is None or plan.image is None or not plan.mounts:
            return out
        try:
            for i, path in enumerate(plan.mounts[0].layers):
                snap_id = snapshots.id_of(self.root, path)
                saving = self.saving.get(snap_id or "")
                if snap_id is None or saving is None:
                    continue
                box = self.boxes.get(saving.sandbox)
                fds = restack.clone_own(box, snap_id) if box is not None and box.ready else None
                if fds is None:
                    saving.thread.join()
                    snapshots.image_of(self.root, snap_id)  # raises if its copy failed
                    continue
                out[i] = fds
        except BaseException:
            for fds in out.values():
                for fd in fds:
                    os.close(fd)
            raise
        return out

    def known(self, name: str) -> Box | None:
        return self.boxes.get(name)

    def with_net(self, name: str) -> Box:
        """The running sandbox ``name`` for ``warren net``: a long-lived one, or the
        one-shot run that asks on its terminal (``run-ID``, the name it told its client)."""
        if name.startswith(RUN_PREFIX):
            box = self.oneshots.get(name[len(RUN_PREFIX) :])
            if box is not None and box.run is not None and box.run.ask and box.ready:
                return box
        return self.live(name)

    def entry(self, name: str) -> registry.Entry:
        assert self.registry is not None
        entry = self.registry.get(name)
        if entry is None:
            raise SandboxNotFound(
                f"no sandbox named {name}",
                operation="lookup",
                path=name,
                hint="see `warren ls`; create one with `warren create NAME`",
            )
        return entry

    def live(self, name: str, paused_ok: bool = False) -> Box:
        """The running sandbox ``name``, or a typed error saying why it cannot be used."""
        box = self.boxes.get(name)
        if box is not None and box.ready and box.kill_at is None and box.failure is None:
            if box.paused is not None and not paused_ok:
                raise SandboxPaused(
                    f"sandbox {name} is paused: nothing runs in it until it is resumed",
                    operation="lookup",
                    path=name,
                    hint=f"resume it with `warren resume {name}` (Sandbox.resume())",
                )
            return box
        entry = self.entry(name)
        raise SandboxDead(
            f"sandbox {name} is {entry.state if box is None else 'stopping'}"
            + (f": {why}" if (why := entry.reason if box is None else box.ending_why) else ""),
            operation="lookup",
            path=name,
            hint=f"remove it with `warren rm {name}` and create it again",
        )

    def info(self, name: str, entry: registry.Entry | None = None) -> protocol.SandboxInfo:
        """What ``warren ls`` shows of ``name``; ``entry`` is its registry record when the
        caller has read it already."""
        box = self.boxes.get(name)
        entry = entry or self.entry(name)
        state = entry.state
        if box is not None and (box.kill_at is not None or box.failure is not None):
            state = "stopping"
        elif box is not None and box.paused is not None:
            state = "paused"
        limits = box.plan.limits if box is not None else None
        return protocol.SandboxInfo(
            idle_timeout=(limits.limits.idle_timeout or None) if limits else None,
            last_active=box.last_active if box is not None else 0.0,
            name=entry.name,
            id=entry.id,
            state=state,
            # Stopping on its own (idle timeout, a failure): why, already while it stops.
            reason=entry.reason or (box.ending_why if box is not None else ""),
            workspace=entry.workspace,
            created=entry.created,
            pid1=entry.pid1,
            warnings=list(entry.warnings),
        )

    def record_ready(self, box: Box) -> None:
        """A long-lived sandbox is up: in the registry, with its state directory."""
        assert self.registry is not None and self.root is not None
        self.registry.add(
            registry.Entry(
                name=box.name,
                id=box.id,
                state=registry.RUNNING,
                reason="",
                workspace=box.plan.workspace,
                created=box.created,
                supervisor_pid=os.getpid(),
                supervisor_start=self.start_time,
                pid1=box.pid,
                warnings=box.plan.warnings,
            )
        )
        try:
            os.makedirs(statedir.sandbox_dir(self.root, box.name), mode=0o700, exist_ok=True)
            if box.plan.review is not None:
                review.write_pointer(statedir.sandbox_dir(self.root, box.name), box.plan.review)
        except OSError as e:
            with contextlib.suppress(WarrenError):
                self.registry.remove(box.name)
            raise SetupError.from_os(
                e,
                f"cannot make the state directory of sandbox {box.name}: {e.strerror}",
                "create",
                statedir.sandbox_dir(self.root, box.name),
                hint="free space on the disk of warren's state directory",
            ) from None

    def record_end(self, box: Box, status: int, warnings: list[str], shutdown: bool) -> str | None:
        """A long-lived sandbox ended: removed, or marked stopped or dead with why; the
        why of an end nobody asked for (a death, or a failure that ended it), else None."""
        assert self.registry is not None
        if box.stoppers:
            if box.remove:
                self.forget(box.name)
            else:
                self.registry.set_state(box.name, box.id, registry.STOPPED, "stopped on request", warnings)
        elif box.ending_why:  # the supervisor stopped it: a failure, or its idle timeout
            self.registry.set_state(box.name, box.id, registry.STOPPED, box.ending_why, warnings)
            if box.failure is not None:
                return box.ending_why
        elif shutdown:
            self.registry.set_state(
                box.name, box.id, registry.STOPPED, "the supervisor was stopped", warnings
            )
        else:
            how = (
                f"killed by signal {signal.Signals(os.WTERMSIG(status)).name}"
                if os.WIFSIGNALED(status)
                else f"exited with status {os.waitstatus_to_exitcode(status)}"
            )
            died = f"the sandbox's PID 1 ({box.pid}) was {how}"
            self.registry.set_state(box.name, box.id, registry.DEAD, died, warnings)
            return died
        return None

    def forget(self, name: str) -> None:
        """``rm``: the sandbox's record and state directory go."""
        assert self.registry is not None and self.root is not None
        self.registry.remove(name)
        with contextlib.suppress(WarrenError):
            review.remove_layer(review.layer_of(statedir.sandbox_dir(self.root, name), self.root, name))
        shutil.rmtree(statedir.sandbox_dir(self.root, name), ignore_errors=True)


def _snapshot_info(snap: snapshots.Snapshot) -> protocol.SnapshotInfo:
    return protocol.SnapshotInfo(
        id=snap.id,
        sandbox=snap.sandbox,
        image=snap.image,
        created=snap.created,
        size=snap.size,
        workspace=snap.workspace,
        seconds=snap.seconds,
        host_workspace=snap.host_workspace,
        saved=snap.saved,
    )
