"""Review sandboxes over `warren serve`'s HTTP API v1 and the library's HTTP transport:
diff, checkpoints, rollback, apply and discard, judged on the host's workspace."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import module_state
from service_util import Serve
from warren.client.http import HttpTransport
from warren.client.sandbox import Sandbox
from warren.errors import CheckpointError


@pytest.fixture(scope="module")
def unix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    for _ in module_state(tmp_path_factory):
        server = Serve(tmp_path_factory.mktemp("serve"), unix=True, token=False)
        yield server
        server.stop()


def _exec(c: object, name: str, script: str) -> str:
    r = c.post(f"/v1/sandboxes/{name}/exec", json={"argv": ["sh", "-c", script]})  # type: ignore[attr-defined]
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["exit_code"] == 0, body
    return str(body["stdout"])


def test_diff_checkpoint_rollback_apply_over_http(unix: Serve, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "keep.txt").write_text("keep\n")
    with unix.client(None) as c:
        r = c.post("/v1/sandboxes", json={"name": "rv-http", "workspace": str(ws), "review": True})
        assert r.status_code == 201, r.text
        _exec(c, "rv-http", "echo new > new.txt")
        r = c.get("/v1/sandboxes/rv-http/diff", params={"patch": "1"})
        assert r.status_code == 200
        assert [(x["kind"], x["path"]) for x in r.json()["changes"]] == [("added", "new.txt")]
        assert "+new" in r.json()["patch"] and not (ws / "new.txt").exists()
        r = c.post("/v1/sandboxes/rv-http/checkpoints")
        assert r.status_code == 201, r.text
        point = r.json()["id"]
        _exec(c, "rv-http", "rm -f keep.txt new.txt")
        assert "keep.txt" not in _exec(c, "rv-http", "ls")  # control: the removal shows
        listed = c.get("/v1/sandboxes/rv-http/checkpoints").json()["checkpoints"]
        assert point in [x["id"] for x in listed] and listed[-1]["command"] == "sh -c ls"
        r = c.post("/v1/sandboxes/rv-http/rollback", json={"id": point})
        assert r.status_code == 200 and r.json()["id"] == point, r.text
        assert _exec(c, "rv-http", "cat keep.txt new.txt") == "keep\nnew\n"
        # bad input: typed errors, nothing done
        for bad in ({"id": "x"}, {"id": -1}, {"keep_running": "yes"}, {"other": 1}):
            r = c.post("/v1/sandboxes/rv-http/rollback", json=bad)
            assert r.status_code == 400 and "error" in r.json(), (bad, r.text)
        r = c.post("/v1/sandboxes/rv-http/rollback", json={"id": 4242})
        assert r.status_code == 409 and r.json()["error"]["type"] == "CheckpointError"
        r = c.post("/v1/sandboxes/rv-http/apply", json={})
        assert r.status_code == 409 and r.json()["error"]["type"] == "ReviewError"  # still running
        assert not (ws / "new.txt").exists()
        r = c.post("/v1/sandboxes/rv-http/apply", json={"paths": [1]})
        assert r.status_code == 400
        # the library over HTTP: the same sandbox
        sb = Sandbox.get("rv-http", transport=HttpTransport(f"unix:{unix.socket}", None))
        assert [c.path for c in sb.diff().changes] == ["new.txt"]
        assert sb.checkpoints()[-1].id >= point
        with pytest.raises(CheckpointError, match="no checkpoint 4242"):
            sb.rollback(4242)
        Sandbox.get("rv-http").stop()  # no HTTP route stops a sandbox: the local one
        r = c.post("/v1/sandboxes/rv-http/apply", json={"paths": ["new.txt"]})
        assert r.status_code == 200 and r.json()["applied"] == ["new.txt"], r.text
        assert (ws / "new.txt").read_text() == "new\n"
        assert c.post("/v1/sandboxes/rv-http/discard").status_code == 200
        assert c.get("/v1/sandboxes/rv-http/diff").json()["changes"] == []
        assert c.delete("/v1/sandboxes/rv-http").status_code in (200, 204)
        r = c.get("/v1/sandboxes/nope/checkpoints")
        assert r.status_code == 404 and r.json()["error"]["type"] == "SandboxNotFound"
