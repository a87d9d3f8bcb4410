"""The network log's budget and the network helper's accounting: a sandbox that floods
the proxy with refused requests grows neither the log past its budget nor a process
outside its own cgroups, keeps working, and the log still says what was refused.

The writer's rotation and summaries are judged on small budgets and a short window
(as the helper writes them); the flood itself, end to end, on a long-lived sandbox's
``net.jsonl`` read on the host.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import loopback_http
from warren.client.sandbox import Sandbox
from warren.net import log as netlog
from warren.net.allowlist import NetEvent
from warren.policy import PolicySpec, build


def _event(i: int, allowed: bool, host: str = "denied.test") -> NetEvent:
    reason = "on the allowlist" if allowed else f"{host}:80 is not on the allowlist"
    return NetEvent("t", "sb", "GET", host, 80, allowed, reason + " " + "x" * 100 if allowed else reason)


def test_the_log_file_rotates_within_its_budget_and_keeps_the_newest(tmp_path: Path) -> None:
    path = tmp_path / "net.jsonl"
    writer = netlog.Writer(path, budget=64 * 1024)
    for i in range(5000):  # about 1 MiB of allowed events: never rate-limited
        writer(NetEvent(f"{i}", "sb", "GET", "allowed.test", 80, True, "on the allowlist " + "x" * 150))
    sizes = [p.stat().st_size for p in (path, netlog.older(path))]
    assert all(s <= 64 * 1024 for s in sizes) and sum(sizes) > 64 * 1024, sizes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["net.jsonl", "net.jsonl.1"]
    events = netlog.read(path)
    assert events[-1].time == "4999" and [int(e.time) for e in events] == sorted(int(e.time) for e in events)
    # control: without a budget the same events take all of it
    whole = tmp_path / "whole" / "net.jsonl"
    unbounded = netlog.Writer(whole, budget=1 << 40)
    for i in range(5000):
        unbounded(NetEvent(f"{i}", "sb", "GET", "allowed.test", 80, True, "on the allowlist " + "x" * 150))
    assert whole.stat().st_size > 10 * sum(sizes) // 2


def _wait(what: str, check: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_repeated_refusals_are_counted_and_summed_up_when_the_window_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(netlog, "WINDOW", 0.5)
    path = tmp_path / "net.jsonl"
    # the window's clock stands still while the events come (however slow the machine);
    # the summary's timer waits in real time
    writer = netlog.Writer(path, clock=lambda: 1000.0)
    for _ in range(3000):
        writer(_event(0, False))
    for i in range(200):  # many targets: each logged once until TARGETS are known, then counted
        writer(_event(i, False, f"h{i}.test"))
    writer(_event(0, True, "allowed.test"))  # an allowed request is always logged
    first = netlog.read(path)
    logged = min(netlog.PER_WINDOW, netlog.PER_TARGET + netlog.TARGETS - 1)
    assert len(first) == logged + 1, len(first)
    assert sum(e.host == "denied.test" for e in first) == netlog.PER_TARGET
    assert first[-1].allowed

    def summed(summary: list[NetEvent]) -> int:
        counted = sum(
            int(e.reason.split("and ")[1].split(" ")[0].replace(",", "")) for e in summary if e.host != "*"
        )
        other = [e for e in summary if e.host == "*"]
        return counted + (int(other[0].reason.split(" ")[0].replace(",", "")) if other else 0)

    def summary_now() -> list[NetEvent]:
        return [e for e in netlog.read(path) if "more refusals" in e.reason]

    # The summary's lines are written one after another by its timer: wait for them all
    # (a count short of the whole times out here; one over fails below).
    _wait("the whole summary", lambda: summed(summary_now()) >= 3000 + 200 - logged)
    summary = summary_now()
    denied = next(e for e in summary if e.host == "denied.test")
    assert f"and {3000 - netlog.PER_TARGET:,} more refusals of this in 0.5 s" in denied.reason
    assert "is not on the allowlist" in denied.reason  # still says what was refused
    assert summed(summary) == 3000 + 200 - logged  # none lost, none twice
    assert len(summary) <= netlog.TARGETS + 1
    # the next window logs one by one again
    writer(_event(0, False))
    assert netlog.read(path)[-1].reason == _event(0, False).reason
    # a helper that ends logs what it counted at once
    for _ in range(10):
        writer(_event(0, False))
    writer.close()
    assert "and 6 more refusals of this" in netlog.read(path)[-1].reason  # 11, 5 of them logged


# --- end to end --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    with loopback_http() as (port, _asked):
        yield port


FLOOD = r"""
import socket, time
start, n = time.monotonic(), 0
while n < {N}:
    s = socket.create_connection(("127.0.0.1", 3128))
    s.sendall(b"GET http://denied.test/x HTTP/1.1\r\nHost: denied.test\r\n\r\n")
    ok = s.recv(64).startswith(b"HTTP/1.1 403")
    s.close()
    n += ok
    if not ok:
        break
