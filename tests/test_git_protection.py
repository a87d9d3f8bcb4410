"""Host git never runs what a sandbox wrote, by construction: the sandbox's git
directory is its own at the top level (config, hooks, HEAD, index, anything planted
there), the host's data directories are shared, the supervisor syncs back only data
and naming keys through descriptors, and repositories made inside are adopted when
the sandbox ends. Each attack is judged on the host, beside git working inside."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conftest import (
    GIT_ENV,
    WARREN,
    Layout,
    comm,
    host_git,
    host_marker,
    large_tree,
    run_cli,
    supervisor_watches,
)


@pytest.fixture(autouse=True, params=["run", "exec"])
def via(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(Layout, "via", request.param)
    return str(request.param)


@pytest.fixture
def repo(layout: Layout, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    (layout.root / "githome").mkdir()
    (layout.workspace.parent / "githome").mkdir(exist_ok=True)
    ws = layout.workspace
    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "first"]):
        assert host_git(ws, *args).returncode == 0
    return ws


def marker_path() -> Path:
    return host_marker()


def evil_script(marker: Path) -> str:
    return f"#!/bin/sh\ntouch {marker}\nexit 0\n"


@pytest.fixture
def live(layout: Layout, repo: Path, via: str) -> Iterator[str | None]:
    """A long-lived sandbox of the repository (exec), or None (run)."""
    if via == "run":
        yield None
        return
    name = f"git{os.getpid()}{uuid.uuid4().hex[:6]}"
    made = run_cli(["create", "--write", str(layout.cache), name], cwd=repo)
    assert made.returncode == 0, made.stderr
    try:
        yield name
    finally:
        run_cli(["rm", "-f", name], cwd=repo)


IDENTITY = "export GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@x GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@x\n"


def inside(layout: Layout, live: str | None, script: str) -> subprocess.CompletedProcess[str]:
    script = IDENTITY + script
    if live is None:
        return run_cli(["run", "--write", str(layout.cache), "--", "sh", "-c", script], cwd=layout.workspace)
    return run_cli(["exec", live, "sh", "-c", script], cwd=layout.workspace)


def background(layout: Layout, live: str | None, script: str) -> subprocess.Popen[str]:
    script = IDENTITY + script
    if live is None:
        argv = [*WARREN, "run", "--write", str(layout.cache), "--", "sh", "-c", script]
    else:
        argv = [*WARREN, "exec", live, "sh", "-c", script]
    return subprocess.Popen(
        argv, cwd=layout.workspace, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


# --- the supervisor's writes never follow what the sandbox planted -----------------------------


def test_links_planted_in_the_git_directory_never_redirect_a_host_write(
    layout: Layout, repo: Path, live: str | None
) -> None:
    victim = layout.outside
    head_before = (repo / ".git" / "HEAD").read_bytes()
    script = f"""
set -e
for n in $(seq 1 300); do ln -sf {victim} .git/config.warren-$n; done
git config user.name '$(touch {marker_path()})'
rm -f .git/HEAD .git/index && ln -s {victim} .git/HEAD && ln -s {victim} .git/index
cp .git/config cfg && rm .git/config && ln -s {victim} .git/config
sleep 1.5
rm .git/config .git/HEAD && cp cfg .git/config && echo 'ref: refs/heads/main' > .git/HEAD
"""
    r = inside(layout, live, script)
    assert r.returncode == 0, r.stderr
    # The control's key is set by a command of its own: while .git/config was gone or a
    # link the supervisor put the host's back, and a write racing that put is lost (in
    # the sandbox's own view; nothing reaches the host either way).
    r = inside(layout, live, "git config user.email planted@example.com")
    assert r.returncode == 0, r.stderr
    if live is not None:
        time.sleep(1.2)  # the supervisor syncs a live sandbox twice a second
    assert victim.read_text() == "keep me\n", "a host file was written through a planted link"
    assert (repo / ".git" / "HEAD").read_bytes() == head_before
    assert not (repo / ".git" / "HEAD").is_symlink() and not (repo / ".git" / "config").is_symlink()
    assert not list((repo / ".git").glob("config.warren-*"))
    # The control: a plain change of a naming key does reach the host, so the sync ran.
    deadline = time.monotonic() + 10
    while host_git(repo, "config", "user.email").stdout.strip() != "planted@example.com":
        assert time.monotonic() < deadline, "the sandbox's user.email never reached the host"
        time.sleep(0.1)
    assert host_git(repo, "status").returncode == 0


def test_commondir_replanted_in_a_loop_never_reaches_host_git(
    layout: Layout, repo: Path, live: str | None
) -> None:
    marker = marker_path()
    script = f"""
set -e
cp -r .git/. planted
printf '{evil_script(marker)}' > planted/fsmon && chmod +x planted/fsmon
git config --file planted/config core.fsmonitor "$PWD/planted/fsmon"
echo ready > ready
end=$(( $(date +%s) + 4 ))
while [ $(date +%s) -lt $end ]; do
  echo "$PWD/planted" > .git/commondir.tmp && mv .git/commondir.tmp .git/commondir
  printf '[core]\\n\\tfsmonitor = %s\\n' "$PWD/planted/fsmon" > .git/config.worktree
