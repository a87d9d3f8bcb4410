"""Checkpoints of a review workspace and rollback to one (``warren checkpoint``,
``checkpoints``, ``rollback``): the workspace frozen where it is, stacked again in
milliseconds. Judged on the host, as root and as uid 1001: the layers read by ``diff``
and written by ``apply`` to the host workspace, the sandbox's view measured by a
script whose every line is compared with the same script's run before, the host's
process table.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import module_state, run_cli
from warren._core import execstub
from warren.client.sandbox import Sandbox
from warren.errors import CheckpointError, WarrenError
from warren.policy import PolicySpec, build
from warren.server import checkpoints, statedir
from warren.server import review as layer

# Every entry of the workspace as the sandbox sees it: type, mode, size, mtime, content
# digest, and which names share an inode (hard links).
VIEW = r"""
import hashlib, json, os, stat, sys
root = sys.argv[1]
out, inodes = {}, {}
for d, dirs, files in os.walk(root):
    for n in sorted(dirs + files):
        p = os.path.join(d, n)
        st = os.lstat(p)
        rel = os.path.relpath(p, root)
        digest = ""
        if stat.S_ISREG(st.st_mode):
            with open(p, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            inodes.setdefault(st.st_ino, []).append(rel)
        elif stat.S_ISLNK(st.st_mode):
            digest = os.readlink(p)
        out[rel] = [stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_size, st.st_mtime_ns, digest]
links = sorted(sorted(v) for v in inodes.values() if len(v) > 1)
print(json.dumps({"entries": out, "links": links}))
"""


@pytest.fixture(scope="module", autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from module_state(tmp_path_factory)


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "src" / "deep").mkdir(parents=True)
    (ws / "a.txt").write_text("a\n")
    (ws / "src" / "main.py").write_text("print('main')\n")
    (ws / "src" / "deep" / "x.bin").write_bytes(bytes(range(256)) * 64)
    (ws / "tool.sh").write_text("echo tool\n")
    (ws / "tool.sh").chmod(0o750)
    os.link(ws / "a.txt", ws / "a-link.txt")
    os.symlink("src/main.py", ws / "main-link")
    os.utime(ws / "src" / "main.py", ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))
    # ctimes are taken from a coarse clock (a tick of a few ms): a sandbox started
    # within the tick of the last change here would see these files as changed on the
    # host since it started (``apply`` counts the same tick as later, to be safe)
    time.sleep(0.02)
    return ws


def _review(ws: Path, name: str) -> Sandbox:
    return Sandbox.create(build(PolicySpec(workspace=str(ws), review=True)), name=name)


# Every process's command line inside; one that ends between the glob and its read is
# passed over (a helper or spare ending then made `cat` fail in a gate).
_CMDLINES = 'for f in /proc/[0-9]*/cmdline; do cat "$f" 2>/dev/null; done; true'


def _sh(sb: Sandbox, script: str) -> str:
    r = sb.exec(["sh", "-c", script])
    assert r.exit_code == 0, (script, r.stderr.decode())
    return r.stdout.decode()


def _view(sb: Sandbox, ws: Path) -> dict[str, object]:
    r = sb.exec(["python3", "-I", "-c", VIEW, str(ws)])
    assert r.exit_code == 0, r.stderr.decode()
    view: dict[str, object] = json.loads(r.stdout)
    return view


def _changes(sb: Sandbox) -> set[tuple[str, str]]:
    return {(c.kind, c.path) for c in sb.diff().changes}


def _layer_dir(name: str) -> str:
    root = statedir.location(os.environ)
    return layer.layer_of(statedir.sandbox_dir(root, name), root, name)


def test_rm_rf_of_the_workspace_then_rollback_restores_every_file(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    sb = _review(ws, "cp-rmrf")
    try:
        # changes of the sandbox's own before the checkpoint: a hard link made inside,
        # a mode, a file's times (a.txt and its host link stay untouched: a write copies
        # one name up, apart from the other, as the overlay does)
        _sh(sb, "echo made > made.txt && ln made.txt made-link.txt && chmod 600 src/main.py")
        _sh(sb, "touch -d @1500000000 tool.sh")
        before = _view(sb, ws)
        diff_before = _changes(sb)
        assert ["a-link.txt", "a.txt"] in before["links"] and ["made-link.txt", "made.txt"] in before["links"]
        taken = sb.checkpoint()
        _sh(sb, f"rm -rf {ws}/* && ls -A {ws}")
        # control: the detector sees the removal, inside and from the host
        assert _view(sb, ws)["entries"] == {}
        assert ("removed", "src/deep/x.bin") in _changes(sb)
        # the last checkpoint is the one before the last command (the view above): the
        # state after rm -rf; the one taken by hand is before it
        assert sb.checkpoints()[-1].command.startswith("python3 -I -c")
        back = sb.rollback(taken.id)
        assert back.id == taken.id and back.stopped == "" and back.command.startswith("sh -c 'rm -rf")
        assert _view(sb, ws) == before  # contents, modes, times, hard links
        assert _changes(sb) == diff_before
        assert (ws / "a.txt").read_text() == "a\n" and not (ws / "made.txt").exists()  # the host untouched
    finally:
        sb.remove()


def test_rollback_to_an_older_checkpoint_then_diff_shows_exactly_the_changes_up_to_it(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    sb = _review(ws, "cp-older")
    try:
        _sh(sb, "echo one > one.txt && echo changed > a.txt")
        first = sb.checkpoint()
        at_first = _changes(sb)
        assert at_first == {("added", "one.txt"), ("modified", "a.txt")}
        _sh(sb, "echo two > two.txt && rm -r src")  # follows the checkpoint taken by hand
        _sh(sb, "mkdir src && echo new > src/new.py && rm one.txt")  # a checkpoint is taken before it
        listed = sb.checkpoints()
        assert [c.id for c in listed[1:]][:1] == [first.id] and len(listed) == 3
        assert listed[0].command.startswith("sh -c 'echo one")  # the first, before any change
        assert listed[1].command.startswith("sh -c 'echo two")
        assert listed[2].command.startswith("sh -c 'mkdir")
        assert listed[1].bytes > 0 and all(c.time >= listed[0].time for c in listed)
        back = sb.rollback(listed[2].id)  # the state before the third command
        assert back.id == listed[2].id
        assert _changes(sb) == at_first | {
            ("added", "two.txt"),
            ("removed", "src"),
            ("removed", "src/main.py"),
            ("removed", "src/deep"),
            ("removed", "src/deep/x.bin"),
        }
        sb.rollback(first.id)
        assert [c.id for c in sb.checkpoints()] == [c.id for c in listed[:2]]  # the later one went
        assert _changes(sb) == at_first
        assert _sh(sb, "cat one.txt a.txt && ls src") == "one\nchanged\ndeep\nmain.py\n"
        with pytest.raises(CheckpointError, match="no checkpoint 999"):
            sb.rollback(999)
        # nothing of the dropped layers is left in the layer's directory once removed
        named = set(layer.read_stack(_layer_dir("cp-older")).layers)
        deadline = time.monotonic() + 10
        while extra := {
            n for n in os.listdir(_layer_dir("cp-older")) if n.startswith("upper") and n not in named
        }:
            assert time.monotonic() < deadline, extra
            time.sleep(0.02)
    finally:
        sb.remove()


def _until_frozen_ahead(name: str, timeout: float = 15) -> layer.LayerStack:
    """The record once the last command's changes are frozen ahead (``freeze_ahead``):
    its newest frozen directory named by no checkpoint."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = layer.read_stack(_layer_dir(name))
        if len(record.layers) >= 2 and all(c.layer != record.layers[-2] for c in record.checkpoints):
            return record
        time.sleep(0.02)
    raise AssertionError(f"{name}'s changes were not frozen ahead: {layer.read_stack(_layer_dir(name))}")


def test_a_commands_changes_frozen_ahead_are_undone_and_checkpointed_as_before(tmp_path: Path) -> None:
    """After a command, while nobody waits, the supervisor freezes what it changed
    (the workspace stacked again on it), so that the next command's checkpoint is only
    recorded and that command finds a spare ready (a review sandbox's exec at an
    agent's pace: 32 against 3.4 ms before; ``bench_checkpoints.py``). What must not
    change: the listing, a rollback to the last checkpoint undoing the last command, a
    rollback past it, the diff, a write between two commands kept by the next one's
    checkpoint, a checkpoint taken by hand, and its bytes charged."""
    ws = _workspace(tmp_path)
    name = "cp-ahead"
    sb = _review(ws, name)
    try:
        start = _view(sb, ws)
        _sh(sb, "echo one > one.txt && echo changed > a.txt")
        frozen = _until_frozen_ahead(name)
        assert len(frozen.checkpoints) == 1  # frozen ahead is no checkpoint yet
        assert "; sh -c 'echo one" in sb.checkpoints()[-1].command  # the one before it, as ever
        assert {("added", "one.txt"), ("modified", "a.txt")} <= _changes(sb)
        # Undo with nothing run since: back to before the command, the frozen layer gone.
        sb.rollback()
        assert not _sh(sb, "ls one.txt 2>/dev/null; true") and _view(sb, ws) == start
        assert _changes(sb) == set()

        _sh(sb, "echo two > two.txt")
        _until_frozen_ahead(name)
        after_two = _view(sb, ws)  # a command: its checkpoint is the frozen layer, recorded
        record = layer.read_stack(_layer_dir(name))
        assert record.checkpoints[-1].layer == frozen_layer(record) and record.checkpoints[-1].bytes > 0
        assert record.checkpoints[-1].commands[0].startswith("python3 -I -c")
        sb.files.write("api.txt", b"written between two commands\n")
        _sh(sb, "echo three > three.txt")  # its checkpoint: the view's state and api.txt
        back = sb.rollback()
        assert back.command.startswith("sh -c 'echo three")
        assert _sh(sb, "cat two.txt api.txt; ls three.txt 2>/dev/null; true") == (
            "two\nwritten between two commands\n"
        )
        view = _view(sb, ws)
        assert {k: v for k, v in view["entries"].items() if k != "api.txt"} == after_two["entries"]  # type: ignore[attr-defined]

        _sh(sb, "echo four > four.txt")
        _until_frozen_ahead(name)
        taken = sb.checkpoint()  # by hand: the frozen layer, recorded as it is
        record = layer.read_stack(_layer_dir(name))
        assert taken.command == "" and record.checkpoints[-1].layer == frozen_layer(record)
        _sh(sb, "rm four.txt two.txt")
        sb.rollback(taken.id)
        assert _sh(sb, "cat four.txt two.txt") == "four\ntwo\n"
        # A process left running: nothing is frozen ahead (PID 1 is not alone) and the
        # commands run; once it is gone, the next command's checkpoint is taken whole and
        # freezing ahead resumes.
        server = sb.spawn(["sleep", "60"])
        _sh(sb, "echo five > five.txt")
        time.sleep(0.5)
        record = layer.read_stack(_layer_dir(name))
        assert record.checkpoints[-1].layer == frozen_layer(record), record  # none frozen ahead
        server.kill()
        server.wait(timeout=10)
        _sh(sb, "echo six > six.txt")
        _until_frozen_ahead(name)
        assert "sh -c 'echo six" in sb.checkpoints()[-1].command
        first = sb.checkpoints()[0]
        sb.rollback(first.id)  # past every frozen layer: the workspace as it began
        assert _view(sb, ws) == start and _changes(sb) == set()
        assert not (ws / "one.txt").exists() and (ws / "a.txt").read_text() == "a\n"  # the host untouched
    finally:
        sb.remove()


def frozen_layer(record: layer.LayerStack) -> str:
    """The newest frozen directory of a record (below the live upper)."""
    return record.layers[-2]


def _host_pids_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline.split(b"\0"):
            found.append(int(entry))
    return found


def _seen_running(marker: str) -> list[int]:
    """The host's pids of the process with ``marker`` in its command line, once there."""
    deadline = time.monotonic() + 10
    while not (pids := _host_pids_with(marker)):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return pids


def _rss_mib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    return 0


def _seen_gone(marker: str) -> None:
    deadline = time.monotonic() + 5
    while _host_pids_with(marker):
        assert time.monotonic() < deadline, "the process still runs after the rollback"
        time.sleep(0.01)


def test_a_running_process_is_named_and_stopped_or_the_rollback_refused(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    sb = _review(ws, "cp-running")
    try:
        _sh(sb, "echo x > x.txt")
        sb.checkpoint()
        marker = f"{os.getpid()}.{time.monotonic_ns() % 100000}"
        sb.spawn(["sh", "-c", f"echo y > y.txt; exec sleep {marker}"])
        _seen_running(marker)  # control: the host sees it running
        with pytest.raises(CheckpointError, match=r"while processes run in it: \d+ \(sleep\)"):
            sb.checkpoint()
        with pytest.raises(CheckpointError, match=r"while processes run in it: \d+ \(sleep\)"):
            sb.rollback(keep_running=True)
        assert _host_pids_with(marker)  # refused: still running, the layer unchanged
        assert ("added", "y.txt") in _changes(sb)
        back = sb.rollback()
        assert "(sleep)" in back.stopped
        _seen_gone(marker)
        assert _changes(sb) == {("added", "x.txt")}
        assert _sh(sb, "ls").split() == sorted(
            ["a-link.txt", "a.txt", "main-link", "src", "tool.sh", "x.txt"]
        )
    finally:
        sb.remove()


def test_a_process_passing_for_warrens_stub_is_stopped_by_a_rollback_all_the_same(tmp_path: Path) -> None:
    # A quiesce does not name warren's own waiting stub among what it stopped (one whose
    # helper ended before it named itself is PID 1's for a moment, told by its exe). A
    # command run from a memfd of the stub's name is taken for it: not named, but
    # stopped all the same, judged on the host. It holds 512 MiB, so that after its kill
    # it stays a while in its exit with its exe gone (the kernel frees its memory): it
    # was judged when first seen, and is not named on a second look either.
    ws = _workspace(tmp_path)
    sb = _review(ws, "cp-disguise")
    try:
        _sh(sb, "echo x > x.txt")
        sb.checkpoint()
        marker = f"{os.getpid()}.{time.monotonic_ns() % 100000}"
        held = "import time; m = b'x' * (512 << 20); time.sleep(1000)"
        disguise = (
            f"import os, sys; fd = os.memfd_create({execstub.NAME!r}); "
            "os.write(fd, open(sys.executable, 'rb').read()); "
            f"os.execv(f'/proc/self/fd/{{fd}}', ['python3', '-I', '-c', {held!r}, {marker!r}])"
        )
        sb.spawn(["python3", "-I", "-c", disguise])
        pids = _seen_running(marker)  # control: the host sees it running
        assert os.readlink(f"/proc/{pids[0]}/exe") == execstub.MEMFD_NAME  # it passes for the stub
        deadline = time.monotonic() + 10
        while _rss_mib(pids[0]) < 500:  # control: its memory is held
            assert time.monotonic() < deadline
            time.sleep(0.01)
        back = sb.rollback()
        assert back.stopped == ""
        _seen_gone(marker)
        assert _changes(sb) == {("added", "x.txt")}
    finally:
        sb.remove()


# A process of the command before that takes a while to go: it touches 2 GiB, waits for
# "go", then exits (freeing that memory takes the kernel about 0.2 s).
_BIG = r"""
import mmap, os, time
m = mmap.mmap(-1, 2 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for off in range(0, len(m), 4096):
    m[off] = 1
open("ready", "w").close()
while not os.path.exists("go"):
    time.sleep(0.001)
os._exit(0)
"""
# Says "go", then waits until that process is in the kernel's exit (every thread
# PF_EXITING, or a zombie) and says whether it saw it there or already gone.
_UNTIL_EXITING = r"""
import os, sys
pid = sys.argv[1]
open("go", "w").close()
seen = "gone"
while True:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        break
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X") or int(fields[6]) & 0x4:
        seen = "exiting"
        break
print(seen)
"""


def test_the_checkpoint_before_a_command_waits_for_a_process_in_its_exit(tmp_path: Path) -> None:
    # The checkpoint before each command is skipped while a process of the sandbox still
    # runs (said in the supervisor's log, naming it). One in the kernel's exit runs
    # nothing more: it is waited for, however long the kernel takes to free its memory,
    # and the next command gets its checkpoint (skipped before, after a 15 ms grace).
    ws = _workspace(tmp_path)
    (ws / "big.py").write_text(_BIG)
    (ws / "until_exiting.py").write_text(_UNTIL_EXITING)
    sb = _review(ws, "cp-exit")
    try:
        for round_ in range(2):
            pid = _sh(
                sb,
                "rm -f ready go; python3 -I big.py >/dev/null 2>&1 & echo $!; "
                "until [ -e ready ]; do sleep 0.01; done",
            )
            # its checkpoint skipped: the big process runs
            assert _sh(sb, f"python3 -I until_exiting.py {pid.strip()}").strip() == "exiting"  # control
            _sh(sb, f"echo {round_} > three.txt")
            listed = sb.checkpoints()
            assert listed[-1].command == f"sh -c 'echo {round_} > three.txt'", [c.command for c in listed]
        log = (Path(statedir.location(os.environ)) / statedir.LOG_FILE).read_text()
        assert re.search(
            r"no checkpoint of cp-exit before sh -c 'python3 -I until_exiting\.py \d+': a process of "
            r"the sandbox still ran, \d+ \(python3\)",
            log,
        ), log[-2000:]
        # judged on the host: back to it, the change of the command after it is undone
        sb.rollback(listed[-1].id)
        assert (ws / "three.txt").exists() is False
        assert _sh(sb, "cat three.txt") == "0\n"
    finally:
        sb.remove()


def test_apply_after_several_checkpoints_applies_their_union(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    sb = _review(ws, "cp-union")
    try:
        _sh(sb, "echo 1 > new.txt && echo edited > src/main.py")
        sb.checkpoint()
        _sh(sb, "rm a-link.txt && mkdir -p lib && mv new.txt lib/new.txt")
        sb.checkpoint()
        _sh(sb, "chmod 700 tool.sh && echo 2 >> lib/new.txt && rm -r src/deep && mkdir src/deep")
        sb.checkpoint()
        _sh(sb, "echo again > src/deep/y && ln -sf a.txt main-link")
        assert len(layer.read_stack(_layer_dir("cp-union")).layers) >= 5  # the union of 5 layers or more
        expected = {
            ("modified", "src/main.py"),
            ("removed", "a-link.txt"),
            ("added", "lib"),
            ("added", "lib/new.txt"),
            ("mode", "tool.sh"),
            ("removed", "src/deep/x.bin"),  # the directory made again is opaque
            ("added", "src/deep/y"),
            ("modified", "main-link"),
        }
        assert _changes(sb) == expected
        sb.stop()
        sb.apply()
        assert not (ws / "a-link.txt").exists() and (ws / "lib" / "new.txt").read_text() == "1\n2\n"
        assert (ws / "src" / "main.py").read_text() == "edited\n"
        assert (ws / "tool.sh").stat().st_mode & 0o777 == 0o700
        assert sorted(os.listdir(ws / "src" / "deep")) == ["y"]
        assert os.readlink(ws / "main-link") == "a.txt"
        assert sb.diff().changes == ()
    finally:
        sb.remove()


def test_a_supervisor_killed_mid_apply_leaves_each_file_old_or_new(tmp_path: Path) -> None:
    """SIGKILL to the supervisor while it applies, a few rounds at growing delays: every
    file of the host workspace is then the old or the new content, never a mix."""
    ws = tmp_path / "ws"
    ws.mkdir()
    old = {f"f{i:03d}": bytes([i]) * (64 << 10) for i in range(40)}
    for name, data in old.items():
        (ws / name).write_bytes(data)
    sb = _review(ws, "cp-kill")
    try:
        _sh(sb, "for f in f*; do head -c 65536 /dev/zero | tr '\\000' N > $f; done")
        sb.stop()
        new = {n: (ws / n).read_bytes() for n in old}  # the host's is still the old
        assert new == old
        root = statedir.location(os.environ)
        # How long an apply takes here, the kills aimed within it: the faster of two (the
        # first of a sandbox's applies can be much slower than those the kills then aim at).
        took = float("inf")
        for _ in range(2):
            for name, data in old.items():
                (ws / name).write_bytes(data)
            began = time.monotonic()
            sb.apply(force=True)
            took = min(took, time.monotonic() - began)
        seen_partial = False
        for share in (0.2, 0.4, 0.6, 0.8, 0.3, 0.5, 0.7, 0.1, 0.9, 0.45):
            for name, data in old.items():
                (ws / name).write_bytes(data)
            Sandbox.list()  # a supervisor is up: the kill lands in the apply, not its start
            found = statedir.read_address(root)
            assert found is not None
            t = threading.Thread(target=_apply_quietly, args=(sb,))
            t.start()
            time.sleep(took * share)
            os.kill(found[1], signal.SIGKILL)
            t.join(30)
            _gone(found[1])
            states = set()
            for name, data in old.items():
                now = (ws / name).read_bytes()
                assert now == data or now == layer_content(name, data), f"{name} is half written"
                states.add(now == data)
            seen_partial = seen_partial or len(states) == 2
            if seen_partial:
                break
        assert seen_partial, f"no kill landed within an apply of {took:.3f} s"
        sb.apply(force=True)
        for name, data in old.items():
            assert (ws / name).read_bytes() == layer_content(name, data)
    finally:
        sb.remove()


def test_a_supervisor_killed_mid_checkpoint_leaves_the_record_before_or_after(tmp_path: Path) -> None:
    """SIGKILL to the supervisor while it takes a checkpoint, four rounds at growing delays
    (the sandbox ends with it): the record is readable and names only directories that
    are there, the union is what the sandbox wrote (a checkpoint changes nothing of
    it), with the checkpoint listed or not; the stopped sandbox rolls back to the
    earlier checkpoint, and a new one on the same workspace takes checkpoints."""
    ws = _workspace(tmp_path)
    root = statedir.location(os.environ)
    failed = 0
    for n, delay in enumerate((0.0, 0.002, 0.005, 0.01)):
        name = f"cp-killcp{n}"
        sb = _review(ws, name)
        try:
            _sh(sb, "echo one > one.txt")
            first = sb.checkpoint()
            _sh(sb, f"echo {n} > two.txt && rm a.txt")
            Sandbox.list()  # a supervisor is up: the kill lands in the checkpoint, not its start
            found = statedir.read_address(root)
            assert found is not None
            outcome: list[object] = []
            t = threading.Thread(target=_checkpoint_into, args=(sb, outcome))
            t.start()
            time.sleep(delay)
            os.kill(found[1], signal.SIGKILL)
            t.join(30)
            _gone(found[1])
            failed += isinstance(outcome[0], WarrenError)
            record = layer.read_stack(_layer_dir(name))
            for d in [*record.layers, *(b.name for b in record.bases)]:
                assert os.path.isdir(os.path.join(_layer_dir(name), d)), (d, record)
            ids = [c.id for c in record.checkpoints]
            assert first.id in ids[-2:], ids  # the new checkpoint listed, or not
            changed = {("added", "one.txt"), ("added", "two.txt"), ("removed", "a.txt")}
            assert _changes(sb) == changed, (delay, record)
            sb.rollback(first.id)  # stopped: only the record and the directories change
            assert _changes(sb) == {("added", "one.txt")}
        finally:
            sb.remove()
    assert failed, "no kill landed before the checkpoint's answer"
    # a new sandbox on the same workspace takes checkpoints and rolls back
    sb = _review(ws, "cp-killcp-after")
    try:
        _sh(sb, "echo x > x.txt")
        point = sb.checkpoint()
        _sh(sb, "rm x.txt")
        sb.rollback(point.id)
        assert _sh(sb, "cat x.txt") == "x\n"
    finally:
        sb.remove()


def test_the_helper_in_the_sandboxs_namespaces_holds_nothing_of_the_supervisors(tmp_path: Path) -> None:
    """The process kept joined to a review sandbox's namespaces (it mounts each new
    stack) closed every descriptor of the supervisor's but its channel (a client's
    connection held there would never close), is not dumpable (nothing of the user's,
    the sandbox's processes included, reads or traces it: as uid 1001 its descriptors
    cannot even be listed), and is in no pid namespace of the sandbox's."""
    ws = _workspace(tmp_path)
    sb = _review(ws, "cp-helper")
    try:
        _sh(sb, "echo x > x.txt")
        sb.checkpoint()  # the helper exists now (forked ahead, or for this one)
        found = statedir.read_address(statedir.location(os.environ))
        assert found is not None
        helpers = []
        for pid in _children(found[1]):
            with open(f"/proc/{pid}/status") as f:
                status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
            if len(status["NSpid"].split()) != 1:
                continue  # a sandbox's PID 1
            try:  # in another mount namespace than the supervisor's (not its spawner)
                joined = os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink(f"/proc/{found[1]}/ns/mnt")
            except PermissionError:
                joined = os.getuid() != 0  # not dumpable: its namespaces are not the user's to read
            if joined:
                helpers.append(pid)
        assert len(helpers) == 1, helpers
        helper = helpers[0]
        with open(f"/proc/{helper}/status") as f:
            assert f"\nNSpid:\t{helper}\n" in f.read()  # the host's pid only: in no sandbox pid namespace
        if os.getuid() == 0:
            fds = _settled_fds(helper)
            assert fds[3:] and len(fds) == 4 and fds[:3] == [0, 1, 2], fds  # stdio and its channel
            assert os.readlink(f"/proc/{helper}/fd/{fds[3]}").startswith("socket:")
        else:
            with pytest.raises(PermissionError):
                os.listdir(f"/proc/{helper}/fd")
        assert "cp-helper" not in _sh(sb, _CMDLINES)  # nothing inside names it
    finally:
        sb.remove()


def _settled_fds(pid: int, within: float = 10.0) -> list[int]:
    """The descriptors of the helper ``pid`` once it has let go of the stack a restack
    replaced (``joined.close_later`` closes it in a thread of its own: that close
    syncs the upper directory's filesystem and may take a while). While it waits, no
    descriptor but that one is extra, and none is a socket (a client's connection, or
    any channel of the supervisor's, would be one); what is still extra at the end is
    returned for the caller to see."""
    deadline = time.monotonic() + within
    while True:
        fds = sorted(int(n) for n in os.listdir(f"/proc/{pid}/fd"))
        held = []
        for fd in fds[3:]:
            with contextlib.suppress(FileNotFoundError):
                held.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        assert len(fds) <= 5 and sum(h.startswith("socket:") for h in held) <= 1, (fds, held)
        if len(fds) <= 4 or time.monotonic() > deadline:
            return fds
        time.sleep(0.05)


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as f:
            out.extend(int(c) for c in f.read().split())
    return out


def _checkpoint_into(sb: Sandbox, outcome: list[object]) -> None:
    try:
        outcome.append(sb.checkpoint())
    except WarrenError as e:
        outcome.append(e)


def _gone(pid: int) -> None:
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, f"the killed supervisor {pid} is still there"
        time.sleep(0.005)


def _apply_quietly(sb: Sandbox) -> None:
    with contextlib.suppress(WarrenError):  # the killed supervisor's answer
        sb.apply(force=True)


def layer_content(name: str, data: bytes) -> bytes:
    return b"N" * len(data)


def test_the_cli_takes_lists_and_rolls_back(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    sb = _review(ws, "cp-cli")
    try:
        _sh(sb, "echo one > one.txt")
        r = run_cli(["checkpoint", "cp-cli"], cwd=ws)
        assert r.returncode == 0 and r.stdout.strip().isdigit(), r.stderr
        _sh(sb, "rm one.txt")
        r = run_cli(["checkpoints", "--json", "cp-cli"], cwd=ws)
        items = json.loads(r.stdout)
        assert [i["command"] for i in items][-1] == "sh -c 'rm one.txt'"
        r = run_cli(["checkpoints", "cp-cli"], cwd=ws)
        assert "rm one.txt" in r.stdout
        r = run_cli(["rollback", "cp-cli"], cwd=ws)
        assert r.returncode == 0 and "rolled back to checkpoint" in r.stderr, r.stderr
        assert _sh(sb, "cat one.txt") == "one\n"
        r = run_cli(["rollback", "cp-cli", "12345"], cwd=ws)
        assert r.returncode != 0 and "no checkpoint 12345" in r.stderr and "Traceback" not in r.stderr
        r = run_cli(["rollback", "nothing-here"], cwd=ws)
        assert r.returncode != 0 and "Traceback" not in r.stderr
        plain = Sandbox.create(build(PolicySpec(workspace=str(ws))), name="cp-plain")
        try:
            r = run_cli(["checkpoint", "cp-plain"], cwd=ws)
            assert r.returncode == 125 and "writes your workspace itself" in r.stderr
            assert "--review" in r.stderr
            assert "Traceback" not in r.stderr
        finally:
            plain.remove()
    finally:
        sb.remove()


def test_git_inside_keeps_working_across_checkpoints_and_rollbacks(tmp_path: Path) -> None:
    """Fidelity: the workspace stacked again is the same workspace to git (its index,
    objects and refs across layers), and a rollback undoes a commit."""
    ws = tmp_path / "ws"
    ws.mkdir()
    sb = _review(ws, "cp-git")
    env = "git -c user.name=t -c user.email=t@e -c init.defaultBranch=main"
    try:
        _sh(sb, f"{env} init -q && echo 1 > f && {env} add f && {env} commit -qm one")
        taken = sb.checkpoint()
        _sh(sb, f"echo 2 > f && {env} commit -qam two && {env} checkout -qb side")
        assert _sh(sb, "git log --format=%s").split() == ["two", "one"]
        sb.rollback(taken.id)
        assert _sh(sb, "git log --format=%s && git status --porcelain && git branch").split() == [
            "one",
            "*",
            "main",
        ]
        _sh(sb, f"echo 3 > f && {env} commit -qam three && {env} gc -q")
        assert _sh(sb, "git log --format=%s").split() == ["three", "one"]
        assert _sh(sb, "git fsck --no-progress 2>&1; echo $?").strip().endswith("0")
    finally:
        sb.remove()


@pytest.mark.caller_independent(half="root")
def test_the_mounts_moved_are_those_directly_on_the_workspace_overlay() -> None:
    from warren.plan.facts import MountEntry

    def m(i: int, parent: int, point: str, fs: str = "ext4") -> MountEntry:
        return MountEntry(i, parent, "/", point, "rw", fs, "x")

    mounts = (
        m(1, 0, "/"),
        m(2, 1, "/ws", "ext4"),
        m(3, 2, "/ws", "overlay"),
        m(4, 3, "/ws/.git/hooks"),
        m(5, 4, "/ws/.git/hooks/x"),
        m(6, 3, "/ws/secret"),
        m(7, 1, "/wsother"),
    )
    assert checkpoints.mounts_on(mounts, "/ws") == [".git/hooks", "secret"]
    with pytest.raises(ValueError, match="no single overlay"):
        checkpoints.mounts_on(mounts[:2], "/ws")
    with pytest.raises(ValueError, match="stacked"):
        checkpoints.mounts_on((*mounts, m(8, 6, "/ws/secret")), "/ws")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _files(where: Path) -> dict[str, tuple[bytes, int, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mode, p.stat().st_mtime_ns) for p in where.iterdir()}


def test_a_frozen_checkpoint_is_never_written_by_the_sandbox(tmp_path: Path) -> None:
    """The attack: write, chmod and touch a file of a checkpoint after it was taken, and
    hold a file open across one (a writer in the background). Judged on the host in the
    layer's directories: the frozen one never changes; the control is the live one,
    which takes every write."""
    ws = tmp_path / "ws"
    ws.mkdir()
    sb = _review(ws, "cp-frozen")
    try:
        _sh(sb, "echo v1 > f && echo v1 > held.txt")
        taken = sb.checkpoint()
        base = Path(_layer_dir("cp-frozen"))
        stack = layer.read_stack(str(base))
        frozen = base / next(c.layer for c in stack.checkpoints if c.id == taken.id)
        live = base / stack.layers[-1]
        before = _files(frozen)
        _sh(sb, "echo v2 > f && chmod 777 f && touch -d @1000000000 f && echo v2 >> held.txt")
        assert (live / "f").read_bytes() == b"v2\n"  # the control: the writes land in the live layer
        writer = "exec 3>>held.txt; while :; do echo x >&3; sleep 0.01; done"
        sb.spawn(["sh", "-c", writer])  # a checkpoint before it froze the writes above
        stack = layer.read_stack(str(base))
        live = base / stack.layers[-1]
        before_spawn = stack.checkpoints[-1]
        assert before_spawn.id != taken.id
        also_frozen = base / before_spawn.layer
        frozen_then = _files(also_frozen)
        deadline = time.monotonic() + 10
        while _size(live / "held.txt") < 12:  # the control: the writer writes
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(CheckpointError, match=r"while processes run in it: \d+ \(sh\)"):
            sb.checkpoint()
        _sh(sb, "true")  # a command: its checkpoint is skipped while the writer runs
        assert sb.checkpoints()[-1].id == before_spawn.id
        assert _size(live / "held.txt") > 12 and _files(also_frozen) == frozen_then
        back = sb.rollback(taken.id)  # the writer is stopped first
        assert "(sh)" in back.stopped or "(sleep)" in back.stopped, back.stopped
        time.sleep(0.05)
        assert _files(frozen) == before
        assert _sh(sb, "cat f held.txt") == "v1\nv1\n"
    finally:
        sb.remove()


def test_a_stopped_review_sandbox_rolls_back_before_apply(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    sb = _review(ws, "cp-stopped")
    try:
        _sh(sb, "echo good > good.txt")
        good = sb.checkpoint()
        _sh(sb, "rm -rf src && echo bad > bad.txt")
        sb.stop()
        assert ("added", "bad.txt") in _changes(sb)  # the control: the bad step is there
        assert sb.rollback(good.id).id == good.id
        assert _changes(sb) == {("added", "good.txt")}
        sb.apply()
        assert (ws / "good.txt").read_text() == "good\n" and (ws / "src" / "main.py").exists()
        assert not (ws / "bad.txt").exists()
    finally:
        sb.remove()


def _host_tree(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every entry beneath ``root`` on the host: (mode, mtime, content or link target)."""
    out: dict[str, tuple[int, int, bytes]] = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = Path(d, n)
            st = p.lstat()
            data = os.readlink(p).encode() if p.is_symlink() else p.read_bytes() if p.is_file() else b""
            out[str(p.relative_to(root))] = (st.st_mode, st.st_mtime_ns, data)
    return out


def test_a_review_workspace_seen_at_another_path_is_reviewed_and_rolled_back_there(tmp_path: Path) -> None:
    # workspace_at (E2B's /home/user): the overlay is seen at the new path, and a
    # checkpoint or a rollback stacks it again there too (not only at the host path)
    ws = _workspace(tmp_path)
    parent = Path.home() / f".warren-review-at-{os.urandom(6).hex()}"
    parent.mkdir()
    at = parent / "user"
    host_before = _host_tree(ws)
    sb = Sandbox.create(build(PolicySpec(workspace=str(ws), review=True, workspace_at=str(at))), name="cp-at")
    try:
        out = _sh(sb, "pwd && echo made > made.txt && rm tool.sh && mv src/main.py src/deep/moved.py && ls")
        assert out.splitlines() == [str(at), "a-link.txt", "a.txt", "made.txt", "main-link", "src"]
        assert not at.exists() and _host_tree(ws) == host_before  # the host saw nothing
        expected = {("added", "made.txt"), ("removed", "tool.sh"), ("renamed", "src/deep/moved.py")}
        assert _changes(sb) == expected
        before = _view(sb, at)
        taken = sb.checkpoint()
        _sh(sb, f"rm -rf {at}/* && echo late > {at}/late.txt")
        assert _view(sb, at)["entries"].keys() == {"late.txt"}  # type: ignore[attr-defined]
        assert ("removed", "a.txt") in _changes(sb)  # the control: the layer took the removal
        sb.rollback(taken.id)
        assert _view(sb, at) == before  # at the new path, what the checkpoint froze
        assert _view(sb, ws) == _view(sb, at)  # and the host path inside shows the same overlay
        assert _changes(sb) == expected
        # a checkpoint taken before a command, then a write: both seen at the new path
        _sh(sb, "echo again > again.txt")
        assert _sh(sb, "cat again.txt made.txt") == "again\nmade\n"
        assert _host_tree(ws) == host_before
        sb.stop()
        sb.apply()
        assert (ws / "made.txt").read_text() == "made\n" and (ws / "again.txt").read_text() == "again\n"
        assert not (ws / "tool.sh").exists() and (ws / "src" / "deep" / "moved.py").exists()
        assert not (ws / "src" / "main.py").exists() and not (ws / "late.txt").exists()
    finally:
        sb.remove()
        parent.rmdir()
