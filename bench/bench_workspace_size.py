"""Launch cost against the workspace's size: a 100,000-file workspace next to an empty one.

The workspace is what JavaScript projects hold: one repository with a ``node_modules``
tree (``--packages`` packages of 10 directories of 10 files each; 1,000 by default:
100,000 files, 11,000 directories); the empty one is a repository too. In the same run,
interleaved, the supervisor warm:

  bwrap ... true               in each workspace (the baseline: no per-file work)
  warren run -- true           in each workspace (CLI, whole process)
  Sandbox.create + first exec  in each workspace (then removed)

and the ratio of the big workspace to the empty one (target <= 1.2x). A large
workspace's hard-link walk runs beside the launch (``server.linkwalk``), and the first
command starts once it has ended; the bench times a writing open in the first command
against one in the next (they should cost the same: neither carries the walk's window
filter), in the same sandbox. ``--parts`` also
times the two walks a launch makes of the workspace, alone: the hard-link scan
(``server.links``, every file stat'ed) and the repository walk (``server.gitfind``,
every directory opened; its per-directory memory warm), in Python and natively
(``warren-walk``, which a launch uses, both walks in one pass). WARREN_NATIVE_WALK=0
times the launches with the Python walks. ``--mounts`` (as root) also times a launch in
the big workspace after a tmpfs was mounted and unmounted elsewhere (untimed): what a
container started beside, or a disk plugged in, does to the mount table; the launch
should cost what one without costs.

Run: python bench/bench_workspace_size.py [--packages 1000] [--runs 15] [--parts] [--mounts]
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

BWRAP = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-all"]
BWRAP += ["--die-with-parent"]


def _tree(ws: Path, packages: int) -> int:
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    files = 0
    for p in range(packages):
        for d in range(10):
            lib = ws / "node_modules" / f"pkg{p}" / f"lib{d}"
            lib.mkdir(parents=True)
            for f in range(10):
                (lib / f"f{f}.js").write_text("module.exports = 1\n")
                files += 1
    return files


def _ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3


def _time(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _cmd(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> Callable[[], None]:
    def go() -> None:
        subprocess.run(
            argv, cwd=cwd, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env
        )

    return go


def _create(ws: Path, env: dict[str, str] | None = None) -> Callable[[], None]:
    def go() -> None:
        saved = dict(os.environ)
        os.environ.update(env or {})  # another supervisor (its own state) for another setting
        try:
            box = Sandbox.create(PolicySpec(workspace=str(ws)))
            try:
                box.exec(["true"])
            finally:
                box.remove()
        finally:
            os.environ.clear()
            os.environ.update(saved)

    return go


def _mount_elsewhere(where: Path) -> Callable[[], None]:
    def go() -> None:
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(where)], check=True)
        subprocess.run(["umount", str(where)], check=True)

    return go


_OPENS = 20000
_OPEN_LOOP = (
    "import os,time\n"
    "open('bench-write-open.tmp','w').close()\n"  # the first waits for the walk, if it runs
    "t=time.perf_counter()\n"
    f"for _ in range({_OPENS}):\n"
    "    os.close(os.open('bench-write-open.tmp', os.O_WRONLY|os.O_TRUNC))\n"
    "print(time.perf_counter()-t)\n"
)


def _write_opens(ws: Path, runs: int) -> None:
    """The first command (asked for while the walk runs, started after it) against the
    next: the time of one writing open in each (medians of ``runs`` sandboxes)."""
    during: list[float] = []
    after: list[float] = []
    for _ in range(runs):
        box = Sandbox.create(PolicySpec(workspace=str(ws)))
        try:
            first = box.exec(["python3", "-c", _OPEN_LOOP])
            assert first.exit_code == 0, first
            time.sleep(0.1)  # the next spare, forked with today's filter
            second = box.exec(["python3", "-c", _OPEN_LOOP])
            assert second.exit_code == 0, second
            during.append(float(first.stdout) / _OPENS)
            after.append(float(second.stdout) / _OPENS)
        finally:
            box.remove()
    (ws / "bench-write-open.tmp").unlink(missing_ok=True)
    d, a = statistics.median(during) * 1e6, statistics.median(after) * 1e6
    diff = statistics.median(x - y for x, y in zip(during, after, strict=True)) * 1e6
    print(f"a writing open in the big workspace, {runs} sandboxes (medians; {_OPENS} opens each)")
    print(f"  the first command (asked for during the walk) {d:8.1f} us")
    print(f"  the next command                              {a:8.1f} us")
    print(f"  difference                                    {diff:8.1f} us per open (median of pairs)")


def _parts(ws: Path, runs: int) -> None:
    from warren._core import safepath, treewalk
    from warren.server import gitfind
    from warren.server.links import LinkScanner

    scanner, memory = LinkScanner(), {}  # type: ignore[var-annotated]
    times: dict[str, list[float]] = {
        k: [] for k in ("scan", "git", "native scan", "native git", "native both")
    }

    def walk(links: bool, git: bool) -> None:
        fd = safepath.open_dir(str(ws))
        try:
            tree = treewalk.walk(fd, links=links, git=git)
            assert tree is not None, "warren-walk is not installed (run scripts/setup)"
            if git:
                gitfind.find(fd, tree=tree)
        finally:
            os.close(fd)

    def python_git() -> None:
        fd = safepath.open_dir(str(ws))
        try:
            gitfind.find(fd, memory)
        finally:
            os.close(fd)

    for _ in range(runs):
        os.environ["WARREN_NATIVE_WALK"] = "0"
        times["scan"].append(_time(lambda: scanner.scan([str(ws)])))
        del os.environ["WARREN_NATIVE_WALK"]
        times["git"].append(_time(python_git))
        times["native scan"].append(_time(lambda: walk(True, False)))
        times["native git"].append(_time(lambda: walk(False, True)))
        times["native both"].append(_time(lambda: walk(True, True)))
    print("the walks alone, in the big workspace (medians)")
    print(f"  hard-link scan, Python (every file stat'ed)      {_ms(times['scan']):8.1f} ms")
    print(f"  repository walk, Python (every directory, warm)  {_ms(times['git']):8.1f} ms")
    print(f"  hard-link scan, native (warren-walk)             {_ms(times['native scan']):8.1f} ms")
    print(f"  repository walk, native                          {_ms(times['native git']):8.1f} ms")
    print(f"  both in one native pass (what a launch does)     {_ms(times['native both']):8.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--packages", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--parts", action="store_true", help="also time the launch's walks of the workspace")
    ap.add_argument(
        "--pace",
        type=float,
        default=0.0,
        help="seconds between two timed launches (an agent's pace: the sandbox booted ahead is ready); "
        "0, the default: back to back",
    )
    ap.add_argument(
        "--python-walk",
        action="store_true",
        help="also launch in the big workspace walked in Python (WARREN_NATIVE_WALK=0, its own supervisor)",
    )
    ap.add_argument(
        "--mounts",
        action="store_true",
        help="as root: also launch in the big workspace after a mount made and removed elsewhere",
    )
    args = ap.parse_args()
    if args.mounts and os.geteuid() != 0:
        raise SystemExit("bench_workspace_size: --mounts mounts a tmpfs on this machine: run it as root")
    warren_cli = shutil.which("warren")
    if warren_cli is None:
        raise SystemExit("bench_workspace_size: the `warren` command is not on PATH (run scripts/setup)")
    # The supervisor may still be stopping sandboxes booted ahead when its state goes.
    tmp_dir = tempfile.TemporaryDirectory(prefix="bench-ws-", dir="/var/tmp", ignore_cleanup_errors=True)
    with tmp_dir as tmp:
        base = Path(tmp)
        os.environ["XDG_STATE_HOME"] = str(base / "state")
        empty, big = base / "empty", base / "big"
        # A repository both (what an agent works in): the ratio is the size's alone, not
        # a repository's own cost (its git directory's store, its sync at the end).
        subprocess.run(["git", "init", "-q", str(empty)], check=True)
        files = _tree(big, args.packages)
        print(
            f"{files} files in {big}, {args.runs} interleaved runs "
            f"({f'{args.pace:g} s apart' if args.pace else 'back to back'}), uid {os.getuid()}, "
            f"load {os.getloadavg()[0]:.1f}"
        )
        cases: dict[str, Callable[[], None]] = {}
        for label, ws in (("empty", empty), ("big", big)):
            cases[f"bwrap ... true, {label}"] = _cmd([*BWRAP, "true"], ws)
            cases[f"warren run -- true, {label}"] = _cmd([warren_cli, "run", "--", "true"], ws)
            cases[f"create + first exec, {label}"] = _create(ws)
        if args.python_walk:
            py = {**os.environ, "WARREN_NATIVE_WALK": "0", "XDG_STATE_HOME": str(base / "state-py")}
            cases["warren run -- true, big, Python walk"] = _cmd([warren_cli, "run", "--", "true"], big, py)
            cases["create + first exec, big, Python walk"] = _create(big, py)
        before: dict[str, Callable[[], None]] = {}  # untimed, before the case
        if args.mounts:
            elsewhere = base / "elsewhere"
            elsewhere.mkdir()
            mounted = "warren run -- true, big, a mount elsewhere first"
            cases[mounted] = _cmd([warren_cli, "run", "--", "true"], big)
            before[mounted] = _mount_elsewhere(elsewhere)
        for fn in cases.values():  # warm: the supervisor, its memories, the page cache
            fn()
        samples: dict[str, list[float]] = {k: [] for k in cases}
        for _ in range(args.runs):
            for label, fn in cases.items():
                if label in before:
                    before[label]()
                time.sleep(args.pace)
                samples[label].append(_time(fn))
        print(f"load after the runs {os.getloadavg()[0]:.1f}")
        for label, xs in samples.items():
            print(f"  {label:46} median {_ms(xs):8.1f} ms")
        print("the big workspace against the empty one (target <= 1.2x)")
        for what in ("bwrap ... true", "warren run -- true", "create + first exec"):
            r = _ms(samples[f"{what}, big"]) / _ms(samples[f"{what}, empty"])
            bw = _ms(samples[f"{what}, big"]) / _ms(samples["bwrap ... true, big"])
            verdict = "met" if r <= 1.2 else "NOT met"
            print(f"  {what:22} {r:6.2f}x  {verdict:7}   ({bw:5.1f}x bwrap in the big one)")
        if args.mounts:
            r = _ms(samples[mounted]) / _ms(samples["warren run -- true, big"])
            print(f"  warren run -- true     {r:6.2f}x  after a mount elsewhere, against without")
        if args.python_walk:
            for what in ("warren run -- true", "create + first exec"):
                r = _ms(samples[f"{what}, big, Python walk"]) / _ms(samples[f"{what}, empty"])
                print(f"  {what:22} {r:6.2f}x  with the Python walks")
        _write_opens(big, args.runs)
        if args.parts:
            _parts(big, args.runs)
        subprocess.run([warren_cli, "shutdown"], check=False, capture_output=True)
        if args.python_walk:
            subprocess.run([warren_cli, "shutdown"], check=False, capture_output=True, env=py)


if __name__ == "__main__":
    main()
