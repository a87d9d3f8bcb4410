"""`POST /v1/sandboxes/{name}/processes/{id}/stdin` on a real `warren serve`, with a
real HTTP client (httpx): JSON and raw bodies, and every refusal as a typed error
with its status."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service_util import Serve
from warren.protocol import STDIN_MAX_QUEUED

UPPER = "import sys\nfor line in sys.stdin:\n    print(line.upper(), end='', flush=True)\n"


@pytest.fixture
def client(tmp_path: Path, state_home: Path) -> Iterator[httpx.Client]:
    server = Serve(tmp_path)
    ws = tmp_path / "ws"
    ws.mkdir()
    try:
        with server.client() as c:
            c.post("/v1/sandboxes", json={"name": "box", "workspace": str(ws)}).raise_for_status()
            yield c
    finally:
        server.stop()


def _error(r: httpx.Response, status: int, kind: str) -> dict[str, object]:
    assert r.status_code == status, r.text
    body = r.json()["error"]
    assert body["type"] == kind, body
    assert body["message"] and body["hint"], body
    return dict(body)


def _spawn(c: httpx.Client, argv: list[str], stdin: bool = True) -> tuple[str, int]:
    r = c.post("/v1/sandboxes/box/processes", json={"argv": argv, "stdin": stdin})
    assert r.status_code == 201, r.text
    return r.json()["id"], r.json()["pid"]


def _finished(c: httpx.Client, ident: str) -> dict[str, object]:
    deadline = time.monotonic() + 15
    while True:
        state = c.get(f"/v1/sandboxes/box/processes/{ident}").json()
        if not state["running"]:
            return dict(state)
        assert time.monotonic() < deadline, state
        time.sleep(0.05)


def test_json_and_raw_bodies_reach_the_process_in_order(client: httpx.Client) -> None:
    c = client
    ident, pid = _spawn(c, ["python3", "-c", UPPER])
    url = f"/v1/sandboxes/box/processes/{ident}/stdin"
    r = c.post(url, json={"data": "one\n"})
    assert r.status_code == 200 and r.json() == {"queued": 0, "closed": False}
    deadline = time.monotonic() + 10
    while c.get(f"/v1/sandboxes/box/processes/{ident}").json()["stdout"] != "ONE\n":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    two = base64.b64encode(b"two\n").decode()
    assert c.post(url, json={"data": two, "encoding": "base64"}).status_code == 200
    raw = {"Content-Type": "application/octet-stream"}
    assert (
        c.post(f"/v1/sandboxes/box/processes/{pid}/stdin", content=b"three\n", headers=raw).status_code == 200
    )
    r = c.post(url, content=b"four\n", headers=raw, params={"eof": "true"})
    assert r.status_code == 200 and r.json()["closed"] is True
    state = _finished(c, ident)
    assert state["exit_code"] == 0 and state["stdout"] == "ONE\nTWO\nTHREE\nFOUR\n"

    counter, _ = _spawn(c, ["wc", "-c"])
    for _ in range(3):
        c.post(f"/v1/sandboxes/box/processes/{counter}/stdin", content=b"x" * 100_000, headers=raw)
    assert c.post(f"/v1/sandboxes/box/processes/{counter}/stdin", json={"eof": True}).status_code == 200
    assert str(_finished(c, counter)["stdout"]).strip() == "300000"


def test_refusals_are_typed_errors_with_their_status(client: httpx.Client) -> None:
    c = client
    raw = {"Content-Type": "application/octet-stream"}

    def stdin(ident: str | int, **kwargs: object) -> httpx.Response:
        return c.post(f"/v1/sandboxes/box/processes/{ident}/stdin", **kwargs)  # type: ignore[arg-type]

    _error(stdin("0123456789ab", json={"data": "x"}), 404, "ProcessNotFound")
    _error(stdin(999999, json={"data": "x"}), 404, "ProcessNotFound")
    _error(c.post("/v1/sandboxes/nope/processes/abc/stdin", json={"data": "x"}), 404, "SandboxNotFound")

    plain, _ = _spawn(c, ["sleep", "30"], stdin=False)
    body = _error(stdin(plain, json={"data": "x"}), 409, "StdinNotOpen")
    assert body["path"] == plain

    closed, _ = _spawn(c, ["sleep", "30"])
    assert stdin(closed, json={"eof": True}).status_code == 200
    assert stdin(closed, json={"eof": True}).status_code == 200  # again: nothing to do
    _error(stdin(closed, json={"data": "late"}), 409, "StdinClosed")

    ended, _ = _spawn(c, ["true"])
    _finished(c, ended)
    _error(stdin(ended, json={"data": "late"}), 409, "ProcessEnded")

    sleeper, _ = _spawn(c, ["sleep", "60"])
    body = _error(stdin(sleeper, content=b"x" * (STDIN_MAX_QUEUED + 1), headers=raw), 413, "StdinFull")
    assert "in parts" in str(body["hint"])
    accepted = 0
    while (r := stdin(sleeper, content=b"y" * (1 << 20), headers=raw)).status_code == 200:
        accepted += 1 << 20
        assert accepted <= STDIN_MAX_QUEUED + (1 << 20), "the bound was never reached"
    # the pipe takes up to 1 MiB, then at most 4 MiB wait in warren's queue
    assert accepted >= STDIN_MAX_QUEUED
    body = _error(r, 413, "StdinFull")
    assert "not reading" in str(body["message"])

    for bad in (
        {"data": 5},
        {"data": "x", "encoding": "latin-1"},
        {"data": "not base64!", "encoding": "base64"},
        {"eof": "yes"},
        {"data": "x", "stdin": True},
    ):
        _error(stdin(sleeper, json=bad), 400, "WarrenError")
    _error(stdin(sleeper, content=b"{not json"), 400, "WarrenError")
    r = c.post("/v1/sandboxes/box/processes", json={"argv": ["cat"], "stdin": "yes"})
    _error(r, 400, "WarrenError")
    for ident in (plain, closed, sleeper):
        c.post(f"/v1/sandboxes/box/processes/{ident}/signal", json={"signal": "SIGKILL"})
