"""Sandboxes on an image against sandboxes on the host's root, side by side in one run.

  create + remove of a long-lived sandbox (supervisor warm)        host root vs image
  a file-heavy workload: untar a tree of many small files           host workspace vs the image's layer
  2000 renames of files (each a broker notification on an image)   host root vs image
  rename of a big directory of the image (a move of its tree)        vs the same rename of an upper dir
  snapshot and fork of a sandbox with N MiB of changed files         (the image's size does not enter)

Run: python bench/bench_envroot.py --image NAME|/root/dir [--runs 10] [--changed 1024]
The image needs sh, tar, dd and python3 (a Debian minbase with python3 does).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from warren import PolicySpec, Sandbox


def _median(fn: Callable[[], object], runs: int) -> float:
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def _row(what: str, host: float, image: float) -> None:
    print(
        f"{what:<44} host {host * 1000:8.1f} ms   image {image * 1000:8.1f} ms   ratio {image / host:5.2f}x"
    )


def _timed(sb: Sandbox, script: str) -> float:
    """Seconds the script itself took inside (exec overhead excluded)."""
    got = sb.exec(["sh", "-c", f"s=$(date +%s%N); {script} >/dev/null 2>&1; e=$(date +%s%N); echo $((e-s))"])
    return int(got.stdout.decode().split()[-1]) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", required=True)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--changed", type=int, default=1024, help="MiB of changed files for snapshot/fork")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="warren-bench-", dir="/var/tmp") as tmp:
        os.environ["XDG_STATE_HOME"] = str(Path(tmp) / "state")
        ws = Path(tmp) / "ws"
        ws.mkdir()
        tree = Path(tmp) / "tree.tar"
        subprocess.run(["tar", "-cf", str(tree), "-C", "/usr/lib", "python3"], check=True)
        files = int(
            subprocess.run(["tar", "-tf", str(tree)], capture_output=True, text=True).stdout.count("\n")
        )
        host_spec = PolicySpec(workspace=str(ws), read=[str(tree)])
        image_spec = PolicySpec(image=args.image, workspace="none", read=[str(tree)], disk="3G")
        Sandbox.create(host_spec).remove()  # the supervisor warm

        create_host = _median(lambda: Sandbox.create(host_spec).remove(), args.runs)
        create_image = _median(lambda: Sandbox.create(image_spec).remove(), args.runs)
        _row("create + remove", create_host, create_image)

        with Sandbox.create(host_spec) as h, Sandbox.create(image_spec) as i:
            untar = f"mkdir -p {{d}} && tar -xf {tree} -C {{d}}"
            th = statistics.median(_timed(h, untar.format(d=f"{ws}/u{n}")) for n in range(3))
            ti = statistics.median(_timed(i, untar.format(d=f"/root/u{n}")) for n in range(3))
            _row(f"untar {files} files (/usr/lib/python3)", th, ti)

            loop = (
                "python3 -c \"import os\nos.makedirs('{d}', exist_ok=True)\nopen('{d}/a','w').close()\n"
                "for n in range(1000): os.rename('{d}/a', '{d}/b'); os.rename('{d}/b', '{d}/a')\""
            )
            # In /tmp (a tmpfs in both): the difference is the broker's notification.
            rh = statistics.median(_timed(h, loop.format(d=f"/tmp/r{n}")) for n in range(3))
            ri = statistics.median(_timed(i, loop.format(d=f"/tmp/r{n}")) for n in range(3))
            _row("2000 renames of a file in /tmp", rh, ri)

            lower = _timed(i, "mv /usr/share /usr/share2")
            count = (
                i.exec(["sh", "-c", "find /usr/share2 | wc -l; du -sm /usr/share2 | cut -f1"])
                .stdout.decode()
                .split()
            )
            upper = _timed(i, "cp -a /usr/share2 /srv/up && mv /srv/up /srv/up2")
            copy = _timed(i, "cp -a /usr/share2 /srv/cp2")
            print(
                f"rename of the image's /usr/share ({count[0]} entries, {count[1]} MiB): "
                f"{lower * 1000:.0f} ms "
                f"(a directory made in the layer, renamed: copy {copy * 1000:.0f} ms, copy+rename "
                f"{upper * 1000:.0f} ms)"
            )

        for changed in (16, args.changed):
            with Sandbox.create(image_spec) as s:
                s.exec(["sh", "-c", f"dd if=/dev/urandom of=/root/big bs=1M count={changed} 2>/dev/null"])
                t = time.perf_counter()
                snap = s.snapshot()
                took = time.perf_counter() - t
                t = time.perf_counter()
                with Sandbox.create(PolicySpec(from_snapshot=snap.id, workspace="none")) as f:
                    restored = time.perf_counter() - t
                    assert f.exec(["sh", "-c", "test -s /root/big"]).exit_code == 0
                t = time.perf_counter()
                with s.fork() as f2:
                    forked = time.perf_counter() - t
                    del f2
                print(
                    f"{changed:5d} MiB changed: snapshot {took * 1000:7.0f} ms "
                    f"(paused {snap.seconds * 1000:.0f} ms, {'copied' if snap.saved else 'frozen'})"
                    f"   create from it {restored * 1000:6.0f} ms"
                    f"   fork (snapshot + create) {forked * 1000:7.0f} ms"
                )
            for sn in reversed(Sandbox.snapshots()):
                Sandbox.remove_snapshot(sn.id)


if __name__ == "__main__":
    main()
