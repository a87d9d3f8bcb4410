"""A long-lived sandbox's trail (``warren events``): every command, file operation and
network decision of a scripted session, in order, with who asked and how each command
ended; no secret's or environment variable's value in it; bounded under a flood; followed
as it grows. Judged on the host: the trail's files in warren's state, read directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gzip
import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import loopback_http, module_state, run_cli
from warren import protocol
from warren.cli import events as events_cli
from warren.client.sandbox import Sandbox
from warren.client.transport import trail_of
from warren.errors import ConfigError, HostError, WarrenError
from warren.net import log as netlog
from warren.policy import PolicySpec, build, config
from warren.server import trail

SECRET = "trail-secret-" + "7f3a9c" * 5  # the real value the proxy holds; the sandbox sees a placeholder
ENV_VALUE = "trail-env-value-" + "51e0" * 6  # an environment value given to one command


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from module_state(tmp_path_factory)


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    with loopback_http() as (port, _asked):
        yield port


@pytest.fixture(scope="module")
def sb(state: Path, server: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    ws = tmp_path_factory.mktemp("ws")
    hosts = ["allowed.test", "api.test"]
    spec = PolicySpec(
        workspace=str(ws),
        network="allow",
        allow_hosts=[*(f"{h}:{server}" for h in hosts), f"127.0.0.2:{server}"],
        resolve=dict.fromkeys(hosts, "127.0.0.2"),
        secrets=["TOKEN=WARREN_TEST_TRAIL_SECRET@api.test"],
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WARREN_TEST_TRAIL_SECRET", SECRET)
        box = Sandbox.create(build(spec), name="trail")
    with box:
        yield box


def _files(state: Path, name: str) -> list[Path]:
    return sorted((state / "warren" / "sandboxes" / name).glob("*.jsonl*"))


def _on_disk(state: Path, name: str) -> bytes:
    return b"".join(p.read_bytes() for p in _files(state, name))


def _curl(url: str, *headers: str) -> list[str]:
    return ["curl", "-sS", "--max-time", "10", "-o", "/dev/null", "-w", "%{http_code}", *headers, url]


def test_a_scripted_session_leaves_every_event_in_order(sb: Sandbox, state: Path, server: int) -> None:
    before = len(list(sb.events()))
    assert sb.exec(["true"]).ok
    sb.files.write("up.txt", b"uploaded\n")
    r = sb.exec(["sh", "-c", 'echo "$TRAIL_ENV"; exit 3'], env={"TRAIL_ENV": ENV_VALUE}, cwd="/tmp")
    assert r.exit_code == 3 and r.stdout.decode().strip() == ENV_VALUE  # the command had the value
    assert sb.exec(_curl(f"http://allowed.test:{server}/in")).stdout == b"200"
    assert sb.exec(_curl(f"http://denied.test:{server}/out")).stdout == b"403"
    records = list(sb.events())[before:]
    got = [
        (
            r["kind"],
            r.get("argv", [None])[0] if r["kind"] == "exec" else r.get("host", r.get("op", r.get("exit"))),
        )
        for r in records
    ]
    assert got == [
        ("exec", "true"),
        ("exec.end", 0),
        ("file", "write"),
        ("exec", "sh"),
        ("exec.end", 3),
        ("exec", "curl"),
        ("net", "allowed.test"),
        ("exec.end", 0),
        ("exec", "curl"),
        ("net", "denied.test"),
        ("exec.end", 0),
    ], records
    first, end = records[0], records[1]
    assert first["origin"] == "library" and first["uid"] >= 0 and first["peer_pid"] > 0
    assert end["id"] == first["id"] and end["duration"] >= 0 and end["signal"] is None
    assert records[2]["path"] == "up.txt"
    sh = records[3]
    assert sh["cwd"] == "/tmp" and sh["env"] == ["TRAIL_ENV"]  # the name, never the value
    assert records[6]["allowed"] is True and records[9]["allowed"] is False
    times = [r["time"] for r in records]
    assert times == sorted(times)
    # the same records are on the host, in warren's state: the trail and the network log
    disk = _on_disk(state, "trail")
    assert b'"argv":["true"]' in disk and b'"host":"denied.test"' in disk


def test_a_command_that_hits_its_timeout_says_so_in_the_trail(sb: Sandbox) -> None:
    r = sb.exec(["sleep", "30"], timeout=0.3)
    assert r.timed_out
    end = list(sb.events())[-1]
    assert end["kind"] == "exec.end" and end["timed_out"] is True and end["exit"] is None
    assert end["signal"] == 9 and end["duration"] < 10
    human = [line for line in map(events_cli.line, sb.events()) if " exec.end " in line][-1]
    assert "timed out" in human


def test_ends_of_commands_run_at_once_are_in_time_order_each_timed_by_its_end(sb: Sandbox) -> None:
    """An exec's end is recorded when its helper exits or before the next thing this
    sandbox records, at the time its helper saw it end: commands running side by side
    end in the trail in the order they ended, each with its own duration, and the trail
    read right after an answer holds that answer's end."""
    before = len(list(sb.events()))
    lengths = {"2.0": 0.0, "0.2": 0.0, "1.0": 0.0}

    def run(length: str) -> None:
        lengths[length] = sb.exec(["sleep", length]).duration

    threads = [threading.Thread(target=run, args=(length,)) for length in lengths]
    for t in threads:
        t.start()
        time.sleep(0.05)
    threads[1].join()
    assert [r["kind"] for r in list(sb.events())[before:]][-1] == "exec.end"  # the 0.2 s one's
    for t in threads:
        t.join()
    records = list(sb.events())[before:]
    started = {r["id"]: r["argv"][1] for r in records if r["kind"] == "exec"}
    ends = [r for r in records if r["kind"] == "exec.end"]
    # Each record whole in the message (a list is cut short there): what ended when.
    assert [started[r["id"]] for r in ends] == ["0.2", "1.0", "2.0"], "\n".join(map(json.dumps, records))
    times = [r["time"] for r in records]
    assert times == sorted(times), records
    for r in ends:
        length = float(started[r["id"]])
        assert length <= r["duration"] <= lengths[started[r["id"]]] + 0.05, (r, lengths)


