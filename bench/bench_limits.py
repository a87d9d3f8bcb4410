"""What limits cost: `warren run -- true`, create + first exec, and an exec in a live
sandbox (whose helper reads the cgroup counters before and after), with the default
limits (cgroups as root here, rlimits for others) next to the same with none
(`--memory none --pids none --tmp-size none`), interleaved in one run; and what a
pause + resume round trip takes with 20 processes in the sandbox (by the mechanism
`warren plan` names for this caller).

And what the default pids limit leaves of the host: a fork bomb under `warren run`
with no flags, inside an outer safety net of this script's own (root: a pids cgroup
with pids.max 3000 around the client, and the supervisor it starts; anyone: prlimit
--nproc 3000), while /bin/true is timed from outside every 20 ms; printed: the peak of
the bomb's tasks (sampled from /proc: every task in the sandbox's pid namespace) and
the median and p99 of /bin/true, next to /bin/true with no bomb.

Run: python bench/bench_limits.py [--runs 100] [--fork-bomb-only] [--bomb-pids N]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from warren import PolicySpec, Sandbox

WARREN = [sys.executable, "-m", "warren"]
NONE = ["--memory", "none", "--pids", "none", "--tmp-size", "none"]


def _ms(xs: list[float]) -> str:
    xs = sorted(xs)
    p99 = xs[min(len(xs) - 1, int(len(xs) * 0.99))]
    return f"median {statistics.median(xs) * 1e3:7.2f} ms   p99 {p99 * 1e3:7.2f} ms"


NET_PIDS = 3000  # the outer safety net's hard cap
# Writes its pid namespace where the sampler finds it, then forks without end.
FORK_BOMB = "readlink /proc/self/ns/pid > ns.txt; f(){ f|f& }; f; sleep 3"


def _true_times(stop: threading.Event, out: list[float]) -> None:
    while not stop.is_set():
        start = time.monotonic()
        subprocess.run(["/bin/true"], check=False)
        out.append(time.monotonic() - start)
        stop.wait(0.02)


def _tasks_in(ns: str) -> int:
    n = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/ns/pid") == ns:
                    n += len(os.listdir(f"/proc/{pid}/task"))
    return n


def fork_bomb(pids: str | None = None) -> None:
    """The default pids limit (or ``--pids``) against a fork bomb, with the host's
    /bin/true timed."""
    idle: list[float] = []
    stop = threading.Event()
    t = threading.Thread(target=_true_times, args=(stop, idle))
    t.start()
    time.sleep(2)
    stop.set()
    t.join()
    with tempfile.TemporaryDirectory() as ws, tempfile.TemporaryDirectory() as state:
        os.chmod(ws, 0o755)
        env = {**os.environ, "XDG_STATE_HOME": state}
        group = ""
        if os.getuid() == 0:
            own = next(
                line.split(":", 2)[2]
                for line in Path("/proc/self/cgroup").read_text().splitlines()
                if "pids" in line.split(":")[1].split(",")
            )
            group = os.path.normpath(f"/sys/fs/cgroup/pids{own}/warren-bench-net-{os.getpid()}")
            os.mkdir(group)
            with open(f"{group}/pids.max", "w") as f:
                f.write(str(NET_PIDS))
        enter = f"echo $$ > {group}/cgroup.procs; " if group else ""
        argv = ["sh", "-c", enter + f'exec prlimit --nproc={NET_PIDS} -- "$@"', "net", *WARREN]
        plan = subprocess.run([*argv, "plan", "-w", ws], env=env, capture_output=True, text=True).stdout
        print(next(line for line in plan.splitlines() if line.strip().startswith("pids")))
        busy: list[float] = []
        limit = ["--pids", pids] if pids else []
        stop = threading.Event()
        t = threading.Thread(target=_true_times, args=(stop, busy))
        t.start()
        bomb = subprocess.Popen(
            [*argv, "run", "-w", ws, *limit, "--timeout", "8", "--", "sh", "-c", FORK_BOMB],
            cwd=ws,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        peak = 0
        ns = ""
        while bomb.poll() is None:
            if not ns:
                with contextlib.suppress(OSError):
                    ns = Path(ws, "ns.txt").read_text().strip()
            if ns:
                peak = max(peak, _tasks_in(ns))
            time.sleep(0.05)
        stop.set()
        t.join()
        err = bomb.stderr.read() if bomb.stderr else ""
        subprocess.run([*WARREN, "shutdown"], env=env, capture_output=True)
        net_peak = ""
        if group:
            net_peak = Path(group, "pids.peak").read_text().strip()
            for _ in range(200):
                with contextlib.suppress(OSError):
                    os.rmdir(group)
                    break
                for pid in Path(group, "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
                time.sleep(0.05)
        said = [line for line in err.splitlines() if line.startswith("warren:")]
        print(
            f"  fork bomb, {' '.join(limit) or 'default limits'}: peak {peak} tasks in the sandbox",
            end="",
        )
        print(
            f" (the net's pids.peak {net_peak}, cap {NET_PIDS})"
            if net_peak
            else f" (net: prlimit {NET_PIDS})"
        )
        print(f"  /bin/true from outside, no bomb         {_ms(idle)}")
        print(f"  /bin/true from outside, during the bomb {_ms(busy)}   ({len(busy)} samples)")
        print(f"  warren said: {said[-1] if said else '(nothing)'}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--fork-bomb-only", action="store_true")
    ap.add_argument("--bomb-pids", help="the fork bomb with this --pids instead of the default")
    args = ap.parse_args()
    runs = args.runs
    fork_bomb(args.bomb_pids)
    if args.fork_bomb_only:
        return
    with tempfile.TemporaryDirectory() as ws:
        subprocess.run([*WARREN, "run", "-w", ws, "--", "true"], check=True)  # warm the supervisor
        print(
            subprocess.run([*WARREN, "plan", "-w", ws], capture_output=True, text=True)
            .stdout.split("limits\n")[1]
            .split("process\n")[0]
        )
        run: dict[str, list[float]] = {"with": [], "without": []}
        create: dict[str, list[float]] = {"with": [], "without": []}
        limits = {
            "with": PolicySpec(workspace=ws),
            "without": PolicySpec(workspace=ws, memory="none", pids="none", tmp_size="none"),
        }
        for _ in range(runs):
            for kind, extra in (("with", []), ("without", NONE)):
                start = time.monotonic()
                subprocess.run([*WARREN, "run", "-w", ws, *extra, "--", "true"], check=True)
                run[kind].append(time.monotonic() - start)
                start = time.monotonic()
                sb = Sandbox.create(limits[kind])
                sb.exec(["true"])
                create[kind].append(time.monotonic() - start)
                sb.remove()
        execs: dict[str, list[float]] = {"with": [], "without": []}
        boxes = {kind: Sandbox.create(limits[kind]) for kind in limits}
        try:
            for _ in range(runs):
                for kind, sb in boxes.items():
                    start = time.monotonic()
                    sb.exec(["true"])
                    execs[kind].append(time.monotonic() - start)
                    time.sleep(0.01)  # paced: the spare helper is forked between execs
            sb = boxes["with"]
            sb.exec(["sh", "-c", "for i in $(seq 20); do sleep 600 & done"])
            pauses = []
            for _ in range(runs):
                start = time.monotonic()
                sb.pause()
                sb.resume()
                pauses.append(time.monotonic() - start)
        finally:
            for sb in boxes.values():
                sb.remove()
        for kind in ("with", "without"):
            print(f"  warren run -- true, {kind:7} limits   {_ms(run[kind])}")
        for kind in ("with", "without"):
            print(f"  create + first exec, {kind:7} limits  {_ms(create[kind])}")
        for kind in ("with", "without"):
            print(f"  Sandbox.exec(true), {kind:7} limits   {_ms(execs[kind])}")
        print(f"  pause + resume, 20 processes          {_ms(pauses)}")


if __name__ == "__main__":
    main()
