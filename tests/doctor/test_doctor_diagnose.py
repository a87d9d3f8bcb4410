"""The diagnosis is a pure function: hand-built evidence and results -> causes."""

from __future__ import annotations

import errno as E
import re
from pathlib import Path

from warren.doctor import diagnose as dg
from warren.doctor import report
from warren.doctor.evidence import Evidence, Location, Process, parse_mountinfo
from warren.doctor.probe_base import ProbeResult, _result

HOST = Process(kernel="6.18", uid=1001, gid=1001, landlock_abi=7, seccomp="disabled", cwd="/w")


def loc(role: str, mount_id: int = 27, dev: str = "254:0", fstype: str = "ext4", **kw: object) -> Location:
    base: dict[str, object] = {
        "exists": True,
        "mount_id": mount_id,
        "dev": dev,
        "fstype": fstype,
        "mount_point": "/",
        "owner_uid": 1001,
        "mode": "0o755",
        "dac_writable": True,
    }
    base.update(kw)
    return Location(role, f"/{role}", probe_dir=f"/{role}", **base)  # type: ignore[arg-type]


def fail(probe_id: str, location: str = "workspace", err: int | None = E.EXDEV, **kw: object) -> ProbeResult:
    fields: dict[str, object] = {"operation": "rename", "errno": err, "kind": "file"}
    fields.update(kw)
    return ProbeResult(probe_id, probe_id, location, "fail", True, **fields)  # type: ignore[arg-type]


def ok(probe_id: str, location: str = "workspace") -> ProbeResult:
    return ProbeResult(probe_id, probe_id, location, "pass", True)


def cause_of(
    r: ProbeResult, *locs: Location, process: Process = HOST, others: tuple[ProbeResult, ...] = ()
) -> str:
    ev = Evidence(process, locs)
    c = dg.explain(r, ev, [*others, r])
    assert c is not None
    assert c.fix and c.explanation
    return c.id


def between(probe_id: str, err: int = E.EXDEV) -> ProbeResult:
    return fail(probe_id, "cache->workspace", err, src="cache", dst="workspace", operation="link")


def test_exdev_between_two_mounts_of_one_filesystem_is_separate_bind_mounts() -> None:
    r = between("hardlink_into_workspace")
    assert cause_of(r, loc("workspace", 40), loc("cache", 41)) == "separate_bind_mounts"


def test_exdev_between_two_filesystems_is_cross_device_and_only_a_warning() -> None:
    r = between("hardlink_into_workspace")
    ev = Evidence(HOST, (loc("workspace", 40), loc("cache", 41, dev="0:50", fstype="tmpfs")))
    c = dg.explain(r, ev, [r])
    assert c is not None and c.id == "cross_device"
    assert report.final_status(r, c) == "warn"


def test_file_exdev_within_one_mount_is_landlock_without_refer() -> None:
    r = fail("rename_across_dirs")
    assert cause_of(r, loc("workspace"), others=(ok("rename_same_dir"),)) == "landlock_no_refer"
    r2 = between("rename_into_workspace")
    assert cause_of(r2, loc("workspace"), loc("cache")) == "landlock_no_refer"


def test_dir_exdev_on_overlay_is_overlay_unless_files_show_the_landlock_signature() -> None:
    ws = loc("workspace", fstype="overlay", super_options="rw,lowerdir=/l,redirect_dir=nofollow")
    r = fail("dir_rename_into_root", kind="dir")
    assert cause_of(r, ws, others=(ok("rename_across_dirs"),)) == "overlay_dir_limit"
    files_too = fail("rename_across_dirs")
    assert cause_of(r, ws, others=(files_too,)) == "landlock_no_refer"


def test_dir_exdev_on_ext4_is_landlock() -> None:
    assert cause_of(fail("dir_rename_across_dirs", kind="dir"), loc("workspace")) == "landlock_no_refer"


def test_exdev_where_plain_cross_directory_renames_work_is_not_blamed_on_landlock() -> None:
    r = fail("o_tmpfile", operation="linkat(O_TMPFILE)")
    assert cause_of(r, loc("workspace"), others=(ok("rename_across_dirs"),)) == "unknown"


def test_erofs_is_read_only() -> None:
    r = fail("create_dir", "cache", E.EROFS, operation="mkdir", kind="dir")
    assert cause_of(r, loc("cache", mount_options="ro,relatime", read_only=True)) == "read_only"


def test_eacces_with_permissions_denied_is_not_writable_naming_owner_and_mode() -> None:
    r = fail("create_dir", "cache", E.EACCES, operation="mkdir")
    ev = Evidence(HOST, (loc("cache", owner_uid=0, mode="0o755", dac_writable=False),))
    c = dg.explain(r, ev, [r])
    assert c is not None and c.id == "not_writable"
    assert "uid 0, mode 0o755" in c.explanation and "uid 1001" in c.explanation


def test_eacces_although_permissions_allow_blames_a_security_module() -> None:
    r = fail("create_dir", "tool-cache:uv", E.EACCES, operation="mkdir")
    ev = Evidence(HOST, (loc("tool-cache:uv", dac_writable=True),))
    c = dg.explain(r, ev, [r])
    assert c is not None and c.id == "not_writable"
    assert "security module" in c.explanation and "Landlock" in c.explanation