print("REFUSED", n, round(time.monotonic() - start, 2))
"""


def _netd_pids(state: Path) -> tuple[list[int], list[int]]:
    """The processes in the sandbox's cgroups (read from warren's records on the host):
    those in this (the host's) network namespace, and the others (the sandbox's)."""
    where = state / "warren" / "cgroups"
    records = list(where.iterdir()) if where.is_dir() else []
    if not records:
        return [], []
    assert len(records) == 1, records
    dirs = [d for d in records[0].read_text().split() if os.path.isdir(d)]
    pids = {int(p) for d in dirs for p in Path(d, "cgroup.procs").read_text().split()}
    ours = os.readlink("/proc/self/ns/net")
    host, inside = [], []
    for pid in sorted(pids):
        try:
            (host if os.readlink(f"/proc/{pid}/ns/net") == ours else inside).append(pid)
        except PermissionError:
            # Not dumpable (PID 1, an exec stub): the sandbox's own; warren's helpers are
            # the caller's plain processes, readable by it.
            inside.append(pid)
        except OSError:
            pass  # gone meanwhile
    return host, inside


def _spec(tmp_path: Path, server: int) -> PolicySpec:
    ws = tmp_path / "ws"
    ws.mkdir()
    return PolicySpec(
        workspace=str(ws),
        network="allow",
        allow_hosts=[f"allowed.test:{server}", f"127.0.0.2:{server}"],
        resolve={"allowed.test": "127.0.0.2"},
    )


def test_a_flood_of_refusals_keeps_the_log_small_and_the_sandbox_working(
    tmp_path: Path, state_home: Path, server: int
) -> None:
    with Sandbox.create(build(_spec(tmp_path, server)), name="flood") as sb:
        r = sb.exec(["python3", "-c", FLOOD.format(N=3000)], timeout=120)
        assert r.ok and r.stdout.decode().startswith("REFUSED 3000 "), (r.stdout, r.stderr)
        # the sandbox keeps working, and so does its proxy
        r = sb.exec(["curl", "-sS", "--max-time", "10", f"http://allowed.test:{server}/after"])
        assert r.stdout == b"ok\n", r.stderr
        log = state_home / "warren" / "sandboxes"
        files = [p for p in log.rglob("net.jsonl*")]
        assert files, list(log.rglob("*"))
        size = sum(p.stat().st_size for p in files)
        lines = [json.loads(x) for p in files for x in p.read_text().splitlines()]
        refused = [x for x in lines if not x["allowed"]]
        # the window's first refusals one by one (saying what), the rest counted
        assert 1 <= len(refused) <= netlog.PER_WINDOW + netlog.TARGETS + 1, len(refused)
        assert all("denied.test" in x["host"] for x in refused)
        assert size < 64 * 1024, size  # 3000 lines would be ~600 KB
        assert lines[-1]["allowed"] and lines[-1]["host"] == "allowed.test"


def test_the_network_helper_counts_in_the_sandboxs_cgroups(
    tmp_path: Path, state_home: Path, server: int
) -> None:
    with Sandbox.create(build(_spec(tmp_path, server)), name="acct") as sb:
        r = sb.exec(["curl", "-sS", "--max-time", "10", f"http://allowed.test:{server}/x"])
        assert r.stdout == b"ok\n", r.stderr
        # the network helper counts in the sandbox's cgroups: a process there in the
        # host's network namespace (control: the sandbox's own processes are found there too)
        host, inside = _netd_pids(state_home)
        if not host and not inside:
            pytest.skip(
                "the sandbox has no cgroups for this caller here (none delegated to it): "
                "the helper is charged where a sandbox has them"
            )
        assert inside, "the detector sees the sandbox's own processes in its cgroups"
        assert len(host) == 1, host
        with open(f"/proc/{host[0]}/status") as f:
            parent = int(next(x for x in f if x.startswith("PPid:")).split()[1])
        assert parent not in host + inside  # its parent, the supervisor, stays where it started
        # charged for memory, not counted among the sandbox's processes: its threads (one
        # per connection, capped by itself) would take the sandbox's pids budget
        records = list((state_home / "warren" / "cgroups").iterdir())
        for d in records[0].read_text().split():
            if "/pids/" in d:
                assert host[0] not in {int(p) for p in Path(d, "cgroup.procs").read_text().split()}
