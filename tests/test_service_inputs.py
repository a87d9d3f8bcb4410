"""Every bad number `warren serve` can be sent is a typed 4xx naming it, never a 500
(found by fuzzing: timeouts that overflow, pids 0/1/huge, offsets past 2^63); each with
a control showing the good value works."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from conftest import module_state
from service_util import Serve


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from module_state(tmp_path_factory)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, state: Path) -> Iterator[tuple[Serve, str]]:
    tmp = tmp_path_factory.mktemp("serve")
    ws = tmp / "ws"
    ws.mkdir()
    server = Serve(tmp)
    with server.client() as c:
        r = c.post("/v1/sandboxes", json={"name": "inputs", "workspace": str(ws)})
        assert r.status_code == 201, r.text
    yield server, "/v1/sandboxes/inputs"
    server.stop()


@pytest.fixture
def c(served: tuple[Serve, str]) -> Iterator[httpx.Client]:
    with served[0].client() as client:
        yield client


@pytest.fixture
def sb(served: tuple[Serve, str]) -> str:
    return served[1]


def _typed(r: httpx.Response, status: int, kind: str | None = None) -> str:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    if kind is not None:
        assert error["type"] == kind, error
    return str(error["message"])


@pytest.mark.parametrize("timeout", [0, -1, 1e16, 1e300, 10**30, "5", True])
def test_a_timeout_out_of_range_is_400_on_exec_and_run(
    c: httpx.Client, sb: str, timeout: object, tmp_path: Path
) -> None:
    assert "timeout" in _typed(c.post(f"{sb}/exec", json={"argv": ["true"], "timeout": timeout}), 400)
    run = {"argv": ["true"], "timeout": timeout, "policy": {"workspace": str(tmp_path)}}
    assert "timeout" in _typed(c.post("/v1/run", json=run), 400)
    spawn = c.post(f"{sb}/processes", json={"argv": ["true"], "timeout": timeout})
    assert "timeout" in _typed(spawn, 400)


def test_a_timeout_in_range_is_a_limit(c: httpx.Client, sb: str) -> None:
    r = c.post(f"{sb}/exec", json={"argv": ["sleep", "5"], "timeout": 0.5})
    assert r.status_code == 200 and r.json()["timed_out"], r.text
    r = c.post(f"{sb}/exec", json={"argv": ["true"], "timeout": 7 * 24 * 3600})
    assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text


@pytest.mark.parametrize("limit", [-1, 1 << 70, 1.5])
def test_an_output_limit_out_of_range_is_400(c: httpx.Client, sb: str, limit: object) -> None:
    assert "output_limit" in _typed(c.post(f"{sb}/exec", json={"argv": ["true"], "output_limit": limit}), 400)


@pytest.mark.parametrize("pid", ["0", "1", "-1", "-5", str(1 << 31), "9" * 30, "4194303"])
def test_a_signal_to_a_pid_that_is_not_the_sandboxs_process_is_404(
    c: httpx.Client, sb: str, pid: str
) -> None:
    r = c.post(f"{sb}/processes/{pid}/signal", json={"signal": "SIGKILL"})
    _typed(r, 404, "ProcessNotFound")
    # the sandbox is unharmed (a signal to its PID 1 or to every process would end it)
    assert c.get(sb).json()["state"] == "running"


def test_a_signal_to_the_sandboxs_process_reaches_it(c: httpx.Client, sb: str) -> None:
    started = c.post(f"{sb}/processes", json={"argv": ["sleep", "60"]}).json()
    r = c.post(f"{sb}/processes/{started['pid']}/signal", json={"signal": "SIGKILL"})
    assert r.status_code == 200 and r.json() == {"ok": True}, r.text
    for _ in range(100):
        state = c.get(f"{sb}/processes/{started['id']}").json()
        if not state["running"]:
            break
        time.sleep(0.05)
    assert state["exit_code"] == 128 + 9
    # once it is gone, its pid names no process of the sandbox
    _typed(c.post(f"{sb}/processes/{started['pid']}/signal", json={}), 404, "ProcessNotFound")


@pytest.mark.parametrize("sig", [0, 65, -1, "SIGNOPE", 1 << 70, None])
def test_a_bad_signal_is_400(c: httpx.Client, sb: str, sig: object) -> None:
    _typed(c.post(f"{sb}/processes/2/signal", json={"signal": sig}), 400)


def test_offsets_past_the_bound_are_400_and_the_process_still_answers(c: httpx.Client, sb: str) -> None:
    started = c.post(f"{sb}/processes", json={"argv": ["echo", "hi"]}).json()
    base = f"{sb}/processes/{started['id']}"
    for query in (f"offset={1 << 70}", f"stderr_offset={1 << 63}", "offset=-1", "offset=1e3", "offset=٣"):
        _typed(c.get(f"{base}?{query}"), 400)
        _typed(c.get(f"{base}/output?{query}"), 400)
    for last in (f"{1 << 70}:0", "0:99999999999999999999999", "1:x"):
        _typed(c.get(f"{base}/output", headers={"Last-Event-ID": last}), 400)
    r = c.get(f"{base}?offset={1 << 40}")
    assert r.status_code == 200 and r.json()["next_offset"] == 1 << 40


@pytest.mark.parametrize("value", ["null", "maybe", "2"])
def test_a_boolean_query_parameter_that_is_not_one_is_400(c: httpx.Client, sb: str, value: str) -> None:
    _typed(c.delete(f"{sb}?remove={value}"), 400)
    assert c.get(sb).json()["state"] == "running"


def test_a_create_without_a_body_is_400_and_makes_no_sandbox(c: httpx.Client) -> None:
    before = len(c.get("/v1/sandboxes").json()["sandboxes"])
    _typed(c.post("/v1/sandboxes"), 400)
    assert len(c.get("/v1/sandboxes").json()["sandboxes"]) == before


def test_a_method_a_route_lacks_is_405_with_allow(c: httpx.Client, sb: str) -> None:
    r = c.request("PATCH", "/v1/sandboxes")
    _typed(r, 405)
    assert set(r.headers["allow"].replace(" ", "").split(",")) >= {"GET", "POST"}
    r = c.put(f"{sb}/exec")
    _typed(r, 405)
    assert "POST" in r.headers["allow"]


def test_the_delete_answer_is_a_documented_state(c: httpx.Client, tmp_path: Path) -> None:
    doc = c.get("/v1/openapi.json").json()
    states = doc["components"]["schemas"]["Sandbox"]["properties"]["state"]["enum"]
    ws = tmp_path / "ws"
    ws.mkdir()
    assert c.post("/v1/sandboxes", json={"name": "gone", "workspace": str(ws)}).status_code == 201
    r = c.delete("/v1/sandboxes/gone")
    assert r.status_code == 200 and r.json()["state"] in states, (r.json(), states)