def test_owner_shown_as_overflow_uid_in_a_user_namespace_is_uid_mapping() -> None:
    inside = Process(uid=0, uid_map="0 1001 1", landlock_abi=7)
    r = fail("create_dir", err=E.EACCES, operation="mkdir")
    assert cause_of(r, loc("workspace", owner_uid=65534, dac_writable=False), process=inside) == "uid_mapping"


def test_eperm_on_a_passthrough_filesystem_that_local_permissions_allow_is_uid_mapping() -> None:
    r = fail("create_file", err=E.EPERM, operation="create")
    assert cause_of(r, loc("workspace", fstype="virtiofs", dev="0:40")) == "uid_mapping"


def test_eoverflow_is_uid_mapping() -> None:
    assert (
        cause_of(fail("create_file", err=E.EOVERFLOW, operation="create"), loc("workspace")) == "uid_mapping"
    )


def test_eperm_under_a_seccomp_filter_is_seccomp() -> None:
    filtered = Process(uid=1001, seccomp="filter", seccomp_filters=1)
    r = fail("renameat2_exchange", err=E.EPERM, operation="renameat2(EXCHANGE)")
    assert cause_of(r, loc("workspace"), process=filtered) == "seccomp_denied"
    assert cause_of(fail("inotify", err=E.ENOSYS), loc("workspace"), process=filtered) == "seccomp_denied"


def test_unsupported_operations_and_broken_semantics_are_fs_unsupported() -> None:
    assert cause_of(fail("o_tmpfile", err=E.EOPNOTSUPP), loc("workspace", fstype="9p")) == "fs_unsupported"
    lax = fail("flock", err=None, operation="flock", message="a second exclusive lock was granted")
    assert cause_of(lax, loc("workspace", fstype="fuse")) == "fs_unsupported"


def test_missing_tmpdir_is_named() -> None:
    r = fail("create_dir", "tmpdir", E.ENOENT, operation="mkdir")
    assert cause_of(r, loc("tmpdir", exists=False)) == "missing_dir"


def test_deleted_cwd() -> None:
    gone = Process(cwd=None, cwd_deleted=True, cwd_link="/w (deleted)")
    r = fail("cwd", "process", E.ENOENT, operation="getcwd")
    assert cause_of(r, process=gone) == "deleted_cwd"


def test_passing_probes_have_no_cause() -> None:
    assert dg.diagnose(Evidence(HOST, (loc("workspace"),)), [ok("create_file")]) == [None]


def test_a_crashing_probe_is_reported_as_an_error_with_its_message() -> None:
    def boom() -> str:
        raise RuntimeError("probe bug")

    r = _result("fsync", "fsync", "workspace", True, boom)
    assert r.status == "error" and r.message == "RuntimeError: probe bug"
    built = report.build(Evidence(HOST, (loc("workspace"),)), [r], [None])
    assert built["ok"] is False and built["summary"]["error"] == 1  # type: ignore[index]


def test_optional_failures_warn_and_keep_the_verdict_ok() -> None:
    r = fail("xattr_user", err=E.EOPNOTSUPP, operation="setxattr")
    r = ProbeResult(**{**r.to_dict(), "required": False})  # type: ignore[arg-type]
    ev = Evidence(HOST, (loc("workspace"),))
    built = report.build(ev, [ok("create_file"), r], dg.diagnose(ev, [ok("create_file"), r]))
    assert built["ok"] is True
    assert [p["status"] for p in built["probes"]] == ["pass", "warn"]  # type: ignore[index]
    assert built["causes"][0]["id"] == "fs_unsupported"  # type: ignore[index]


def test_report_has_a_schema_version_and_the_documented_top_level_keys() -> None:
    ev = Evidence(HOST, (loc("workspace"),))
    built = report.build(ev, [ok("create_file")], [None])
    assert built["schema"] == "warren-doctor/1"
    doc = (Path(dg.__file__).parent / "SCHEMA.md").read_text()
    documented = set(re.findall(r"^\| `(\w+)` \|", doc, re.M))
    assert set(built) == documented


def test_every_cause_id_is_documented() -> None:
    doc = (Path(dg.__file__).parent / "SCHEMA.md").read_text()
    for cause_id in dg.CAUSES:
        assert f"`{cause_id}`" in doc, cause_id


def test_mountinfo_parsing_unescapes_paths_and_reads_super_options() -> None:
    text = (
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard\n"
        "65 27 0:39 / /tmp/with\\040space rw,relatime - overlay overlay rw,lowerdir=/l,userxattr\n"
        "70 27 254:0 /home/u/ws /ws ro,relatime shared:1 - ext4 /dev/vda rw\n"
    )
    root, ov, bind = parse_mountinfo(text)
    assert ov.mount_point == "/tmp/with space" and ov.fstype == "overlay" and "userxattr" in ov.super_options
    assert bind.root == "/home/u/ws" and bind.dev == root.dev and bind.read_only and not root.read_only
