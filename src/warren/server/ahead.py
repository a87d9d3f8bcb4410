"""Sandboxes booted ahead: after a ``run`` (or a ``create``), the supervisor boots the
next sandbox for the same request, so that the next such run takes the exec path (a
ready PID 1 and its spare helper) instead of a launch, and the next create answers as
soon as it is checked.

A sandbox booted ahead serves at most one run or create, as a fresh one does, so it is
new to its command by construction: its /tmp and TMPDIR were made empty at its launch
and nothing ran in it. What makes it *the same* sandbox the run would have got is checked at the
run, never assumed:

- the request is planned again, as every run is, with the sandbox's own TMPDIR name,
  and its plan and the host facts it was made from must equal the booted one's (a
  config file edited, a new deny, an env change that passes, a mount, a link scanned,
  other cgroups of the caller: another plan). The host's facts are gathered afresh,
  and its policy resolved afresh unless the boot's resolution still stands
  (``policymemo``: nothing it read changed); where they, the caller and the rest
  ``make_plan`` takes are all equal to what the booted plan was made from
  (``planning.Basis``), that pure step is not run again: it would make the same plan;
- the host paths the setup resolved must still be what they were (``marks``: a
  workspace, a denied directory or a bound file replaced since is another sandbox),
  which the kernel tells where it watched them (``markwatch``: nothing queued, nothing
  changed), else they are taken again;
- where the sandbox has repositories, they are brought in step before the command
  starts, and the ancestor guard's snapshot is taken again (the host's changes since
  the boot are not the sandbox's).

Anything else is a miss: the stale sandbox is stopped and the run launches a fresh one.
Only plain requests are booted ahead (namespaces usable, network none or open, or for
a run allow without ask; no secrets, no image), from their second run within ``IDLE``
seconds on, whose planning is quick (``SLOW``), while the supervisor has nothing else to
do (``QUIET``), and only for a caller in whose cgroups the supervisor itself is
(``lingers_anyway``: what is booted counts against the caller's groups after its run
returned); one per request, stopped after ``IDLE`` seconds unused, at most ``MAX`` in
all. Pure bookkeeping here: the
supervisor launches and stops.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .. import protocol
from ..plan import CallerFacts, Plan
from ..plan.facts import HostFacts, MountEntry
from ..plan.model import MountKind
from ..plan.mounts import within
from . import marks
from .box import Box

if TYPE_CHECKING:
    from .planning import Basis
    from .policymemo import PolicyMemo

# Seconds unused before a sandbox booted ahead is stopped (its spare with it), and within
# which a request must come again to be booted ahead for: an agent waiting for its model
# comes back every 5 to 60 s; at 20 s the runs of one every 30 s all launched afresh.
IDLE = 60.0
MAX = 4  # sandboxes booted ahead at a time (the oldest is stopped for a new one)
SEEN = 64  # requests remembered: one is booted ahead for only once it came again
# Booted once the supervisor has had no connection, and no exec has ended, for this long
# (seconds), with no exec running: booting takes its loop for a few ms and a core for
# longer, which a command asked for meanwhile should not wait on.
QUIET = 0.005
# ... and for the next create, this long: a create's client sends its first commands
# at once (a framework's setup, a `git config`, a `mkdir`), tens of ms apart, and a boot
# (about 50 ms of the loop on a 2-core machine) began in such a gap held the next one up:
# an exec 10 ms after the create's answer took 26 ms instead of 4. The next create comes
# when the agent's task is done, seconds later; the next run may come at once.
CREATE_QUIET = 0.25


def quiet_for(request: Request) -> float:
    """How long the supervisor must have been quiet before ``request``'s next sandbox
    is booted (``QUIET``, ``CREATE_QUIET``)."""
    return CREATE_QUIET if request.long_lived else QUIET


# A request whose planning and launch took more of the supervisor's CPU than this
# (seconds; CPU, not wall time, so a loaded machine does not turn it off; the native
# walks' processes count as the supervisor's: ``_core.treewalk.cpu``) is not booted
# ahead: planning it again at the run costs about what the boot saves (the hard-link
# scan of a large workspace), and booting would hold the supervisor's loop as long.
SLOW = 0.05

Key = tuple[object, ...]


@dataclass
class Request:
    """What a run asked, as the supervisor plans it: enough to boot the next one."""

    spec: dict[str, object]
    caller: CallerFacts
    msg_caller: protocol.Caller
    cwd: str | None
    search_path: str | None
    long_lived: bool = False  # a create's (else a run's)

    def key(self) -> Key:
        """Where to look for a sandbox booted ahead: the request's own words. Whether it
        fits is the plan's and the host's to say (``mismatch``), not this key's."""
        c = self.caller
        return (
            self.long_lived,
            c.uid,
            c.gid,
            c.cwd,
            c.cgroups,
            self.cwd,
            self.search_path,
            self.msg_caller.config,
            self.msg_caller.profile,
            json.dumps(self.spec, sort_keys=True, default=str),
        )