done
"""
    proc = background(layout, live, script)
    try:
        deadline = time.monotonic() + 30
        while not (repo / "ready").exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        for _ in range(25):  # the user's plain git on the host, while the plant is re-made
            host_git(repo, "status")
            host_git(repo, "-c", "extensions.worktreeConfig=true", "status")
    finally:
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert not marker.exists(), "host git ran the sandbox's core.fsmonitor"
    assert not (repo / ".git" / "commondir").exists() and not (repo / ".git" / "config.worktree").exists()
    # The control: the plant itself works when host git is pointed at it.
    host_git(repo, "-c", f"core.fsmonitor={repo}/planted/fsmon", "status")
    assert marker.exists(), "the planted fsmonitor does not run even when named: the test proves nothing"


# --- repositories made inside ----------------------------------------------------------------------


NESTED = """
set -e
printf '{evil}' > evil.sh && chmod +x evil.sh
git init -q -b main sub
git -C sub commit -q --allow-empty -m s
git -C sub config core.fsmonitor "$PWD/evil.sh"
cp evil.sh sub/.git/hooks/post-checkout
git add sub evil.sh && git commit -q -m 'add sub'
"""


@pytest.fixture(params=["walked", "watched"])
def tree(request: pytest.FixtureRequest, layout: Layout, repo: Path) -> str:
    """The workspace as it is ("walked": few directories, each walked at every launch),
    or with enough directories that the supervisor watches them instead, made so by two
    runs before the test (``server.repowatch``)."""
    if request.param == "watched":
        large_tree(repo)
        for _ in range(2):
            assert inside(layout, None, "true").returncode == 0
        assert supervisor_watches() >= 300
    return str(request.param)


def test_a_nested_repository_made_inside_never_runs_on_the_host(
    layout: Layout, repo: Path, tree: str, live: str | None
) -> None:
    marker = marker_path()
    r = inside(layout, live, NESTED.format(evil=evil_script(marker)))
    assert r.returncode == 0, r.stderr
    if live is not None:
        # While the sandbox lives the host's index does not name the new submodule.
        time.sleep(1.2)
        host_git(repo, "status")
        assert not marker.exists(), "host git status recursed into a repository the sandbox made"
        assert "sub" not in host_git(repo, "ls-files", "-s").stdout.split()
        run_cli(["rm", "-f", live], cwd=repo)
    # Ended: adopted. Its config on the host holds no program; the index may name it now.
    for args in (["status"], ["-C", "sub", "status"], ["-C", "sub", "checkout", "-q", "-b", "x"]):
        host_git(repo, *args)
    assert not marker.exists(), "host git ran what the sandbox wrote into a repository it made"
    assert host_git(repo, "-C", "sub", "config", "core.fsmonitor").returncode == 1
    assert not (repo / "sub" / ".git" / "hooks" / "post-checkout").exists()
    assert "sub" in host_git(repo, "ls-files").stdout.split()
    # Inside, the repository keeps what the sandbox set.
    later = layout.run(["sh", "-c", "git -C sub config core.fsmonitor; git -C sub log -1 --format=%s"])
    assert later.returncode == 0, later.stderr
    assert later.stdout.split() == [f"{repo}/evil.sh", "s"]


def test_a_repository_made_inside_stays_unnamed_while_another_sandbox_of_the_workspace_starts(
    layout: Layout, repo: Path, live: str | None
) -> None:
    """A second sandbox launched on the workspace while the one that made a repository
    lives finds that repository and gets warren's store of it; the maker still writes
    the host's copy directly. The host's index must go on leaving it out: it named it
    once the second launch had made its store (a sandbox booted ahead did so within a
    second in the gate, one run in seven), and host git then ran the fsmonitor the
    sandbox had set."""
    if live is None:
        pytest.skip("needs the maker alive while the other sandbox starts: a long-lived one (exec)")
    marker = marker_path()
    r = inside(layout, live, NESTED.format(evil=evil_script(marker)))
    assert r.returncode == 0, r.stderr
    other = f"other{os.getpid()}{uuid.uuid4().hex[:6]}"
    made = run_cli(["create", "--write", str(layout.cache), other], cwd=repo)
    assert made.returncode == 0, made.stderr
    try:
        assert run_cli(["exec", other, "true"], cwd=repo).returncode == 0
        assert run_cli(["exec", live, "true"], cwd=repo).returncode == 0  # a sync after it
        time.sleep(1.2)  # the supervisor's rounds
        host_git(repo, "status")
        assert not marker.exists(), "host git status recursed into a repository the sandbox made"
        assert "sub" not in host_git(repo, "ls-files", "-s").stdout.split()
    finally:
        run_cli(["rm", "-f", other], cwd=repo)


def test_a_repository_a_removed_sandbox_made_is_adopted_though_one_booted_ahead_holds_the_workspace(
    layout: Layout, repo: Path, via: str
) -> None:
    """Two runs leave a sandbox booted ahead for the next, holding a lease on the
    workspace; a long-lived sandbox then makes a repository and is removed. Adoption
    waits for sandboxes that can still write the workspace, but an unused booted one
    writes nothing (whoever takes it plans again, and finds the repository): the
    repository is adopted at the removal, and host git runs nothing of it."""
    if via == "exec":
        pytest.skip("one case: the test makes its own runs, then its own long-lived sandbox")
    for _ in range(2):
        assert inside(layout, None, "true").returncode == 0
    marker = marker_path()
    name = f"git{os.getpid()}{uuid.uuid4().hex[:6]}"
    made = run_cli(["create", "--write", str(layout.cache), name], cwd=repo)
    assert made.returncode == 0, made.stderr
    try:
        r = inside(layout, name, NESTED.format(evil=evil_script(marker)))
        assert r.returncode == 0, r.stderr
    finally:
        assert run_cli(["rm", "-f", name], cwd=repo).returncode == 0
    host_git(repo, "-C", "sub", "status")
    assert host_git(repo, "-C", "sub", "config", "core.fsmonitor").returncode == 1
    assert not marker.exists(), "host git ran what the removed sandbox wrote"
    # The booted sandbox is not used for a plan it was not made for: the next run works.
    assert inside(layout, None, "git -C sub log -1 --format=%s").stdout == "s\n"


HIDDEN = """
import os, subprocess
st = os.stat("sub")
subprocess.run(["git", "init", "-q", "-b", "main", "sub"], check=True)
subprocess.run(["git", "-C", "sub", "commit", "-q", "--allow-empty", "-m", "s"], check=True)
os.utime("sub", ns=(st.st_atime_ns, st.st_mtime_ns))
print("set back" if os.stat("sub").st_mtime_ns == st.st_mtime_ns else "moved")
"""


def test_a_repository_made_with_its_directory_s_mtime_set_back_is_protected_in_the_next_sandbox(
    layout: Layout, repo: Path, tree: str, via: str
) -> None:
    """The launch's repository walk remembers each directory; a sandbox makes a
    repository in a remembered one and sets the directory's mtime back (utimensat), so
    that a memory keyed on the mtime answers "nothing for git here" at the next launch.
    That next sandbox must still get warren's tree over the adopted repository's
    ``.git``: judged on the host while it lives, its config never holds what it wrote."""
    if via == "exec":
        pytest.skip("one case: the test makes its own run, then its own long-lived sandbox")
    (repo / "sub").mkdir()
    time.sleep(0.1)  # settled: the walk remembers it
    assert inside(layout, None, "true").returncode == 0
    r = inside(layout, None, f"python3 -c '{HIDDEN}'")
    assert r.returncode == 0 and r.stdout == "set back\n", (r.stdout, r.stderr)
    assert (repo / "sub" / ".git").is_dir()  # adopted at the run's end
    name = f"git{os.getpid()}{uuid.uuid4().hex[:6]}"
    made = run_cli(["create", "--write", str(layout.cache), name], cwd=repo)
    assert made.returncode == 0, made.stderr
    try:
        w = inside(
            layout, name, "git -C sub config core.fsmonitor /planted && git -C sub config core.fsmonitor"
        )
        assert w.returncode == 0 and w.stdout == "/planted\n", (w.stdout, w.stderr)
        time.sleep(1.2)  # the supervisor syncs a live sandbox twice a second
        assert host_git(repo, "-C", "sub", "config", "core.fsmonitor").returncode == 1
    finally:
        run_cli(["rm", "-f", name], cwd=repo)
    # Control: the detector reads what the host's config holds.
    assert host_git(repo, "-C", "sub", "config", "core.fsmonitor", "/set-on-host").returncode == 0
    assert host_git(repo, "-C", "sub", "config", "core.fsmonitor").stdout.strip() == "/set-on-host"


def test_a_sandbox_of_a_repository_with_a_nested_one_serves_every_exec(
    layout: Layout, repo: Path, via: str, state_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each repository adds a descriptor to a request handed into the sandbox (its
    watch); with a nested repository made by an earlier run, an exec carried more than
    the eight descriptors a frame took, and PID 1 took that for a broken supervisor and
    exited (the sandbox dead, "connection lost"). The exec stub off, so every request
    carries its stdio through PID 1 or the spare."""
    if via == "exec":
        pytest.skip("one case: the test makes its own run, then its own long-lived sandbox")
    monkeypatch.setenv("WARREN_EXEC_STUB", "0")
    r = inside(layout, None, "git init -q -b main sub && git -C sub commit -q --allow-empty -m s")
    assert r.returncode == 0, r.stderr
    name = f"git{os.getpid()}{uuid.uuid4().hex[:6]}"
    made = run_cli(["create", "--write", str(layout.cache), name], cwd=repo)
    assert made.returncode == 0, made.stderr
    try:
        for i in range(4):
            e = run_cli(["exec", name, "sh", "-c", f"cat; echo {i}"], cwd=repo, stdin="in ")
            assert e.returncode == 0 and e.stdout == f"in {i}\n", (e.stdout, e.stderr)
        assert "sub" in inside(layout, name, "git -C sub rev-parse --show-toplevel").stdout
    finally:
        run_cli(["rm", "-f", name], cwd=repo)


