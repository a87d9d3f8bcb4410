"""Real developer tools in warren against the same work on the host, side by side.

    python bench/bench_tools.py [--rounds N]

Each round copies a small project into three fresh directories and runs the same steps
in each: on the host (plain subprocesses), in a live sandbox (``warren exec``, as an
agent issues commands) and one-shot (``warren run`` per step). The steps, all offline
(nothing but this machine is reached):

  git     init, add, commit, status, log, a local clone
  uv      a venv, and an install from a local wheel directory (uv's cache is the host's)
  pip     a venv, and the same install through pip
  npm     a local package packed and installed into an app (npm's cache is the host's)
  cargo   a new crate, built (offline; skipped where cargo is not installed)

Every step must succeed in all three places with the same result (the file it leaves
compared), or the bench stops and says which. A first round warms the caches and is
not counted. Medians over the rounds (modes interleaved), per step and in total, as
ratios to the host. Target (issue 22): the whole work within 1.10x of the host's time
in a live sandbox.
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
from pathlib import Path

WHEELS = Path(os.environ.get("WARREN_WHEELHOUSE", "/opt/warren-wheelhouse"))
PRESETS = ["--preset", "python", "--preset", "node", "--preset", "cargo", "--preset", "git"]

STEPS: dict[str, tuple[str, str]] = {
    # name: (shell script run in the project directory, a file whose content is its result)
    "git": (
        "git init -q -b main . && git add -A && git -c user.name=b -c user.email=b@x commit -qm one"
        " && git status --short > .git-status && git log --format=%s > result-git"
        " && git clone -q . clone && git -C clone log --format=%s >> result-git",
        "result-git",
    ),
    "uv": (
        "uv venv -q .venv-uv && uv pip install -q --offline --no-index --find-links {wheels}"
        " --python .venv-uv/bin/python idna && .venv-uv/bin/python -c 'import idna; print(idna.__name__)'"
        " > result-uv",
        "result-uv",
    ),
    "pip": (
        "python3 -m venv .venv-pip && .venv-pip/bin/pip install -q --disable-pip-version-check --no-index"
        " --find-links {wheels} idna"
        " && .venv-pip/bin/python -c 'import idna; print(idna.__name__)' > result-pip",
        "result-pip",
    ),
    "npm": (
        "cd lib && npm pack -q --pack-destination .. > /dev/null && cd ../app"
        " && npm install -q --offline --no-audit --no-fund ../benchlib-1.0.0.tgz > /dev/null"
        " && node -e 'console.log(require(\"benchlib\"))' > ../result-npm",
        "result-npm",
    ),
    "cargo": (
        "cargo new -q --vcs none hello && cd hello && cargo build -q --offline"
        " && ./target/debug/hello > ../result-cargo",
        "result-cargo",
    ),
}


def project(where: Path) -> Path:
    """A small project: a few source files, a node package and an app to install it into."""
    where.mkdir(parents=True)
    (where / "src").mkdir()
    for i in range(20):
        (where / "src" / f"m{i}.py").write_text(f"def f{i}():\n    return {i}\n")
    (where / "README.md").write_text("bench\n")
    (where / "lib").mkdir()
    lib = '{"name": "benchlib", "version": "1.0.0", "main": "index.js"}\n'
    (where / "lib" / "package.json").write_text(lib)
    (where / "lib" / "index.js").write_text("module.exports = 'benchlib works';\n")
    (where / "app").mkdir()
    (where / "app" / "package.json").write_text('{"name": "app", "version": "1.0.0", "private": true}\n')
    return where


def _check(done: subprocess.CompletedProcess[str], what: str) -> None:
    if done.returncode != 0:
        raise SystemExit(f"bench_tools: {what} failed ({done.returncode}):\n{done.stdout}{done.stderr}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    warren = shutil.which("warren")
    if warren is None:
        raise SystemExit("bench_tools: the `warren` command is not on PATH (run scripts/setup)")
    steps = {k: v for k, v in STEPS.items() if shutil.which(k) or k in ("pip",)}
    missing = sorted(set(STEPS) - set(steps))
    if not WHEELS.is_dir():
        raise SystemExit(
            f"bench_tools: no wheel directory at {WHEELS} (run scripts/setup, or set WARREN_WHEELHOUSE)"
        )
    # Workspaces beside the user's caches (under /var/tmp, not /tmp: a sandbox's /tmp is its own).
    base = Path(tempfile.mkdtemp(prefix="warren-bench-tools-", dir="/var/tmp"))
    times: dict[str, dict[str, list[float]]] = {m: {s: [] for s in steps} for m in ("host", "exec", "run")}
    print(
        f"bench_tools: {args.rounds} rounds, uid {os.getuid()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f}"
        + (f"; not installed, skipped: {', '.join(missing)}" if missing else "")
    )
    try:
        for r in range(args.rounds + 1):  # round 0 warms the caches: not counted
            dirs = {m: project(base / f"{r}-{m}") for m in times}
            box = f"bench-tools-{os.getpid()}-{r}"
            _check(
                subprocess.run(
                    [warren, "create", box, "-w", str(dirs["exec"]), *PRESETS], capture_output=True, text=True
                ),
                "warren create",
            )
            try:
                for name, (script, result) in steps.items():
                    line = script.format(wheels=WHEELS)
                    runs = {
                        "host": (["sh", "-c", line], dirs["host"]),
                        "exec": ([warren, "exec", box, "--", "sh", "-c", line], dirs["exec"]),
                        "run": (
                            [warren, "run", "-w", str(dirs["run"]), *PRESETS, "--", "sh", "-c", line],
                            dirs["run"],
                        ),
                    }
                    order = list(runs)[r % 3 :] + list(runs)[: r % 3]  # interleaved: no mode always first
                    for mode in order:
                        argv, cwd = runs[mode]
                        start = time.perf_counter()
                        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
                        if r:
                            times[mode][name].append(time.perf_counter() - start)
                        _check(done, f"{name} ({mode})")
                    outs = {m: (dirs[m] / result).read_text() for m in runs}
                    if len(set(outs.values())) != 1:
                        raise SystemExit(f"bench_tools: {name} left different results: {outs}")
            finally:
                subprocess.run([warren, "rm", "-f", box], capture_output=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"{'step':8} {'host':>10} {'warren exec':>14} {'warren run':>14}")
    total = {m: 0.0 for m in times}
    for name in steps:
        med = {m: statistics.median(times[m][name]) for m in times}
        for m in times:
            total[m] += med[m]
        print(
            f"{name:8} {med['host'] * 1000:8.0f} ms"
            f" {med['exec'] * 1000:8.0f} ms {med['exec'] / med['host']:4.2f}x"
            f" {med['run'] * 1000:7.0f} ms {med['run'] / med['host']:4.2f}x"
        )
    ratio = total["exec"] / total["host"]
    print(
        f"{'total':8} {total['host'] * 1000:8.0f} ms {total['exec'] * 1000:8.0f} ms {ratio:4.2f}x"
        f" {total['run'] * 1000:7.0f} ms {total['run'] / total['host']:4.2f}x"
    )
    print(f"live sandbox / host {ratio:.2f}x (target <= 1.10x: {'met' if ratio <= 1.10 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
