"""The mount steps of ``_core.mounts``, executed one at a time in a child's own user
and mount namespaces, and judged from the host: what the step made read-only gets
no write through it, what it hid is still there on the host, what it bound writable
writes through to the host directory."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from warren._core import _sys, mounts
from warren.plan.model import MountKind, MountOp

from .child import attempt, in_child


def test_mask_makes_every_entry_but_the_kept_ones_read_only(tmp_path: Path) -> None:
    base = tmp_path / "base"
    (base / "keep").mkdir(parents=True)
    (base / "other").mkdir()
    (base / "file").write_text("x")

    def inside() -> dict[str, str]:
        mounts._mask(str(base), ("keep",))
        return {
            "keep": attempt(lambda: (base / "keep" / "new").write_text("y")),
            "other": attempt(lambda: (base / "other" / "new").write_text("y")),
            "file": attempt(lambda: (base / "file").write_text("changed")),
            "chmod": attempt(lambda: os.chmod(base / "other", 0o700)),
        }

    got = in_child(inside, namespaces=True)
    assert got == {"keep": "ok", "other": "EROFS", "file": "EROFS", "chmod": "EROFS"}
    assert (base / "keep" / "new").read_text() == "y"
    assert not (base / "other" / "new").exists() and (base / "file").read_text() == "x"


def test_a_masked_symlink_is_left_alone_not_followed(tmp_path: Path) -> None:
    """A link in a masked directory is no mount point: masking must not follow it to
    whatever it names (outside, here) and make that read-only."""
    base, outside = tmp_path / "base", tmp_path / "outside"
    base.mkdir()
    outside.mkdir()
    (base / "link").symlink_to(outside)

    def inside() -> str:
        mounts._mask(str(base), ())
        return attempt(lambda: (outside / "new").write_text("y"))

    assert in_child(inside, namespaces=True) == "ok"
    assert (outside / "new").read_text() == "y"


def test_rebind_writable_makes_a_read_only_view_writable_again(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()

    def inside() -> list[str]:
        mounts._apply(MountOp(MountKind.RO_SELF, str(root)), str(root), None)
        before = attempt(lambda: (root / "before").write_text("x"))
        mounts.rebind_writable(str(root))
        after = attempt(lambda: (root / "after").write_text("x"))
        return [before, after]

    assert in_child(inside, namespaces=True) == ["EROFS", "ok"]
    assert not (root / "before").exists()
    made = (root / "after").stat()
    assert (made.st_uid, made.st_gid) == (os.getuid(), os.getgid())


def test_a_read_only_tmpfs_hides_a_denied_directory_and_takes_no_write(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key").write_text("k")

    def inside() -> dict[str, object]:
        mounts._apply(MountOp(MountKind.TMPFS, str(secret), readonly=True), str(secret), None)
        return {"listing": os.listdir(secret), "write": attempt(lambda: (secret / "x").write_text("x"))}

    assert in_child(inside, namespaces=True) == {"listing": [], "write": "EROFS"}
    assert (secret / "key").read_text() == "k" and not (secret / "x").exists()


def test_a_read_write_bind_writes_through_but_its_submounts_stay_read_only(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "sub").mkdir(parents=True)
    dst.mkdir()

    def inside() -> dict[str, str]:
        # A writable submount of the source: the clone must not carry it writable.
        mounts._apply(MountOp(MountKind.TMPFS, str(src / "sub")), str(src / "sub"), None)
        op = MountOp(MountKind.BIND_RW, str(dst), source=str(src))
        mounts._apply(op, str(dst), mounts._preclone(op))
        return {
            "top": attempt(lambda: (dst / "new").write_text("y")),
            "submount": attempt(lambda: (dst / "sub" / "x").write_text("y")),
            "source submount": attempt(lambda: (src / "sub" / "x").write_text("y")),
        }

    got = in_child(inside, namespaces=True)
    assert got == {"top": "ok", "submount": "EROFS", "source submount": "ok"}
    assert (src / "new").read_text() == "y"


def test_a_denied_file_shows_empty_and_only_where_the_planned_file_still_is(tmp_path: Path) -> None:
    stand_in = tmp_path / "denied"
    stand_in.write_bytes(b"")
    target, moved = tmp_path / ".env", tmp_path / "other"
    target.write_text("SECRET")
    moved.write_text("not planned")
    planned = target.stat()

    def inside() -> dict[str, str]:
        mounts._mask_file(str(stand_in), str(target), (planned.st_dev, planned.st_ino))
        return {
            "content": target.read_text(),
            "elsewhere": attempt(
                lambda: mounts._mask_file(str(stand_in), str(moved), (planned.st_dev, planned.st_ino))
            ),
        }

    assert in_child(inside, namespaces=True) == {"content": "", "elsewhere": "ESTALE"}
    assert target.read_text() == "SECRET" and moved.read_text() == "not planned"


@pytest.mark.parametrize("when", ["before-the-step", "after-the-open"])
def test_a_masked_link_removed_before_its_step_is_skipped(tmp_path: Path, when: str) -> None:
    """A workspace file linked to a denied one (masked by descriptor, ``op.ident``)
    removed between the plan and its step, or between the step's open and its bind
    (the kernel refuses a mount on an unlinked file with ENOENT): nothing is left at the
    name to hide, and the start goes on; the file's other name is untouched."""
    stage = tmp_path / "stage"
    (stage / "dev").mkdir(parents=True)
    secret, link = tmp_path / "secret", tmp_path / "ws-link"
    secret.write_text("SECRET")
    os.link(secret, link)
    planned = link.stat()
    op = MountOp(MountKind.DENY_FILE, str(link), ident=(planned.st_dev, planned.st_ino))

    def inside() -> dict[str, object]:
        mounts.STAGE = str(stage)
        real, binds = _sys.mount, []

        def mount(
            source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None
        ) -> None:
            binds.append(target)
            if when == "after-the-open":
                os.unlink(link)  # not a mount point: the child may remove it itself
            real(source, target, fstype, flags, data)

        _sys.mount = mount
        if when == "before-the-step":
            os.unlink(link)
        mounts._apply(op, str(link), None)
        return {"binds": len(binds), "link": link.exists()}

    expected = {"binds": 1 if when == "after-the-open" else 0, "link": False}
    assert in_child(inside, namespaces=True) == expected
    assert secret.read_text() == "SECRET" and not link.exists()


