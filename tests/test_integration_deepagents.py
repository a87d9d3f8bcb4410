"""warren as a Deep Agents sandbox backend, against the real ``deepagents``: the
backend's own primitives (execute, uploads, downloads), the file tools Deep Agents
builds on them, confinement judged on the host, one ``create_deep_agent`` run with a
scripted chat model, and the Deep Agents Code provider
found through its entry-point group (that part needs ``deepagents-code``, which is
not in the dev extra: its pins conflict with pipx's and schemathesis's)."""

from __future__ import annotations

import asyncio
import functools
import os
import re
import shutil
import subprocess
import tempfile
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


def test_execute_returns_the_raw_output_and_exit_code_as_deep_agents_sandbox_does(
    backend: WarrenSandbox,
) -> None:
    """What Deep Agents' own sandbox backend (LangSmith's) returns: stdout, then stderr,
    nothing added; no output is ""."""
    result = backend.execute("echo out; echo err >&2; exit 3")
    assert isinstance(result, ExecuteResponse)
    assert (result.output, result.exit_code, result.truncated) == ("out\n\nerr\n", 3, False)
    assert backend.execute("true").output == ""
    assert backend.execute("printf 'no newline'").output == "no newline"


def test_execute_timeout_kills_the_command_and_answers_124(backend: WarrenSandbox) -> None:
    result = backend.execute("sleep 60", timeout=1)
    assert result.exit_code == 124
    assert "timed out" in result.output


def test_large_output_comes_back_complete(backend: WarrenSandbox) -> None:
    """A 100 kB cap made reads of large files fail; 600 kB come back whole."""
    result = backend.execute("yes 0123456789 | head -c 600000")
    assert (len(result.output), result.truncated) == (600000, False)


BIG_SOURCE = "".join(f"def function_{i}(value):\n    return value * {i}  # line {i}\n" for i in range(3200))


def test_deep_agents_tools_read_grep_glob_and_edit_a_187_kb_file(backend: WarrenSandbox, ws: Path) -> None:
    """Deep Agents' own read, grep, glob and edit (all built on ``execute``) on a
    187 kB source file, and a grep and a glob that match nothing: each failed while
    ``execute`` capped and decorated its output. Judged on the host too."""
    assert 180_000 < len(BIG_SOURCE) < 200_000
    target = ws / "big.py"
    target.write_text(BIG_SOURCE)
    read = backend.read(str(target), offset=0, limit=10_000)
    assert read.error is None and read.file_data is not None
    assert read.file_data["content"].count("\n") >= 6399
    assert "function_3199" in read.file_data["content"]
    tail = backend.read(str(target), offset=6398, limit=2)
    assert tail.error is None and tail.file_data is not None and "line 3199" in tail.file_data["content"]
    found = backend.grep("return value * 3199  #", str(ws))  # a literal, not a regex
    assert found.error is None and [m["line"] for m in found.matches or []] == [6400]
    nothing = backend.grep("no_such_symbol_anywhere", str(ws))
    assert (nothing.error, nothing.matches) == (None, [])
    assert backend.glob("*.rs", str(ws)).error is None
    assert backend.glob("*.rs", str(ws)).matches == []
    assert [m["path"] for m in backend.glob("*.py", str(ws)).matches or []] == [str(target)]
    edited = backend.edit(str(target), "return value * 3199  # line 3199", "return 0  # edited")
    assert edited.error is None
    assert target.read_text() == BIG_SOURCE.replace("return value * 3199  # line 3199", "return 0  # edited")


def test_large_output_is_offloaded_where_the_sandbox_may_write_and_inline_elsewhere(
    backend: WarrenSandbox, ws: Path
) -> None:
    """Deep Agents' capture wrapper: in the workspace the full output lands in the file
    (read on the host) and the model gets a preview; at Deep Agents' default
    ``/large_tool_results`` (warren's root is read-only) it comes back whole instead
    of being lost."""
    command = "seq 1 50000"
    expected = "".join(f"{i}\n" for i in range(1, 50001))
    kept = ws / "large_tool_results" / "call_1"
    offloaded = backend.execute_with_offload(command, str(kept), max_inline_bytes=20_000)
    assert offloaded.offloaded and offloaded.response.exit_code == 0
    assert len(offloaded.response.output) < 20_000
    assert kept.read_text() == expected
    inline = backend.execute_with_offload(command, "/large_tool_results/call_2", max_inline_bytes=20_000)
    assert not inline.offloaded and inline.response.output == expected
    assert not Path("/large_tool_results").exists()


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


