"""The resource-limit rows, judged against what this test itself can do as this user.

Runs as root and as an unprivileged user. Each row must agree with the test's own
attempt: a mkdir beneath its own cgroup, forks against RLIMIT_NPROC in a user namespace
made by unshare(1), a tmpfs filled by head(1). The test shares the doctor's cgroups (a
child process stays in its parent's), so both try the same directories.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import PYTHON, Place, Run, run_doctor

V1 = ("pids", "memory", "cpu", "freezer")
SIGNALS = "signals (SIGSTOP/SIGCONT)"


def own_cgroups() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(","):
            out[c] = path
    return out


def v1_dir(controller: str) -> Path | None:
    base = Path("/sys/fs/cgroup") / controller
    own = own_cgroups().get(controller)
    if own is None or not (base / "cgroup.procs").exists():
        return None
    return base / own.lstrip("/")


def v2_mount() -> str | None:
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if fields[2] == "cgroup2":
            return fields[1]
    return None


def v2_dir() -> Path | None:
    point, own = v2_mount(), own_cgroups().get("")
    return None if point is None or own is None else Path(point) / own.lstrip("/")


def my_mkdir(parent: Path) -> tuple[int | None, list[str]]:
    """This test's own attempt: (None, files of the child) when it can make a cgroup
    beneath ``parent`` (and removes it), else (errno, [])."""
    child = parent / f"warren-doctor-test-{os.getpid()}"
    try:
        child.mkdir()
    except OSError as e:
        return e.errno, []
    try:
        return None, sorted(p.name for p in child.iterdir())
    finally:
        child.rmdir()


def doctor_cgroups(dirs: list[Path]) -> list[str]:
    return sorted(str(p) for d in dirs for p in d.iterdir() if p.name.startswith("warren-doctor-"))


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Run:
    root = tmp_path_factory.mktemp("limits")
    for name in ("ws", "home", "tmp"):
        (root / name).mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(root / "home"), "LANG": "C.UTF-8"}
    env["TMPDIR"] = str(root / "tmp")
    place = Place(root, root / "ws", root / "ws", root / "home", root / "tmp", env)
    return run_doctor(place, "--workspace", str(place.ws), "--only-given")


@pytest.mark.parametrize("controller", V1)
def test_cgroup1_row_agrees_with_this_users_own_mkdir_beneath_its_cgroup(
    controller: str, report: Run
) -> None:
    parent = v1_dir(controller)
    if parent is None:
        pytest.skip(f"no cgroup v1 {controller} hierarchy at /sys/fs/cgroup/{controller}")
    row = report.probe(f"cgroup1_{controller}", "limits")
    facts = row["facts"]
    assert isinstance(facts, dict)
    assert facts["directory"] == str(parent) and facts["own_cgroup"] == own_cgroups()[controller]
    err, _ = my_mkdir(parent)
    if err is None:
        assert row["status"] == "pass" and facts["usable"] is True, row
        assert str(row["detail"]).startswith("usable: ")
    else:
        assert row["status"] == "warn" and row["errno"] == err and facts["usable"] is False, row
        assert row["cause"]["id"] == "cgroup_not_writable"  # type: ignore[index]
        assert f"not writable by uid {os.geteuid()}" in str(row["message"])


def test_cgroup1_pids_is_usable_by_root_and_refused_with_eacces_to_others(report: Run) -> None:
    parent = v1_dir("pids")
    if parent is None or parent.stat().st_uid == os.geteuid() != 0:
        pytest.skip("no cgroup v1 pids hierarchy, or one delegated to this user")
    err, _ = my_mkdir(parent)
    row = report.probe("cgroup1_pids", "limits")
    if os.geteuid() == 0:
        assert err is None and row["status"] == "pass"
    else:
        assert err == errno.EACCES and row["status"] == "warn" and row["errno"] == errno.EACCES
        # The fallback named is the one nproc_per_userns measured.
        assert "RLIMIT_NPROC" in row["cause"]["explanation"]  # type: ignore[index]


def test_cgroup1_memory_refused_says_memory_is_limited_per_process(report: Run) -> None:
    parent = v1_dir("memory")
    if parent is None or my_mkdir(parent)[0] is None:
        pytest.skip("this user can make memory cgroups here")
    row = report.probe("cgroup1_memory", "limits")
    assert "per process only (RLIMIT_DATA)" in row["cause"]["explanation"]  # type: ignore[index]


def test_cgroup2_row_reports_the_mount_own_cgroup_controllers_and_writability(report: Run) -> None:
    parent = v2_dir()
    if parent is None:
        pytest.skip("no cgroup2 mount")
    row = report.probe("cgroup2", "limits")
    facts = row["facts"]
    assert isinstance(facts, dict)
    controllers = (parent / "cgroup.controllers").read_text().split()
    assert facts["mount_point"] == v2_mount() and facts["own_cgroup"] == own_cgroups()[""]
    assert facts["controllers"] == controllers
    assert facts["subtree_control"] == (parent / "cgroup.subtree_control").read_text().split()
    bound = [c for c in ("memory", "pids", "cpu") if c not in controllers and v1_dir(c) is not None]
    assert facts["bound_to_v1"] == bound
    said = str(row["detail"] or row["message"])
    if bound:
        assert f"{', '.join(bound)} bound to cgroup v1" in said
    err, files = my_mkdir(parent)
    assert facts["writable"] is (err is None)
    assert row["status"] == ("pass" if err is None else "warn"), row
    assert facts["freeze"] is ("cgroup.freeze" in files)


def test_pause_row_names_the_mechanism_this_users_own_attempts_imply(report: Run) -> None:
    freezer, v2 = v1_dir("freezer"), v2_dir()
    if freezer is not None and my_mkdir(freezer)[0] is None:
        expected = "cgroup1 freezer"
    elif v2 is not None and "cgroup.freeze" in my_mkdir(v2)[1]:
        expected = "cgroup2 cgroup.freeze"
    else:
        expected = SIGNALS
    row = report.probe("pause", "limits")
    assert row["facts"] == {"mechanism": expected}
    assert row["status"] == ("warn" if expected == SIGNALS else "pass")


FORK_UNDER_NPROC = """
import os, resource
resource.setrlimit(resource.RLIMIT_NPROC, (3, 3))
r, w = os.pipe()
kids, err = [], None
for _ in range(5):
    try:
        pid = os.fork()
    except OSError as e:
        err = e.errno
        break
    if pid == 0:
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    kids.append(pid)
os.close(w)
for pid in kids:
    os.waitpid(pid, 0)
