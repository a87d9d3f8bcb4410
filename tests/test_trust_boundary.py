"""The trust boundary against an untrusted repository or agent: each hole is closed,
judged from the host side (a marker not created, a host file unchanged), and the
fidelity the fix could cost is kept."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import Layout, host_files, host_git, host_marker, run_cli

# Runs inside the sandbox: try each operation, report the outcome (or errno name) as JSON.
ATTEMPT = r"""
import errno, json, os, sys
results = {}
def attempt(name, fn):
    try:
        out = fn()
        results[name] = out if isinstance(out, str) else "ALLOWED"
    except OSError as e:
        results[name] = errno.errorcode.get(e.errno, str(e.errno))
"""


def _attempts(layout: Layout, body: str, *flags: str) -> dict[str, str]:
    r = layout.py(ATTEMPT + body + "\nprint(json.dumps(results))", *flags)
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


@pytest.fixture(autouse=True, params=["run", "exec"])
def via(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each claim holds for a one-shot `warren run` and for `warren exec`."""
    monkeypatch.setattr(Layout, "via", request.param)
    return str(request.param)


# --- 6: pre-existing hard links to files outside the writable roots ------------------


def test_a_hardlink_to_an_outside_file_is_a_file_of_its_own_inside(layout: Layout, state_home: Path) -> None:
    """The outside file keeps its content whatever the sandbox does with its workspace
    name (tests/test_links.py has the rest: git, denied files, stale answers)."""
    secret = layout.root / "secret.txt"
    secret.write_text("SECRET-VALUE\n")
    secret.chmod(0o600)
    public = layout.root / "public.txt"
    public.write_text("public\n")
    public.chmod(0o644)
    os.link(secret, layout.workspace / "sec-link")
    os.link(public, layout.workspace / "pub-link")
    # A file linked between two writable roots is explained: it stays shared.
    (layout.cache / "shared.txt").write_text("cache\n")
    os.link(layout.cache / "shared.txt", layout.workspace / "from-cache")
    res = _attempts(
        layout,
        """
attempt('write_secret', lambda: open('sec-link', 'a').write('x'))
attempt('write_public', lambda: open('pub-link', 'a').write('x'))
attempt('write_cache_link', lambda: open('from-cache', 'a').write('inside\\n'))
attempt('read_public', lambda: open('pub-link').read())
""",
    )
    assert res == {
        "write_secret": "ALLOWED",
        "write_public": "ALLOWED",
        "write_cache_link": "ALLOWED",
        "read_public": "public\nx",
    }, res
    assert secret.read_text() == "SECRET-VALUE\n" and public.read_text() == "public\n"
    assert (layout.workspace / "pub-link").read_text() == "public\nx"
    assert (layout.cache / "shared.txt").read_text() == "cache\ninside\n"


# --- 2: git on the host never runs what a sandbox wrote; git inside keeps working -------


@pytest.fixture
def repo(layout: Layout, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A repository in the workspace, made on the host; warren's git stores private to
    the test."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    (layout.root / "githome").mkdir()
    ws = layout.workspace
    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "first"]):
        assert host_git(ws, *args).returncode == 0
    return ws


def test_host_git_never_runs_what_a_sandbox_wrote(layout: Layout, repo: Path) -> None:
    marker = host_marker()
    evil = f"#!/bin/sh\ntouch {marker}-$(basename $0)\nexit 0\n"
    script = f"""
set -e
printf '{evil}' > evil.sh && chmod +x evil.sh
mkdir -p evilhooks && cp evil.sh evilhooks/pre-commit && cp evil.sh evilhooks/post-checkout
for h in pre-commit post-checkout post-commit reference-transaction; do
  cp evil.sh .git/hooks/$h
done
git config core.fsmonitor "$PWD/evil.sh"
git config core.hooksPath "$PWD/evilhooks"
git config core.pager "$PWD/evil.sh"
git config alias.st "!$PWD/evil.sh"
git config filter.x.clean "$PWD/evil.sh"
printf '[core]\\n\\tsshCommand = {marker}-ssh\\n[include]\\n\\tpath = {repo}/evil.cfg\\n' >> .git/config
printf '[core]\\n\\tfsmonitor = {repo}/evil.sh\\n' > evil.cfg
echo '* filter=x' > .git/info/attributes
git config user.name Inside
git remote add origin https://example.invalid/r.git
git config user.name
"""
    r = layout.run(["sh", "-c", script])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("Inside")
    # The host, as a user and an IDE would use it:
    for args in (
        ["status"],
        ["add", "-A"],
        ["commit", "-q", "-m", "host"],
        ["checkout", "-q", "-b", "topic"],
        ["log", "-1"],
        ["diff", "HEAD~1"],
        ["st"],
    ):
        host_git(repo, *args)
    assert not list(Path("/tmp").glob(marker.name + "*")), "host git ran a program the sandbox wrote"
    host_config = host_git(repo, "config", "--list", "--show-origin").stdout
    for key in ("fsmonitor", "hookspath", "pager", "alias", "filter", "sshcommand", "include"):
        assert key not in host_config.lower(), host_config
    # What only names things reached the host: the remote and the name set inside.
    assert host_git(repo, "config", "remote.origin.url").stdout.strip() == "https://example.invalid/r.git"
    assert host_git(repo, "config", "user.name").stdout.strip() == "Inside"


