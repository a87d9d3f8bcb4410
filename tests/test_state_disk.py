"""A full or small state disk: snapshots are budgeted, and a request that meets a full
disk gets a typed error while the supervisor and every other sandbox go on.

The state directory is on a 64 MiB tmpfs (the safety net: nothing here can write more
than that on the host). Root mounts it here; uid 1001 cannot, so ``scripts/test``
mounts one for it beforehand and names it in ``WARREN_TEST_SMALL_FS``. Judged on the
host: the tmpfs's use (statvfs), the files of the saved layer, the supervisor's pid and
another sandbox answering.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import WARREN, shut_down_supervisor
from test_envroot import image  # noqa: F401 (the small image: a fixture)
from warren import PolicySpec, Sandbox
from warren.errors import CheckpointError, SandboxError, SetupError, SnapshotError, WarrenError
from warren.images.ref import ImageRef
from warren.server import snapshots, statedir

SMALL = 64 << 20
SPARSE = 50 << 30
INODES = 8192  # so that names run out too: a tmpfs's files cost no block until written


@pytest.fixture(scope="module")
def small_fs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    given = os.environ.get("WARREN_TEST_SMALL_FS")
    if os.geteuid() == 0:
        where = tmp_path_factory.mktemp("small")
        subprocess.run(
            [
                "mount",
                "-t",
                "tmpfs",
                "-o",
                f"size={SMALL},nr_inodes={INODES},mode=0755",
                "warren-test-small",
                str(where),
            ],
            check=True,
        )
        try:
            yield where
        finally:
            subprocess.run(["umount", "-l", str(where)], check=False)
        return
    if not given:
        pytest.skip(
            "a small filesystem for the state directory: root mounts one here, and "
            "scripts/test mounts one for uid 1001 (WARREN_TEST_SMALL_FS)"
        )
    where = Path(given)
    st = os.statvfs(where)
    assert st.f_blocks * st.f_frsize <= 2 * SMALL, f"{where} is not a small filesystem"
    for entry in where.iterdir():  # a previous run's
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    yield where


@pytest.fixture(scope="module")
def config_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The user's config directory of this module's supervisor: a snapshot budget is
    written there by the tests that need one (none: the default)."""
    return tmp_path_factory.mktemp("config")


def _budget(config_home: Path, value: str | None) -> None:
    path = config_home / "warren" / "config.toml"
    if value is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"snapshot_budget = {value!r}\n".replace("'", '"'))


@pytest.fixture(scope="module")
def state_home(small_fs: Path, config_home: Path) -> Iterator[Path]:
    home = small_fs / "state"
    home.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_STATE_HOME", str(home))
        mp.setenv("XDG_CONFIG_HOME", str(config_home))
        yield home
        for entry in Sandbox.list():
            with contextlib.suppress(WarrenError):
                Sandbox(entry).remove()
        shut_down_supervisor()
    shutil.rmtree(home, ignore_errors=True)


def _used(where: Path) -> int:
    st = os.statvfs(where)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _free(where: Path) -> int:
    st = os.statvfs(where)
    return st.f_bavail * st.f_frsize


