"""The resource-limit rows' decisions, pure: hand-built rows -> pause mechanism, causes, table."""

from __future__ import annotations

import errno as E

from warren.doctor import diagnose as dg
from warren.doctor import limits, report
from warren.doctor.evidence import Evidence, MountEntry, Process
from warren.doctor.probes import ProbeResult

USER = Evidence(Process(kernel="6.18", uid=1001, gid=1001))
ROOT = Evidence(Process(kernel="6.18", uid=0, gid=0))


def row(probe_id: str, status: str = "pass", **kw: object) -> ProbeResult:
    return ProbeResult(probe_id, probe_id, "limits", status, False, **kw)  # type: ignore[arg-type]


def refused(probe_id: str, err: int = E.EACCES, operation: str = "mkdir") -> ProbeResult:
    return row(
        probe_id, "fail", operation=operation, errno=err, message=f"not writable by uid 1001 ({probe_id})"
    )


def mount(point: str, root: str = "/", fstype: str = "cgroup", opts: str = "rw,pids") -> MountEntry:
    return MountEntry(30, 1, "0:30", root, point, "rw", fstype, "cgroup", opts)


def test_pause_prefers_a_v1_freezer_then_cgroup2_freeze_then_signals() -> None:
    v2_freeze = row("cgroup2", facts={"freeze": True})
    assert limits.pause_mechanism([row("cgroup1_freezer"), v2_freeze]) == "cgroup1 freezer"
    assert limits.pause_mechanism([refused("cgroup1_freezer"), v2_freeze]) == "cgroup2 cgroup.freeze"
    v2_without = row("cgroup2", facts={"freeze": False})
    assert limits.pause_mechanism([refused("cgroup1_freezer"), v2_without]) == "signals (SIGSTOP/SIGCONT)"
    assert (
        limits.pause_mechanism([refused("cgroup1_freezer"), refused("cgroup2")])
        == "signals (SIGSTOP/SIGCONT)"
    )


def test_a_refused_memory_cgroup_says_memory_is_limited_per_process_only() -> None:
    r = refused("cgroup1_memory")
    c = dg.explain(r, USER, [r])
    assert c is not None and c.id == "cgroup_not_writable"
    assert "RLIMIT_DATA" in c.explanation and "per process only" in c.explanation
    assert "root" in c.fix and "delegate" in c.fix
    assert report.final_status(r, c) == "warn"


def test_a_refused_pids_cgroup_names_the_nproc_fallback_as_that_row_measured_it() -> None:
    pids = refused("cgroup1_pids")
    counted = row("nproc_per_userns", facts={"forked": 2})
    c = dg.explain(pids, USER, [pids, counted])
    assert c is not None and "caps the whole sandbox" in c.explanation
    broken = row("nproc_per_userns", "fail", operation="fork", errno=E.EAGAIN, message="only 0 forks")
    c = dg.explain(pids, USER, [pids, broken])
    assert c is not None and "does not cap the whole sandbox" in c.explanation
    exempt = row("nproc_per_userns", "skip", facts={"forked": 5})
    c = dg.explain(pids, ROOT, [pids, exempt])
    assert c is not None and "never applies RLIMIT_NPROC to root" in c.explanation


def test_limit_failures_get_their_own_causes() -> None:
    absent = row("cgroup1_cpu", "fail", operation="mountinfo", message="no cgroup v1 hierarchy has cpu")
    assert (c := dg.explain(absent, USER, [absent])) is not None and c.id == "cgroup_absent"
    userns = row("tmpfs_size", "fail", operation="unshare(CLONE_NEWUSER)", errno=E.EPERM, message="EPERM")
    assert (c := dg.explain(userns, USER, [userns])) is not None and c.id == "no_user_namespace"
    per_user = row("nproc_per_userns", "fail", operation="fork", errno=E.EAGAIN, message="only 0 forks")
    assert (c := dg.explain(per_user, USER, [per_user])) is not None and c.id == "nproc_not_per_userns"
    signals = row("pause", "fail", message="signals", facts={"mechanism": "signals (SIGSTOP/SIGCONT)"})
    assert (c := dg.explain(signals, USER, [signals])) is not None and c.id == "no_freezer"
    assert "one by one" in c.explanation


def test_missing_mechanisms_are_warnings_the_verdict_ignores() -> None:
    results = [refused("cgroup1_pids"), refused("cgroup1_memory"), row("pause", "fail", message="signals")]
    built = report.build(USER, results, dg.diagnose(USER, results))
    assert built["ok"] is True
    assert built["summary"] == {"pass": 0, "fail": 0, "warn": 3, "skip": 0, "error": 0}


def test_the_table_gives_limits_their_own_section_with_each_hint_once() -> None:
    results = [refused("cgroup1_pids"), refused("cgroup1_memory"), row("tmpfs_size", detail="enforced")]
    text = report.render(report.build(USER, results, dg.diagnose(USER, results)))
    section = text[text.index("RESOURCE LIMITS") :]
    assert "UID 1001" in section.splitlines()[0]
    for probe_id in ("cgroup1_pids", "cgroup1_memory", "tmpfs_size"):
        assert sum(line.startswith(probe_id + " ") for line in section.splitlines()) == 1
    assert section.count("hint [cgroup_not_writable]") == 1
    assert "Causes:" not in text  # limit causes are not repeated there


def test_a_cgroup_left_behind_is_an_error_that_fails_the_verdict() -> None:
    left = ProbeResult("cleanup", "remove", "limits", "error", True, message="left /sys/fs/cgroup/pids/x")
    assert report.build(USER, [left], dg.diagnose(USER, [left]))["ok"] is False


def test_own_cgroup_is_found_below_a_mount_that_shows_only_a_subtree() -> None:
    own = limits.parse_proc_cgroup("12:pids:/docker/abc/x\n4:cpu,cpuacct:/\n0::/user.slice\n")
    assert own == {"pids": "/docker/abc/x", "cpu": "/", "cpuacct": "/", "": "/user.slice"}
    assert limits.own_dir([mount("/sys/fs/cgroup/pids")], own["pids"]) == "/sys/fs/cgroup/pids/docker/abc/x"
    container = mount("/sys/fs/cgroup/pids", root="/docker/abc")
    assert limits.own_dir([container], own["pids"]) == "/sys/fs/cgroup/pids/x"
    assert limits.own_dir([container], "/docker/abcd") is None
    # In a cgroup namespace a mount made outside it has root "/..": no path reaches the cgroup.
    assert limits.own_dir([mount("/sys/fs/cgroup/pids", root="/..")], "/warren-0-1") is None