def test_a_git_directory_planted_through_commondir_is_removed(layout: Layout, repo: Path) -> None:
    """``.git/commondir`` would point host git at a config and hooks the sandbox wrote."""
    marker = host_marker()
    script = f"""
set -e
cp -r .git/. planted
printf '#!/bin/sh\ntouch {marker}\n' > planted/hooks/post-checkout
printf '#!/bin/sh\ntouch {marker}\n' > planted/fsmon
chmod +x planted/hooks/post-checkout planted/fsmon
git config --file planted/config core.fsmonitor "$PWD/planted/fsmon"
echo "$PWD/planted" > .git/commondir
"""
    r = layout.run(["sh", "-c", script])
    assert r.returncode == 0, r.stderr
    for args in (["status"], ["checkout", "-q", "-b", "topic"]):
        host_git(repo, *args)
    assert not marker.exists(), "host git ran a program the sandbox wrote"
    assert not (repo / ".git" / "commondir").exists()


def test_the_host_rewriting_its_config_leaves_a_live_sandbox_protected(
    layout: Layout, repo: Path, via: str
) -> None:
    """Host git replaces .git/config by a rename, which detaches a bind on it in every
    sandbox; the supervisor binds the store again."""
    if via == "run":
        pytest.skip("needs a sandbox alive across host commands")
    name = f"gitlive{os.getpid()}"
    assert run_cli(["create", name], cwd=repo).returncode == 0
    try:
        assert host_git(repo, "config", "core.editor", "vi").returncode == 0  # rename on the host
        time.sleep(1.0)  # the supervisor checks every quarter second
        r = run_cli(
            ["exec", name, "sh", "-c", "printf '[core]\\n\\tfsmonitor = /x/evil\\n' >> .git/config"], cwd=repo
        )
        assert r.returncode == 0, r.stderr
        assert "evil" not in (repo / ".git" / "config").read_text()
        assert host_git(repo, "config", "core.editor").stdout.strip() == "vi"  # the host's own change
        inside = run_cli(["exec", name, "git", "config", "core.fsmonitor"], cwd=repo)
        assert inside.stdout.strip() == "/x/evil"
    finally:
        run_cli(["rm", "-f", name], cwd=repo)


def test_git_inside_keeps_working_across_runs(layout: Layout, repo: Path) -> None:
    hook = '#!/bin/sh\necho fired >> "$(git rev-parse --show-toplevel)/hook-log"\n'
    first = layout.run(
        [
            "sh",
            "-c",
            f"set -e; printf '{hook}' > .git/hooks/post-commit; chmod +x .git/hooks/post-commit;"
            "git config user.name Agent; git config user.email agent@example.com;"
            "git commit -q --allow-empty -m one; git config --get user.name",
        ]
    )
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "Agent"
    assert (repo / "hook-log").read_text() == "fired\n"
    # On the host the sandbox's hook does not fire ...
    assert host_git(repo, "commit", "-q", "--allow-empty", "-m", "host").returncode == 0
    assert (repo / "hook-log").read_text() == "fired\n"
    # ... and in a later sandbox run it does, with the config set before.
    later = layout.run(
        [
            "sh",
            "-c",
            "set -e; git commit -q --allow-empty -m two; git log -1 --format=%an;"
            "git worktree add -q -b feature wt; cd wt; echo x > f; git add f; git commit -q -m three;"
            "git log -1 --format=%s",
        ]
    )
    assert later.returncode == 0, later.stderr
    assert later.stdout.split() == ["Agent", "three"]
    assert (repo / "hook-log").read_text() == "fired\nfired\n"
    assert (repo / "wt" / "hook-log").read_text() == "fired\n"  # the worktree's commit
    log = host_git(repo, "log", "--all", "--format=%s").stdout.split()
    assert {"one", "two", "three", "host"} <= set(log)


# --- 5: a workspace replaced on the host is followed by a live sandbox ---------------------


