"""A helper whose call fails with ENOSYS as its PID 1 goes says nothing of a bug.

While the hard-link walk's window is open, a helper's writing calls pass through PID 1's
broker. When the walk finds a file linked from outside after a command started, the
supervisor ends the sandbox: PID 1's exit closes the broker's listener, and a call in
flight fails with ENOSYS before the namespace's end kills the helper. The helper then
told its client "sandbox helper failed: OSError(38, 'Function not implemented') ... a bug
in warren" (seen once as uid 1001 in a gate: test_links' link added from outside),
where the client should hear the supervisor's "linked from outside ... run the command
again". A helper now first waits, a moment at most, for its PID 1 to end
(``pid1._pid1_ends``): ending, it says nothing; going on, it reports as before.

The race itself is not made here at will; what decides it is, from the host.
"""

from __future__ import annotations

import os
import time

from warren._core import pid1


def _helper_under(parent_lives: float, within: float) -> tuple[bool, float]:
    """A process that lives ``parent_lives`` s, with a child asking ``_pid1_ends(within)``
    of it: the answer and how long it took, read from the host."""
    r, w = os.pipe()
    parent = os.fork()
    if parent == 0:  # the "PID 1"
        os.close(r)
        child = os.fork()
        if child == 0:  # the "helper"
            start = time.monotonic()
            ends = pid1._pid1_ends(within)
            os.write(w, f"{int(ends)} {time.monotonic() - start}".encode())
            os._exit(0)
        os.close(w)
        time.sleep(parent_lives)
        os._exit(0)
    os.close(w)
    try:
        data = b""
        while chunk := os.read(r, 100):
            data += chunk
    finally:
        os.close(r)
        os.waitpid(parent, 0)
    ends, took = data.decode().split()
    return ends == "1", float(took)


def test_a_helper_knows_its_pid1_ended_as_soon_as_it_does() -> None:
    ends, took = _helper_under(parent_lives=0.2, within=5.0)
    assert ends and took < 2.0, took


def test_a_helper_whose_pid1_goes_on_reports_after_the_wait() -> None:
    ends, took = _helper_under(parent_lives=2.0, within=0.3)
    assert not ends and 0.25 <= took < 1.5, took
