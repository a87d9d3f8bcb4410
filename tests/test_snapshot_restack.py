"""Snapshots and fork without a copy (``server.restack``, ``_core.restack``).

A snapshot of a sandbox whose only process is PID 1 freezes its layer in memory and
stacks the sandbox's root again above it; the copy to the state directory follows in
the background, and a sandbox made from the snapshot meanwhile gets the frozen layer by
descriptor. What must hold, as root and as uid 1001:
- the snapshot has the state of the moment it was taken, whatever the original,
  the forks and the sandboxes made from it do afterwards (each way);
- the copy that reaches the state directory shows exactly what the sandbox showed,
  deletions and replaced directories included, over several frozen layers;
- a process with a file open keeps the snapshot on the copy path, and its later write
  reaches neither;
- the sandbox goes on working as before: /proc, /dev, a host workspace, a read-only
  bind, repeated snapshots; a sandbox made from the snapshot works when the original
  is gone.
"""

from __future__ import annotations

import os
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import module_state
from test_envroot import image, pyimage  # noqa: F401 (the small image and one with Python: fixtures)
from warren import PolicySpec, Sandbox
from warren.models import SnapshotInfo
from warren.plan.facts import parse_mountinfo
from warren.server import restack

STATE = (
    "cat /etc/state; ls -A /opt/tree /opt/tree/c; cat /root/one; stat -c %h /root/two; stat -c %s /root/big"
)


