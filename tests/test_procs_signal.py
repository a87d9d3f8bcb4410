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
