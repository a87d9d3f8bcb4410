"""`warren run -- true` at an agent's pace: one command every 1, 10 or 30 seconds.

An agent waits for its model between commands; what a sandbox booted ahead saves is
lost when it is gone before the next command comes. For each pace P, --runs times:
idle P/2, time ``bwrap ... true``; idle P/2, time ``warren run -- true`` (so warren's
runs come every P seconds and both are measured after the same idle moment). Target
(issue 36): warren within 1.5x bwrap at each pace. Medians; the supervisor started
before (two runs at the pace first, as an agent's session would have).

Run: python bench/bench_pace.py [--pace 1,10,30] [--runs 6]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

BWRAP = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-all"]
BWRAP += ["--die-with-parent", "true"]


def _time(argv: list[str], cwd: Path) -> float:
    t = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pace", default="1,10,30", help="seconds between commands, comma-separated")
    ap.add_argument("--runs", type=int, default=6)
    args = ap.parse_args()
    warren_cli = shutil.which("warren")
    if warren_cli is None:
        raise SystemExit("bench_pace: the `warren` command is not on PATH (run scripts/setup)")
    run = [warren_cli, "run", "--", "true"]
    # The supervisor may still be stopping sandboxes booted ahead when its state goes.
    tmp_dir = tempfile.TemporaryDirectory(prefix="bench-pace-", dir="/var/tmp", ignore_cleanup_errors=True)
    with tmp_dir as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        os.environ["XDG_STATE_HOME"] = str(Path(tmp) / "state")
        print(f"uid {os.getuid()}, {args.runs} runs per pace, load {os.getloadavg()[0]:.1f}")
        for pace in (float(p) for p in args.pace.split(",") if p):
            for _ in range(2):
                _time(run, ws)
                time.sleep(pace)
            bw, wr = [], []
            for _ in range(args.runs):
                time.sleep(pace / 2)
                bw.append(_time(BWRAP, ws))
                time.sleep(pace / 2)
                wr.append(_time(run, ws))
            b, w = statistics.median(bw) * 1e3, statistics.median(wr) * 1e3
            verdict = "met" if w / b <= 1.5 else "NOT met"
            print(f"  every {pace:4g} s: bwrap {b:7.1f} ms, warren run {w:7.1f} ms: {w / b:5.2f}x {verdict}")
        subprocess.run([warren_cli, "shutdown"], check=False, capture_output=True)


if __name__ == "__main__":
    main()
