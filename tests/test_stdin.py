"""stdin for background processes: ``spawn(..., stdin=True)``, ``Process.write`` and
``Process.close_stdin``, with real processes reading it, and the typed errors.

The tests taking ``sb`` run again over HTTP in tests/test_remote_sdk.py; the others
look at the local supervisor itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import warren
from conftest import Layout, module_state
from warren.client.sandbox import Process, Sandbox
from warren.errors import (
    ExecError,
    ProcessEnded,
    ProcessNotFound,
    StdinClosed,
    StdinFull,
    StdinNotOpen,
)
from warren.policy import PolicySpec
from warren.protocol import STDIN_MAX_QUEUED
from warren.server import statedir
from warren.server.stdin import SWEEP_EVERY

UPPER = "import sys\nfor line in sys.stdin:\n    print(line.upper(), end='', flush=True)\n"


@pytest.fixture(scope="module", autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from module_state(tmp_path_factory)


@pytest.fixture
def sb(layout: Layout) -> Iterator[Sandbox]:
    with Sandbox.create(PolicySpec(workspace=str(layout.workspace))) as sandbox:
        yield sandbox


def _until(check: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _stdout_is(p: Process, expected: bytes) -> Callable[[], bool]:
    def check() -> bool:
        out = p.output().stdout
        assert expected.startswith(out), out
        return out == expected

    return check


def test_a_line_reader_gets_each_line_written_later_in_order(sb: Sandbox) -> None:
    p = sb.spawn(["python3", "-c", UPPER], stdin=True)
    p.write("alpha\n")
    _until(_stdout_is(p, b"ALPHA\n"), "the first line's answer")
    assert p.running  # it answered one line and waits for the next
    p.write(b"beta\n")
    p.write("gamma\ndelta\n")
    _until(_stdout_is(p, b"ALPHA\nBETA\nGAMMA\nDELTA\n"), "the later lines' answers")
    p.close_stdin()
    assert p.wait(10) == 0


def test_eof_ends_cat_and_wc_with_everything_written(sb: Sandbox) -> None:
    cat = sb.spawn(["cat"], stdin=True)
    wc = sb.spawn(["wc", "-c"], stdin=True)
    for i in range(50):
        cat.write(f"line {i}\n")
        wc.write(b"x" * 1000 + bytes([i]))
    assert cat.running and wc.running  # nothing ends them but eof
    cat.close_stdin()
    wc.close_stdin()
    assert cat.wait(10) == 0 and wc.wait(10) == 0
    assert cat.output().stdout == "".join(f"line {i}\n" for i in range(50)).encode()
    assert wc.output().stdout.strip() == str(50 * 1001).encode()


def test_eight_mib_reach_sha256sum_intact_while_other_clients_are_served(
    sb: Sandbox, layout: Layout, tmp_path: Path
) -> None:
    data = os.urandom(8 << 20)
    other_ws = tmp_path / "other"
    other_ws.mkdir()
    with Sandbox.create(PolicySpec(workspace=str(other_ws))) as other:
        # It reads nothing for 3 s: the 8 MiB cannot all be taken before then.
        p = sb.spawn(["sh", "-c", "sleep 3; exec sha256sum"], stdin=True)
        failed: list[BaseException] = []

        def feed() -> None:
            try:
                p.write(data)
            except BaseException as e:
                failed.append(e)

        writer = threading.Thread(target=feed)
        writer.start()
        time.sleep(0.3)
        for i in range(5):
            start = time.monotonic()
            assert other.exec(["echo", str(i)]).stdout == f"{i}\n".encode()
            assert time.monotonic() - start < 2.0
            assert any(s.name == other.name for s in Sandbox.list())
        assert writer.is_alive(), "the write should still wait for the slow reader"
        writer.join(60)
        assert not writer.is_alive() and not failed, failed
        p.close_stdin()
        assert p.wait(20) == 0
    assert p.output().stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()


def test_spawn_without_stdin_reads_end_of_file_at_once(sb: Sandbox) -> None:
    cat = sb.spawn(["cat"])
    probe = sb.spawn(["python3", "-c", "import sys; print(repr(sys.stdin.read()))"])
    assert cat.wait(10) == 0 and cat.output().stdout == b""
    assert probe.wait(10) == 0 and probe.output().stdout == b"''\n"


def test_writing_where_it_cannot_go_is_a_typed_error_naming_the_process(sb: Sandbox) -> None:
    plain = sb.spawn(["sleep", "30"])
    with pytest.raises(StdinNotOpen) as info:
        plain.write("x")
    assert plain.id in info.value.message and "stdin=True" in info.value.hint
    with pytest.raises(StdinNotOpen):
        plain.close_stdin()
    plain.kill()

    closed = sb.spawn(["sleep", "30"], stdin=True)
    closed.write("some\n")
    closed.close_stdin()
    closed.close_stdin()  # closing again does nothing
    with pytest.raises(StdinClosed) as closed_info:
        closed.write("more\n")
    assert "close_stdin" in closed_info.value.hint and closed_info.value.path == closed.id
    closed.kill()

    ended = sb.spawn(["true"], stdin=True)
    assert ended.wait(10) == 0
    with pytest.raises(ProcessEnded) as ended_info:
        ended.write("late\n")
    assert ended.id in ended_info.value.message and ended_info.value.hint
    ended.close_stdin()  # closing what has ended does nothing

    with pytest.raises(ProcessNotFound) as missing:
        sb.process("0123456789ab").write("x")
    assert "0123456789ab" in missing.value.message and missing.value.hint

    reader = sb.spawn(["cat"], stdin=True)
    for bad in (None, 42, ["x"]):
        with pytest.raises(ExecError):
            reader.write(bad)  # type: ignore[arg-type]
    with pytest.raises(ExecError):
        sb.spawn(["cat"], stdin="yes")  # type: ignore[arg-type]
    reader.close_stdin()
    assert reader.wait(10) == 0


@pytest.mark.parametrize("after", [0.0, SWEEP_EVERY + 0.5], ids=["at-once", "after-a-sweep"])
def test_a_process_that_closes_its_stdin_refuses_more_with_stdin_closed(sb: Sandbox, after: float) -> None:
    """Whether the write itself finds the reader gone or the supervisor's sweep found it
    first (and let go of the pipe), the answer says the process closed its stdin."""
    p = sb.spawn(
        ["python3", "-c", "import os, time; os.close(0); print('closed', flush=True); time.sleep(30)"],
        stdin=True,
    )
    _until(_stdout_is(p, b"closed\n"), "the process to close its stdin")
    time.sleep(after)
    with pytest.raises(StdinClosed) as info:
        p.write("anyone there?\n")
    assert "closed its stdin" in info.value.message
    assert p.running
    p.kill()


def test_a_process_that_does_not_read_fills_up_to_the_bound_then_stdin_full(sb: Sandbox) -> None:
    p = sb.spawn(["sleep", "60"], stdin=True)
    chunk = b"z" * (256 << 10)
    accepted = 0
    with pytest.raises(StdinFull) as info:
        for _ in range(100):
            sb._transport.write_stdin(sb.name, p.id, chunk)
            accepted += len(chunk)
    # the queue's bound, plus what the pipe itself took (1 MiB, or 64 KiB if it could not grow)
    assert STDIN_MAX_QUEUED <= accepted <= STDIN_MAX_QUEUED + (1 << 20)
    assert "not reading" in info.value.message and info.value.hint
    start = time.monotonic()
    with pytest.raises(StdinFull) as waited:
        p.write(b"y" * 1000, timeout=0.5)
    assert 0.5 <= time.monotonic() - start < 5
    assert "0 of 1000 bytes were sent within 0.5 s" in waited.value.message
    with pytest.raises(StdinFull):  # one write may not exceed the bound by itself
        sb._transport.write_stdin(sb.name, p.id, b"x" * (STDIN_MAX_QUEUED + 1))
    p.kill()
    p.wait(10)
    with pytest.raises(ProcessEnded):
        p.write("x")


def test_a_process_is_found_by_its_pid_and_from_another_handle(sb: Sandbox) -> None:
    p = sb.spawn(["python3", "-c", UPPER], stdin=True)
    sb._transport.write_stdin(sb.name, str(p.pid), b"by pid\n")
    again = Sandbox.get(sb.name).process(p.id)
    again.write("by id\n")
    again.close_stdin()
    assert p.wait(10) == 0
    assert p.output().stdout == b"BY PID\nBY ID\n"


def test_async_sandbox_writes_and_closes_stdin(layout: Layout) -> None:
    async def main() -> bytes:
        async with await warren.AsyncSandbox.create(PolicySpec(workspace=str(layout.workspace))) as sb:
            p = await sb.spawn(["python3", "-c", UPPER], stdin=True)
            await p.write("async\n")
            await p.close_stdin()
            assert await p.wait(10) == 0
            return (await p.output()).stdout

    assert asyncio.run(main()) == b"ASYNC\n"


def _supervisor_write_pipes() -> int:
    """Pipe write ends the local supervisor holds (its own wake-up pipe among them)."""
    found = statedir.read_address(statedir.location(os.environ))
    assert found is not None
    pid = found[1]
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if not os.readlink(f"/proc/{pid}/fd/{fd}").startswith("pipe:"):
                continue
            info = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
        except OSError:
            continue
        flags = int(info.split("flags:")[1].split()[0], 8)
        count += (flags & os.O_ACCMODE) == os.O_WRONLY
    return count


def test_the_supervisor_lets_go_of_a_pipe_once_its_process_ends(sb: Sandbox) -> None:
    before = _supervisor_write_pipes()
    procs = [sb.spawn(["sleep", "30"], stdin=True) for _ in range(3)]
    assert _supervisor_write_pipes() == before + 3
    for p in procs:
        p.kill(9)
        p.wait(10)
    # nobody writes to them again: the supervisor's sweep (once a second) finds them
    _until(lambda: _supervisor_write_pipes() == before, "the pipes to be closed", timeout=5)
    spawned_and_done = sb.spawn(["true"], stdin=True)
    spawned_and_done.wait(10)
    _until(lambda: _supervisor_write_pipes() == before, "the pipe of a finished process", timeout=5)
