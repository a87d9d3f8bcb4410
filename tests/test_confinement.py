"""What the sandbox must NOT be able to do: each claim is tested by attempting it."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import WARREN, Layout
from warren._core import credsend, nativeinit

# Runs inside the sandbox: try each operation, report errno names as JSON.
ATTEMPT = r"""
import errno, json, os, sys
results = {}
def attempt(name, fn):
    try:
        fn()
        results[name] = "ALLOWED"
    except OSError as e:
        results[name] = errno.errorcode.get(e.errno, str(e.errno))
"""


def _attempts(layout: Layout, body: str, *flags: str) -> dict[str, str]:
    r = layout.py(ATTEMPT + body + "\nprint(json.dumps(results))", *flags)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


DENIED = {"EROFS", "EACCES", "EPERM"}


@pytest.fixture(autouse=True, params=["run", "exec"])
def via(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every claim here holds for a one-shot `warren run` and for `warren exec` in a
    long-lived sandbox: one suite over both launch paths, so neither can drift."""
    monkeypatch.setattr(Layout, "via", request.param)
    return str(request.param)


def test_writes_outside_the_writable_roots_fail(any_layout: Layout) -> None:
    outside = str(any_layout.outside)
    parent = str(any_layout.root)
    res = _attempts(
        any_layout,
        f"""
open('inside.txt', 'w').write('x')
attempt('write', lambda: open({outside!r}, 'a').write('x'))
attempt('truncate', lambda: os.truncate({outside!r}, 0))
attempt('chmod', lambda: os.chmod({outside!r}, 0o777))
attempt('utimes', lambda: os.utime({outside!r}, (0, 0)))
attempt('setxattr', lambda: os.setxattr({outside!r}, 'user.warren', b'1'))
attempt('unlink', lambda: os.unlink({outside!r}))
attempt('create_in_parent', lambda: open({parent!r} + '/new.txt', 'w'))
attempt('mkdir_in_parent', lambda: os.mkdir({parent!r} + '/newdir'))
attempt('rename_out', lambda: os.rename('inside.txt', {parent!r} + '/escaped.txt'))
attempt('symlink_in_parent', lambda: os.symlink('/etc/passwd', {parent!r} + '/ln'))
attempt('write_usr', lambda: open('/usr/warren-test', 'w'))
attempt('write_etc', lambda: open('/etc/passwd', 'a'))
""",
    )
    # Moving a file out may also fail as EXDEV (cross-mount), which is still a refusal.
    assert res.pop("rename_out") in DENIED | {"EXDEV"}
    for name, outcome in res.items():
        assert outcome in DENIED, f"{name}: {outcome}"
    st = any_layout.outside.stat()
    assert any_layout.outside.read_text() == "keep me\n"
    assert st.st_mode & 0o777 != 0o777 and st.st_mtime > 0
    assert sorted(p.name for p in any_layout.root.iterdir()) == ["C", "W", "outside.txt"]
    assert (any_layout.workspace / "inside.txt").exists()


def test_kernel_tunables_are_not_writable(layout: Layout) -> None:
    res = _attempts(
        layout,
        """
attempt('sysctl', lambda: open('/proc/sys/kernel/hostname', 'w').write('pwned'))
attempt('sysrq', lambda: open('/proc/sysrq-trigger', 'w').write('h'))
attempt('sys', lambda: open('/sys/kernel/uevent_helper', 'w').write('x'))
""",
    )
    for name, outcome in res.items():
        assert outcome in DENIED | {"ENOENT"}, f"{name}: {outcome}"
    assert socket.gethostname() != "pwned"


def test_denied_path_is_unreadable(layout: Layout) -> None:
    secret_dir = layout.root / "secrets"
    secret_dir.mkdir()
    (secret_dir / "key").write_text("TOP SECRET")
    secret_file = layout.root / "token.txt"
    secret_file.write_text("TOKEN")
    r = layout.run(
        ["sh", "-c", f"ls -A {secret_dir}; cat {secret_dir}/key; cat {secret_file}; echo done"],
        "--deny",
        str(secret_dir),
        "--deny",
        str(secret_file),
    )
    assert "TOP SECRET" not in r.stdout and "TOKEN" not in r.stdout
    assert r.stdout.strip().endswith("done")