def test_every_command_has_its_end_even_one_that_ends_before_its_start_is_recorded(sb: Sandbox) -> None:
    """A command can end before the supervisor writes its start (the record comes after
    the handoff): its end is still recorded, after its start. Busy loops beside make
    that common."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        before = len(list(sb.events()))
        for _ in range(150):
            assert sb.exec(["true"]).ok
    finally:
        for p in busy:
            p.kill()
            p.wait()
    records = list(sb.events())[before:]
    starts = [r["id"] for r in records if r["kind"] == "exec"]
    ends = [r["id"] for r in records if r["kind"] == "exec.end"]
    assert len(starts) == 150 and ends == starts, records


def test_the_cli_shows_the_trail_as_lines_and_as_json(sb: Sandbox) -> None:
    sb.exec(["echo", "from-the-cli-test"])
    human = run_cli(["events", "trail"], cwd=Path(sb.workspace))
    assert human.returncode == 0, human.stderr
    assert "$ echo from-the-cli-test" in human.stdout and "exit 0 after" in human.stdout
    as_json = run_cli(["events", "--json", "trail"], cwd=Path(sb.workspace))
    lines = [json.loads(x) for x in as_json.stdout.splitlines()]
    assert any(x.get("argv") == ["echo", "from-the-cli-test"] for x in lines)
    ours = run_cli(["exec", "trail", "--", "true"], cwd=Path(sb.workspace))
    assert ours.returncode == 0, ours.stderr
    last = [
        json.loads(x)
        for x in run_cli(["events", "--json", "trail"], cwd=Path(sb.workspace)).stdout.splitlines()
    ]
    assert [x["origin"] for x in last if x["kind"] == "exec"][-1] == "cli"
    missing = run_cli(["events", "no-such-sandbox"], cwd=Path(sb.workspace))
    assert (
        missing.returncode != 0 and "Traceback" not in missing.stderr and "no-such-sandbox" in missing.stderr
    )


def test_no_secret_or_environment_value_reaches_the_trail(sb: Sandbox, state: Path, server: int) -> None:
    script = 'echo "$TOKEN"; curl -sS --max-time 10 -o /dev/null -w "%{http_code}" '
    script += '-H "Authorization: Bearer $TOKEN" '
    r = sb.exec(["sh", "-c", script + f"http://api.test:{server}/s"], env={"TRAIL_ENV": ENV_VALUE})
    placeholder, code = r.stdout.decode().split("\n", 1)
    assert placeholder and placeholder != SECRET and code == "403"  # plain HTTP to a secret's host
    asked = [x for x in sb.events() if x["kind"] == "net" and x["host"] == "api.test"]
    assert asked and not asked[-1]["allowed"]  # the request is in the trail, refused
    disk = _on_disk(state, "trail")
    assert SECRET.encode() not in disk and ENV_VALUE.encode() not in disk
    # control: a value the trail does hold is found by the same look. The record is
    # written once the request is handed, beside the command (whose answer can come
    # first, under load): a read of the trail comes after it, as above.
    sb.exec(["echo", ENV_VALUE])
    assert any(x.get("argv") == ["echo", ENV_VALUE] for x in sb.events())
    assert ENV_VALUE.encode() in _on_disk(state, "trail")


def test_following_the_trail_sees_a_new_event(sb: Sandbox) -> None:
    marker = f"followed-{time.monotonic_ns()}"
    seen = threading.Event()
    reading = threading.Event()

    def follow() -> None:
        for record in sb.events(follow=True, poll=0.05):
            reading.set()
            if record.get("argv") == ["echo", marker]:
                seen.set()
                return  # the generator closes: the follower lets go

    sb.exec(["true"])  # the trail holds something before the follower starts
    threading.Thread(target=follow, daemon=True).start()
    assert reading.wait(10)  # it has read what was there
    assert not seen.is_set()  # control: the command is not in the trail before it runs
    sb.exec(["echo", marker])
    assert seen.wait(10), "the follower never saw the new command"


def test_the_async_sandbox_reads_the_same_trail(sb: Sandbox) -> None:
    from warren.client.aio import AsyncSandbox

    sb.exec(["echo", "async"])

    async def read() -> list[dict[str, object]]:
        return [r async for r in AsyncSandbox(sb.info).events()]

    got = asyncio.run(read())
    assert got == list(sb.events()) and got[-2]["argv"] == ["echo", "async"]


def test_a_follower_stops_when_the_sandbox_ends(state: Path, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    box = Sandbox.create(build(PolicySpec(workspace=str(ws))), name="ending")
    try:
        box.exec(["true"])

        def sleeper() -> None:
            with contextlib.suppress(WarrenError):  # its sandbox is stopped under it
                box.exec(["sleep", "30"])

        running = threading.Thread(target=sleeper)
        running.start()
        deadline = time.monotonic() + 10
        while not any(r.get("argv") == ["sleep", "30"] for r in box.events()):
            assert time.monotonic() < deadline, "the running command never reached the trail"
            time.sleep(0.02)
        done = threading.Event()
        got: list[dict[str, object]] = []

        def follow() -> None:
            got.extend(box.events(follow=True, poll=0.05))
            done.set()

        threading.Thread(target=follow, daemon=True).start()
        assert not done.wait(0.3)  # control: it waits while the sandbox runs
        box.stop()
        assert done.wait(10), "the follower did not end with the sandbox"
        assert [r["kind"] for r in got][-1] == "end"
        cut = [r for r in got if r["kind"] == "exec.end" and r.get("note")]
        assert [r["note"] for r in cut] == ["the sandbox was stopped while it ran"] and cut[0]["exit"] is None
        running.join(10)
        assert [p.name for p in _files(state, "ending")] == ["trail.jsonl"]  # kept after the stop
    finally:
        box.remove()
    assert _files(state, "ending") == []  # removed with the sandbox


@pytest.mark.caller_independent(half="root")
def test_the_trail_file_rotates_within_its_budget(tmp_path: Path) -> None:
    t = trail.Trail(str(tmp_path), size=64 * 1024)
    for i in range(5000):
        t.record("exec", id=str(i), argv=["x" * 100])
    t.close()
    sizes = [p.stat().st_size for p in (tmp_path / "trail.jsonl", tmp_path / "trail.jsonl.1")]
    assert all(s <= 64 * 1024 for s in sizes) and sum(sizes) > 64 * 1024, sizes
    lines, _after, _skip = trail.read(str(tmp_path))
    assert json.loads(lines[-1])["id"] == "4999"
    # control: the same records without a budget take ten times the room
    whole = tmp_path / "whole"
    whole.mkdir()
    u = trail.Trail(str(whole), size=1 << 40)
    for i in range(5000):
        u.record("exec", id=str(i), argv=["x" * 100])
    u.close()
    assert (whole / "trail.jsonl").stat().st_size > 5 * sum(sizes)


@pytest.mark.caller_independent(half="root")
def test_pages_merge_both_logs_in_order_each_record_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def line(t: str, **fields: object) -> str:
        return json.dumps({"time": f"2026-11-24T07:00:00.{t}Z", **fields}) + "\n"

    (tmp_path / "trail.jsonl.1").write_text(
        line("001", kind="exec", id="a") + line("003", kind="exec.end", id="a")
    )
    (tmp_path / "trail.jsonl").write_text(line("005", kind="file", op="write") + line("009", kind="end"))
    (tmp_path / "net.jsonl").write_text(
        line("002", method="GET", host="h", port=80, allowed=True, reason="r")
        + line("003", method="GET", host="h", port=80, allowed=False, reason="r")
        + line("006", kind="net.policy", change="allow h2")  # another kind (a policy change)
        + "not json\n"
    )
    monkeypatch.setattr(trail, "READ_MAX", 3)
    pages, after, skip = [], "", 0
    while True:
        lines, after, skip = trail.read(str(tmp_path), after, skip)
        if not lines:
            break
        pages.append([json.loads(x) for x in lines])
    assert [len(p) for p in pages] == [3, 3, 1]
    got = [(r["time"][-4:-1], r["kind"]) for p in pages for r in p]
    # at a tie (003) the network's decision comes before the command's end
    assert got == [
        ("001", "exec"),
        ("002", "net"),
        ("003", "net"),
        ("003", "exec.end"),
        ("005", "file"),
        ("006", "net.policy"),
        ("009", "end"),
    ]
    # a follower's look at a large trail with nothing new reads its last block only
    big = tmp_path / "big"
    big.mkdir()
    t = trail.Trail(str(big), size=1 << 30)
    for i in range(20_000):
        t.record("exec", id=str(i), argv=["x" * 200])
    t.close()
    lines, after, skip = trail.read(str(big), "9999")
    assert lines == [] and (big / "trail.jsonl").stat().st_size > 4 << 20
    reads: list[int] = []
    real = os.pread

    def counted(fd: int, n: int, at: int) -> bytes:
        reads.append(n)
        return real(fd, n, at)

    monkeypatch.setattr(os, "pread", counted)
    last = json.loads((big / "trail.jsonl").read_bytes().splitlines()[-1])["time"]
    assert trail.read(str(big), last, 10**9)[0] == []
    assert 0 < sum(reads) <= 2 * 64 * 1024, reads
    reads.clear()
    assert len(trail.read(str(big))[0]) == 3  # control: from the start it reads it all
    assert sum(reads) > 4 << 20


@pytest.mark.caller_independent(half="root")
def test_a_human_line_carries_no_control_character_from_the_trail() -> None:
    hostile = {"time": "t", "kind": "net", "method": "GET", "host": "\x1b]0;owned\x07h.test", "port": 80}
    shown = events_cli.line({**hostile, "allowed": False, "reason": "r\rX"})
    assert "\x1b" not in shown and "\x07" not in shown and "\r" not in shown
    assert "\\x1b]0;owned\\x07h.test" in shown  # escaped, still readable
    unknown = events_cli.line({"time": "t", "kind": "net.approval", "id": "\x1b[2J"})
    assert "\x1b" not in unknown and "net.approval" in unknown


@pytest.mark.caller_independent(half="root")
def test_records_lost_to_a_full_disk_are_counted_and_no_line_is_left_half_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = trail.Trail(str(tmp_path))
    t.record("exec", id="before")
    real = os.write
    room = [10]  # bytes the disk still takes

    def full(fd: int, data: bytes) -> int:
        if fd != t.fd:
            return real(fd, data)
        if room[0] <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = real(fd, bytes(data)[: room[0]])
        room[0] -= n
        return n

    monkeypatch.setattr(os, "write", full)
    for i in range(3):
        t.record("exec", id=f"lost-{i}")  # the first is cut after 10 bytes, the rest refused
    room[0] = 1 << 20
    t.record("exec", id="after")
    t.close()
    lines = [json.loads(x) for x in (tmp_path / "trail.jsonl").read_bytes().splitlines()]
    assert [(x["kind"], x.get("id"), x.get("count")) for x in lines] == [
        ("exec", "before", None),
        ("lost", None, 3),
        ("exec", "after", None),
    ]


@pytest.mark.caller_independent(half="root")
def test_a_bad_trail_budget_is_a_config_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "warren").mkdir()
    (tmp_path / "warren" / "config.toml").write_text('trail_budget = "lots"\n')
    with pytest.raises(ConfigError) as e:
        config.trail_budget({"XDG_CONFIG_HOME": str(tmp_path)}, tmp_path)
    assert "trail_budget" in e.value.message and e.value.hint
    (tmp_path / "warren" / "config.toml").write_text('trail_budget = "64K"\n')
    assert config.trail_budget({"XDG_CONFIG_HOME": str(tmp_path)}, tmp_path) == 64 << 10


@pytest.mark.caller_independent(half="root")
def test_a_huge_argv_is_cut_to_one_bounded_record(tmp_path: Path) -> None:
    t = trail.Trail(str(tmp_path))
    huge = protocol.Command(argv=["y" * 100_000] * 50)
    many = protocol.Command(argv=["true"], env={f"NAME_{i}": "v" for i in range(10_000)})
    for cmd in (huge, many):
        t.handed(protocol.ExecRequest(sandbox="s", command=cmd), {})
    t.record("note", text="z" * 100_000)
    t.close()
    lines = (tmp_path / "trail.jsonl").read_bytes().splitlines(keepends=True)
    assert len(lines) == 3 and all(len(x) <= trail.LINE_MAX and x.endswith(b"\n") for x in lines)
    a, b, c = (json.loads(x) for x in lines)  # cut, and still records
    assert a["argv"][-1] == "... (50 in all)" and len(a["argv"][0]) < 2000
    assert b["argv"] == ["true"] and b["env"][-1] == "... (10,000 in all)"
    assert c == {"time": c["time"], "kind": "note", "truncated": True}


FLOOD = r"""
import socket
n = 0
while n < 2000:
    s = socket.create_connection(("127.0.0.1", 3128))
    s.sendall(b"GET http://denied.test/x HTTP/1.1\r\nHost: denied.test\r\n\r\n")
    ok = s.recv(64).startswith(b"HTTP/1.1 403")
    s.close()
    n += ok
    if not ok:
        break
