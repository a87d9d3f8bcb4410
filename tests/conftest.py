"""Shared fixtures. The suite runs as whoever invokes pytest: CI runs it once as root
and once as an unprivileged user with uid 1001 (scripts/test)."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
import sys
import uuid
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

# The installed `warren` command (the native front end where it was built, which hands
# everything but plain run/exec to the Python CLI), as a user types it.
_INSTALLED = Path(sys.executable).parent / "warren"
WARREN = [str(_INSTALLED)] if _INSTALLED.exists() else [sys.executable, "-m", "warren"]


# scripts/test runs the suite twice, as root and as uid 1001; a test marked
# ``caller_independent`` checks something that does not depend on who calls (the HTTP
# API's contract fuzzed, the documents) and costs a lot: one half of that pair runs it
# (``half="user"``, the default, or ``half="root"``, to even out the halves' times) and
# the other leaves it, saying so. Run on its own (plain pytest, as anyone), it runs.
PAIRED = os.environ.get("WARREN_TEST_PAIRED", "")


def need_tool(name: str, for_what: str) -> None:
    """Skip, saying why, where the program ``name`` is not installed — unless this run is
    scripts/test's (``WARREN_TEST_ALL_TOOLS=1``), whose setup installs it: there a
    missing tool is a failure, never a quiet skip."""
    if shutil.which(name) is not None:
        return
    why = f"{name} is not installed ({for_what}; scripts/setup installs it)"
    if os.environ.get("WARREN_TEST_ALL_TOOLS") == "1":
        pytest.fail(why)
    pytest.skip(why)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "caller_independent(half='user'|'root'): what it checks does not depend on the caller"
        " (run by that half of a pair)",
    )


# The longest modules (minutes of one worker: an image built, real projects' suites,
# installers) start first, so that a worker does not begin one of them when the other
# has nothing left (pytest-xdist hands out a file at a time in this order).
LONGEST_FIRST = (
    "test_image_fidelity.py",
    "test_tmpdir.py",
    "test_e2b_api.py",
    "test_install.py",
    "test_service_schema.py",
    "test_real_project.py",
    "test_uploads.py",
    "test_images_debian.py",  # after the other worker has built the image both use
)


def _longest_first(item: pytest.Item) -> int:
    name = item.path.name
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_longest_first)  # stable: the order within a module stays
    if PAIRED not in ("root", "user"):
        return
    for item in items:
        marker = item.get_closest_marker("caller_independent")
        half = marker.kwargs.get("half", "user") if marker else PAIRED
        if half != PAIRED:
            who = "uid-1001" if half == "user" else "root"
            why = f"caller-independent: the {who} half of this paired run runs it"
            item.add_marker(pytest.mark.skip(reason=why))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failing test's report carries the last lines of the log of the supervisor it
    talked to (the state it set in ``XDG_STATE_HOME``, read while the test's environment
    is still set): a sandbox lost in CI says there why."""
    report = yield
    if report.failed and call.when == "call":
        from warren import statedir

        log = Path(statedir.location(os.environ)) / statedir.LOG_FILE
        with contextlib.suppress(OSError):
            tail = log.read_bytes()[-6000:].decode(errors="replace")
            if tail.strip():
                report.sections.append((f"supervisor log {log} (its end)", tail))
    return report


def pytest_report_header() -> str:
    return f"warren tests as uid={os.getuid()} gid={os.getgid()} home={os.environ.get('HOME')}"


_names = itertools.count()


@dataclass
class Layout:
    """A workspace W and a tool cache C on the same host filesystem, side by side,
    plus an ``outside`` file next to them that the sandbox must not change.

    ``via`` says how ``run`` runs a command: "run" (a one-shot ``warren run``) or
    "exec" (``warren create`` with the same flags, ``warren exec``, ``warren rm -f``):
    suites that set it per test cover both launch paths with the same assertions."""

    root: Path
    workspace: Path
    cache: Path
    outside: Path
    via: ClassVar[str] = "run"

    def run(
        self,
        argv: Sequence[str],
        *flags: str,
        stdin: str | None = None,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """`warren run --write C [flags] -- argv` from inside the workspace (or the
        same through a long-lived sandbox, see ``via``)."""
        where = cwd or self.workspace
        if self.via == "run":
            return run_cli(
                ["run", "--write", str(self.cache), *flags, "--", *argv],
                cwd=where,
                stdin=stdin,
                env=env,
                timeout=timeout,
            )
        name = f"t{os.getpid()}-{next(_names)}"
        made = run_cli(
            ["create", "--write", str(self.cache), *flags, name], cwd=where, env=env, timeout=timeout
        )
        if made.returncode != 0:
            return made
        try:
            ran = run_cli(
                ["exec", "--cwd", str(where), name, *argv], cwd=where, stdin=stdin, env=env, timeout=timeout
            )
        finally:
            gone = run_cli(["rm", "-f", name], cwd=where, env=env, timeout=timeout)
        return subprocess.CompletedProcess(ran.args, ran.returncode, ran.stdout, ran.stderr + gone.stderr)

    def py(self, code: str, *flags: str) -> subprocess.CompletedProcess[str]:
        return self.run(["python3", "-c", code], *flags)


# Host git as a user runs it, with a fixed identity and no system config.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
}