def test_the_nested_repository_attack_works_without_warren(tmp_path: Path) -> None:
    """The control for the test above: the same repository made on the host runs the
    fsmonitor from the outer repository's plain ``git status``."""
    marker = marker_path()
    ws = tmp_path / "plain"
    ws.mkdir()
    (tmp_path / "githome").mkdir()
    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "first"]):
        assert host_git(ws, *args).returncode == 0
    env = {**os.environ, **GIT_ENV, "HOME": str(tmp_path / "githome")}
    r = subprocess.run(
        ["sh", "-c", NESTED.format(evil=evil_script(marker))], cwd=ws, env=env, capture_output=True
    )
    assert r.returncode == 0, r.stderr
    host_git(ws, "status")
    assert marker.exists()
    marker.unlink()


def test_a_bare_repository_shaped_directory_made_inside_is_adopted(
    layout: Layout, repo: Path, live: str | None
) -> None:
    marker = marker_path()
    script = f"""
set -e
git init -q --bare shaped
git -C shaped config core.sshCommand 'touch {marker}'
git -C shaped config alias.x '!touch {marker}'
printf '{evil_script(marker)}' > shaped/hooks/reference-transaction
chmod +x shaped/hooks/reference-transaction
"""
    r = inside(layout, live, script)
    assert r.returncode == 0, r.stderr
    if live is not None:
        run_cli(["rm", "-f", live], cwd=repo)
    shaped = repo / "shaped"
    assert host_git(shaped, "config", "core.sshCommand").returncode == 1
    assert host_git(shaped, "config", "alias.x").returncode == 1
    host_git(shaped, "update-ref", "refs/heads/t", host_git(repo, "rev-parse", "HEAD").stdout.strip())
    assert not marker.exists()


