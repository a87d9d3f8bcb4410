"""Execs back to back, as a framework's several tool calls of one model turn come:
``Sandbox.exec(["true"])`` at each position of a burst, with helpers that serve again
(``warren._core.again``, the default) and without (``WARREN_SERVE_AGAIN=0``: each
helper serves one request), beside ``subprocess.run(["true"])`` back to back.

Each burst follows a pause (``--gap``, longer than PID 1's burst gap, so its first
exec is paced); the two sandboxes (each under a supervisor of its own, started with
and without the variable) take turns burst by burst, so both come from the same
minutes. Target (issue 36): ``Sandbox.exec`` within +1.0 ms of ``subprocess.run`` at
every pace, back to back included. Medians and third quartiles, milliseconds.

Run: python bench/bench_burst.py [--bursts 20] [--length 6] [--gap 0.8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable

from warren import PolicySpec, Sandbox
from warren.client.local import LocalTransport


def _box(state: str, serve_again: bool, workspace: str) -> Sandbox:
    env = {**os.environ, "XDG_STATE_HOME": state, "WARREN_SERVE_AGAIN": "1" if serve_again else "0"}
    return Sandbox.create(PolicySpec(workspace=workspace), transport=LocalTransport(env))


def _burst(call: Callable[[], object], length: int) -> list[float]:
    times = []
    for _ in range(length):
        t = time.perf_counter()
        call()
        times.append((time.perf_counter() - t) * 1000)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bursts", type=int, default=20)
    ap.add_argument("--length", type=int, default=6)
    ap.add_argument("--gap", type=float, default=0.8, help="seconds before each burst")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        workspace = os.path.join(tmp, "w")
        os.mkdir(workspace)
        boxes = {
            "serve again": _box(os.path.join(tmp, "a"), True, workspace),
            "one each": _box(os.path.join(tmp, "b"), False, workspace),
        }
        calls: dict[str, Callable[[], object]] = {
            name: (lambda box=box: box.exec(["true"])) for name, box in boxes.items()
        }
        calls["subprocess.run"] = lambda: subprocess.run(["true"], check=True)
        try:
            for call in calls.values():
                _burst(call, args.length)  # each supervisor warm, each sandbox used
            taken: dict[str, list[list[float]]] = {name: [] for name in calls}
            for _ in range(args.bursts):
                for name, call in calls.items():
                    time.sleep(args.gap)
                    taken[name].append(_burst(call, args.length))
        finally:
            for box in boxes.values():
                box.remove()
    base = [statistics.median(b[i] for b in taken["subprocess.run"]) for i in range(args.length)]
    print(f"{args.bursts} bursts of {args.length} execs of true, {args.gap} s apart; ms, median (q3)")
    print(f"{'position':<16}" + "".join(f"{i + 1:>14}" for i in range(args.length)) + f"{'2nd..last':>14}")
    for name, bursts in taken.items():
        cells = []
        for i in range(args.length):
            at = [b[i] for b in bursts]
            cells.append(f"{statistics.median(at):6.2f} ({statistics.quantiles(at, n=4)[2]:5.1f})")
        rest = statistics.median(t for b in bursts for t in b[1:])
        print(f"{name:<16}" + "".join(f"{c:>14}" for c in cells) + f"{rest:>14.2f}")
    for name in boxes:
        rest = statistics.median(t for b in taken[name] for t in b[1:])
        first = statistics.median(b[0] for b in taken[name])
        print(
            f"{name}: first +{first - base[0]:.2f} ms, the rest +{rest - statistics.median(base[1:]):.2f} ms"
            " over subprocess.run (target +1.0)"
        )


if __name__ == "__main__":
    main()
