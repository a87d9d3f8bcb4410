"""Run the doctor: gather evidence, run the probes, diagnose, print. Standard library only.

``python3 -m warren.doctor.probe_main --workspace W --cache C --json`` is the form a
sandbox launches inside itself; ``python -m warren.doctor`` and ``warren doctor`` are the
same program. Exit status: 0 when everything developer tools need works, 1 when not,
2 for bad arguments. Nothing escapes as a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Mapping, Sequence

from . import evidence as _evidence
from . import userns
from .diagnose import diagnose
from .limits import run_limit_probes
from .probes import run_probes
from .report import build, render

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2


class UsageError(Exception):
    pass


def _same(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def gather(
    workspace: str | None,
    caches: Sequence[str],
    env: Mapping[str, str],
    tool_caches: bool = True,
) -> tuple[_evidence.Evidence, frozenset[str]]:
    """Evidence for the locations to probe, and the roles that get the full file suite."""
    process = _evidence.gather_process()
    if workspace is None and process.cwd is not None:
        workspace = process.cwd
    if workspace is not None and not os.path.isdir(workspace):
        raise UsageError(f"workspace {workspace} is not a directory")
    for cache in caches:
        if not os.path.isdir(cache):
            raise UsageError(f"cache {cache} is not a directory")
    mounts = _evidence.read_mounts()
    locations: list[_evidence.Location] = []
    seen: list[str] = []
    if workspace is not None:
        locations.append(_evidence.gather_location("workspace", workspace, mounts))
        seen.append(workspace)
    full: set[str] = set()
    for n, cache in enumerate(caches, start=1):
        if any(_same(cache, s) for s in seen):
            continue
        role = "cache" if len(caches) == 1 else f"cache{n}"
        locations.append(_evidence.gather_location(role, cache, mounts))
        full.add(role)
        seen.append(cache)
    home = env.get("HOME") or os.path.expanduser("~")
    for tool, path in _evidence.tool_caches(env, home) if tool_caches else ():
        if any(_same(path, s) for s in seen):
            continue
        loc = _evidence.gather_location(f"tool-cache:{tool}", path, mounts)
        # A cache not created yet is probed in its nearest existing parent, never in /.
        if loc.exists or loc.probe_dir not in ("/", ""):
            locations.append(loc)
            seen.append(path)
    tmp = env.get("TMPDIR") or "/tmp"
    tmp_loc = _evidence.gather_location("tmpdir", tmp, mounts)
    if not tmp_loc.exists:
        # $TMPDIR must exist itself: probing its parent would report a writable TMPDIR.
        tmp_loc = _evidence.Location("tmpdir", tmp_loc.path, False, tmp_loc.path)
    locations.append(tmp_loc)
    return _evidence.Evidence(process, tuple(locations), mounts), frozenset(full)


def run(
    workspace: str | None = None,
    caches: Sequence[str] = (),
    *,
    as_json: bool = False,
    env: Mapping[str, str] | None = None,
    tool_caches: bool = True,
    limits: bool = True,
    not_held: Sequence[tuple[str, str]] = (),
) -> tuple[str, int]:
    """Run the doctor and return (output, exit status).

    ``tool_caches=False`` probes only the workspace, the given caches and $TMPDIR: how
    a sandbox is checked, where the policy decides which tools' caches exist.
    ``limits=False`` leaves out the resource-limit rows: inside a sandbox they would
    describe nesting, while its limits are what the host's rows and `warren plan` say.
    ``not_held``: what the degraded mode cannot hold (``userns.check``), shown when
    this host gets no namespaces."""
    ev, full = gather(workspace, caches, os.environ if env is None else env, tool_caches)
    results = run_probes(ev, full_suite_roles=full) + (run_limit_probes(ev) if limits else [])
    report = build(ev, results, diagnose(ev, results))
    if limits:  # on the host (inside a sandbox it would describe nesting)
        report[userns.SECTION] = userns.check(not_held=not_held)
    text = json.dumps(report, indent=2, ensure_ascii=False) if as_json else render(report)
    if limits and not as_json:
        section = report[userns.SECTION]
        assert isinstance(section, dict)
        # Before the last line, which is the verdict.
        head, _, verdict = text.rpartition("\n")
        text = "\n".join([head, *userns.render(section), "", verdict])
    return text, EXIT_OK if report["ok"] else EXIT_PROBLEMS


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="warren doctor",
        description="Probe the filesystem semantics developer tools rely on, here, and name the "
        "cause of every failure with a fix; and which resource-limit mechanisms this host offers you.",
    )
    parser.add_argument("--workspace", "-w", metavar="DIR", help="the workspace (default: current directory)")
    parser.add_argument("--cache", metavar="DIR", action="append", default=[], help="a cache (repeatable)")
    parser.add_argument(
        "--json", action="store_true", help="print the report as JSON (schema warren-doctor/1)"
    )
    parser.add_argument(
        "--only-given",
        action="store_true",
        help="probe only the workspace, the --cache directories and $TMPDIR (no tool-cache discovery)",
    )
    parser.add_argument(
        "--no-limits",
        action="store_true",
        help="leave out the resource-limit rows (cgroups, RLIMIT_NPROC, tmpfs size=, pause)",
    )
    args = parser.parse_args(argv)
    try:
        text, code = run(
            args.workspace,
            args.cache,
            as_json=args.json,
            tool_caches=not args.only_given,
            limits=not args.no_limits,
        )
    except UsageError as e:
        print(f"warren doctor: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as e:  # the doctor must never answer with a traceback
        print(f"warren doctor: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        print("  hint: please report this with the command you ran", file=sys.stderr)
        return EXIT_PROBLEMS
    with contextlib.suppress(BrokenPipeError):
        print(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