def test_a_denied_path_beneath_a_read_only_graft_under_tmp_stays_hidden(layout: Layout) -> None:
    """Under /tmp the sandbox gets a fresh directory and ``--read`` grafts the host's
    directory into it: what is denied beneath the graft (a --deny, warren's own state or
    image store) must be hidden there too. Control: the rest of the graft is seen."""
    shared = layout.root / "shared"  # beside the writable roots, not around them
    secret_dir = shared / "secrets"
    secret_dir.mkdir(parents=True)
    (secret_dir / "key").write_text("TOP SECRET")
    secret_file = shared / "token.txt"
    secret_file.write_text("TOKEN")
    (shared / "seen.txt").write_text("SEEN")
    r = layout.run(
        ["sh", "-c", f"cat {secret_dir}/key; cat {secret_file}; cat {shared}/seen.txt; echo done"],
        "--read",
        str(shared),
        "--deny",
        str(secret_dir),
        "--deny",
        str(secret_file),
    )
    assert "TOP SECRET" not in r.stdout and "TOKEN" not in r.stdout
    assert "SEEN" in r.stdout and r.stdout.strip().endswith("done"), r.stdout


def test_a_workspace_inside_a_read_only_graft_under_tmp_stays_writable(tmp_path: Path) -> None:
    """``--read`` of the directory around the workspace (under /tmp: grafted into a
    fresh directory) must not cover the workspace's own writable bind."""
    from conftest import run_cli

    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "beside.txt").write_text("BESIDE\n")
    r = run_cli(
        ["run", "-w", str(ws), "--read", str(tmp_path), "--", "sh", "-c", f"cat {tmp_path}/beside.txt > out"],
        cwd=ws,
    )
    assert r.returncode == 0 and (ws / "out").read_text() == "BESIDE\n", r.stderr


def test_default_deny_hides_credentials_in_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY")
    ws = tmp_path / "ws"
    ws.mkdir()
    from conftest import run_cli

    r = run_cli(
        ["run", "--", "sh", "-c", f"cat {home}/.ssh/id_ed25519; echo end"], cwd=ws, env={"HOME": str(home)}
    )
    assert "PRIVATE KEY" not in r.stdout
    assert r.stdout.strip().endswith("end")


def test_run_and_var_run_are_empty_and_host_sockets_unreachable(layout: Layout, tmp_path: Path) -> None:
    # A pathname socket on the host in /tmp (outside the workspace) and, as root, in /run.
    paths = [tmp_path / "host.sock"]
    if os.getuid() == 0:
        paths.append(Path(f"/run/warren-test-{os.getpid()}.sock"))
    servers = []
    for p in paths:
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(p))
        s.listen()
        servers.append(s)
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(f"\0warren-test-{os.getpid()}")
    abstract.listen()
    try:
        connects = "\n".join(
            f"attempt('connect {p}', lambda: socket.socket(socket.AF_UNIX).connect({str(p)!r}))"
            for p in paths
        )
        res = _attempts(
            layout,
            f"""
import socket
attempt('connect abstract', lambda: socket.socket(socket.AF_UNIX).connect('\\0warren-test-{os.getpid()}'))
{connects}
results['run'] = os.listdir('/run')
results['var_run'] = os.listdir('/var/run')
""",
        )
    finally:
        for s in (*servers, abstract):
            s.close()
        for p in paths:
            p.unlink(missing_ok=True)
    assert res.pop("run") == [] and res.pop("var_run") == []
    for name, outcome in res.items():
        assert outcome in {"ENOENT", "ECONNREFUSED", "EACCES", "EPERM"}, f"{name}: {outcome}"


def test_proc_shows_only_sandbox_processes(layout: Layout) -> None:
    r = layout.py("import os; print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")
    assert r.returncode == 0, r.stderr
    pids = json.loads(r.stdout)
    # PID 1, its credentials sender (pid 2, where it was built: _core.credsend; its
    # broker's thread and the broker's kept worker took the next two pids), the exec
    # helper, the command; in a long-lived sandbox also the helper and the command's
    # process forked ahead of the next exec (a sandbox booted ahead may have let a spare
    # go and forked another, a few pids on). Nothing of the host's.
    # Where PID 1 became the native init, the keeper it forked comes right after the sender.
    sender = [2] if credsend.program() else []
    keeper = [2 + len(sender)] if nativeinit.program() else []
    prefix = [1, *sender, *keeper]
    rest = pids[len(prefix) :]
    assert pids[: len(prefix)] == prefix, pids
    assert all(4 <= p < 32 for p in rest) and len(rest) <= 5, pids
    assert os.getpid() not in pids or os.getpid() <= 4


