"""How each resource limit is enforced on this host for this caller: a pure decision.

Inputs: the policy's limits (unset ones take ``policy.limits.defaults``), the cgroup
hierarchies this caller could write (``CgroupFacts``, probed by ``_core.cgroups``),
the machine's RAM. Output: a ``LimitsPlan`` — one row per limit saying how it is
enforced (``cgroup1``, ``cgroup2``, ``rlimit (...)``, ``tmpfs size=``, or ``not
enforceable here: why``), the cgroup files to write, the rlimits to set, how the
sandbox is paused, and which cgroup counters tell that a limit was reached. The best
mechanism wins (a writable cgroup v1 controller, then a delegated cgroup2 subtree,
then rlimits); nothing is dropped silently. The sandbox's groups go beneath the
*caller's* (the client's) groups; ``place`` decides the hierarchies where it gets none:
join the caller's group, stay (nothing escaped), or refuse (a limit set on the caller's
side would be escaped). Executed by ``_core.cgroups`` and ``_core.shim``; the
supervisor enforces the idle timeout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .. import durations
from ..policy.limits import NO_LIMIT, Limits, defaults, pids_formula, show_size

CGROUP1 = "cgroup1"
CGROUP2 = "cgroup2"
NPROC = "rlimit (RLIMIT_NPROC in the sandbox's own user namespace: counts the whole sandbox)"
DATA = "rlimit (per process: RLIMIT_DATA)"
TMPFS = "tmpfs size="
NOT = "not enforceable here"
CFS_PERIOD_US = 100_000
SUPERVISOR = "supervisor"
# How a sandbox is paused: the freezer stops every task without its knowledge; signals
# are the fallback (a stopped child is visible to its parent, and resume continues
# whatever the sandbox had stopped itself).
FREEZER1 = "cgroup1 freezer"
FREEZE2 = "cgroup2 cgroup.freeze"
SIGNALS = "signals (SIGSTOP/SIGCONT; the processes' parents can see the stop)"
V2 = "cgroup2"  # the controller name of the one cgroup2 group a sandbox gets


@dataclass(frozen=True)
class Hierarchy:
    """A cgroup v1 controller as this caller finds it."""

    controller: str  # "pids", "memory", "cpu", "freezer"
    parent: str  # the caller's own cgroup in it: sandboxes' cgroups go beneath
    writable: bool


@dataclass(frozen=True)
class Placement:
    """One hierarchy the caller is in (a v1 hierarchy, or cgroup2): where the caller
    is, where the supervisor is (a new PID 1 starts there), and what the sandbox would
    escape if it stayed there."""

    controllers: tuple[str, ...]  # the v1 hierarchy's controllers, or (V2,)
    caller: str  # the caller's own group (a directory)
    supervisor: str  # the supervisor's group: where PID 1 is born
    joinable: bool  # a process of this uid may move itself into ``caller``
    # What is set on the caller's side, between its group and the one it shares with
    # the supervisor ("pids.max 60 of /sys/fs/cgroup/pids/ci"): limits a sandbox left in
    # the supervisor's group would escape. Filled only when the supervisor is not
    # inside the caller's group.
    escaped: tuple[str, ...] = ()

    @property
    def within(self) -> bool:
        """The supervisor is in the caller's group or beneath it: whatever limits the
        caller limits a sandbox born there."""
        return self.supervisor == self.caller or self.supervisor.startswith(self.caller.rstrip("/") + "/")


@dataclass(frozen=True)
class CgroupFacts:
    """The caller's cgroups (the client's, read from the kernel by the supervisor),
    and what this uid may do there."""

    uid: int
    v1: tuple[Hierarchy, ...] = ()
    # cgroup2: the caller's own cgroup and the controllers enabled for its children
    # (empty: no delegated subtree to use).
    v2_path: str | None = None
    v2_controllers: tuple[str, ...] = ()
    v2_writable: bool = False
    placements: tuple[Placement, ...] = ()
    # Finite pids limits of the caller's group and its ancestors in the hierarchy that
    # holds the sandbox's pids group: (directory, pids.max), innermost first.
    pids_caps: tuple[tuple[str, int], ...] = ()
    # ``v2_path`` is the supervisor's delegated group, not the caller's: the caller's is
    # not delegated and sets no limit a group beneath the supervisor's would escape.
    v2_borrowed: bool = False

    def writable(self, controller: str) -> Hierarchy | None:
        for h in self.v1:
            if h.controller == controller and h.writable:
                return h
        return None

    def v2_offers(self, controller: str) -> bool:
        """A delegated cgroup2 subtree whose children may get ``controller``."""
        return self.v2_writable and self.v2_path is not None and controller in self.v2_controllers

    def why_not(self, controller: str) -> str:
        """Why no cgroup can enforce ``controller`` for this caller."""
        v1 = next((h for h in self.v1 if h.controller == controller), None)
        parts = []
        if v1 is None:
            parts.append(f"no cgroup v1 {controller} hierarchy")
        else:
            parts.append(f"cgroup v1 {controller} ({v1.parent}) is not writable by uid {self.uid}")
        if self.v2_path is None:
            parts.append("no cgroup2 mount")
        elif not self.v2_writable:
            parts.append(f"the caller's cgroup2 group {self.v2_path} is not delegated to uid {self.uid}")
        else:
            offered = " ".join(self.v2_controllers) or "none"
            parts.append(
                f"the delegated cgroup2 group {self.v2_path} has no {controller} controller (has: {offered})"
            )
        return "; ".join(parts)


@dataclass(frozen=True)
class LimitRow:
    name: str  # "memory", "pids", "cpus", "tmp_size"
    value: str  # as shown: "512M", "64", "0.5", "none"
    default: bool  # taken from the defaults, not set
    mechanism: str  # CGROUP1, NPROC, DATA, TMPFS, NOT, or "none"
    detail: str = ""

    @property
    def enforced(self) -> bool:
        return self.mechanism not in (NOT, "none")


@dataclass(frozen=True)
class CgroupPlan:
    controller: str  # a v1 controller, or V2 for the sandbox's one cgroup2 group
    parent: str  # the sandbox's cgroup is made beneath, named at launch
    files: tuple[tuple[str, str], ...]  # (file, value), written in order
    # cgroup2: controllers to enable in ``parent``'s cgroup.subtree_control first
    enable: tuple[str, ...] = ()
    borrowed: bool = False  # ``parent`` is the supervisor's group (CgroupFacts.v2_borrowed)


@dataclass(frozen=True)
class Counter:
    """A cgroup file whose ``key`` line counts the times a limit was reached."""

    limit: str  # "memory" or "pids"
    controller: str  # the group it is read from (a v1 controller or V2)
    file: str
    key: str


@dataclass(frozen=True)
class LimitsPlan:
    limits: Limits  # the effective values
    rows: tuple[LimitRow, ...] = ()
    cgroups: tuple[CgroupPlan, ...] = ()
    rlimits: tuple[tuple[str, int], ...] = ()  # ("RLIMIT_NPROC", n): set on each command before execve
    pause: str = SIGNALS  # FREEZER1, FREEZE2 or SIGNALS
    counters: tuple[Counter, ...] = ()
    # The caller's own groups PID 1 moves into where the sandbox gets no group of its
    # own in that hierarchy and the supervisor is elsewhere (it counts against them).
    joins: tuple[str, ...] = ()
    # Why the sandbox cannot be placed inside the caller's cgroups: launching is
    # refused (a sandbox in the supervisor's groups would escape these limits).
    refused: tuple[str, ...] = ()
    # The caller's pids limits above the sandbox's own (see CgroupFacts.pids_caps).
    pids_caps: tuple[tuple[str, int], ...] = ()
    # (name in /proc/sys/user, value): set by PID 1 in the sandbox's own user namespace
    # (``user_ns_limits``).
    user_ns: tuple[tuple[str, int], ...] = ()

    def row(self, name: str) -> LimitRow:
        return next(r for r in self.rows if r.name == name)

    def reached(self, limit: str, peak: int | None = None) -> str:
        """How a command is told it ran into ``limit`` ("memory limit 512M reached").
        ``peak``: the most tasks the sandbox's own pids group ever held; below its own
        limit, the refused fork was the caller's limit, named as such."""
        if limit == "memory":
            return f"memory limit {show_size(self.limits.memory or 0)} reached"
        own = (self.limits.pids or 0) + OVERHEAD_TASKS
        if peak is not None and self.pids_caps and peak < own:
            group, cap = min(self.pids_caps, key=lambda c: c[1])
            mine = self.limits.pids
            return f"pids limit {cap} of the caller's cgroup {group} reached, not the sandbox's own ({mine})"
        return f"pids limit {self.limits.pids} reached"


