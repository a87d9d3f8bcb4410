"""warren as a Deep Agents sandbox backend, against the real ``deepagents``: the
backend's own primitives (execute, uploads, downloads), the file tools Deep Agents
builds on them, confinement judged on the host, one ``create_deep_agent`` run with a
scripted chat model, and the Deep Agents Code provider
found through its entry-point group (that part needs ``deepagents-code``, which is
not in the dev extra: its pins conflict with pipx's and schemathesis's)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deepagents.backends.protocol import ExecuteResponse

from conftest import module_state
from warren import ConfigError, Sandbox
from warren.integrations.deepagents import WarrenSandbox


@pytest.fixture(scope="module", autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from module_state(tmp_path_factory)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


@pytest.fixture
def backend(ws: Path) -> Iterator[WarrenSandbox]:
    sandbox = WarrenSandbox({"workspace": str(ws)})
    yield sandbox
    sandbox.close()


def _names() -> set[str]:
    return {info.name for info in Sandbox.list()}


def test_constructible_with_no_arguments_for_the_current_directory(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ws)
    backend = WarrenSandbox()
    try:
        assert backend.id not in _names()  # created on first use
        result = backend.execute("pwd")
        assert backend.id in _names()
        assert result.output.strip() == str(ws)
    finally:
        backend.close()
    assert backend.id not in _names()


def test_execute_reports_output_stderr_and_exit_code_like_the_local_shell(backend: WarrenSandbox) -> None:
    result = backend.execute("echo out; echo err >&2; exit 3")
    assert isinstance(result, ExecuteResponse)
    assert result.exit_code == 3
    assert result.output == "out\n\n[stderr] err\n\nExit code: 3"
    assert not result.truncated
    assert backend.execute("true").output == "<no output>"


def test_execute_timeout_kills_the_command_and_answers_124(backend: WarrenSandbox) -> None:
    result = backend.execute("sleep 60", timeout=1)
    assert result.exit_code == 124
    assert "timed out" in result.output


def test_large_output_is_truncated_and_says_so(ws: Path) -> None:
    backend = WarrenSandbox({"workspace": str(ws)}, max_output_bytes=1000)
    try:
        result = backend.execute("yes | head -c 100000")
    finally:
        backend.close()
    assert result.truncated
    assert len(result.output) < 100000


def test_deep_agents_file_tools_work_through_warren(backend: WarrenSandbox, ws: Path) -> None:
    target = str(ws / "notes" / "a.txt")
    assert backend.write(target, "alpha\nbeta\n").error is None
    assert (ws / "notes" / "a.txt").read_text() == "alpha\nbeta\n"
    assert "beta" in str(backend.read(target))
    assert backend.edit(target, "beta", "gamma").error is None
    assert (ws / "notes" / "a.txt").read_text() == "alpha\ngamma\n"
    listing = backend.ls(str(ws / "notes"))
    assert "a.txt" in str(listing)
    assert "a.txt" in str(backend.glob("**/*.txt", str(ws)))
    assert "gamma" in str(backend.grep("gamma", str(ws)))


def test_uploads_and_downloads_round_trip_and_report_errors_per_file(
    backend: WarrenSandbox, ws: Path
) -> None:
    up = backend.upload_files([(str(ws / "d" / "x.bin"), b"\x00\x01data")])
    assert [(r.path, r.error) for r in up] == [(str(ws / "d" / "x.bin"), None)]
    down = backend.download_files([str(ws / "d" / "x.bin"), str(ws / "missing")])
    assert down[0].content == b"\x00\x01data" and down[0].error is None
    assert down[1].content is None and down[1].error == "file_not_found"


def test_commands_and_file_operations_cannot_reach_secrets_or_write_outside(
    backend: WarrenSandbox, outside: Path, planted_secret: Path
) -> None:
    ran = backend.execute(f"cat {planted_secret}; echo pwned > {outside}; echo done")
    assert "done" in ran.output
    assert "PLANTED-SECRET" not in ran.output
    down = backend.download_files([str(planted_secret)])
    assert down[0].content is None or b"PLANTED-SECRET" not in down[0].content
    assert down[0].error is not None
    up = backend.upload_files([(str(outside), b"pwned")])
    assert up[0].error is not None
    assert outside.read_text() == "keep me\n"


def test_an_unknown_policy_key_is_warrens_config_error_with_a_hint() -> None:
    with pytest.raises(ConfigError) as info:
        WarrenSandbox({"netwrok": "open"})
    assert "known keys" in info.value.hint


_NAME = "test_the_deep_agents_code_provider_is_found_by_its_entry_point"
DCODE_VENV = Path(os.environ.get("WARREN_DCODE_VENV", "/opt/warren-venv-dcode"))


def test_the_deep_agents_code_provider_is_found_by_its_entry_point(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    try:
        import deepagents_code.integrations.sandbox_registry as registry_module
    except ImportError:
        # Its pins conflict with the dev extra: scripts/setup keeps it in a venv of its
        # own with warren, where this very test runs (and must pass).
        python = DCODE_VENV / "bin" / "python"
        if not python.exists():
            pytest.skip(
                f"{python} is missing: scripts/setup makes it (deepagents-code, in a venv of its own)"
            )
        r = subprocess.run(
            [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", f"{__file__}::{_NAME}"],
            cwd=Path(__file__).parent.parent,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
        return
    from deepagents_code.integrations.sandbox_provider import SandboxNotFoundError, SandboxProvider

    from warren.integrations.deepagents.provider import WarrenSandboxProvider

    monkeypatch.chdir(ws)
    registry = registry_module.SandboxRegistry(config=registry_module.SandboxConfig())
    assert "warren" in registry.available_providers()
    provider = registry.create_provider("warren")
    assert isinstance(provider, WarrenSandboxProvider) and isinstance(provider, SandboxProvider)
    assert registry.provider_metadata("warren").working_dir == str(ws)

    backend = provider.get_or_create(preset=["python"])
    try:
        assert backend.id in _names()
        backend.execute("echo kept > /tmp/marker")
        again = provider.get_or_create(sandbox_id=backend.id)
        assert again.execute("cat /tmp/marker").output == "kept\n"
    finally:
        provider.delete(sandbox_id=backend.id)
    assert backend.id not in _names()
    with pytest.raises(SandboxNotFoundError):
        provider.get_or_create(sandbox_id=backend.id)
    with pytest.raises(SandboxNotFoundError):
        provider.delete(sandbox_id=backend.id)
    with pytest.raises(ConfigError):
        provider.get_or_create(netwrok="open")


def test_a_deep_agent_execute_call_runs_in_warren_and_stays_confined(
    backend: WarrenSandbox, ws: Path, outside: Path, planted_secret: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("LANGSMITH_TRACING", "LANGCHAIN_TRACING_V2"):  # no trace upload from a test
        monkeypatch.setenv(name, "false")
    from deepagents import create_deep_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, ToolMessage

    class ScriptedModel(GenericFakeChatModel):
        """One ``execute`` call, then a final answer; no network model."""

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

    command = f"cat {planted_secret}; echo pwned > {outside}; echo ran > inside.txt; echo done"
    call = {"name": "execute", "args": {"command": command}, "id": "call_1", "type": "tool_call"}
    model = ScriptedModel(
        messages=iter([AIMessage(content="", tool_calls=[call]), AIMessage(content="finished")])
    )
    agent = create_deep_agent(model=model, backend=backend)
    result = agent.invoke({"messages": [{"role": "user", "content": "run it"}]})

    tool_outputs = [str(m.content) for m in result["messages"] if isinstance(m, ToolMessage)]
    assert len(tool_outputs) == 1 and "done" in tool_outputs[0]
    assert "PLANTED-SECRET" not in str(result["messages"])
    assert result["messages"][-1].content == "finished"
    assert (ws / "inside.txt").read_text() == "ran\n"
    assert outside.read_text() == "keep me\n"