# Run in a sandbox: a file made in TMPDIR (tempfile) renamed into the working directory,
# as pip and uv do; prints TMPDIR, then "renamed" or the error's text.
# For a script run inside a sandbox: sendmmsg(2) through ctypes (Python has no binding),
# each datagram one message; returns the call's result and each message's msg_len.
SENDMMSG = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
class iovec(ctypes.Structure):
    _fields_ = [('base', ctypes.c_char_p), ('len', ctypes.c_size_t)]
class msghdr(ctypes.Structure):
    _fields_ = [('name', ctypes.c_void_p), ('namelen', ctypes.c_uint), ('iov', ctypes.POINTER(iovec)),
                ('iovlen', ctypes.c_size_t), ('control', ctypes.c_void_p), ('controllen', ctypes.c_size_t),
                ('flags', ctypes.c_int)]
class mmsghdr(ctypes.Structure):
    _fields_ = [('hdr', msghdr), ('len', ctypes.c_uint)]
def sendmmsg(fd, datagrams):
    iovs = (iovec * len(datagrams))(*(iovec(d, len(d)) for d in datagrams))
    vec = (mmsghdr * len(datagrams))()
    for i in range(len(datagrams)):
        vec[i].hdr.iov = ctypes.pointer(iovs[i]); vec[i].hdr.iovlen = 1
    return libc.sendmmsg(fd, vec, len(datagrams), 0), [m.len for m in vec]
"""
RENAME_FROM_TMPDIR = """
import os, tempfile
fd, name = tempfile.mkstemp()
os.write(fd, b"x"); os.close(fd)
print(os.environ["TMPDIR"])
try:
    os.rename(name, "renamed")
    print("renamed")
except OSError as e:
    print(os.strerror(e.errno))
"""


# Files a test's hostile script would make on the host if warren let it run there. The
# sandbox's /tmp is its own, so one appears in the host's /tmp only from a host program.
_MARKERS = f"warren-git-marker-{os.getpid()}-"


def host_marker() -> Path:
    return Path("/tmp") / f"{_MARKERS}{uuid.uuid4().hex}"


@pytest.fixture(scope="session", autouse=True)
def _private_default_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No test reaches the user's own warren: a test that names no state of its own gets
    this session's (each xdist worker has one), never the default supervisor of the user
    running the suite, which may be another version (a developer's, another checkout's)."""
    home = tmp_path_factory.mktemp("default-state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_STATE_HOME", str(home))
        yield
        subprocess.run(
            [sys.executable, "-m", "warren", "shutdown"], capture_output=True, timeout=60, check=False
        )


