"""The sandbox's TMPDIR and /tmp, and a workspace inside a larger git repository.

Pure decisions first (``plan.tmpdir``, the git hint, the plan's note), then the same
through ``warren run`` and long-lived sandboxes, judged on the host: what the
workspace holds while a command runs and after, where a rename from TMPDIR lands
compared with the host's own rename (measured here, never assumed), pip's uninstall,
the clean-up against a planted link, the sweep after a killed supervisor, ``/tmp``
writable in every shape, and git in a repository's subdirectory.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import RENAME_FROM_TMPDIR, make_wheel, module_state, run_cli
from warren.cli.hints import writes_repository
from warren.plan import CallerFacts, HostFacts
from warren.plan import make_plan as _make_plan
from warren.plan.facts import enclosing_repository, parse_mountinfo
from warren.plan.render import render
from warren.plan.tmpdir import Scratch, scratch_tmpdir
from warren.policy import PolicySpec, build
from warren.server import statedir


@pytest.fixture(scope="module")
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One private supervisor for the module's tests, as a user's serves all of theirs."""
    yield from module_state(tmp_path_factory)


ROOT_ONLY = "22 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
SHM_TMPFS = ROOT_ONLY + "30 22 0:50 / /dev/shm rw - tmpfs tmpfs rw\n"
HOME_MOUNT = ROOT_ONLY + "31 22 0:51 / /home rw - ext4 /dev/vdb rw\n"


def _facts(mountinfo: str = ROOT_ONLY, writable: set[str] | None = None, abi: int = 7) -> HostFacts:
    dirs = (
        writable
        if writable is not None
        else {"/home/u/proj", "/home/u/.cache", "/home/u", "/work", "/work/proj"}
    )
    return HostFacts(
        parse_mountinfo(mountinfo),
        abi,
        40,
        True,
        path_kinds={d: "dir" for d in dirs},
        writable_dirs=frozenset(dirs),
    )


def _scratch(
    ws: str = "/home/u/proj", env: dict[str, str] | None = None, host: HostFacts | None = None, **kw: object
) -> Scratch | None:
    return scratch_tmpdir(ws, True, env or {}, "/home/u", host or _facts(), "abc", **kw)  # type: ignore[arg-type]


# --- pure: where TMPDIR goes ----------------------------------------------------------------


def test_tmpdir_goes_to_the_callers_cache_beside_a_workspace_in_home() -> None:
    assert _scratch() == Scratch("/home/u/.cache", "warren/tmp/abc")
    # XDG_CACHE_HOME is followed, like the tools themselves.
    host = _facts(writable={"/home/u/proj", "/home/u/xdg"})
    assert _scratch(env={"XDG_CACHE_HOME": "/home/u/xdg"}, host=host) == Scratch(
        "/home/u/xdg", "warren/tmp/abc"
    )


def test_tmpdir_goes_to_a_cache_made_for_it_when_the_caller_has_none_yet() -> None:
    # A new account: no ~/.cache. It is made (as any caching tool would), not a directory
    # beside the workspace that changes its parent.
    host = _facts(writable={"/home/u/proj", "/home/u"})
    assert _scratch(host=host) == Scratch("/home/u", ".cache/warren/tmp/abc")
    # Control: a ~/.cache that is there but not the caller's to write is not replaced.
    host = HostFacts(
        parse_mountinfo(ROOT_ONLY),
        7,
        40,
        True,
        path_kinds={"/home/u/proj": "dir", "/home/u": "dir", "/home/u/.cache": "dir"},
        writable_dirs=frozenset({"/home/u/proj", "/home/u"}),
    )
    assert _scratch(host=host) == Scratch("/home/u", ".warren-tmp-abc")


def test_tmpdir_goes_beneath_the_callers_own_tmpdir_when_that_shares_the_workspaces_mount() -> None:
    host = _facts(writable={"/home/u/proj", "/home/u/.cache", "/home/u/tmp"})
    assert _scratch(env={"TMPDIR": "/home/u/tmp"}, host=host) == Scratch("/home/u/tmp", ".warren-tmp-abc")


def test_tmpdir_goes_above_a_workspace_outside_home_and_never_into_it() -> None:
    # The cache (/home/u/.cache) and /work/proj meet only at /, which is never shared.
    found = _scratch("/work/proj")
    assert found == Scratch("/work", ".warren-tmp-abc")
    assert found is not None and not found.path.startswith("/work/proj/")