@dataclass
class Booted:
    box: Box
    host: HostFacts
    marks: marks.Marks
    scratch_id: str  # the random part of its TMPDIR's name: the run is planned with it
    # What its plan was made from (``planning.Basis``): a run planned from an equal one
    # gets this plan without ``make_plan`` again. None: not reusable (``Planner.planned``).
    basis: Basis | None = None
    waiting: Request | None = None  # the run given to it while it still boots
    since: float = field(default_factory=time.monotonic)
    checked: bool = False  # its marks were taken again once it was ready, and held
    # its policy, kept while what it was resolved from is unchanged (closed when used,
    # or with the box)
    policy: PolicyMemo | None = None


def lingers_anyway(caller_cgroups: str | None, own_cgroups: str) -> bool:
    """Whether this supervisor (``own_cgroups``: its /proc/self/cgroup) is in, or beneath,
    each of the caller's groups. A sandbox goes beneath the caller's groups and counts
    there; one booted ahead stays after the run that asked, so it is booted only where
    the supervisor itself stays too: never in a group of the caller's own that the
    caller alone holds (a job whose group is removed once it is done, a unit's limits)."""
    if caller_cgroups is None:
        return False
    own: dict[tuple[str, str], str] = {}
    for line in own_cgroups.splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        own[(hier, controllers)] = path
    for line in caller_cgroups.splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        mine = own.get((hier, controllers))
        if mine is None or not (mine == path or mine.startswith(path.rstrip("/") + "/")):
            return False
    return True


def eligible(plan: Plan, long_lived: bool = False) -> bool:
    """Whether a run (or, ``long_lived``, a create) of this plan may be booted ahead. A
    run's network may be ``allow`` (not ``ask``): its proxy's helper is given the run's
    event pipe when the run takes it (``boxnet.attach_events``); a long-lived sandbox's
    helper logs under the sandbox's name, which a booted one does not have yet."""
    network = ("none", "open") if long_lived else ("none", "open", "allow")
    return (
        plan.namespaces
        and plan.image is None
        and plan.net.mode in network
        and plan.net.ask_timeout is None
        and not plan.net.intercepts
        and plan.net.trust_bundle is None
        and plan.review is None
    )


class Pool:
    def __init__(self) -> None:
        self.booted: dict[Key, Booted] = {}
        self.seen: dict[Key, float] = {}  # request -> when it last ran, oldest first

    def again(self, key: Key, now: float) -> bool:
        """Note a run of ``key``; whether it also ran within ``IDLE`` seconds before. A
        request is booted ahead for from its second run on: one that comes once costs
        no sandbox that nobody uses."""
        last = self.seen.pop(key, None)
        self.seen[key] = now
        while len(self.seen) > SEEN:
            del self.seen[next(iter(self.seen))]
        return last is not None and now - last <= IDLE

    def get(self, key: Key) -> Booted | None:
        return self.booted.get(key)

    def add(self, key: Key, booted: Booted) -> list[Box]:
        """Keep ``booted`` for ``key``; returns the sandboxes to stop to make room."""
        self.booted[key] = booted
        out = []
        while len(self.booted) > MAX:
            oldest = min(self.booted, key=lambda k: self.booted[k].since)
            out.append(self.booted.pop(oldest).box)
        return out

    def take(self, key: Key) -> Booted | None:
        return self.booted.pop(key, None)

    def forget(self, box: Box) -> None:
        for key, booted in list(self.booted.items()):
            if booted.box is box:
                del self.booted[key]

    def expired(self, now: float) -> list[Box]:
        """Those unused for ``IDLE`` seconds (forgotten here; the caller stops them)."""
        old = [key for key, b in self.booted.items() if now - b.since > IDLE]
        return [self.booted.pop(key).box for key in old]

    def boxes(self) -> list[Box]:
        return [b.box for b in self.booted.values()]