@pytest.fixture(scope="session", autouse=True)
def _worker_cgroup() -> Iterator[None]:
    """Under pytest-xdist, a worker in a cgroup2 group delegated to its user (scripts/test
    delegates one to uid 1001, as systemd does for a user's services) moves into a child
    group of its own, as systemd gives each service one: the sandboxes its tests make go
    beneath it, so what a test finds there is its own, never another worker's."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    own = next(
        (line[3:] for line in Path("/proc/self/cgroup").read_text().splitlines() if line.startswith("0::")),
        "/",
    )
    mount = (
        "/sys/fs/cgroup/unified"
        if os.path.exists("/sys/fs/cgroup/unified/cgroup.procs")
        else "/sys/fs/cgroup"
    )
    group = os.path.normpath(f"{mount}{own}")
    if not worker or own == "/" or not os.access(group, os.W_OK):
        yield
        return
    child = os.path.join(group, f"pytest-{worker}")
    try:
        os.makedirs(child, exist_ok=True)
        Path(child, "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        yield
        return
    yield
    with contextlib.suppress(OSError):
        Path(group, "cgroup.procs").write_text(str(os.getpid()))
        os.rmdir(child)


@pytest.fixture(autouse=True)
def _origin_as_it_was() -> Iterator[None]:
    """A test that runs the CLI in this process (``entrypoint(["doctor", ...])``) names
    the whole process's requests "cli" (``origin.set_default``): put back what it was,
    or the library's requests of later tests on this worker are recorded as the CLI's
    (``test_trail`` failed so whenever a doctor test ran before it on its worker)."""
    from warren.client import origin

    before = origin._process[0]
    yield
    origin.set_default(before)


@pytest.fixture(autouse=True)
def _remove_host_markers() -> Iterator[None]:
    """The markers of this run (the positive controls make theirs on purpose) go afterwards."""
    yield
    for marker in Path("/tmp").glob(_MARKERS + "*"):
        marker.unlink(missing_ok=True)


def supervisor_watches() -> int:
    """How many inotify watches this session's supervisor holds (its ``fdinfo``)."""
    from warren.server import statedir

    found = statedir.read_address(statedir.location(os.environ))
    assert found is not None, "no supervisor"
    count = 0
    for fd in os.listdir(f"/proc/{found[1]}/fdinfo"):
        with contextlib.suppress(OSError), open(f"/proc/{found[1]}/fdinfo/{fd}") as f:
            count += sum(line.startswith("inotify wd:") for line in f)
    return count


def large_tree(workspace: Path, dirs: int = 300) -> None:
    """Empty directories enough for the supervisor to watch the workspace's directories
    rather than walk them (``server.gitkeeper.WATCH_FROM``); git ignores them."""
    for i in range(dirs):
        (workspace / "node_modules" / f"p{i}").mkdir(parents=True)


