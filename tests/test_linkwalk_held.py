"""The bound on requests held during the hard-link walk after launch
(``server.linkwalk``, ``server.box.HELD_MAX``). The walk is held back longer here than
in ``test_linkwalk`` (``WARREN_LINK_WALK_DELAY``): every one of ``HELD_MAX`` and more
requests, each from a thread of its own, has to reach the supervisor while the walk
waits, on a machine busy with the rest of the suite. Each outcome records when it
came, and the test checks the requests were asked for well within the walk and the
refusals came during it: one it could pass without the hold proves nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import held_walk_state
from warren import PolicySpec, Sandbox
from warren.errors import SandboxError
from warren.server import box as server_box

DELAY = 8.0
ASKED_WITHIN = 3.0  # the requests are all asked for this long after `before`, at most


@pytest.fixture(scope="module")
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from held_walk_state(tmp_path_factory, DELAY)


def test_requests_beyond_the_bound_held_during_the_walk_are_refused_and_the_rest_run(
    tmp_path: Path, state_home: Path
) -> None:
    """Every request asked for during the walk waits in the supervisor with copies of its
    descriptors: at most ``HELD_MAX`` at once. Those beyond it hear a typed error naming
    the sandbox and why (before any held one runs); the held ones all run once the walk
    has ended, each starting after it, and the sandbox takes requests as before."""
    ws = tmp_path / "ws"
    ws.mkdir()
    extra = 8
    before = time.time()
    box = Sandbox.create(PolicySpec(workspace=str(ws)))
    try:
        outcomes: list[tuple[object, float]] = []
        lock = threading.Lock()
        gate = threading.Barrier(server_box.HELD_MAX + extra + 1)

        def ask() -> None:
            gate.wait()
            try:
                r = box.exec(["date", "+%s.%N"])
                got: object = (r.exit_code, float(r.stdout)) if r.exit_code == 0 else r
            except SandboxError as e:
                got = e
            with lock:
                outcomes.append((got, time.time()))

        threads = [threading.Thread(target=ask) for _ in range(server_box.HELD_MAX + extra)]
        for t in threads:
            t.start()
        gate.wait()
        asked = time.time()
        late = asked - before
        assert late < ASKED_WITHIN, ("the requests were not asked for well within the walk", late)
        for t in threads:
            t.join(120)
        assert len(outcomes) == len(threads)
        ran = [got for got, _when in outcomes if isinstance(got, tuple)]
        refused = [(got, when) for got, when in outcomes if isinstance(got, SandboxError)]
        others = [got for got, _when in outcomes if not isinstance(got, SandboxError)]
        assert len(ran) == server_box.HELD_MAX, others
        assert len(refused) == extra, refused
        for _code, started in ran:
            assert started >= before + DELAY, (started - before, "it started during the walk")
        first = min(started for _code, started in ran)
        for e, when in refused:
            assert when < first, (when - first, "refused only after the walk, when the held ones ran")
            assert f"sandbox {box.name} cannot take more requests now" in str(e), e
            assert "hard links" in str(e) and e.hint and "ask again" in e.hint
        r = box.exec(["echo", "still here"])
        assert (r.exit_code, r.stdout) == (0, b"still here\n")
    finally:
        box.remove()
