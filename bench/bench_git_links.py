"""What a hard link costs inside warren, with and without a repository in the workspace.

Where a workspace holds a repository, its git data is bound in and PID 1's broker takes
link(2) (git's local clone calls it; the broker makes links out of the git data on the
writable root's own mount, as on the host): every link(2) of the sandbox then makes a
round trip to the broker. linkat(2) — what uv, cargo, cp -l and ln call — is never
brokered. Side by side in one run, per link (median of --rounds rounds of --links links):
the host, warren without a repository, warren with one; link(2) and linkat(2) each.

Run: python bench/bench_git_links.py [--links 5000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import warren
from warren import PolicySpec

PROBE = """
import os, sys, time
d, how, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.makedirs(d + "/src"); os.makedirs(d + "/dst")
for i in range(n):
    open(f"{d}/src/{i}", "w").close()
t = time.perf_counter()
for i in range(n):
    # follow_symlinks=True: link(2); False: linkat(2) with no flags
    os.link(f"{d}/src/{i}", f"{d}/dst/{i}", follow_symlinks=how == "link")
print((time.perf_counter() - t) / n * 1e6)
"""


def _host(d: Path, how: str, n: int) -> float:
    out = subprocess.run([sys.executable, "-c", PROBE, str(d), how, str(n)], capture_output=True, text=True)
    return float(out.stdout)


def _inside(ws: Path, d: Path, how: str, n: int) -> float:
    r = warren.run(["python3", "-c", PROBE, str(d), how, str(n)], PolicySpec(workspace=str(ws)))
    assert r.exit_code == 0, r.stderr
    return float(r.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--links", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        base = Path(tmp)
        plain, repo = base / "plain", base / "repo"
        plain.mkdir()
        repo.mkdir()
        subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
        rows: dict[tuple[str, str], list[float]] = {}
        for r in range(args.rounds):
            for how in ("link", "linkat"):
                rows.setdefault(("host", how), []).append(_host(base / f"h{r}{how}", how, args.links))
                for name, ws in (("warren", plain), ("warren, repository", repo)):
                    us = _inside(ws, ws / f"w{r}{how}", how, args.links)
                    rows.setdefault((name, how), []).append(us)
        print(f"{'':22} {'link(2)':>12} {'linkat(2)':>12}   (us per link, median of {args.rounds})")
        for name in ("host", "warren", "warren, repository"):
            cells = [statistics.median(rows[name, how]) for how in ("link", "linkat")]
            print(f"{name:22} {cells[0]:12.1f} {cells[1]:12.1f}")


if __name__ == "__main__":
    main()
