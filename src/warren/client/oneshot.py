"""One-shot sandboxed commands for Python callers: ``warren.run(argv, policy=...)``.

The supervisor plans and launches the sandbox (from a fresh process, never a copy of
the caller) and tears it down when the command ends; this module checks the
arguments and hands them to the transport. The module is not named ``run`` so that
``warren.run`` is always the function.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from ..models import Result
from ..net.allowlist import NetEvent
from ..output import DEFAULT_OUTPUT_LIMIT
from ..policy import Policy, PolicySpec
from . import checks
from .transport import Command, Transport


def run(
    argv: Sequence[str],
    policy: PolicySpec | Policy | None = None,
    *,
    stdin: bytes | str | None = None,
    timeout: float | None = None,
    cwd: str | os.PathLike[str] | None = None,
    output_limit: int = DEFAULT_OUTPUT_LIMIT,
    on_stdout: Callable[[bytes], None] | None = None,
    on_stderr: Callable[[bytes], None] | None = None,
    on_net_event: Callable[[NetEvent], None] | None = None,
    transport: Transport | None = None,
    remote: str | None = None,
    token: str | None = None,
) -> Result:
    """Run ``argv`` in a fresh one-shot sandbox and capture its output.

    With ``--network allow`` every proxy decision is in ``Result.net_log`` and is
    also passed to ``on_net_event`` as it happens. Safe to call from any thread.

    Raises a :class:`~warren.errors.WarrenError` subclass when the sandbox cannot be
    set up (``SetupError``, ``CwdNotFound``, ``PolicyError``) or the command cannot run
    (``CommandNotFound``, ``ExecError``). A command that runs and fails is a
    ``Result`` with its exit status.
    """
    if transport is None:
        from .sandbox import _local

        transport = _local(remote, token)
    command = Command.checked(
        "run", argv, cwd, None, stdin, timeout, output_limit, on_stdout, on_stderr, on_net_event=on_net_event
    )
    return transport.run(checks.spec_of(policy), command, config=False, profile=None)
