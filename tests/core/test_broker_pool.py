"""The broker's workers (``_core.broker.pool``), in this process: a bound that refuses
at once, a blocking call interrupted when its caller is gone, idle workers leaving."""

from __future__ import annotations

import errno
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from warren._core import _sys
from warren._core.broker import pool


@pytest.fixture
def interrupt() -> Iterator[None]:
    old = signal.getsignal(pool.INTERRUPT)
    pool.install_interrupt()
    yield
    signal.signal(pool.INTERRUPT, old)


def _wait(check: Callable[[], bool], until: float = 5.0) -> bool:
    deadline = time.monotonic() + until
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return False


def test_beyond_the_bound_a_call_is_refused_at_once_not_queued() -> None:
    workers = pool.Workers(limit=3, keep=1, idle=5.0)
    workers.start()
    release = threading.Event()
    taken = [workers.submit(n, release.wait) for n in range(3)]
    t = time.monotonic()
    refused = workers.submit(99, release.wait)
    assert taken == [True, True, True] and refused is False
    assert time.monotonic() - t < 0.5
    release.set()
    assert _wait(lambda: not workers.in_flight())
    assert workers.submit(100, lambda: None)  # free again


def test_a_worker_whose_caller_left_is_interrupted_and_freed(tmp_path: Path, interrupt: None) -> None:
    """A raw blocking connect to a full backlog returns EINTR once the broker sees the
    notification gone, and the worker takes the next job."""
    path = str(tmp_path / "full.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(0)
    held = []
    while True:
        c = socket.socket(socket.AF_UNIX)
        c.setblocking(False)
        try:
            c.connect(path)
        except BlockingIOError:
            c.close()
            break
        held.append(c)
    address = socket.AF_UNIX.to_bytes(2, "little") + path.encode() + b"\0"
    results: list[int] = []
    client = socket.socket(socket.AF_UNIX)
    workers = pool.Workers(limit=1, keep=1, idle=5.0)
    workers.start()
    assert workers.submit(1, lambda: results.append(_sys.connect(client.fileno(), address)))
    time.sleep(0.3)
    assert results == [] and workers.in_flight()  # it really waits
    workers.interrupt_abandoned(lambda nid: True)  # still waited for: left alone
    time.sleep(0.2)
    assert results == []

    def interrupted() -> bool:
        workers.interrupt_abandoned(lambda nid: False)  # gone: interrupted, again each tick
        return bool(results)

    assert _wait(interrupted)
    assert results == [-errno.EINTR]
    assert _wait(lambda: not workers.in_flight())
    done = threading.Event()
    assert workers.submit(2, done.set) and done.wait(2)
    for c in (*held, client, listener):
        c.close()


def test_idle_workers_leave_down_to_those_kept() -> None:
    workers = pool.Workers(limit=4, keep=1, idle=0.2)
    workers.start()
    release = threading.Event()
    for n in range(4):
        assert workers.submit(n, release.wait)
    assert workers.threads == 4
    release.set()
    assert _wait(lambda: workers.threads == 1)
    done = threading.Event()
    assert workers.submit(9, done.set) and done.wait(2)