def mismatch(booted: Booted, plan: Plan, host: HostFacts) -> tuple[str | None, bool]:
    """Why the booted sandbox is not exactly what a run planned now as ``plan`` on
    ``host`` (with the booted sandbox's TMPDIR name) would get (words for the
    supervisor's log), or None where it is (if still booting: so far; its marks are
    checked again once it is ready); and whether it is, once its read rules are built
    again (``changed``)."""
    box = booted.box
    if box.kill_at is not None or box.run is not None:
        return "it is being stopped, or used", False
    if plan != box.plan:
        return f"the request is planned differently now ({_differing(plan, box.plan)})", False
    if host != booted.host and not same_but_hidden(plan, host, booted.host):
        return f"the host changed ({_differing(host, booted.host)})", False
    return changed(booted, plan)


def _differing(now: Plan | HostFacts, then: Plan | HostFacts) -> str:
    """The fields of two plans (or two hosts' facts) that differ, by name."""
    return ", ".join(f.name for f in dataclasses.fields(now) if getattr(now, f.name) != getattr(then, f.name))


# Mounts a plan makes afresh over a host directory: whatever the host mounts beneath it
# is out of the sandbox's sight.
_FRESH = frozenset({MountKind.TMPFS})
# Steps that do not bring anything of the host's into the sandbox at their path.
_NOT_HOST = frozenset({MountKind.ROOT_VIEW, MountKind.TMPFS, MountKind.PROC, MountKind.DEVPTS})
_NOT_HOST |= {MountKind.SYMLINK, MountKind.DIR, MountKind.RO_SELF}


def hidden_mounts(plan: Plan, mounts: tuple[MountEntry, ...]) -> frozenset[MountEntry]:
    """The host's mounts that ``plan``'s sandbox never shows: strictly beneath a fresh
    tmpfs of the plan (its /tmp, /run: made over the host's, which the sandbox cannot
    unmount), and neither above nor beneath any host path another step of the plan
    brings in (a workspace under /tmp is bound from the host with what is mounted in it)."""
    fresh = [op.target for op in plan.mounts if op.kind in _FRESH]
    brought = [
        path
        for op in plan.mounts
        if op.kind not in _NOT_HOST
        for path in (op.target, op.source, *op.layers)
        if path is not None and path.startswith("/")
    ]
    out = set()
    for entry in mounts:
        mp = entry.mount_point
        if not any(mp != t and within(mp, t) for t in fresh):
            continue
        if any(within(mp, p) or within(p, mp) for p in brought):
            continue
        out.add(entry)
    return frozenset(out)


def same_but_hidden(plan: Plan, host: HostFacts, then: HostFacts) -> bool:
    """Whether ``host`` and ``then`` differ only in mounts ``plan``'s sandbox never shows
    (``hidden_mounts``: a test suite's tmpfs under the host's /tmp, made or gone)."""
    now_seen = tuple(m for m in host.mounts if m not in hidden_mounts(plan, host.mounts))
    then_seen = tuple(m for m in then.mounts if m not in hidden_mounts(plan, then.mounts))
    return now_seen == then_seen and dataclasses.replace(host, mounts=()) == dataclasses.replace(
        then, mounts=()
    )


def changed(booted: Booted, plan: Plan) -> tuple[str | None, bool]:
    """What of the host paths the booted sandbox was set up from is another file now
    (``plan``: its own, or one equal to it), or None; and whether the sandbox is what a
    fresh one would be only once PID 1 builds its read rules again (an entry made or
    replaced in a directory whose entries get a rule each, and that only:
    ``marks.rules_only``). The kernel says nothing changed where it watched them and
    nothing came (``markwatch``); else the marks are taken again."""
    watch = booted.box.launched.mark_watch
    if watch is not None and watch.unchanged():
        return None, False
    now = marks.take(plan)
    why = marks.difference(booted.marks, now)
    if why is None:
        return None, False
    if marks.difference(booted.marks, now, skip=marks.rules_only(plan)) is None:
        return None, True
    return why, False
