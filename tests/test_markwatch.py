"""The kernel's word on a booted sandbox's marks (``server.markwatch``): every change to
what a marked path names (the path or a directory on its way replaced, a link retargeted,
a new entry in a listed directory, a mount) makes the watch say "changed", and the marks
taken again agree that something did; what the marks do not rest on (another name in the
same directory) leaves it quiet. No sandbox runs here: the plans are made from this host.
As root and as uid 1001.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from warren._core import _sys
from warren.plan import CallerFacts, HostFacts, Plan, make_plan
from warren.plan.facts import MountEntry
from warren.plan.model import MountKind, MountOp
from warren.plan.mounts import SCRATCH_PREFIX
from warren.policy import PolicySpec, build
from warren.server import ahead, marks, markwatch
from warren.server.hostfacts import gather

# Beside the tests' tmp_path, not in it (pytest's own directories get new entries), and
# one directory for the module: a new entry in /var/tmp (a listed directory of these
# plans, above the denied path) is a change for every watch, this module's others too.
_HERE = Path("/var/tmp") / f"warren-markwatch-{os.getpid()}"


@pytest.fixture(scope="module")
def _module_dir() -> Iterator[Path]:
    _HERE.mkdir()
    yield _HERE
    shutil.rmtree(_HERE, ignore_errors=True)


@pytest.fixture
def base(_module_dir: Path) -> Iterator[Path]:
    path = _module_dir / os.urandom(4).hex()
    (path / "ws").mkdir(parents=True)
    (path / "quiet").mkdir()  # a directory no plan names: the denied one's place
    (path / "quiet" / "secret").mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _plan(ws: Path, denied: Path) -> Plan:
    caller = CallerFacts.here(cwd=str(ws))
    policy = build(
        PolicySpec(workspace=str(ws), deny=[str(denied)]), cwd=ws, env=caller.env, home=Path(caller.home)
    )
    return make_plan(policy, gather(), caller)


def _watched(plan: Plan) -> markwatch.MarkWatch:
    """A watch that was quiet right after its start. The host is shared (other processes
    make entries in /var/tmp, mount and unmount): a watch that spoke before the test
    changed anything is let go and another started, a few times."""
    for _ in range(20):
        watch = markwatch.MarkWatch.start(plan)
        assert watch is not None, "the host's paths can be watched"
        taken = marks.take(plan)
        assert watch.confirm(plan)
        if watch.unchanged():
            watch.taken = taken  # type: ignore[attr-defined]
            return watch
        watch.close()
        time.sleep(0.1)
    raise AssertionError("the host kept changing what the plan rests on")


def _agrees(watch: markwatch.MarkWatch, plan: Plan) -> None:
    """The watch says changed, and the marks taken again agree."""
    assert not watch.unchanged()
    assert not watch.unchanged(), "changed for good"
    assert not marks.still(watch.taken, marks.take(plan))  # type: ignore[attr-defined]
    watch.close()


def test_an_untouched_host_keeps_the_watch_quiet_and_other_names_do_not_count(base: Path) -> None:
    plan = _plan(base / "ws", base / "quiet" / "secret")
    quiet = 0
    for _ in range(10):  # the host is shared: a change of someone else's may come between
        watch = _watched(plan)
        (base / "ws" / "file").write_text("x")  # the workspace's contents are not its identity
        (base / "quiet" / "secret" / "inner").mkdir()  # inside a denied directory: hidden whole
        os.rmdir(base / "quiet" / "secret" / "inner")
        os.unlink(base / "ws" / "file")
        if watch.unchanged():
            quiet += 1
            assert marks.still(watch.taken, marks.take(plan))  # type: ignore[attr-defined]
        watch.close()
        if quiet:
            break
    assert quiet, "the watch spoke though nothing it rests on changed"


def _kernel_watches() -> set[int]:
    """The watch descriptors the kernel holds for the shared inotify instance."""
    fd = markwatch._SHARED.fd
    with open(f"/proc/self/fdinfo/{fd}") as f:
        return {int(line.split()[1].split(":")[1], 16) for line in f if line.startswith("inotify wd:")}


def test_a_closed_watch_stays_idle_until_swept_and_the_next_one_reuses_it(base: Path) -> None:
    """Closing a booted sandbox's watch (on its run's path) removes nothing from the
    kernel; the next sandbox's watch of the same directories takes the same descriptors
    and hears a change; ``sweep`` removes what stayed idle past its time."""
    plan = _plan(base / "ws", base / "quiet" / "secret")
    first = _watched(plan)
    wds = set(first.wds)
    first.close()
    assert wds <= _kernel_watches(), "closing removed nothing"
    assert wds <= set(markwatch._SHARED.idle)
    assert not markwatch.due(time.monotonic()), "not idle for long yet"
    second = _watched(plan)
    assert set(second.wds) == wds, "the same directories, the same watches"
    assert not wds & set(markwatch._SHARED.idle), "wanted again: not idle"
    os.rename(base / "ws", base / "ws.old")
    (base / "ws").mkdir()
    _agrees(second, plan)  # (closes it: idle again)
    later = time.monotonic() + markwatch.IDLE_KEEP + 1
    assert markwatch.due(later)
    markwatch.sweep(later)
    assert not wds & _kernel_watches(), "swept: removed from the kernel"
    assert not wds & set(markwatch._SHARED.idle)


def test_a_replaced_workspace_is_a_change(base: Path) -> None:
    plan = _plan(base / "ws", base / "quiet" / "secret")
    watch = _watched(plan)
    os.rename(base / "ws", base / "ws.old")
    (base / "ws").mkdir()
    _agrees(watch, plan)


def test_a_workspace_removed_or_moved_away_is_told_without_the_marks(base: Path) -> None:
    """``replaced``: a name on the way to a path the plan names gone from its directory
    (the workspace deleted and made again, as a harness copying a project anew does; or
    moved away) says which, and the marks taken again agree that the sandbox is another."""
    plan = _plan(base / "ws", base / "quiet" / "secret")
    watch = _watched(plan)
    assert watch.replaced() is None
    shutil.rmtree(base / "ws")
    (base / "ws").mkdir()
    assert watch.replaced() == str(base / "ws")
    _agrees(watch, plan)
    assert watch.replaced() == str(base / "ws"), "closed, it still says so"
    watch = _watched(plan)
    os.rename(base, base.with_name(base.name + ".away"))
    try:
        assert watch.replaced() == str(base)
        assert not watch.unchanged()
    finally:
        os.rename(base.with_name(base.name + ".away"), base)
        watch.close()


def test_changes_the_marks_must_judge_are_not_told_replaced(base: Path) -> None:
    """A new entry of a listed directory, a file written or removed in the workspace,
    and a name removed on the way to where a listed entry's link points (an entry's
    read rule can be built again: ``marks.rules_only``) leave ``replaced`` silent; the
    first and last still make the watch say "changed", for the marks to judge."""
    (base / "a").mkdir()
    (base / "a" / "f").write_text("1")
    (base / "quiet" / "link").symlink_to(base / "a" / "f")
    plan = _plan(base / "ws", base / "quiet" / "secret")
    for _ in range(10):  # the host is shared: another process's change may come between
        watch = _watched(plan)
        (base / "ws" / "file").write_text("x")
        os.unlink(base / "ws" / "file")
        if watch.unchanged():
            break
        watch.close()
    assert watch.replaced() is None
    (base / "quiet" / "new").write_text("x")
    assert not watch.unchanged()
    assert watch.replaced() is None
    watch.close()
    watch = _watched(plan)
    os.unlink(base / "a" / "f")
    assert not watch.unchanged()
    assert watch.replaced() is None, "reached only through a listed entry's link"
    watch.close()


def test_a_denied_directory_replaced_is_a_change(base: Path) -> None:
    plan = _plan(base / "ws", base / "quiet" / "secret")
    watch = _watched(plan)
    shutil.rmtree(base / "quiet" / "secret")
    (base / "quiet" / "secret").mkdir()
    _agrees(watch, plan)


def test_a_new_entry_beside_a_denied_path_is_a_change(base: Path) -> None:
    """Its directory's entries get a read rule each: a new one has none in the booted
    sandbox, where a fresh one would give it one."""
    plan = _plan(base / "ws", base / "quiet" / "secret")
    watch = _watched(plan)
    (base / "quiet" / "new").write_text("x")
    _agrees(watch, plan)


def test_a_sandbox_s_tmpdir_made_beside_is_no_change_as_for_the_marks(base: Path) -> None:
    """A sibling workspace's sandbox makes its TMPDIR (``.warren-tmp-<random>``) in the
    directory both share at every launch: a directory so named made since the boot is
    no difference to the marks, so the watch stays quiet too (before, every sandbox
    booted ahead for one of two sibling workspaces went stale, and its run took the
    marks again)."""
    plan = _plan(base / "ws", base / "quiet" / "secret")
    quiet = 0
    for _ in range(10):  # the host is shared: a change of someone else's may come between
        watch = _watched(plan)
        scratch = base / "quiet" / f"{SCRATCH_PREFIX}{os.urandom(12).hex()}"
        scratch.mkdir()
        if watch.unchanged():
            now = marks.take(plan)
            # Judged only if the watch is still quiet once they are taken: a change of
            # someone else's (a mount elsewhere) may land between the two (a gate saw one).
            if watch.unchanged():
                quiet += 1
                assert marks.still(watch.taken, now)  # type: ignore[attr-defined]
        scratch.rmdir()  # a sandbox's end: one gone is gone inside too
        if watch.unchanged():
            quiet += 1
        watch.close()
        if quiet == 2:
            break
    assert quiet == 2, "the watch spoke where the marks see no difference"


def test_the_tmpdir_names_a_watch_remembers_have_a_budget(
    base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each such name removed is remembered (made again, it would be a change): a
    sandbox whose workspace is a listed directory of another's could make and remove
    them without end, growing the supervisor. Past ``SCRATCH_GONE_MAX`` the watch says
    changed, and the marks, taken again, judge (here: nothing differs)."""
    monkeypatch.setattr(markwatch, "SCRATCH_GONE_MAX", 8)
    plan = _plan(base / "ws", base / "quiet" / "secret")
    for _ in range(10):  # the host is shared: a change of someone else's may come between
        watch = _watched(plan)
        for _ in range(8):
            scratch = base / "quiet" / f"{SCRATCH_PREFIX}{os.urandom(12).hex()}"
            scratch.mkdir()
            scratch.rmdir()
        if watch.unchanged():
            break
        watch.close()
    else:
        raise AssertionError("the watch spoke within the budget")
    assert len(watch.scratch_gone) == 8
    scratch.mkdir()
    scratch.rmdir()
    assert not watch.unchanged(), "past the budget: changed"
    assert len(watch.scratch_gone) <= 9
    assert marks.still(watch.taken, marks.take(plan))  # type: ignore[attr-defined]
    watch.close()