def test_tmpdir_stays_the_private_tmpfs_when_the_hosts_is_another_filesystem() -> None:
    assert _scratch(env={"TMPDIR": "/dev/shm"}, host=_facts(SHM_TMPFS)) is None
    # Control: the same host, the caller's TMPDIR on the workspace's filesystem.
    assert _scratch(env={"TMPDIR": "/var/tmp"}, host=_facts(SHM_TMPFS)) is not None


def test_tmpdir_stays_private_when_no_place_outside_the_workspace_shares_its_mount() -> None:
    # /home is a filesystem of its own and the caller can write only the workspace there.
    host = _facts(HOME_MOUNT, writable={"/home/u/proj"})
    assert _scratch(env={"TMPDIR": "/home/u/proj/tmp"}, host=host) is None
    # Control: with its cache writable, the cache joins the workspace's mount.
    host = _facts(HOME_MOUNT, writable={"/home/u/proj", "/home/u/.cache"})
    assert _scratch(env={"TMPDIR": "/home/u/proj/tmp"}, host=host) == Scratch(
        "/home/u/.cache", "warren/tmp/abc"
    )


def test_tmpdir_stays_private_for_a_workspace_under_tmp_or_without_landlock_sharing() -> None:
    host = _facts(writable={"/tmp/a/proj", "/tmp/a", "/home/u/.cache"})
    assert _scratch("/tmp/a/proj", host=host) is None
    assert _scratch(shared=False) is None  # Landlock < 2: every root is a mount of its own
    assert _scratch() is not None  # control


def test_tmpdir_stays_private_for_a_read_only_or_unwritable_workspace() -> None:
    assert scratch_tmpdir("/home/u/proj", False, {}, "/home/u", _facts(), "abc") is None
    assert _scratch(host=_facts(writable={"/home/u/.cache", "/home/u"})) is None
    assert scratch_tmpdir("/home/u/proj", True, {}, "/home/u", _facts(), "abc") is not None  # control


# --- pure: the plan around it ---------------------------------------------------------------


def _caller(tmp_path: Path, env: dict[str, str] | None = None) -> CallerFacts:
    return CallerFacts(
        os.getuid(), os.getgid(), str(tmp_path), {"HOME": str(tmp_path), **(env or {})}, str(tmp_path)
    )


def test_plan_notes_the_exdev_of_a_workspace_under_tmp(tmp_path: Path) -> None:
    ws = tmp_path / "proj"
    ws.mkdir()
    policy = build(PolicySpec(workspace=str(ws)), env={"HOME": str(tmp_path)}, home=tmp_path)
    host = HostFacts(parse_mountinfo(ROOT_ONLY), 7, 40, True, writable_dirs=frozenset({str(ws)}))
    plan = _make_plan(policy, host, _caller(tmp_path), scratch_id="abc")
    assert plan.env["TMPDIR"] == "/tmp" and plan.scratch is None
    assert any("EXDEV" in n for n in plan.notes), plan.notes
    # Control: the host's TMPDIR on another filesystem: EXDEV there too, nothing to note.
    host = HostFacts(parse_mountinfo(SHM_TMPFS), 7, 40, True, writable_dirs=frozenset({str(ws)}))
    plan = _make_plan(policy, host, _caller(tmp_path, {"TMPDIR": "/dev/shm"}), scratch_id="abc")
    assert not plan.notes


def test_plan_names_a_repository_above_the_workspace_and_both_ways_out(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / ".git").mkdir(parents=True)
    (root / "sub").mkdir()
    assert enclosing_repository(str(root / "sub")) == str(root)
    assert enclosing_repository(str(root)) is None  # a repository of its own
    policy = build(PolicySpec(workspace=str(root / "sub")), env={"HOME": str(tmp_path)}, home=tmp_path)
    host = HostFacts(parse_mountinfo(ROOT_ONLY), 7, 40, True, repository=str(root))
    plan = _make_plan(policy, host, _caller(tmp_path))
    assert plan.repository == str(root)
    text = render(plan)
    assert f"--workspace {root}" in text and f"--write {root}/.git" in text
    # Grafted read-only under the fresh /tmp, before the workspace's own bind.
    targets = [(op.kind.value, op.target) for op in plan.mounts]
    assert targets.index(("bind_ro", str(root))) < targets.index(("bind_rw", str(root / "sub")))
    granted = build(
        PolicySpec(workspace=str(root / "sub"), write=[str(root / ".git")]),
        env={"HOME": str(tmp_path)},
        home=tmp_path,
    )
    assert _make_plan(granted, host, _caller(tmp_path)).repository is None