def test_a_git_file_workspace_keeps_its_git_file(layout: Layout, repo: Path, via: str) -> None:
    """A linked worktree as the workspace: its ``.git`` file names the git directory
    host git uses there, and stays as it is."""
    if via == "exec":
        pytest.skip("the .git file is planned the same way for both")
    wt = layout.root / "wt"
    assert host_git(repo, "worktree", "add", "-q", str(wt)).returncode == 0
    (wt / "githome").mkdir(exist_ok=True)
    before = (wt / ".git").read_text()
    for attempt in ("printf 'gitdir: /tmp/evil\\n' > .git", "rm -f .git", "mv .git moved"):
        r = run_cli(["run", "--", "sh", "-c", f"{attempt}; echo rc=$?"], cwd=wt)
        assert r.returncode == 0 and "rc=0" not in r.stdout, r.stdout + r.stderr
    assert (wt / ".git").read_text() == before


# --- git inside keeps working, in step with the host ----------------------------------------------


def test_git_inside_and_on_the_host_stay_in_step(layout: Layout, repo: Path, live: str | None) -> None:
    r = inside(
        layout, live, "set -e; echo a > a; git add a; git -c user.name=I -c user.email=i@x commit -qm inside"
    )
    assert r.returncode == 0, r.stderr
    # The host sees the commit and its index as soon as the command returned (a one-shot
    # run, and an exec in a live sandbox alike: its end is told after a sync round).
    assert host_git(repo, "log", "-1", "--format=%s").stdout.strip() == "inside"
    assert host_git(repo, "status", "--porcelain").stdout == ""
    assert host_git(repo, "commit", "-q", "--allow-empty", "-m", "host").returncode == 0
    seen = ""
    for _ in range(40):  # a live sandbox hears of the host's commit within a sync round
        seen = inside(layout, live, "git log -1 --format=%s").stdout.strip()
        if seen == "host":
            break
        time.sleep(0.1)
    assert seen == "host"
    script = """
set -e
git -c user.name=I -c user.email=i@x commit -qm gone --allow-empty
git reset -q --hard HEAD~1
git reflog expire --expire=now --all
git gc -q --prune=now
git worktree add -q -b feature wt2
git fsck --no-progress
git count-objects -v | grep -E '^(count|size-garbage)'
"""
    r = inside(layout, live, script)
    assert r.returncode == 0, r.stderr
    assert "size-garbage: 0" in r.stdout
    assert host_git(repo, "fsck", "--no-progress").returncode == 0
    assert "feature" in host_git(repo, "branch", "--list").stdout


def test_the_repository_holds_only_what_the_same_commands_make_on_the_host(
    layout: Layout, repo: Path, live: str | None, tmp_path: Path
) -> None:
    """warren's protection made ``.git/modules`` (and ``logs`` in a repository without
    commits) on the host and left them there; the same commands on the host make none.
    Judged against a twin repository the same commands ran in on the host."""
    twin = tmp_path / "twin"
    twin.mkdir()
    (tmp_path / "githome").mkdir(exist_ok=True)
    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "first"]):
        assert host_git(twin, *args).returncode == 0
    script = "set -e; git status --porcelain; echo x > f; git add f; git commit -qm f"
    r = inside(layout, live, script)
    assert r.returncode == 0, r.stderr
    on_host = subprocess.run(["sh", "-c", IDENTITY + script], cwd=twin, env={**os.environ, **GIT_ENV})
    assert on_host.returncode == 0
    if live is not None:
        assert run_cli(["rm", "-f", live], cwd=repo).returncode == 0
    assert sorted(os.listdir(repo / ".git")) == sorted(os.listdir(twin / ".git"))
    assert not (repo / ".git" / "modules").exists()


