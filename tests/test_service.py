"""`warren serve`: the HTTP API v1 against a real server on loopback TCP and a unix
socket, exercised with a real HTTP client (httpx)."""

from __future__ import annotations

import base64
import json
import os
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from conftest import WARREN, module_state
from service_util import Serve
from warren.client.http import events


@pytest.fixture
def tcp(tmp_path: Path, state_home: Path) -> Iterator[Serve]:
    server = Serve(tmp_path)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def unix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    """One server (and state) on a unix socket for the module's tests: each test's
    sandboxes are removed after it (``_unix_sandboxes_removed``)."""
    for _ in module_state(tmp_path_factory):
        server = Serve(tmp_path_factory.mktemp("serve"), unix=True, token=False)
        yield server
        server.stop()


@pytest.fixture(autouse=True)
def _unix_sandboxes_removed(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "unix" not in request.fixturenames:
        return
    server: Serve = request.getfixturevalue("unix")
    with server.client(None) as c:
        for box in c.get("/v1/sandboxes").json()["sandboxes"]:
            assert c.delete(f"/v1/sandboxes/{box['name']}").status_code in (200, 204), box


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


def _error(r: httpx.Response, status: int, kind: str) -> dict[str, object]:
    assert r.status_code == status, r.text
    body = r.json()["error"]
    assert body["type"] == kind, body
    assert set(body) >= {"type", "message", "path", "errno", "hint"}
    return dict(body)


def test_tcp_without_or_with_a_wrong_token_is_401_and_runs_nothing(tcp: Serve, ws: Path) -> None:
    marker = ws / "ran"
    body = {"argv": ["touch", str(marker)], "policy": {"workspace": str(ws)}}
    for token in (None, "wrong-token-wrong-token", tcp.token + "x"):  # type: ignore[operator]
        with tcp.client(token) as c:
            _error(c.post("/v1/run", json=body), 401, "WarrenError")
            _error(c.get("/v1/sandboxes"), 401, "WarrenError")
            assert c.get("/v1/health").status_code == 401
    with httpx.Client(base_url=tcp.url, headers={"Authorization": f"Basic {tcp.token}"}) as c:
        assert c.post("/v1/run", json=body).status_code == 401
    assert not marker.exists()
    with tcp.client() as c:
        assert c.get("/v1/health").json()["status"] == "ok"
        r = c.post("/v1/run", json=body)
        assert r.status_code == 200 and r.json()["exit_code"] == 0
    assert marker.exists()
    # serve logs a request once its response is sent: the last line may come a moment later.
    deadline = time.monotonic() + 5
    while "POST /v1/run 200" not in tcp.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    log = tcp.log.read_text()
    assert "POST /v1/run 401" in log and "POST /v1/run 200" in log and "ms" in log


def test_serve_refuses_a_short_token_and_remote_without_allow_remote(
    tmp_path: Path, state_home: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "WARREN_TOKEN"}
    env["WARREN_TOKEN"] = "short"
    r = subprocess.run([*WARREN, "serve", "--listen", "127.0.0.1:0"], capture_output=True, text=True, env=env)
    assert r.returncode == 125 and "shorter than 16" in r.stderr and "hint:" in r.stderr
    env["WARREN_TOKEN"] = "0123456789abcdef0123"
    r = subprocess.run([*WARREN, "serve", "--listen", "0.0.0.0:0"], capture_output=True, text=True, env=env)
    assert r.returncode == 125 and "non-loopback" in r.stderr and "--allow-remote" in r.stderr
    assert "Traceback" not in r.stderr


def test_unix_socket_is_mode_0600_and_serves_the_api(unix: Serve, ws: Path) -> None:
    assert unix.socket is not None
    assert stat.S_IMODE(os.stat(unix.socket).st_mode) == 0o600
    with unix.client(None) as c:
        r = c.post(
            "/v1/run", json={"argv": ["sh", "-c", "printf hi; exit 4"], "policy": {"workspace": str(ws)}}
        )
        assert r.json()["exit_code"] == 4 and r.json()["stdout"] == "hi"


def test_openapi_is_valid_and_describes_every_route(unix: Serve) -> None:
    from openapi_spec_validator import validate

    from warren.service.app import Service, routes

    with unix.client(None) as c:
        doc = c.get("/v1/openapi.json").json()
    validate(doc)
    served = {(r.path, m) for r in routes(Service(None)) for m in (r.methods or ()) if m != "HEAD"}  # type: ignore[arg-type]
    described = {(p, m.upper()) for p, ops in doc["paths"].items() for m in ops}
    assert served == described


def test_sandbox_crud_exec_and_files(unix: Serve, ws: Path) -> None:
    (ws / "secret").mkdir()
    (ws / "secret" / "key").write_text("TOP\n")
    with unix.client(None) as c:
        r = c.post("/v1/sandboxes", json={"name": "box", "workspace": str(ws), "deny": [str(ws / "secret")]})
        assert r.status_code == 201 and r.json()["state"] == "running"
        _error(c.post("/v1/sandboxes", json={"name": "box", "workspace": str(ws)}), 409, "SandboxExists")
        assert c.get("/v1/sandboxes/box").json()["workspace"] == str(ws)
        assert "box" in [s["name"] for s in c.get("/v1/sandboxes").json()["sandboxes"]]
        _error(c.get("/v1/sandboxes/nope"), 404, "SandboxNotFound")
        _error(c.post("/v1/sandboxes/nope/exec", json={"argv": ["true"]}), 404, "SandboxNotFound")

        r = c.post(
            "/v1/sandboxes/box/exec",
            json={"argv": ["sh", "-c", 'cat; echo "$X" >&2; pwd'], "stdin": "in\n", "env": {"X": "y"}},
        )
        out = r.json()
        assert (out["exit_code"], out["stdout"], out["stderr"]) == (0, f"in\n{ws}\n", "y\n")
        assert out["truncated"] is False and out["duration"] > 0
        r = c.post("/v1/sandboxes/box/exec", json={"argv": ["printf", "\\377\\000x"]})
        assert (
            r.json()["stdout_encoding"] == "base64" and base64.b64decode(r.json()["stdout"]) == b"\xff\x00x"
        )
        r = c.post(
            "/v1/sandboxes/box/exec", json={"argv": ["head", "-c", "5000", "/dev/zero"], "output_limit": 100}
        )
        assert r.json()["truncated"] is True
        _error(c.post("/v1/sandboxes/box/exec", json={"argv": ["no-such-tool"]}), 422, "CommandNotFound")
        _error(c.post("/v1/sandboxes/box/exec", json={"argv": ["true"], "cwd": "/nope"}), 422, "CwdNotFound")

        base = "/v1/sandboxes/box/files"
        assert c.put(base, params={"path": "d/e/f.bin", "parents": 1}, content=b"\x00\x01").status_code == 201
        assert (ws / "d" / "e" / "f.bin").read_bytes() == b"\x00\x01"
        assert c.get(base, params={"path": "d/e/f.bin"}).content == b"\x00\x01"
        listing = c.get(base, params={"path": "d/e"}).json()
        assert [(e["name"], e["type"], e["size"]) for e in listing["entries"]] == [("f.bin", "file", 2)]
        assert c.post(f"{base}/mkdir", json={"path": "m"}).status_code == 201
        assert c.post(f"{base}/move", json={"src": "d/e/f.bin", "dst": "m/g.bin"}).status_code == 200
        assert (ws / "m" / "g.bin").exists() and not (ws / "d" / "e" / "f.bin").exists()
        assert c.get(f"{base}/stat", params={"path": "m/g.bin"}).json()["size"] == 2
        assert c.delete(base, params={"path": "m", "recursive": 1}).status_code == 200
        assert not (ws / "m").exists()
        _error(c.get(base, params={"path": "m"}), 404, "SandboxFileNotFound")
        # traversal is resolved inside the sandbox: it leads only where the policy lets it
        outside = ws.parent / "outside.txt"
        outside.write_text("keep\n")
        up = "../" * 12
        r = c.put(base, params={"path": f"{up}etc/warren-escape"}, content=b"x")
        _error(r, 403, "SandboxPermissionDenied")
        assert not Path("/etc/warren-escape").exists()
        c.put(base, params={"path": f"{up}{str(outside).lstrip('/')}"}, content=b"changed")
        assert outside.read_text() == "keep\n"
        r = c.get(base, params={"path": "../ws/secret/key"})
        assert r.status_code >= 400 and b"TOP" not in r.content

        assert c.delete("/v1/sandboxes/box").json()["state"] == "removed"
        _error(c.get("/v1/sandboxes/box"), 404, "SandboxNotFound")


def test_bad_input_is_a_typed_error(unix: Serve, ws: Path) -> None:
    with unix.client(None) as c:
        r = c.post("/v1/run", content=b"{not json", headers={"Content-Type": "application/json"})
        assert "not valid JSON" in _error(r, 400, "WarrenError")["message"]  # type: ignore[operator]
        r = c.post("/v1/run", json={"argv": ["true"], "polcy": {}})
        assert "'polcy'" in _error(r, 400, "WarrenError")["message"]  # type: ignore[operator]
        r = c.post("/v1/run", json={"argv": ["true"], "policy": {"network": 3}})
        _error(r, 400, "ConfigError")
        r = c.post("/v1/sandboxes", json={"name": "x", "writable": ["/"]})
        assert "writable" in _error(r, 400, "WarrenError")["message"]  # type: ignore[operator]
        _error(c.post("/v1/run", json={"argv": "ls -l"}), 400, "ExecError")
        _error(c.post("/v1/run", json={"argv": ["true"], "timeout": -1}), 400, "ExecError")
        r = c.post("/v1/run", content=b"x" * (17 * 1024 * 1024))
        assert "over the limit" in _error(r, 413, "WarrenError")["message"]  # type: ignore[operator]
        _error(c.get("/v1/nothing"), 404, "WarrenError")
        _error(c.get("/v1/sandboxes/bad%2Fname"), 404, "WarrenError")
        r = c.post("/v1/sandboxes", json={"name": "../x"})
        assert r.status_code == 400 and "Traceback" not in r.text


def test_exec_sse_streams_the_first_event_before_the_command_ends(unix: Serve, ws: Path) -> None:
    with unix.client(None) as c:
        c.post("/v1/sandboxes", json={"name": "s", "workspace": str(ws)}).raise_for_status()
        body = {"argv": ["sh", "-c", "echo first; sleep 2; echo second >&2; exit 7"]}
        start = time.monotonic()
        seen: list[tuple[str, float, object]] = []
        with c.stream(
            "POST", "/v1/sandboxes/s/exec", json=body, headers={"Accept": "text/event-stream"}
        ) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            for event, data in events(r.iter_lines()):
                seen.append((event, time.monotonic() - start, data))
        kinds = [e for e, _, _ in seen]
        assert kinds == ["stdout", "stderr", "exit"]
        assert seen[0][1] < 1.5 and seen[-1][1] >= 2.0
        assert base64.b64decode(seen[0][2]["data"]) == b"first\n"  # type: ignore[index]
        assert seen[-1][2]["exit_code"] == 7  # type: ignore[index]

        body = {"argv": ["sh", "-c", "echo one-shot"], "policy": {"workspace": str(ws)}}
        with c.stream("POST", "/v1/run", json=body, headers={"Accept": "text/event-stream"}) as r:
            got = list(events(r.iter_lines()))
        assert [e for e, _ in got] == ["stdout", "exit"] and got[-1][1]["exit_code"] == 0
        assert base64.b64decode(got[0][1]["data"]) == b"one-shot\n"


def test_process_output_resumes_without_loss_or_duplication(unix: Serve, ws: Path) -> None:
    with unix.client(None) as c:
        c.post("/v1/sandboxes", json={"name": "p", "workspace": str(ws)}).raise_for_status()
        script = "i=0; while [ $i -lt 60 ]; do echo line$i; echo err$i >&2; i=$((i+1)); sleep 0.01; done"
        r = c.post("/v1/sandboxes/p/processes", json={"argv": ["sh", "-c", script]})
        assert r.status_code == 201
        pid = r.json()["id"]
        assert r.json()["pid"] > 0
        out, err = b"", b""
        last = None
        url = f"/v1/sandboxes/p/processes/{pid}/output"
        interrupted = 0
        for _ in range(100):
            headers = {"Accept": "text/event-stream"}
            if last:
                headers["Last-Event-ID"] = last
            done = False
            with c.stream("GET", url, headers=headers) as r:
                lines = r.iter_lines()
                event, data, ident, n = "", "", None, 0
                for line in lines:
                    if line.startswith("id:"):
                        ident = line[3:].strip()
                    elif line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:"):
                        data = line[5:].strip()
                    elif not line:
                        if event == "stdout":
                            out += base64.b64decode(json.loads(data)["data"])
                        elif event == "stderr":
                            err += base64.b64decode(json.loads(data)["data"])
                        elif event == "exit":
                            done = json.loads(data)["exit_code"] == 0
                        last = ident
                        n += 1
                        if n == 2 and not done:
                            interrupted += 1
                            break  # disconnect mid-stream
            if done:
                break
        assert interrupted > 0, "the stream was never interrupted"
        assert out == b"".join(f"line{i}\n".encode() for i in range(60))
        assert err == b"".join(f"err{i}\n".encode() for i in range(60))
        r = c.get(f"/v1/sandboxes/p/processes/{pid}", params={"offset": 5})
        assert r.json()["stdout"] == out[5:].decode() and r.json()["exit_code"] == 0

        r = c.post("/v1/sandboxes/p/processes", json={"argv": ["sleep", "60"]})
        sleeper = r.json()["id"]
        assert any(
            p["argv"] == ["sleep", "60"] for p in c.get("/v1/sandboxes/p/processes").json()["processes"]
        )
        assert (
            c.post(f"/v1/sandboxes/p/processes/{sleeper}/signal", json={"signal": "SIGKILL"}).status_code
            == 200
        )
        deadline = time.monotonic() + 10
        while c.get(f"/v1/sandboxes/p/processes/{sleeper}").json()["running"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert c.get(f"/v1/sandboxes/p/processes/{sleeper}").json()["exit_code"] == 128 + 9
        _error(
            c.post(f"/v1/sandboxes/p/processes/{sleeper}/signal", json={"signal": "SIGNOPE"}),
            400,
            "SandboxError",  # the shared checks' type (the SDK raises the same)
        )


def test_ports_and_netlog(unix: Serve, ws: Path) -> None:
    with unix.client(None) as c:
        c.post("/v1/sandboxes", json={"name": "n", "workspace": str(ws)}).raise_for_status()
        r = c.post("/v1/sandboxes/n/processes", json={"argv": ["python3", "-m", "http.server", "8765"]})
        assert r.status_code == 201
        address = c.post("/v1/sandboxes/n/ports", json={"port": 8765}).json()["address"]
        assert address.startswith("127.0.0.1:")
        deadline = time.monotonic() + 15
        while True:
            try:
                assert httpx.get(f"http://{address}/").status_code == 200
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        _error(
            c.post("/v1/sandboxes/n/ports", json={"port": 0}), 400, "SandboxError"
        )  # the shared checks, as the SDK raises
        assert c.get("/v1/sandboxes/n/netlog").json() == {"events": []}
        stats = c.get("/v1/sandboxes/n/stats").json()
        assert stats["pids"] >= 2 and stats["memory"] > 0, stats  # the http.server is running
        assert set(stats) >= {"memory", "pids", "cpu_time", "source", "memory_limit", "pids_limit"}


def test_twenty_sandboxes_times_ten_concurrent_execs(tcp: Serve, ws: Path) -> None:
    with tcp.client(limits=httpx.Limits(max_connections=200)) as c:

        def make(i: int) -> str:
            r = c.post("/v1/sandboxes", json={"name": f"c{i}", "workspace": str(ws)})
            assert r.status_code == 201, r.text
            return f"c{i}"

        def run(name_i: tuple[str, int]) -> tuple[str, str]:
            name, i = name_i
            r = c.post(f"/v1/sandboxes/{name}/exec", json={"argv": ["echo", f"{name}-{i}"]})
            assert r.status_code == 200, r.text
            return r.json()["stdout"], f"{name}-{i}\n"

        with ThreadPoolExecutor(20) as pool:
            names = list(pool.map(make, range(20)))
        with ThreadPoolExecutor(100) as pool:
            results = list(pool.map(run, [(n, i) for n in names for i in range(10)]))
        assert len(results) == 200 and all(got == want for got, want in results)


def test_sigkill_of_serve_leaves_sandboxes_alive_and_usable(
    tmp_path: Path, state_home: Path, ws: Path
) -> None:
    first = Serve(tmp_path)
    with first.client() as c:
        c.post("/v1/sandboxes", json={"name": "keep", "workspace": str(ws)}).raise_for_status()
        c.post("/v1/sandboxes/keep/processes", json={"argv": ["sleep", "300"]}).raise_for_status()
    first.stop(signal.SIGKILL)
    second = Serve(tmp_path)
    try:
        with second.client() as c:
            assert c.get("/v1/sandboxes/keep").json()["state"] == "running"
            ps = c.get("/v1/sandboxes/keep/processes").json()["processes"]
            assert any(p["argv"] == ["sleep", "300"] for p in ps)
            assert c.post("/v1/sandboxes/keep/exec", json={"argv": ["echo", "ok"]}).json()["stdout"] == "ok\n"
    finally:
        second.stop()


def test_sse_exec_reports_a_failure_as_an_error_event(unix: Serve, ws: Path) -> None:
    with unix.client(None) as c:
        c.post("/v1/sandboxes", json={"name": "e", "workspace": str(ws)}).raise_for_status()
        headers = {"Accept": "text/event-stream"}
        with c.stream("POST", "/v1/sandboxes/e/exec", json={"argv": ["no-such-tool"]}, headers=headers) as r:
            got = list(events(r.iter_lines()))
        assert got[-1][0] == "error" and got[-1][1]["error"]["type"] == "CommandNotFound"
    assert threading.active_count() >= 1


def test_sigterm_stops_serve_and_removes_its_socket(tmp_path: Path, state_home: Path) -> None:
    server = Serve(tmp_path, unix=True, token=False)
    assert server.socket is not None and os.path.exists(server.socket)
    server.stop(signal.SIGTERM)
    assert server.proc.returncode == 0
    assert not os.path.exists(server.socket)


def test_pause_and_resume_over_http(unix: Serve, ws: Path) -> None:
    """A paused sandbox does nothing (its counter file stands still) and refuses work with
    409 SandboxPaused; resumed, it goes on where it was. The remote SDK gets the same."""
    counter = (  # writes ./n atomically: a reader never sees it empty
        "import os, time\ni = 0\nwhile True:\n    i += 1\n    open('n.tmp', 'w').write(str(i))\n"
        "    os.replace('n.tmp', 'n')\n    time.sleep(0.02)"
    )
    with unix.client(None) as c:
        assert c.post("/v1/sandboxes", json={"name": "pz", "workspace": str(ws)}).status_code == 201
        assert (
            c.post("/v1/sandboxes/pz/processes", json={"argv": ["python3", "-c", counter]}).status_code == 201
        )
        deadline = time.monotonic() + 10
        while not ((ws / "n").exists() and (ws / "n").read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        r = c.post("/v1/sandboxes/pz/pause")
        assert r.status_code == 200 and r.json()["state"] == "paused"
        assert c.get("/v1/sandboxes/pz").json()["state"] == "paused"
        at = (ws / "n").read_text()
        time.sleep(0.5)
        assert (ws / "n").read_text() == at
        _error(c.post("/v1/sandboxes/pz/exec", json={"argv": ["true"]}), 409, "SandboxPaused")
        assert c.get("/v1/sandboxes/pz/stats").status_code == 200  # watching is allowed
        r = c.post("/v1/sandboxes/pz/resume")
        assert r.status_code == 200 and r.json()["state"] == "running"
        deadline = time.monotonic() + 10
        while (ws / "n").read_text() in ("", at) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert int((ws / "n").read_text() or 0) > int(at)
        _error(c.post("/v1/sandboxes/nope/pause"), 404, "SandboxNotFound")

    from warren.client.http import HttpTransport
    from warren.client.sandbox import Sandbox
    from warren.errors import SandboxPaused

    sb = Sandbox.get("pz", transport=HttpTransport(f"unix:{unix.socket}", None))
    sb.pause()
    assert sb.info.state == "paused" and sb.alive
    with pytest.raises(SandboxPaused):
        sb.exec(["true"])
    sb.resume()
    assert sb.exec(["echo", "on"]).stdout == b"on\n"
    sb.remove()