def test_git_hint_only_for_git_commands_that_write_a_read_only_repository() -> None:
    hint = writes_repository(["git", "-c", "user.name=x", "commit", "-m", "x"], "/r")
    assert hint is not None and "--workspace /r" in hint and "--write /r/.git" in hint
    assert writes_repository(["/usr/bin/git", "-C", "sub", "add", "."], "/r") is not None
    assert writes_repository(["git", "status"], "/r") is None
    assert writes_repository(["git", "commit"], None) is None
    assert writes_repository(["make", "commit"], "/r") is None


# --- through warren: shapes of workspace ----------------------------------------------------

WARREN = [sys.executable, "-m", "warren"]

UPWARD = """
import os, sys, tempfile
d = sys.argv[1] if len(sys.argv) > 1 else tempfile.gettempdir()
found = []
while True:
    if os.path.exists(os.path.join(d, "pyproject.toml")):
        found.append(d)
    if d == "/":
        break
    d = os.path.dirname(d)
print(repr(found))
"""


class Shape:
    """A workspace (``ws``) with room beside it (``base``), and the environment to run
    warren with: XDG_CACHE_HOME in ``base``, so the caller's own cache is untouched."""

    def __init__(self, kind: str, base: Path) -> None:
        self.kind, self.base, self.ws = kind, base, base / "ws"
        self.ws.mkdir(parents=True)
        (base / "cache").mkdir()

    def env(self, **extra: str) -> dict[str, str]:
        return {"XDG_CACHE_HOME": str(self.base / "cache"), **extra}

    def run(self, argv: list[str], *flags: str, **env: str) -> subprocess.CompletedProcess[str]:
        return run_cli(["run", *flags, "--", *argv], cwd=self.ws, env=self.env(**env), timeout=120)


@pytest.fixture(params=["home", "tmp", "var_tmp"])
def shape(request: pytest.FixtureRequest, tmp_path: Path, state_home: Path) -> Iterator[Shape]:
    tag = f"{os.getpid()}-{request.node.name[-30:].replace('/', '_').replace('[', '_').rstrip(']')}"
    if request.param == "tmp":
        base = tmp_path / "proj"
    elif request.param == "home":
        base = Path(os.path.expanduser("~")) / f".warren-tmpdir-{tag}"
    else:
        base = Path("/var/tmp") / f"warren-tmpdir-{tag}"
    yield Shape(request.param, base)
    shutil.rmtree(base, ignore_errors=True)


def _within(path: str, parent: Path) -> bool:
    return path == str(parent) or path.startswith(str(parent) + "/")


def _host_tmpdir() -> str:
    return os.environ.get("TMPDIR") or "/tmp"


def _host_rename(src_dir: str, dst_dir: Path) -> str:
    """What the host does: rename a mkstemp() file of ``src_dir`` into ``dst_dir``."""
    fd, name = tempfile.mkstemp(dir=src_dir)
    os.close(fd)
    try:
        os.rename(name, dst_dir / "host-renamed")
        os.unlink(dst_dir / "host-renamed")
        return "renamed"
    except OSError as e:
        os.unlink(name)
        return os.strerror(e.errno or 0)


