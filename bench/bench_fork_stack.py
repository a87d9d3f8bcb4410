"""Fork without a copy: what freezing a sandbox's layer and stacking it costs, and why
warren does not do it yet. Side by side with warren's copy path (snapshot / fork of a
live sandbox on an image, as ``bench_envroot`` measures them).

The mechanism measured: at fork time the sandbox's writable layer (``up0``, on the tmpfs
made in its namespaces) stops being written; the original gets a fresh upper above it
(overlay lower ``up0:image``) and so does the fork. Nothing is copied. Three runs, each
in a user and mount namespace of its own (``unshare -Urm``, no privilege):

  stack     the two overlay mounts (original re-stacked, fork), for N MiB changed and for
            a small and a large lower (``--small``, ``--large``: the image's unchanged data)
  leak      a file the sandbox had open for writing before the freeze: its next write
            lands in ``up0``, which is the fork's lower -- the fork sees it
  sibling   a second sandbox (its own user namespace, as every warren sandbox has) mounts
            ``up0`` as a lower through /proc/PID/root: refused; from a copy of the first
            one's mount namespace (the same user namespace): works

Run: python bench/bench_fork_stack.py [--changed 16,1024] [--image NAME]
(--image also runs warren's copy path on that image, side by side.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

CHILD = textwrap.dedent(
    r"""
    import ctypes, json, os, sys, time
    libc = ctypes.CDLL(None, use_errno=True)
    def mount(src, dst, fstype, data):
        if libc.mount(src.encode(), dst.encode(), fstype.encode(), 0, data.encode()) != 0:
            e = ctypes.get_errno(); raise OSError(e, os.strerror(e), dst)
    base, lower, mib, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    t = f"{base}/T"
    os.mkdir(t)
    mount("tmpfs", t, "tmpfs", "size=3G")
    for d in ("up0", "w0", "root0", "up1", "w1", "root1", "up2", "w2", "root2"):
        os.mkdir(f"{t}/{d}")
    mount("overlay", f"{t}/root0", "overlay", f"lowerdir={lower},upperdir={t}/up0,workdir={t}/w0,userxattr")
    with open(f"{t}/root0/big", "wb") as f:
        chunk = os.urandom(1 << 20)
        for _ in range(mib):
            f.write(chunk)
    held = open(f"{t}/root0/log", "a")  # a dev server's log, open across the fork
    held.write("before\n"); held.flush()
    out = {}
    start = time.perf_counter()
    stacked = f"lowerdir={t}/up0:{lower}"
    mount("overlay", f"{t}/root1", "overlay", f"{stacked},upperdir={t}/up1,workdir={t}/w1,userxattr")
    mount("overlay", f"{t}/root2", "overlay", f"{stacked},upperdir={t}/up2,workdir={t}/w2,userxattr")
    out["stack_ms"] = (time.perf_counter() - start) * 1000
    # Independent from here on, and the fork has the state:
    open(f"{t}/root1/only-original", "w").close()
    out["independent"] = not os.path.exists(f"{t}/root2/only-original")
    out["fork_has_state"] = os.path.getsize(f"{t}/root2/big") == mib << 20
    held.write("after the fork, by the original\n"); held.flush()
    out["fork_sees_originals_later_write"] = "after the fork" in open(f"{t}/root2/log").read()
    if mode == "sibling":
        print(json.dumps(out), flush=True)
        sys.stdin.read()  # stay: the sibling looks at our layer meanwhile
    else:
        print(json.dumps(out))
    """
)

SIBLING = textwrap.dedent(
    r"""
    import ctypes, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    up0, lower, base = sys.argv[1], sys.argv[2], sys.argv[3]
    for d in ("u", "w", "r"):
        os.makedirs(f"{base}/{d}", exist_ok=True)
    data = f"lowerdir={up0}:{lower},upperdir={base}/u,workdir={base}/w,userxattr"
    rc = libc.mount(b"overlay", f"{base}/r".encode(), b"overlay", 0, data.encode())
    print("mounted" if rc == 0 else os.strerror(ctypes.get_errno()))
    """
)


def _in_userns(script: str, *args: str, stdin: int | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["unshare", "-Urm", "--propagation", "private", sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        stdin=stdin,
        text=True,
    )


def stack(base: Path, lower: str, mib: int) -> dict[str, object]:
    work = Path(tempfile.mkdtemp(dir=base))
    p = _in_userns(CHILD, str(work), lower, str(mib), "stack")
    out, _ = p.communicate(timeout=600)
    shutil.rmtree(work, ignore_errors=True)
    result: dict[str, object] = json.loads(out)
    return result


def sibling(base: Path, lower: str) -> tuple[str, str]:
    """A sibling user namespace, then a copy of the first one's mount namespace in its
    own user namespace (nsenter -U -m, then unshare -m)."""
    work = Path(tempfile.mkdtemp(dir=base))
    first = _in_userns(CHILD, str(work), lower, "1", "sibling", stdin=subprocess.PIPE)
    assert first.stdout is not None and first.stdin is not None
    first.stdout.readline()
    up0 = f"/proc/{first.pid}/root{work}/T/up0"
    # unshare(1) execs python in the namespaces: the pid is the holder of the mount.
    other = Path(tempfile.mkdtemp(dir=base))
    sib = _in_userns(SIBLING, up0, lower, str(other))
    apart = (sib.communicate(timeout=60)[0] or "").strip()
    same_argv = ["nsenter", "-U", "-m", "-t", str(first.pid), "--preserve-credentials"]
    same_argv += ["unshare", "-m", sys.executable, "-c", SIBLING, f"{work}/T/up0", lower, f"{work}/T/fork"]
    same = subprocess.run(same_argv, capture_output=True, text=True, timeout=60)
    first.stdin.close()
    first.wait(timeout=60)
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(other, ignore_errors=True)
    return apart, (same.stdout.strip() or same.stderr.strip())


def copy_path(image: str, mib: int) -> tuple[float, float]:
    from warren import PolicySpec, Sandbox

    spec = PolicySpec(image=image, workspace="none", disk="3G")
    with Sandbox.create(spec) as s:
        s.exec(["sh", "-c", f"dd if=/dev/urandom of=/root/big bs=1M count={mib} 2>/dev/null"])
        t = time.perf_counter()
        snap = s.snapshot()
        took = time.perf_counter() - t
        t = time.perf_counter()
        with s.fork():
            forked = time.perf_counter() - t
    for sn in Sandbox.snapshots():
        Sandbox.remove_snapshot(sn.id)
    del snap
    return took, forked


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--changed", default="16,1024", help="MiB of changed files, comma-separated")
    ap.add_argument("--small", default="/usr/share/doc", help="a lower with little unchanged data")
    ap.add_argument("--large", default="/usr", help="a lower with much unchanged data")
    ap.add_argument("--image", help="also run warren's copy path on this image (side by side)")
    args = ap.parse_args()
    sizes = [int(x) for x in args.changed.split(",")]
    with tempfile.TemporaryDirectory(prefix="warren-bench-stack-", dir="/var/tmp") as tmp:
        base = Path(tmp)
        os.environ["XDG_STATE_HOME"] = str(base / "state")
        du = {
            p: (subprocess.run(["du", "-sm", p], capture_output=True, text=True).stdout.split() or ["?"])[0]
            for p in (args.small, args.large)
        }
        print(f"lowers: {args.small} ({du[args.small]} MiB), {args.large} ({du[args.large]} MiB)")
        for mib in sizes:
            for lower in (args.small, args.large):
                r = stack(base, lower, mib)
                line = (
                    f"{mib:5d} MiB changed, lower {lower:<15} stack (2 overlay mounts) "
                    f"{float(r['stack_ms']):6.1f} ms   independent {r['independent']}, "
                    f"fork has the state {r['fork_has_state']}, "
                    f"fork sees a write through an fd opened before {r['fork_sees_originals_later_write']}"
                )
                print(line)
            if args.image:
                took, forked = copy_path(args.image, mib)
                print(
                    f"{mib:5d} MiB changed, warren's copy path on {args.image}: "
                    f"snapshot {took * 1000:7.0f} ms   fork {forked * 1000:7.0f} ms"
                )
        apart, same = sibling(base, args.small)
        print(f"the layer as a lower in a sibling user namespace (another sandbox): {apart}")
        print(f"... from a copy of its mount namespace, in its user namespace: {same}")


if __name__ == "__main__":
    main()