def host_git(where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """git on the host in ``where``, its HOME beside it (``githome``, made by the test)."""
    env = {**os.environ, **GIT_ENV, "HOME": str(where.parent / "githome")}
    return subprocess.run(["git", *args], cwd=where, capture_output=True, text=True, env=env, timeout=60)


def comm(pid: int) -> str:
    """A process's name as the host sees it; "" once it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def sandbox_members() -> list[str]:
    """The names of the processes in the pid namespaces of this test's supervisor's
    sandboxes: its descendants with a pid of their own inside, sorted."""
    from warren._core.procs import descendants
    from warren.server import statedir

    found = statedir.read_address(statedir.location(os.environ))
    if found is None:
        return []
    names = [comm(pid) for pid in descendants(found[1]) if _nspid_depth(pid) > 1]
    return sorted(name for name in names if name)


def memory_holds(pid: int, needle: bytes) -> bool:
    """Whether ``needle`` is anywhere in the writable memory of process ``pid``, read on
    the host through /proc/PID/mem (the caller's own processes, or any as root)."""
    found = False
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("rw"):
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(start)
                data = mem.read(end - start)
            except OSError:
                continue  # a mapping that went meanwhile, or [vvar]
            found = found or needle in data
    return found


def network_helpers() -> list[int]:
    """The network helpers (``server.netd``) of this test's supervisor."""
    from warren._core.procs import descendants
    from warren.server import netd, statedir

    found = statedir.read_address(statedir.location(os.environ))
    return [] if found is None else [pid for pid in descendants(found[1]) if comm(pid) == netd.NAME]


def spawners() -> list[int]:
    """The spawner (``_core.spawner``) of this test's supervisor, in a list (empty while
    none runs): the supervisor's child with a pid in the host's namespace only that is
    neither a network helper, a helper in a sandbox's namespaces, a paused sandbox's
    thaw guard nor pasta."""
    from warren._core.procs import descendants
    from warren.server import joined, netd, pause, statedir

    found = statedir.read_address(statedir.location(os.environ))
    if found is None:
        return []
    sup = found[1]
    picked = []
    for pid in descendants(sup):
        try:
            with open(f"/proc/{pid}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if (
            int(status["PPid"]) == sup
            and len(status["NSpid"].split()) == 1
            and comm(pid) not in (netd.NAME, joined.NAME, pause.NAME)
            and b"pasta" not in cmdline
        ):
            picked.append(pid)
    return picked


def joined_helpers() -> list[int]:
    """The helpers of this test's supervisor in its sandboxes' user and mount
    namespaces (``server.joined.Helper``: review sandboxes', snapshots')."""
    from warren._core.procs import descendants
    from warren.server import joined, statedir

    found = statedir.read_address(statedir.location(os.environ))
    return [] if found is None else [pid for pid in descendants(found[1]) if comm(pid) == joined.NAME]


def network_helper_runs() -> bool:
    """A network helper (``server.netd``) of this test's supervisor runs."""
    return bool(network_helpers())


def server_of(pid1: int) -> int:
    """The process that serves a sandbox, seen from the host: its PID 1, or where PID 1
    became the native init (``_core.nativeinit``), the keeper it forked (its child
    that is not the credentials sender). The helpers and spares are its children."""
    from warren._core.procs import table

    if comm(pid1) != "warren-init":
        return pid1
    rows = table()
    for pid, ppid, _state in rows:
        if ppid == pid1 and comm(pid) not in ("warren-credsend", ""):
            return pid
    # A keeper joined from outside once the first left (``_core.rejoin``): the spawner's
    # child (the supervisor's other child), in the sandbox's pid namespace and cgroups.
    supervisor = next((pp for p, pp, _st in rows if p == pid1), 0)
    spawners = {p for p, pp, _st in rows if pp == supervisor and comm(p) not in ("warren-init", "")}
    for pid, ppid, _state in rows:
        if ppid in spawners and _nspid_depth(pid) > 1 and _cgroups(pid) == _cgroups(pid1):
            return pid
    return pid1


def _nspid_depth(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return len(f.read().split("NSpid:", 1)[1].split("\n", 1)[0].split())
    except (OSError, IndexError):
        return 0


def _cgroups(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return f.read()
    except OSError:
        return ""


def run_cli(
    args: Sequence[str],
    *,
    cwd: Path,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [*WARREN, *args],
        cwd=cwd,
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )


def _make_layout(base: Path) -> Layout:
    base.mkdir(parents=True, exist_ok=True)
    ws = base / "W"
    cache = base / "C"
    ws.mkdir()
    cache.mkdir()
    outside = base / "outside.txt"
    outside.write_text("keep me\n")
    return Layout(base, ws, cache, outside)


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    """W and C under /tmp: the sandbox grafts each into its private /tmp, on a read-only
    view of the directory around them."""
    return _make_layout(tmp_path / "proj")


@pytest.fixture(params=["tmp", "home"])
def any_layout(request: pytest.FixtureRequest, tmp_path: Path) -> Layout:
    """Both shapes of the mount plan: under /tmp (grafted) and under $HOME (masked
    in place on the host view)."""
    if request.param == "tmp":
        return _make_layout(tmp_path / "proj")
    home = Path(os.path.expanduser("~"))
    base = home / f".warren-test-{os.getpid()}-{request.node.name[-40:].replace('/', '_')}"
    layout = _make_layout(base)
    request.addfinalizer(lambda: subprocess.run(["rm", "-rf", str(base)], check=False))
    return layout


@pytest.fixture
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """warren's state (and so its supervisor) private to one test; every sandbox it
    left is removed afterwards."""
    home = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    yield home
    remove_sandboxes()
    shut_down_supervisor()


@pytest.fixture
def no_sandbox_left(state_home: Path) -> Iterator[None]:
    """For a module sharing one state (a module-scoped ``state_home``) whose tests read
    it exactly (listings, cgroup records): each test starts with no sandbox."""
    yield
    remove_sandboxes()


def remove_sandboxes() -> None:
    """Every sandbox of this state removed (its supervisor goes on: a module sharing one
    state starts each test with none). None is started for a state no supervisor ever
    served (one killed is: the next sweeps what it left)."""
    from warren.client.sandbox import Sandbox
    from warren.server import statedir

    if statedir.read_address(statedir.location(os.environ)) is None:
        return
    for info in Sandbox.list():
        Sandbox(info).remove()


@contextlib.contextmanager
def loopback_http(host: str = "127.0.0.2") -> Iterator[tuple[int, list[str]]]:
    """A small HTTP server on ``host`` (a loopback address other than the host's own
    services' 127.0.0.1) that answers every GET with "ok": its port, and the paths asked
    for so far, in order."""
    import http.server
    import threading

    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            body = b"ok\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer((host, 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield int(httpd.server_address[1]), asked
    finally:
        httpd.shutdown()
        httpd.server_close()


# Held by tests that change a host file every sandbox's plan depends on (exclusive), and
# by tests that need the host unchanged across a few commands (shared): a file in /var/tmp,
# so both halves of CI (root and uid 1001, side by side) see the same lock.
HOST_FILES_LOCK = "/var/tmp/warren-tests-host-files.lock"


@contextlib.contextmanager
def host_files(exclusive: bool) -> Iterator[None]:
    """``exclusive``: this test changes a file the planning of every sandbox reads (a
    host key in /etc/ssh, which the default deny list's glob matches; a denied place of
    HOME made or removed: ``denied_home_dir``), which makes any
    sandbox booted ahead at that moment, of any caller, another plan. Shared: this test
    needs a sandbox booted ahead to be taken by its next run (tests/test_ahead.py)."""
    import fcntl

    fd = os.open(HOST_FILES_LOCK, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def held_walk_state(tmp_path_factory: pytest.TempPathFactory, delay: float) -> Iterator[Path]:
    """For a module-scoped ``state_home`` of the hard-link walk's tests: a private state
    whose supervisor walks every workspace natively after launch (every tree counts as
    large, ``WARREN_NATIVE_WALK``), held back ``delay`` seconds first
    (``WARREN_LINK_WALK_DELAY``)."""
    from warren._core import treewalk

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WARREN_NATIVE_WALK", "1")
        mp.setenv("WARREN_LINK_WALK_DELAY", str(delay))
        assert treewalk.program() is not None, "warren-walk is not installed (run scripts/setup)"
        yield from module_state(tmp_path_factory)


def module_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """For a module-scoped ``state_home``: one private state (and supervisor) for the
    module's tests, every sandbox it left removed at the end."""
    home = tmp_path_factory.mktemp("state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_STATE_HOME", str(home))
        yield home
        remove_sandboxes()
        shut_down_supervisor()


def shut_down_supervisor(timeout: float = 10) -> None:
    """The private supervisor of this state, if one runs, ends (with the sandboxes it
    booted ahead for a request seen twice, which no listing shows): the next test finds
    no process or cgroup of this one's."""
    import select

    from warren import protocol
    from warren.client import connect
    from warren.errors import WarrenError
    from warren.server import statedir

    found = statedir.read_address(statedir.location(os.environ))
    if found is None:
        return
    try:
        pidfd = os.pidfd_open(found[1])
    except OSError:
        return  # gone already
    try:
        with contextlib.suppress(WarrenError, OSError):
            connect.request(protocol.ShutdownRequest(), (protocol.SandboxList,))
        select.select([pidfd], [], [], timeout)  # readable once it has exited
    finally:
        os.close(pidfd)


@pytest.fixture
def sandbox_py(layout: Layout) -> Callable[..., subprocess.CompletedProcess[str]]:
    return layout.py


def make_wheel(dest: Path, name: str = "warrendemo", version: str = "1.0") -> Path:
    """A small pure-Python wheel, built by hand (no network, no build backend)."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": "VALUE = 42\n",
        f"{name}/data.py": "BLOB = " + repr("x" * 4096) + "\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: warren-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = "".join(f"{path},,\n" for path in files) + f"{dist}/RECORD,,\n"
    files[f"{dist}/RECORD"] = record
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return wheel


@pytest.fixture
def outside() -> Iterator[Path]:
    """A file of the caller's HOME, outside every workspace: a sandbox must leave it as
    it is (a module may define its own ``outside``)."""
    path = Path.home() / f".warren-test-{os.getpid()}-outside.txt"
    path.write_text("keep me\n")
    yield path
    path.unlink()


@pytest.fixture
def planted_secret() -> Iterator[Path]:
    """A credential in a default-denied place of the caller's HOME (~/.aws): a sandbox
    must never print ``PLANTED-SECRET``."""
    aws = Path.home() / ".aws"
    made = not aws.exists()
    secret = aws / f"credentials-warren-test-{os.getpid()}"
    for _ in range(5):  # another test process (xdist, the other uid's run) may remove ~/.aws
        denied_home_dir(aws, True)
        with contextlib.suppress(FileNotFoundError):
            secret.write_text("aws_secret_access_key = PLANTED-SECRET-77ab\n")
            break
    yield secret
    secret.unlink(missing_ok=True)
    if made:
        denied_home_dir(aws, False)


def denied_home_dir(path: Path, made: bool) -> None:
    """Make (or remove, if empty: another test process's plant may be in it) a denied
    place of HOME, such as ~/.aws. Its coming or going makes any sandbox booted ahead
    for the caller another plan: done while no test needs one taken (``host_files``)."""
    if path.exists() is made:
        return
    with host_files(exclusive=True):
        if made:
            path.mkdir(exist_ok=True)
        else:
            with contextlib.suppress(OSError):
                path.rmdir()
