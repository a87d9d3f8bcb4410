"""Files API writes, side by side in one run.

  files.write of 4 KiB and of 50 MiB over an existing workspace file (all or nothing:
  a random-named file beside it, fsync, rename), next to the same bytes written on the
  host the same way (temp + fsync + rename) and in place (truncate + write, no fsync):
  what the sandbox round trip costs, and what the atomicity costs.

Run: python bench/bench_files.py [--runs 200] [--big-runs 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from warren import PolicySpec, Sandbox


def _median_ms(fn: Callable[[], object], runs: int) -> float:
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1000


def _host_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.bench-{os.urandom(8).hex()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)


def _host_in_place(path: Path, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write(data)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--big-runs", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="warren-bench-") as tmp:
        os.environ["XDG_STATE_HOME"] = str(Path(tmp) / "state")
        ws = Path(tmp) / "ws"
        ws.mkdir()
        with Sandbox.create(PolicySpec(workspace=str(ws)), name="bench") as sb:
            for size, runs, label in ((4096, args.runs, "4 KiB"), (50 << 20, args.big_runs, "50 MiB")):
                data = os.urandom(size)
                target = ws / "f.bin"
                target.write_bytes(data)
                rows: list[tuple[str, Callable[[], object]]] = [
                    ("files.write", lambda d=data: sb.files.write("f.bin", d)),  # type: ignore[misc]
                    ("host temp+fsync+rename", lambda t=target, d=data: _host_atomic(t, d)),  # type: ignore[misc]
                    ("host in place, no fsync", lambda t=target, d=data: _host_in_place(t, d)),  # type: ignore[misc]
                ]
                for name, fn in rows:
                    print(f"{label:7} {name:26} {_median_ms(fn, runs):8.2f} ms")


if __name__ == "__main__":
    main()
