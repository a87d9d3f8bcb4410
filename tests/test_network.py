"""Network modes, by attempting what an agent would: reach allowed and forbidden hosts
through the proxy, around it, by IP literal, via metadata addresses and via names
that resolve to the host's own services. Only loopback servers started here.

The resolver map (``--resolve``) stands in for DNS: allowed.test -> 127.0.0.2 (an
allowed server), denied.test -> 127.0.0.3, rebind.test -> 127.0.0.1 (a "host
service"). Loopback answers are refused for names unless the address itself is on
the allowlist, so the allowed server's address is listed explicitly.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import warren
from conftest import make_wheel, run_cli
from warren.client.sandbox import Sandbox
from warren.errors import PolicyError
from warren.policy import PolicySpec, build

_SBIN_PATH = os.environ.get("PATH", "/usr/bin:/bin") + ":/usr/sbin:/sbin"


@dataclass
class Server:
    """A loopback HTTP server that remembers every request it got."""

    host: str
    root: Path | None = None
    hits: list[str] = field(default_factory=list)
    host_headers: list[str] = field(default_factory=list)
    httpd: http.server.ThreadingHTTPServer | None = None

    @property
    def port(self) -> int:
        assert self.httpd is not None
        return int(self.httpd.server_address[1])

    def start(self) -> Server:
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a: object, **kw: object) -> None:
                super().__init__(*a, directory=str(server.root or "/nonexistent"), **kw)  # type: ignore[arg-type]

            def do_GET(self) -> None:
                server.hits.append(self.path)
                server.host_headers.append(str(self.headers.get("Host")))
                if server.root is None:
                    body = f"hello from {server.host}\n".encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                else:
                    super().do_GET()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer((self.host, 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        assert self.httpd is not None
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, Server]]:
    started = {
        "allowed": Server("127.0.0.2").start(),
        "denied": Server("127.0.0.3").start(),
        "host": Server("127.0.0.1").start(),
    }
    yield started
    for s in started.values():
        s.stop()


@pytest.fixture(autouse=True)
def _clear_hits(servers: dict[str, Server]) -> None:
    for s in servers.values():
        s.hits.clear()
        s.host_headers.clear()


def _allow_spec(ws: Path, servers: dict[str, Server], **extra: object) -> PolicySpec:
    a, h = servers["allowed"], servers["host"]
    return PolicySpec(
        workspace=str(ws),
        network="allow",
        allow_hosts=[f"allowed.test:{a.port}", f"127.0.0.2:{a.port}", f"rebind.test:{h.port}"],
        resolve={"allowed.test": "127.0.0.2", "denied.test": "127.0.0.3", "rebind.test": "127.0.0.1"},
        **extra,  # type: ignore[arg-type]
    )


def _connect_probe(targets: list[tuple[str, int]]) -> str:
    """Python source that tries a plain TCP connect to each target, ignoring any proxy."""
    return f"""
import os, socket
for addr in {targets!r}:
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect(addr)
        print("CONNECTED", addr)
    except OSError as e:
        print("unreachable", addr, e.errno)
