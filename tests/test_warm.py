"""A spare helper's warm-up (``shim.warm``) runs, once and without effect, the code its
request will run, so that the copy-on-write faults of that code (a helper is a fork of
PID 1, and Python writes reference counts and specialised bytecode into whatever it
runs) come before the request, not on its path: a request received with descriptors
over a socket and decoded, the word to PID 1, the command's directory and environment,
the helper's own object and its dry run of the command's end, the wait for the end, the
answers framed and sent. (About 150 faults of an exec's path became 51 with it, on this
machine: ``docs/development.md``.)

What must hold, as root and as uid 1001, judged from the parent of the process that
warms up: it leaves nothing behind — no descriptor, the same directory and scheduling
policy, no child, nothing written to the workspace — with and without limits, and the
sandboxes' execs go on as before (the rest of the suite).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from warren._core import shim
from warren.plan import CallerFacts, Plan, make_plan
from warren.policy import PolicySpec, build
from warren.server.hostfacts import gather


def _plan(ws: Path, **spec: object) -> Plan:
    caller = CallerFacts.here(cwd=str(ws))
    policy = build(PolicySpec(workspace=str(ws), **spec), cwd=ws, env=caller.env, home=Path(caller.home))  # type: ignore[arg-type]
    return make_plan(policy, gather(), caller)


def _state() -> tuple[list[str], str, int, list[str]]:
    children = []
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/children") as f:
            children += f.read().split()
    return sorted(os.listdir("/proc/self/fd")), os.getcwd(), os.sched_getscheduler(0), children


@pytest.mark.parametrize("limits", [{}, {"memory": "512M", "pids": 64}], ids=["no-limits", "limits"])
def test_warming_up_leaves_nothing_behind(tmp_path: Path, limits: dict[str, object]) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    plan = _plan(ws, **limits)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            before = _state()
            shim.warm(plan)
            after = _state()
            out = "same" if before == after else f"{before} -> {after}"
        except BaseException as e:
            out = f"error {e!r}"
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert data == b"same", data.decode()
    assert list(ws.iterdir()) == []