@pytest.mark.parametrize("how", ["made-again", "a-file", "moved-in"])
def test_a_tmpdir_name_there_at_the_boot_made_again_or_not_warrens_is_a_change(base: Path, how: str) -> None:
    """What the marks do count stays a change: a directory of that name that was there
    at the boot, removed and made again (another directory); a file of that name; one
    moved in (which may have replaced one that was there)."""
    scratch = base / "quiet" / f"{SCRATCH_PREFIX}{os.urandom(12).hex()}"
    if how == "made-again":
        scratch.mkdir()
    plan = _plan(base / "ws", base / "quiet" / "secret")
    watch = _watched(plan)
    if how == "made-again":
        scratch.rmdir()
        scratch.mkdir()
    elif how == "a-file":
        scratch.write_text("x")
    else:
        (base / "moved").mkdir()
        (base / "moved").rename(scratch)
    if how == "moved-in":
        # the marks see a new directory of warren's name (no difference to them); the
        # watch cannot tell a move in from a replacement, and says changed
        assert not watch.unchanged()
        watch.close()
    else:
        _agrees(watch, plan)


def test_where_a_listed_entry_s_link_leads_counts(base: Path) -> None:
    """An entry of a listed directory (beside the denied one) is a link: its read rule
    is for the file it leads to. That file replaced, or the link pointed elsewhere, is a
    change."""
    (base / "a").mkdir()
    (base / "a" / "f").write_text("1")
    (base / "quiet" / "link").symlink_to(base / "a" / "f")
    plan = _plan(base / "ws", base / "quiet" / "secret")
    found = markwatch.lookups(plan)
    assert found is not None and "f" in found[0].get(str(base / "a"), set()), "the link is followed"
    watch = _watched(plan)
    (base / "a" / "f.new").write_text("2")
    os.rename(base / "a" / "f.new", base / "a" / "f")
    _agrees(watch, plan)
    watch = _watched(plan)
    (base / "quiet" / "link.new").symlink_to(base / "ws")
    os.rename(base / "quiet" / "link.new", base / "quiet" / "link")
    _agrees(watch, plan)


