"""A spare helper copies ahead the pages a helper wrote on a request's path (``_core.prefault``).

What must hold, as root and as uid 1001:

- a process forked from another sees as its own (pagemap: present, mapped by it alone)
  exactly the shared pages it wrote, not those it only read;
- a spare given a helper's record has those pages copied before it waits, their
  contents unchanged, and its parent's copy untouched;
- a record torn, foreign or stale (addresses unmapped, read-only, the kernel's) costs
  nothing: no crash, no page outside the process's private writable mappings;
- the record keeps what earlier helpers wrote (runs merged), is written by the first
  helper and then by one in ``RECORD_EVERY``;
- it is on where a process that is not dumpable (PID 1, a helper) may read its own
  pagemap, which only root may: as another user it is off, and costs nothing;
- in a real long-lived sandbox as root, a helper takes fewer page faults on an exec's
  path (its fault count, read from the host, beside a supervisor told
  ``WARREN_PREFAULT=0``); execs run as before either way.

How much it saves is a benchmark's (``bench/bench_pace.py --exec``), not a test's.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
import time
from pathlib import Path

import pytest

from conftest import Layout, shut_down_supervisor
from warren import PolicySpec, Result, Sandbox
from warren._core import _sys, harden, prefault
from warren._core.procs import table

PAGE = prefault.PAGE


def _buffer(pages: int, fill: int = 0x5A) -> tuple[mmap.mmap, int]:
    """A private anonymous mapping of ``pages`` pages, every page written (present)."""
    view = mmap.mmap(-1, pages * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view.write(bytes([fill]) * (pages * PAGE))
    address = ctypes.addressof(ctypes.c_char.from_buffer(view))
    return view, address


def _in_child(work: object) -> str:
    """``work()``'s string, from a forked child (the parent keeps its pages shared)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            out = str(work())  # type: ignore[operator]
        except BaseException as e:  # report it: the parent asserts
            out = f"error {e!r}"
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, data
    return data.decode()


