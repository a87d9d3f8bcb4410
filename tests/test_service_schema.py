"""The OpenAPI document is the contract: schemathesis fuzzes a real `warren serve`
(valid and invalid data: its coverage and fuzzing phases, deterministic, bounded) and
every answer must be a documented status with a body of the documented shape, never a
5xx. Two runs: every operation with generated names (mostly no such sandbox), then
the operations of one sandbox with its name pinned to a live one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from service_util import Serve

CHECKS = "not_a_server_error,status_code_conformance,response_schema_conformance"
EXAMPLES = 10  # per operation: both runs together take about a minute on 2 cores


def _schemathesis(server: Serve, cwd: Path, *extra: str, config: Path | None = None) -> str:
    schemathesis = Path(sys.executable).with_name("schemathesis")
    if not schemathesis.exists():
        pytest.fail("schemathesis is not installed (it is in the dev extra)")
    args = [str(schemathesis), *(["--config-file", str(config)] if config else []), "run"]
    args += [f"{server.url}/v1/openapi.json", "--checks", CHECKS, "--mode", "all"]
    args += ["--phases", "coverage,fuzzing", "--max-examples", str(EXAMPLES), "--generation-deterministic"]
    args += ["--workers", "1", "--no-shrink", "--request-timeout", "60", "--no-color"]
    args += ["--header", f"Authorization: Bearer {server.token}", *extra]
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=400)
    out = proc.stdout
    assert proc.returncode == 0, out[-6000:] + proc.stderr[-2000:]
    assert " passed" in out and "failure" not in out.lower().replace("0 failures", ""), out[-3000:]
    return out


@pytest.mark.caller_independent
def test_schemathesis_finds_no_failure_against_a_real_server(tmp_path: Path, state_home: Path) -> None:
    cwd = tmp_path / "cwd"  # where a policy without a workspace puts a sandbox
    cwd.mkdir()
    server = Serve(tmp_path)
    try:
        with server.client() as c:
            assert c.post("/v1/sandboxes", json={"name": "a", "workspace": str(cwd)}).status_code == 201
        _schemathesis(server, cwd)
        with server.client() as c:
            # the first run may have removed it (its generated names include "a")
            if c.get("/v1/sandboxes/a").status_code == 404:
                assert c.post("/v1/sandboxes", json={"name": "a", "workspace": str(cwd)}).status_code == 201
        config = tmp_path / "schemathesis.toml"
        config.write_text('[parameters]\n"path.name" = "a"\n')
        _schemathesis(server, cwd, "--include-path-regex", r"^/v1/sandboxes/\{name\}/", config=config)
        log = server.log.read_text()
        assert "/v1/sandboxes/a/exec 422" in log  # control: the second run reached the live sandbox
        assert " 500 " not in log and "Traceback" not in log, log[-3000:]
    finally:
        server.stop()