@pytest.mark.parametrize("how", ["rm", "mv"])
def test_a_workspace_replaced_on_the_host_is_followed(any_layout: Layout, via: str, how: str) -> None:
    if via == "run":
        pytest.skip("needs a sandbox alive across the replacement")
    ws = any_layout.workspace
    name = f"follow{os.getpid()}{how}"
    assert run_cli(["create", name], cwd=ws).returncode == 0
    try:
        if how == "rm":
            subprocess.run(["rm", "-rf", str(ws)], check=True)
        else:
            ws.rename(ws.with_name("W.old"))
        ws.mkdir()
        r = run_cli(
            ["exec", "--cwd", str(ws), name, "sh", "-c", "echo new > made-inside; cat made-inside"], cwd=ws
        )
        if any_layout.root.is_relative_to("/tmp"):
            # Grafted into the sandbox's private /tmp: the new directory is out of reach,
            # and the error says so with a hint that works.
            assert r.returncode == 125, r.stderr
            assert "was replaced on the host" in r.stderr and f"warren rm -f {name}" in r.stderr
            return
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "new"
        assert (ws / "made-inside").read_text() == "new\n"  # judged on the host
        if how == "mv":
            assert not (ws.with_name("W.old") / "made-inside").exists()
    finally:
        run_cli(["rm", "-f", name], cwd=any_layout.root)


# --- 7: pathname unix sockets outside the sandbox's own places ----------------------------


def test_host_unix_sockets_are_unreachable_and_own_ones_work(layout: Layout) -> None:
    """Landlock covers pathname sockets only from ABI 9: PID 1's broker decides connect
    and addressed sends by the socket file reached. Judged from the host listener."""
    where = Path(tempfile.mkdtemp(prefix="warren-sock-", dir="/var/tmp"))  # visible inside, read-only
    try:
        stream = socket.socket(socket.AF_UNIX)
        stream.bind(str(where / "s"))
        stream.listen()
        stream.settimeout(0.5)
        dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        dgram.bind(str(where / "d"))
        dgram.settimeout(0.5)
        os.chmod(where, 0o755)
        for p in ("s", "d"):
            os.chmod(where / p, 0o777)
        res = _attempts(
            layout,
            f"""
import socket
def conn(path, relative=False):
    s = socket.socket(socket.AF_UNIX)
    if relative:
        os.chdir(os.path.dirname(path)); path = os.path.basename(path)
    s.connect(path)
def send(path):
    socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b'leak', path)
def sendmsg(path):
    socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendmsg([b'leak'], [], 0, path)
here = os.getcwd()
attempt('connect', lambda: conn({str(where / "s")!r}))
attempt('connect_relative', lambda: conn({str(where / "s")!r}, True))
os.chdir(here)
attempt('sendto', lambda: send({str(where / "d")!r}))
attempt('sendmsg', lambda: sendmsg({str(where / "d")!r}))
def own(base):
    l = socket.socket(socket.AF_UNIX); l.bind(base + '/own.sock'); l.listen()
    c = socket.socket(socket.AF_UNIX); c.connect(base + '/own.sock'); c.send(b'x')
    a, _ = l.accept(); assert a.recv(1) == b'x'
    d = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); d.bind(base + '/own.dg')
    socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b'y', base + '/own.dg')
    assert d.recv(1) == b'y'
    os.unlink(base + '/own.sock'); os.unlink(base + '/own.dg')
attempt('own_in_workspace', lambda: own(here))
attempt('own_in_tmpdir', lambda: own(os.environ.get('TMPDIR', '/tmp')))
def own_abstract():
    l = socket.socket(socket.AF_UNIX); l.bind('\\0warren-test'); l.listen()
    socket.socket(socket.AF_UNIX).connect('\\0warren-test')
attempt('abstract', own_abstract)
attempt('tcp_to_nowhere', lambda: socket.create_connection(('127.0.0.1', 9), timeout=1))
""",
        )
        assert res["connect"] == "EACCES" and res["connect_relative"] == "EACCES", res
        assert res["sendto"] == "EACCES" and res["sendmsg"] == "EACCES", res
        assert res["own_in_workspace"] == "ALLOWED" and res["own_in_tmpdir"] == "ALLOWED", res
        assert res["abstract"] == "ALLOWED", res
        assert res["tcp_to_nowhere"] == "ECONNREFUSED", res  # other families go on unchanged
        with pytest.raises(TimeoutError):
            stream.accept()
        with pytest.raises(TimeoutError):
            dgram.recv(16)
    finally:
        shutil.rmtree(where, ignore_errors=True)


# --- 3, 4, 8, 9, 11 --------------------------------------------------------------------------


