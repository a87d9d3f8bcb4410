"""One-shot sandboxed commands for Python callers: ``warren.run(argv, policy=...)``.

Owns stdin feeding, output capture (caps from ``output``) and timeouts for a single
command; the module is not named ``run`` so that ``warren.run`` is always the function.
Launching is ``launch``'s job, planning ``plan``'s.
"""

from __future__ import annotations

import os
import select
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from . import guard, hostinfo, launch, netns
from . import plan as _plan
from .errors import ExecError
from .netpolicy import NetEvent
from .netproxy import Proxy
from .output import DEFAULT_OUTPUT_LIMIT, Result, feed, truncation_marker
from .output import Capture as _Capture
from .policy import Policy, PolicySpec, build

__all__ = ["DEFAULT_OUTPUT_LIMIT", "Result", "plan_for", "run", "run_plan", "truncation_marker"]


def plan_for(policy: Policy, cwd: str | None = None) -> _plan.Plan:
    paths = [r.path for r in (*policy.writable, *policy.readable, *policy.denied)]
    facts = hostinfo.gather_for(paths)
    return _plan.make_plan(policy, facts, cwd=cwd)


def run(
    argv: Sequence[str],
    policy: Policy | None = None,
    *,
    stdin: bytes | None = None,
    timeout: float | None = None,
    cwd: str | os.PathLike[str] | None = None,
    output_limit: int = DEFAULT_OUTPUT_LIMIT,
    on_stdout: Callable[[bytes], None] | None = None,
    on_stderr: Callable[[bytes], None] | None = None,
    on_net_event: Callable[[NetEvent], None] | None = None,
) -> Result:
    """Run ``argv`` in a fresh one-shot sandbox and capture its output.

    With ``--network allow`` every proxy decision is in ``Result.net_log`` and is
    also passed to ``on_net_event`` as it happens.

    Raises a :class:`~warren.errors.WarrenError` subclass when the sandbox cannot be
    set up (``SetupError``, ``CwdNotFound``) or the command cannot run
    (``CommandNotFound``, ``ExecError``). A command that runs and fails is a
    ``Result`` with its exit status.
    """
    if isinstance(argv, (str, bytes)):
        raise ExecError(
            "argv must be a list of strings, not one string",
            operation="run",
            hint='use ["sh", "-c", "..."] to run a shell command line',
        )
    policy = policy or build(PolicySpec())
    # Output is captured, never a terminal: always a new session.
    plan = replace(plan_for(policy, str(cwd) if cwd is not None else None), new_session=True)
    return run_plan(
        plan,
        argv,
        stdin=stdin,
        timeout=timeout,
        cwd=str(Path(cwd)) if cwd is not None else None,
        output_limit=output_limit,
        on_stdout=on_stdout,
        on_stderr=on_stderr,
        on_net_event=on_net_event,
    )


def run_plan(
    plan: _plan.Plan,
    argv: Sequence[str],
    *,
    stdin: bytes | None = None,
    timeout: float | None = None,
    cwd: str | None = None,
    output_limit: int = DEFAULT_OUTPUT_LIMIT,
    on_stdout: Callable[[bytes], None] | None = None,
    on_stderr: Callable[[bytes], None] | None = None,
    on_net_event: Callable[[NetEvent], None] | None = None,
) -> Result:
    start = time.monotonic()
    before = guard.snapshot(plan)
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    in_r, in_w = os.pipe2(os.O_CLOEXEC)
    try:
        child = launch.start(plan, argv, stdin=in_r, stdout=out_w, stderr=err_w, cwd=cwd)
    finally:
        for fd in (out_w, err_w, in_r):
            os.close(fd)
    try:
        net = start_network(plan, child, on_net_event)
    except BaseException:
        for fd in (out_r, err_r, in_w):
            os.close(fd)
        raise
    captures = {out_r: _Capture(output_limit, on_stdout), err_r: _Capture(output_limit, on_stderr)}
    pending = memoryview(stdin or b"")
    if not pending:
        os.close(in_w)
        in_w = -1
    else:
        os.set_blocking(in_w, False)
    readers = [out_r, err_r, child.report_fd]
    deadline = None if timeout is None else start + timeout
    timed_out = False
    try:
        while readers:
            writers = [in_w] if in_w >= 0 else []
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready_r, ready_w, _ = select.select(readers, writers, [], wait)
            if not ready_r and not ready_w:
                timed_out = True
                child.kill()
                deadline = None
                continue
            for fd in ready_w:
                pending = feed(fd, pending)
                if not pending:
                    os.close(in_w)
                    in_w = -1
            for fd in ready_r:
                if fd == child.report_fd:
                    if not child.read_report():
                        readers.remove(fd)
                    continue
                chunk = os.read(fd, 65536)
                if chunk:
                    captures[fd].feed(chunk)
                else:
                    readers.remove(fd)
        outcome = child.wait()
    finally:
        for fd in (out_r, err_r, in_w):
            if fd >= 0:
                os.close(fd)
        if child.outcome is None:
            child.kill()
        netns.stop(net)
    assert outcome is not None
    repairs = guard.restore(before)
    if outcome.error is not None and not timed_out:
        raise outcome.error
    out, err = captures[out_r], captures[err_r]
    return Result(
        exit_code=outcome.exit_code,
        stdout=out.value(),
        stderr=err.value(),
        duration=time.monotonic() - start,
        signal=outcome.signal,
        timed_out=timed_out,
        stdout_truncated=bool(out.dropped),
        stderr_truncated=bool(err.dropped),
        warnings=(*plan.warnings, *repairs),
        net_log=tuple(net.events) if isinstance(net, Proxy) else (),
    )


def start_network(
    plan: _plan.Plan, child: launch.Child, on_event: Callable[[NetEvent], None] | None = None
) -> Proxy | netns.Pasta | None:
    """Complete a launched sandbox's network mode; on failure the sandbox is ended."""
    if child.net is None:
        return None
    try:
        net = netns.complete(plan, child.net, child.pid)
    except BaseException:
        child.kill()
        child.wait()
        raise
    if isinstance(net, socket.socket):
        return netns.proxy_for(plan, net, f"run-{child.pid}", on_event).start()
    return net