print("REFUSED", n)
"""


def test_a_flood_of_commands_and_requests_keeps_the_trail_within_its_budget(
    state_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Commands asked as fast as they run, by a user whose ``trail_budget`` is 32 KiB (the
    4 MiB default takes a thousand commands of long argv to fill: half a minute), then
    2,000 refused requests from inside: three times the budget is written, what stays is
    within it, the newest records are kept, and the requests add a bounded number of
    records (the network log's rate limit) to what ``events`` reads."""
    budget = 32 * 1024
    conf = tmp_path / "config"
    (conf / "warren").mkdir(parents=True)
    (conf / "warren" / "config.toml").write_text('trail_budget = "32K"\n')
    monkeypatch.setenv("XDG_CONFIG_HOME", str(conf))
    ws = tmp_path / "ws"
    ws.mkdir()
    spec = PolicySpec(workspace=str(ws), network="allow", allow_hosts=["allowed.test:1"])
    with Sandbox.create(build(spec), name="flood") as box:
        argv = ["true", *(["z" * 1000] * 2)]
        start = time.monotonic()
        for _ in range(50):
            assert box.exec(argv).ok
        took = time.monotonic() - start
        box.exec(["echo", "last"])
        files = {p.name: p.stat().st_size for p in _files(state_home, "flood")}
        assert sorted(files) == ["trail.jsonl", "trail.jsonl.1"], files  # rotated
        assert all(s <= budget for s in files.values()), files
        written = 50 * len(json.dumps(argv))
        assert written > sum(files.values()) + budget // 2, (written, files)  # the flood was bigger
        records = list(box.events())
        assert records[-2]["argv"] == ["echo", "last"] and records[-1]["kind"] == "exec.end"
        assert len(records) < 2 * 50  # the oldest went with the rotation
        before = len(records)
        r = box.exec(["python3", "-c", FLOOD], timeout=120)
        assert r.stdout.decode().strip() == "REFUSED 2000", (r.stdout, r.stderr)
        after = list(box.events())
        refused = [x for x in after if x["kind"] == "net"]
        assert 1 <= len(refused) <= netlog.PER_WINDOW + netlog.TARGETS + 1, len(refused)
        assert len(after) - before <= len(refused) + 2 < 2000  # the flood's command, its end
        print(f"50 commands in {took:.1f} s; trail on disk {sum(files.values()):,} bytes")


