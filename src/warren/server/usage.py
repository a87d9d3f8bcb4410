"""A live sandbox's use of memory, tasks and CPU time, against its limits (``warren stats``).

From the sandbox's own cgroups where it has them (the numbers the limits are enforced
on), else summed over the sandbox's processes in /proc (resident memory, threads,
CPU time). Reads only; the supervisor answers with it.
"""

from __future__ import annotations

import contextlib
import os

from .. import protocol
from .._core import cgroups, procs
from ..plan.limits import V2, LimitsPlan

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _proc_stat(pid: int) -> tuple[float, int, int] | None:
    """(CPU seconds incl. reaped children, threads, resident bytes) of one process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/statm") as f:
            rss = int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None
    # fields[0] is the state (field 3): utime..cstime are fields 14-17, threads 20.
    ticks = sum(int(x) for x in fields[11:15])
    return ticks / _TICK, int(fields[17]), rss


def _counter(by_kind: dict[str, str], controller: str, v1_file: str, v2_file: str) -> tuple[int, str] | None:
    """A controller's current count from the sandbox's cgroup1 or cgroup2 group, and
    which file it came from; None where it has neither."""
    v2 = by_kind.get(V2)
    with contextlib.suppress(ValueError):
        if controller in by_kind:
            return int(cgroups.read(by_kind[controller], v1_file)), f"cgroup1 {v1_file}"
        if v2 is not None and os.path.exists(os.path.join(v2, v2_file)):
            return int(cgroups.read(v2, v2_file)), f"cgroup2 {v2_file}"
    return None


def cpu_of(pid: int) -> float:
    """A process's CPU seconds, its reaped children's included (0.0 once it is gone)."""
    got = _proc_stat(pid)
    return got[0] if got is not None else 0.0


def measure(
    roots: list[int], groups: list[str], limits: LimitsPlan | None, cpu_before: float = 0.0
) -> protocol.Stats:
    """``roots``: the sandbox's processes whose trees are all of it (``Box.process_roots``);
    ``cpu_before``: the CPU time of keepers joined from outside that left, which their
    parent's reaping (the spawner's) took out of the sandbox's trees."""
    tasks = [p for root in roots for p in (root, *procs.descendants(root))]
    per = [s for s in (_proc_stat(p) for p in tasks) if s is not None]
    memory = sum(s[2] for s in per)
    pids = sum(s[1] for s in per)
    source = "/proc (resident memory and threads summed over the sandbox's processes)"
    by_kind = {cgroups.kind_of(g): g for g in groups}
    used: list[str] = []
    if got := _counter(by_kind, "memory", "memory.usage_in_bytes", "memory.current"):
        memory = got[0]
        used.append(got[1])
    if got := _counter(by_kind, "pids", "pids.current", "pids.current"):
        pids = got[0]
        used.append(got[1])
    if used:
        source = f"{', '.join(used)}; CPU time from /proc"
    eff = limits.limits if limits is not None else None
    return protocol.Stats(
        memory=memory,
        pids=pids,
        cpu_time=round(sum(s[0] for s in per) + cpu_before, 3),
        source=source,
        memory_limit=(eff.memory or None) if eff else None,
        pids_limit=(eff.pids or None) if eff else None,
        cpus_limit=(eff.cpus or None) if eff else None,
    )
