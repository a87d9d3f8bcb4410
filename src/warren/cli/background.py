"""Background commands from the command line: ``warren exec -d NAME CMD`` starts one and
prints its id; ``warren logs NAME ID [-f]`` prints (and follows) what it wrote.

Both are the library's ``Sandbox.spawn`` and the supervisor's capped per-process logs
(the same ones MCP's ``process_output`` and the HTTP processes endpoints read): nothing
here keeps output of its own.
"""

from __future__ import annotations

import os
import sys
import time

from ..client.local import LocalTransport
from ..client.sandbox import Sandbox
from ..errors import SandboxDead

FOLLOW_POLL = 0.1  # seconds between two reads of a running process's log


def detach(name: str, command: list[str], cwd: str | None, env: dict[str, str], timeout: float | None) -> int:
    process = Sandbox.get(name, transport=LocalTransport()).spawn(command, cwd=cwd, env=env, timeout=timeout)
    print(process.id)
    return 0


def _write(stream: int, data: bytes) -> None:
    while data:
        data = data[os.write(stream, data) :]


def show(name: str, spawn_id: str, follow: bool) -> int:
    """Print the process's stdout and stderr so far to ours; with ``follow``, keep
    printing until it ends and return its exit status (128+N for signal N)."""
    transport = LocalTransport()
    out_at = err_at = 0
    sys.stdout.flush()
    while True:
        state, out, err = transport.process(name, spawn_id, out_at, err_at)
        _write(1, out)
        _write(2, err)
        out_at, err_at = out_at + len(out), err_at + len(err)
        ended = state.status is not None or not state.running
        if not follow or (ended and not out and not err):
            break
        if not out and not err:
            time.sleep(FOLLOW_POLL)
    if not follow:
        return 0
    if state.status is None:
        raise SandboxDead(
            f"sandbox {name} ended while process {spawn_id} was running",
            operation="logs",
            path=name,
            hint="see `warren ls` for why",
        )
    st = state.status
    return 128 + os.WTERMSIG(st) if os.WIFSIGNALED(st) else os.waitstatus_to_exitcode(st)
