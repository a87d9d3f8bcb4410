"""What each `warren` command costs in CPU, beside a Python start and bubblewrap.

    python bench/bench_cli.py [--runs N]

A test suite or an agent's harness drives warren through its command line: `run` with
the paths it may write, `create` / `exec --cwd` / `rm -f` around a command, `stop`, `ls`.
For each, the median CPU time (user + system, of the command's own processes: the
front end and the Python CLI it may hand over to, not the supervisor's) and wall time of
N runs, beside the same figures for `python3 -c pass` (what any Python command pays
first) and a bubblewrap sandbox running `true`. The native front end takes `run` with
`-w/--write/--read/--deny`, `exec --cwd`, `create`, `stop NAME` and `rm -f NAME` without
Python; `ls` is the Python CLI on the protocol alone (docs/development.md, "The Python
CLI in the suite").

Read the ratios: a command at about 1x `python3 -c pass` is all start-up; `run` and
`exec` on the native path should be far below it.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BWRAP = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
BWRAP += ["--unshare-all", "--die-with-parent"]


def measured(argv: list[str], cwd: Path) -> tuple[float, float, int]:
    """CPU seconds of the command's processes, wall seconds, exit status."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return cpu, wall, done.returncode


@contextmanager
def place() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="warren-bench-cli-") as d:
        ws = Path(d) / "ws"
        (ws / "sub").mkdir(parents=True)
        (Path(d) / "cache").mkdir()
        yield ws


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15)
    ns = ap.parse_args()
    warren = shutil.which("warren")
    if warren is None:
        raise SystemExit("bench_cli: the `warren` command is not on PATH (run scripts/setup)")
    with place() as ws:
        cache = str(ws.parent / "cache")
        figures: dict[str, tuple[list[float], list[float]]] = {}

        def add(label: str, argv: list[str]) -> None:
            cpu, wall, status = measured(argv, ws)
            if status != 0:
                raise SystemExit(f"bench_cli: {' '.join(argv)} exited {status}")
            got = figures.setdefault(label, ([], []))
            got[0].append(cpu)
            got[1].append(wall)

        measured([warren, "run", "--", "true"], ws)  # the supervisor started, once
        for i in range(ns.runs):  # interleaved: the machine's load falls on each alike
            add("python3 -c pass", [sys.executable, "-c", "pass"])
            if shutil.which("bwrap"):
                add("bwrap true", [*BWRAP, "true"])
            add("warren run -- true", [warren, "run", "--", "true"])
            add("warren run --write C -- true", [warren, "run", "--write", cache, "--", "true"])
            name = f"bench-cli-{os.getpid()}-{i}"
            add("warren create --write C NAME", [warren, "create", "--write", cache, name])
            add("warren exec --cwd DIR NAME true", [warren, "exec", "--cwd", str(ws / "sub"), name, "true"])
            add("warren stop NAME", [warren, "stop", name])
            add("warren rm -f NAME", [warren, "rm", "-f", name])
            add("warren ls", [warren, "ls"])
    base = statistics.median(figures["python3 -c pass"][0])
    print(f"{'command':36} {'CPU':>9} {'wall':>9}  CPU / python3 -c pass")
    for label, (cpu, wall) in figures.items():
        c = statistics.median(cpu)
        print(f"{label:36} {c * 1e3:7.1f}ms {statistics.median(wall) * 1e3:7.1f}ms  {c / base:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
