"""``workspace_at``: the workspace seen at another path than its host one (E2B's
``/home/user``), the mount point made inside the sandbox only.

Its parent is shadowed: a read-only tmpfs showing the host's entries bound back, with the
mount point made in it. Judged from the host: the host's directory gains nothing, a write
beside the workspace is refused and lands nowhere, a denied file in the shadowed parent
stays unreadable, and the repository's git directory is warren's there too (a hook or a
config written through the new path never reaches host git). The positive controls: the
same writes into the workspace through the new path do reach the host, and git works in it
as on the host.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import GIT_ENV, host_git, module_state
from warren import Sandbox
from warren.errors import PolicyError
from warren.policy.spec import PolicySpec

HOME = "/home/user"


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from module_state(tmp_path_factory)


class Placed:
    def __init__(self, sandbox: Sandbox, workspace: Path, parent: Path) -> None:
        self.sandbox, self.workspace, self.parent = sandbox, workspace, parent

    def sh(self, script: str) -> subprocess.CompletedProcess[str]:
        r = self.sandbox.exec(["sh", "-c", script])
        return subprocess.CompletedProcess(script, r.exit_code, r.stdout.decode(), r.stderr.decode())


@pytest.fixture(scope="module")
def placed(state: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Placed]:
    """One sandbox for the module: a git repository as its workspace, seen at a path
    below a parent in the caller's home that holds a denied file, a plain file and a
    link (the home: a parent every caller can make, root or not)."""
    workspace = tmp_path_factory.mktemp("placed") / "ws"
    workspace.mkdir()
    (workspace.parent / "githome").mkdir()
    assert host_git(workspace, "init", "-q").returncode == 0
    assert host_git(workspace, "commit", "-q", "--allow-empty", "-m", "base").returncode == 0
    parent = Path.home() / f".warren-placed-{secrets.token_hex(6)}"
    parent.mkdir()
    (parent / "visible.txt").write_text("shown\n")
    (parent / "secret.txt").write_text("never shown\n")
    (parent / "link").symlink_to("visible.txt")
    spec = PolicySpec(
        workspace=str(workspace),
        workspace_at=str(parent / "user"),
        deny=[str(parent / "secret.txt")],
        env=dict(GIT_ENV),
    )
    sandbox = Sandbox.create(spec)
    try:
        yield Placed(sandbox, workspace, parent)
    finally:
        sandbox.remove()
        shutil.rmtree(parent)


def test_commands_start_in_the_workspace_at_its_new_path_and_writes_reach_the_host(placed: Placed) -> None:
    at = placed.parent / "user"
    r = placed.sh("pwd; echo from-inside > made.txt; ls -a")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == str(at)
    assert (placed.workspace / "made.txt").read_text() == "from-inside\n"  # the control: it reaches the host
    assert not at.exists()  # the mount point was made inside only


def test_the_shadowed_parent_shows_the_hosts_entries_read_only_and_keeps_denied_ones_hidden(
    placed: Placed,
) -> None:
    p = placed.parent
    before = sorted(os.listdir(p)), os.stat(p).st_mode, os.stat(p).st_mtime_ns
    r = placed.sh(
        f"ls -A {p}; cat {p}/visible.txt; readlink {p}/link; cat {p}/link; "
        f"cat {p}/secret.txt || echo SECRET-REFUSED; "
        f"echo x > {p}/planted.txt || echo WRITE-REFUSED; mkdir {p}/user2 || echo MKDIR-REFUSED; "
        f"chmod 777 {p} || echo CHMOD-REFUSED; rm -f {p}/visible.txt || echo RM-REFUSED"
    )
    out = r.stdout.splitlines()
    assert out[:4] == ["link", "secret.txt", "user", "visible.txt"], r.stdout
    assert out[4:7] == ["shown", "visible.txt", "shown"]
    assert "never shown" not in r.stdout and "SECRET-REFUSED" in out
    for refused in ("WRITE-REFUSED", "MKDIR-REFUSED", "CHMOD-REFUSED", "RM-REFUSED"):
        assert refused in out, r.stdout + r.stderr
    # judged on the host: nothing changed there
    assert (sorted(os.listdir(p)), os.stat(p).st_mode, os.stat(p).st_mtime_ns) == before
    assert (p / "visible.txt").read_text() == "shown\n"


def test_git_works_at_the_new_path_and_host_git_never_reads_what_it_writes(placed: Placed) -> None:
    config = (placed.workspace / ".git" / "config").read_bytes()
    r = placed.sh(
        "git commit -q --allow-empty -m inside && git log --format=%s | head -1; "
        "printf '[core]\\n\\tfsmonitor = touch /tmp/pwned\\n' >> .git/config; "
        "mkdir -p .git/hooks && printf '#!/bin/sh\\ntouch /tmp/pwned\\n' > .git/hooks/post-checkout "
        "&& chmod +x .git/hooks/post-checkout && echo PLANTED"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["inside", "PLANTED"]
    # the commit is the host's (objects and refs are shared) ...
    assert host_git(placed.workspace, "log", "--format=%s", "-1").stdout.strip() == "inside"
    # ... its config and hooks are not: the sandbox wrote warren's copies
    assert (placed.workspace / ".git" / "config").read_bytes() == config
    assert not (placed.workspace / ".git" / "hooks" / "post-checkout").exists()


def test_the_workspace_at_its_new_path_behaves_as_on_the_host_for_tools(placed: Placed) -> None:
    """Fidelity: renames and hard links within it, modes, times and xattrs on its files."""
    r = placed.sh(
        "mkdir -p a/b && echo hi > a/b/f && mv a/b c && ln c/f hard && chmod 640 hard && "
        "touch -d @1000000 hard && python3 -c \"import os; os.setxattr('hard', 'user.k', b'v'); "
        "print(os.getxattr('hard', 'user.k').decode())\""
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == "v\n"
    host = placed.workspace / "hard"
    st = host.stat()
    assert st.st_nlink == 2 and (st.st_mode & 0o777) == 0o640 and int(st.st_mtime) == 1000000
    assert os.getxattr(host, "user.k") == b"v"


@pytest.mark.parametrize(
    ("at", "says"),
    [
        ("user", "absolute"),
        ("/home/../home/user", "absolute, normal"),
        ("/user", "directly under /"),
        ("/tmp/user", "under /tmp"),
        ("/proc/x/user", "under /proc"),
        ("/no-such-parent-dir/user", "not a directory on this host"),
    ],
)
def test_a_workspace_at_that_cannot_hold_is_a_typed_error(
    state: Path, tmp_path: Path, at: str, says: str
) -> None:
    with pytest.raises(PolicyError) as caught:
        Sandbox.create(PolicySpec(workspace=str(tmp_path), workspace_at=at))
    assert says in caught.value.message and caught.value.hint


def test_a_workspace_at_inside_a_writable_root_is_refused(state: Path) -> None:
    """Its parent would be shown read-only over a directory the sandbox may write."""
    base = Path.home() / f".warren-placed-{secrets.token_hex(6)}"
    (base / "ws" / "sub").mkdir(parents=True)
    try:
        with pytest.raises(PolicyError) as caught:
            Sandbox.create(
                PolicySpec(workspace=str(base / "ws"), workspace_at=str(base / "ws" / "sub" / "user"))
            )
        assert "inside the writable root" in caught.value.message
    finally:
        shutil.rmtree(base)
