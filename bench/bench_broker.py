"""Cost of PID 1's syscall broker: the calls it answers for a sandbox, per call.

The same Python loop (N calls each of chmod, utimensat, fchmod, a unix-socket connect,
a rename in the workspace, a TCP connect and a small TCP sendmsg on loopback — the
broker makes these itself on a worker thread —, a small sendmsg on a unix socketpair —
made by the credentials sender, which names the command as its sender — and stat as a control that is not
brokered) runs on the host, under bubblewrap (no broker), and in `warren run`, side by
side in one run.
A second warren row runs inside a git repository, where renames are brokered too.

Run: python bench/bench_broker.py [--n 2000]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

LOOP = r"""
import json, os, socket, sys, time
n = int(sys.argv[1])
open('f', 'w').close()
out = {}
def timed(name, fn):
    # The best of batches of 50 calls: the cost of the call itself, not the load of
    # whatever else shares the machine.
    best = float('inf')
    for start in range(0, n, 50):
        t = time.perf_counter()
        for i in range(start, start + 50):
            fn(i)
        best = min(best, (time.perf_counter() - t) / 50)
    out[name] = best * 1e6
fd = os.open('f', os.O_RDONLY)
timed('stat', lambda i: os.stat('f'))
timed('chmod', lambda i: os.chmod('f', 0o644 if i % 2 else 0o600))
timed('fchmod', lambda i: os.fchmod(fd, 0o644))
timed('utime', lambda i: os.utime('f', (i, i)))
def ren(i):
    open('r', 'w').close(); os.rename('r', 'f2')
timed('create+rename', ren)
l = socket.socket(socket.AF_UNIX); l.bind('s.sock'); l.listen(1024)
def conn(i):
    c = socket.socket(socket.AF_UNIX); c.connect('s.sock'); a, _ = l.accept(); a.close(); c.close()
timed('unix connect', conn)
os.unlink('s.sock')
t = socket.socket(); t.bind(('127.0.0.1', 0)); t.listen(1024)
def tcp(i):
    c = socket.socket(); c.connect(t.getsockname()); a, _ = t.accept(); a.close(); c.close()
timed('tcp connect', tcp)
c = socket.socket(); c.connect(t.getsockname()); a, _ = t.accept()
def sendmsg(i):
    c.sendmsg([b'x' * 64]); a.recv(64)
timed('tcp sendmsg 64B', sendmsg)
u, v = socket.socketpair()
def unix_sendmsg(i):
    u.sendmsg([b'x' * 64]); v.recv(64)
# a unix send names its sender: made by warren's credentials sender (_core.credsend)
timed('unix sendmsg 64B', unix_sendmsg)
print(json.dumps(out))
"""


def _run(argv: list[str], cwd: Path) -> dict[str, float]:
    r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=True)
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    args = ap.parse_args()
    py = sys.executable
    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="warren-bench-broker-", dir="/var/tmp") as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        cmd = [py, "-c", LOOP, str(args.n)]
        rows["host"] = _run(cmd, ws)
        bwrap = shutil.which("bwrap")
        if bwrap:
            rows["bwrap"] = _run(
                [
                    bwrap,
                    "--ro-bind",
                    "/",
                    "/",
                    "--dev",
                    "/dev",
                    "--proc",
                    "/proc",
                    "--bind",
                    str(ws),
                    str(ws),
                    "--chdir",
                    str(ws),
                    "--unshare-all",
                    *cmd,
                ],
                ws,
            )
        warren = [py, "-m", "warren", "run", "--"]
        rows["warren"] = _run([*warren, *cmd], ws)
        subprocess.run(["git", "init", "-q", str(ws)], check=True)
        rows["warren, git repo"] = _run([*warren, *cmd], ws)
    names = list(rows["host"])
    print(f"per call, microseconds (best batch of 50, {args.n} calls)")
    print(f"{'':18}" + "".join(f"{k:>18}" for k in rows))
    for name in names:
        print(f"{name:18}" + "".join(f"{rows[k][name]:18.1f}" for k in rows))


if __name__ == "__main__":
    main()
