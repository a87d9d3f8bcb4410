"""Long-lived sandbox benchmark, side by side in one run.

  exec("true") in a live sandbox vs subprocess.run(["true"]): median and p99
  create + remove of a sandbox (supervisor already running)
  memory: PSS of the supervisor and every process of the sandboxes (PID 1, the keeper
  serving it, its spare), per sandbox, 50 alive: just used, then idle, then used again
  (the keepers joined, where PID 1 forked the first ones), then each paused
  right after an exec (the supervisor's thaw guard of each counts, where a freezer
  pauses: ``WARREN_NATIVE_THAW=0`` measures the Python guard); each time by role too
  (PSS per sandbox, and what one process holds alone: its USS), and what a sandbox
  would hold without its exec helper's own pages (the total less the helpers' USS: a
  process's end gives back its USS, not its PSS)

Run: python bench/bench_sandbox.py [--runs 1000] [--idle 50] [--network] [--review]
[--image DIR]
``--network``: every sandbox with network allowed through warren's proxy (to one host,
never reached): its network helper, a process of the supervisor's while it runs, counts
in its memory. ``--review``: every sandbox in review mode (checkpoints before each
command). ``--image DIR``: every sandbox on the root directory DIR (no workspace; it
needs ``true``).
PSS of another user's non-dumpable PID 1 is unreadable without privileges: run it as
root for the memory figure (it says so otherwise).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from warren import PolicySpec, Sandbox
from warren._core.procs import descendants
from warren.server import statedir

SPARE_IDLE = float(os.environ.get("WARREN_SPARE_IDLE", "20"))


def _stats(samples: list[float]) -> str:
    samples = sorted(samples)
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
    return f"median {statistics.median(samples) * 1000:7.2f} ms   p99 {p99 * 1000:7.2f} ms"


def _rollup(pid: int) -> dict[str, int] | None:
    """``smaps_rollup``'s figures (kB), None where unreadable (gone, or not dumpable)."""
    try:
        lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    except OSError:
        return None
    fields: dict[str, int] = {}
    for line in lines[1:]:
        name, _, rest = line.partition(":")
        if rest.strip().endswith("kB"):
            fields[name] = int(rest.split()[0])
    return fields


def _uss_kib(rollup: dict[str, int]) -> int:
    """The pages this process alone holds: what its end gives back (a page it shares
    stays, its PSS then split among fewer)."""
    return rollup.get("Private_Clean", 0) + rollup.get("Private_Dirty", 0)


def _status(pid: int) -> tuple[str, int, int]:
    """The process's name, its parent, and how many pid namespaces it is in."""
    name, ppid, levels = "?", 0, 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key == "Name":
                name = value.strip()
            elif key == "PPid":
                ppid = int(value)
            elif key == "NSpid":
                levels = len(value.split())
    except OSError:
        pass
    return name, ppid, levels