def test_a_worktree_made_inside_works_on_the_host_and_its_metadata_stays_data(
    layout: Layout, repo: Path, live: str | None
) -> None:
    """``git worktree add`` inside: host git sees the worktree (``status``, ``log``,
    ``worktree list``) and its commits; what the sandbox plants in the worktree's git
    directory that host git would run (``config.worktree`` with the host's
    extensions.worktreeConfig on, a ``commondir`` elsewhere) never reaches the host.
    ``git worktree remove`` inside removes it on the host too."""
    marker = marker_path()
    assert host_git(repo, "config", "extensions.worktreeConfig", "true").returncode == 0
    script = f"""
set -e
git worktree add -q -b task wt
echo t > wt/t && git -C wt add t && git -C wt commit -qm in-worktree
printf '[core]\\n\\tfsmonitor = touch {marker}; false\\n' > .git/worktrees/wt/config.worktree
echo /elsewhere > .git/worktrees/wt/commondir
"""
    r = inside(layout, live, script)
    assert r.returncode == 0, r.stderr
    if live is not None:
        time.sleep(1.2)  # a sync round after the plants
    wt = repo / "wt"
    status = host_git(wt, "status", "--porcelain")
    assert status.returncode == 0 and status.stdout == "", status.stderr
    assert host_git(wt, "log", "-1", "--format=%s").stdout.strip() == "in-worktree"
    assert host_git(wt, "rev-parse", "--abbrev-ref", "HEAD").stdout.strip() == "task"
    listed = host_git(repo, "worktree", "list", "--porcelain").stdout
    assert f"worktree {wt}" in listed and "branch refs/heads/task" in listed
    assert not (repo / ".git" / "worktrees" / "wt" / "config.worktree").exists()
    assert (repo / ".git" / "worktrees" / "wt" / "commondir").read_text() == "../..\n"
    assert not marker.exists(), "host git ran the worktree config the sandbox wrote"
    # The host commits in it; the sandbox sees that, then removes the worktree.
    (wt / "h").write_text("h\n")
    assert host_git(wt, "add", "h").returncode == 0
    assert host_git(wt, "commit", "-qm", "on-host").returncode == 0
    seen = ""
    for _ in range(40):
        seen = inside(layout, live, "echo ../.. > .git/worktrees/wt/commondir; git -C wt log -1 --format=%s")
        seen = seen.stdout.strip()
        if seen == "on-host":
            break
        time.sleep(0.1)
    assert seen == "on-host"
    if live is None:
        return  # a later sandbox's remove: test_a_worktree_the_host_made_...
    r = inside(layout, live, "git worktree remove --force wt && git worktree list")
    assert r.returncode == 0, r.stderr
    time.sleep(1.2)  # a sync round
    assert f"worktree {wt}\n" not in host_git(repo, "worktree", "list", "--porcelain").stdout
    assert not (repo / ".git" / "worktrees" / "wt").exists()
    assert host_git(repo, "log", "-1", "--format=%s", "task").stdout.strip() == "on-host"


