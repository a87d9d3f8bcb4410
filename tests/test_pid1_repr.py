"""A helper resets PID 1's signal handlers first thing (``pid1.Init._helper``), and
Python's ``signal.signal`` tries to make the handler it replaces an enum member: for a
bound method of PID 1's ``Init`` that fails with a message holding its ``repr``. A
dataclass's repr holds every field, the whole plan with it: formatted in every helper,
on the path of a request that found no spare (3-5 ms of an exec there, the medians of
30 pairs of back-to-back execs: ``docs/development.md``). ``Init`` is no dataclass
repr, so that replacing its handlers never formats its state."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import pytest

from warren._core import pid1
from warren.plan import CallerFacts, Plan, make_plan
from warren.policy import PolicySpec, build
from warren.server.hostfacts import gather


def test_replacing_pid1_s_handlers_formats_nothing_of_its_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    caller = CallerFacts.here(cwd=str(tmp_path))
    policy = build(PolicySpec(workspace=str(tmp_path)), cwd=tmp_path, env=caller.env, home=Path(caller.home))
    plan = make_plan(policy, gather(), caller)
    ours, theirs = socket.socketpair()
    init = pid1.Init(plan, ours, None, False, None, set())

    def formatted(_self: object) -> str:
        raise AssertionError("the plan was formatted")

    monkeypatch.setattr(Plan, "__repr__", formatted)
    before = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, init._on_term)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # what a helper does, as PID 1's child
    finally:
        signal.signal(signal.SIGTERM, before)
        ours.close()
        theirs.close()
        os.close(init.wake_r)
        os.close(init.wake_w)
    assert len(repr(init)) < 200