_MOUNTED = """
import subprocess, sys
from warren.server import markwatch
from test_markwatch import _plan
from pathlib import Path
base = Path(sys.argv[1])
plan = _plan(base / "ws", base / "quiet" / "secret")
watch = markwatch.MarkWatch.start(plan)
assert watch is not None and watch.unchanged()
subprocess.run(["mount", "-t", "tmpfs", "none", str(base / "quiet")], check=True)
print("changed" if not watch.unchanged() else "unchanged")
"""


def test_a_mount_over_a_marked_path_is_a_change(base: Path) -> None:
    """A mount makes no inotify event: the mount table's own change says it. In a mount
    namespace of the test's own (a user namespace: as uid 1001 too), the watch made
    there, then a tmpfs mounted over the denied directory's parent."""
    env = {**os.environ, "PYTHONPATH": os.path.dirname(__file__)}
    r = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", sys.executable, "-c", _MOUNTED, str(base)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "changed"


def test_events_count_only_for_the_names_looked_up_and_new_entries_of_listed_ones() -> None:
    IN = _sys
    assert markwatch.relevant(IN.IN_CREATE, "ws", {"ws"}, wild=False)
    assert markwatch.relevant(IN.IN_MOVED_FROM, "ws", {"ws"}, wild=False)
    assert not markwatch.relevant(IN.IN_CREATE, "other", {"ws"}, wild=False)
    assert markwatch.relevant(IN.IN_CREATE, "other", None, wild=True), "a new entry of a listed one"
    assert markwatch.relevant(IN.IN_MOVED_TO, "other", {"ws"}, wild=True)
    assert not markwatch.relevant(IN.IN_DELETE, "other", None, wild=True), "one gone is gone inside too"
    tmpdir = SCRATCH_PREFIX + "0" * 24
    made_dir = IN.IN_CREATE | IN.IN_ISDIR
    assert not markwatch.relevant(made_dir, tmpdir, None, wild=True), "a sandbox's TMPDIR made beside"
    assert markwatch.relevant(made_dir, tmpdir, None, wild=True, gone_before=True), "there at the boot"
    assert markwatch.relevant(IN.IN_CREATE, tmpdir, None, wild=True), "a file"
    assert markwatch.relevant(IN.IN_MOVED_TO | IN.IN_ISDIR, tmpdir, None, wild=True), "moved in"
    assert markwatch.relevant(made_dir, tmpdir, {tmpdir}, wild=True), "a name a planned path takes"
    assert markwatch.relevant(made_dir, "other", None, wild=True)
    for whole in (IN.IN_Q_OVERFLOW, IN.IN_IGNORED, IN.IN_DELETE_SELF, IN.IN_MOVE_SELF):
        assert markwatch.relevant(whole, "", None, wild=False)


