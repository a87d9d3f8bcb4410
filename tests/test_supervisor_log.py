"""The supervisor's log is on the state disk, which a sandbox can fill (a layer, a
snapshot): a line the disk cannot take is dropped and counted, and the supervisor,
with every sandbox of it, lives on (a print that raised ENOSPC used to end it). A
sandbox can make lines come for as long as it lives: the log is rotated, its size
bounded."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import Layout, run_cli, shut_down_supervisor
from warren.server import gitleases, logfile, statedir


def test_lines_a_full_disk_cannot_take_are_counted_and_said_once_it_can(tmp_path: Path) -> None:
    full = os.open("/dev/full", os.O_WRONLY | os.O_CLOEXEC)
    log = logfile.Log(full)
    try:
        print("one", file=log)
        print("two", "three", file=log, flush=True)
        assert log.dropped == 2
        r, w = os.pipe()
        log.fd = w
        print("four", file=log)
        os.close(w)
        assert os.read(r, 4096) == b"warren supervisor: 2 lines of this log were lost (disk full)\nfour\n"
        assert log.dropped == 0
        os.close(r)
    finally:
        os.close(full)


def test_a_supervisor_whose_log_the_disk_refuses_serves_on(state_home: Path, layout: Layout) -> None:
    """The log is /dev/full (every write ENOSPC) and the supervisor has lines to write
    from its start (a damaged lease record it drops): it serves every command."""
    shut_down_supervisor()
    root = Path(statedir.location(os.environ))
    (root / gitleases.DIRECTORY).mkdir(parents=True, exist_ok=True)
    (root / gitleases.DIRECTORY / "0123456789abcdef.json").write_text("{")
    (root / statedir.LOG_FILE).unlink(missing_ok=True)
    os.symlink("/dev/full", root / statedir.LOG_FILE)
    for _ in range(3):
        r = run_cli(["run", "--", "sh", "-c", "echo ran"], cwd=layout.workspace)
        assert (r.returncode, r.stdout) == (0, "ran\n"), r.stderr
    assert not (root / gitleases.DIRECTORY / "0123456789abcdef.json").exists()


def test_the_log_is_rotated_past_its_limit_and_what_is_on_disk_stays_bounded(tmp_path: Path) -> None:
    path = tmp_path / "supervisor.log"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    out = os.dup(fd)  # standard output: the same log, replaced by the rotation too
    log = logfile.Log(fd, str(path), limit=1000, also=(out,))
    try:
        for i in range(510):
            print(f"line {i:04d} " + "x" * 40, file=log)
        os.write(out, b"from stdout\n")
    finally:
        os.close(fd)
        os.close(out)
    rotated = path.with_name("supervisor.log.1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["supervisor.log", "supervisor.log.1"]
    assert path.stat().st_size < 1000 + 60 and rotated.stat().st_size < 1000 + 60
    kept = rotated.read_text().splitlines() + path.read_text().splitlines()
    assert kept[-1] == "from stdout"
    numbers = [int(line.split()[1]) for line in kept[:-1]]
    assert numbers == list(range(numbers[0], 510)) and numbers[0] > 400  # the newest, none lost between
