"""Review mode (``create --review``): the sandbox's changes to its workspace go to a
layer of its own; ``diff`` shows them, ``apply`` writes them to the host, ``discard``
drops them. Everything judged on the host, as root and as uid 1001.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import warren
from conftest import GIT_ENV, host_git, make_wheel, module_state, need_tool, run_cli
from warren.client.sandbox import Sandbox
from warren.errors import PolicyError, ReviewConflict, ReviewError
from warren.policy import PolicySpec, build


@pytest.fixture(scope="module", autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from module_state(tmp_path_factory)


def _tree(root: Path) -> dict[str, tuple[str, int, str]]:
    """Every entry beneath ``root``: (type, mode, content or link target), links not followed."""
    out: dict[str, tuple[str, int, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath, name)
            st = p.lstat()
            rel = str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", 0, os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode), "")
            else:
                out[rel] = ("file", stat.S_IMODE(st.st_mode), p.read_text())
    return out


def _bytes_tree(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every entry beneath ``root``, git's binary files included: (mode, mtime of a
    non-directory, bytes or link target), links not followed."""
    out: dict[str, tuple[int, int, bytes]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath, name)
            st = p.lstat()
            data, mtime = b"", st.st_mtime_ns
            if stat.S_ISLNK(st.st_mode):
                data = os.fsencode(os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                data = p.read_bytes()
            else:
                mtime = 0
            out[str(p.relative_to(root))] = (st.st_mode, mtime, data)
    return out


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "keep.txt").write_text("keep\n")
    (ws / "edit.txt").write_text("before\n")
    (ws / "gone.txt").write_text("remove me\n")
    (ws / "src" / "old.py").write_text("print('moved')\n")
    (ws / "run.sh").write_text("echo hi\n")
    (ws / "olddir").mkdir()
    (ws / "olddir" / "f").write_text("in a removed directory\n")
    (ws / "replaced").mkdir()
    (ws / "replaced" / "a").write_text("a\n")
    return ws


def _review(ws: Path, name: str, **extra: object) -> Sandbox:
    return Sandbox.create(build(PolicySpec(workspace=str(ws), review=True, **extra)), name=name)  # type: ignore[arg-type]


CHANGES = (
    "echo after > edit.txt && rm gone.txt && mkdir -p lib && mv src/old.py lib/new.py && "
    "chmod 755 run.sh && echo fresh > lib/added.txt && rm -r olddir && "
    "rm -r replaced && mkdir replaced && echo n > replaced/n"
)