@pytest.fixture(scope="session")
def setuid_probe() -> Iterator[Path]:
    """A setuid-root program that prints its euid and effective capabilities, in a private
    directory under /var/tmp (the sandbox shows the host's /var/tmp; its /tmp is its own),
    removed at the end. Only root can make one, so the root run also tries it as uid 1001."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make a setuid-root program; the root run tries it as uid 1001 too")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("a C compiler is needed to build the setuid probe (scripts/setup installs gcc)")
    where = Path(tempfile.mkdtemp(prefix="warren-setuid-", dir="/var/tmp"))
    try:
        where.chmod(0o755)
        src, path = where / "probe.c", where / "probe"
        src.write_text(
            "#include <stdio.h>\n#include <unistd.h>\n"
            'int main(void){char l[256];FILE*f=fopen("/proc/self/status","r");'
            'printf("euid=%d\\n",(int)geteuid());'
            'while(fgets(l,sizeof l,f)) if(!__builtin_strncmp(l,"CapEff",6)) fputs(l,stdout);return 0;}\n'
        )
        subprocess.run([cc, "-O0", "-o", str(path), str(src)], check=True)
        os.chown(path, 0, 0)
        os.chmod(path, 0o4755)
        yield path
    finally:
        shutil.rmtree(where)


def test_setuid_binary_gains_no_privilege(layout: Layout, setuid_probe: Path) -> None:
    host = subprocess.run([str(setuid_probe)], capture_output=True, text=True, check=True)
    assert "euid=0" in host.stdout  # the probe really is setuid root on the host
    r = layout.run([str(setuid_probe)])
    assert r.returncode == 0, r.stderr
    assert f"euid={os.getuid()}" in r.stdout
    assert "CapEff:\t0000000000000000" in r.stdout


def test_setuid_binary_gains_no_privilege_for_uid_1001(setuid_probe: Path) -> None:
    try:
        user = pwd.getpwuid(1001)
    except KeyError:
        pytest.skip("no user with uid 1001 (scripts/setup creates one)")
    as_user = ["runuser", "-u", user.pw_name, "--"]
    host = subprocess.run([*as_user, str(setuid_probe)], capture_output=True, text=True, check=True)
    assert "euid=0" in host.stdout  # uid 1001 gets root from it on the host
    top = Path(tempfile.mkdtemp(prefix="warren-setuid-user-"))
    try:
        top.chmod(0o755)
        ws = top / "ws"
        ws.mkdir()
        for path in (top, ws):
            os.chown(path, 1001, user.pw_gid)
        keep = [f"{k}={v}" for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "LANG")]
        env = ["env", "-i", *keep, f"HOME={top}", f"XDG_STATE_HOME={top}/state", "PYTHONDONTWRITEBYTECODE=1"]
        r = subprocess.run(
            [*as_user, *env, *WARREN, "run", "--", str(setuid_probe)],
            cwd=ws,
            capture_output=True,
            text=True,
            timeout=120,
        )
        subprocess.run([*as_user, *env, *WARREN, "shutdown"], cwd=ws, capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert "euid=1001" in r.stdout
        assert "CapEff:\t0000000000000000" in r.stdout
    finally:
        # The supervisor that `shutdown` ended may still be closing its database (its
        # WAL file goes as it exits): a file gone meanwhile is no failure.
        shutil.rmtree(top, onerror=_gone_is_fine)


def _gone_is_fine(_func: object, _path: str, exc_info: tuple[type, BaseException, object]) -> None:
    if not isinstance(exc_info[1], FileNotFoundError):
        raise exc_info[1]


def test_outbound_network_fails(layout: Layout) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    accepted: list[object] = []
    server.settimeout(3)
    t = threading.Thread(target=lambda: accepted.append(_accept(server)), daemon=True)
    t.start()
    try:
        res = _attempts(
            layout,
            f"""
