"""The pages a helper writes on a request's path, copied before the request comes.

A spare helper is a fork of PID 1 and shares its memory copy-on-write. On an exec's
path it wrote to about 150 of those pages (Python writes reference counts on every
object it touches, and allocates in PID 1's arenas), each first write a page fault and
a copy (about 4 us each on this 2-core VM): some 0.6 ms, most of it after a short
command's end, before its answer. Which pages those are changes little from one request
to the next (the same code, in copies of the same PID 1), so:

- a helper that has answered (off the path) records which pages of its private
  writable mappings have become its own (``/proc/self/pagemap``: present, mapped by it
  alone) since it began to wait, added to what is recorded already, in a page PID 1
  shares with every helper it forks (``Record``: an anonymous shared mapping made
  before the first); the first helpers, then one in ``RECORD_EVERY`` (reading the
  pagemap is a millisecond or two, before the wait and after the answer);
- a spare, once ready and before it waits, has those pages copied
  (``MADV_POPULATE_WRITE``: as if written, the contents unchanged), only where they
  fall in its own private writable mappings, and ``MAX_PAGES`` at most.

About 55 faults are left on the path (allocations that land elsewhere each time). The
cost is memory while a spare waits: the pages it would copy anyway once used, about
0.3 MiB, ``MAX_PAGES`` at most. ``WARREN_PREFAULT=0`` in the supervisor's environment
turns it off (the benchmarks' baseline). Only an optimization: a kernel without the
advice (before 5.14: ``enabled``), a pagemap that cannot be read, or a record torn by
two helpers writing at once (each run is checked against PID 1's own mappings, which are
the spare's at its fork, and the advice never changes a page's contents) cost the faults
on the path, nothing else.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from array import array
from dataclasses import dataclass

from . import _sys

PAGE = mmap.PAGESIZE
MAX_PAGES = 512  # 2 MiB with 4 KiB pages: what one spare may copy ahead, at most
MAX_RANGES = 254
RECORD_EVERY = 16  # a helper in so many records (the first always)
_HEAD = struct.Struct("=QQ")  # sequence (odd while written), runs
_RANGE = struct.Struct("=QQ")  # first address, pages
SIZE = _HEAD.size + MAX_RANGES * _RANGE.size
_PRESENT = 1 << 63
_EXCLUSIVE = 1 << 56


def private_writable() -> list[tuple[int, int]]:
    """This process's private writable mappings, (start, end), but its stack and the
    kernel's own pages."""
    out = []
    with open("/proc/self/maps", "rb") as f:
        for line in f:
            fields = line.split()
            if fields[1] != b"rw-p" or (len(fields) > 5 and fields[5].startswith((b"[stack", b"[v"))):
                continue
            start, _, end = fields[0].partition(b"-")
            out.append((int(start, 16), int(end, 16)))
    return out