def test_nothing_appears_in_the_workspace_while_a_command_runs_or_after(shape: Shape) -> None:
    script = 'echo "$TMPDIR"; touch "$TMPDIR/x"; mkdir "$TMPDIR/d"; echo ready; sleep 1.5'
    proc = subprocess.Popen(
        [*WARREN, "run", "--", "sh", "-c", script],
        cwd=shape.ws,
        env={**os.environ, **shape.env()},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    tmpdir = proc.stdout.readline().strip()
    assert proc.stdout.readline().strip() == "ready", proc.communicate(timeout=60)
    during = os.listdir(shape.ws)
    if tmpdir != "/tmp":  # a directory of the host's while the sandbox lives: 0700, the caller's
        st = os.lstat(tmpdir)
        assert (st.st_mode & 0o777, st.st_uid) == (0o700, os.getuid())
        assert sorted(os.listdir(tmpdir)) == ["d", "x"]
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert during == [] and os.listdir(shape.ws) == []
    assert tmpdir.startswith("/") and not _within(tmpdir, shape.ws)
    assert tmpdir == "/tmp" or not os.path.lexists(tmpdir), "the sandbox's TMPDIR is removed"


def test_tmpdir_of_a_long_lived_sandbox_lives_beside_the_workspace_until_it_is_removed(shape: Shape) -> None:
    name = f"tmp{os.getpid()}"
    assert run_cli(["create", name], cwd=shape.ws, env=shape.env()).returncode == 0
    try:
        r = run_cli(["exec", name, "sh", "-c", 'echo x > "$TMPDIR/kept"; echo "$TMPDIR"'], cwd=shape.ws)
        assert r.returncode == 0, r.stderr
        tmpdir = r.stdout.strip()
        again = run_cli(["exec", name, "sh", "-c", 'cat "$TMPDIR/kept"'], cwd=shape.ws)
        assert again.stdout == "x\n", again.stderr  # one TMPDIR for the sandbox's life
        assert os.listdir(shape.ws) == []
    finally:
        assert run_cli(["rm", "-f", name], cwd=shape.ws).returncode == 0
    assert not _within(tmpdir, shape.ws)
    assert tmpdir == "/tmp" or not os.path.lexists(tmpdir)
    assert os.listdir(shape.ws) == []


def test_a_rename_from_tmpdir_into_the_workspace_is_what_it_is_on_the_host(shape: Shape) -> None:
    host = _host_rename(_host_tmpdir(), shape.ws)
    r = shape.run(["python3", "-c", RENAME_FROM_TMPDIR])
    assert r.returncode == 0, r.stderr
    tmpdir, outcome = r.stdout.split("\n")[:2]
    if shape.kind == "tmp" and host == "renamed":
        # The known limit: a workspace under /tmp has the private /tmp as TMPDIR (a host
        # directory shared into the sandbox's writable /tmp would be writable too).
        assert (tmpdir, outcome) == ("/tmp", os.strerror(errno.EXDEV))
        plan = run_cli(["plan"], cwd=shape.ws, env=shape.env())
        assert "EXDEV" in plan.stdout and "note:" in plan.stdout, plan.stdout
    else:
        assert outcome == host, (tmpdir, outcome, host)
    if outcome == "renamed":
        assert (shape.ws / "renamed").read_text() == "x"
    assert [p.name for p in shape.ws.iterdir()] == (["renamed"] if outcome == "renamed" else [])


def test_a_rename_from_a_tmpdir_on_another_filesystem_is_exdev_as_on_the_host(shape: Shape) -> None:
    if not os.access("/dev/shm", os.W_OK) or os.stat("/dev/shm").st_dev == os.stat(shape.ws).st_dev:
        pytest.skip("/dev/shm is not a writable filesystem of its own here")
    host = _host_rename("/dev/shm", shape.ws)
    assert host == os.strerror(errno.EXDEV)
    r = shape.run(["python3", "-c", RENAME_FROM_TMPDIR], TMPDIR="/dev/shm")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["/tmp", host]


def test_a_tool_searching_upward_from_its_temp_dir_finds_nothing_of_the_workspace(shape: Shape) -> None:
    (shape.ws / "pyproject.toml").write_text("[tool.mypy]\n")
    (shape.ws / "sub").mkdir()
    # Control: the probe finds the workspace's file from a directory inside it.
    ctl = shape.run(["python3", "-c", UPWARD, str(shape.ws / "sub")])
    assert ctl.returncode == 0 and str(shape.ws) in ctl.stdout, (ctl.stdout, ctl.stderr)
    r = shape.run(["python3", "-c", UPWARD])
    assert r.returncode == 0, r.stderr
    found = eval(r.stdout)  # a list of str, printed by repr
    assert not [d for d in found if _within(d, shape.ws)], found


@pytest.fixture(scope="module")
def venv_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with pip, made once on the host (ensurepip is most of a venv's cost): each
    case copies it into its workspace and runs its pip by ``-m`` (no absolute shebang)."""
    venv = tmp_path_factory.mktemp("venv-template") / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True)
    return venv


def test_pip_uninstalls_from_a_workspace_venv(shape: Shape, venv_template: Path) -> None:
    wheels = shape.base / "wheels"
    make_wheel(wheels)
    shutil.copytree(venv_template, shape.ws / "venv", symlinks=True)
    script = (
        "set -e; "
        f"venv/bin/python -m pip install -q --no-index --find-links {wheels} warrendemo; "
        "venv/bin/python -m pip uninstall -y -q warrendemo; "
        "venv/bin/python -c 'import warrendemo' 2>/dev/null && echo still-there || echo gone"
    )
    r = shape.run(
        ["sh", "-c", script],
        "--read",  # under /tmp a sibling of the workspace is not there unless named
        str(wheels),
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_CONFIG_FILE=os.devnull,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "gone"
    assert not list(shape.ws.glob("venv/lib/python3*/site-packages/warrendemo"))
    assert sorted(p.name for p in shape.ws.iterdir()) == ["venv"]


def test_tmp_is_writable_beside_writable_paths_and_the_hosts_directories_stay_untouched(
    shape: Shape,
) -> None:
    other = shape.base / "y"
    other.mkdir()
    before = sorted(os.listdir(shape.base))
    unique = f"warren-private-{os.getpid()}-{shape.kind}"
    script = (
        f"set -e; touch /tmp/f; mkdir /tmp/{unique}; echo ok > /tmp/{unique}/g; cat /tmp/{unique}/g; "
        f"touch {other}/a; "
        # The directory above both roots: on the host it is not granted.
        f"touch {shape.base}/planted 2>/dev/null || true"
    )
    r = shape.run(["sh", "-c", script], "--write", str(other))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"
    assert (other / "a").exists()  # control: the granted path was written
    assert sorted(os.listdir(shape.base)) == before, "nothing written beside the roots on the host"
    assert not os.path.exists(f"/tmp/{unique}"), "the sandbox's /tmp is its own"


def _plant_script(target_file: Path, target_dir: Path) -> str:
    return (
        f'ln -s {target_file} "$TMPDIR/flink"; ln -s {target_dir} "$TMPDIR/dlink"; '
        f'mkdir "$TMPDIR/sub"; ln -s {target_dir} "$TMPDIR/sub/deep"; echo "$TMPDIR"'
    )


def _host_targets(shape: Shape) -> tuple[Path, Path]:
    target_file = shape.base / "outside.txt"
    target_file.write_text("keep me\n")
    target_dir = shape.base / "outside-dir"
    target_dir.mkdir()
    (target_dir / "inner.txt").write_text("keep me too\n")
    return target_file, target_dir


@pytest.mark.parametrize("shape", ["home", "var_tmp"], indirect=True)
def test_clean_up_of_tmpdir_never_follows_a_link_the_sandbox_planted(shape: Shape) -> None:
    if _host_rename(_host_tmpdir(), shape.ws) != "renamed":
        pytest.skip("the host's TMPDIR is on another filesystem than the workspace: no TMPDIR is made")
    target_file, target_dir = _host_targets(shape)
    name = f"links{os.getpid()}"
    assert run_cli(["create", name], cwd=shape.ws, env=shape.env()).returncode == 0
    try:
        r = run_cli(["exec", name, "sh", "-c", _plant_script(target_file, target_dir)], cwd=shape.ws)
        assert r.returncode == 0, r.stderr
        tmpdir = Path(r.stdout.strip())
        # Control: the links are there, on the host, pointing at the host's files.
        assert os.readlink(tmpdir / "flink") == str(target_file)
        assert os.readlink(tmpdir / "sub" / "deep") == str(target_dir)
    finally:
        assert run_cli(["rm", "-f", name], cwd=shape.ws).returncode == 0
    assert not os.path.lexists(tmpdir)
    assert target_file.read_text() == "keep me\n"
    assert (target_dir / "inner.txt").read_text() == "keep me too\n"


@pytest.mark.parametrize("shape", ["home", "var_tmp"], indirect=True)
def test_tmpdir_left_by_a_killed_supervisor_is_swept_by_the_next_one(shape: Shape) -> None:
    if _host_rename(_host_tmpdir(), shape.ws) != "renamed":
        pytest.skip("the host's TMPDIR is on another filesystem than the workspace: no TMPDIR is made")
    target_file, target_dir = _host_targets(shape)
    name = f"swept{os.getpid()}"
    assert run_cli(["create", name], cwd=shape.ws, env=shape.env()).returncode == 0
    r = run_cli(["exec", name, "sh", "-c", _plant_script(target_file, target_dir)], cwd=shape.ws)
    assert r.returncode == 0, r.stderr
    tmpdir = Path(r.stdout.strip())
    found = statedir.read_address(statedir.location(os.environ))
    assert found is not None
    os.kill(found[1], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and os.path.exists(f"/proc/{found[1]}"):
        time.sleep(0.05)
    assert os.path.isdir(tmpdir), "a killed supervisor removes nothing"
    listed = run_cli(["ls"], cwd=shape.ws)  # starts the next supervisor, which sweeps
    assert listed.returncode == 0, listed.stderr
    assert not os.path.lexists(tmpdir)
    assert target_file.read_text() == "keep me\n"
    assert (target_dir / "inner.txt").read_text() == "keep me too\n"
    run_cli(["rm", "-f", name], cwd=shape.ws)


# --- a workspace inside a larger repository ---------------------------------------------------

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.org"]


@pytest.fixture
def repo_sub(shape: Shape) -> Path:
    """A repository in ``shape.ws`` with one commit; the workspace is its ``sub``."""
    root = shape.ws
    (root / "sub").mkdir()
    (root / "top.txt").write_text("top\n")
    (root / "sub" / "s.txt").write_text("s\n")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "."], cwd=root, check=True)
    subprocess.run([*GIT, "commit", "-qm", "first commit"], cwd=root, check=True)
    return root / "sub"


def _git_run(shape: Shape, sub: Path, argv: list[str], *flags: str) -> subprocess.CompletedProcess[str]:
    return run_cli(["run", *flags, "--", *argv], cwd=sub, env=shape.env(), timeout=120)


def test_git_in_a_repository_subdirectory_reads_the_parent_repository(shape: Shape, repo_sub: Path) -> None:
    root = repo_sub.parent
    script = "set -e; git rev-parse --show-toplevel; git log --format=%s; git status --short; echo end"
    r = _git_run(shape, repo_sub, ["sh", "-c", script])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [str(root), "first commit", "end"], r.stdout


def test_git_commit_in_a_repository_subdirectory_fails_with_a_hint_naming_both_ways(
    shape: Shape, repo_sub: Path
) -> None:
    root = repo_sub.parent
    r = _git_run(shape, repo_sub, [*GIT, "commit", "--allow-empty", "-qm", "second"])
    assert r.returncode != 0
    hints = [line for line in r.stderr.splitlines() if line.startswith("warren: hint:")]
    assert len(hints) == 1, r.stderr
    assert f"--workspace {root}" in hints[0] and f"--write {root}/.git" in hints[0]
    log = subprocess.run(["git", "log", "--format=%s"], cwd=root, capture_output=True, text=True)
    assert log.stdout.splitlines() == ["first commit"]
    # Control: a command that does not write the repository gets no such hint.
    r = _git_run(shape, repo_sub, ["git", "log", "--bad-option"])
    assert r.returncode != 0 and "warren: hint:" not in r.stderr


def test_git_commit_in_a_repository_subdirectory_works_with_its_git_directory_granted(
    shape: Shape, repo_sub: Path
) -> None:
    root = repo_sub.parent
    (repo_sub / "new.txt").write_text("new\n")
    script = f"set -e; git add new.txt; {' '.join(GIT)} commit -qm second; git status --short; echo done"
    r = _git_run(shape, repo_sub, ["sh", "-c", script], "--write", str(root / ".git"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["done"]
    assert "warren: hint:" not in r.stderr
    log = subprocess.run(["git", "log", "--format=%s"], cwd=root, capture_output=True, text=True)
    assert log.stdout.splitlines() == ["second", "first commit"]


def test_a_unix_socket_in_tmpdir_works(shape: Shape) -> None:
    code = (
        "import os, socket; p = os.path.join(os.environ['TMPDIR'], 's'); "
        "l = socket.socket(socket.AF_UNIX); l.bind(p); l.listen(); "
        "c = socket.socket(socket.AF_UNIX); c.connect(p); c.send(b'x'); "
        "a, _ = l.accept(); print(a.recv(1).decode()); os.unlink(p)"
    )
    r = shape.run(["python3", "-c", code])
    assert (r.returncode, r.stdout) == (0, "x\n"), r.stderr
