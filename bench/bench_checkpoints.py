"""Checkpoints and rollback of a review workspace against a plain exec, in one run, at
1k, 10k and 100k files (issue 38: a checkpoint <= 15 ms and a rollback <= 10 ms
whatever the workspace's size).

For each size: a workspace of that many small files on the host, a review sandbox on
it, and --runs rounds of: a command that changes one file (the checkpoint taken before
each command is of a clean upper then: recorded, not frozen), ``Sandbox.checkpoint``
(the change frozen), ``exec true`` twice (the first right after the checkpoint, whose
PID 1 forks its helpers again; the second a plain exec), ``Sandbox.rollback`` (to that
checkpoint). Then --runs commands that each change a file, with the checkpoint taken
before each frozen (what an agent pays per command). Times are the library's round
trips (client, supervisor, PID 1), medians. --changed writes that many MiB in the
workspace first (1 GiB by default; frozen by the first checkpoint; a checkpoint counts
the blocks of what changed since the last one, a stat per entry, and reads no data).
The load is printed before and after: the figures are the ratios to the plain exec.

--pace S (after the table, per size): --runs commands that each change a file, one
every S seconds as an agent's come, beside the same command in a plain (not review)
sandbox on a workspace of the same size, in the same cycles: once a command ended and
nobody waits, its changes are frozen ahead (``checkpoints.freeze_ahead``), so the next
command's checkpoint is only recorded and it finds a spare ready.

--deep N (after the table): a review sandbox that takes N checkpoints, one before
each of N commands that change a small file (its frozen layers merged into bases every
32), then rolls back to the last checkpoint (the workspace stands on a base and a few
layers) and to the middle one (below the bases kept: one is built while it waits),
beside a plain exec; repeated --deep-runs times on fresh sandboxes.

--image NAME_OR_DIR (after the table): a sandbox on that image, --runs rounds of a
command that changes a file of its root, a checkpoint of the root and a rollback to
it, beside a plain exec.

Run: python bench/bench_checkpoints.py [--sizes 1000,10000,100000] [--runs 15] [--changed 1024]
     [--pace 1] [--deep 1000] [--deep-runs 3] [--image NAME_OR_DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def _fill(ws: Path, count: int) -> None:
    per_dir = 1000
    for d in range((count + per_dir - 1) // per_dir):
        sub = ws / f"d{d:04d}"
        sub.mkdir()
        for i in range(min(per_dir, count - d * per_dir)):
            (sub / f"f{i:04d}.txt").write_text(f"{d} {i}\n")


def _ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1e3:6.1f}"


def _deep(sandbox: Any, build: Any, spec: Any, tmp: Path, count: int, runs: int) -> None:
    print(f"{count} checkpoints, {runs} runs: exec true, each command + its checkpoint, rollback to")
    print("  the last, rollback to the middle (ms, medians)")
    plain: list[float] = []
    step: list[float] = []
    last: list[float] = []
    middle: list[float] = []
    for run in range(runs):
        ws = tmp / f"deep{run}"
        ws.mkdir()
        sb = sandbox.create(build(spec(workspace=str(ws), review=True)), name=f"bench-deep-{run}")
        try:
            for i in range(count):
                t = time.perf_counter()
                sb.exec(["sh", "-c", f"echo {i} > f{i % 20}"])
                step.append(time.perf_counter() - t)
            for _ in range(5):
                t = time.perf_counter()
                sb.exec(["true"])
                plain.append(time.perf_counter() - t)
            points = sb.checkpoints()
            t = time.perf_counter()
            sb.rollback(points[-1].id)
            last.append(time.perf_counter() - t)
            t = time.perf_counter()
            sb.rollback(points[len(points) // 2].id)
            middle.append(time.perf_counter() - t)
        finally:
            sb.remove()
    print(f"  exec {_ms(plain)}  command+cp {_ms(step)}  last {_ms(last)}  middle {_ms(middle)}")


def _image(sandbox: Any, spec: Any, image: str, runs: int) -> None:
    plain: list[float] = []
    taking: list[float] = []
    back: list[float] = []
    with sandbox.create(spec(image=image, workspace="none")) as sb:
        for i in range(runs):
            sb.exec(["sh", "-c", f"echo {i} > /root/bench.txt"])
            t = time.perf_counter()
            sb.exec(["sh", "-c", ":"])  # an image may have no true
            plain.append(time.perf_counter() - t)
            t = time.perf_counter()
            point = sb.checkpoint()
            taking.append(time.perf_counter() - t)
            sb.exec(["sh", "-c", "rm -f /root/bench.txt"])
            t = time.perf_counter()
            sb.rollback(point.id)
            back.append(time.perf_counter() - t)
            if len(sb.checkpoints()) >= 24:  # 32 frozen layers at most: start again
                sb.rollback(sb.checkpoints()[0].id)
    print(f"image {image}: exec sh -c : {_ms(plain)}  checkpoint {_ms(taking)}  rollback {_ms(back)}")


def _paced(
    sb: Any, sandbox: Any, plain_policy: Any, args: argparse.Namespace
) -> tuple[list[float], list[float]]:
    """--runs commands that change a file, each every --pace seconds, in ``sb`` (a review
    sandbox) and in a plain sandbox on the same workspace, in turn."""
    other = sandbox.create(plain_policy)
    reviewed: list[float] = []
    plain: list[float] = []
    try:
        for i in range(args.runs):
            for box, into in ((sb, reviewed), (other, plain)):
                time.sleep(args.pace)
                t = time.perf_counter()
                box.exec(["sh", "-c", f"echo {i} > d0000/f0002.txt"])
                into.append(time.perf_counter() - t)
    finally:
        other.remove()
    return reviewed, plain


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--changed", type=int, default=1024, help="MiB written in the workspace first")
    ap.add_argument("--pace", type=float, default=0, help="seconds between the paced commands (0: none)")
    ap.add_argument("--deep", type=int, default=0, help="checkpoints taken before the deep rollbacks")
    ap.add_argument("--deep-runs", type=int, default=3)
    ap.add_argument("--image", default="", help="an image (a store name or a root directory)")
    args = ap.parse_args()
    tmp_dir = tempfile.TemporaryDirectory(prefix="bench-cp-", dir="/var/tmp", ignore_cleanup_errors=True)
    with tmp_dir as tmp:
        os.environ["XDG_STATE_HOME"] = str(Path(tmp) / "state")
        from warren.client.sandbox import Sandbox
        from warren.policy import PolicySpec, build

        print(f"uid {os.getuid()}, {args.runs} runs, load {os.getloadavg()[0]:.1f}, medians in ms")
        print("   files  exec true  checkpoint  rollback  exec after cp  exec(write)+cp")
        paced: list[tuple[int, list[float], list[float]]] = []
        for size in (int(s) for s in args.sizes.split(",") if s):
            ws = Path(tmp) / f"ws{size}"
            ws.mkdir()
            _fill(ws, size)
            sb = Sandbox.create(build(PolicySpec(workspace=str(ws), review=True)), name=f"bench-cp-{size}")
            try:
                if args.changed:
                    sb.exec(["sh", "-c", f"head -c {args.changed << 20} /dev/urandom > big.bin"])
                plain: list[float] = []
                after: list[float] = []
                taking: list[float] = []
                back: list[float] = []
                per_command: list[float] = []
                for i in range(args.runs):
                    sb.exec(["sh", "-c", f"echo {i} > d0000/f0000.txt"])
                    t = time.perf_counter()
                    point = sb.checkpoint()
                    taking.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    sb.exec(["true"])
                    after.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    sb.exec(["true"])
                    plain.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    sb.rollback(point.id)
                    back.append(time.perf_counter() - t)
                for i in range(args.runs):
                    t = time.perf_counter()
                    sb.exec(["sh", "-c", f"echo {i} > d0000/f0001.txt"])
                    per_command.append(time.perf_counter() - t)
                print(
                    f"{size:8d}  {_ms(plain)}     {_ms(taking)}     {_ms(back)}    {_ms(after)}"
                    f"         {_ms(per_command)}"
                )
                if args.pace:
                    paced.append((size, *_paced(sb, Sandbox, build(PolicySpec(workspace=str(ws))), args)))
            finally:
                sb.remove()
        for size, reviewed, plain_box in paced:
            print(
                f"{size:8d} files, a command every {args.pace:g} s: review sandbox {_ms(reviewed)} ms, "
                f"plain sandbox {_ms(plain_box)} ms "
                f"({statistics.median(reviewed) / statistics.median(plain_box):.2f}x)"
            )
        if args.image:
            _image(Sandbox, PolicySpec, args.image, args.runs)
        if args.deep:
            _deep(Sandbox, build, PolicySpec, Path(tmp), args.deep, args.deep_runs)
        print(f"load {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
