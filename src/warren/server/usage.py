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


def measure(pid1: int, groups: list[str], limits: LimitsPlan | None) -> protocol.Stats:
    tasks = [pid1, *procs.descendants(pid1)]
    per = [s for s in (_proc_stat(p) for p in tasks) if s is not None]
    memory = sum(s[2] for s in per)
    pids = sum(s[1] for s in per)
    source = "/proc (resident memory and threads summed over the sandbox's processes)"
    by_kind = {cgroups.kind_of(g): g for g in groups}
    used: list[str] = []
    v2 = by_kind.get(V2)
    with contextlib.suppress(ValueError):
        if "memory" in by_kind:
            memory = int(cgroups.read(by_kind["memory"], "memory.usage_in_bytes"))
            used.append("cgroup1 memory.usage_in_bytes")
        elif v2 is not None and os.path.exists(os.path.join(v2, "memory.current")):
            memory = int(cgroups.read(v2, "memory.current"))
            used.append("cgroup2 memory.current")
        if "pids" in by_kind:
            pids = int(cgroups.read(by_kind["pids"], "pids.current"))
            used.append("cgroup1 pids.current")
        elif v2 is not None and os.path.exists(os.path.join(v2, "pids.current")):
            pids = int(cgroups.read(v2, "pids.current"))
            used.append("cgroup2 pids.current")
    if used:
        source = f"{', '.join(used)}; CPU time from /proc"
    eff = limits.limits if limits is not None else None
    return protocol.Stats(
        memory=memory,
        pids=pids,
        cpu_time=round(sum(s[0] for s in per), 3),
        source=source,
        memory_limit=(eff.memory or None) if eff else None,
        pids_limit=(eff.pids or None) if eff else None,
        cpus_limit=(eff.cpus or None) if eff else None,
    )