# PID 1, its spare helper, each command's helper, the git broker: tasks of the sandbox that
# are warren's, added to the pids limit so the user's number is the commands' own.
OVERHEAD_TASKS = 8


# What one sandbox may hold of each per-user count the kernel charges at every user
# namespace level up to the host's uid: a share of the user's own limit, so that one
# sandbox at its limit leaves the rest to the user's host programs and other sandboxes.
USER_NS_SHARES = {
    "max_inotify_instances": 4,
    "max_inotify_watches": 2,
    "max_fanotify_groups": 4,
    "max_fanotify_marks": 2,
}


def user_ns_limits(host: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """The limits of a sandbox's own user namespace, from the user's (``host``: the
    values of /proc/sys/user there; a name the kernel lacks is left out)."""
    return tuple(
        (name, max(1, host[name] // share)) for name, share in USER_NS_SHARES.items() if host.get(name, 0) > 0
    )


def plan(
    given: Limits,
    facts: CgroupFacts,
    mem_total: int,
    cpus: int = 1,
    user_counts: Mapping[str, int] | None = None,
) -> LimitsPlan:
    """``cpus``, ``mem_total``: the machine's, which the defaults scale with;
    ``user_counts``: the host's /proc/sys/user limits (None: the sandbox gets no user
    namespace, so none of its own)."""
    base = defaults(mem_total, cpus)
    eff = Limits(
        memory=given.memory if given.memory is not None else base.memory,
        pids=given.pids if given.pids is not None else base.pids,
        cpus=given.cpus if given.cpus is not None else base.cpus,
        tmp_size=given.tmp_size if given.tmp_size is not None else base.tmp_size,
        idle_timeout=given.idle_timeout if given.idle_timeout is not None else base.idle_timeout,
    )
    rows: list[LimitRow] = []
    groups: list[CgroupPlan] = []
    v2_files: list[tuple[str, str]] = []
    v2_enable: list[str] = []
    rlimits: list[tuple[str, int]] = []
    counters: list[Counter] = []
    pids_in = ""  # the group that enforces the pids limit: "pids" (v1), V2, or none

    def by_cgroup(
        controller: str, v1: list[tuple[str, str]], v2: list[tuple[str, str]], counter: Counter | None
    ) -> str:
        """Enforce through a writable v1 controller, else the delegated cgroup2 group:
        the mechanism's name, or "" when neither can."""
        h = facts.writable(controller)
        if h is not None:
            groups.append(CgroupPlan(controller, h.parent, tuple(v1)))
            if counter:
                counters.append(counter)
            return CGROUP1
        if facts.v2_offers(controller):
            v2_enable.append(controller)
            v2_files.extend(v2)
            if counter:
                counters.append(Counter(counter.limit, V2, *V2_COUNTERS[counter.limit]))
            return CGROUP2
        return ""

    for name in ("memory", "pids", "tmp_size"):
        if getattr(eff, name) == NO_LIMIT:
            rows.append(LimitRow(name, "none", False, "none", "no limit, as asked"))
    if eff.memory:
        shown = show_size(eff.memory)
        how = by_cgroup(
            "memory",
            [("memory.limit_in_bytes", str(eff.memory))],
            [("memory.max", str(eff.memory))],
            Counter("memory", "memory", "memory.oom_control", "oom_kill"),
        )
        if how:
            file = "memory.limit_in_bytes" if how == CGROUP1 else "memory.max"
            rows.append(LimitRow("memory", shown, given.memory is None, how, f"{file}, all processes"))
        else:
            rlimits.append(("RLIMIT_DATA", eff.memory))
            rows.append(
                LimitRow(
                    "memory",
                    shown,
                    given.memory is None,
                    DATA,
                    "several processes together can use more; " + facts.why_not("memory"),
                )
            )
    if eff.pids:
        files = [("pids.max", str(eff.pids + OVERHEAD_TASKS))]
        how = by_cgroup("pids", files, files, Counter("pids", "pids", "pids.events", "max"))
        pids_in = "pids" if how == CGROUP1 else V2 if how == CGROUP2 else ""
        formula = f"; default: {pids_formula(mem_total, cpus)}" if given.pids is None else ""
        if how:
            rows.append(LimitRow("pids", str(eff.pids), given.pids is None, how, "pids.max" + formula))
        elif facts.uid == 0:
            # The kernel never applies RLIMIT_NPROC to the host's root (a root caller's
            # sandbox maps to it): setting it would claim a limit that is not there.
            why = "RLIMIT_NPROC does not bind root; " + facts.why_not("pids") + formula
            rows.append(LimitRow("pids", str(eff.pids), given.pids is None, NOT, why))
        else:
            rlimits.append(("RLIMIT_NPROC", eff.pids + OVERHEAD_TASKS))
            rows.append(
                LimitRow("pids", str(eff.pids), given.pids is None, NPROC, facts.why_not("pids") + formula)
            )
    if eff.cpus:
        quota = max(1000, round(eff.cpus * CFS_PERIOD_US))
        how = by_cgroup(
            "cpu",
            [("cpu.cfs_period_us", str(CFS_PERIOD_US)), ("cpu.cfs_quota_us", str(quota))],
            [("cpu.max", f"{quota} {CFS_PERIOD_US}")],
            None,
        )
        if how:
            detail = (
                f"cpu.cfs_quota_us {quota} per 100 ms"
                if how == CGROUP1
                else f"cpu.max {quota} {CFS_PERIOD_US}"
            )
            rows.append(LimitRow("cpus", f"{eff.cpus:g}", False, how, detail))
        else:
            rows.append(LimitRow("cpus", f"{eff.cpus:g}", False, NOT, facts.why_not("cpu")))
    else:
        # No quota, but one scheduling group: a sandbox of many busy processes gets
        # one fair share, not one per process.
        how = by_cgroup("cpu", [], [], None)
        rows.append(
            LimitRow(
                "cpus",
                "none",
                True,
                "none",
                f"one fair share as a {how} cpu group" if how else "shared fairly by the scheduler",
            )
        )
    if eff.tmp_size:
        rows.append(
            LimitRow(
                "tmp_size",
                show_size(eff.tmp_size),
                given.tmp_size is None,
                TMPFS,
                "each of /tmp and /dev/shm",
            )
        )
    if eff.idle_timeout:
        rows.append(
            LimitRow(
                "idle_timeout",
                durations.show(eff.idle_timeout),
                False,
                SUPERVISOR,
                "a long-lived sandbox stops after this long without a request",
            )
        )
    else:
        rows.append(
            LimitRow("idle_timeout", "none", given.idle_timeout is None, "none", "lives until stopped")
        )
    pause = SIGNALS
    freezer = facts.writable("freezer")
    if freezer is not None:
        groups.append(CgroupPlan("freezer", freezer.parent, ()))
        pause = FREEZER1
    elif facts.v2_writable and facts.v2_path is not None:
        pause = FREEZE2
    if facts.v2_writable and facts.v2_path is not None and (v2_enable or pause == FREEZE2):
        # One group holds the whole sandbox: what it enforces, and cgroup.freeze and
        # cgroup.kill, which every cgroup2 group has.
        groups.append(CgroupPlan(V2, facts.v2_path, tuple(v2_files), tuple(v2_enable), facts.v2_borrowed))
    caps = facts.pids_caps if pids_in else ()
    if caps:
        # The sandbox's own peak tells whose limit refused a fork (``reached``).
        counters.append(Counter("pids", pids_in, "pids.peak", ""))
    joins, refused = place(facts, tuple(groups))
    return LimitsPlan(
        eff,
        tuple(rows),
        tuple(groups),
        tuple(rlimits),
        pause,
        tuple(counters),
        joins,
        refused,
        caps,
        user_ns_limits(user_counts) if user_counts is not None else (),
    )


def place(facts: CgroupFacts, groups: tuple[CgroupPlan, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Where the sandbox goes in each hierarchy the caller is in: its own group beneath
    the caller's (``groups``, made beneath ``Hierarchy.parent``, the caller's); else
    nowhere new when the supervisor is inside the caller's group anyway; else the
    caller's group itself (joined); else, if that would escape a limit set on the
    caller's side, refused — never silently the supervisor's group. Returns (joins,
    refusals)."""
    joins: list[str] = []
    refused: list[str] = []
    for p in facts.placements:
        if any(g.controller in p.controllers for g in groups) or p.within:
            continue
        if p.joinable:
            joins.append(p.caller)
        elif p.escaped:
            refused.append(
                f"the supervisor runs in {p.supervisor}, outside your cgroup {p.caller}, and uid "
                f"{facts.uid} cannot place the sandbox there: it would escape {', '.join(p.escaped)}"
            )
    return tuple(joins), tuple(refused)


# The counters of a cgroup2 group: (file, key) per limit.
V2_COUNTERS = {"memory": ("memory.events", "oom_kill"), "pids": ("pids.events", "max")}


def render(lp: LimitsPlan) -> list[str]:
    lines = ["limits"]
    for r in lp.rows:
        how = r.mechanism if r.mechanism != NOT else f"{NOT}: {r.detail}"
        extra = f"  ({r.detail})" if r.detail and r.mechanism != NOT else ""
        lines.append(f"  {r.name:<12} {r.value:<7}{' (default)' if r.default else '':<10} {how}{extra}")
    lines.append(f"  {'pause':<12} {'':<7}{'':<10} {lp.pause}")
    for g in lp.cgroups:
        whose = "the supervisor's (yours is not delegated, and sets no limit)" if g.borrowed else "yours"
        lines.append(f"  {'cgroup':<12} {g.controller:<17} beneath {g.parent}: {whose}")
    for j in lp.joins:
        lines.append(f"  {'cgroup':<12} {'(joined)':<17} the caller's own {j}")
    for cap in lp.pids_caps:
        lines.append(f"  {'caller cap':<12} {'pids ' + str(cap[1]):<17} {cap[0]} (counts the sandbox too)")
    for name, value in lp.user_ns:
        shown = name.removeprefix("max_")
        lines.append(f"  {shown:<17} {value:<17} the sandbox's user namespace's limit (a share of yours)")
    for why in lp.refused:
        lines.append(f"  refused: {why}")
    return lines


FLAG_OF = {"memory": "--memory", "pids": "--pids", "cpus": "--cpus", "tmp_size": "--tmp-size"}


def unenforced(plan: LimitsPlan) -> list[str]:
    """A warning for each limit the caller set that this host cannot hold for them
    (``warren plan`` shows the same rows): said at ``run`` and ``create``, not only in
    the plan, so a sandbox is never believed limited when it is not."""
    return [
        f"{FLAG_OF.get(row.name, row.name)} {row.value} is not enforced here: {row.detail}"
        for row in plan.rows
        if row.mechanism == NOT and not row.default
    ]