def test_changes_stay_off_the_host_until_apply_then_exactly_those(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    before = _tree(ws)
    sb = _review(ws, "review-basic")
    try:
        r = sb.exec(["sh", "-c", CHANGES + " && cat edit.txt lib/new.py && ls"])
        assert r.exit_code == 0, r.stderr
        assert b"after" in r.stdout and b"moved" in r.stdout and b"gone.txt" not in r.stdout
        assert _tree(ws) == before  # the host saw nothing
        changes = {(c.kind, c.path) for c in sb.diff().changes}
        assert changes == {
            ("modified", "edit.txt"),
            ("removed", "gone.txt"),
            ("added", "lib"),
            ("renamed", "lib/new.py"),
            ("mode", "run.sh"),
            ("added", "lib/added.txt"),
            ("removed", "olddir"),
            ("removed", "olddir/f"),
            ("removed", "replaced/a"),  # a directory made again is opaque: the host's entries go
            ("added", "replaced/n"),
        }, changes
        patch = sb.diff(patch=True).patch
        assert "-before\n+after\n" in patch and "rename from src/old.py\nrename to lib/new.py" in patch
        assert "old mode 100644\nnew mode 100755" in patch
        with pytest.raises(ReviewError, match="running"):
            sb.apply()
        assert _tree(ws) == before
        sb.stop()
        sb.apply()
        after = _tree(ws)
        expected = dict(before)
        for gone in ("gone.txt", "src/old.py", "olddir", "olddir/f", "replaced/a"):
            del expected[gone]
        expected["edit.txt"] = ("file", 0o644, "after\n")
        expected["run.sh"] = ("file", 0o755, "echo hi\n")
        expected["lib"] = ("dir", 0o755, "")
        expected["lib/new.py"] = ("file", 0o644, "print('moved')\n")
        expected["lib/added.txt"] = ("file", 0o644, "fresh\n")
        expected["replaced/n"] = ("file", 0o644, "n\n")
        assert after == expected
        assert (ws / "edit.txt").stat().st_uid == os.getuid()  # owned by the caller
        assert sb.diff().changes == ()  # applied: nothing left to show
    finally:
        sb.remove()
    # control: the same commands in a live sandbox change the host at once (the detector sees them)
    live = _workspace(tmp_path / "live")
    subprocess_result = run_cli(["run", "--", "sh", "-c", CHANGES], cwd=live)
    assert subprocess_result.returncode == 0, subprocess_result.stderr
    assert _tree(live) == expected


def test_apply_by_path_then_discard_drops_the_rest(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    sb = _review(ws, "review-partial")
    try:
        # a directory closed by its mode: diff, discard and rm get past it as uid 1001 too
        script = "echo one > edit.txt && echo two > keep.txt && mkdir -p closed/in && touch closed/f"
        script += " && chmod 0 closed"
        assert sb.exec(["sh", "-c", script]).exit_code == 0
        assert "closed" in [c.path for c in sb.diff().changes]
        sb.stop()
        with pytest.raises(ReviewError, match=r"no change at nothing\.txt"):
            sb.apply("nothing.txt")
        assert [c.path for c in sb.apply("edit.txt").changes] == ["edit.txt"]
        assert (ws / "edit.txt").read_text() == "one\n" and (ws / "keep.txt").read_text() == "keep\n"
        sb.discard()
        assert sb.diff().changes == ()
        assert (ws / "keep.txt").read_text() == "keep\n"
    finally:
        sb.remove()
    # removed with the sandbox: no layer is left in the state directory
    assert list(Path(os.environ["XDG_STATE_HOME"], "warren", "review").iterdir()) == []


def test_apply_refuses_a_file_changed_on_the_host_meanwhile_unless_forced(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    sb = _review(ws, "review-conflict")
    try:
        assert sb.exec(["sh", "-c", "echo sandbox > edit.txt && echo sandbox > keep.txt"]).exit_code == 0
        (ws / "edit.txt").write_text("host\n")  # the user edits it meanwhile
        sb.stop()
        with pytest.raises(ReviewConflict, match=r"edit\.txt") as caught:
            sb.apply()
        assert "--force" in caught.value.hint
        # nothing written: not even the file nobody else touched
        assert (ws / "edit.txt").read_text() == "host\n" and (ws / "keep.txt").read_text() == "keep\n"
        # control: the untouched one alone applies
        sb.apply("keep.txt")
        assert (ws / "keep.txt").read_text() == "sandbox\n"
        sb.apply(force=True)
        assert (ws / "edit.txt").read_text() == "sandbox\n"
    finally:
        sb.remove()


def test_links_are_applied_as_links_never_followed(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    (ws / "sub").mkdir()
    target = tmp_path / "outside.txt"
    target.write_text("outside\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    sb = _review(ws, "review-links")
    try:
        # the sandbox turns edit.txt into a link out of the workspace and writes sub/f
        script = f"rm edit.txt && ln -s {target} edit.txt && echo planted > sub/f"
        assert sb.exec(["sh", "-c", script]).exit_code == 0
        # the host's side of the way: sub becomes a link to a directory outside meanwhile
        (ws / "sub").rmdir()
        (ws / "sub").symlink_to(elsewhere)
        sb.stop()
        with pytest.raises(ReviewConflict):
            sb.apply()
        sb.apply(force=True)
        assert os.readlink(ws / "edit.txt") == str(target)
        assert target.read_text() == "outside\n"
        assert list(elsewhere.iterdir()) == []  # never written through the host's link
        assert (ws / "sub").is_dir() and not (ws / "sub").is_symlink()
        assert (ws / "sub" / "f").read_text() == "planted\n"
    finally:
        sb.remove()
    # control: writing through that link on the host does reach the file outside
    (ws / "edit.txt").write_text("through\n")
    assert target.read_text() == "through\n"


def test_a_denied_file_stays_unreadable_in_review_mode(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    (ws / "secret.env").write_text("TOKEN=PLANTED-REVIEW-SECRET\n")
    (ws / "plain.env").write_text("TOKEN=visible\n")
    sb = _review(ws, "review-deny", deny=[str(ws / "secret.env")])
    try:
        got = sb.exec(["sh", "-c", "cat secret.env; cp secret.env copy; ln secret.env hard; cat plain.env"])
        assert b"PLANTED-REVIEW-SECRET" not in got.stdout + got.stderr
        assert b"TOKEN=visible" in got.stdout  # control: the same read of a file not denied
        sb.stop()
        layer_text = b"".join(
            p.read_bytes()
            for p in Path(os.environ["XDG_STATE_HOME"], "warren", "review").rglob("*")
            if p.is_file() and not p.is_symlink()
        )
        assert b"PLANTED-REVIEW-SECRET" not in layer_text
    finally:
        sb.remove()


def test_git_inside_commits_to_the_layer_and_host_git_never_sees_it(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    (tmp_path / "githome").mkdir()
    assert host_git(ws, "init", "-q").returncode == 0
    host_git(ws, "add", "-A")
    assert host_git(ws, "commit", "-qm", "host").returncode == 0
    head = host_git(ws, "rev-parse", "HEAD").stdout
    sb = _review(ws, "review-git", env=dict(GIT_ENV))
    try:
        r = sb.exec(["sh", "-c", "echo inside >> edit.txt && git commit -qam inside && git log --oneline"])
        assert r.exit_code == 0, r.stderr
        assert b"inside" in r.stdout
        assert host_git(ws, "rev-parse", "HEAD").stdout == head
        held = [c for c in sb.diff().changes if c.path.startswith(".git/") or c.path == ".git"]
        assert held and all(c.held for c in held)
        sb.stop()
        sb.apply()
        assert host_git(ws, "rev-parse", "HEAD").stdout == head  # the commit stays in the layer
        assert (ws / "edit.txt").read_text() == "before\ninside\n"  # the work tree's change is applied
        assert "edit.txt" in host_git(ws, "status", "--short").stdout
    finally:
        sb.remove()


def test_pip_installs_into_a_venv_in_a_review_workspace(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    wheel = make_wheel(tmp_path / "wheels")
    sb = _review(ws, "review-pip", read=[str(wheel.parent)])
    try:
        script = (
            # no ensurepip (seconds): this Python's pip installs into the venv
            f"echo link-mode=$UV_LINK_MODE && {sys.executable} -m venv --without-pip .venv && "
            f"{sys.executable} -m pip --python .venv/bin/python install -q --no-index {wheel} && "
            ".venv/bin/python -c 'import warrendemo; print(warrendemo.VALUE)'"
        )
        r = sb.exec(["sh", "-c", script], timeout=120)
        assert r.exit_code == 0, r.stderr
        assert b"link-mode=copy" in r.stdout  # uv copies quietly (its hard links cannot reach the layer)
        assert r.stdout.strip().endswith(b"42")
        assert not (ws / ".venv").exists()
        assert any(c.path == ".venv" for c in sb.diff().changes)
    finally:
        sb.remove()


def test_uv_installs_from_its_cache_into_a_review_workspace_quietly(tmp_path: Path) -> None:
    uv = Path(sys.executable).with_name("uv")
    if not uv.exists():
        pytest.skip("uv is not installed beside this Python")
    ws = _workspace(tmp_path)
    wheel = make_wheel(tmp_path / "wheels")
    script = (
        f"{uv} venv -q --python {sys.executable} .uvenv && "
        f"{uv} pip install --python .uvenv/bin/python --no-index {wheel} && "
        ".uvenv/bin/python -c 'import warrendemo; print(warrendemo.VALUE)'"
    )
    runs = {}
    for mode in ("", "hardlink"):  # control: uv told to hard-link says it cannot
        env = {"UV_LINK_MODE": mode} if mode else {}
        sb = _review(ws, f"review-uv{mode}", presets=["python"], read=[str(wheel.parent)], env=env)
        try:
            runs[mode] = sb.exec(["sh", "-c", script], timeout=120)
        finally:
            sb.remove()
    for r in runs.values():
        assert r.exit_code == 0, r.stderr
        assert r.stdout.strip().endswith(b"42")
    assert b"hardlink" not in runs[""].stderr.lower(), runs[""].stderr
    assert b"hardlink" in runs["hardlink"].stderr.lower(), runs["hardlink"].stderr
    assert not (ws / ".uvenv").exists()


def test_the_tools_work_in_a_review_workspace_and_their_work_applies_as_made(tmp_path: Path) -> None:
    """Renames across directories, hard links within the workspace, git branches and a
    worktree, an npm install (and a cargo build where cargo is installed for this user)
    inside a review sandbox: each behaves as on the host, the host sees nothing until
    ``apply``, then the work tree as made (a hard-linked pair as one file), git's own
    metadata held in the layer."""
    need_tool("npm", "an npm install in a review workspace")
    ws = _workspace(tmp_path)
    (tmp_path / "githome").mkdir()
    assert host_git(ws, "init", "-q", "-b", "main").returncode == 0
    host_git(ws, "add", "-A")
    assert host_git(ws, "commit", "-qm", "host").returncode == 0
    pkg = tmp_path / "pkgsrc"
    pkg.mkdir()
    (pkg / "package.json").write_text(
        '{"name": "warren-review-demo", "version": "1.0.0", "main": "index.js"}'
    )
    (pkg / "index.js").write_text("module.exports = 41 + 1;\n")
    packed = subprocess.run(
        ["npm", "pack", "-q", "--pack-destination", str(tmp_path), "--cache", str(tmp_path / "npm-cache")],
        cwd=pkg,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert packed.returncode == 0, packed.stderr
    tarball = tmp_path / packed.stdout.strip().splitlines()[-1]
    cargo = shutil.which("cargo")
    has_cargo = (
        cargo is not None and subprocess.run([cargo, "--version"], capture_output=True).returncode == 0
    )
    before = _bytes_tree(ws)
    sb = _review(ws, "review-tools", env=dict(GIT_ENV), read=[str(tmp_path)])
    try:
        script = (
            "set -e; mkdir -p a b && echo one > a/f && mv a/f b/f && test -f b/f && ! test -e a/f; "
            'echo x > h1 && ln h1 h2 && echo y >> h1 && test "$(cat h2)" = "$(printf \'x\\ny\')"; '
            "git checkout -q -b feature && git add -A && git commit -qm inside; "
            "git worktree add -q ../wt-outside-is-refused 2>/dev/null && exit 3 || true; "
            "git worktree add -q wt main && git -C wt log --oneline -1 >/dev/null; "
            f'npm install -q --offline --no-audit --no-fund --cache "$TMPDIR/npm" {tarball}; '
            "node -e 'process.exit(require(\"warren-review-demo\") === 42 ? 0 : 1)'"
        )
        r = sb.exec(["sh", "-c", script], timeout=180)
        assert r.exit_code == 0, r.stderr
        if has_cargo:
            crate = (
                "mkdir -p crate/src && cd crate && "
                'printf \'[package]\\nname = "demo"\\nversion = "0.1.0"\\n\' > Cargo.toml && '
                "echo 'fn main() { println!(\"built\"); }' > src/main.rs && "
                "cargo build -q --offline && ./target/debug/demo"
            )
            built = sb.exec(["sh", "-c", crate], timeout=300)
            assert built.exit_code == 0 and built.stdout.strip() == b"built", built.stderr
        assert _bytes_tree(ws) == before  # nothing reached the host
        assert host_git(ws, "branch", "--list", "feature").stdout == ""
        sb.stop()
        sb.apply()
    finally:
        sb.remove()
    assert (ws / "b" / "f").read_text() == "one\n" and not (ws / "a" / "f").exists()
    assert os.stat(ws / "h1").st_ino == os.stat(ws / "h2").st_ino  # applied as one file
    assert (ws / "node_modules" / "warren-review-demo" / "index.js").exists()
    # git's metadata stays in the layer (host git would read it): the host's repository is
    # as it was, the worktree's files arrive as plain files, and host git works on them
    assert host_git(ws, "rev-parse", "--abbrev-ref", "HEAD").stdout.strip() == "main"
    assert host_git(ws, "branch", "--list", "feature").stdout == ""
    assert (ws / "wt" / "keep.txt").read_text() == "keep\n" and not (ws / "wt" / ".git").exists()
    assert str(ws / "wt") not in host_git(ws, "worktree", "list").stdout
    assert host_git(ws, "status", "--short").returncode == 0
    assert not (tmp_path / "wt-outside-is-refused").exists()


def test_review_mode_refuses_what_it_was_not_built_for(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    with pytest.raises(PolicyError, match="read-only workspace"):
        _review(ws, "review-ro", workspace_writable=False)
    with pytest.raises(PolicyError, match="inside the workspace"):
        _review(ws, "review-inner", write=[str(ws / "src")])
    # the library's one-shot run keeps no sandbox: no layer to review
    with pytest.raises(PolicyError, match="created by name"):
        warren.run(["true"], PolicySpec(workspace=str(ws), review=True))
    # run --json prints a result and keeps nothing: with --review, one of them would be lost
    both = run_cli(["run", "--review", "--json", "--workspace", str(ws), "--", "true"], cwd=ws)
    assert both.returncode == 125 and "cannot be combined" in both.stderr and "hint:" in both.stderr
    assert "Traceback" not in both.stderr


def test_run_review_keeps_the_changes_in_a_stopped_sandbox_to_apply(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    before = _tree(ws)
    (ws / "src").mkdir(exist_ok=True)
    script = "pwd && echo run > ../edit.txt && exit 3"
    r = run_cli(["run", "--review", "--workspace", str(ws), "--", "sh", "-c", script], cwd=ws / "src")
    assert r.returncode == 3, r.stderr  # the command's status
    assert r.stdout.strip() == str(ws / "src")  # started where the caller is, as `run` does
    assert _tree(ws) == before
    name = re.search(r"kept in review sandbox (review-[0-9a-f]{8})", r.stderr)
    assert name is not None and "M edit.txt" in r.stderr, r.stderr
    try:
        assert run_cli(["apply", name[1]], cwd=ws).returncode == 0
        assert (ws / "edit.txt").read_text() == "run\n"
    finally:
        run_cli(["rm", "-f", name[1]], cwd=ws)


def test_the_cli_lists_patches_and_applies(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    assert run_cli(["create", "--review", "review-cli"], cwd=ws).returncode == 0
    try:
        assert run_cli(["exec", "review-cli", "sh", "-c", "echo cli > edit.txt"], cwd=ws).returncode == 0
        listed = run_cli(["diff", "review-cli"], cwd=ws)
        assert listed.stdout == "M edit.txt\n", listed.stderr
        assert "+cli" in run_cli(["diff", "--patch", "review-cli"], cwd=ws).stdout
        listed_json = json.loads(run_cli(["diff", "--json", "review-cli"], cwd=ws).stdout)
        assert [(c["kind"], c["path"]) for c in listed_json["changes"]] == [("modified", "edit.txt")]
        refused = run_cli(["apply", "review-cli"], cwd=ws)
        assert refused.returncode == 125 and "hint:" in refused.stderr and "Traceback" not in refused.stderr
        assert run_cli(["stop", "review-cli"], cwd=ws).returncode == 0
        assert run_cli(["apply", "review-cli"], cwd=ws).returncode == 0
        assert (ws / "edit.txt").read_text() == "cli\n"
    finally:
        run_cli(["rm", "-f", "review-cli"], cwd=ws)
