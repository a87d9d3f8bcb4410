"""The supervisor signals a sandbox's processes only while they are the sandbox's: a
pid freed and taken by a host process is never signalled (pause by signals)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from warren._core import procs


def _state(pid: int) -> str:
    for _ in range(100):
        s = procs.state(pid)
        if s in ("T", "t"):
            return s
        time.sleep(0.01)
    return procs.state(pid)


def test_a_process_outside_the_sandbox_tree_is_never_signalled() -> None:
    host = subprocess.Popen(["sleep", "30"])
    other = subprocess.Popen(["unshare", "-rp", "--fork", "sleep", "30"])
    try:
        time.sleep(0.2)
        kids = procs.descendants(other.pid)
        assert kids, "unshare did not start its child"
        # The host's sleep stands for a pid reused by the host: not under that root.
        assert not procs.signal_member(host.pid, signal.SIGSTOP, other.pid)
        assert _state(host.pid) not in ("T", "t")
        # The control: the same call stops a process that is under it.
        assert procs.signal_member(kids[-1], signal.SIGSTOP, other.pid)
        assert _state(kids[-1]) in ("T", "t")
        os.kill(kids[-1], signal.SIGCONT)
    finally:
        for p in (host, other):
            p.kill()
            p.wait()


# A process whose main thread exits (the raw exit call: only the calling thread ends)
# while another thread counts into the file ARGV[1] every 5 ms: its leader reads as a
# zombie on the host while the process runs on.
LEADERLESS_COUNTER = (
    "import ctypes, os, sys, threading, time\n"
    "path = sys.argv[1]\n"
    "def count():\n"
    "    i = 0\n"
    "    while True:\n"
    "        i += 1\n"
    "        with open(path + '.tmp', 'w') as f: f.write(str(i))\n"
    "        os.replace(path + '.tmp', path)\n"
    "        time.sleep(0.005)\n"
    "threading.Thread(target=count).start()\n"
    "time.sleep(0.05)\n"
    "ctypes.CDLL(None).syscall({'x86_64': 60, 'aarch64': 93}[os.uname().machine], 0)\n"
)


def read_count(path: str) -> int:
    for _ in range(100):
        try:
            with open(path) as f:
                return int(f.read())
        except (OSError, ValueError):
            time.sleep(0.01)
    raise AssertionError(f"the counter never wrote {path}")


def advances(path: str, within: float = 0.3) -> bool:
    start = read_count(path)
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if read_count(path) > start:
            return True
        time.sleep(0.02)
    return False


def test_pause_by_signals_stops_the_threads_of_a_process_whose_leader_exited(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from warren.server import pause

    count = str(tmp_path / "count")
    proc = subprocess.Popen(["python3", "-c", LEADERLESS_COUNTER, count])
    try:
        for _ in range(200):
            if procs.state(proc.pid) == "Z":
                break
            time.sleep(0.01)
        # What the old check read: a zombie, skipped as if it were not running. The
        # control: its thread still counts, and each task says so.
        assert procs.state(proc.pid) == "Z"
        assert procs.running(proc.pid)
        assert advances(count)
        paused = pause.pause("leaderless", [proc.pid], [])  # no freezer: signals
        assert paused.freezer is None
        assert not procs.running(proc.pid)
        assert not advances(count, 0.4), "a thread of the paused process kept counting"
        pause.resume("leaderless", [proc.pid], paused)
        assert advances(count)
    finally:
        proc.kill()
        proc.wait()