def test_a_denied_path_removed_after_planning_is_skipped_and_one_still_there_is_hidden(
    tmp_path: Path,
) -> None:
    """Another process may remove a denied file or directory between the plan and its
    step (the suite's own tests plant and remove host keys under /etc): the sandbox
    still starts, and what is still there is still hidden."""
    stage = tmp_path / "stage"
    (stage / "dev").mkdir(parents=True)
    gone_file, gone_dir = tmp_path / "gone-key", tmp_path / "gone-dir"
    kept = tmp_path / "kept-key"
    kept.write_text("secret")

    def inside() -> dict[str, str]:
        mounts.STAGE = str(stage)  # the child's own copy of the module: never the runner's
        deny_file = MountOp(MountKind.DENY_FILE, str(gone_file))
        deny_dir = MountOp(MountKind.TMPFS, str(gone_dir), mode=0, readonly=True)
        mounts._apply(deny_file, str(gone_file), None)
        mounts._apply(deny_dir, str(gone_dir), None)
        mounts._apply(MountOp(MountKind.DENY_FILE, str(kept)), str(kept), None)
        # The child still holds every capability of its namespace, so the stand-in's
        # mode does not stop it here: what it reads is the stand-in, not the secret.
        return {"kept": kept.read_text(), "gone": str(gone_file.exists())}

    assert in_child(inside, namespaces=True) == {"kept": "", "gone": "False"}
    assert kept.read_text() == "secret"


@pytest.mark.parametrize("host", ["removed", "replaced", "replaced-after-lookup"])
def test_a_denied_file_the_host_removes_or_replaces_while_it_is_hidden(tmp_path: Path, host: str) -> None:
    """The host removes a denied file, or renames a new one over it, while the sandbox
    is putting its stand-in there (the uid-1001 CI run once failed its start with ENOENT
    at "deny_file /etc/ssh/ssh_host_..._key": the root run's test removed its host key
    between the bind and the remount, which the kernel answers by detaching the bind).
    Removed: nothing is left to hide and the start goes on. Replaced: the stand-in is
    over the new file, nosuid and nodev. "replaced-after-lookup" is the kernel's answer
    when the rename lands between the attach's lookup and the attach itself (ENOENT,
    made here by the test since the window is the kernel's own): tried again."""
    stage = tmp_path / "stage"
    (stage / "dev").mkdir(parents=True)
    key = tmp_path / "key"
    key.write_text("OLD-SECRET")
    asked_r, asked_w = os.pipe()
    done_r, done_w = os.pipe()

    def on_the_host() -> None:  # in the runner's namespace, not the child's
        if os.read(asked_r, 1):
            if host == "removed":
                key.unlink()
            else:
                (tmp_path / "key.new").write_text("NEW-SECRET")
                os.rename(tmp_path / "key.new", key)
        os.write(done_w, b"x")

    helper = threading.Thread(target=on_the_host)
    helper.start()

    def inside() -> dict[str, object]:
        mounts.STAGE = str(stage)
        real, calls = _sys.move_mount, []

        def move_mount(fd: int, to_path: str) -> None:
            calls.append(to_path)
            if len(calls) == 1:
                os.write(asked_w, b"x")  # the host acts, then the attach runs
                os.read(done_r, 1)
                if host == "replaced-after-lookup":
                    raise FileNotFoundError(2, "move_mount: No such file or directory", to_path)
            real(fd, to_path)

        _sys.move_mount = move_mount
        mounts._apply(MountOp(MountKind.DENY_FILE, str(key)), str(key), None)
        mountinfo = [line.split() for line in Path("/proc/self/mountinfo").read_text().splitlines()]
        options = [fields[5] for fields in mountinfo if fields[4] == str(key)]
        read = key.read_text() if key.exists() else "gone"
        return {"attaches": len(calls), "read": read, "options": options}

    try:
        got = in_child(inside, namespaces=True)
    finally:
        os.close(asked_w)  # the host's side stops waiting if the child never asked
        helper.join(5)
        for fd in (asked_r, done_r, done_w):
            os.close(fd)
    assert isinstance(got, dict)
    if host == "removed":
        assert got == {"attaches": 1, "read": "gone", "options": []}
        assert not key.exists()
    else:
        assert got["attaches"] == (2 if host == "replaced-after-lookup" else 1)
        assert got["read"] == ""  # the stand-in (the child may open mode 000: it has every capability)
        assert len(got["options"]) == 1 and {"rw", "nosuid", "nodev"} <= set(got["options"][0].split(","))
        assert key.read_text() == "NEW-SECRET"