def _own_in(address: int, pages: int) -> list[int]:
    """Which pages of the buffer at ``address`` this process has as its own."""
    runs = prefault.own_pages([(address, address + pages * PAGE)])
    return [(a - address) // PAGE + i for a, n in runs for i in range(n)]


def test_pages_written_after_a_fork_are_the_writers_own_and_only_those() -> None:
    view, address = _buffer(16)

    def child() -> str:
        before = _own_in(address, 16)
        for page in (3, 4, 5, 10):
            view[page * PAGE] = 0x11
        view[7 * PAGE : 7 * PAGE + 10]  # read only: stays shared
        return f"{before}|{_own_in(address, 16)}"

    before, after = _in_child(child).split("|")
    assert before == "[]" and after == str([3, 4, 5, 10]), (before, after)
    assert view[3 * PAGE] == 0x5A, "the child's write reached the parent"


def test_a_spare_copies_the_recorded_pages_before_it_waits_without_changing_them() -> None:
    view, address = _buffer(32)
    record = prefault.Record()  # this process plays PID 1
    first = record.ahead()
    assert first.runs == () and first.records, first  # nothing recorded: it records

    def helper() -> int:
        before = prefault.ready(first)
        for page in (2, 3, 17, 30):
            view[page * PAGE + 1] = 0x22
        prefault.record(record, before)
        return len([run for run in record.read() if address <= run[0] < address + 32 * PAGE])

    assert int(_in_child(helper)) == 3  # runs 2-3, 17, 30 of the buffer
    ahead = record.ahead()

    def spare() -> str:
        before = _own_in(address, 32)
        prefault.ready(ahead)
        after = _own_in(address, 32)
        same = view[:] == bytes([0x5A]) * (32 * PAGE)
        return f"{before}|{after}|{same}"

    before, after, same = _in_child(spare).split("|")
    assert before == "[]", before
    assert after == str([2, 3, 17, 30]) and same == "True", (after, same)
    assert view[:] == bytes([0x5A]) * (32 * PAGE), "a child's write reached the parent"


def test_a_torn_or_foreign_record_copies_nothing_outside_private_writable_memory() -> None:
    record = prefault.Record()
    with open("/proc/self/maps") as maps:  # this interpreter's code: mapped, not writable
        text = next(int(line.split("-")[0], 16) for line in maps if " r-xp " in line)
    view, address = _buffer(4)
    # Out of order, as a torn record may be: nothing mapped, code, the kernel's half.
    record.write([(0x1000, 4), (address, 4), (text, 2), (0xFFFF800000000000, 8)])
    assert record.ahead().runs == ((address, 4),)

    def spare() -> str:
        done = prefault.populate(record.ahead().runs)
        return f"{done} {_own_in(address, 4)} {view[:] == bytes([0x5A]) * (4 * PAGE)}"

    assert _in_child(spare) == "4 [0, 1, 2, 3] True"
    # A run far past its mapping is cut to what is private and writable, and capped.
    record.write([(address, 1 << 20)])
    done, own = _in_child(spare).split(" ", 1)
    assert 4 <= int(done) <= prefault.MAX_PAGES and own == "[0, 1, 2, 3] True", (done, own)
    # Given straight to the kernel, runs it would not copy are passed over.
    assert _in_child(lambda: prefault.populate([(0x1000, 4), (text, 2), (address, 1)])) == "1"
    # A record being written (odd sequence) reads as none.
    prefault._HEAD.pack_into(record.view, 0, 7, 3)
    assert record.read() == [] and record.ahead().runs == ()
    assert prefault.ready(None) is None


def test_within_cuts_runs_to_the_mappings_and_the_limit() -> None:
    p = PAGE
    mappings = [(10 * p, 20 * p), (30 * p, 40 * p)]
    assert prefault.within([(0, 5)], mappings, 100) == []
    assert prefault.within([(8 * p, 5)], mappings, 100) == [(10 * p, 3)]
    assert prefault.within([(18 * p, 20)], mappings, 100) == [(18 * p, 2), (30 * p, 8)]
    assert prefault.within([(12 * p, 4), (32 * p, 4)], mappings, 6) == [(12 * p, 4), (32 * p, 2)]
    assert prefault.within([(45 * p, 1)], mappings, 100) == []


def test_records_keep_what_earlier_helpers_wrote() -> None:
    p = PAGE
    assert prefault.runs_of(frozenset({3 * p, 1 * p, 2 * p, 7 * p})) == [(1 * p, 3), (7 * p, 1)]
    assert prefault.pages_of([(1 * p, 3), (7 * p, 1)]) == frozenset({1 * p, 2 * p, 3 * p, 7 * p})
    assert prefault.merged([(10 * p, 2)], [(11 * p, 3), (20 * p, 1)]) == [(10 * p, 4), (20 * p, 1)]
    assert prefault.merged([(10 * p, 2)], [(12 * p, 1)]) == [(10 * p, 3)]
    assert prefault.merged([], [(5 * p, 1), (1 * p, 1)]) == [(1 * p, 1), (5 * p, 1)]


def test_spares_record_while_nothing_is_recorded_then_one_in_record_every() -> None:
    record = prefault.Record()
    assert record.ahead().records and record.ahead().records  # nothing recorded yet
    record.write([(PAGE, 1)])
    turns = [record.ahead().records for _ in range(2 * prefault.RECORD_EVERY)]
    assert turns.count(True) == 2, turns


def _spare_of(pid1: int) -> int:
    """The spare helper of a sandbox's PID 1 once it waits (SCHED_BATCH: after its
    pages were copied), from the host."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for pid, ppid, _state in table():
            if ppid == pid1 and _stat(pid)[38] == "3":
                return pid
        time.sleep(0.02)
    raise AssertionError("no spare helper waits")


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command's name (field 3 is index 0)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return ["?"] * 50


def _path_faults(workspace: Path) -> list[int]:
    """In a long-lived sandbox under a supervisor of its own: for a few execs, the page
    faults its helper took from its wait (a spare: read from the host) to a moment into
    its command (``sleep``: the helper follows it, so still there to be read)."""
    sb = Sandbox.create(PolicySpec(workspace=str(workspace)))
    out = []
    try:
        for i in range(5):
            time.sleep(0.6)  # apart: not a burst, whose spare is forked beside its request
            spare = _spare_of(sb.pid1)
            waiting = int(_stat(spare)[7])  # minflt: readable of a process not dumpable
            done: list[Result] = []
            runner = threading.Thread(target=lambda out=done: out.append(sb.exec(["sleep", "0.6"])))
            runner.start()
            time.sleep(0.3)
            serving = int(_stat(spare)[7])
            runner.join()
            assert done and done[0].exit_code == 0, done
            # The first two spares were forked before any helper recorded: the create's,
            # and the one forked beside the first ``sleep`` (``pid1.SPARE_BESIDE_MS``)
            # before its helper, recording once answered, had ended.
            if i >= 2:
                out.append(serving - waiting)
    finally:
        sb.remove()
        shut_down_supervisor()
    return out


def test_on_only_where_a_process_that_is_not_dumpable_reads_its_own_pagemap() -> None:
    def helper() -> bool:
        _sys.prctl(harden.PR_SET_DUMPABLE, 0)
        return prefault.enabled()

    assert _in_child(helper) == str(os.getuid() == 0)


@pytest.mark.skipif(
    os.getuid() != 0,
    reason="as another user than root a helper cannot read its own pagemap (it is not dumpable): "
    "the copy ahead is off, which the test above shows",
)
def test_a_live_sandboxs_helpers_take_fewer_faults_on_the_path(
    layout: Layout, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "off"))
    monkeypatch.setenv("WARREN_PREFAULT", "0")
    off = _path_faults(layout.workspace)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "on"))
    monkeypatch.delenv("WARREN_PREFAULT")
    on = _path_faults(layout.workspace)
    # About 120 without and 50 with, on this machine: what the spares copied ahead.
    assert max(on) < min(off) - 30, (on, off)
