"""The real-projects job's harness (bench/real_projects.py), on its small offline
project: the same setup and tests on the host and in warren, outcomes compared by name,
the files left compared by path. The job itself needs the network and takes minutes:
not run here."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "real_projects.py"


def test_the_harness_finds_the_smoke_project_identical_and_sees_a_difference() -> None:
    # In the home, not /tmp: a workspace under /tmp cannot rename from TMPDIR inside
    # (docs/known-limits.md), which the smoke project's test would (rightly) report.
    work = Path(tempfile.mkdtemp(prefix="real-projects-", dir=Path.home()))
    try:
        r = subprocess.run(
            [sys.executable, str(BENCH), "--smoke", "--json", "--workdir", str(work)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        res = json.loads(r.stdout.splitlines()[0])
        assert res["identical"] and res["outcomes"]["host"] == {"ok": 2, "skipped": 1}, res
        assert res["only_in_warren"] == [] and res["only_on_host"] == [], res
        # Control: the comparison sees a file one side left and the other did not.
        sys.path.insert(0, str(BENCH.parent))
        try:
            import real_projects
        finally:
            sys.path.pop(0)
        host = real_projects._tree(work / "host" / "smoke")
        (work / "warren" / "smoke" / "litter").write_text("x")
        assert real_projects._tree(work / "warren" / "smoke") - host == {"litter"}
    finally:
        shutil.rmtree(work, ignore_errors=True)
