"""A running sandbox's network policy changed while it runs (``warren net NAME allow|deny``)
and ``--network ask``'s approvals, judged from the host: a loopback server here counts
the requests that reached it, so "the connection failed" is what the server saw, not
what the sandbox said.

The servers: 127.0.0.2 (the one a change allows, or an approval lets through), 127.0.0.4
(a "host service" a name may resolve to: DNS rebinding) and 127.0.0.5 (approved for
good). Not 127.0.0.1: the sandbox's tools reach that one directly (NO_PROXY), inside.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import warren
from conftest import module_state, run_cli
from service_util import Serve
from test_network import Server
from warren.client.http import events
from warren.client.sandbox import Sandbox
from warren.errors import PolicyError
from warren.models import NetPending
from warren.net import live
from warren.policy import PolicySpec, build

state = pytest.fixture(scope="module")(module_state)


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, Server]]:
    started = {
        "target": Server("127.0.0.2").start(),
        "host": Server("127.0.0.4").start(),
        "other": Server("127.0.0.5").start(),
    }
    yield started
    for s in started.values():
        s.stop()


@pytest.fixture(autouse=True)
def _clear_hits(servers: dict[str, Server]) -> None:
    for s in servers.values():
        s.hits.clear()


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ws")


def _curl(url: str) -> list[str]:
    return ["curl", "-sS", "--max-time", "20", url]


def _spec(ws: Path, **extra: object) -> PolicySpec:
    return PolicySpec(
        workspace=str(ws),
        resolve={"target.test": "127.0.0.2", "rebind.test": "127.0.0.4"},
        **extra,  # type: ignore[arg-type]
    )


def _until(what: Callable[[], list[NetPending]], timeout: float = 15) -> list[NetPending]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError("no pending request came")


@pytest.fixture(scope="module")
def allow_box(state: Path, ws: Path) -> Iterator[Sandbox]:
    with Sandbox.create(build(_spec(ws, network="allow")), name="netctl-allow") as sb:
        yield sb


@pytest.fixture(scope="module")
def ask_box(state: Path, ws: Path) -> Iterator[Sandbox]:
    with Sandbox.create(build(_spec(ws, network="ask", ask_timeout=30)), name="netctl-ask") as sb:
        yield sb


# --- allow and deny at run time ------------------------------------------------------------


def test_allow_at_run_time_reaches_the_host_then_deny_refuses_it(
    allow_box: Sandbox, servers: dict[str, Server]
) -> None:
    t = servers["target"]
    url = f"http://127.0.0.2:{t.port}/one"
    refused = allow_box.exec(_curl(url))
    assert "warren proxy refused GET 127.0.0.2" in refused.stdout.decode() and t.hits == []

    policy = allow_box.net_allow(f"127.0.0.2:{t.port}")
    assert policy.changed and policy.added == (f"127.0.0.2:{t.port}",) and policy.mode == "allow"
    reached = allow_box.exec(_curl(url))
    assert reached.stdout.decode() == "hello from 127.0.0.2\n", reached.stderr
    assert t.hits == ["/one"]  # the control: the server sees what gets through

    policy = allow_box.net_deny(f"127.0.0.2:{t.port}")
    assert policy.added == () and policy.denied == (f"127.0.0.2:{t.port}",)
    again = allow_box.exec(_curl(url))
    assert "denied by the rule" in again.stdout.decode()
    assert t.hits == ["/one"]

    # Every change is a record of its own in the network log, with who asked.
    changes = [e for e in allow_box.net_log() if e.kind == "policy"]
    assert [(e.method, e.host, e.allowed) for e in changes][-2:] == [
        ("ALLOW", f"127.0.0.2:{t.port}", True),
        ("DENY", f"127.0.0.2:{t.port}", False),
    ]
    assert all(e.by.startswith(f"library (uid {os.getuid()}, pid {os.getpid()})") for e in changes)
    allow_box.net_allow(f"127.0.0.2:{t.port}")  # lifts the deny
    assert allow_box.net_policy().denied == ()


def test_deny_wins_over_a_rule_given_at_create(state: Path, ws: Path, servers: dict[str, Server]) -> None:
    t = servers["target"]
    spec = _spec(ws, allow_hosts=[f"target.test:{t.port}", f"127.0.0.2:{t.port}"])
    with Sandbox.create(build(spec), name="netctl-deny") as sb:
        assert sb.exec(_curl(f"http://target.test:{t.port}/a")).ok and t.hits == ["/a"]
        sb.net_deny("target.test")  # no port: 80 and 443, as --allow-host reads it
        sb.net_deny(f"target.test:{t.port}")
        r = sb.exec(_curl(f"http://target.test:{t.port}/b"))
        assert "denied by the rule 'target.test:" in r.stdout.decode()
        assert t.hits == ["/a"]
        assert sb.net_policy().allowed == (f"target.test:{t.port}", f"127.0.0.2:{t.port}")


def test_a_change_never_widens_past_what_create_accepts(
    allow_box: Sandbox, ws: Path, servers: dict[str, Server]
) -> None:
    for entry in ("169.254.169.254:80", "*.com", "fe80::1", "pypi.org:99999", "exa mple.org"):
        with pytest.raises(PolicyError) as at_create:
            build(_spec(ws, allow_hosts=[entry]))
        with pytest.raises(PolicyError) as at_run:
            allow_box.net_allow(entry)
        # The same check, the same words (only where it was written differs), and a hint.
        assert at_run.value.message.split(": ", 1)[1] == at_create.value.message.split(": ", 1)[1]
        assert at_run.value.hint
    # A name allowed at run time is judged as one allowed at create: it resolves to the
    # host's own loopback, so the proxy refuses it (DNS rebinding) ...
    h = servers["host"]
    allow_box.net_allow(f"rebind.test:{h.port}")
    r = allow_box.exec(_curl(f"http://rebind.test:{h.port}/rebind"))
    assert "possible DNS rebinding" in r.stdout.decode() and h.hits == []
    # ... and the control: the address itself, allowed, does reach that server.
    allow_box.net_allow(f"127.0.0.4:{h.port}")
    assert allow_box.exec(_curl(f"http://127.0.0.4:{h.port}/direct")).ok
    assert h.hits == ["/direct"]


def test_a_sandbox_without_a_proxy_refuses_changes_with_a_hint(state: Path, ws: Path) -> None:
    with Sandbox.create(build(_spec(ws)), name="netctl-none") as sb:
        with pytest.raises(PolicyError, match="network 'none': there is no proxy") as e:
            sb.net_allow("pypi.org")
        assert "--network allow" in (e.value.hint or "")


def test_a_paused_sandbox_refuses_net_requests_with_a_hint(allow_box: Sandbox) -> None:
    allow_box.pause()
    try:
        with pytest.raises(warren.SandboxPaused) as e:
            allow_box.net_allow("paused.example.org")
        assert e.value.hint
    finally:
        allow_box.resume()
    assert "paused.example.org" not in allow_box.net_policy().added


# --- --network ask ---------------------------------------------------------------------------


def _target(sb: Sandbox, host: str, port: int) -> list[NetPending]:
    return [p for p in sb.net_pending() if (p.host, p.port) == (host, port)]


def test_a_pending_connection_approved_completes_rejected_is_refused(
    ask_box: Sandbox, servers: dict[str, Server]
) -> None:
    t = servers["target"]
    url = f"http://127.0.0.2:{t.port}/asked"
    proc = ask_box.spawn(_curl(url))
    (pending,) = _until(lambda: _target(ask_box, "127.0.0.2", t.port))
    assert pending.method == "GET" and t.hits == []  # it waits; nothing reached the server
    # Who asked: curl, numbered as the sandbox numbers it (a pid of its own namespace).
    assert pending.process.startswith("pid ") and f"curl -sS --max-time 20 {url}" in pending.process
    ask_box.net_approve(pending.id)
    assert proc.wait(timeout=20) == 0
    assert b"hello from 127.0.0.2" in proc.output().stdout and t.hits == ["/asked"]

    # Approved once is not approved for good: the next connection asks again.
    proc = ask_box.spawn(_curl(url))
    (pending,) = _until(lambda: _target(ask_box, "127.0.0.2", t.port))
    ask_box.net_reject(pending.id)
    proc.wait(timeout=20)
    assert f"rejected (request {pending.id}" in proc.output().text
    assert t.hits == ["/asked"]
    with pytest.raises(PolicyError, match=f"no pending request {pending.id}"):
        ask_box.net_approve(pending.id)

    records = [(e.method, e.host) for e in ask_box.net_log() if e.kind == "policy"]
    assert ("APPROVE", f"127.0.0.2:{t.port}") in records and ("REJECT", f"127.0.0.2:{t.port}") in records


def test_approve_always_allows_the_host_for_the_sandbox_life(
    ask_box: Sandbox, servers: dict[str, Server]
) -> None:
    o = servers["other"]  # a server of its own: the other tests' target stays unlisted
    url = f"http://127.0.0.5:{o.port}/always"
    proc = ask_box.spawn(_curl(url))
    (pending,) = _until(lambda: _target(ask_box, "127.0.0.5", o.port))
    policy = ask_box.net_approve(pending.id, always=True)
    assert f"127.0.0.5:{o.port}" in policy.added
    assert proc.wait(timeout=20) == 0
    start = time.monotonic()
    again = ask_box.exec(_curl(url))
    assert again.ok and time.monotonic() - start < 10 and _target(ask_box, "127.0.0.5", o.port) == []
    assert o.hits == ["/always", "/always"]


def test_an_unanswered_connection_times_out_with_the_proxys_refusal(
    state: Path, ws: Path, servers: dict[str, Server]
) -> None:
    t = servers["target"]
    with Sandbox.create(build(_spec(ws, network="ask", ask_timeout=1)), name="netctl-t") as sb:
        start = time.monotonic()
        r = sb.exec(_curl(f"http://127.0.0.2:{t.port}/late"))
        took = time.monotonic() - start
    assert "warren proxy refused GET 127.0.0.2" in r.stdout.decode()
    assert "no answer within 1 s" in r.stdout.decode()
    assert 1 <= took < 15 and t.hits == []


def test_a_one_shot_run_refuses_at_once_and_says_how_to_allow(ws: Path, servers: dict[str, Server]) -> None:
    t = servers["target"]
    start = time.monotonic()
    r = warren.run(_curl(f"http://127.0.0.2:{t.port}/run"), policy=build(_spec(ws, network="ask")))
    assert time.monotonic() - start < live_timeout_default() / 2
    out = r.stdout.decode()
    assert "nobody can answer here" in out and f"add --allow-host 127.0.0.2:{t.port}" in out
    assert t.hits == []


def live_timeout_default() -> float:
    from warren.policy.spec import DEFAULT_ASK_TIMEOUT

    return DEFAULT_ASK_TIMEOUT


_FLOOD = """
import select, socket, sys, threading, time
n, expected = int(sys.argv[1]), int(sys.argv[2])
socks = []
# At most 16 connects at once: each is made on one of PID 1's 32 broker workers, and
# more at once than that get ENOBUFS (known-limits); the flood is of the proxy's queue.
room = threading.Semaphore(16)
def one(i):
    with room:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=60)
    s.sendall(f"CONNECT h{i}.flood.test:443 HTTP/1.1\\r\\nHost: h{i}.flood.test:443\\r\\n\\r\\n".encode())
    socks.append(s)
threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
for t in threads: t.start()
for t in threads: t.join()
refused, left, deadline = 0, list(socks), time.monotonic() + 60
while left and refused < expected and time.monotonic() < deadline:
    ready, _, _ = select.select(left, [], [], 0.5)
    for s in ready:
        left.remove(s)
        if b" 403 " in s.recv(4096): refused += 1
time.sleep(0.5)  # one more look: a refusal past the expected ones would show now
ready, _, _ = select.select(left, [], [], 0)
refused += sum(1 for s in ready if b" 403 " in s.recv(4096))
print(refused, flush=True)
sys.stdin.read()
"""


def test_the_pending_queue_stays_bounded_under_a_flood(state: Path, ws: Path) -> None:
    n = live.MAX_PENDING + 40
    # A sandbox of its own, whose requests outlast any slowness of a loaded machine.
    spec = _spec(ws, network="ask", ask_timeout=600)
    with Sandbox.create(build(spec), name="netctl-flood") as sb:
        proc = sb.spawn(["python3", "-c", _FLOOD, str(n), str(n - live.MAX_PENDING)], stdin=True)
        deadline = time.monotonic() + 90
        while b"\n" not in proc.output().stdout and time.monotonic() < deadline:
            time.sleep(0.05)
        said = proc.output()
        refused_at_once = int(said.text.split()[0]) if said.text.strip() else -1

        def flood_waiting() -> list[NetPending]:
            return [p for p in sb.net_pending() if p.host.endswith(".flood.test")]

        flood = flood_waiting()
        while len(flood) < live.MAX_PENDING and time.monotonic() < deadline:  # heads still read
            time.sleep(0.05)
            flood = flood_waiting()
        why = f"{refused_at_once=} waiting={len(flood)} {said.stderr[-2000:]!r} " + repr(
            [e.reason for e in sb.net_log()][-5:]
        )
        # Exactly the queue's room waits; every connection past it was refused at once.
        assert len(flood) == live.MAX_PENDING, why
        assert refused_at_once == n - live.MAX_PENDING, why
        # A request that waits is a record of the log, within its budget (pending records
        # count against the refusals' rate limit: the window's first ones are logged).
        asked = {e.request for e in sb.net_log() if e.kind == "pending" and e.host.endswith(".flood.test")}
        assert asked and asked <= {p.id for p in flood}


# --- the command line ------------------------------------------------------------------------


def test_cli_net_shows_changes_and_answers(
    state: Path, ws: Path, allow_box: Sandbox, ask_box: Sandbox, servers: dict[str, Server]
) -> None:
    t = servers["target"]
    env = {"XDG_STATE_HOME": str(state)}
    r = run_cli(["net", "netctl-allow", "allow", "cli.example.org:8443"], cwd=ws, env=env)
    assert r.returncode == 0, r.stderr
    assert "allowed since:\n" in r.stdout and "  cli.example.org:8443\n" in r.stdout
    shown = json.loads(run_cli(["net", "--json", "netctl-allow"], cwd=ws, env=env).stdout)
    assert "cli.example.org:8443" in shown["added"] and shown["mode"] == "allow"
    log = run_cli(["logs", "--net", "netctl-allow"], cwd=ws, env=env).stdout
    assert "POLICY ALLOW cli.example.org:8443 by cli (uid" in log

    bad = run_cli(["net", "netctl-allow", "allow", "169.254.169.254"], cwd=ws, env=env)
    assert bad.returncode != 0 and "link-local and metadata addresses" in bad.stderr
    assert "Traceback" not in bad.stderr and "hint:" in bad.stderr
    bad = run_cli(["net", "netctl-ask", "approve", "x"], cwd=ws, env=env)
    assert bad.returncode != 0 and "is not a request id" in bad.stderr

    proc = ask_box.spawn(_curl(f"http://127.0.0.2:{t.port}/cli"))
    (pending,) = _until(lambda: _target(ask_box, "127.0.0.2", t.port))
    listed = run_cli(["net", "netctl-ask", "pending"], cwd=ws, env=env).stdout
    assert f"GET 127.0.0.2:{t.port}" in listed and "warren net netctl-ask approve" in listed
    r = run_cli(["net", "netctl-ask", "approve", str(pending.id)], cwd=ws, env=env)
    assert r.returncode == 0, r.stderr
    assert proc.wait(timeout=20) == 0 and t.hits == ["/cli"]


# --- warren run --network ask on a terminal --------------------------------------------------


def _on_a_terminal(
    ws: Path,
    env: dict[str, str],
    argv: list[str],
    answers: list[bytes],
    meanwhile: Callable[[bytes], None] | None = None,
) -> str:
    """What a terminal shows of ``warren run ARGV`` (the terminal its controlling one),
    typing the next of ``answers`` each time a question appears; ``meanwhile`` is given
    what was shown so far, again and again."""
    import fcntl
    import pty
    import select
    import subprocess
    import termios

    from conftest import WARREN

    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [*WARREN, "run", *argv],
        cwd=ws,
        env={**os.environ, **env},
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
        preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
    )
    os.close(slave)
    seen, asked = b"", 0
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.05)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every holder of the terminal is gone
                    break
                if not chunk:
                    break
                seen += chunk
            if seen.count(b"allow it? [y] once") > asked and asked < len(answers):
                os.write(master, answers[asked])
                asked += 1
            if meanwhile is not None:
                meanwhile(seen)
        proc.wait(timeout=30)
    finally:
        os.close(master)
        proc.kill()
    return seen.decode(errors="replace").replace("\r\n", "\n")


def _ask_flags(port: int) -> list[str]:
    return ["--network=ask", f"--allow-host=listed.test:{port}", "--resolve=listed.test=127.0.0.2"]


def test_a_run_on_a_terminal_asks_inline_and_the_answer_decides(
    ws: Path, servers: dict[str, Server], tmp_path: Path
) -> None:
    t = servers["target"]
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    url = f"http://127.0.0.2:{t.port}"
    script = f"curl -sS {url}/yes; echo; curl -sS {url}/no; echo; echo DONE"
    shown = _on_a_terminal(ws, env, [*_ask_flags(t.port), "--", "sh", "-c", script], [b"y", b"n"])
    assert shown.count(f"the sandbox asks to connect: GET 127.0.0.2:{t.port}") == 2, shown
    assert "allowed once" in shown and "refused\n" in shown and "DONE" in shown
    assert "hello from 127.0.0.2" in shown and "rejected (request 2" in shown
    assert t.hits == ["/yes"]  # judged by the server: the one approved, not the one refused


def test_no_question_is_written_into_a_full_screen_program(
    ws: Path, servers: dict[str, Server], tmp_path: Path
) -> None:
    t = servers["target"]
    config = tmp_path / "config"
    (config / "warren").mkdir(parents=True)
    (config / "warren" / "config.toml").write_text("ask_timeout = 1\n")
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(config)}
    script = (
        f"printf '\\033[?1049hIN-ALT\\n'; curl -sS http://127.0.0.2:{t.port}/alt; "
        "printf '\\033[?1049lLEFT\\n'; echo DONE"
    )
    shown = _on_a_terminal(ws, env, [*_ask_flags(t.port), "--", "sh", "-c", script], [b"y"])
    inside = shown.split("IN-ALT", 1)[1].split("LEFT", 1)[0]
    # Only the program's own output there (curl printing the proxy's 403 body): no line of
    # warren's, no question; the control is the test above, where the question does come.
    assert "warren:" not in inside and "the sandbox asks" not in inside, shown
    assert "no answer within 1 s" in inside  # the program's own output: curl's 403 body
    assert "the sandbox asks" not in shown and "DONE" in shown  # ended unasked: nothing left
    assert t.hits == []


# --- over HTTP ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def http(state: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    """``warren serve`` on a unix socket, with this module's state (its sandboxes)."""
    server = Serve(tmp_path_factory.mktemp("serve"), unix=True, token=False)
    yield server
    server.stop()