import socket
attempt('host loopback', lambda: socket.create_connection(('127.0.0.1', {port}), timeout=2))
attempt('internet', lambda: socket.create_connection(('1.1.1.1', 443), timeout=2))
attempt('dns', lambda: socket.getaddrinfo('pypi.org', 443))
results['ifaces'] = sorted(n for _, n in socket.if_nameindex())
""",
        )
    finally:
        t.join()
        server.close()
    assert res.pop("ifaces") == ["lo"]
    for name, outcome in res.items():
        assert outcome != "ALLOWED", name
    assert accepted == [None], "the host's loopback server must not see a connection"


def _accept(server: socket.socket) -> object:
    try:
        conn, _ = server.accept()
        conn.close()
        return "connected"
    except TimeoutError:
        return None


def test_kernel_attack_surface_is_closed(layout: Layout) -> None:
    res = _attempts(
        layout,
        """
import ctypes, fcntl, termios
libc = ctypes.CDLL(None, use_errno=True)
def sc(*args):
    def f():
        if libc.syscall(*args) < 0:
            e = ctypes.get_errno(); raise OSError(e, os.strerror(e))
    return f
attempt('unshare user', sc(272, 0x10000000))
attempt('keyctl', sc(250, 0, 0, 0))
attempt('io_uring_setup', sc(425, 1, ctypes.create_string_buffer(120)))
attempt('bpf', sc(321, 0, 0, 0))
attempt('perf_event_open', sc(298, 0, 0, -1, -1, 0))
attempt('mount', sc(165, b'none', b'/tmp', b'tmpfs', 0, 0))
attempt('umount', sc(166, b'/run', 2))
import pty
master, replica = pty.openpty()
attempt('TIOCSTI', lambda: fcntl.ioctl(replica, termios.TIOCSTI, b'x'))
""",
    )
    for name, outcome in res.items():
        assert outcome in {"EPERM", "ENOSYS", "EACCES"}, f"{name}: {outcome}"


def test_new_user_namespace_is_refused(layout: Layout) -> None:
    r = layout.run(["sh", "-c", "unshare -Ur true; echo status=$?"])
    assert "status=0" not in r.stdout


def test_ancestor_metadata_cannot_be_changed(any_layout: Layout) -> None:
    """The ancestors of the writable roots are on the shared mount, where Landlock does
    not cover chmod/utimes/xattrs: PID 1's broker refuses them (by the object, not the
    path), inside the roots they work."""
    parent = any_layout.root
    before = parent.stat()
    res = _attempts(
        any_layout,
        f"""
attempt('chmod', lambda: os.chmod({str(parent)!r}, 0o777))
attempt('chmod_fd', lambda: os.fchmod(os.open({str(parent)!r}, os.O_RDONLY), 0o777))
attempt('chmod_setuid_dir', lambda: os.chmod({str(parent)!r}, 0o4777))
attempt('utime', lambda: os.utime({str(parent)!r}, (0, 0)))
attempt('utime_fd', lambda: os.utime(os.open({str(parent)!r}, os.O_RDONLY), (0, 0)))
attempt('setxattr', lambda: os.setxattr({str(parent)!r}, 'user.warren', b'1'))
attempt('chmod_outside_file', lambda: os.chmod({str(any_layout.outside)!r}, 0o777))
attempt('chmod_inside', lambda: os.chmod('.', 0o755))
attempt('utime_inside', lambda: os.utime('.', (0, 0)))
""",
    )
    assert res.pop("chmod_inside") == "ALLOWED" and res.pop("utime_inside") == "ALLOWED", res
    for name, outcome in res.items():
        assert outcome in DENIED, f"{name}: {outcome}"
    after = parent.stat()
    assert after.st_mode == before.st_mode
    assert after.st_mtime_ns == before.st_mtime_ns
    assert stat.S_IMODE(any_layout.outside.stat().st_mode) != 0o777


def test_read_flag_makes_a_path_inside_the_workspace_read_only(layout: Layout) -> None:
    protected = layout.workspace / ".git"
    protected.mkdir()
    (protected / "config").write_text("[core]\n")
    res = _attempts(
        layout,
        f"""
attempt('write', lambda: open({str(protected / "config")!r}, 'a').write('x'))
attempt('create', lambda: open({str(protected / "new")!r}, 'w'))
open('still-writable', 'w').write('ok')
""",
        "--read",
        str(protected),
    )
    assert res == {"write": "EROFS", "create": "EROFS"}
    assert (protected / "config").read_text() == "[core]\n"
    assert (layout.workspace / "still-writable").read_text() == "ok"