def wait_for(condition: Callable[[], bool], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@contextlib.contextmanager
def later_sandbox(layout: Layout, repo: Path, via: str) -> Iterator[str | None]:
    """A sandbox started now, after the host's setup (``live`` starts one before it)."""
    if via == "run":
        yield None
        return
    name = f"gitl{os.getpid()}{uuid.uuid4().hex[:6]}"
    made = run_cli(["create", "--write", str(layout.cache), name], cwd=repo)
    assert made.returncode == 0, made.stderr
    try:
        yield name
    finally:
        run_cli(["rm", "-f", name], cwd=repo)


def test_a_worktree_the_host_made_works_in_a_later_sandbox_and_is_removed_there(
    layout: Layout, repo: Path, via: str
) -> None:
    """A sandbox started after the host made a worktree: git works in it inside (its
    entry lacked ``commondir`` in warren's tree: "not a git repository"), and ``git
    worktree remove`` there exits 0 and removes it on the host as on the host: the
    checkout, the ``.git`` file (once a mount point inside, which git reported busy) and
    the entry."""
    wt = repo / "wt"
    assert host_git(repo, "worktree", "add", "-q", "-b", "task", "wt").returncode == 0
    (wt / "w").write_text("w\n")
    with later_sandbox(layout, repo, via) as live:
        r = inside(layout, live, "git -C wt add w && git -C wt commit -qm inside && echo committed")
        assert "committed" in r.stdout, r.stdout + r.stderr

        # (each wait is for what the exec's end brings the host at once; the long limit
        # is for a loaded machine, and every failure says what the host had instead)
        def logged() -> subprocess.CompletedProcess[str]:
            return host_git(wt, "log", "-1", "--format=%s")

        assert wait_for(lambda: logged().stdout.strip() == "inside", 20), logged()
        # (without optional locks: a host status rewriting the index just before the
        # remove is a change on both sides, which the host wins)
        status = host_git(wt, "--no-optional-locks", "status", "--porcelain")
        assert status.stdout == "", status
        r = inside(layout, live, "git worktree remove --force wt && git worktree list --porcelain")
        assert r.returncode == 0, r
        assert f"worktree {wt}\n" not in r.stdout, r.stdout
        assert wait_for(lambda: not wt.exists(), 20), sorted(os.listdir(wt))
        entry = repo / ".git" / "worktrees" / "wt"
        assert wait_for(lambda: not entry.exists(), 20), sorted(os.listdir(entry))
        listed = host_git(repo, "worktree", "list", "--porcelain").stdout
        assert f"worktree {wt}\n" not in listed, listed
        assert host_git(repo, "log", "-1", "--format=%s", "task").stdout.strip() == "inside"
        if live is not None:
            r = inside(
                layout, live, "test ! -e wt && git worktree add -q wt2 task && git -C wt2 log -1 --format=%s"
            )
            assert r.returncode == 0 and r.stdout.strip() == "inside", r


def test_a_worktree_the_host_made_is_deleted_and_pruned_in_a_later_sandbox(
    layout: Layout, repo: Path, via: str
) -> None:
    """``rm -rf wt && git worktree prune`` inside, for a worktree the host made before the
    sandbox: both exit 0, and the host lists it no more."""
    wt = repo / "wt"
    assert host_git(repo, "worktree", "add", "-q", "-b", "task", "wt").returncode == 0
    with later_sandbox(layout, repo, via) as live:
        r = inside(layout, live, "rm -rf wt && git worktree prune && git worktree list --porcelain")
        assert r.returncode == 0, r.stderr
        assert f"worktree {wt}\n" not in r.stdout
        assert not wt.exists()
        assert wait_for(lambda: not (repo / ".git" / "worktrees" / "wt").exists())
    listed = host_git(repo, "worktree", "list", "--porcelain").stdout
    assert "prunable" not in listed and f"worktree {wt}\n" not in listed


def test_git_rm_of_a_submodule_the_host_added_works_in_a_later_sandbox(
    layout: Layout, repo: Path, via: str
) -> None:
    lib = layout.root / "lib"
    lib.mkdir()
    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "lib"]):
        assert host_git(lib, *args).returncode == 0
    added = host_git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "sub")
    assert added.returncode == 0, added.stderr
    assert host_git(repo, "commit", "-qm", "add sub").returncode == 0
    with later_sandbox(layout, repo, via) as live:
        r = inside(layout, live, "git rm -q sub && git status --porcelain")
        assert r.returncode == 0, r.stderr
        assert sorted(r.stdout.splitlines()) == ["D  sub", "M  .gitmodules"]
        assert not (repo / "sub").exists()
        assert wait_for(
            lambda: (
                sorted(host_git(repo, "status", "--porcelain").stdout.splitlines())
                == ["D  sub", "M  .gitmodules"]
            )
        )


NESTED_GIT_FILE = """
set -e
printf '{evil}' > evil.sh && chmod +x evil.sh
mkdir -p evil/objects evil/refs
printf 'ref: refs/heads/main\\n' > evil/HEAD
printf '[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = %s\\n' "$PWD/evil.sh" > evil/config
{replace}
printf 'gitdir: %s\\n' "$PWD/evil" > wt/.git
"""
REPLACED = {"in place": "true", "renamed": "mv wt wt.old && mkdir wt"}


@pytest.mark.parametrize("how", sorted(REPLACED))
def test_a_worktrees_git_file_the_sandbox_rewrote_runs_nothing_on_the_host(
    layout: Layout, repo: Path, via: str, how: str
) -> None:
    """A ``.git`` file below the top of a writable root can be replaced inside (its
    directory renamed and made again: a mount point on the file never stopped that), so
    it is the sandbox's as a repository made inside is: once the sandbox ended, the git
    directory it names is adopted, and host git there runs nothing the sandbox wrote."""
    marker = marker_path()
    assert host_git(repo, "worktree", "add", "-q", "-b", "task", "wt").returncode == 0
    with later_sandbox(layout, repo, via) as live:
        script = NESTED_GIT_FILE.format(evil=evil_script(marker), replace=REPLACED[how])
        r = inside(layout, live, script)
        assert r.returncode == 0, r.stderr
    for args in (["status"], ["log", "-1"]):
        host_git(repo / "wt", *args)
    assert not marker.exists(), "host git ran what the sandbox wrote through a .git file it rewrote"
    assert host_git(repo / "evil", "config", "core.fsmonitor").returncode == 1


def test_the_git_file_rewrite_attack_works_without_warren(tmp_path: Path) -> None:
    """The control for the test above: the same rewrite on the host runs the fsmonitor
    from a plain ``git status`` in the worktree."""
    marker = marker_path()
    ws = tmp_path / "plain"
    ws.mkdir()
    (tmp_path / "githome").mkdir()
    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "first"]):
        assert host_git(ws, *args).returncode == 0
    assert host_git(ws, "worktree", "add", "-q", "-b", "task", "wt").returncode == 0
    script = NESTED_GIT_FILE.format(evil=evil_script(marker), replace="true")
    env = {**os.environ, **GIT_ENV, "HOME": str(tmp_path / "githome")}
    assert subprocess.run(["sh", "-c", script], cwd=ws, env=env, capture_output=True).returncode == 0
    host_git(ws / "wt", "status")
    assert marker.exists()
    marker.unlink()