def test_http_changes_the_policy_and_answers_waiting_connections_from_events(
    http: Serve, allow_box: Sandbox, ask_box: Sandbox, servers: dict[str, Server]
) -> None:
    t = servers["target"]
    with http.client(None) as c, http.client(None) as answering:
        r = c.post(
            "/v1/sandboxes/netctl-allow/network", json={"action": "allow", "rule": "http.example.org:8443"}
        )
        assert r.status_code == 200, r.text
        assert "http.example.org:8443" in r.json()["added"]
        bad = c.post(
            "/v1/sandboxes/netctl-allow/network", json={"action": "allow", "rule": "169.254.169.254"}
        )
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "PolicyError"
        assert "link-local and metadata" in bad.json()["error"]["message"]
        none = c.post("/v1/sandboxes/netctl-ask/network/pending/999999", json={"action": "approve"})
        assert none.status_code == 400 and "no pending request 999999" in none.json()["error"]["message"]

        headers = {"Accept": "text/event-stream"}
        with c.stream("GET", "/v1/sandboxes/netctl-ask/network", headers=headers, timeout=30) as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            proc = ask_box.spawn(_curl(f"http://127.0.0.2:{t.port}/http"))
            asked = 0
            for event, data in events(stream.iter_lines()):
                if event == "pending" and (data["host"], data["port"]) == ("127.0.0.2", t.port):
                    asked = data["id"]
                    ok = answering.post(
                        f"/v1/sandboxes/netctl-ask/network/pending/{asked}", json={"action": "approve"}
                    )
                    assert ok.status_code == 200, ok.text
                if event == "ended" and data["id"] == asked:
                    break
        assert proc.wait(timeout=20) == 0 and t.hits == ["/http"]
    approvals = [e for e in ask_box.net_log() if e.kind == "policy" and e.method == "APPROVE"]
    assert approvals[-1].by.startswith("http (uid ")


