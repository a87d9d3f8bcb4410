"""``warren serve``'s bearer token is no sandbox's to read: by default it lives in
warren's state directory (hidden in every sandbox), and a ``--token-file`` elsewhere
is denied in every sandbox started after the server, through the API or not. Judged
by what a sandbox could print, with controls: the same file is read before the server
named it, and a copy outside the denial is read."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import WARREN
from service_util import Serve
from warren.policy import PolicySpec, build


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    d = tmp_path / "ws"
    d.mkdir()
    return d


@pytest.fixture
def default_token_serve(tmp_path: Path, state_home: Path) -> Iterator[Serve]:
    s = Serve(tmp_path, token=False)
    yield s
    s.stop()


def _run(ws: Path, *argv: str, read: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    flags = [f"--read={r}" for r in read]
    return subprocess.run(
        [*WARREN, "run", "-w", str(ws), *flags, "--", *argv], capture_output=True, text=True, timeout=60
    )


def test_tcp_without_a_token_uses_one_made_in_the_state_directory(
    default_token_serve: Serve, state_home: Path, ws: Path
) -> None:
    path = state_home / "warren" / "serve.token"
    token = path.read_text().strip()
    # E2B's SDK takes only keys of the form e2b_ + hex: the token serves its API as is
    assert re.fullmatch(r"e2b_[0-9a-f]{64}", token) and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert f"a new token is in {path}" in default_token_serve.log.read_text()
    run = {"argv": ["cat", str(path)], "policy": {"workspace": str(ws)}}
    with default_token_serve.client(None) as c:
        assert c.post("/v1/run", json=run).status_code == 401
    with default_token_serve.client(token) as c:
        r = c.post("/v1/run", json=run)
        assert r.status_code == 200, r.text
        # a sandbox cannot read it (the state directory is hidden) ...
        assert r.json()["exit_code"] != 0 and token not in r.json()["stdout"]
        # ... control: a copy where the sandbox may read is read, and printed
        (ws / "copy").write_text(token)
        r = c.post("/v1/run", json={**run, "argv": ["cat", str(ws / "copy")]})
        assert r.json()["stdout"] == token


def test_a_token_file_elsewhere_is_denied_in_sandboxes_started_after_the_server(
    tmp_path: Path, state_home: Path, ws: Path
) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    token_file = keys / "token"
    token = os.urandom(16).hex()
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    # control: before the server names it, a sandbox that may read the directory reads it
    before = _run(ws, "cat", str(token_file), read=(str(keys),))
    assert before.stdout.strip() == token, before.stderr
    serve = Serve(tmp_path, token=False, extra=("--token-file", str(token_file)))
    try:
        after = _run(ws, "cat", str(token_file), read=(str(keys),))
        assert after.returncode != 0 and token not in after.stdout
        with serve.client(token) as c:
            r = c.post(
                "/v1/run",
                json={
                    "argv": ["cat", str(token_file)],
                    "policy": {"workspace": str(ws), "read": [str(keys)]},
                },
            )
            assert r.status_code == 200 and r.json()["exit_code"] != 0 and token not in r.json()["stdout"]
    finally:
        serve.stop()
    # still denied after the server ended: the token may be in use again
    assert token not in _run(ws, "cat", str(token_file), read=(str(keys),)).stdout
    # nothing was written to the state directory's default token
    assert not (state_home / "warren" / "serve.token").exists()


def test_the_old_documented_token_location_is_denied_by_default(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home)}
    ws = home / "ws"
    ws.mkdir()
    policy = build(PolicySpec(workspace=str(ws)), env=env, home=home, cwd=ws)
    assert str(home / ".warren-token") in {str(r.path) for r in policy.denied}
    # control: without the default deny list it is not
    policy = build(PolicySpec(workspace=str(ws), default_deny=False), env=env, home=home, cwd=ws)
    assert str(home / ".warren-token") not in {str(r.path) for r in policy.denied}