"""


def _curl(*args: str) -> list[str]:
    return ["curl", "-sS", "--max-time", "10", *args]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    d = tmp_path / "ws"
    d.mkdir()
    return d


# --- allow: what gets through --------------------------------------------------------


def test_allow_reaches_an_allowed_name_over_plain_http_and_connect(
    ws: Path, servers: dict[str, Server]
) -> None:
    a = servers["allowed"]
    policy = build(_allow_spec(ws, servers))
    script = f"""
        curl -sS --max-time 10 http://allowed.test:{a.port}/plain
        curl -sS --max-time 10 --proxytunnel http://allowed.test:{a.port}/tunnel
        python3 -c 'import urllib.request; print(urllib.request.urlopen("http://allowed.test:{a.port}/urllib").read().decode().strip())'
    """
    r = warren.run(["sh", "-c", script], policy)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.decode().count("hello from 127.0.0.2") == 3
    assert a.hits == ["/plain", "/tunnel", "/urllib"]
    methods = [(e.method, e.host, e.allowed, e.address) for e in r.net_log]
    assert methods == [
        ("GET", "allowed.test", True, "127.0.0.2"),
        ("CONNECT", "allowed.test", True, "127.0.0.2"),
        ("GET", "allowed.test", True, "127.0.0.2"),
    ]
    assert all(e.sandbox.startswith("run-") and e.port == a.port and e.time.endswith("Z") for e in r.net_log)


def test_allow_sets_proxy_variables_for_every_tool(ws: Path, servers: dict[str, Server]) -> None:
    r = warren.run(["env"], build(_allow_spec(ws, servers)))
    env = dict(line.split("=", 1) for line in r.stdout.decode().splitlines() if "=" in line)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        assert env[name] == env[name.lower()] == "http://127.0.0.1:3128"
    assert env["NO_PROXY"] == env["no_proxy"] == "localhost,127.0.0.1,::1"
    assert env["npm_config_https_proxy"] == "http://127.0.0.1:3128"


# --- allow: what is refused, and logged ------------------------------------------------


@pytest.mark.parametrize(
    ("target", "tunnel", "why"),
    [
        ("http://denied.test:{d}/x", False, "is not on the allowlist"),
        ("http://denied.test:{d}/x", True, "is not on the allowlist"),
        ("http://127.0.0.3:{d}/x", True, "IP literal 127.0.0.3"),
        ("http://127.0.0.3:{d}/x", False, "IP literal 127.0.0.3"),
        ("http://169.254.169.254/latest/meta-data/", False, "link-local/metadata"),
        ("http://169.254.169.254:80/latest/meta-data/", True, "link-local/metadata"),
        ("http://[fd00:ec2::254]/latest/meta-data/", True, "link-local/metadata"),
        ("http://rebind.test:{h}/secret", False, "possible DNS rebinding"),
        ("http://rebind.test:{h}/secret", True, "possible DNS rebinding"),
    ],
)
def test_allow_refuses_with_a_clear_proxy_error_and_a_log_line(
    ws: Path, servers: dict[str, Server], target: str, tunnel: bool, why: str
) -> None:
    url = target.format(d=servers["denied"].port, h=servers["host"].port)
    args = ["-o", "/dev/null", "-w", "%{http_code} %{http_connect}\\n"] if tunnel else ["-i"]
    r = warren.run(_curl(*(["--proxytunnel"] if tunnel else []), *args, url), build(_allow_spec(ws, servers)))
    out = r.stdout.decode()
    if tunnel:
        assert r.exit_code != 0 and "403" in out, (out, r.stderr)  # curl: CONNECT tunnel failed, 403
    else:
        assert out.startswith("HTTP/1.1 403 Forbidden"), out
        assert "warren proxy refused GET" in out and why in out, out
    [event] = r.net_log
    assert not event.allowed and why in event.reason
    assert event.method == ("CONNECT" if tunnel else "GET")
    assert servers["denied"].hits == [] and servers["host"].hits == []


def test_allow_refuses_direct_connections_that_ignore_the_proxy(ws: Path, servers: dict[str, Server]) -> None:
    code = _connect_probe(
        [("127.0.0.2", servers["allowed"].port), ("127.0.0.1", servers["host"].port), ("192.0.2.1", 80)]
    )
    r = warren.run(["python3", "-c", code], build(_allow_spec(ws, servers)))
    assert r.exit_code == 0, r.stderr
    assert "CONNECTED" not in r.stdout.decode(), r.stdout
    r = warren.run(
        _curl("--noproxy", "*", f"http://127.0.0.2:{servers['allowed'].port}/"),
        build(_allow_spec(ws, servers)),
    )
    assert r.exit_code == 7, r.stderr  # couldn't connect
    assert servers["allowed"].hits == []


def _refusing_flags() -> list[str]:
    return ["--network=allow", "--resolve=denied.test=127.0.0.3", "--resolve=other.test=127.0.0.3"]


def test_refusals_are_one_line_per_kind_with_a_count(
    ws: Path, servers: dict[str, Server], tmp_path: Path
) -> None:
    """An agent retrying a refused host gets one line for it, with how many times, not a
    line per retry; another host is another line."""
    d = servers["denied"]
    script = " ; ".join(
        [
            *[shlex.join(_curl("-o", "/dev/null", f"http://denied.test:{d.port}/"))] * 3,
            shlex.join(_curl("-o", "/dev/null", f"http://other.test:{d.port}/")),
            "true",
        ]
    )
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    r = run_cli(["run", *_refusing_flags(), "--", "sh", "-c", script], cwd=ws, env=env)
    assert r.returncode == 0, r.stderr
    said = [line for line in r.stderr.splitlines() if line.startswith("warren: network: refused")]
    assert said == [
        f"warren: network: refused GET {host}:{d.port}{times}: {host}:{d.port} is not on the allowlist"
        f" (add --allow-host {host}:{d.port})"
        for host, times in (("denied.test", " (3 times)"), ("other.test", ""))
    ], r.stderr
    assert d.hits == []


def _in_a_terminal(ws: Path, d: Server, env: dict[str, str]) -> str:
    """What a terminal shows of ``warren run`` whose command (a full-screen program, say)
    prints BEFORE, is refused twice, prints CURLED, waits for a gate, prints AFTER. The
    gate opens once a refusal is on the terminal, or 2 s after CURLED without one."""
    import pty
    import select

    gate = ws / f"gate-{len(os.listdir(ws))}"
    get = shlex.join(_curl("-o", "/dev/null", f"http://denied.test:{d.port}/"))
    script = f"echo BEFORE; {get}; {get}; echo CURLED; while [ ! -e {gate} ]; do sleep 0.02; done; echo AFTER"
    from conftest import WARREN

    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [*WARREN, "run", *_refusing_flags(), "--", "sh", "-c", script],
        cwd=ws,
        env={**{k: v for k, v in os.environ.items() if k != "WARREN_LIVE_NOTICES"}, **env},
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    seen, curled_at = b"", None
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 0.05)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every holder of the terminal is gone
                    break
                if not chunk:
                    break
                seen += chunk
            if curled_at is None and b"CURLED" in seen:
                curled_at = time.monotonic()
            waited = curled_at is not None and (b"refused" in seen or time.monotonic() - curled_at > 2)
            if waited and not gate.exists():
                gate.touch()
        assert proc.wait(timeout=60) == 0, seen
    finally:
        os.close(master)
        proc.kill()
    return seen.decode(errors="replace").replace("\r\n", "\n")


def test_refusals_never_come_into_a_terminal_program_while_it_runs(
    ws: Path, servers: dict[str, Server], tmp_path: Path
) -> None:
    d = servers["denied"]
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    shown = _in_a_terminal(ws, d, env)
    assert shown.count("warren: network: refused") == 1, shown
    assert shown.index("AFTER") < shown.index("warren: network: refused") and "(2 times)" in shown, shown
    # the control: asked to say them as they come, the same refusal lands in the program's screen
    live = _in_a_terminal(ws, d, {**env, "WARREN_LIVE_NOTICES": "1"})
    assert live.index("warren: network: refused") < live.index("AFTER"), live
    assert "(2 times in all)" in live


def test_cli_prints_refusals_and_logs_of_a_long_lived_sandbox(
    ws: Path, servers: dict[str, Server], tmp_path: Path
) -> None:
    a, d = servers["allowed"], servers["denied"]
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    flags = [
        f"--allow-host=allowed.test:{a.port}",
        f"--allow-host=127.0.0.2:{a.port}",
        "--resolve=allowed.test=127.0.0.2",
        "--resolve=denied.test=127.0.0.3",
    ]
    r = run_cli(
        ["run", *flags, "--", *_curl("-o", "/dev/null", f"http://denied.test:{d.port}/")], cwd=ws, env=env
    )
    assert (
        f"warren: network: refused GET denied.test:{d.port}: denied.test:{d.port} is not on the allowlist"
        in r.stderr
    )

    name = f"net-{os.getpid()}"
    r = run_cli(["create", *flags, name], cwd=ws, env=env)
    assert r.returncode == 0, r.stderr
    try:
        r = run_cli(
            [
                "exec",
                name,
                "--",
                "sh",
                "-c",
                f"curl -sS http://allowed.test:{a.port}/ok; curl -sS http://denied.test:{d.port}/no",
            ],
            cwd=ws,
            env=env,
        )
        assert "hello from 127.0.0.2" in r.stdout
        logs = run_cli(["logs", "--net", name], cwd=ws, env=env)
        lines = logs.stdout.splitlines()
        assert len(lines) == 2, logs.stdout + logs.stderr
        assert f" {name} allowed GET allowed.test:{a.port} via 127.0.0.2" in lines[0]
        assert f" {name} DENIED GET denied.test:{d.port}: " in lines[1]
        as_json = [
            json.loads(x)
            for x in run_cli(["logs", "--net", "--json", name], cwd=ws, env=env).stdout.splitlines()
        ]
        assert [(e["host"], e["allowed"]) for e in as_json] == [
            ("allowed.test", True),
            ("denied.test", False),
        ]
        assert set(as_json[0]) == {
            "time",
            "sandbox",
            "method",
            "host",
            "port",
            "allowed",
            "reason",
            "address",
            "kind",
            "by",
            "request",
        }
    finally:
        run_cli(["rm", "-f", name], cwd=ws, env=env)
    gone = run_cli(["logs", "--net", name], cwd=ws, env=env)  # removed with the sandbox
    assert gone.returncode != 0 and f"no sandbox named {name}" in gone.stderr
    assert servers["denied"].hits == []


# --- allow: a real package install ------------------------------------------------------


def _simple_index(root: Path) -> None:
    wheel = make_wheel(root / "files", "warrennet", "2.0")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    page = root / "simple" / "warrennet" / "index.html"
    page.parent.mkdir(parents=True)
    page.write_text(f'<a href="../../files/{wheel.name}#sha256={digest}">{wheel.name}</a>\n')
    (root / "simple" / "index.html").write_text('<a href="warrennet/">warrennet</a>\n')


def test_uv_pip_install_from_an_allowed_local_index(ws: Path, tmp_path: Path) -> None:
    uv = os.path.join(os.path.dirname(sys.executable), "uv")
    index = Server("127.0.0.2", root=tmp_path / "index")
    _simple_index(index.root)  # type: ignore[arg-type]
    index.start()
    try:
        spec = PolicySpec(
            workspace=str(ws),
            allow_hosts=[f"index.test:{index.port}", f"127.0.0.2:{index.port}"],
            resolve={"index.test": "127.0.0.2"},
            env={"UV_CACHE_DIR": str(ws / ".uv-cache"), "UV_NO_PROGRESS": "1"},
        )
        script = f"""set -e
            {uv} venv -q --python /usr/bin/python3 .venv
            {uv} pip install --python .venv/bin/python \\
                --index-url http://index.test:{index.port}/simple/ warrennet
            .venv/bin/python -c 'import warrennet; print("value", warrennet.VALUE)'
        """
        r = warren.run(["sh", "-c", script], build(spec), timeout=120)
        assert r.exit_code == 0, r.stderr
        assert "value 42" in r.stdout.decode()
        assert any(h.endswith(".whl") for h in index.hits), index.hits
        assert all(e.allowed and e.host == "index.test" for e in r.net_log), r.net_log
        # The same install without the allowance is refused at the proxy.
        r = warren.run(
            ["sh", "-c", script.replace(".venv", ".venv2")],
            build(
                PolicySpec(
                    workspace=str(ws),
                    allow_hosts=["pypi.org"],
                    resolve={"index.test": "127.0.0.2"},
                    env={"UV_CACHE_DIR": str(ws / ".uv-cache2"), "UV_NO_PROGRESS": "1"},
                )
            ),
            timeout=120,
        )
        assert r.exit_code != 0
        assert any(not e.allowed and e.host == "index.test" for e in r.net_log), r.stderr
    finally:
        index.stop()


def test_git_clone_from_the_allowed_forge_only(ws: Path, tmp_path: Path) -> None:
    """git over HTTP (the dumb protocol, served by a plain file server) through the proxy."""
    forge = tmp_path / "forge"
    src = tmp_path / "src"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", str(src)], check=True)
    (src / "README").write_text("cloned through warren\n")
    subprocess.run([*git, "-C", str(src), "add", "README"], check=True)
    subprocess.run([*git, "-C", str(src), "commit", "-qm", "first"], check=True)
    subprocess.run([*git, "clone", "-q", "--bare", str(src), str(forge / "repo.git")], check=True)
    subprocess.run(["git", "-C", str(forge / "repo.git"), "update-server-info"], check=True)
    server = Server("127.0.0.2", root=forge).start()
    try:
        spec = PolicySpec(
            workspace=str(ws),
            presets=["git"],
            allow_hosts=[f"forge.test:{server.port}", f"127.0.0.2:{server.port}"],
            resolve={"forge.test": "127.0.0.2", "other.test": "127.0.0.2"},
        )
        r = warren.run(["git", "clone", "-q", f"http://forge.test:{server.port}/repo.git", "c"], build(spec))
        assert r.exit_code == 0, r.stderr
        assert (ws / "c" / "README").read_text() == "cloned through warren\n"
        r = warren.run(["git", "clone", "-q", f"http://other.test:{server.port}/repo.git", "d"], build(spec))
        assert r.exit_code != 0 and not (ws / "d").exists()
        assert [e.host for e in r.net_log if not e.allowed] == ["other.test"]
    finally:
        server.stop()


# --- none ---------------------------------------------------------------------------------


def test_none_reaches_nothing_and_sets_no_proxy(ws: Path, servers: dict[str, Server]) -> None:
    code = _connect_probe(
        [
            ("127.0.0.2", servers["allowed"].port),
            ("127.0.0.1", servers["host"].port),
            ("192.0.2.1", 80),
            ("1.1.1.1", 443),
        ]
    )
    code += """
