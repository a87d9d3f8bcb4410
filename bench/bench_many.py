"""Many idle sandboxes: what each costs, and whether the listing still answers at once.

  1. `warren ls` (the whole CLI process) with no sandbox, the baseline of the same run
  2. N idle sandboxes created (default 1,000), then, once their spares are let go:
     memory (PSS of the supervisor and of every sandbox's processes, per sandbox),
     the host's free memory and swap, `warren ls` again, and `Sandbox.list` in-process
  3. every sandbox removed, timed

Issue 36's targets: 1,000 idle sandboxes without touching swap or limits, and `warren ls`
under 100 ms with them. The figures are medians of --runs; CPU time (user + sys of the
`warren ls` process) is printed beside wall time, which a loaded machine inflates.

Run: python bench/bench_many.py [--sandboxes 1000] [--runs 9] [--network]
``--network``: each sandbox with network allowed through warren's proxy (to one host,
never reached); its network helper ends with the spares, after the same idle time.
As root for the memory figure (PID 1 of a sandbox is not dumpable: its PSS is unreadable
to other users without privileges).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from warren import PolicySpec, Sandbox, statedir
from warren._core.procs import descendants
from warren.client.local import LocalTransport


def _pss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _warren() -> str:
    found = shutil.which("warren", path=os.path.dirname(sys.executable)) or shutil.which("warren")
    if found is None:
        raise SystemExit("bench_many: no `warren` command beside this Python or on PATH")
    return found


def _ls(runs: int) -> tuple[float, float, int]:
    """Median wall and CPU seconds of `warren ls`, and the number of lines it printed."""
    walls, cpus, lines = [], [], 0
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        done = subprocess.run([_warren(), "ls"], capture_output=True, text=True, check=True)
        walls.append(time.perf_counter() - t)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        lines = len(done.stdout.splitlines())
    return statistics.median(walls), statistics.median(cpus), lines


def _meminfo() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, value = line.split(":", 1)
        out[key] = int(value.split()[0])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sandboxes", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--idle-wait", type=float, default=65.0, help="seconds for the spares to be let go")
    ap.add_argument("--network", action="store_true", help="network allowed through the proxy")
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="warren-bench-many-", dir="/var/tmp") as tmp:
        os.environ["XDG_STATE_HOME"] = str(Path(tmp) / "state")
        ws = Path(tmp) / "ws"
        ws.mkdir()
        policy = (
            PolicySpec(workspace=str(ws), network="allow", allow_hosts=["pypi.org:443"])
            if args.network
            else PolicySpec(workspace=str(ws))
        )
        first = Sandbox.create(policy, name="bench-0")  # starts the supervisor
        first.remove()
        wall0, cpu0, _ = _ls(args.runs)
        print(f"warren ls, no sandbox:            {wall0 * 1000:7.1f} ms wall  {cpu0 * 1000:6.1f} ms CPU")

        mem_before = _meminfo()
        t = time.perf_counter()
        boxes = []
        for i in range(args.sandboxes):
            try:
                boxes.append(Sandbox.create(policy, name=f"bench-{i}"))
            except Exception as e:  # the figure to report is where it stopped, and why
                print(f"create stopped at {i}: {type(e).__name__}: {e}")
                break
        made = time.perf_counter() - t
        each = made / max(1, len(boxes)) * 1000
        print(f"created {len(boxes)} sandboxes in {made:.1f} s ({each:.1f} ms each)")
        time.sleep(args.idle_wait)

        found = statedir.read_address(statedir.location(os.environ))
        supervisor = found[1] if found else None
        procs = descendants(supervisor) if supervisor else []
        pss = [_pss_kib(p) for p in procs]
        readable = [k for k in pss if k is not None]
        sup = _pss_kib(supervisor) if supervisor else None
        mem_after = _meminfo()
        if sup is not None and len(readable) == len(pss):
            total = sup + sum(readable)
            print(
                f"memory, {len(boxes)} idle: {len(procs)} processes; supervisor {sup / 1024:.1f} MiB, "
                f"per sandbox {(total - sup) / 1024 / max(1, len(boxes)):.2f} MiB PSS"
            )
        else:
            print(f"memory: {len(pss) - len(readable)} of {len(pss)} processes unreadable (run as root)")
        used = (mem_before["MemAvailable"] - mem_after["MemAvailable"]) / 1024
        swapped = (mem_before["SwapFree"] - mem_after["SwapFree"]) / 1024
        print(f"host: MemAvailable down {used:.0f} MiB, swap used {swapped:.0f} MiB")

        wall, cpu, lines = _ls(args.runs)
        print(
            f"warren ls, {len(boxes)} sandboxes:   {wall * 1000:7.1f} ms wall  {cpu * 1000:6.1f} ms CPU  "
            f"({lines} lines; {wall / wall0:.2f}x the empty listing)"
        )
        transport = LocalTransport()
        inproc = []
        for _ in range(args.runs):
            t = time.perf_counter()
            Sandbox.list(transport=transport)
            inproc.append(time.perf_counter() - t)
        print(f"Sandbox.list in-process:          {statistics.median(inproc) * 1000:7.1f} ms")

        t = time.perf_counter()
        for box in boxes:
            box.remove()
        print(f"removed {len(boxes)} in {time.perf_counter() - t:.1f} s")
    print(f"load average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
