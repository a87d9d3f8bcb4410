"""Start-up cost of finding files hardlinked from outside the writable roots.

A workspace whose venv is hardlinked from a uv-like cache of --files files (both
writable roots, so every link is explained), side by side in one run:

  the scan alone (server.links.LinkScanner, the cache as a shared root, as the
  supervisor calls it): cold (first scan) and warm (again)
  the copy that gives --outside workspace files linked from outside an inode of their
  own (server.unshare, once per file: the next runs find plain files)
  warren.run(["true"]) with that workspace and cache: the first run of a fresh
  supervisor with no saved memory (cold scan), the first run of a supervisor that
  loaded its predecessor's memory, and the median of later runs (warm), next to the
  same runs with an empty workspace (no scan work)

Run: python bench/bench_links.py [--files 50000] [--runs 30] [--outside 5000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import warren
from warren import PolicySpec
from warren.server import unshare
from warren.server.links import LinkScanner


def _tree(base: Path, files: int) -> tuple[Path, Path]:
    cache, ws = base / "uv-cache", base / "ws"
    per_dir = 100
    for d in range(files // per_dir):
        src = cache / "archive-v0" / f"pkg{d}"
        dst = ws / ".venv" / "lib" / "site-packages" / f"pkg{d}"
        src.mkdir(parents=True)
        dst.mkdir(parents=True)
        for f in range(per_dir):
            (src / f"m{f}.py").write_text("x = 1\n")
            os.link(src / f"m{f}.py", dst / f"m{f}.py")
    return ws, cache


def _ms(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1000:8.2f} ms"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=50_000)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--outside", type=int, default=5000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="warren-bench-links-", dir="/var/tmp") as tmp:
        base = Path(tmp)
        os.environ["XDG_STATE_HOME"] = str(base / "state")
        ws, cache = _tree(base, args.files)
        empty = base / "empty"
        empty.mkdir()
        roots = [str(ws), str(cache)]
        scanner = LinkScanner()
        t = time.perf_counter()
        found = scanner.scan(roots, [str(cache)])
        cold = time.perf_counter() - t
        warm = []
        for _ in range(args.runs):
            t = time.perf_counter()
            scanner.scan(roots, [str(cache)])
            warm.append(time.perf_counter() - t)
        print(
            f"{args.files} cache files hardlinked into the workspace venv ({len(found)} linked from outside)"
        )
        print(f"  scan alone, cold                  {cold * 1000:8.2f} ms")
        print(f"  scan alone, warm                  {_ms(warm)}")
        if args.outside:
            out, mine = base / "outside", base / "ws-linked"
            out.mkdir()
            mine.mkdir()
            for i in range(args.outside):
                (out / f"o{i}").write_bytes(b"x" * 4096)
                os.link(out / f"o{i}", mine / f"o{i}")
            linked = LinkScanner().scan([str(mine)])
            t = time.perf_counter()
            unshare.own_inodes(str(mine), [(o.path, o.dev, o.ino) for o in linked])
            took = time.perf_counter() - t
            print(
                f"  own inodes for {len(linked)} files of 4 KiB linked from outside (once): "
                f"{took * 1000:8.2f} ms ({took / max(len(linked), 1) * 1e6:.0f} us per file)"
            )

        spec = PolicySpec(workspace=str(ws), write=[str(cache)])
        empty_spec = PolicySpec(workspace=str(empty))

        def first_run(s: PolicySpec) -> float:
            subprocess.run(["warren", "shutdown"], check=True, capture_output=True)
            t = time.perf_counter()
            warren.run(["true"], s)
            return time.perf_counter() - t

        first_empty = first_run(empty_spec)
        first = first_run(spec)  # no saved memory yet: a cold scan
        restart = first_run(spec)  # the previous supervisor saved its memory on exit
        big = [0.0] * args.runs
        small = [0.0] * args.runs
        for i in range(args.runs):
            t = time.perf_counter()
            warren.run(["true"], spec)
            big[i] = time.perf_counter() - t
            t = time.perf_counter()
            warren.run(["true"], empty_spec)
            small[i] = time.perf_counter() - t
        print("warren.run(['true'])")
        print(f"  empty workspace                   {_ms(small)}")
        print(f"  workspace + cache, warm           {_ms(big)}")
        print("  first run of a new supervisor (its start included):")
        print(f"    empty workspace                 {first_empty * 1000:8.2f} ms")
        print(f"    workspace + cache, cold scan    {first * 1000:8.2f} ms")
        print(f"    workspace + cache, saved memory {restart * 1000:8.2f} ms")


if __name__ == "__main__":
    main()