print("proxy" if any("proxy" in k.lower() for k in os.environ) else "no proxy variables")
print(sorted(name for _, name in socket.if_nameindex()))
"""
    r = warren.run(["python3", "-c", code], build(PolicySpec(workspace=str(ws))))
    out = r.stdout.decode()
    assert "no proxy variables" in out and "CONNECTED" not in out and "['lo']" in out, out
    assert r.net_log == ()
    assert all(not s.hits for s in servers.values())


# --- open ------------------------------------------------------------------------------


def test_open_reaches_a_remote_host_but_never_the_hosts_own_services(tmp_path: Path) -> None:
    """A two-namespace network built by the test (veth pair): the sandbox reaches the
    "remote" server through pasta, and none of the "host" namespace's services, on
    loopback or on its own address, directly or via the gateway address."""
    for tool in ("pasta", "ip", "nsenter", "unshare"):
        assert shutil.which(tool, path=_SBIN_PATH), f"{tool} is missing: scripts/setup installs it"
    work = tmp_path / "open"
    work.mkdir()
    if os.getuid() == 0:
        prefix = ["unshare", "--net"]
    else:
        # The test's own user namespace, with CAP_NET_ADMIN kept there to build the
        # network; warren itself still runs as this uid (mapped to itself).
        prefix = ["unshare", "--user", f"--map-user={os.getuid()}", f"--map-group={os.getgid()}"]
        prefix += ["--keep-caps", "--net"]
    scenario = Path(__file__).with_name("open_mode_scenario.py")
    r = subprocess.run(
        [*prefix, sys.executable, str(scenario), str(work)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PATH": _SBIN_PATH},
    )
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["returncode"] == 0, result["stderr"]
    assert result["remote"] == "hello from the remote host\n"
    for probe in ("host_loopback", "host_any", "host_any_via_gateway", "host_loopback_via_gateway"):
        assert result[probe].startswith("unreachable"), (probe, result[probe])
    assert result["pasta_left"] == []
    box = result["long_lived"]  # the same through `warren create --network open`
    assert box.get("remote") == "hello from the remote host\n", box
    assert all(box[p].startswith("unreachable") for p in ("host_loopback", "host_any")), box
    assert box["pasta_while_running"] == 1 and box["pasta_left"] == [], box


def test_open_without_a_usable_pasta_is_a_clear_setup_error(ws: Path, tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "pasta").write_text("#!/bin/sh\necho 'pasta: cannot do that here' >&2\nexit 1\n")
    (fake / "pasta").chmod(0o755)
    r = run_cli(
        ["run", "--network", "open", "--", "true"], cwd=ws, env={"PATH": f"{fake}:{os.environ['PATH']}"}
    )
    if not os.access("/dev/net/tun", os.R_OK | os.W_OK):
        assert r.returncode == 125 and "/dev/net/tun" in r.stderr
        return
    assert r.returncode == 125, r.stderr
    assert "pasta could not set up the sandbox's network: pasta: cannot do that here" in r.stderr
    assert "hint:" in r.stderr and "Traceback" not in r.stderr


# --- expose ------------------------------------------------------------------------------


@pytest.fixture
def state(state_home: Path) -> Path:
    return state_home


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


def test_expose_reaches_a_server_in_the_sandbox_and_closes_with_it(ws: Path, state: Path) -> None:
    (ws / "index.html").write_text("served from inside\n")
    sb = Sandbox.create(build(PolicySpec(workspace=str(ws))))
    proc = sb.spawn(["python3", "-m", "http.server", "--bind", "127.0.0.1", "8000"])
    for _ in range(100):
        if sb.exec(["python3", "-c", "import socket; socket.create_connection(('127.0.0.1', 8000))"]).ok:
            break
        time.sleep(0.05)
    address = sb.expose(8000)
    host, port = address.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    assert _get(f"http://{address}/index.html") == "served from inside\n"
    assert sb.expose(8000) == address  # idempotent
    # Many connections at once, each through a socket made inside the sandbox.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        assert set(pool.map(lambda _: _get(f"http://{address}/index.html"), range(24))) == {
            "served from inside\n"
        }
    # A port where nothing listens inside: the connection is refused/reset, not hung.
    closed = sb.expose(8001)
    with pytest.raises(OSError):
        _get(f"http://{closed}/")
    proc.kill()
    sb.remove()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", int(port)), timeout=3)


def test_expose_rejects_bad_ports_with_a_typed_error(ws: Path, state: Path) -> None:
    with Sandbox.create(build(PolicySpec(workspace=str(ws)))) as sb:
        with pytest.raises(warren.errors.SandboxError, match="port must be a TCP port number"):
            sb.expose(0)
        with pytest.raises(warren.errors.SandboxError, match="host_port"):
            sb.expose(80, 70000)
        busy = socket.socket()
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(warren.errors.SandboxError, match=r"cannot listen on 127\.0\.0\.1"):
            sb.expose(80, busy.getsockname()[1])
        busy.close()
        assert sb.exec(["true"]).ok  # still usable


def test_long_lived_allow_mode_logs_through_the_api(
    ws: Path, state: Path, servers: dict[str, Server]
) -> None:
    a = servers["allowed"]
    with Sandbox.create(build(_allow_spec(ws, servers)), name="netapi") as sb:
        r = sb.exec(_curl(f"http://allowed.test:{a.port}/api"))
        assert r.stdout.decode() == "hello from 127.0.0.2\n", r.stderr
        r = sb.exec(_curl("-o", "/dev/null", "http://169.254.169.254/"))
        events = sb.net_log()
        assert [(e.sandbox, e.host, e.allowed) for e in events] == [
            ("netapi", "allowed.test", True),
            ("netapi", "169.254.169.254", False),
        ]


# --- policy ---------------------------------------------------------------------------------


def test_allow_host_alone_means_allow_and_contradictions_are_errors(ws: Path) -> None:
    assert build(PolicySpec(workspace=str(ws), allow_hosts=["pypi.org"])).network == "allow"
    with pytest.raises(PolicyError, match="network mode 'none'"):
        build(PolicySpec(workspace=str(ws), network="none", allow_hosts=["pypi.org"]))
    with pytest.raises(PolicyError, match="invalid allowed host"):
        build(PolicySpec(workspace=str(ws), allow_hosts=["pypi.org:99999"]))
    with pytest.raises(PolicyError, match="never be allowed"):
        build(PolicySpec(workspace=str(ws), allow_hosts=["169.254.169.254"]))
    python = build(PolicySpec(workspace=str(ws), presets=["python"], network="allow"))
    assert {"pypi.org", "files.pythonhosted.org"} <= set(python.allowed_hosts)
    assert build(PolicySpec(workspace=str(ws), presets=["python"])).allowed_hosts == ()


def test_cli_rejects_bad_network_flags_with_a_hint(ws: Path) -> None:
    r = run_cli(["run", "--allow-host", "bad host!", "--", "true"], cwd=ws)
    assert r.returncode == 125 and "invalid allowed host 'bad host!'" in r.stderr and "hint:" in r.stderr
    r = run_cli(["run", "--resolve", "x.test", "--", "true"], cwd=ws)
    assert r.returncode == 125 and "expected NAME=ADDRESS" in r.stderr
    r = run_cli(["run", "--network", "sideways", "--", "true"], cwd=ws)
    assert r.returncode == 125 and "sideways" in r.stderr
    assert "Traceback" not in r.stderr


def test_workspace_file_cannot_open_the_network(ws: Path) -> None:
    (ws / "warren.toml").write_text('network = "open"\n')
    r = run_cli(["run", "--", "true"], cwd=ws)
    assert r.returncode == 125 and "network = 'open' would open the network" in r.stderr
    (ws / "warren.toml").write_text('allow_host = ["evil.example"]\n')
    r = run_cli(["run", "--", "true"], cwd=ws)
    assert r.returncode == 125 and "allow_host" in r.stderr


def test_no_litter_in_tmp_or_the_workspace(
    ws: Path, servers: dict[str, Server], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A TMPDIR of this test's own (for this process's tempfile and the helpers it starts):
    # the shared /tmp holds the scratch directories of other workers' live sandboxes.
    tmp = tmp_path / "caller-tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)
    r = warren.run(_curl(f"http://allowed.test:{servers['allowed'].port}/"), build(_allow_spec(ws, servers)))
    assert r.exit_code == 0
    assert list(ws.iterdir()) == []
    assert os.listdir(tmp) == []
    # The proxy's threads ended with the run.
    deadline = time.monotonic() + 5
    while any(t.name == "warren-proxy" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(t.name == "warren-proxy" for t in threading.enumerate())


def test_proxy_answers_garbage_with_400_and_keeps_serving(ws: Path, servers: dict[str, Server]) -> None:
    a = servers["allowed"]
    # Each request prints the status line it got, or what went wrong instead (so a failure
    # under load says which request and why); reads go to the end of the status line, and
    # the timeout only keeps a stuck proxy from hanging the test.
    code = f"""
