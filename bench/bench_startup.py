"""Start-up cost of warren's commands, side by side with their baselines in one run.

  warren run -- true (CLI, whole process)  vs  bwrap ... true  vs  /bin/true
  warren exec NAME true (CLI, whole process)
  Sandbox.exec(["true"])  vs  subprocess.run(["true"])   (paced like an agent, and back to back)
  Sandbox.create + first exec

Medians and p99 over --runs (default 200) interleaved runs. The supervisor is warm
(started before measuring), as it is for an agent issuing commands one after another.

Run: python bench/bench_startup.py [--runs 200]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from warren import PolicySpec, Sandbox

BWRAP = [
    "bwrap",
    "--ro-bind",
    "/",
    "/",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
    "--unshare-all",
    "--die-with-parent",
]
TARGETS = {
    "warren run -- true (CLI)": 30.0,
    "warren exec NAME true (CLI)": 20.0,
    "Sandbox.exec, paced": 3.0,
    "Sandbox.create + first exec": 25.0,
}


def _stats(xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    return statistics.median(xs) * 1e3, xs[min(len(xs) - 1, int(len(xs) * 0.99))] * 1e3


def _line(label: str, xs: list[float]) -> str:
    med, p99 = _stats(xs)
    target = TARGETS.get(label)
    verdict = (
        "" if target is None else f"   target <= {target:.0f} ms: {'met' if med <= target else 'NOT met'}"
    )
    return f"  {label:32} median {med:7.2f} ms   p99 {p99:7.2f} ms{verdict}"


def _run(argv: list[str], cwd: Path) -> Callable[[], None]:
    def go() -> None:
        subprocess.run(argv, cwd=cwd, check=True, stdin=subprocess.DEVNULL)

    return go


def _time(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args()
    warren_cli = shutil.which("warren")
    if warren_cli is None:
        raise SystemExit("bench_startup: the `warren` command is not on PATH (run scripts/setup)")
    with tempfile.TemporaryDirectory(prefix="warren-bench-", dir="/var/tmp") as tmp:
        base = Path(tmp)
        os.environ["XDG_STATE_HOME"] = str(base / "state")
        ws = base / "ws"
        ws.mkdir()
        spec = PolicySpec(workspace=str(ws))
        box = Sandbox.create(spec, name="bench")
        try:
            cases: dict[str, Callable[[], None]] = {
                "/bin/true": _run(["/bin/true"], ws),
                "bwrap ... true": _run([*BWRAP, "true"], ws),
                "warren run -- true (CLI)": _run([warren_cli, "run", "--", "true"], ws),
                "warren exec NAME true (CLI)": _run([warren_cli, "exec", "bench", "true"], ws),
            }
            samples: dict[str, list[float]] = {k: [] for k in cases}
            for _ in range(3):
                for fn in cases.values():
                    fn()
            for _ in range(args.runs):
                for label, fn in cases.items():
                    samples[label].append(_time(fn))
            print(f"whole commands, {args.runs} interleaved runs ({os.uname().release}, uid {os.getuid()})")
            for label in cases:
                print(_line(label, samples[label]))

            paced, back_to_back, host = [], [], []
            for _ in range(args.runs):
                host.append(_time(lambda: subprocess.run(["true"])))
                time.sleep(0.01)  # an agent reads the output before its next command
                paced.append(_time(lambda: box.exec(["true"])))
            for _ in range(args.runs):
                back_to_back.append(_time(lambda: box.exec(["true"])))
            print("exec in a live sandbox (library)")
            print(_line("subprocess.run(['true'])", host))
            print(_line("Sandbox.exec, paced", paced))
            print(_line("Sandbox.exec, back to back", back_to_back))

            created = []
            for i in range(max(20, args.runs // 5)):
                t = time.perf_counter()
                sb = Sandbox.create(spec, name=f"c{i}")
                sb.exec(["true"])
                created.append(time.perf_counter() - t)
                sb.remove()
                time.sleep(0.01)
            print("a new sandbox")
            print(_line("Sandbox.create + first exec", created))
        finally:
            box.remove()


if __name__ == "__main__":
    main()