def test_the_library_over_http_changes_the_policy_as_locally(http: Serve, allow_box: Sandbox) -> None:
    from warren.client.http import HttpTransport

    remote = Sandbox.get("netctl-allow", transport=HttpTransport(f"unix:{http.socket}", None))
    policy = remote.net_deny("remote.example.org")
    assert "remote.example.org" in policy.denied
    assert "remote.example.org" in allow_box.net_policy().denied  # the same sandbox, seen locally
    with pytest.raises(PolicyError, match="a wildcard must name a domain"):
        remote.net_allow("*.org")
    assert remote.net_pending() == []


# --- fidelity: a package manager under --network ask --------------------------------------------


def test_uv_waits_for_an_approval_and_installs_as_on_the_host(state: Path, ws: Path, tmp_path: Path) -> None:
    """uv sees a held connection as a slow answer: approved (always), the install goes on
    and a second one asks nothing."""
    import sys

    from test_network import _simple_index

    uv = os.path.join(os.path.dirname(sys.executable), "uv")
    index = Server("127.0.0.2", root=tmp_path / "index")
    _simple_index(index.root)  # type: ignore[arg-type]
    index.start()
    spec = PolicySpec(
        workspace=str(ws),
        network="ask",
        ask_timeout=30,
        # the address (a name resolving to it is refused without it: rebinding), not the name
        allow_hosts=[f"127.0.0.2:{index.port}"],
        resolve={"index.test": "127.0.0.2"},
        env={"UV_CACHE_DIR": str(ws / ".uv-ask-cache"), "UV_NO_PROGRESS": "1"},
    )
    script = f"""set -e
        {uv} venv -q --python /usr/bin/python3 $1
        {uv} pip install --python $1/bin/python --index-url http://index.test:{index.port}/simple/ warrennet
        $1/bin/python -c 'import warrennet; print("value", warrennet.VALUE)'
    """
    try:
        with Sandbox.create(build(spec), name="netctl-uv") as sb:
            proc = sb.spawn(["sh", "-c", script, "sh", ".venv-ask"])
            (pending,) = _until(lambda: _target(sb, "index.test", index.port), timeout=60)
            assert "uv" in pending.process
            sb.net_approve(pending.id, always=True)
            assert proc.wait(timeout=120) == 0, proc.output().stderr
            assert "value 42" in proc.output().text
            again = sb.exec(["sh", "-c", script, "sh", ".venv-ask2"], timeout=120)
            assert again.ok and "value 42" in again.stdout.decode(), again.stderr
            assert sb.net_pending() == []
        assert any(h.endswith(".whl") for h in index.hits), index.hits
    finally:
        index.stop()