print(len(kids), err)
"""


@pytest.fixture
def idle_processes() -> Iterator[None]:
    """Four processes of this user, so it certainly owns more than 3 outside."""
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(4)]
    yield
    for p in procs:
        p.kill()
        p.wait()


def test_nproc_row_matches_forks_counted_in_a_user_namespace_unshare_makes(
    report: Run, userns: None, idle_processes: None
) -> None:
    p = subprocess.run(
        ["unshare", "--user", "--map-current-user", PYTHON, "-c", FORK_UNDER_NPROC],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    forked, err = p.stdout.split()
    row = report.probe("nproc_per_userns", "limits")
    facts = row["facts"]
    assert isinstance(facts, dict)
    if os.getuid() == 0:
        # The kernel exempts root: every fork succeeds, here and in the doctor.
        assert (forked, err) == ("5", "None")
        assert row["status"] == "skip" and facts["forked"] == facts["limit"] == 3
    else:
        # Kernel >= 5.14: the namespace holds 3 tasks, though this user has more outside.
        assert (forked, err) == ("2", str(errno.EAGAIN))
        assert row["status"] == "pass" and facts["per_user_namespace"] is True, row
        assert facts["forked"] == 2 and facts["errno"] == errno.EAGAIN
        assert isinstance(facts["tasks_outside"], int) and facts["tasks_outside"] > 3


def test_tmpfs_row_matches_a_tmpfs_this_test_fills_itself(report: Run, userns: None, tmp_path: Path) -> None:
    target = tmp_path / "mnt"
    target.mkdir()
    fill = f"head -c 2097152 /dev/zero > {target}/f; stat -c %s {target}/f"
    script = f"mount -t tmpfs -o size=1M none {target} && {fill}"
    p = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert "No space left on device" in p.stderr, p.stderr
    row = report.probe("tmpfs_size", "limits")
    assert row["status"] == "pass", row
    assert row["facts"]["written"] == int(p.stdout) == 1 << 20  # type: ignore[index]
    assert row["facts"]["errno"] == errno.ENOSPC  # type: ignore[index]


# Runs the doctor as a child subreaper: a process the doctor forked and did not reap is
# reparented here, and is listed (then killed) once the doctor has exited.
SUBREAPER = """
import ctypes, os, signal, subprocess, sys
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE)
sys.stdout.buffer.write(p.stdout)
left = []
for pid in os.listdir("/proc"):
    try:
        status = open(f"/proc/{pid}/status").read()
    except OSError:
        continue
    if f"PPid:\\t{os.getpid()}\\n" in status:
        left.append(pid)
        os.kill(int(pid), signal.SIGKILL)
        os.waitpid(int(pid), 0)
print("left:" + ",".join(left), file=sys.stderr)
"""


def test_limit_probes_leave_no_cgroup_and_no_process_behind(place: Place) -> None:
    dirs = [d for d in [*(v1_dir(c) for c in V1), v2_dir()] if d is not None]
    if not dirs:
        pytest.skip("no cgroup hierarchy here")
    before = doctor_cgroups(dirs)
    run = run_doctor(place, "--workspace", str(place.ws), "--only-given", prefix=(PYTHON, "-c", SUBREAPER))
    assert "left:\n" in run.stderr, run.stderr
    # Other sandboxes may come and go in these directories meanwhile: compare the names
    # only a doctor makes.
    assert doctor_cgroups(dirs) == before
    rows = [p for p in run.report["probes"] if p["location"] == "limits"]  # type: ignore[union-attr]
    assert [p["id"] for p in rows if p["id"] == "cleanup"] == []
    if os.geteuid() == 0:
        made = [p["id"] for p in rows if p["id"].startswith("cgroup") and p["status"] == "pass"]
        assert made, "as root the probes made (and removed) cgroups: the comparison above means something"


def test_no_limits_leaves_the_rows_out(place: Place) -> None:
    run = run_doctor(place, "--workspace", str(place.ws), "--only-given", "--no-limits")
    assert [p for p in run.report["probes"] if p["location"] == "limits"] == []  # type: ignore[union-attr]
    assert run.code == 0 and run.report["ok"] is True
