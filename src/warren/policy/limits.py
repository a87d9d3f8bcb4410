"""Resource limits as a user writes them, parsed and checked; and the safe defaults.

Owns the meaning of ``memory``, ``pids``, ``cpus``, ``tmp_size`` and ``idle_timeout``
(flags and ``warren.toml`` keys): sizes like ``512M`` or ``2G``, counts, fractional
CPUs, durations like ``90``, ``30s``, ``10m`` or ``2h``. The
defaults come from the machine's size (``defaults``; ``mem_total`` reads
/proc/meminfo, the only file read here, and ``cpu_count`` asks for the CPUs); how
each limit is enforced on this host is the planner's business (``plan.limits``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from .. import durations, sizes
from ..errors import PolicyError

_UNITS = sizes.UNITS
show_size = sizes.show
MIN_IDLE = 1.0

# Below these a sandbox cannot start a shell: a typo (``--memory 512``), not a choice.
MIN_MEMORY = 32 << 20
MIN_TMP = 1 << 20
MIN_PIDS = 16
MAX_PIDS = 1 << 22
T = TypeVar("T")
NO_LIMIT = 0
_NONE_WORDS = ("none", "unlimited")


def is_none_word(value: object) -> bool:
    return isinstance(value, str) and value.strip().lower() in _NONE_WORDS


@dataclass(frozen=True)
class Limits:
    """Resolved limits; ``None``: not set (the default applies); ``NO_LIMIT`` (0): no
    limit, asked for explicitly (``--memory none``)."""

    memory: int | None = None  # bytes, the whole sandbox
    pids: int | None = None  # processes + threads in the sandbox
    cpus: float | None = None  # CPUs' worth of time per wall-clock second
    tmp_size: int | None = None  # bytes, each of the private /tmp and /dev/shm
    idle_timeout: float | None = None  # seconds without a request before a long-lived sandbox stops


def parse_size(value: object, where: str) -> int:
    """``512M``, ``2G``, ``1.5G``, ``1048576`` (bytes); units are powers of 1024."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise _bad(where, value, "a size such as 512M or 2G")
    text = str(value).strip().upper().removesuffix("IB").removesuffix("B")
    unit = text[-1:] if text[-1:] in _UNITS and text[-1:] else ""
    number = text[: len(text) - len(unit)]
    try:
        amount = float(number)
    except ValueError:
        raise _bad(where, value, "a size such as 512M or 2G") from None
    if not amount > 0 or amount == float("inf"):
        raise _bad(where, value, "a positive size such as 512M or 2G")
    return int(amount * _UNITS[unit])


