"""The supervisor's loop survives a bug in its own steps: a timer's or reaping's
exception is said in the log (once every few seconds per step) and every other step
goes on. Raised out of the loop, it ended the supervisor, and every sandbox with it
(an event's handler already had this guard)."""

from __future__ import annotations

import pytest

from warren.server.supervisor import Supervisor


def test_a_timer_step_that_raises_is_logged_and_the_other_steps_still_run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sup = Supervisor(None, None, 0)  # the inline supervisor: no state, no listener
    ran: list[str] = []

    def broken_tick() -> None:
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "planted by a sandbox")

    monkeypatch.setattr(sup.git, "tick", broken_tick)
    monkeypatch.setattr(sup.boots, "drop_replaced", lambda: ran.append("drop_replaced"))
    for _ in range(3):
        sup.git_sync_at = 0.0
        sup._timers()  # raised before: the supervisor's loop ended
    assert ran == ["drop_replaced"] * 3, "the steps after the broken one did not run"
    err = capsys.readouterr().err
    assert err.count("git sync: UnicodeDecodeError") == 1, err  # once, then counted
    assert "test_supervisor_loop.py:" in err, err  # where it was raised