def test_git_worktree_prune_in_a_later_sandbox_prunes_on_the_host(
    layout: Layout, repo: Path, via: str
) -> None:
    """A worktree whose checkout the host deleted: ``git worktree prune`` inside drops
    its entry on the host too (before, host git lists it as prunable: the control)."""
    wt = repo / "wt"
    assert host_git(repo, "worktree", "add", "-q", "-b", "task", "wt").returncode == 0
    subprocess.run(["rm", "-rf", str(wt)], check=True)
    assert "prunable" in host_git(repo, "worktree", "list", "--porcelain").stdout
    with later_sandbox(layout, repo, via) as live:
        r = inside(layout, live, "git worktree prune && git worktree list --porcelain")
        assert r.returncode == 0 and "prunable" not in r.stdout, r.stdout + r.stderr
        assert wait_for(lambda: not (repo / ".git" / "worktrees" / "wt").exists())
    listed = host_git(repo, "worktree", "list", "--porcelain").stdout
    assert "prunable" not in listed and f"worktree {wt}\n" not in listed


def test_a_submodule_added_inside_works_and_is_adopted(layout: Layout, repo: Path, live: str | None) -> None:
    marker = marker_path()
    script = f"""
set -e
git init -q -b main subsrc && git -C subsrc commit -q --allow-empty -m src
git -c protocol.file.allow=always submodule -q add ./subsrc mod
git commit -q -m 'add mod'
git -C mod config core.fsmonitor 'touch {marker}; false'
git submodule status
"""
    r = inside(layout, live, script)
    assert r.returncode == 0, r.stderr
    assert " mod " in r.stdout
    if live is not None:
        time.sleep(1.2)
        host_git(repo, "status")
        assert not marker.exists(), "host git status recursed into a submodule the sandbox made"
        run_cli(["rm", "-f", live], cwd=repo)
    host_git(repo, "status")
    host_git(repo, "submodule", "status")
    assert not marker.exists()
    assert host_git(repo, "log", "-1", "--format=%s").stdout.strip() == "add mod"
    assert host_git(repo / "mod", "log", "-1", "--format=%s").stdout.strip() == "src"


def test_submodule_add_and_update_inside_round_trip_with_host_git(
    layout: Layout, repo: Path, live: str | None
) -> None:
    """``git submodule add`` inside, a new commit upstream, ``git submodule update
    --remote`` inside: once the sandbox has ended (a live one holds the superproject's
    index back while the submodule's git directory is its own) host git sees it all
    (``submodule status``, a clean ``status``, the commits); the host moves the
    submodule's checkout back and a later sandbox's ``git submodule update`` restores it."""
    upstream = layout.root / "upstream"
    upstream.mkdir()
    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "one"]):
        assert host_git(upstream, *args).returncode == 0
    file_ok = "git -c protocol.file.allow=always"
    r = inside(layout, live, f"set -e; {file_ok} submodule -q add {upstream} mod; git commit -qm 'add mod'")
    assert r.returncode == 0, r.stderr
    assert host_git(upstream, "commit", "-q", "--allow-empty", "-m", "two").returncode == 0
    two = host_git(upstream, "rev-parse", "HEAD").stdout.strip()
    r = inside(layout, live, f"set -e; {file_ok} submodule -q update --remote mod; git commit -qam bump")
    assert r.returncode == 0, r.stderr
    if live is not None:
        assert run_cli(["rm", "-f", live], cwd=repo).returncode == 0
    assert host_git(repo, "log", "-2", "--format=%s").stdout.split("\n")[:2] == ["bump", "add mod"]
    assert host_git(repo, "submodule", "status").stdout.split()[:2] == [two, "mod"]
    assert host_git(repo, "status", "--porcelain").stdout == ""
    assert host_git(repo / "mod", "checkout", "-q", "HEAD~1").returncode == 0
    assert host_git(repo, "status", "--porcelain").stdout.strip() == "M mod"  # the control
    r = run_cli(["run", "--", "sh", "-c", "git submodule -q update && git -C mod rev-parse HEAD"], cwd=repo)
    assert r.returncode == 0 and r.stdout.strip() == two, r.stderr
    assert host_git(repo, "status", "--porcelain").stdout == ""


def _inits() -> set[int]:
    """The PID 1s (``warren-init``) of the module's supervisor's sandboxes."""
    from warren import statedir
    from warren._core.procs import descendants

    found = statedir.read_address(statedir.location(os.environ))
    return set() if found is None else {pid for pid in descendants(found[1]) if comm(pid) == "warren-init"}


def _until_booted_ahead(timeout: float = 20) -> None:
    """Until the sandbox booted for the next run has its PID 1: one there half a second
    after the run before it ended (whose own has gone by then). Half a second alone was
    not always enough under a gate's load: the next run then booted its own, after the
    commit, not before."""
    deadline = time.monotonic() + timeout
    time.sleep(0.5)
    while time.monotonic() < deadline:
        seen = _inits()
        if seen:
            time.sleep(0.3)
            if seen & _inits():
                return
        time.sleep(0.05)


