"""Importing a docker-archive into the image store, next to ``tar -x`` of the same layers.

The archive (about --mb MiB, three layers as ``docker save``/``podman save`` write them,
uncompressed; ``--gzip`` compresses the layers) holds a tree shaped like a Debian root:
many small files, some large ones, directories, symlinks, hard links, and whiteouts in
the top layer. Side by side, median of --runs:

  tar -x          GNU tar extracting each layer tar into a fresh directory
                  (no checks, no digests: the floor)
  warren import   ImageStore.import_archive into an empty store: digests verified,
                  every entry checked, written beneath the layer's descriptor

and the ratio of the two, in wall-clock time and in CPU time (user + system: the
steadier figure on a busy machine). The target is at most 2x. Each side starts after
``sync``: the other's data still being written back slows file creation on ext4 by up
to 20x, which would make the figure say which side ran second.

Run: python bench/bench_images.py [--mb 200] [--runs 3] [--gzip] [--layer ROOTFS.tar]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

from warren.images.store import ImageStore


def _layer(rng: random.Random, budget: int, prefix: str, whiteouts: bool = False) -> bytes:
    out = io.BytesIO()
    blob = os.urandom(1 << 20)
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tf:

        def add(
            name: str, kind: bytes = tarfile.REGTYPE, size: int = 0, link: str = "", mode: int = 0o644
        ) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime, info.linkname = kind, mode, 1_700_000_000, link
            data = None
            if kind == tarfile.REGTYPE:
                info.size = size
                data = io.BytesIO((blob * (size // len(blob) + 1))[:size])
            tf.addfile(info, data)

        used, n = 0, 0
        while used < budget:
            d = f"{prefix}/d{n // 40}"
            if n % 40 == 0:
                add(d, tarfile.DIRTYPE, mode=0o755)
            # mostly small files, as in /usr (a Debian root: ~9000 files in 170 MiB)
            small = rng.random() < 0.997
            size = int(rng.paretovariate(1.1) * 2048) if small else rng.randrange(1 << 20, 8 << 20)
            size = min(size, budget - used)
            add(f"{d}/f{n}", size=size, mode=0o755 if n % 7 == 0 else 0o644)
            if n % 25 == 0:
                add(f"{d}/l{n}", tarfile.SYMTYPE, link=f"f{n}")
            if n % 50 == 0:
                add(f"{d}/h{n}", tarfile.LNKTYPE, link=f"{d}/f{n}")
            used += size
            n += 1
        if whiteouts:
            for i in range(0, 200, 3):
                add(f"base/d{i // 40}/.wh.f{i}")
            add("base/d1/.wh..wh..opq")
    return out.getvalue()


def _archive(path: Path, layers: list[bytes], compress: bool) -> Path:
    diff_ids = ["sha256:" + hashlib.sha256(layer).hexdigest() for layer in layers]
    blobs = [gzip.compress(layer, 1) if compress else layer for layer in layers]
    rootfs = {"type": "layers", "diff_ids": diff_ids}
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {}, "rootfs": rootfs}).encode()
    cfg_name = hashlib.sha256(config).hexdigest() + ".json"
    names = [hashlib.sha256(b).hexdigest() + ".tar" for b in blobs]
    manifest = json.dumps([{"Config": cfg_name, "RepoTags": ["bench:latest"], "Layers": names}]).encode()
    with tarfile.open(path, "w") as tf:
        for name, data in [("manifest.json", manifest), (cfg_name, config), *zip(names, blobs, strict=True)]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _median(xs: list[float]) -> str:
    return f"{statistics.median(xs):7.2f} s"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--gzip", action="store_true", help="gzip the layers (podman save --compress does)")
    ap.add_argument("--layer", type=Path, help="a real root filesystem tar (mmdebstrap's) as the one layer")
    args = ap.parse_args()
    rng = random.Random(26)
    total = args.mb << 20
    with tempfile.TemporaryDirectory(prefix="warren-bench-images-", dir="/var/tmp") as tmp:
        base = Path(tmp)
        if args.layer is not None:
            layers = [args.layer.read_bytes()]
        else:
            layers = [
                _layer(rng, total * 75 // 100, "base"),
                _layer(rng, total * 20 // 100, "usr"),
                _layer(rng, total * 5 // 100, "top", whiteouts=True),
            ]
        blobs = base / "layers"
        blobs.mkdir()
        layer_files = []
        for i, layer in enumerate(layers):
            f = blobs / f"{i}.tar"
            f.write_bytes(gzip.compress(layer, 1) if args.gzip else layer)
            layer_files.append(f)
        archive = _archive(base / "image.tar", layers, args.gzip)
        entries = 0
        for layer in layers:
            with tarfile.open(fileobj=io.BytesIO(layer)) as tf:
                entries += len(tf.getmembers())
        print(
            f"archive: {archive.stat().st_size / (1 << 20):.0f} MiB, {len(layers)} layers, {entries} entries"
            f"{', gzip' if args.gzip else ''}; runs: {args.runs}"
        )
        tar_times, warren_times, tar_cpu, warren_cpu = [], [], [], []
        for run in range(args.runs):
            dest = base / f"tar{run}"
            # Each side starts with nothing of the other's waiting to be written: on ext4 a
            # file's creation waits for the journal while ~200 MiB of the other's data is
            # written back (measured: 0.6 ms per create then, 30 us without; either side
            # measured right after the other took up to 3x as long).
            os.sync()
            start, cpu = time.perf_counter(), _children_cpu()
            for i, f in enumerate(layer_files):
                (dest / str(i)).mkdir(parents=True)
                subprocess.run(["tar", "-x", "-f", str(f), "-C", str(dest / str(i))], check=True)
            tar_times.append(time.perf_counter() - start)
            tar_cpu.append(_children_cpu() - cpu)
            shutil.rmtree(dest)
            store = ImageStore(base / f"store{run}")
            os.sync()
            start, cpu = time.perf_counter(), time.process_time()
            store.import_archive("bench", archive)
            warren_times.append(time.perf_counter() - start)
            warren_cpu.append(time.process_time() - cpu)
            store.remove("bench")
            shutil.rmtree(base / f"store{run}")
        t, w = statistics.median(tar_times), statistics.median(warren_times)
        tc, wc = statistics.median(tar_cpu), statistics.median(warren_cpu)
        print("                wall clock              CPU (user + system)")
        print(f"tar -x          {_median(tar_times)}               {_median(tar_cpu)}")
        ratios = f"{_median(warren_times)}   {w / t:5.2f}x   {_median(warren_cpu)}  {wc / tc:5.2f}x"
        print(f"warren import   {ratios}")
        print("target: warren import <= 2x tar -x (wall clock)")


if __name__ == "__main__":
    main()