def test_any_other_step_whose_target_is_missing_still_fails(tmp_path: Path) -> None:
    missing = tmp_path / "missing"

    def inside() -> str:
        op = MountOp(MountKind.TMPFS, str(missing), readonly=True)
        return attempt(lambda: mounts._apply(op, str(missing), None))

    assert in_child(inside, namespaces=True) == "ENOENT"


def test_an_entry_removed_while_it_is_masked_is_skipped_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another sandbox's directory in the home may be removed at any moment of this
    one's setup: listed but gone before it is opened, or opened and gone before the
    mask is attached. Either way there is nothing left to mask, and the start goes on
    (the uid-1001 gate once failed with ENOENT at "mask /home/wtest")."""
    base = tmp_path / "base"
    for name in ("early", "late", "stays"):
        (base / name).mkdir(parents=True)
    listed = mounts._listed
    open_tree = _sys.open_tree

    def racing_listing(directory: int) -> list[str]:
        names = listed(directory)
        os.rmdir(base / "early")
        return names

    def racing_clone(path: str, flags: int, dirfd: int = _sys.AT_FDCWD) -> int:
        fd = open_tree(path, flags, dirfd)
        if os.readlink(f"/proc/self/fd/{dirfd}").endswith("/late"):
            os.rmdir(base / "late")
        return fd

    monkeypatch.setattr(mounts, "_listed", racing_listing)
    monkeypatch.setattr(_sys, "open_tree", racing_clone)

    def inside() -> str:
        mounts._mask(str(base), ())
        return attempt(lambda: (base / "stays" / "new").write_text("y"))

    assert in_child(inside, namespaces=True) == "EROFS"
    assert sorted(os.listdir(base)) == ["stays"]


def test_a_hiding_mask_hides_every_other_directory_and_skips_one_removed_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mask on the way down to an E2B sandbox's home: other directories there are
    hidden (empty, mode 000), the kept one is untouched; one removed between the listing
    and its mount (another sandbox's snapshots directory, removed when emptied) is skipped,
    not fatal (seen once in E2B's suite: "failed at mount step 9 (mask ...)")."""
    base = tmp_path / "base"
    for name in ("keep", "other", "late"):
        (base / name).mkdir(parents=True)
    (base / "other" / "secret").write_text("s")
    (base / "keep" / "mine").write_text("m")
    real_mount = _sys.mount

    def racing_mount(
        source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None
    ) -> None:
        if os.readlink(target).endswith("/late"):
            os.rmdir(base / "late")
        real_mount(source, target, fstype, flags, data)

    monkeypatch.setattr(_sys, "mount", racing_mount)

    def inside() -> dict[str, object]:
        mounts._mask(str(base), ("keep",), hide=True)
        st = os.stat(base / "other")
        # (the child holds every capability of its namespace: mode 000 stops it not)
        return {
            "other": os.listdir(base / "other"),
            "mode": st.st_mode & 0o777,
            "keep": (base / "keep" / "mine").read_text(),
        }

    assert in_child(inside, namespaces=True) == {"other": [], "mode": 0, "keep": "m"}
    assert sorted(os.listdir(base)) == ["keep", "other"] and (base / "other" / "secret").read_text() == "s"


def test_an_entry_swapped_for_a_link_while_it_is_masked_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry listed as a directory and replaced by a link to elsewhere (here the
    sandbox's own writable directory) before it is masked: the mask never lands on
    what the link names, which stays writable."""
    base, elsewhere = tmp_path / "base", tmp_path / "workspace"
    (base / "entry").mkdir(parents=True)
    elsewhere.mkdir()
    listed = mounts._listed

    def swapping_listing(directory: int) -> list[str]:
        names = listed(directory)
        os.rmdir(base / "entry")
        (base / "entry").symlink_to(elsewhere)
        return names

    monkeypatch.setattr(mounts, "_listed", swapping_listing)

    def inside() -> str:
        mounts._mask(str(base), ())
        return attempt(lambda: (elsewhere / "new").write_text("y"))

    assert in_child(inside, namespaces=True) == "ok"
    assert (elsewhere / "new").read_text() == "y"