def _roles(sup: int, pids: list[int]) -> dict[int, str]:
    """What each process under the supervisor is: the native pieces by name; a Python
    process inside a sandbox's pid namespace is its keeper (PID 1 itself with
    ``WARREN_NATIVE_INIT=0``) or, the child of such a one, an exec helper (a spare, or
    one serving); outside, the spawner or another host-side helper of the supervisor's."""
    status = {p: _status(p) for p in pids}
    roles: dict[int, str] = {}
    for p, (name, ppid, levels) in status.items():
        if p == sup:
            roles[p] = "supervisor"
        elif not name.startswith("python"):
            roles[p] = name
        elif levels < 2:
            roles[p] = "spawner and host-side helpers"
        else:
            parent = status.get(ppid, ("", 0, 0))
            inside = parent[0].startswith("python") and parent[2] >= 2
            roles[p] = "exec helper (the spare)" if inside else "keeper"
    return roles


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--idle", type=int, default=50)
    ap.add_argument("--network", action="store_true", help="network allowed through the proxy")
    ap.add_argument("--review", action="store_true", help="review mode")
    ap.add_argument("--image", metavar="DIR", help="on this root directory, no workspace")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="warren-bench-") as tmp:
        os.environ["XDG_STATE_HOME"] = str(Path(tmp) / "state")
        # The bench's own supervisor lets spares go after 20 s (60 by default), so the
        # idle figure comes sooner.
        os.environ.setdefault("WARREN_SPARE_IDLE", str(SPARE_IDLE))
        ws = Path(tmp) / "ws"
        ws.mkdir()
        extra: dict[str, object] = {}
        if args.network:
            extra.update(network="allow", allow_hosts=["pypi.org:443"])
        if args.review:
            extra.update(review=True)
        if args.image:
            extra.update(image=str(Path(args.image).resolve()))
        workspace = "none" if args.image else str(ws)
        policy = PolicySpec(workspace=workspace, **extra)  # type: ignore[arg-type]

        t = time.perf_counter()
        first = Sandbox.create(policy, name="bench")
        cold = time.perf_counter() - t

        for _ in range(50):
            first.exec(["true"])
            subprocess.run(["true"])
        host, sandbox = [], []
        for _ in range(args.runs):
            t = time.perf_counter()
            subprocess.run(["true"])
            host.append(time.perf_counter() - t)
            t = time.perf_counter()
            r = first.exec(["true"])
            sandbox.append(time.perf_counter() - t)
            assert r.exit_code == 0
        print(f"exec true, {args.runs} runs")
        print(f"  subprocess.run(['true'])     {_stats(host)}")
        print(f"  Sandbox.exec(['true'])       {_stats(sandbox)}")

        creates, removes = [], []
        for i in range(20):
            t = time.perf_counter()
            sb = Sandbox.create(policy, name=f"c{i}")
            creates.append(time.perf_counter() - t)
            t = time.perf_counter()
            sb.remove()
            removes.append(time.perf_counter() - t)
        print("create / remove, 20 runs (supervisor running)")
        print(
            f"  Sandbox.create               {_stats(creates)}   "
            f"(first, starting the supervisor: {cold * 1000:.0f} ms)"
        )
        print(f"  Sandbox.remove               {_stats(removes)}")

        idle = [Sandbox.create(policy, name=f"idle{i}") for i in range(args.idle - 1)]
        time.sleep(1)
        _memory("just used (each with a warm spare exec helper)")
        # PID 1 lets its spare go after that long without a request, and the keeper under
        # the native init leaves then too (``pid1.Init._may_leave``)
        time.sleep(SPARE_IDLE + 2)
        _memory(f"idle for {SPARE_IDLE + 1:g} s (spares and keepers let go)")
        # The next command joins a keeper from the spawner (it never ran PID 1's setup)
        for sb in [first, *idle]:
            sb.exec(["true"])
        time.sleep(1)
        _memory("used again (each keeper joined, with a spare)")
        for sb in [first, *idle]:
            sb.exec(["true"])
            sb.pause()
        time.sleep(1)
        _memory("each paused right after an exec", state="paused")
        for sb in [first, *idle]:
            sb.resume()
            sb.remove()


def _memory(when: str, state: str = "running") -> None:
    entries = [e for e in Sandbox.list() if e.state == state]
    found = statedir.read_address(statedir.location(os.environ))
    assert found is not None
    sup = found[1]
    # Each sandbox: PID 1, and while in use its keeper (the spawner's child where PID 1 is
    # the native init) and a spare exec helper with its launcher.
    pids = [sup, *descendants(sup)]
    rollups = {p: _rollup(p) for p in pids}
    read = {p: r for p, r in rollups.items() if r is not None}
    if len(read) < len(rollups):
        print("memory: PSS of PID 1 is not readable as this user (not dumpable); run as root")
        return
    total = sum(r.get("Pss", 0) for r in read.values())
    sup_kib = read[sup].get("Pss", 0)
    n = len(entries)
    print(f"memory with {n} sandboxes alive, {when}: {len(pids) - 1} processes")
    print(f"  supervisor PSS               {sup_kib / 1024:7.2f} MiB")
    print(f"  supervisor + all sandboxes   {total / 1024:7.2f} MiB")
    print(f"  per sandbox                  {(total - sup_kib) / n / 1024:7.2f} MiB")
    # By role: each one's PSS per sandbox, and what one process of it holds alone (USS).
    # Without a process, the total falls by its USS, not its PSS: the pages it shared
    # stay, their PSS split among the others (a spare shares about 2 MB with its keeper
    # alone, which are the keeper's once the spare is gone).
    by_role: dict[str, list[int]] = {}
    for pid, role in _roles(sup, pids).items():
        if pid == sup:
            continue
        rollup = read[pid]
        kept = by_role.setdefault(role, [0, 0, 0])
        kept[0] += 1
        kept[1] += rollup.get("Pss", 0)
        kept[2] += _uss_kib(rollup)
    for role, (count, pss, uss) in sorted(by_role.items(), key=lambda kv: -kv[1][1]):
        print(
            f"    {role:30s} x{count:<4d} PSS {pss / n / 1024:5.2f} MiB per sandbox,"
            f" {uss / count / 1024:5.2f} MiB its own each"
        )
    spares = by_role.get("exec helper (the spare)")
    if spares is not None:
        without = (total - sup_kib - spares[2]) / n / 1024
        print(f"  per sandbox without its exec helper's own pages   {without:7.2f} MiB")


if __name__ == "__main__":
    main()
