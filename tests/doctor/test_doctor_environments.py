"""Each broken environment is built for real; the doctor must name its cause.

Runs as root and as an unprivileged user (CI runs both): user namespaces, bwrap and
Landlock need no privilege here.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from .helpers import PYTHON, Place, no_litter, run_doctor

FILE_IN_DIRS = ("rename_across_dirs", "hardlink_across_dirs")
INTO_WORKSPACE = ("hardlink_into_workspace", "rename_into_workspace")
TOOLS = ("uv", "pip", "npm", "cargo")


def test_plain_directories_pass_every_probe_and_leave_no_litter(place: Place) -> None:
    mine = place.ws / "mine.txt"
    mine.write_text("user data")
    os.utime(mine, ns=(10**9, 10**9))
    run = run_doctor(place, "--workspace", str(place.ws), "--cache", str(place.cache))
    assert run.failed() == []
    assert run.code == 0 and run.report["ok"] is True
    probes = run.report["probes"]
    assert isinstance(probes, list)
    # The resource-limit rows depend on who runs (test_doctor_limits judges them).
    probes = [p for p in probes if p["location"] != "limits"]
    assert {p["status"] for p in probes} == {"pass"}, [p for p in probes if p["status"] != "pass"]
    for tool in TOOLS:
        assert run.probe("hardlink_into_workspace", f"tool-cache:{tool}->workspace")["status"] == "pass"
    assert run.probe("git_commit", "workspace")["status"] == "pass"
    assert no_litter(place) == []
    assert sorted(p.name for p in place.ws.iterdir()) == ["mine.txt"]
    assert mine.read_text() == "user data" and mine.stat().st_mtime_ns == 10**9


def test_separate_bind_mounts_are_named(place: Place, bwrap: str) -> None:
    prefix = (bwrap, "--dev-bind", "/", "/", "--bind", str(place.ws), str(place.ws))
    prefix += ("--bind", str(place.cache), str(place.cache))
    run = run_doctor(place, "--workspace", str(place.ws), "--cache", str(place.cache), prefix=prefix)
    assert run.code == 1
    for probe in INTO_WORKSPACE:
        assert run.cause(probe, "cache->workspace") == "separate_bind_mounts"
        # $HOME (the tool caches) stayed on the / mount: a third mount of the same disk.
        assert run.cause(probe, "tool-cache:uv->workspace") == "separate_bind_mounts"
    for loc in ("workspace", "cache"):
        for probe in FILE_IN_DIRS:
            assert run.probe(probe, loc)["status"] == "pass"
    assert run.report["inferred"] == {"landlock_refer_blocked": False}
    assert no_litter(place) == []


LANDLOCK_ABI1 = """
import os, sys
from warren._core import _sys
ABI1_FS = (1 << 13) - 1
ruleset = _sys.landlock_create_ruleset(ABI1_FS)
_sys.landlock_add_path_rule(ruleset, os.open("/", os.O_PATH), ABI1_FS)
_sys.prctl(_sys.PR_SET_NO_NEW_PRIVS, 1)
_sys.landlock_restrict_self(ruleset)
os.execv(sys.argv[1], sys.argv[1:])
"""


def test_landlock_without_refer_is_named(place: Place) -> None:
    from warren._core import _sys

    if _sys.landlock_abi() < 1:
        pytest.skip("this kernel has no Landlock")
    run = run_doctor(
        place, "--workspace", str(place.ws), "--cache", str(place.cache), prefix=(PYTHON, "-c", LANDLOCK_ABI1)
    )
    assert run.code == 1
    assert run.report["process"]["no_new_privs"] is True  # type: ignore[index]
    assert run.report["inferred"] == {"landlock_refer_blocked": True}
    for loc in ("workspace", "cache"):
        assert run.probe("rename_same_dir", loc)["status"] == "pass"
        for probe in (*FILE_IN_DIRS, "dir_rename_across_dirs"):
            assert run.cause(probe, loc) == "landlock_no_refer"
    for probe in INTO_WORKSPACE:
        assert run.cause(probe, "cache->workspace") == "landlock_no_refer"
    assert {cause for _, _, cause in run.failed()} == {"landlock_no_refer"}
    assert no_litter(place) == []


def _overlay(place: Place, extra: str = "") -> tuple[Path, str]:
    o = place.root / "o"
    for d in ("lower/from-image", "upper", "work", "merged"):
        (o / d).mkdir(parents=True)
    (o / "lower/from-image/f").write_text("layer")
    opts = f"lowerdir={o}/lower,upperdir={o}/upper,workdir={o}/work{extra}"
    return o / "merged", f"mount -t overlay overlay -o {opts} {o}/merged"


def test_overlay_in_user_namespace_without_userxattr_is_named(place: Place, userns: None) -> None:
    merged, mount = _overlay(place)
    run = run_doctor(place, "--workspace", str(merged), prefix=("unshare", "-rm"), shell=mount)
    ws = run.report["locations"][0]  # type: ignore[index]
    assert ws["fstype"] == "overlay" and "userxattr" not in ws["super_options"]
    assert run.cause("dir_rename_into_root", "workspace") == "overlay_dir_limit"
    # Files do cross directories: it is not Landlock.
    for probe in FILE_IN_DIRS:
        assert run.probe(probe, "workspace")["status"] == "pass"
    assert run.report["inferred"] == {"landlock_refer_blocked": False}
    # The tool caches really are another filesystem: reported, but not a failure.
    assert run.cause("hardlink_into_workspace", "tool-cache:uv->workspace") == "cross_device"
    assert run.probe("hardlink_into_workspace", "tool-cache:uv->workspace")["status"] == "warn"
    assert run.failed() == [("workspace", "dir_rename_into_root", "overlay_dir_limit")]
    assert run.code == 1


def test_overlay_with_userxattr_moves_new_directories(place: Place, userns: None) -> None:
    merged, mount = _overlay(place, ",userxattr")
    run = run_doctor(place, "--workspace", str(merged), prefix=("unshare", "-rm"), shell=mount)
    assert run.probe("dir_rename_into_root", "workspace")["status"] == "pass"
    assert run.failed() == []


def test_read_only_cache_is_named(place: Place, userns: None) -> None:
    c = place.cache
    ro = f"mount --bind {c} {c} && mount -o remount,bind,ro {c}"
    run = run_doctor(
        place, "--workspace", str(place.ws), "--cache", str(c), prefix=("unshare", "-rm"), shell=ro
    )
    assert run.code == 1
    assert run.cause("create_dir", "cache") == "read_only"
    assert run.probe("create_dir", "cache")["errno_name"] == "EROFS"
    assert run.report["locations"][1]["read_only"] is True  # type: ignore[index]
    assert run.probe("rename_across_dirs", "cache")["status"] == "skip"
    assert run.probe("create_file", "workspace")["status"] == "pass"


def test_unwritable_cache_is_named(place: Place) -> None:
    prefix: tuple[str, ...] = ()
    if os.geteuid() == 0:
        # Root writes anywhere through CAP_DAC_OVERRIDE: drop every capability.
        if shutil.which("setpriv") is None:
            pytest.skip("as root this needs setpriv to drop capabilities")
        prefix = ("setpriv", "--bounding-set=-all", "--inh-caps=-all")
    place.cache.chmod(0o555)
    try:
        run = run_doctor(place, "--workspace", str(place.ws), "--cache", str(place.cache), prefix=prefix)
    finally:
        place.cache.chmod(0o755)
    assert run.code == 1
    assert run.cause("create_dir", "cache") == "not_writable"
    cause = run.probe("create_dir", "cache")["cause"]
    assert "mode 0o555" in cause["explanation"]  # type: ignore[index]
    assert [(loc, probe) for loc, probe, _ in run.failed()] == [("cache", "create_dir")]


def test_deleted_cwd_is_named(place: Place) -> None:
    gone = place.root / "gone"
    gone.mkdir()
    run = run_doctor(place, "--workspace", str(place.ws), cwd=gone, shell=f"rmdir {gone}")
    assert run.code == 1
    assert run.cause("cwd", "process") == "deleted_cwd"
    assert run.report["process"]["cwd_deleted"] is True  # type: ignore[index]
    assert run.probe("git_commit", "workspace")["status"] == "pass"


def test_deleted_cwd_without_a_workspace_still_reports(place: Place) -> None:
    gone = place.root / "gone"
    gone.mkdir()
    run = run_doctor(place, cwd=gone, shell=f"rmdir {gone}")
    assert run.code == 1
    assert run.cause("cwd", "process") == "deleted_cwd"
    assert run.probe("hardlink_into_workspace", "tool-cache:uv->workspace")["status"] == "skip"


def test_cache_on_another_filesystem_warns_but_passes(place: Place, userns: None) -> None:
    tmpfs = f"mount -t tmpfs doctor-test {place.cache}"
    run = run_doctor(
        place,
        "--workspace",
        str(place.ws),
        "--cache",
        str(place.cache),
        prefix=("unshare", "-rm"),
        shell=tmpfs,
    )
    for probe in INTO_WORKSPACE:
        assert run.cause(probe, "cache->workspace") == "cross_device"
        assert run.probe(probe, "cache->workspace")["status"] == "warn"
    assert run.report["locations"][1]["fstype"] == "tmpfs"  # type: ignore[index]
    assert run.code == 0 and run.failed() == []


def test_owner_unmapped_in_user_namespace_is_uid_mapping(place: Place, userns: None) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: a workspace owned by another uid that the caller may write")
    os.chown(place.ws, 1001, 1001)
    run = run_doctor(place, "--workspace", str(place.ws), prefix=("unshare", "-r"))
    assert run.cause("create_dir", "workspace") == "uid_mapping"
    assert run.report["process"]["user_namespace"] is True  # type: ignore[index]
    assert run.code == 1


def test_table_names_cause_and_fix(place: Place, userns: None) -> None:
    import subprocess

    c = place.cache
    script = f'mount --bind {c} {c} && mount -o remount,bind,ro {c} && exec "$@"'
    cmd = ["unshare", "-rm", "sh", "-c", script, "sh", PYTHON, "-m", "warren.doctor"]
    p = subprocess.run(
        [*cmd, "--workspace", str(place.ws), "--cache", str(c)],
        env=place.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 1, p.stderr
    row = next(line for line in p.stdout.splitlines() if line.startswith("create_dir") and " cache " in line)
    assert "FAIL" in row and "read_only" in row
    assert "[read_only] read-only mount" in p.stdout
    assert "fix: mount it read-write" in p.stdout
    assert "NOT OK" in p.stdout.splitlines()[-1]


@pytest.mark.skipif(sys.platform != "linux", reason="Linux only")
def test_doctor_runs_in_seconds(place: Place) -> None:
    import time

    t = time.monotonic()
    run_doctor(place, "--workspace", str(place.ws), "--cache", str(place.cache))
    assert time.monotonic() - t < 10