def test_the_log_names_what_changed() -> None:
    """``marks.difference``: the words in the supervisor's log when a booted sandbox is
    not used."""
    then = (("/w", (1, 2, 0o040000, b"h")), (marks.ENTRIES + "/d", (("a", (1, 3)),)))
    assert marks.difference(then, then) is None
    assert marks.difference(then, (("/w", (1, 9, 0o040000, b"g")), then[1])) == "/w is another file"
    assert marks.difference(then, (("/w", None), then[1])) == "/w came or went"
    new_entry = (then[0], (marks.ENTRIES + "/d", (("a", (1, 3)), ("b", (1, 4)))))
    assert marks.difference(then, new_entry) == "/d has a new entry (b)"
    replaced = (then[0], (marks.ENTRIES + "/d", (("a", (1, 5)),)))
    assert marks.difference(then, replaced) == "/d/a is another file"
    assert marks.difference(then, (then[0], (marks.ENTRIES + "/d", ()))) is None, "one gone is gone inside"


def test_mounts_beneath_the_sandbox_s_own_tmp_are_out_of_its_sight(base: Path) -> None:
    """A tmpfs mounted under the host's /tmp after the boot (a test suite's) leaves the
    booted sandbox what a fresh one would be: its /tmp is its own. One where the plan
    brings a host path in (a workspace under /tmp, what is mounted in it), or anywhere
    else (/mnt), is a change of the host."""
    plan = _plan(base / "ws", base / "quiet" / "secret")
    host = gather()
    root = host.mounts[0]

    def plus(*points: str) -> HostFacts:
        extra = tuple(
            MountEntry(9000 + i, root.mount_id, "/", p, "rw", "tmpfs", "t") for i, p in enumerate(points)
        )
        return dataclasses.replace(host, mounts=(*host.mounts, *extra))

    assert ahead.same_but_hidden(plan, plus("/tmp/tmp.suite"), host)
    assert ahead.same_but_hidden(plan, plus("/tmp/a", "/tmp/a/b"), plus("/tmp/c"))
    assert not ahead.same_but_hidden(plan, plus("/mnt/usb"), host)
    assert not ahead.same_but_hidden(plan, plus("/tmp"), host), (
        "the host's /tmp itself: the mount the plan covers"
    )
    assert not ahead.same_but_hidden(plan, dataclasses.replace(host, landlock_abi=1), host)
    # A workspace under /tmp: the plan binds it from the host, with what is mounted there.
    in_tmp = Path(f"/tmp/warren-markwatch-{os.getpid()}-{os.urandom(4).hex()}")
    (in_tmp / "ws").mkdir(parents=True)
    try:
        tmp_plan = _plan(in_tmp / "ws", base / "quiet" / "secret")
        assert not ahead.same_but_hidden(tmp_plan, plus(f"{in_tmp}/ws/mnt"), host)
        assert ahead.same_but_hidden(tmp_plan, plus("/tmp/elsewhere"), host)
    finally:
        shutil.rmtree(in_tmp, ignore_errors=True)