@pytest.fixture(scope="module", autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from module_state(tmp_path_factory)


def _spec(image: Path, workspace: Path | None = None, **extra: object) -> PolicySpec:  # noqa: F811
    return PolicySpec(image=str(image), workspace=str(workspace) if workspace else "none", **extra)  # type: ignore[arg-type]


def _sh(sb: Sandbox, script: str) -> str:
    r = sb.exec(["sh", "-c", script])
    assert r.exit_code == 0, (script, r.stderr.decode())
    return r.stdout.decode()


def _saved(snap_id: str, timeout: float = 60) -> SnapshotInfo:
    deadline = time.monotonic() + timeout
    while True:
        found = [s for s in Sandbox.snapshots() if s.id == snap_id]
        assert found, snap_id
        if found[0].saved or time.monotonic() > deadline:
            return found[0]
        time.sleep(0.05)


def _cleanup() -> None:
    for s in reversed(Sandbox.snapshots()):
        for _ in range(50):
            try:
                Sandbox.remove_snapshot(s.id)
                break
            except Exception:
                time.sleep(0.1)


def test_a_snapshot_freezes_the_layer_and_everyone_keeps_their_own_state(
    image: Path,  # noqa: F811
    state_home: Path,
) -> None:
    with Sandbox.create(_spec(image)) as a:
        _sh(
            a,
            "echo one > /etc/state; echo x > /root/one; ln /root/one /root/two; dd if=/dev/zero "
            "of=/root/big bs=1k count=300 status=none; rm /opt/tree/c/g; mkdir /opt/tree/new",
        )
        snap = a.snapshot()
        # Taken without a copy: the record says the copy is still to come.
        assert snap.saved is False and snap.size > 300 * 1024 and snap.workspace == "included"
        at_snapshot = _sh(a, STATE)
        _sh(a, "echo two > /etc/state; rm -r /opt/tree/new; echo y >> /root/one")
        with Sandbox.create(PolicySpec(from_snapshot=snap.id, workspace="none")) as b:
            assert _sh(b, STATE) == at_snapshot
            _sh(b, "echo b > /etc/state")
            with b.fork() as c:  # a fork of a sandbox whose layers are in another's memory
                assert _sh(c, "cat /etc/state") == "b\n"
                _sh(c, "echo c > /etc/state")
                assert _sh(b, "cat /etc/state") == "b\n"
            assert _sh(a, "cat /etc/state") == "two\n"
        with a.fork() as d:
            assert _sh(d, "cat /etc/state; ls -A /opt/tree; cat /root/one") == "two\na\nc\nx\ny\n"
            _sh(d, "echo d > /etc/state")
            assert _sh(a, "cat /etc/state") == "two\n"
        # The copy in the state directory, once there, is what the snapshot showed --
        # read on the host, in the state directory, as well as from a sandbox.
        assert _saved(snap.id).saved
        layer = state_home / "warren" / "snapshots" / snap.id / "layer"
        assert (layer / "etc/state").read_text() == "one\n" and (
            layer / "root/big"
        ).stat().st_size == 300 * 1024
        with Sandbox.create(PolicySpec(from_snapshot=snap.id, workspace="none")) as e:
            assert _sh(e, STATE) == at_snapshot
    _cleanup()


def test_the_copy_merges_every_frozen_layer_as_the_sandbox_showed_them(image: Path) -> None:  # noqa: F811
    a = Sandbox.create(_spec(image))
    _sh(a, "mkdir -p /opt/d/sub; echo 1 > /opt/d/sub/f; echo keep > /opt/d/k; echo v1 > /etc/v")
    first = a.snapshot()
    # Deleted, replaced whole (an opaque directory), changed, made anew: over a frozen layer.
    _sh(
        a,
        "rm /opt/d/k; rm -r /opt/d/sub; mkdir /opt/d/sub; echo 2 > /opt/d/sub/g; echo v2 > /etc/v; "
        "rm /etc/marker; rm -r /opt/tree/a",
    )
    second = a.snapshot()
    assert not first.saved and not second.saved
    view = "ls -A /opt/d /opt/d/sub /etc /opt/tree; cat /etc/v /opt/d/sub/g"
    expected = _sh(a, view)
    assert _saved(second.id).saved and _saved(first.id).saved
    a.remove()
    with Sandbox.create(PolicySpec(from_snapshot=second.id, workspace="none")) as b:
        assert _sh(b, view) == expected
    with Sandbox.create(PolicySpec(from_snapshot=first.id, workspace="none")) as c:
        assert _sh(c, "cat /etc/v /opt/d/k /opt/d/sub/f; ls /etc") == "v1\nkeep\n1\nmarker\npasswd\nv\n"
    _cleanup()


def test_a_snapshot_of_a_sandbox_made_from_one_still_being_saved_stands_alone(image: Path) -> None:  # noqa: F811
    """The second snapshot's copy looks into the first's layer for the names it removed
    (a whiteout stays only where a lower layer has the name): it waits for that copy."""
    with Sandbox.create(_spec(image)) as a:
        _sh(a, "dd if=/dev/zero of=/root/big bs=1M count=48 status=none; echo s1 > /root/from-s1")
        first = a.snapshot()
        with Sandbox.create(PolicySpec(from_snapshot=first.id, workspace="none")) as b:
            _sh(b, "rm /root/from-s1 /etc/marker; echo b > /root/from-b")
            second = b.snapshot()
            assert not first.saved and not second.saved
            assert _saved(second.id).saved
        with Sandbox.create(PolicySpec(from_snapshot=second.id, workspace="none")) as c:
            assert _sh(c, "ls /root; ls /etc") == "big\nfrom-b\npasswd\n"
    _cleanup()


def test_a_process_with_a_file_open_keeps_the_snapshot_on_the_copy_path(
    image: Path,  # noqa: F811
    state_home: Path,
) -> None:
    with Sandbox.create(_spec(image)) as a:
        holder = a.spawn(
            [
                "sh",
                "-c",
                "exec 3>>/root/log; echo before >&3; while [ ! -e /root/go ]; do :; done; echo after >&3",
            ]
        )
        deadline = time.monotonic() + 10
        while _sh(a, "cat /root/log 2>/dev/null || true") != "before\n":
            assert time.monotonic() < deadline
        snap = a.snapshot()
        assert snap.saved is True  # copied, paused: the open file points into the layer
        _sh(a, "touch /root/go")
        assert holder.wait(timeout=10) == 0
        # Judged on the host too: the snapshot's layer in the state directory.
        assert (state_home / "warren/snapshots" / snap.id / "layer/root/log").read_text() == "before\n"
        assert _sh(a, "cat /root/log") == "before\nafter\n"
        with Sandbox.create(PolicySpec(from_snapshot=snap.id, workspace="none")) as b:
            assert _sh(b, "cat /root/log; ls /root") == "before\nlog\n"
        # Idle again: the next snapshot is taken without a copy, over the copied one.
        later = a.snapshot()
        assert later.saved is False
        with Sandbox.create(PolicySpec(from_snapshot=later.id, workspace="none")) as c:
            assert _sh(c, "cat /root/log; ls /root") == "before\nafter\ngo\nlog\n"
    _cleanup()


def test_the_sandbox_works_as_before_after_its_root_is_stacked_again(image: Path, tmp_path: Path) -> None:  # noqa: F811
    ws, ro = tmp_path / "ws", tmp_path / "ro"
    ws.mkdir()
    ro.mkdir()
    (ro / "r").write_text("read only\n")
    spec = _spec(image, ws, read=(str(ro),))
    with Sandbox.create(spec) as a:
        for i in range(3):
            snap = a.snapshot()
            assert snap.saved is False, i
            _sh(a, f"echo {i} > /workspace/w{i}; echo {i} > /etc/n{i}")
        assert sorted(os.listdir(ws)) == ["w0", "w1", "w2"]  # the host workspace, still bound
        assert (ws / "w2").stat().st_uid == os.getuid()
        out = _sh(
            a,
            f"cat /proc/self/comm; echo ok > /dev/null; cat {ro}/r; (echo no > {ro}/r) 2>&1 || true; ls /etc",
        )
        assert out.startswith("cat\nread only\n") and "Read-only file system" in out, out
        assert "n0\nn1\nn2\n" in out
        with a.fork() as b:
            assert _sh(b, "cat /etc/n2; ls /workspace") == "2\nw0\nw1\nw2\n"
    _cleanup()


def test_tools_work_on_files_a_snapshot_froze(image: Path) -> None:  # noqa: F811
    """What a snapshot froze is a lower layer from then on, as the image's files are: a
    directory made before it is renamed (the broker's move, not EXDEV), files are
    removed and replaced, git works in a repository made before it (gc repacks and
    removes loose objects, a local clone links), a rename from TMPDIR lands."""
    with Sandbox.create(_spec(image)) as a:
        _sh(
            a,
            "mkdir -p /root/d/sub && echo f > /root/d/sub/f && echo x > /root/x && "
            "cd /root && git init -q r && cd r && echo 1 > a && git add a && "
            "git -c user.name=t -c user.email=t@t commit -qm one && echo tmp > /tmp/t",
        )
        assert a.snapshot().saved is False
        out = _sh(
            a,
            "mv /root/d /root/e && cat /root/e/sub/f && rm /root/x && mv /tmp/t /root/t && "
            "cat /root/t && cd /root/r && echo 2 > a && "
            "git -c user.name=t -c user.email=t@t commit -qam two && git gc -q && "
            "git count-objects -v && git clone -q /root/r /root/c && "
            "git -C /root/c log --format=%s && ls /root",
        )
        # After gc no loose object is left (the ones made before the snapshot included).
        lines = out.splitlines()
        assert lines[:2] == ["f", "tmp"] and "count: 0" in lines, out
        assert lines[-6:] == ["two", "one", "c", "e", "r", "t"], out
        with a.fork() as b:  # and the fork sees the result, not the frozen state
            assert _sh(b, "ls /root; git -C /root/r log --format=%s") == "c\ne\nr\nt\ntwo\none\n"
    _cleanup()


def test_network_allow_and_expose_work_after_a_snapshot_without_a_copy(pyimage: Path, tmp_path: Path) -> None:  # noqa: F811
    """The network helper's connector (a long-lived helper of PID 1's, sockets only)
    does not keep a snapshot on the copy path, and still connects afterwards."""
    (tmp_path / "index.html").write_text("served from inside\n")
    with Sandbox.create(_spec(pyimage, tmp_path, network="allow")) as a:
        assert a.snapshot().saved is False
        server = a.spawn(["python3", "-m", "http.server", "--bind", "127.0.0.1", "8000"], cwd="/workspace")
        probe = "import socket; socket.create_connection(('127.0.0.1', 8000))"
        for _ in range(100):
            if a.exec(["python3", "-c", probe]).ok:
                break
            time.sleep(0.05)
        address = a.expose(8000)
        with urllib.request.urlopen(f"http://{address}/index.html", timeout=10) as resp:
            assert resp.read() == b"served from inside\n"
        server.kill()
    _cleanup()


def test_a_sandbox_from_a_snapshot_whose_original_is_gone_gets_the_saved_copy(image: Path) -> None:  # noqa: F811
    a = Sandbox.create(_spec(image))
    _sh(a, "dd if=/dev/zero of=/root/big bs=1M count=8 status=none; echo gone > /etc/state")
    snap = a.snapshot()
    assert not snap.saved
    a.remove()
    with Sandbox.create(PolicySpec(from_snapshot=snap.id, workspace="none")) as b:
        assert _sh(b, "cat /etc/state; stat -c %s /root/big") == f"gone\n{8 << 20}\n"
    assert _saved(snap.id).saved
    _cleanup()


def test_a_snapshot_the_supervisor_could_not_save_is_refused_with_a_typed_error(tmp_path: Path) -> None:
    from warren.errors import SnapshotError
    from warren.images.ref import ImageRef
    from warren.server import snapshots

    root = str(tmp_path)
    snap = snapshots.begin(
        root, "dev", ImageRef(name="/img", id="sha256:x", layers=(tmp_path,)), None, None, 0
    )
    assert not snapshots.get(root, snap.id).saved
    snapshots.sweep_unsaved(root)  # a supervisor starting after one that died mid-copy
    with pytest.raises(SnapshotError, match="not usable: the supervisor stopped before its layer was saved"):
        snapshots.image_of(root, snap.id)
    assert snapshots.id_of(root, snapshots.layer_path(root, snap.id)) == snap.id
    assert snapshots.id_of(root, "/elsewhere/layer") is None


def test_root_children_reads_the_mounts_on_the_root_and_refuses_stacks() -> None:
    info = (
        "20 1 0:30 / / rw - overlay overlay rw\n"
        "21 20 0:31 / /dev rw - tmpfs tmpfs rw\n"
        "22 21 0:32 / /dev/pts rw - devpts devpts rw\n"
        "23 20 0:33 / /proc rw - proc proc rw\n"
        "24 20 8:1 /home/u/w\\040s /workspace rw - ext4 /dev/vda rw\n"
    )
    assert restack.root_children(parse_mountinfo(info)) == ["/dev", "/proc", "/workspace"]
    with pytest.raises(ValueError, match="stacked at /proc"):
        restack.root_children(parse_mountinfo(info + "25 23 0:34 / /proc rw - proc proc rw\n"))
    with pytest.raises(ValueError, match="2 mounts at the root"):
        restack.root_children(parse_mountinfo(info + "26 20 0:35 / / rw - tmpfs tmpfs rw\n"))


def test_where_the_kernel_takes_layers_by_path_only_snapshots_are_copied(
    image: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before Linux 6.13 the overlay takes no layer by descriptor: PID 1 mounts the root
    by paths (``WARREN_OVERLAY_BY_PATH=1`` makes it so here), the sandbox works, and its
    snapshots are copied, paused, as before."""
    from conftest import shut_down_supervisor

    shut_down_supervisor()
    monkeypatch.setenv("WARREN_OVERLAY_BY_PATH", "1")
    try:
        with Sandbox.create(_spec(image)) as a:
            _sh(a, "echo by-path > /etc/state; rm /etc/marker")
            snap = a.snapshot()
            assert snap.saved is True
            _sh(a, "echo later > /etc/state")
            with a.fork() as b:
                assert _sh(b, "cat /etc/state; ls /etc") == "later\npasswd\nstate\n"
            with Sandbox.create(PolicySpec(from_snapshot=snap.id, workspace="none")) as c:
                assert _sh(c, "cat /etc/state") == "by-path\n"
        _cleanup()
    finally:
        shut_down_supervisor()  # the next test's supervisor without the variable
