"""Where a run's or a create's sandbox comes from: the one booted ahead for its request
when it fits, else a fresh launch; and booting the next one ahead.

``ahead`` keeps the books (which request has a sandbox booted, what makes one fit);
this module plans, launches, checks and hands over, for the supervisor, which decides
when (after an answer, while nobody waits). A booted sandbox given to a run or a
creator before it is ready is handed over once it is checked ready (``ready``); one
that fails the check is stopped, and whoever waited on it gets a fresh one.
"""

from __future__ import annotations

import secrets
import time

from .. import protocol
from .._core import guard, treewalk
from ..errors import WarrenError
from . import ahead, boxnet, clients, gitkeeper, planning, policymemo, sandboxes
from .box import Box, Run
from .clients import Client
from .connections import Connections


class Booter:
    def __init__(
        self,
        planner: planning.Planner,
        boxes: sandboxes.Sandboxes,
        git: gitkeeper.GitKeeper,
        notes: clients.Notes,
        conns: Connections,
        inline: bool,
    ) -> None:
        self.planner, self.sandboxes, self.git, self.notes = planner, boxes, git, notes
        self.clients = conns
        self.inline = inline  # a supervisor for one client boots nothing ahead
        self.pool = ahead.Pool()  # one-shot sandboxes booted for the next run of a request
        self.to_boot: dict[ahead.Key, ahead.Request] = {}  # booted once nothing else is asked

    def run(self, request: ahead.Request, run: Run) -> Box:
        """The sandbox for a one-shot run."""
        began = treewalk.cpu()
        found = self._booted_for(request)
        if found is None:
            box = self._launch_run(request, run)
        else:
            box, booted = found
            box.run = run
            self._take(box, booted, request)
        box.request = self._again(request, began)  # once it is answered, the next one is booted
        return box

    def create(self, request: ahead.Request, name: str, creator: Client) -> Box:
        """The sandbox for a create, named ``name``."""
        began = treewalk.cpu()
        found = self._booted_for(request)
        if found is None:
            box = self._launch_create(request, name, creator)
            box.request = self._again(request, began)  # once it is ready, the next one is booted
        else:
            box, booted = found
            self.sandboxes.adopt(box, name)
            box.creator = creator
            box.request = self._again(request, began)
            self._take(box, booted, request)
        return box

    def later(self, request: ahead.Request) -> None:
        """Boot the next sandbox for ``request`` once nothing else is asked."""
        self.to_boot[request.key()] = request

    def boot_next(self, shutdown: bool, quiet: float) -> None:
        """The oldest request waiting for one that the supervisor has been ``quiet``
        long enough for (``ahead.quiet_for``): its sandbox is booted now, unless the
        supervisor is shutting down."""
        key = next((k for k, r in self.to_boot.items() if quiet >= ahead.quiet_for(r)), None)
        if key is None:
            return
        request = self.to_boot.pop(key)
        if not shutdown:
            self._boot_ahead(request)

    def drop_replaced(self) -> None:
        """Stop the sandboxes booted ahead that a path of their plan no longer leads to
        (``markwatch.MarkWatch.replaced``: a workspace deleted, moved away or made
        again): no run could be given them, and each holds a PID 1 and its spare until
        ``ahead.IDLE``. The supervisor calls this on its timers' round."""
        for box in self.pool.boxes():
            why = _replaced(box)
            if why is not None:
                self.pool.forget(box)
                self.notes.log("ahead", f"a sandbox booted ahead was stopped unused: {why}")
                box.terminate()

    def stop(self) -> None:
        """Nothing more is booted, and those booted are stopped."""
        self.to_boot.clear()
        for box in self.pool.expired(float("inf")):
            box.terminate()

    def _launch_run(self, request: ahead.Request, run: Run) -> Box:
        plan, git, _host = self.planner.plan(request)
        box = self.sandboxes.launch(
            plan, git, "run", request.search_path, oneshot=True, caller=request.caller
        )
        box.run = run
        return box

    def _launch_create(self, request: ahead.Request, name: str, creator: Client) -> Box:
        plan, git, _host = self.planner.plan(request)
        box = self.sandboxes.launch(
            plan, git, name, request.search_path, oneshot=False, caller=request.caller
        )
        box.creator = creator
        return box

    def _booted_for(self, request: ahead.Request) -> tuple[Box, ahead.Booted] | None:
        """The sandbox booted ahead for this request, if the request planned now gets
        exactly it (``ahead.mismatch``); a stale one is stopped. The caller gives it its run
        or its creator, then ``_take``."""
        booted = self.pool.take(request.key())
        if booted is None:
            return None
        box = booted.box
        why = _replaced(box)
        if why is not None:  # no need to plan the request again to know
            self.notes.log("ahead", f"a sandbox booted ahead was not used: {why}")
            box.terminate()
            return None
        # Made from what the booted one was made from, the plan is the booted one (the
        # host facts are gathered again to know it, and the policy is resolved again
        # unless the boot's still stands: ``policymemo``).
        known = (booted.basis, box.plan) if booted.basis is not None else None
        policy = None
        if booted.policy is not None:
            policy = booted.policy.policy_for(self.planner.memo_key(request))
            booted.policy.close()  # used once: its watch goes now
            booted.policy = None
        plan, git, host, _basis = self.planner.planned(
            request, scratch_id=booted.scratch_id, known=known, policy=policy
        )
        git.close()  # the booted sandbox holds its repositories' lease
        why, refresh = ahead.mismatch(booted, plan, host)
        if why is not None:
            self.notes.log("ahead", f"a sandbox booted ahead was not used: {why}")
            box.terminate()
            return None
        if refresh and booted.checked:  # (else ``ready`` finds the same, and does it)
            _refresh(box)
        # The host's own changes since the boot are not the sandbox's to be undone.
        box.launched.guard = guard.snapshot(box.plan.guarded)
        return box, booted

    def _take(self, box: Box, booted: ahead.Booted, request: ahead.Request) -> None:
        """Its run or creator given: used at once when it is ready, else once it is
        (``ready``)."""
        if booted.checked:
            self._adopt(box)
        else:
            booted.waiting = request

    def _adopt(self, box: Box) -> None:
        """A sandbox booted ahead takes its run's command, or becomes its creator's
        sandbox; its repositories are brought in step first."""
        box.booted = None
        if box.git is not None:
            box.git.idle = False  # its command or its creator's may write the roots now
        if box.launched.mark_watch is not None:
            box.launched.mark_watch.close()  # used: nothing asks it again
            box.launched.mark_watch = None
        self.git.sync(box.git)
        box.walk_before_use()
        if box.run is not None:
            if box.netd is not None and box.run.events is not None:
                # Its proxy's decisions go to this run's client from its first call on.
                try:
                    boxnet.attach_events(box.netd, box.name, box.run.events)
                except WarrenError as e:
                    box.fail(e)
                    return
            box.start_run()
            return
        box.created = box.last_active = time.time()
        box.send(protocol.Adopted())  # its spare, kept while it waited, goes when idle from now on
        box.waiter.box_ready(box)

    def _boot_ahead(self, request: ahead.Request) -> None:
        """After a run or a create: the next sandbox for the same request, booted now."""
        key = request.key()
        if self.pool.get(key) is not None:
            return
        scratch_id = secrets.token_hex(12)
        memo = policymemo.make(self.planner.memo_key(request), lambda: self.planner.resolve(request))
        booted = self._booted(request, scratch_id, memo)
        if booted is None:
            if memo is not None:
                memo.close()
            return
        for old in self.pool.add(key, booted):
            old.terminate()

    def _booted(
        self, request: ahead.Request, scratch_id: str, memo: policymemo.PolicyMemo | None
    ) -> ahead.Booted | None:
        """``request`` planned (with ``memo``'s policy where there is one) and launched
        ahead, or None where it is not to be (its ``memo`` is then the caller's)."""
        try:
            plan, git, host, basis = self.planner.planned(
                request, scratch_id=scratch_id, policy=memo.policy if memo is not None else None
            )
        except WarrenError:
            return None
        if not ahead.eligible(plan, request.long_lived):
            git.close()
            return None
        try:
            box = self.sandboxes.launch(
                plan,
                git,
                f"ahead-{scratch_id}",
                request.search_path,
                oneshot=not request.long_lived,
                caller=request.caller,
                ahead=True,
            )
        except WarrenError:
            return None
        assert box.launched.marks is not None
        box.booted = ahead.Booted(box, host, box.launched.marks, scratch_id, basis=basis, policy=memo)
        return box.booted

    def _again(self, request: ahead.Request, began: float) -> ahead.Request | None:
        """``request`` if the next one like it is to be booted ahead (``ahead.Pool.again``,
        ``ahead.lingers_anyway``; planned and launched within ``ahead.SLOW`` of this
        process's CPU time since ``began``), else None."""
        if self.inline or not self.pool.again(request.key(), time.monotonic()):
            return None
        spent = treewalk.cpu() - began
        if spent > ahead.SLOW:
            # Said, so that a run that was expected to find a sandbox booted says why not.
            self.notes.log(
                "ahead-slow",
                f"the next run of a request is not booted ahead: this one took {spent * 1e3:.0f} ms "
                f"of the supervisor's CPU to plan and launch (more than {ahead.SLOW * 1e3:.0f})",
            )
            return None
        with open("/proc/self/cgroup") as f:
            return request if ahead.lingers_anyway(request.caller.cgroups, f.read()) else None

    def ready(self, box: Box, booted: ahead.Booted) -> None:
        """A sandbox booted ahead is ready: what PID 1 set up from must be what the
        launch saw, or it is no copy of a fresh one (a run waiting for it launches one)."""
        why, refresh = ahead.changed(booted, box.plan)
        if why is None:
            if refresh:
                _refresh(box)
            booted.checked = True
            if booted.waiting is not None:
                self._adopt(box)
            return
        self.notes.log("ahead", f"a sandbox booted ahead was stopped once ready: {why}")
        self.pool.forget(box)
        run, creator, box.run, box.creator = box.run, box.creator, None, None
        again, box.request = box.request, None
        box.booted = booted  # still unused: nothing of its end is anyone's
        box.terminate()
        request = booted.waiting
        if request is None:
            return
        try:
            if run is not None:
                fresh = self._launch_run(request, run)
                run.client.box = fresh
            elif creator is not None:
                fresh = self._launch_create(request, box.name, creator)
            else:
                return
        except WarrenError as e:
            if run is not None:
                run.close_fds()
                run.client.box = None
            waiting = run.client if run is not None else creator
            assert waiting is not None
            self.clients.reply(waiting, protocol.error_message(e))
            return
        fresh.request = again


def _replaced(box: Box) -> str | None:
    """Why ``box``, booted ahead, can certainly not be used, told by its marks' watch
    alone (a path on the way to one its plan names was removed or moved away), or None."""
    watch = box.launched.mark_watch
    where = watch.replaced() if watch is not None else None
    return None if where is None else f"{where} was removed or moved away since the boot"


def _refresh(box: Box) -> None:
    """The booted sandbox's read rules built again before its command: a directory whose
    entries get a rule each has a new one since the boot (its spare, holding the old
    rules, goes as it is sent: ``Box.send``; PID 1 forks the next with the new)."""
    box.send(protocol.Refresh())