def test_a_full_screen_program_is_answered_from_another_terminal(
    ws: Path, servers: dict[str, Server], tmp_path: Path
) -> None:
    """The run names itself before the program starts; `warren net RUN pending|approve`
    from elsewhere answers while the program holds the alternate screen."""
    import re

    t = servers["target"]
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    script = (
        f"printf '\\033[?1049hIN-ALT\\n'; curl -sS http://127.0.0.2:{t.port}/elsewhere; "
        "printf '\\033[?1049lLEFT\\n'; echo DONE"
    )
    answered: list[str] = []
    lists: list[str] = []  # what `warren net RUN pending` said last (a failure says it)

    def answer_elsewhere(seen: bytes) -> None:
        found = re.search(rb"answer from another terminal: warren net (run-[0-9a-f]+) pending", seen)
        if answered or found is None or b"IN-ALT" not in seen:
            return
        name = found.group(1).decode()
        pending = run_cli(["net", name, "pending"], cwd=ws, env=env)
        listed = pending.stdout
        lists[:] = [listed + pending.stderr]  # the last, for the failure's message
        ids = re.findall(rf"^ +(\d+) .*GET 127\.0\.0\.2:{t.port}", listed, re.MULTILINE)
        if ids:
            r = run_cli(["net", name, "approve", ids[0]], cwd=ws, env=env)
            answered.append(r.stdout + r.stderr)

    argv = [*_ask_flags(t.port), "--", "sh", "-c", script]
    shown = _on_a_terminal(ws, env, argv, [], meanwhile=answer_elsewhere)
    said = shown[-600:]
    assert answered and "Traceback" not in answered[0], (answered, lists, said)
    before, rest = shown.split("IN-ALT", 1)
    inside = rest.split("LEFT", 1)[0]
    assert "warren net run-" in before  # said before the program started
    assert "warren" not in inside and "hello from 127.0.0.2" in inside, shown
    assert t.hits == ["/elsewhere"]