def test_a_broad_workspace_is_refused(tmp_path: Path, via: str) -> None:
    if via == "exec":
        pytest.skip("refused before any launch: one path is enough")
    marker = Path(f"/usr/local/warren-broad-{uuid.uuid4().hex}")
    for cwd, flags in ((Path("/"), []), (Path.home(), []), (tmp_path, ["--write", "/etc"])):
        r = run_cli(["run", *flags, "--", "touch", str(marker)], cwd=cwd)
        assert r.returncode == 125, (cwd, r.stderr)
        assert "too broad" in r.stderr and "--allow-broad-workspace" in r.stderr
        assert not marker.exists()


def test_denied_paths_fail_with_eacces_and_keep_their_content(layout: Layout) -> None:
    secret = layout.root / "token.txt"
    secret.write_text("TOKEN")
    secret_dir = layout.root / "keys"
    secret_dir.mkdir()
    (secret_dir / "k").write_text("KEY")
    inner = layout.workspace / ".env"
    inner.write_text("INNER")
    res = _attempts(
        layout,
        f"""
for p in ({str(secret)!r}, {str(inner)!r}):
    attempt('read ' + p, lambda: open(p).read())
    attempt('write ' + p, lambda: open(p, 'w').write('x'))
attempt('list dir', lambda: str(os.listdir({str(secret_dir)!r})))
attempt('read in dir', lambda: open({str(secret_dir / "k")!r}).read())
""",
        "--deny",
        str(secret),
        "--deny",
        str(inner),
        "--deny",
        str(secret_dir),
    )
    for name, outcome in res.items():
        if name == "list dir":
            assert outcome in ("EACCES", "[]"), res  # a read-only empty directory in its place
        else:
            assert outcome == "EACCES" or (name == "read in dir" and outcome == "ENOENT"), res
    assert secret.read_text() == "TOKEN" and inner.read_text() == "INNER"
    assert (secret_dir / "k").read_text() == "KEY"


CREDENTIALS = (
    ".npmrc",
    ".claude/.credentials.json",
    ".cargo/credentials.toml",
    ".azure/accessTokens.json",
    ".config/hub",
    ".terraform.d/credentials.tfrc.json",
    ".vault-token",
    ".local/share/keyrings/login.keyring",
    ".aws/credentials",
    ".git-credentials",
    ".config/gh/hosts.yml",
    ".docker/config.json",
    ".kube/config",
    ".pypirc",
    ".netrc",
    ".ssh/id_ed25519",
    ".config/gcloud/credentials.db",
)


def test_credential_stores_are_unreadable_even_when_made_later(tmp_path: Path, via: str) -> None:
    """Planted dummy credentials, some before the sandbox exists and some after (item 11):
    no token is printed."""
    home = tmp_path / "home"
    ws = tmp_path / "ws"
    ws.mkdir()
    early, late = CREDENTIALS[::2], CREDENTIALS[1::2]
    for rel in early:
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text(f"TOKEN-{rel}")
    env = {"HOME": str(home)}
    script = (
        "for f in " + " ".join(f"'{home / rel}'" for rel in CREDENTIALS) + '; do cat "$f"; done; echo end'
    )
    name = f"creds{os.getpid()}"
    if via == "exec":
        assert run_cli(["create", name], cwd=ws, env=env).returncode == 0
    try:
        for rel in late:
            (home / rel).parent.mkdir(parents=True, exist_ok=True)
            (home / rel).write_text(f"TOKEN-{rel}")
        args = ["exec", name, "sh", "-c", script] if via == "exec" else ["run", "--", "sh", "-c", script]
        r = run_cli(args, cwd=ws, env=env)
        assert r.stdout.strip().endswith("end"), r.stderr
        assert "TOKEN-" not in r.stdout, r.stdout
    finally:
        if via == "exec":
            run_cli(["rm", "-f", name], cwd=ws, env=env)


def test_no_setuid_file_can_be_made(layout: Layout) -> None:
    res = _attempts(
        layout,
        """
import shutil
shutil.copy('/bin/sh', 'suidsh')
attempt('chmod', lambda: os.chmod('suidsh', 0o4755))
attempt('chmod_setgid', lambda: os.chmod('suidsh', 0o2755))
attempt('fchmod', lambda: os.fchmod(os.open('suidsh', os.O_RDONLY), 0o4755))
attempt('open_mode', lambda: os.close(os.open('made', os.O_CREAT | os.O_WRONLY, 0o4755)))
attempt('mkdir_mode', lambda: os.mkdir('d', 0o2755))
""",
    )
    for _name, outcome in res.items():
        assert outcome == "EPERM", res
    for p in layout.workspace.iterdir():
        assert not p.stat().st_mode & 0o6000, p