def test_a_command_right_after_a_host_commit_sees_its_index(
    layout: Layout, repo: Path, live: str | None
) -> None:
    """The host commits a file, and a command inside starts at once: it sees the
    commit with its index (``git status`` shows only the files not committed yet, the
    file is tracked), not the new branch (shared at once) with the index from before it
    (copied by the sync, twice a second: the file then read as deleted from the index,
    and untracked). Of a live
    sandbox, and of one booted ahead (a run). Four rounds: one that came after a sync
    round by chance shows nothing."""
    ticks = os.sysconf("SC_CLK_TCK")
    for n in range(4):  # made first: a new entry in the workspace stops a sandbox booted ahead
        (repo / f"f{n}").write_text(str(n))
    for n in range(4):
        if live is None:
            for _ in range(1 if n else 2):  # (the second run of a kind is what boots the next)
                assert inside(layout, live, "true").returncode == 0
            _until_booted_ahead()  # the next run's sandbox
        committed = float(Path("/proc/uptime").read_text().split()[0])
        assert host_git(repo, "add", f"f{n}").returncode == 0
        assert host_git(repo, "commit", "-qm", f"c{n}").returncode == 0
        r = inside(layout, live, "cat /proc/1/stat; git status --porcelain; echo --; git ls-files")
        assert r.returncode == 0, r.stderr
        pid1, _, rest = r.stdout.partition("\n")
        started = int(pid1.rpartition(")")[2].split()[19]) / ticks  # since boot, as /proc/uptime
        assert started < committed, "the sandbox was started before the host's commit"
        status, _, files = rest.partition("--\n")
        untracked = [f"?? f{i}" for i in range(n + 1, 4)]
        assert status.splitlines() == untracked and files.split() == [f"f{i}" for i in range(n + 1)], (
            n,
            r.stdout,
        )


def test_a_sparse_checkout_made_inside_holds_on_the_host(
    layout: Layout, repo: Path, live: str | None
) -> None:
    """``git sparse-checkout set`` inside: the host's checkout is sparse as well (host
    ``sparse-checkout list``, the files outside absent, a clean ``status``); ``disable``
    inside brings them back on the host."""
    for d in ("a", "b"):
        (repo / d).mkdir()
        (repo / d / "f").write_text(d)
    assert host_git(repo, "add", "a", "b").returncode == 0
    assert host_git(repo, "commit", "-qm", "ab").returncode == 0
    if live is not None:
        # The host's commit is whole in the live sandbox before its next command: the
        # ref (shared) and the index (synced first). With the index from before it, a
        # sparse checkout knew no b/f to take away.
        got = inside(layout, live, "git log -1 --format=%s; git ls-files").stdout.split()
        assert got == ["ab", "a/f", "b/f"]
    r = inside(layout, live, "git sparse-checkout set a && ls")
    assert r.returncode == 0 and r.stdout.split() == ["a"], r.stdout + r.stderr
    assert not (repo / "b").exists() and (repo / "a" / "f").exists()
    assert wait_for(lambda: host_git(repo, "sparse-checkout", "list").stdout.split() == ["a"])
    assert host_git(repo, "--no-optional-locks", "status", "--porcelain").stdout == ""
    assert host_git(repo, "config", "core.sparseCheckout").stdout.strip() == "true"
    # extensions.worktreeConfig is on for host git now: what the sandbox sets in the
    # worktree's config that names a program stays inside, as in .git/config.
    marker = marker_path()
    r = inside(layout, live, f"git config --worktree core.fsmonitor 'touch {marker}; false' && git status -s")
    assert r.returncode == 0, r.stderr
    if live is not None:
        time.sleep(0.6)  # a sync round that could carry it (an absence: nothing to wait on)
    host_git(repo, "status")
    assert not marker.exists(), "host git ran the worktree config the sandbox wrote"
    fsmonitor = host_git(repo, "config", "--worktree", "core.fsmonitor").stdout.strip()
    assert fsmonitor == "" and (repo / ".git" / "config.worktree").exists()
    host_git(repo, "-c", f"core.fsmonitor=touch {marker}; false", "status")  # the control
    assert marker.exists()
    r = inside(layout, live, "git sparse-checkout disable && ls")
    assert r.returncode == 0 and r.stdout.split() == ["a", "b"], r.stdout + r.stderr
    assert wait_for(lambda: host_git(repo, "config", "core.sparseCheckout").stdout.strip() != "true")
    assert (repo / "b" / "f").read_text() == "b"
    assert host_git(repo, "--no-optional-locks", "status", "--porcelain").stdout == ""


def test_a_repository_made_in_a_subdirectory_workspace_is_adopted(
    layout: Layout, repo: Path, via: str
) -> None:
    """A workspace inside a repository: the sandbox makes WS/.git, which host git in WS
    would use; when the sandbox ends it holds no program any more."""
    if via == "exec":
        pytest.skip("adoption at the end is the same for both")
    marker = marker_path()
    ws = repo / "pkg"
    ws.mkdir()
    script = IDENTITY + f"git init -q . && git config core.fsmonitor 'touch {marker}; false' && git status -s"
    r = run_cli(["run", "--", "sh", "-c", script], cwd=ws)
    assert r.returncode == 0, r.stderr
    host_git(ws, "status")
    assert not marker.exists()
    assert host_git(ws, "config", "core.fsmonitor").returncode == 1
