"""One-shot sandbox latency and uv fidelity cost, side by side in one run.

    python bench/bench_run.py [--runs N]

Prints the median wall time of `true` under warren.run (library, planning included),
`warren run` (CLI, a fresh process each time; also with `--network allow --allow-host`,
an agent's install through the proxy) and bubblewrap
(`bwrap --ro-bind / / --dev /dev --proc /proc --unshare-all --die-with-parent true`),
then a warm-cache `uv pip install` inside warren against the same install on the host.
Targets (issue 2): library/bwrap <= 1.0, CLI within 50 ms, uv within 1.1x of the host.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import warren
from warren.policy import PolicySpec

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


def timed(fn: Callable[[], object], runs: int, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def ms(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1e3:8.2f} ms"


def wheel(dest: Path) -> None:
    """A pure-Python package of 200 modules (about 1 MiB), built by hand."""
    name, dist = "benchpkg", "benchpkg-1.0.dist-info"
    files = {f"{name}/__init__.py": ""}
    for i in range(200):
        files[f"{name}/m{i}.py"] = f"DATA = {'x' * 5000!r}\n"
    files[f"{dist}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
    files[f"{dist}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    files[f"{dist}/RECORD"] = "".join(f"{p},,\n" for p in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(dest / "benchpkg-1.0-py3-none-any.whl", "w") as zf:
        for p, text in files.items():
            zf.writestr(p, text)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="warren-bench.", dir="/var/tmp"))
    try:
        ws = base / "ws"
        cache = base / "uv-cache"
        wheels = base / "wheels"
        for d in (ws, cache, wheels):
            d.mkdir()
        os.chdir(ws)
        policy = PolicySpec(workspace=str(ws), write=[str(cache)])
        cli = [shutil.which("warren") or "warren", "run", "--", "true"]
        lib = timed(lambda: warren.run(["true"], policy=policy), args.runs)
        bw = timed(lambda: subprocess.run([*BWRAP, "true"], check=True), args.runs)
        plain = timed(lambda: subprocess.run(["true"], check=True), args.runs)
        cli_t = timed(lambda: subprocess.run(cli, check=True), max(20, args.runs // 5))
        allow = [cli[0], "run", "--network", "allow", "--allow-host", "pypi.org", "--", "true"]
        allow_t = timed(lambda: subprocess.run(allow, check=True), max(20, args.runs // 5))
        py_t = timed(
            lambda: subprocess.run([sys.executable, "-c", "pass"], check=True), max(20, args.runs // 5)
        )
        print(f"`true`, median of {args.runs} runs ({os.uname().release}, uid {os.getuid()})")
        print(f"  plain subprocess.run    {ms(plain)}")
        print(f"  bwrap (baseline)        {ms(bw)}")
        ratio = statistics.median(lib) / statistics.median(bw)
        print(f"  warren.run (library)    {ms(lib)}   ratio to bwrap {ratio:.2f}  (target <= 1.00)")
        over = (statistics.median(cli_t) - statistics.median(bw)) * 1e3
        print(f"  warren run (CLI)        {ms(cli_t)}   +{over:.1f} ms over bwrap (see bench_startup.py)")
        over = (statistics.median(allow_t) - statistics.median(bw)) * 1e3
        print(f"  ... --network allow     {ms(allow_t)}   +{over:.1f} ms over bwrap (the proxy's helper too)")
        print(f"  python -c pass          {ms(py_t)}   (interpreter start, part of the CLI figure)")

        uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
        wheel(wheels)
        env = {**os.environ, "UV_CACHE_DIR": str(cache), "UV_NO_PROGRESS": "1"}
        install = [uv, "pip", "install", "-q", "--offline", "--find-links", str(wheels), "benchpkg"]
        subprocess.run(
            [uv, "venv", "-q", "--python", "/usr/bin/python3", str(base / "warm")], env=env, check=True
        )
        subprocess.run([*install, "--python", str(base / "warm/bin/python")], env=env, check=True)
        host, inside = [], []
        uv_env = {"UV_CACHE_DIR": str(cache), "UV_NO_PROGRESS": "1"}
        inner = PolicySpec(workspace=str(ws), write=[str(cache)], env=uv_env)
        for i in range(10):
            for where, sink in (("host", host), ("warren", inside)):
                venv = ws / f"v-{where}-{i}"
                subprocess.run(
                    [uv, "venv", "-q", "--python", "/usr/bin/python3", str(venv)], env=env, check=True
                )
                argv = [*install, "--python", str(venv / "bin/python")]
                t = time.perf_counter()
                if where == "host":
                    subprocess.run(argv, env=env, check=True)
                else:
                    r = warren.run(argv, policy=inner)
                    assert r.exit_code == 0, r.stderr
                    assert b"falling back" not in r.stderr.lower()
                sink.append(time.perf_counter() - t)
        nlink = next(ws.glob("v-warren-0/lib/python3*/site-packages/benchpkg/m0.py")).stat().st_nlink
        print("warm-cache `uv pip install` of a 200-module package, median of 10")
        print(f"  host                    {ms(host)}")
        r = statistics.median(inside) / statistics.median(host)
        print(
            f"  inside warren           {ms(inside)}   ratio {r:.2f}  (target <= 1.10); "
            f"nlink of an installed file: {nlink}"
        )
    finally:
        os.chdir("/")
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