def _supervisor() -> int:
    found = statedir.read_address(statedir.location(os.environ))
    assert found is not None, "no supervisor"
    return found[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"


def _sh(sb: Sandbox, script: str) -> str:
    r = sb.exec(["sh", "-c", script])
    assert r.exit_code == 0, (script, r.stderr.decode())
    return r.stdout.decode()


def _spec(image: Path, **extra: object) -> PolicySpec:  # noqa: F811
    return PolicySpec(image=str(image), workspace="none", disk="256M", **extra)  # type: ignore[arg-type]


def _saved(snap_id: str, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [s for s in Sandbox.snapshots() if s.id == snap_id]
        if found and found[0].saved:
            return True
        time.sleep(0.05)
    return False


def _snapshot_dirs(state: Path) -> list[str]:
    with contextlib.suppress(FileNotFoundError):
        return sorted(os.listdir(state / "warren" / snapshots.DIR))
    return []


def test_a_sparse_file_costs_the_snapshot_what_it_holds(
    image: Path,  # noqa: F811
    state_home: Path,
    small_fs: Path,
) -> None:
    other = Sandbox.create(_spec(image))
    a = Sandbox.create(_spec(image))
    supervisor = _supervisor()
    _sh(a, f"dd if=/dev/zero of=/root/sparse bs=1 seek={SPARSE} count=0 status=none; echo data > /root/small")
    # Both ways of taking it: frozen in memory then copied in the background (PID 1
    # alone), and copied at once while paused (a process runs).
    fast = a.snapshot()
    assert _saved(fast.id)
    a.spawn(["sh", "-c", "read x"], stdin=True)  # a process runs: paused and copied
    copied = a.snapshot()
    assert copied.saved
    for snap in (fast, copied):
        layer = state_home / "warren" / snapshots.DIR / snap.id / "layer"
        st = (layer / "root/sparse").stat()
        assert st.st_size == SPARSE and st.st_blocks == 0, (st.st_size, st.st_blocks)
        assert (layer / "root/small").read_text() == "data\n"
    # The control: the file's size is 800 times the disk's, so a copy that wrote its
    # holes could not have fit; and the detector sees a dense write of 8 MiB there.
    assert SPARSE >= 800 * SMALL
    before = _used(small_fs)
    (small_fs / "dense").write_bytes(os.urandom(8 << 20))
    assert _used(small_fs) - before >= 8 << 20
    (small_fs / "dense").unlink()
    assert _used(small_fs) < 16 << 20
    assert _alive(supervisor) and _supervisor() == supervisor
    assert _sh(other, "echo alive") == "alive\n"
    with Sandbox.create(PolicySpec(from_snapshot=copied.id, workspace="none")) as b:
        assert _sh(b, "stat -c %s /root/sparse; cat /root/small") == f"{SPARSE}\ndata\n"
    a.remove()
    other.remove()
    for snap in (copied, fast):
        Sandbox.remove_snapshot(snap.id)


def test_a_layer_bigger_than_the_free_space_is_refused_typed_and_leaves_nothing(
    image: Path,  # noqa: F811
    state_home: Path,
    small_fs: Path,
) -> None:
    other = Sandbox.create(_spec(image))
    a = Sandbox.create(_spec(image), name="big")
    supervisor = _supervisor()
    _sh(a, "dd if=/dev/urandom of=/root/big bs=1M count=80 status=none")
    assert _free(small_fs) < 80 << 20  # the control: it cannot fit
    used, dirs, listed = _used(small_fs), _snapshot_dirs(state_home), Sandbox.snapshots()
    for copy in (False, True):  # frozen in memory first (PID 1 alone), then paused for a copy
        if copy:
            a.spawn(["sh", "-c", "read x"], stdin=True)
        with pytest.raises(SnapshotError) as refused:
            a.snapshot()
        e = refused.value
        assert e.errno == errno.ENOSPC and "sandbox big" in e.message and "free" in e.message
        assert "80" in e.message and "snapshot rm" in e.hint
        assert _snapshot_dirs(state_home) == dirs and Sandbox.snapshots() == listed
        assert abs(_used(small_fs) - used) < 1 << 20
    cli = subprocess.run([*WARREN, "snapshot", "big"], capture_output=True, text=True)
    assert cli.returncode == 125 and "does not fit" in cli.stderr and "hint:" in cli.stderr
    assert "Traceback" not in cli.stderr
    assert _alive(supervisor) and _sh(other, "echo alive") == "alive\n"
    assert _sh(a, "rm /root/big; echo small > /root/f; cat /root/f") == "small\n"
    snap = a.snapshot()  # the sandbox is fine: once its layer fits, it is saved
    assert snap.saved
    with Sandbox.create(_spec(image)) as c:
        assert _sh(c, "echo ok") == "ok\n"
    a.remove()
    other.remove()
    Sandbox.remove_snapshot(snap.id)


@pytest.mark.parametrize("free_mib", [4, 30])
def test_a_copy_the_disk_cannot_take_midway_leaves_nothing(
    small_fs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, free_mib: int
) -> None:
    """The disk fills after the check (another writer): with 4 MiB left the copy meets
    ENOSPC; with 30 MiB left the check it repeats every 16 MiB refuses it first. Either
    way a typed error, and nothing of the copy stays."""
    root = small_fs / f"unit-{free_mib}"
    root.mkdir()
    layer = tmp_path / "layer"
    (layer / "root").mkdir(parents=True)
    (layer / "root/big").write_bytes(os.urandom(40 << 20))
    filler = small_fs / "filler"
    try:
        with open(filler, "wb") as f:
            while _free(small_fs) > free_mib << 20:
                f.write(b"\0" * (1 << 20))
        used = _used(small_fs)
        # What the check saw before the disk filled: room enough.
        monkeypatch.setattr(snapshots, "check_room", lambda *a, **k: None)
        monkeypatch.setattr(snapshots, "layer_bound", lambda layers: 1 << 40)
        fd = os.open(layer, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with pytest.raises((SetupError, SnapshotError)) as failed:
                snapshots.take(str(root), "dev", fd, ImageRef(name="/img", id="sha256:x", layers=()), None)
        finally:
            os.close(fd)
        assert failed.value.errno == errno.ENOSPC, failed.value
        assert ("does not fit" in failed.value.message) == (free_mib == 30), failed.value.message
        assert os.listdir(root / snapshots.DIR) == [] and snapshots.all_snapshots(str(root)) == []
        assert _used(small_fs) <= used
    finally:
        filler.unlink(missing_ok=True)
        shutil.rmtree(root, ignore_errors=True)


def test_a_full_state_disk_is_a_typed_error_for_create_and_the_supervisor_lives(
    state_home: Path, small_fs: Path, tmp_path: Path
) -> None:
    other = Sandbox.create(PolicySpec(workspace=str(tmp_path)), name="other")
    supervisor = _supervisor()
    filler = small_fs / "filler"
    try:
        with open(filler, "wb") as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * (1 << 16))
                f.flush()
        # The control: the disk is full for this user.
        with pytest.raises(OSError) as full:
            (small_fs / "one-more").write_bytes(b"x" * 4096)
        assert full.value.errno == errno.ENOSPC
        outcomes = []
        for i in range(3):
            r = subprocess.run(
                [*WARREN, "create", f"full{i}", "-w", str(tmp_path)], capture_output=True, text=True
            )
            assert "Traceback" not in r.stderr, r.stderr
            if r.returncode:
                assert r.returncode == 125 and "hint:" in r.stderr, r.stderr
            outcomes.append(r.returncode)
            assert _alive(supervisor) and _supervisor() == supervisor
            assert other.exec(["echo", "alive"]).stdout == b"alive\n"
        assert 125 in outcomes, "creates on a full state disk all succeeded: the test did not fill it"
        # No name left either: a background process's records cannot be made.
        names = small_fs / "names"
        names.mkdir()
        with contextlib.suppress(OSError):
            for i in range(INODES):
                (names / str(i)).touch()
        with pytest.raises(SandboxError) as refused:
            other.spawn(["sh", "-c", "echo"])
        assert refused.value.errno == errno.ENOSPC and "background process" in refused.value.message
        assert _alive(supervisor) and other.exec(["echo", "alive"]).stdout == b"alive\n"
    finally:
        filler.unlink(missing_ok=True)
        (small_fs / "one-more").unlink(missing_ok=True)
        shutil.rmtree(small_fs / "names", ignore_errors=True)
    with Sandbox.create(PolicySpec(workspace=str(tmp_path)), name="after") as after:
        assert after.exec(["true"]).exit_code == 0
    assert _alive(supervisor)
    other.remove()
    for info in Sandbox.list():
        Sandbox(info).remove()


def test_a_sparse_file_linked_from_outside_costs_its_own_inode_what_it_holds(
    state_home: Path, small_fs: Path
) -> None:
    """A workspace file that is also a hard link to a file outside gets an inode of its
    own at launch (``server.unshare``): a sparse one (as a sandbox may leave it, the
    link being writable then) is copied without its holes, on the same 64 MiB disk."""
    base = small_fs / "linked"
    ws = base / "W"
    ws.mkdir(parents=True)
    outside = base / "outside.img"
    with open(outside, "wb") as f:
        f.seek(1 << 20)
        f.write(b"data")
        f.truncate(SPARSE)
    os.link(outside, ws / "disk.img")
    used = _used(small_fs)
    try:
        with Sandbox.create(PolicySpec(workspace=str(ws))) as sb:
            assert _sh(
                sb, "stat -c '%s %h' disk.img; dd if=disk.img bs=4 skip=262144 count=1 status=none"
            ) == (f"{SPARSE} 1\ndata")
        copy = (ws / "disk.img").stat()
        assert copy.st_ino != outside.stat().st_ino and copy.st_size == SPARSE
        assert copy.st_blocks * 512 <= 1 << 20 and _used(small_fs) - used < 1 << 20
        assert SPARSE > SMALL  # the control: written out, it could not have fit
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _layer_of(tmp_path: Path, mib: int) -> Path:
    layer = tmp_path / "layer"
    (layer / "root").mkdir(parents=True)
    (layer / "root/data").write_bytes(os.urandom(mib << 20))
    return layer


def _real_bound(layers: list[int]) -> int:
    """What the layer under test really holds (its own filesystem, the test's disk,
    holds much else): its data blocks and a block per name, as ``layer_bound`` counts."""
    total = 0
    for fd in layers:
        for _dirpath, dirs, files, dfd in os.fwalk(dir_fd=fd):
            for name in files:
                total += os.stat(name, dir_fd=dfd, follow_symlinks=False).st_blocks * 512
            total += (len(dirs) + len(files)) * 4096
    return total


def _take(root: Path, layer: Path) -> snapshots.Snapshot:
    fd = os.open(layer, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return snapshots.take(str(root), "dev", fd, ImageRef(name="/img", id="sha256:x", layers=()), None)
    finally:
        os.close(fd)


def test_snapshots_past_the_users_budget_are_refused_typed_and_leave_nothing(
    small_fs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many snapshots of one sandbox, each fitting on the disk: past the budget in the
    user's config the next one is refused before a byte is copied, naming the budget and
    how to free or raise it; removing one makes room again."""
    root = small_fs / "budget"
    root.mkdir()
    config = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    monkeypatch.setattr(snapshots, "layer_bound", _real_bound)
    layer = _layer_of(tmp_path, 8)
    try:
        _budget(config, "20M")
        first, second = _take(root, layer), _take(root, layer)
        assert snapshots.charged(str(root)) >= 16 << 20
        used, dirs = _used(small_fs), sorted(os.listdir(root / snapshots.DIR))
        # The control: the disk has room for a third copy; only the budget refuses it.
        free, keep = snapshots.room(str(root))
        assert free - keep > 12 << 20
        with pytest.raises(SnapshotError) as refused:
            _take(root, layer)
        e = refused.value
        assert e.errno == errno.EDQUOT and "budget" in e.message and "20M" in e.message, e.message
        assert "snapshot rm" in e.hint and "snapshot_budget" in e.hint
        assert sorted(os.listdir(root / snapshots.DIR)) == dirs and abs(_used(small_fs) - used) < 1 << 20
        snapshots.remove(str(root), first.id, set())
        third = _take(root, layer)  # room again
        # Without a budget the disk's reserve is all that holds.
        _budget(config, "none")
        fourth = _take(root, layer)
        assert {s.id for s in snapshots.all_snapshots(str(root))} == {second.id, third.id, fourth.id}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_default_budget_is_a_quarter_of_the_state_disk_and_a_bad_one_is_a_typed_error(
    small_fs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from warren.errors import ConfigError

    root = small_fs / "default"
    root.mkdir()
    config = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    monkeypatch.setattr(snapshots, "layer_bound", _real_bound)
    layer = _layer_of(tmp_path, 6)
    try:
        kept = [_take(root, layer), _take(root, layer)]  # 12M of the 16M (a quarter of 64M)
        with pytest.raises(SnapshotError) as refused:
            _take(root, layer)
        assert "(the default)" in refused.value.message and "16M" in refused.value.message
        _budget(config, "20%")  # a share of its own: 12.8M
        with pytest.raises(SnapshotError):
            _take(root, layer)
        _budget(config, "50%")
        kept.append(_take(root, layer))
        for bad in ("lots", "0%", "250%"):
            _budget(config, bad)
            with pytest.raises(ConfigError) as wrong:
                _take(root, layer)
            assert "snapshot_budget" in wrong.value.message and "20G" in wrong.value.hint
        assert len(snapshots.all_snapshots(str(root))) == len(kept) == 3
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_sandbox_snapshotted_past_the_budget_gets_a_typed_error_through_the_cli(
    image: Path,  # noqa: F811
    state_home: Path,
    small_fs: Path,
    config_home: Path,
) -> None:
    """End to end: the supervisor reads the budget from the user's config at each
    snapshot; the CLI says what and how, exit 125, no traceback; nothing is left."""
    a = Sandbox.create(_spec(image), name="often")
    _sh(a, "dd if=/dev/urandom of=/root/data bs=1M count=8 status=none")
    _budget(config_home, "12M")
    try:
        first = a.snapshot()
        assert _saved(first.id)
        used, dirs, listed = _used(small_fs), _snapshot_dirs(state_home), Sandbox.snapshots()
        cli = subprocess.run([*WARREN, "snapshot", "often"], capture_output=True, text=True)
        assert cli.returncode == 125 and "snapshot budget" in cli.stderr, cli.stderr
        assert "hint:" in cli.stderr and "snapshot_budget" in cli.stderr and "Traceback" not in cli.stderr
        assert _snapshot_dirs(state_home) == dirs and Sandbox.snapshots() == listed
        assert abs(_used(small_fs) - used) < 1 << 20
        # The control: the disk had room; with the budget raised the same snapshot is taken.
        _budget(config_home, "none")
        second = a.snapshot()
        assert _saved(second.id)
    finally:
        _budget(config_home, None)
    a.remove()
    for snap in Sandbox.snapshots():
        Sandbox.remove_snapshot(snap.id)


def test_an_image_layer_of_zeros_costs_the_store_what_it_holds(small_fs: Path, tmp_path: Path) -> None:
    """A crafted image whose layer is a file of zeros (a gzip bomb: 96 MiB of zeros is
    100 KiB of gzip) is unpacked with its zeros as holes, on the 64 MiB disk it could not
    fit on written out; its one block of data is where it was."""
    import gzip
    import tarfile

    from images_util import docker_archive, entry, layer_tar, sha
    from warren.images.store import ImageStore

    size, at = 96 << 20, 50 << 20
    data = bytearray(size)
    data[at : at + 4] = b"data"
    layer = layer_tar([entry("disk.img", tarfile.REGTYPE, data=bytes(data))])
    del data
    archive = docker_archive(tmp_path / "zeros.tar", [gzip.compress(layer, 1)], diff_ids=[sha(layer)])
    assert archive.stat().st_size < 1 << 20 and size > SMALL  # the control: dense, it cannot fit
    store = small_fs / "store"
    used = _used(small_fs)
    try:
        ref = ImageStore(store).import_archive("zeros", archive)
        img = ref.layers[0] / "disk.img"
        st = img.stat()
        assert st.st_size == size and st.st_blocks * 512 <= 1 << 20, (st.st_size, st.st_blocks)
        assert _used(small_fs) - used < 2 << 20
        with open(img, "rb") as f:
            f.seek(at - 2)
            assert f.read(8) == b"\0\0data\0\0"
    finally:
        shutil.rmtree(store, ignore_errors=True)


def _review(ws: Path) -> Sandbox:
    return Sandbox.create(PolicySpec(workspace=str(ws), review=True))


def test_review_checkpoints_past_the_budget_are_refused_typed_and_the_earlier_ones_stay(
    state_home: Path, config_home: Path, tmp_path: Path
) -> None:
    """A checkpoint's bytes count against ``snapshot_budget``: past it, EDQUOT, the
    changes stay live, the command before which one is skipped still runs, and the
    earlier checkpoints roll back."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "kept.txt").write_text("kept\n")
    sb = _review(ws)
    try:
        _sh(sb, "echo small > small.txt")
        first = sb.checkpoint()
        _budget(config_home, "2M")
        _sh(sb, "head -c 3145728 /dev/urandom > big.bin")
        with pytest.raises(CheckpointError, match="would pass your snapshot budget") as caught:
            sb.checkpoint()
        assert caught.value.errno == errno.EDQUOT
        assert _sh(sb, "echo ran; stat -c %s big.bin") == "ran\n3145728\n"  # no checkpoint before it
        assert sb.checkpoints()[-1].id == first.id  # neither that one nor the one before "echo ran"
        # the control: the same checkpoint under no budget is taken
        _budget(config_home, "none")
        big = sb.checkpoint()
        assert big.bytes >= 3 << 20
        sb.rollback(first.id)
        assert _sh(sb, "ls") == "kept.txt\nsmall.txt\n"
    finally:
        _budget(config_home, None)
        sb.remove()


def test_a_full_state_disk_during_a_checkpoint_is_typed_and_the_earlier_ones_stay_usable(
    state_home: Path, config_home: Path, small_fs: Path, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "kept.txt").write_text("kept\n")
    _budget(config_home, "none")
    sb = _review(ws)
    filler = small_fs / "filler"
    try:
        _sh(sb, "echo one > one.txt")
        first = sb.checkpoint()
        _sh(sb, "echo two > two.txt")
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # the state disk full
        try:
            for size in (1 << 20, 4096):
                with contextlib.suppress(OSError):
                    while True:
                        os.write(fd, b"\0" * size)
        finally:
            os.close(fd)
        assert _free(small_fs) < 64 << 10
        with pytest.raises(CheckpointError, match="cannot take a checkpoint") as caught:
            sb.checkpoint()
        assert caught.value.errno == errno.ENOSPC
        with pytest.raises(CheckpointError) as caught:  # refused before anything changed
            sb.rollback(first.id)
        assert caught.value.errno == errno.ENOSPC
        assert [c.id for c in sb.checkpoints()][-1] == first.id
        assert _sh(sb, "cat one.txt two.txt") == "one\ntwo\n"  # the workspace as it was
        filler.unlink()
        back = sb.rollback(first.id)
        assert back.id == first.id
        assert _sh(sb, "ls") == "kept.txt\none.txt\n"
    finally:
        filler.unlink(missing_ok=True)
        _budget(config_home, None)
        sb.remove()