def own_pages(mappings: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Of ``mappings``, the runs of pages present and mapped by this process alone, as
    (first address, pages)."""
    runs: list[tuple[int, int]] = []
    fd = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    try:
        for start, end in mappings:
            entries = array("Q")
            entries.frombytes(os.pread(fd, (end - start) // PAGE * 8, start // PAGE * 8))
            want = _PRESENT | _EXCLUSIVE
            first = -1
            for i, entry in enumerate(entries):
                if entry & want == want:
                    if first < 0:
                        first = i
                elif first >= 0:
                    runs.append((start + first * PAGE, i - first))
                    first = -1
            if first >= 0:
                runs.append((start + first * PAGE, len(entries) - first))
    finally:
        os.close(fd)
    return runs


def within(runs: list[tuple[int, int]], mappings: list[tuple[int, int]], limit: int) -> list[tuple[int, int]]:
    """The parts of ``runs`` (first address, pages; in address order) inside
    ``mappings`` (in address order, apart), at most ``limit`` pages in all."""
    out: list[tuple[int, int]] = []
    left, m = limit, 0
    for address, pages in runs:
        end = address + pages * PAGE
        while m < len(mappings) and mappings[m][1] <= address:
            m += 1
        k = m
        while k < len(mappings) and mappings[k][0] < end and left > 0:
            lo, hi = max(address, mappings[k][0]), min(end, mappings[k][1])
            n = min((hi - lo) // PAGE, left)
            out.append((lo, n))
            left -= n
            k += 1
    return out


def merged(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Two sets of runs as one, in address order, overlapping and adjacent runs joined."""
    out: list[tuple[int, int]] = []
    for address, pages in sorted([*a, *b]):
        if out and address <= out[-1][0] + out[-1][1] * PAGE:
            last, n = out[-1]
            out[-1] = (last, max(n, (address - last) // PAGE + pages))
        else:
            out.append((address, pages))
    return out


def enabled() -> bool:
    """In PID 1 once it is not dumpable, as its helpers are: unless turned off
    (``WARREN_PREFAULT=0``), where the kernel knows the advice (Linux 5.14: an empty
    range takes it without looking at any page) and such a process may read its own
    pagemap. Only root may: the /proc files of a process that is not dumpable are the
    host's root's, and a helper as another user has no way to learn its pages (PID 1's
    pagemap would not tell them: its pages are shared with the process it was forked
    from, and with every other sandbox's PID 1)."""
    if os.environ.get("WARREN_PREFAULT", "1") == "0":
        return False
    try:
        _sys.madvise(0, 0, _sys.MADV_POPULATE_WRITE)
        os.close(os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC))
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class Ahead:
    """What PID 1 gives a spare it forks: the runs to copy (within its own private
    writable mappings, which the spare's are at the fork), and whether this helper
    records what its request writes. Planned in PID 1, so that the spare's own Python
    work (itself copying pages) is the copying alone."""

    runs: tuple[tuple[int, int], ...]
    records: bool


class Record:
    """The shared page: made by PID 1 before it forks its first helper."""

    def __init__(self) -> None:
        self.view = mmap.mmap(-1, SIZE)  # MAP_SHARED | MAP_ANONYMOUS: every later fork shares it
        self.forks = 0  # PID 1's count of spares given an ``Ahead``

    def ahead(self) -> Ahead:
        """In PID 1, before it forks a spare: what that spare copies, and whether it
        records (while nothing is recorded, then one spare in ``RECORD_EVERY``)."""
        recorded = self.read()
        records = not recorded or self.forks % RECORD_EVERY == 0
        self.forks += 1
        runs: list[tuple[int, int]] = []
        if recorded:
            with contextlib.suppress(OSError, ValueError):
                runs = within(sorted(recorded), private_writable(), MAX_PAGES)
        return Ahead(tuple(runs), records)

    def write(self, runs: list[tuple[int, int]]) -> None:
        runs = runs[:MAX_RANGES]
        seq, _count = _HEAD.unpack_from(self.view, 0)
        _HEAD.pack_into(self.view, 0, seq + 1, 0)
        for i, run in enumerate(runs):
            _RANGE.pack_into(self.view, _HEAD.size + i * _RANGE.size, *run)
        _HEAD.pack_into(self.view, 0, seq + 2, len(runs))

    def read(self) -> list[tuple[int, int]]:
        """The runs last recorded; none while one is being written."""
        seq, count = _HEAD.unpack_from(self.view, 0)
        if seq % 2 or count > MAX_RANGES:
            return []
        runs = [_RANGE.unpack_from(self.view, _HEAD.size + i * _RANGE.size) for i in range(count)]
        return runs if _HEAD.unpack_from(self.view, 0)[0] == seq else []


def ready(ahead: Ahead | None) -> frozenset[int] | None:
    """In a spare before it waits: ``ahead``'s pages copied (``populate``); and, when
    it records, the pages it has as its own now, which ``record`` leaves out (written
    before its request: not the path's)."""
    if ahead is None:
        return None
    populate(ahead.runs)
    if not ahead.records:
        return None
    with contextlib.suppress(OSError, ValueError):
        return pages_of(own_pages(private_writable()))
    return None


def record(shared: Record | None, before: frozenset[int] | None) -> None:
    """In a helper that has answered, if it took ``before`` (``ready``): the pages it
    made its own since, added to the record."""
    if shared is None or before is None:
        return
    with contextlib.suppress(OSError, ValueError):
        since = pages_of(own_pages(private_writable())) - before
        shared.write(merged(shared.read(), runs_of(since)))


def pages_of(runs: list[tuple[int, int]]) -> frozenset[int]:
    return frozenset(address + i * PAGE for address, pages in runs for i in range(pages))


def runs_of(pages: frozenset[int]) -> list[tuple[int, int]]:
    """Page addresses as runs (first address, pages), in address order."""
    runs: list[tuple[int, int]] = []
    for address in sorted(pages):
        if runs and runs[-1][0] + runs[-1][1] * PAGE == address:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((address, 1))
    return runs


def populate(runs: tuple[tuple[int, int], ...] | list[tuple[int, int]]) -> int:
    """These runs of this process's pages copied now, their contents unchanged. How
    many pages."""
    done = 0
    for address, pages in runs:
        try:
            _sys.madvise(address, pages * PAGE, _sys.MADV_POPULATE_WRITE)
        except OSError:
            continue  # not mapped (ENOMEM), not writable (EINVAL), would fault (EFAULT)
        done += pages
    return done