def test_an_asking_run_is_named_in_started_before_any_output(ws: Path, servers: dict[str, Server]) -> None:
    """The name a full-screen program's user answers by (`warren net RUN pending`) comes
    in the run's Started, which the client reads before the command's output: not only
    in the network helper's first event, whose pipe may be read after the program already
    switched to the alternate screen (then the line was never said). Here that pipe is
    never read at all; the control: a run that does not ask here is given no name."""
    from warren import protocol, wire
    from warren.client import connect

    t = servers["target"]

    def started(network: str, net_ask: bool) -> protocol.Started:
        sock = connect.supervisor()
        net_r, net_w = os.pipe2(os.O_CLOEXEC)
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            message = protocol.RunRequest(
                spec=protocol.Spec(workspace=str(ws), network=network, allow_host=[f"listed.test:{t.port}"]),
                caller=protocol.Caller(cwd=str(ws), env=dict(os.environ)),
                command=protocol.Command(argv=["true"], stdio=[True, True, True]),
                net_events=True,
                net_ask=net_ask,
            )
            connect.send_request(sock, message, [null, null, null, net_w])
            msg, _payload, fds = wire.recv(sock, (protocol.Started, protocol.Exited, protocol.Error))
            for fd in fds:
                os.close(fd)
            assert isinstance(msg, protocol.Started), msg
            wire.recv(sock, (protocol.Exited,))
            return msg
        finally:
            sock.close()
            for fd in (net_r, net_w, null):
                os.close(fd)

    name = started("ask", True).ask_name
    assert name is not None and name.startswith("run-"), name
    assert started("ask", False).ask_name is None  # not asked on a terminal: `warren net` alone
    assert started("allow", True).ask_name is None  # nothing is asked in this mode


