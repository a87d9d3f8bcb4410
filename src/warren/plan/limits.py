"""How each resource limit is enforced on this host for this caller: a pure decision.

Inputs: the policy's limits (unset ones take ``policy.limits.defaults``), the cgroup
hierarchies this caller could write (``CgroupFacts``, probed by ``_core.cgroups``),
the machine's RAM. Output: a ``LimitsPlan`` — one row per limit saying how it is
enforced (``cgroup1``, ``rlimit (...)``, ``tmpfs size=``, or ``not enforceable
here: why``), the cgroup files to write and the rlimits to set. The best mechanism
wins; nothing is dropped silently. Executed by ``_core.cgroups`` and ``_core.shim``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..policy.limits import NO_LIMIT, Limits, defaults, show_size

CGROUP1 = "cgroup1"
NPROC = "rlimit (RLIMIT_NPROC in the sandbox's own user namespace: counts the whole sandbox)"
DATA = "rlimit (per process: RLIMIT_DATA)"
TMPFS = "tmpfs size="
NOT = "not enforceable here"
CFS_PERIOD_US = 100_000


@dataclass(frozen=True)
class Hierarchy:
    """A cgroup v1 controller as this caller finds it."""

    controller: str  # "pids", "memory", "cpu", "freezer"
    parent: str  # the caller's own cgroup in it: sandboxes' cgroups go beneath
    writable: bool


@dataclass(frozen=True)
class CgroupFacts:
    uid: int
    v1: tuple[Hierarchy, ...] = ()
    # cgroup2: the caller's own cgroup and the controllers enabled for its children
    # (empty: no delegated subtree to use).
    v2_path: str | None = None
    v2_controllers: tuple[str, ...] = ()
    v2_writable: bool = False

    def writable(self, controller: str) -> Hierarchy | None:
        for h in self.v1:
            if h.controller == controller and h.writable:
                return h
        return None

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
        elif controller not in self.v2_controllers or not self.v2_writable:
            parts.append(f"no delegated cgroup2 subtree with {controller} (at {self.v2_path})")
        else:
            parts.append(f"cgroup2 at {self.v2_path} offers {controller}; warren does not use cgroup2 yet")
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
    controller: str
    parent: str  # the sandbox's cgroup is made beneath, named at launch
    files: tuple[tuple[str, str], ...]  # (file, value), written in order


@dataclass(frozen=True)
class LimitsPlan:
    limits: Limits  # the effective values
    rows: tuple[LimitRow, ...] = ()
    cgroups: tuple[CgroupPlan, ...] = ()
    rlimits: tuple[tuple[str, int], ...] = ()  # ("RLIMIT_NPROC", n): set on each command before execve

    def row(self, name: str) -> LimitRow:
        return next(r for r in self.rows if r.name == name)


# PID 1, its spare helper, each command's helper, the git broker: tasks of the sandbox that
# are warren's, added to the pids limit so the user's number is the commands' own.
OVERHEAD_TASKS = 8


def plan(given: Limits, facts: CgroupFacts, mem_total: int) -> LimitsPlan:
    base = defaults(mem_total)
    eff = Limits(
        memory=given.memory if given.memory is not None else base.memory,
        pids=given.pids if given.pids is not None else base.pids,
        cpus=given.cpus if given.cpus is not None else base.cpus,
        tmp_size=given.tmp_size if given.tmp_size is not None else base.tmp_size,
    )
    rows: list[LimitRow] = []
    groups: list[CgroupPlan] = []
    rlimits: list[tuple[str, int]] = []

    for name in ("memory", "pids", "tmp_size"):
        if getattr(eff, name) == NO_LIMIT:
            rows.append(LimitRow(name, "none", False, "none", "no limit, as asked"))
    if eff.memory:
        shown = show_size(eff.memory)
        h = facts.writable("memory")
        if h is not None:
            files = [("memory.limit_in_bytes", str(eff.memory))]
            groups.append(CgroupPlan("memory", h.parent, tuple(files)))
            rows.append(
                LimitRow(
                    "memory", shown, given.memory is None, CGROUP1, "memory.limit_in_bytes, all processes"
                )
            )
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
        h = facts.writable("pids")
        if h is not None:
            groups.append(CgroupPlan("pids", h.parent, (("pids.max", str(eff.pids + OVERHEAD_TASKS)),)))
            rows.append(LimitRow("pids", str(eff.pids), given.pids is None, CGROUP1, "pids.max"))
        else:
            rlimits.append(("RLIMIT_NPROC", eff.pids + OVERHEAD_TASKS))
            rows.append(LimitRow("pids", str(eff.pids), given.pids is None, NPROC, facts.why_not("pids")))
    if eff.cpus:
        h = facts.writable("cpu")
        if h is not None:
            quota = max(1000, round(eff.cpus * CFS_PERIOD_US))
            groups.append(
                CgroupPlan(
                    "cpu",
                    h.parent,
                    (("cpu.cfs_period_us", str(CFS_PERIOD_US)), ("cpu.cfs_quota_us", str(quota))),
                )
            )
            rows.append(
                LimitRow("cpus", f"{eff.cpus:g}", False, CGROUP1, f"cpu.cfs_quota_us {quota} per 100 ms")
            )
        else:
            rows.append(LimitRow("cpus", f"{eff.cpus:g}", False, NOT, facts.why_not("cpu")))
    else:
        h = facts.writable("cpu")
        if h is not None:
            # No quota, but one scheduling group: a sandbox of many busy processes gets
            # one fair share, not one per process.
            groups.append(CgroupPlan("cpu", h.parent, ()))
        rows.append(
            LimitRow(
                "cpus",
                "none",
                True,
                "none",
                "one fair share as a cgroup1 cpu group" if h else "shared fairly by the scheduler",
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
    return LimitsPlan(eff, tuple(rows), tuple(groups), tuple(rlimits))


def render(lp: LimitsPlan) -> list[str]:
    lines = ["limits"]
    for r in lp.rows:
        how = r.mechanism if r.mechanism != NOT else f"{NOT}: {r.detail}"
        extra = f"  ({r.detail})" if r.detail and r.mechanism != NOT else ""
        lines.append(f"  {r.name:<9} {r.value:<7}{' (default)' if r.default else '':<10} {how}{extra}")
    return lines