DCODE_VENV = Path(os.environ.get("WARREN_DCODE_VENV", "/opt/warren-venv-dcode"))


# The tests that need deepagents-code: run together in its venv, once (its imports are
# most of their cost), each then judged by its own line of that run's summary.
DCODE_TESTS = (
    "test_the_deep_agents_code_provider_is_found_by_its_entry_point",
    "test_dcode_gets_a_sandbox_on_its_servers_guarded_event_loop",
)


@functools.cache
def _dcode_venv_run(python: Path) -> str:
    repo = Path(__file__).parent.parent
    # From a directory of its own: LangGraph's in-memory runtime makes .langgraph_api in
    # the working directory, and a checkout need not be writable by the caller.
    where = tempfile.mkdtemp(prefix="warren-dcode-")
    try:
        argv = [str(python), "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", f"--rootdir={repo}"]
        r = subprocess.run(
            [*argv, *(f"{__file__}::{name}" for name in DCODE_TESTS)],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=400,
        )
    finally:
        shutil.rmtree(where, ignore_errors=True)
    return r.stdout + r.stderr


def _ran_in_the_dcode_venv(name: str) -> bool:
    """Whether test ``name`` was run (and passed) in the Deep Agents Code venv, since
    ``deepagents-code`` is missing here; False when it is here and the test goes on."""
    try:
        import deepagents_code  # noqa: F401
    except ImportError:
        # Its pins conflict with the dev extra: scripts/setup keeps it in a venv of its
        # own with warren, where this very test runs (and must pass).
        python = DCODE_VENV / "bin" / "python"
        if not python.exists():
            pytest.skip(
                f"{python} is missing: scripts/setup makes it (deepagents-code, in a venv of its own)"
            )
        out = _dcode_venv_run(python)
        assert re.search(rf"^PASSED \S*::{name}$", out, re.M), out[-5000:]
        return True
    return False


# Deep Agents Code's glue (its entry point, its event loop's guard), the same whoever
# calls: the root half of scripts/test runs it (its venv's imports take half a minute).
@pytest.mark.caller_independent(half="root")
def test_the_deep_agents_code_provider_is_found_by_its_entry_point(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if _ran_in_the_dcode_venv("test_the_deep_agents_code_provider_is_found_by_its_entry_point"):
        return
    import deepagents_code.integrations.sandbox_registry as registry_module
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


# Deep Agents Code's glue (its entry point, its event loop's guard), the same whoever
# calls: the root half of scripts/test runs it (its venv's imports take half a minute).
@pytest.mark.caller_independent(half="root")
def test_dcode_gets_a_sandbox_on_its_servers_guarded_event_loop(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dcode --sandbox warren``: its server builds the sandbox on an event loop where
    LangGraph's blockbuster refuses blocking calls; ``Blocking call to os.getcwd``
    ended it. The same configuration (LangGraph's own ``_enable_blockbuster``), then a
    command through the async path dcode's tools use. The control: a blocking call
    made on that loop is refused, so the checker is on."""
    if _ran_in_the_dcode_venv("test_dcode_gets_a_sandbox_on_its_servers_guarded_event_loop"):
        return
    from blockbuster import BlockingError
    from deepagents_code.integrations.sandbox_factory import create_sandbox
    from langgraph_runtime_inmem.queue import _enable_blockbuster

    monkeypatch.chdir(ws)

    async def on_the_guarded_loop() -> str:
        guard = _enable_blockbuster()
        try:
            with pytest.raises(BlockingError):
                os.getcwd()
            with create_sandbox("warren") as backend:
                return (await backend.aexecute("pwd")).output
        finally:
            guard.deactivate()

    assert asyncio.run(on_the_guarded_loop()).strip() == str(ws)


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


def test_relative_paths_are_invalid_for_uploads_and_downloads(backend: WarrenSandbox, ws: Path) -> None:
    """Deep Agents' protocol takes absolute paths (its standard tests require
    ``invalid_path``); the control: the same file by its absolute path works."""
    up = backend.upload_files([("relative.txt", b"x"), (str(ws / "absolute.txt"), b"y")])
    assert [r.error for r in up] == ["invalid_path", None]
    assert not (ws / "relative.txt").exists() and (ws / "absolute.txt").read_bytes() == b"y"
    down = backend.download_files(["absolute.txt", str(ws / "absolute.txt")])
    assert [(r.error, r.content) for r in down] == [("invalid_path", None), (None, b"y")]
