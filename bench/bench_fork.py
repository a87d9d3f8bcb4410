"""Snapshot and fork of a sandbox on an image, side by side with a host-root create in
the same run (the baseline) and with the copy path (what a snapshot costs when a
process keeps it from freezing the layer: a background process holds it).

  create + remove                          host root (baseline) vs image
  for N MiB of changed files, on a small and a large image (unchanged data):
    snapshot                               without a copy (the layer frozen in memory)
    saved after                            until its copy is in the state directory (background)
    create from it, at once                the frozen layer given by descriptor
    fork (snapshot + create)               without a copy
    snapshot with a process running        the copy path, paused

Target (issue 26): fork of 1 GiB changed <= 200 ms, independent of the image's size.
Run: python bench/bench_fork.py [--changed 16,256,1024] [--large-mib 512] [--runs 5]
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

TOOLS = ("sh", "dd", "cat", "ls", "rm", "mkdir", "stat", "true", "sleep")


def _image(root: Path, large_mib: int, files: int) -> None:
    for d in ("usr/bin", "etc", "root", "tmp", "opt"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "bin").symlink_to("usr/bin")
    libs: set[str] = set()
    for tool in TOOLS:
        path = os.path.realpath(shutil.which(tool) or tool)
        shutil.copy2(path, root / "usr/bin" / tool)
        out = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
        libs |= {p for p in out.split() if p.startswith("/")}
    for lib in libs:
        dest = root / lib.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(lib), dest)
    if large_mib:
        subprocess.run(
            ["dd", "if=/dev/urandom", f"of={root}/opt/blob", "bs=1M", f"count={large_mib}", "status=none"],
            check=True,
        )
        many = root / "opt/many"
        many.mkdir()
        for n in range(files):
            (many / f"f{n}").write_text(str(n))


def _median(fn: Callable[[], object], runs: int) -> float:
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def _saved(snap_id: str) -> None:
    while not next(s for s in Sandbox.snapshots() if s.id == snap_id).saved:
        time.sleep(0.005)


def _sizes(image: str, changed: int, runs: int) -> dict[str, float]:
    spec = PolicySpec(image=image, workspace="none", disk=f"{max(3, changed * 3 // 1024 + 1)}G")
    out: dict[str, list[float]] = {k: [] for k in ("snapshot", "saved", "create", "fork", "copy")}
    for _ in range(runs):
        with Sandbox.create(spec) as s:
            s.exec(["sh", "-c", f"dd if=/dev/urandom of=/root/big bs=1M count={changed} status=none"])
            t = time.perf_counter()
            snap = s.snapshot()
            out["snapshot"].append(time.perf_counter() - t)
            assert not snap.saved, "the snapshot was copied: nothing should run in the sandbox here"
            t2 = time.perf_counter()
            with Sandbox.create(PolicySpec(from_snapshot=snap.id, workspace="none")) as f:
                out["create"].append(time.perf_counter() - t2)
                assert f.exec(["stat", "-c", "%s", "/root/big"]).stdout == f"{changed << 20}\n".encode()
            _saved(snap.id)
            out["saved"].append(time.perf_counter() - t)
            t = time.perf_counter()
            with s.fork() as f2:
                out["fork"].append(time.perf_counter() - t)
                del f2
            held = s.spawn(["sh", "-c", "exec 3>>/root/log; exec sleep 600"])
            time.sleep(0.2)
            t = time.perf_counter()
            copied = s.snapshot()
            out["copy"].append(time.perf_counter() - t)
            assert copied.saved
            held.kill()
        for sn in reversed(Sandbox.snapshots()):
            Sandbox.remove_snapshot(sn.id)
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--changed", default="16,256,1024", help="MiB of changed files, comma-separated")
    ap.add_argument("--large-mib", type=int, default=512, help="unchanged data in the large image (MiB)")
    ap.add_argument("--large-files", type=int, default=20000, help="... and small files in it")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="warren-bench-", dir="/var/tmp") as tmp:
        os.environ["XDG_STATE_HOME"] = str(Path(tmp) / "state")
        small, large = Path(tmp) / "small", Path(tmp) / "large"
        _image(small, 0, 0)
        _image(large, args.large_mib, args.large_files)
        ws = Path(tmp) / "ws"
        ws.mkdir()
        Sandbox.create(PolicySpec(workspace=str(ws))).remove()  # the supervisor warm
        host = _median(lambda: Sandbox.create(PolicySpec(workspace=str(ws))).remove(), args.runs)
        on_image = _median(
            lambda: Sandbox.create(PolicySpec(image=str(small), workspace="none")).remove(), args.runs
        )
        print(
            f"create + remove: host root {host * 1000:.1f} ms (baseline), image {on_image * 1000:.1f} ms "
            f"({on_image / host:.2f}x)"
        )
        print(
            f"{'image':<7}{'changed':>9}{'snapshot':>10}{'saved':>9}{'create':>9}{'fork':>9}"
            f"{'fork/base':>10}{'copy path':>11}"
        )
        for name, image in (("small", small), (f"+{args.large_mib}M", large)):
            for mib in (int(x) for x in args.changed.split(",")):
                r = _sizes(str(image), mib, args.runs)
                print(
                    f"{name:<7}{mib:>6} MiB{r['snapshot'] * 1000:>8.1f}ms{r['saved'] * 1000:>7.0f}ms"
                    f"{r['create'] * 1000:>7.1f}ms{r['fork'] * 1000:>7.1f}ms{r['fork'] / host:>9.2f}x"
                    f"{r['copy'] * 1000:>9.0f}ms"
                )


if __name__ == "__main__":
    main()