import socket
def ask(data):
    try:
        with socket.create_connection(("127.0.0.1", 3128), timeout=120) as s:
            s.sendall(data)
            got = b""
            while b"\\r\\n" not in got:
                chunk = s.recv(4096)
                if not chunk:
                    return "closed after " + repr(got)
                got += chunk
            return got.split(b"\\r\\n")[0].decode(errors="replace")
    except OSError as e:
        return "error " + repr(e)
print(ask(b"NONSENSE\\r\\n\\r\\n"))
print(ask(b"GET / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n"))
print(ask(b"CONNECT allowed.test HTTP/1.1\\r\\n\\r\\n"))
print(ask(b"GET http://allowed.test:{a.port}/after HTTP/1.1\\r\\nHost: internal.service\\r\\n\\r\\n"))
"""
    r = warren.run(["python3", "-c", code], build(_allow_spec(ws, servers)))
    lines = r.stdout.decode().splitlines()
    why = f"exit {r.exit_code}, stdout {lines}, stderr {r.stderr.decode(errors='replace')!r}"
    assert lines == ["HTTP/1.1 400 Bad Request"] * 3 + ["HTTP/1.0 200 OK"], why
    # The upstream saw the vetted URL's host, not the forged Host header.
    assert a.host_headers == [f"allowed.test:{a.port}"], why


def test_async_sandbox_exposes_and_reads_its_net_log(
    ws: Path, state: Path, servers: dict[str, Server]
) -> None:
    import asyncio

    from warren.client.aio import AsyncSandbox

    (ws / "page.txt").write_text("async page\n")

    async def main() -> tuple[str, list[str]]:
        async with await AsyncSandbox.create(build(_allow_spec(ws, servers))) as sb:
            await sb.spawn(["python3", "-m", "http.server", "--bind", "127.0.0.1", "8000"])
            for _ in range(100):
                if (await sb.exec(["curl", "-s", "--noproxy", "*", "http://127.0.0.1:8000/page.txt"])).ok:
                    break
                await asyncio.sleep(0.05)
            address = await sb.expose(8000)
            page = await asyncio.to_thread(_get, f"http://{address}/page.txt")
            await sb.exec(_curl(f"http://denied.test:{servers['denied'].port}/"))
            return page, [e.host for e in await sb.net_log()]

    page, hosts = asyncio.run(main())
    assert page == "async page\n"
    assert hosts == ["denied.test"]


def test_cli_port_forwards_into_a_sandbox(ws: Path, tmp_path: Path) -> None:
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    (ws / "hi.txt").write_text("hi from the cli\n")
    name = f"port-{os.getpid()}"
    assert run_cli(["create", name], cwd=ws, env=env).returncode == 0
    try:
        run_cli(
            ["exec", name, "--", "sh", "-c", "python3 -m http.server 8000 >/dev/null 2>&1 &"], cwd=ws, env=env
        )
        r = run_cli(["port", name, "8000"], cwd=ws, env=env)
        assert r.returncode == 0, r.stderr
        address = r.stdout.strip()
        for _ in range(100):
            try:
                assert _get(f"http://{address}/hi.txt") == "hi from the cli\n"
                break
            except OSError:
                time.sleep(0.05)
        else:
            pytest.fail("the exposed server never answered")
        bad = run_cli(["port", name, "0"], cwd=ws, env=env)
        assert bad.returncode == 125 and "Traceback" not in bad.stderr
    finally:
        run_cli(["rm", "-f", name], cwd=ws, env=env)
    with pytest.raises(OSError):
        _get(f"http://{address}/hi.txt")


def test_tls_trust_variables_pass_through(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Behind a proxy with its own CA (corporate, CI), tools find it through these."""
    for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO", "PIP_CERT"):
        monkeypatch.setenv(name, "/etc/ssl/certs/ca-certificates.crt")
    monkeypatch.setenv("SOME_API_TOKEN", "secret")
    r = warren.run(["env"], build(PolicySpec(workspace=str(ws))))
    out = r.stdout.decode()
    assert "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt" in out
    assert "GIT_SSL_CAINFO=/etc/ssl/certs/ca-certificates.crt" in out
    assert "SOME_API_TOKEN" not in out