def test_an_mcp_agent_sees_its_waiting_request_and_cannot_answer_it(
    state: Path, ws: Path, servers: dict[str, Server]
) -> None:
    """Over MCP the agent reads its sandbox's policy and the request its command waits on
    (``sandbox_network``), so it can tell its user the id; no tool changes the policy or
    answers. The user's ``warren net approve`` on the host lets the command through."""
    import asyncio
    import sys

    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    t = servers["target"]
    argv = [sys.executable, "-m", "warren", "mcp", "--workspace", str(ws), "--network", "ask"]
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=dict(os.environ))

    def data(result: object) -> dict[str, object]:
        assert not result.isError, result.content  # type: ignore[attr-defined]
        got = result.structuredContent  # type: ignore[attr-defined]
        return got if got is not None else json.loads(result.content[0].text)  # type: ignore[attr-defined]

    async def main() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            tools = {tool.name for tool in (await session.list_tools()).tools}
            assert not {n for n in tools if "approve" in n or "allow" in n or n.startswith("net_")}, tools
            started = data(
                await session.call_tool(
                    "start_process",
                    {
                        "argv": [
                            "curl",
                            "-sS",
                            "-o",
                            "/dev/null",
                            "-w",
                            "%{http_code}",
                            f"http://127.0.0.2:{t.port}/mcp",
                        ]
                    },
                )
            )
            deadline = time.monotonic() + 20
            while True:
                policy = data(await session.call_tool("sandbox_network", {}))
                if policy["pending"] or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
            assert policy["mode"] == "ask" and t.hits == [], policy
            (waiting,) = policy["pending"]  # type: ignore[misc]
            assert (waiting["host"], waiting["port"]) == ("127.0.0.2", t.port)
            (mine,) = [i for i in Sandbox.list() if i.workspace == str(ws) and i.name.endswith("default")]
            Sandbox(mine).net_approve(int(waiting["id"]))
            deadline = time.monotonic() + 20
            out: dict[str, object] = {}
            while time.monotonic() < deadline:
                out = data(await session.call_tool("process_output", {"id": started["id"]}))
                if out.get("exit_code") is not None:
                    break
                await asyncio.sleep(0.05)
            assert "200" in str(out.get("stdout")), out
            assert [h for h in t.hits if h.endswith("/mcp")], t.hits

    asyncio.run(main())