def parse_count(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise _bad(where, value, "a whole number such as 256")
    try:
        n = int(value)
    except ValueError:
        raise _bad(where, value, "a whole number such as 256") from None
    if not MIN_PIDS <= n <= MAX_PIDS:
        raise _bad(where, value, f"between {MIN_PIDS} and {MAX_PIDS}")
    return n


def parse_cpus(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise _bad(where, value, "a number of CPUs such as 0.5 or 2")
    try:
        n = float(value)
    except ValueError:
        raise _bad(where, value, "a number of CPUs such as 0.5 or 2") from None
    if not 0.01 <= n <= 4096:
        raise _bad(where, value, "a number of CPUs between 0.01 and 4096")
    return n


def parse_duration(value: object, where: str) -> float:
    """``90`` (seconds), ``30s``, ``10m``, ``1.5h``, ``1d``."""
    expected = "a duration such as 90, 30s, 10m or 2h"
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise _bad(where, value, expected)
    text = str(value).strip().lower()
    unit = text[-1:] if text[-1:] in durations.SECONDS and text[-1:] else ""
    try:
        amount = float(text[: len(text) - len(unit)]) * durations.SECONDS[unit]
    except ValueError:
        raise _bad(where, value, expected) from None
    if not MIN_IDLE <= amount < float("inf"):
        raise _bad(where, value, f"{expected}, at least {MIN_IDLE:g} s")
    return amount


def parse(
    memory: object,
    pids: object,
    cpus: object,
    tmp_size: object,
    where: str,
    idle_timeout: object = None,
) -> Limits:
    """Limits from a spec's raw values (``None``: not set); every bad value is a
    ``PolicyError`` naming the key and where it came from."""
    mem = _parsed(memory, parse_size, f"{where}: memory")
    if mem and mem < MIN_MEMORY:
        raise _bad(f"{where}: memory", memory, f"at least {show_size(MIN_MEMORY)}")
    tmp = _parsed(tmp_size, parse_size, f"{where}: tmp_size")
    if tmp and tmp < MIN_TMP:
        raise _bad(f"{where}: tmp_size", tmp_size, f"at least {show_size(MIN_TMP)}")
    return Limits(
        memory=mem,
        pids=_parsed(pids, parse_count, f"{where}: pids"),
        cpus=_parsed(cpus, parse_cpus, f"{where}: cpus"),
        tmp_size=tmp,
        idle_timeout=_parsed(idle_timeout, parse_duration, f"{where}: idle_timeout"),
    )


def _parsed(value: object, parse_value: Callable[[object, str], T], where: str) -> T | int | None:
    """One limit: not set (``None``), no limit (``none``/``unlimited``: ``NO_LIMIT``),
    or ``value`` parsed."""
    if value is None:
        return None
    return NO_LIMIT if is_none_word(value) else parse_value(value, where)


# The default pids limit: PIDS_PER_CPU tasks per CPU, at most one per PIDS_RAM_PER_TASK
# of RAM, within [PIDS_FLOOR, PIDS_CEILING] (see ``defaults``).
PIDS_PER_CPU = 512
PIDS_RAM_PER_TASK = 16 << 20
PIDS_FLOOR = 256
PIDS_CEILING = 32768


def default_pids(mem_total: int, cpus: int) -> int:
    """``clamp(min(512 x CPUs, RAM / 16 MiB), 256, 32768)``: 1024 on 2 CPUs."""
    return max(PIDS_FLOOR, min(PIDS_CEILING, PIDS_PER_CPU * max(1, cpus), mem_total // PIDS_RAM_PER_TASK))


def pids_formula(mem_total: int, cpus: int) -> str:
    """How ``default_pids`` came out for this machine, as ``warren plan`` shows it."""
    by_ram = mem_total // PIDS_RAM_PER_TASK
    return (
        f"min({PIDS_PER_CPU} x {cpus} CPUs = {PIDS_PER_CPU * max(1, cpus)}, "
        f"RAM/16M = {by_ram}) within [{PIDS_FLOOR}, {PIDS_CEILING}]"
    )


def defaults(mem_total: int, cpus: int | None = None) -> Limits:
    """What a sandbox gets with no flags, sized to keep the host answering:

    - memory: half of RAM. The other half stays for the host and other sandboxes,
      so the host's own OOM killer never has to pick among its services.
    - pids: ``clamp(min(512 x CPUs, RAM / 16 MiB), 256, 32768)`` processes + threads
      (``default_pids``). A fork bomb's cost to the host is CPU time and kernel memory
      per task: what the host can bear grows with its CPUs (each runnable task takes
      a share of them, and the host's own commands wait behind) and with its RAM (a
      task's kernel stack, page tables and the smallest process footprint: 16 MiB
      each leaves room). 1024 on a 2-CPU machine, where a fork bomb at that limit
      still lets the host start `/bin/true` in milliseconds (bench/bench_limits.py);
      8192 on 16 CPUs with 128 GiB. `make -j`, cargo and test runners with thread
      pools fit: they use a few tasks per CPU.
    - tmp_size: an eighth of RAM each for /tmp and /dev/shm (tmpfs lives in RAM;
      the kernel's default of half of RAM each could take it all).
    - cpus: none. CPU time is shared fairly by the scheduler; a hog slows the host
      but cannot take it down.
    - idle_timeout: none. A long-lived sandbox lives until it is stopped, as it did
      before the option existed; an idle one costs a few MiB.

    ``cpus``: the machine's CPU count (``cpu_count``) unless given (tests plan for
    other machines).
    """
    n = cpu_count() if cpus is None else cpus
    return Limits(
        memory=max(MIN_MEMORY, mem_total // 2),
        pids=default_pids(mem_total, n),
        cpus=None,
        tmp_size=max(MIN_TMP, mem_total // 8),
    )


def cpu_count() -> int:
    """The machine's CPUs (online), the other fact the defaults scale with."""
    return os.cpu_count() or 1


def mem_total() -> int:
    """MemTotal of /proc/meminfo in bytes (the one fact the defaults need)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 4 << 30


def lowered(current: Limits, ceiling: Limits) -> Limits:
    """Each limit of ``current`` no higher than the same one of ``ceiling`` (a
    workspace file may only lower limits)."""

    def low(a: float | None, b: float | None) -> float | None:
        if a is None or b is None:
            return b if a is None else a
        # NO_LIMIT is the highest of all: a ceiling of none keeps ``a``, and ``a`` of
        # none under a ceiling is the ceiling.
        return b if a == NO_LIMIT else a if b == NO_LIMIT else min(a, b)

    return Limits(
        memory=_int(low(current.memory, ceiling.memory)),
        pids=_int(low(current.pids, ceiling.pids)),
        cpus=low(current.cpus, ceiling.cpus),
        tmp_size=_int(low(current.tmp_size, ceiling.tmp_size)),
        idle_timeout=low(current.idle_timeout, ceiling.idle_timeout),
    )


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _bad(where: str, value: object, expected: str) -> PolicyError:
    return PolicyError(
        f"{where}: {value!r} is not {expected}",
        operation="policy",
        hint="sizes take K, M, G or T (powers of 1024), e.g. --memory 512M --tmp-size 1G; "
        "--pids takes a count, --cpus a number such as 0.5, --idle-timeout a duration such as 10m; "
        "none (or unlimited) for no limit",
    )
