"""Loading warren's native programs into sealed memfds (``_core.programs``).

Every clone of a PID 1 loads the exec stub and the credentials sender (``clone.preload``);
what is loaded once is kept, and where the program is is asked only the first time (a
look through sysconfig's places costs more than the rest of the load)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from warren._core import programs


@pytest.fixture
def program(tmp_path: Path) -> str:
    path = tmp_path / "prog"
    path.write_bytes(b"#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return str(path)


def test_a_program_is_found_once_and_its_memfd_kept(program: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(programs, "_loaded", {})
    asked: list[int] = []

    def find() -> str:
        asked.append(1)
        return program

    first = programs.load("warren-test-prog", find)
    second = programs.load("warren-test-prog", find)
    assert first is not None and first == second
    assert asked == [1]
    assert programs.loaded("warren-test-prog") == first
    with open(f"/proc/self/fd/{first}", "rb") as f:
        assert f.read() == Path(program).read_bytes()
    seals = fcntl.fcntl(first, fcntl.F_GET_SEALS)
    assert seals & fcntl.F_SEAL_WRITE and seals & fcntl.F_SEAL_SEAL
    with pytest.raises(PermissionError):
        os.write(first, b"x")
    os.close(first)


def test_no_program_is_remembered_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(programs, "_loaded", {})
    asked: list[int] = []

    def find() -> None:
        asked.append(1)

    assert programs.load("warren-test-none", find) is None
    assert programs.load("warren-test-none", find) is None
    assert asked == [1]
