"""Helpers to run the doctor as a separate program, inside environments built for real."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PYTHON = sys.executable


@dataclass
class Place:
    """A workspace, a cache, a $HOME (tool caches resolve below it) and a $TMPDIR."""

    root: Path
    ws: Path
    cache: Path
    home: Path
    tmp: Path
    env: dict[str, str]

    def dirs(self) -> list[Path]:
        return [self.ws, self.cache, self.home, self.tmp]


@dataclass
class Run:
    report: dict[str, object]
    code: int
    stderr: str

    def probe(self, probe_id: str, location: str) -> dict[str, object]:
        probes = self.report["probes"]
        assert isinstance(probes, list)
        found = [p for p in probes if p["id"] == probe_id and p["location"] == location]
        assert len(found) == 1, f"{probe_id} at {location}: {found}"
        return found[0]

    def cause(self, probe_id: str, location: str) -> str | None:
        c = self.probe(probe_id, location)["cause"]
        return None if c is None else str(c["id"])  # type: ignore[index]

    def failed(self) -> list[tuple[str, str, str | None]]:
        probes = self.report["probes"]
        assert isinstance(probes, list)
        return [
            (p["location"], p["id"], p["cause"] and p["cause"]["id"])
            for p in probes
            if p["status"] in ("fail", "error")
        ]


def run_doctor(
    place: Place,
    *args: str,
    prefix: tuple[str, ...] = (),
    cwd: Path | str | None = None,
    shell: str | None = None,
) -> Run:
    """Run ``python -m warren.doctor --json ARGS``, optionally behind ``prefix`` (bwrap,
    unshare, ...) or at the end of a ``sh -c`` script ``shell`` that prepares the place."""
    doctor = [PYTHON, "-m", "warren.doctor", "--json", *args]
    if shell is not None:
        cmd = [*prefix, "sh", "-c", f'{shell} && exec "$@"', "sh", *doctor]
    else:
        cmd = [*prefix, *doctor]
    p = subprocess.run(cmd, env=place.env, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert p.stdout.startswith("{"), f"no report (exit {p.returncode}): {p.stderr}"
    assert "Traceback" not in p.stderr, p.stderr
    return Run(json.loads(p.stdout), p.returncode, p.stderr)


def no_litter(place: Place) -> list[str]:
    return [str(p) for d in place.dirs() for p in d.iterdir() if p.name.startswith(".warren-doctor-")]