# --- OpenTelemetry ---------------------------------------------------------------------------


class Collector:
    """An OTLP/HTTP collector on loopback: each POST to /v1/traces decoded with the
    protocol's own messages (``opentelemetry-proto``)."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        self.spans: list[Any] = []
        self.resources: list[dict[str, Any]] = []
        self.paths: list[str] = []
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                message = ExportTraceServiceRequest.FromString(body)
                collector.paths.append(self.path)
                for rs in message.resource_spans:
                    collector.resources.append({a.key: _value(a.value) for a in rs.resource.attributes})
                    for ss in rs.scope_spans:
                        collector.spans.extend(ss.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _value(v: Any) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, which) if which else None


def _attributes(span: Any) -> dict[str, Any]:
    return {a.key: _value(a.value) for a in span.attributes}


def test_the_otlp_collector_receives_a_span_per_command_with_its_network_events(
    sb: Sandbox, server: int
) -> None:
    pytest.importorskip("opentelemetry.sdk", reason="the otel extra is in the dev extra: scripts/setup")
    sb.exec(["sh", "-c", "exit 5"])
    sb.files.write("otel.txt", b"x")
    sb.exec(_curl(f"http://allowed.test:{server}/otel"))
    sb.exec(_curl(f"http://denied.test:{server}/otel"))
    collector = Collector()
    try:
        # the environment's endpoint alone sends nothing; --otlp's wins over it
        quiet = run_cli(
            ["events", "trail"], cwd=Path(sb.workspace), env={"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url}
        )
        assert quiet.returncode == 0 and collector.paths == []
        elsewhere = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "",
        }
        r = run_cli(["events", "--otlp", collector.url, "trail"], cwd=Path(sb.workspace), env=elsewhere)
        assert r.returncode == 0, r.stderr
    finally:
        collector.close()
    assert collector.paths and set(collector.paths) == {"/v1/traces"}
    assert {"service.name": "warren", "warren.sandbox": "trail"}.items() <= collector.resources[0].items()
    execs = [s for s in collector.spans if s.name.startswith("exec ")]
    failed = next(s for s in execs if _attributes(s)["warren.argv"] == ["sh", "-c", "exit 5"])
    attrs = _attributes(failed)
    assert attrs["warren.exit"] == 5 and attrs["warren.origin"] == "library"
    assert failed.status.code == 2 and failed.end_time_unix_nano >= failed.start_time_unix_nano  # ERROR
    curls = [s for s in execs if s.name == "exec curl"][-2:]
    assert [[(e.name, _attributes(e)["warren.host"]) for e in s.events] for s in curls] == [
        [("net allowed", "allowed.test")],
        [("net refused", "denied.test")],
    ]
    assert all(s.events[0].time_unix_nano >= s.start_time_unix_nano for s in curls)
    files = [_attributes(s)["warren.path"] for s in collector.spans if s.name == "file write"]
    assert "otel.txt" in files


@pytest.mark.caller_independent(half="root")
def test_otlp_without_the_extra_is_a_typed_error_with_the_install_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from warren.client import otlp

    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(HostError) as e:
        otlp.Exporter("http://127.0.0.1:4318", "x")
    assert "otel" in e.value.message and "pip install 'warren-sandbox[otel]'" in (e.value.hint or "")
    with pytest.raises(WarrenError, match="--otlp wants"):
        otlp.endpoint("127.0.0.1:4318")
    assert otlp.endpoint("http://127.0.0.1:4318") == "http://127.0.0.1:4318/v1/traces"
    assert otlp.endpoint("https://c.example/otlp/v1/traces") == "https://c.example/otlp/v1/traces"


# --- over HTTP -------------------------------------------------------------------------------


def test_http_callers_are_named_by_their_tokens_id_and_the_trail_is_served_and_followed(
    sb: Sandbox, state: Path, tmp_path: Path
) -> None:
    from service_util import Serve
    from warren.client.http import HttpTransport

    server = Serve(tmp_path)
    try:
        assert server.token is not None
        token_id = hashlib.sha256(server.token.encode()).hexdigest()[:12]
        with server.client() as http:
            r = http.post("/v1/sandboxes/trail/exec", json={"argv": ["echo", "over-http"]})
            assert r.status_code == 200, r.text
            page = http.get("/v1/sandboxes/trail/events").json()
            assert page["running"] is True and page["after"]
            ours = [x for x in page["records"] if x.get("argv") == ["echo", "over-http"]]
            assert [x["origin"] for x in ours] == [f"http token {token_id}"]
            # a page from the cursor on holds only what came after it
            later = http.get(
                "/v1/sandboxes/trail/events", params={"after": page["after"], "skip": page["skip"]}
            )
            assert later.json()["records"] == []
            bad = http.get("/v1/sandboxes/trail/events", params={"skip": "x"})
            assert bad.status_code == 400 and "Traceback" not in bad.text
            # followed (SSE): what is there, then a new command as it comes
            marker = f"sse-{time.monotonic_ns()}"
            with http.stream(
                "GET", "/v1/sandboxes/trail/events", headers={"Accept": "text/event-stream"}
            ) as stream:
                lines = stream.iter_lines()
                assert (
                    http.post("/v1/sandboxes/trail/exec", json={"argv": ["echo", marker]}).status_code == 200
                )
                for line in lines:
                    if line.startswith("data: ") and marker in line:
                        break
        # the remote SDK reads the same trail
        remote = list(trail_of(HttpTransport(server.url, server.token), "trail"))
        assert any(x.get("argv") == ["echo", marker] for x in remote)
    finally:
        server.stop()
    disk = _on_disk(state, "trail")
    assert server.token.encode() not in disk  # never the token
    assert token_id.encode() in disk  # control: its id is, found by the same look


def test_mcp_callers_are_named_in_the_trail(state: Path, tmp_path: Path) -> None:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    ws = tmp_path / "mcp-ws"
    ws.mkdir()
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "warren", "mcp", "--workspace", str(ws)], env=dict(os.environ)
    )
    found: list[dict[str, object]] = []

    async def main() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            ran = await session.call_tool("run_command", {"argv": ["echo", "from-mcp"]})
            assert not ran.isError, ran.content
            wrote = await session.call_tool("write_file", {"path": "m.txt", "content": "x"})
            assert not wrote.isError, wrote.content
            # the agent reads its own sandbox's trail, a page at a time
            got = _mcp_data(await session.call_tool("sandbox_events", {}))
            assert [r["argv"] for r in got["records"] if r["kind"] == "exec"] == [["echo", "from-mcp"]]
            again = _mcp_data(
                await session.call_tool("sandbox_events", {"after": got["after"], "skip": got["skip"]})
            )
            assert again["records"] == [] and again["more"] is False
            for _ in range(55):  # 110 records more: two pages
                assert not (await session.call_tool("run_command", {"argv": ["true"]})).isError
            pages = [_mcp_data(await session.call_tool("sandbox_events", {}))]
            while pages[-1]["more"]:
                cursor = {"after": pages[-1]["after"], "skip": pages[-1]["skip"]}
                pages.append(_mcp_data(await session.call_tool("sandbox_events", cursor)))
            assert len(pages) == 2 and len(pages[0]["records"]) == 100
            paged = [r for p in pages for r in p["records"]]
            ours = [i for i in Sandbox.list() if i.name.endswith("default") and i.workspace == str(ws)]
            assert paged == list(Sandbox(ours[0]).events())  # each once, in order
            # read while the MCP server (which removes its sandboxes when it ends) runs
            ours = [i for i in Sandbox.list() if i.name.endswith("default") and i.workspace == str(ws)]
            assert len(ours) == 1, ours
            found.extend(Sandbox(ours[0]).events())

    asyncio.run(main())
    execs = [r for r in found if r["kind"] == "exec" and r["argv"] == ["echo", "from-mcp"]]
    files = [r for r in found if r["kind"] == "file" and r["path"] == "m.txt"]
    assert [r["origin"] for r in execs] == ["mcp"] and files and files[-1]["origin"] == "mcp"


def _mcp_data(result: Any) -> Any:
    assert not result.isError, result.content
    content = result.structuredContent
    return content if content is not None else json.loads(result.content[0].text)


def test_policy_and_pending_records_read_as_lines() -> None:
    """``warren net``'s records in the network log (a policy change, a connection waiting
    for approval) show as lines of their own, their sandbox-chosen host escaped."""
    from warren.server.trail import net_record

    policy = net_record(
        {
            "time": "t",
            "kind": "policy",
            "method": "APPROVE",
            "host": "a.test\x1b[2J",
            "by": "cli",
            "reason": "r",
        }
    )
    pending = net_record(
        {"time": "t", "kind": "pending", "method": "CONNECT", "host": "b.test", "port": 443, "request": 7}
    )
    decision = net_record(
        {"time": "t", "kind": "request", "method": "GET", "host": "c.test", "port": 80, "allowed": True}
    )
    assert (policy["kind"], pending["kind"], decision["kind"]) == ("policy", "pending", "net")
    assert "APPROVE a.test" in events_cli.line(policy) and "by cli" in events_cli.line(policy)
    assert "\x1b" not in events_cli.line(policy)
    assert "request 7 waits: CONNECT b.test:443" in events_cli.line(pending)
    assert "allowed GET c.test:80" in events_cli.line(decision)