def test_only_entries_that_matter_to_the_read_rules_alone_can_be_refreshed(base: Path) -> None:
    """A new entry beside a denied path is made right by building the read rules again
    (``marks.rules_only``); one in a directory masked entry by entry (as the workspace's
    parent is where the TMPDIR is made beside the workspace) or guarded is not: the
    booted sandbox is not used."""
    plan = _plan(base / "ws", base / "quiet" / "secret")
    quiet = str(base / "quiet")
    assert quiet in marks.rules_only(plan)
    # The host is shared (a `warren doctor` on another worker makes and removes a file in
    # $HOME): marks taken while another process changed what the plan rests on are taken
    # again, a few times, as `_watched` does.
    for _ in range(20):
        (base / "quiet" / "new").unlink(missing_ok=True)
        then = marks.take(plan)
        (base / "quiet" / "new").write_text("x")
        now = marks.take(plan)
        told = marks.difference(then, now), marks.difference(then, now, skip=marks.rules_only(plan))
        if told == (f"{quiet} has a new entry (new)", None):
            break
        time.sleep(0.1)
    assert told == (f"{quiet} has a new entry (new)", None)
    masked = dataclasses.replace(plan, mounts=(*plan.mounts, MountOp(MountKind.MASK, quiet)))
    guarded = dataclasses.replace(plan, guarded=(*plan.guarded, quiet))
    for other in (masked, guarded):
        assert quiet not in marks.rules_only(other)
        assert marks.difference(then, now, skip=marks.rules_only(other)) is not None


def test_names_looked_up_once_per_call_resolve_each_path_as_looked_up_alone(tmp_path: Path) -> None:
    """``lookups`` looks each name up once for all the plan's paths (they share most of
    theirs): every path resolves, and records its lookups, as it does alone, through
    absolute and relative links, ``..`` after a link, a link to a link, a dangling one,
    a loop, a file where a directory is asked, and (as a user) a directory it cannot
    search."""
    t = tmp_path
    (t / "a" / "b" / "c").mkdir(parents=True)
    (t / "a" / "b" / "f").write_text("x")
    (t / "abs").symlink_to(t / "a" / "b")
    (t / "a" / "rel").symlink_to("b/c")
    (t / "a" / "up").symlink_to("../a/b/../b")
    (t / "twice").symlink_to("abs")
    (t / "dangling").symlink_to(t / "nowhere")
    (t / "loop1").symlink_to("loop2")
    (t / "loop2").symlink_to("loop1")
    (t / "shut").mkdir()
    (t / "shut" / "in").mkdir()
    (t / "shut").chmod(0)
    paths = [
        f"{t}/a/b/c",
        f"{t}/abs/c",
        f"{t}/abs/../b/c",
        f"{t}/a/rel",
        f"{t}/a/rel/../f",
        f"{t}/a/up/c",
        f"{t}/twice/f",
        f"{t}/twice/f/deeper",
        f"{t}/dangling/x",
        f"{t}/loop1/x",
        f"{t}/a/./b/c/",
        f"{t}/shut/in",
        f"{t}/a/missing/x",
    ]
    try:
        alone = []
        for path in paths:
            out: markwatch.Lookups = {}
            alone.append((markwatch._chain(path, out), out))
        seen: dict[str, object] = {}
        together: markwatch.Lookups = {}
        results = [markwatch._chain(path, together, seen) for path in [*paths, *reversed(paths)]]  # type: ignore[arg-type]
    finally:
        (t / "shut").chmod(0o755)
    assert results[: len(paths)] == [r for r, _ in alone] == list(reversed(results[len(paths) :]))
    merged: markwatch.Lookups = {}
    for _, out in alone:
        for directory, names in out.items():
            merged.setdefault(directory, set()).update(names)
    assert together == merged
    # the cases are what they are meant to be
    assert [r for r, _ in alone][:4] == [f"{t}/a/b/c"] * 4
    assert alone[8][0] is None and alone[9][0] is False and alone[7][0] is None
    assert alone[11][0] == (f"{t}/shut/in" if os.getuid() == 0 else False)  # root searches it
    assert len(seen) < sum(len(names) for _, out in alone for names in out.values())