def test_plan_shows_git_protection_hardlink_copies_and_the_socket_rule(
    layout: Layout, repo: Path, via: str, state_home: Path
) -> None:
    if via == "exec":
        pytest.skip("the plan is the same for both")
    secret = layout.root / "secret"
    secret.write_text("s")
    secret.chmod(0o600)
    os.link(secret, repo / "linked")
    r = run_cli(["plan"], cwd=repo)
    assert r.returncode == 0, r.stderr
    assert f"{repo}/.git: its top level inside (config, hooks, HEAD, index) is" in r.stdout
    assert "shared with the host: " in r.stdout and "objects" in r.stdout
    assert f"own inode {repo}/linked" in r.stdout
    assert "unix sockets: connect/sendto/sendmsg to a pathname socket only inside" in r.stdout
    assert "metadata: chmod, utimensat, xattrs only inside" in r.stdout


SYSTEM_SECRETS = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/security/opasswd")


@pytest.fixture
def host_key() -> Iterator[Path | None]:
    """A dummy SSH host key pair in /etc/ssh matched only by the ``ssh_host_*_key`` glob
    (root only: nobody else may write there), removed afterwards."""
    if os.getuid() != 0:
        yield None
        return
    key = Path(f"/etc/ssh/ssh_host_warrentest{os.getpid()}_key")
    pub = key.with_name(key.name + ".pub")
    # Every sandbox's plan changes while it exists: none of tests/test_ahead.py's runs then.
    with host_files(exclusive=True):
        key.parent.mkdir(exist_ok=True)
        key.write_text("HOSTKEY-PRIVATE-MARKER\n")
        key.chmod(0o600)
        pub.write_text("ssh-ed25519 HOSTKEY-PUBLIC-MARKER\n")
        try:
            yield key
        finally:
            key.unlink(missing_ok=True)
            pub.unlink(missing_ok=True)


def test_system_secrets_are_hidden_from_a_root_callers_sandbox(layout: Layout, host_key: Path | None) -> None:
    """Password hashes, sudo rules and SSH host private keys print nothing in a
    sandbox; with --no-default-deny (the control) a root caller reads them, so the test
    could see the attack succeed. For uid 1001 permissions already refuse them: the
    deny list must not break anything it can read (passwd, ssh_config, the .pub)."""
    secrets_ = [p for p in SYSTEM_SECRETS if os.path.exists(p)]
    assert "/etc/shadow" in secrets_
    keys = [str(host_key)] if host_key else []
    pubs = [str(host_key) + ".pub"] if host_key else []
    script = (
        "for f in "
        + " ".join(f"'{p}'" for p in [*secrets_, *keys])
        + '; do cat "$f" 2>/dev/null && echo "READ $f"; done; '
        + "for f in /etc/passwd "
        + " ".join(f"'{p}'" for p in pubs)
        + '; do cat "$f" >/dev/null && echo "PUBLIC $f"; done; echo end'
    )
    hidden = layout.run(["sh", "-c", script])
    shown = layout.run(["sh", "-c", script], "--no-default-deny")
    assert hidden.returncode == 0 and hidden.stdout.strip().endswith("end"), hidden.stderr
    assert "READ " not in hidden.stdout and "HOSTKEY-PRIVATE-MARKER" not in hidden.stdout, hidden.stdout
    assert "root:" not in hidden.stdout, hidden.stdout
    for p in ["/etc/passwd", *pubs]:
        assert f"PUBLIC {p}" in hidden.stdout, hidden.stdout
    if os.getuid() == 0:
        # The control: the same command without the default deny list reads them all.
        assert "READ /etc/shadow" in shown.stdout and "root:" in shown.stdout, shown.stdout
        assert "HOSTKEY-PRIVATE-MARKER" in shown.stdout, shown.stdout
    else:
        assert "READ /etc/shadow" not in shown.stdout, shown.stdout  # file permissions, not warren


def test_the_host_key_glob_is_expanded_and_the_usual_names_are_listed() -> None:
    from warren.policy.model import SYSTEM_DENIED
    from warren.policy.resolve import system_denied

    got = system_denied(("/etc/ssh/ssh_host_*_key", "/etc/shadow"))
    assert "/etc/shadow" in got and all("*" not in p for p in got)
    assert all(p.endswith("_key") for p in got if p.startswith("/etc/ssh/"))
    assert "/etc/ssh/ssh_host_ed25519_key" in SYSTEM_DENIED  # hidden even when made later
    assert not any(p.endswith(".pub") for p in system_denied())
