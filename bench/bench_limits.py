"""What limits cost: `warren run -- true`, create + first exec, and an exec in a live
sandbox (whose helper reads the cgroup counters before and after), with the default
limits (cgroups as root here, rlimits for others) next to the same with none
(`--memory none --pids none --tmp-size none`), interleaved in one run; and what a
pause + resume round trip takes with 20 processes in the sandbox (by the mechanism
`warren plan` names for this caller).

Run: python bench/bench_limits.py [--runs 100]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time

from warren import PolicySpec, Sandbox

WARREN = [sys.executable, "-m", "warren"]
NONE = ["--memory", "none", "--pids", "none", "--tmp-size", "none"]


def _ms(xs: list[float]) -> str:
    xs = sorted(xs)
    p99 = xs[min(len(xs) - 1, int(len(xs) * 0.99))]
    return f"median {statistics.median(xs) * 1e3:7.2f} ms   p99 {p99 * 1e3:7.2f} ms"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=100)
    runs = ap.parse_args().runs
    with tempfile.TemporaryDirectory() as ws:
        subprocess.run([*WARREN, "run", "-w", ws, "--", "true"], check=True)  # warm the supervisor
        print(
            subprocess.run([*WARREN, "plan", "-w", ws], capture_output=True, text=True)
            .stdout.split("limits\n")[1]
            .split("process\n")[0]
        )
        run: dict[str, list[float]] = {"with": [], "without": []}
        create: dict[str, list[float]] = {"with": [], "without": []}
        limits = {
            "with": PolicySpec(workspace=ws),
            "without": PolicySpec(workspace=ws, memory="none", pids="none", tmp_size="none"),
        }
        for _ in range(runs):
            for kind, extra in (("with", []), ("without", NONE)):
                start = time.monotonic()
                subprocess.run([*WARREN, "run", "-w", ws, *extra, "--", "true"], check=True)
                run[kind].append(time.monotonic() - start)
                start = time.monotonic()
                sb = Sandbox.create(limits[kind])
                sb.exec(["true"])
                create[kind].append(time.monotonic() - start)
                sb.remove()
        execs: dict[str, list[float]] = {"with": [], "without": []}
        boxes = {kind: Sandbox.create(limits[kind]) for kind in limits}
        try:
            for _ in range(runs):
                for kind, sb in boxes.items():
                    start = time.monotonic()
                    sb.exec(["true"])
                    execs[kind].append(time.monotonic() - start)
                    time.sleep(0.01)  # paced: the spare helper is forked between execs
            sb = boxes["with"]
            sb.exec(["sh", "-c", "for i in $(seq 20); do sleep 600 & done"])
            pauses = []
            for _ in range(runs):
                start = time.monotonic()
                sb.pause()
                sb.resume()
                pauses.append(time.monotonic() - start)
        finally:
            for sb in boxes.values():
                sb.remove()
        for kind in ("with", "without"):
            print(f"  warren run -- true, {kind:7} limits   {_ms(run[kind])}")
        for kind in ("with", "without"):
            print(f"  create + first exec, {kind:7} limits  {_ms(create[kind])}")
        for kind in ("with", "without"):
            print(f"  Sandbox.exec(true), {kind:7} limits   {_ms(execs[kind])}")
        print(f"  pause + resume, 20 processes          {_ms(pauses)}")


if __name__ == "__main__":
    main()
