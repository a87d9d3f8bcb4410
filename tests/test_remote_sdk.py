"""The remote SDK: the SDK's own behaviour tests (tests/test_sandbox.py,
tests/test_library.py and tests/test_stdin.py) run again, unchanged, with ``WARREN_URL``/``WARREN_TOKEN``
pointing at a real ``warren serve`` on loopback TCP, so ``Sandbox``, ``warren.run``
and their errors go through the HTTP transport. Left out: tests that inspect the
supervisor's host processes, and the one relying on the caller's cwd (over HTTP a
relative workspace resolves where the service runs)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

import warren
from service_util import Serve
from test_library import (  # noqa: F401 - collected again here, over HTTP
    test_argv_as_a_string_is_rejected,
    test_missing_command_raises_typed_error,
    test_missing_cwd_raises_cwd_not_found_naming_it,
    test_run_feeds_stdin_and_uses_cwd,
    test_run_returns_result_with_output_and_duration,
    test_timeout_kills_the_whole_tree_including_sigterm_ignorers,
)
from test_sandbox import (  # noqa: F401 - collected again here, over HTTP
    sb,
    test_exec_never_breaks_after_the_workspace_is_emptied_removed_or_symlinked,
    test_exec_reports_signals_as_128_plus_n_with_the_name,
    test_exec_returns_output_status_and_runs_in_the_workspace,
    test_exec_runs_fully_hardened_and_confined,
    test_exec_sees_per_call_env_and_cwd,
    test_fifty_concurrent_execs_in_one_sandbox,
    test_files_api_cannot_escape_the_policy,
    test_files_api_round_trip_in_bytes_and_text,
    test_missing_command_is_a_typed_error,
    test_output_is_capped_with_a_visible_marker,
    test_reattach_by_name_and_errors_for_missing_or_stopped,
    test_spawned_http_server_answers_a_later_exec,
    test_spawns_and_forwarded_ports_are_listed_and_a_forward_closed,
    test_timeout_kills_a_forked_child_that_ignores_sigterm,
)
from test_stdin import (  # noqa: F401 - collected again here, over HTTP
    test_a_line_reader_gets_each_line_written_later_in_order,
    test_a_process_is_found_by_its_pid_and_from_another_handle,
    test_a_process_that_closes_its_stdin_refuses_more_with_stdin_closed,
    test_a_process_that_does_not_read_fills_up_to_the_bound_then_stdin_full,
    test_async_sandbox_writes_and_closes_stdin,
    test_eight_mib_reach_sha256sum_intact_while_other_clients_are_served,
    test_eof_ends_cat_and_wc_with_everything_written,
    test_spawn_without_stdin_reads_end_of_file_at_once,
    test_writing_where_it_cannot_go_is_a_typed_error_naming_the_process,
)
from warren.client.http import HttpTransport
from warren.client.sandbox import Sandbox
from warren.errors import SandboxNotFound, WarrenError

# The HTTP transport under the SDK's own tests: the same whoever calls. What it carries
# runs in both halves directly (tests/test_sandbox.py, tests/test_library.py,
# tests/test_stdin.py).
pytestmark = pytest.mark.caller_independent(half="user")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    home = tmp_path_factory.mktemp("state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_STATE_HOME", str(home))
        mp.delenv("WARREN_URL", raising=False)
        serve = Serve(tmp_path_factory.mktemp("serve"))
        mp.setenv("WARREN_URL", serve.url)
        mp.setenv("WARREN_TOKEN", serve.token or "")
        yield serve
        for entry in Sandbox.list():
            Sandbox(entry).remove()
        serve.stop()


@pytest.fixture(scope="module", autouse=True)
def state_home(server: Serve) -> Serve:
    return server


def test_the_sdk_talks_http_and_the_service_saw_it(server: Serve, tmp_path: Path) -> None:
    with Sandbox.create(warren.PolicySpec(workspace=str(tmp_path))) as sandbox:
        assert isinstance(sandbox._transport, HttpTransport)
        assert sandbox.exec(["echo", "remote"]).stdout == b"remote\n"
    assert f"POST /v1/sandboxes/{sandbox.name}/exec 200" in server.log.read_text()


def test_explicit_remote_and_token_arguments(
    server: Serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WARREN_URL")
    monkeypatch.delenv("WARREN_TOKEN")
    policy = warren.PolicySpec(workspace=str(tmp_path))
    result = warren.run(["echo", "hi"], policy, remote=server.url, token=server.token)
    assert result.stdout == b"hi\n"
    with pytest.raises(WarrenError) as info:
        Sandbox.create(policy, remote=server.url, token="wrong-wrong-wrong-wrong")
    assert "token" in info.value.message and info.value.hint
    with pytest.raises(SandboxNotFound):
        Sandbox.get("no-such-box", remote=server.url, token=server.token)

    async def main() -> None:
        async with await warren.AsyncSandbox.create(policy, remote=server.url, token=server.token) as sandbox:
            result = await sandbox.exec(["echo", "async"])
            assert result.stdout == b"async\n"

    asyncio.run(main())


def test_output_callbacks_stream_over_sse(tmp_path: Path) -> None:
    chunks: list[bytes] = []
    with Sandbox.create(warren.PolicySpec(workspace=str(tmp_path))) as sandbox:
        result = sandbox.exec(["sh", "-c", "echo a; echo b >&2; echo c"], on_stdout=chunks.append)
    assert b"".join(chunks) == b"a\nc\n" == result.stdout and result.stderr == b"b\n"


def test_run_streams_output_to_callbacks_over_http(tmp_path: Path) -> None:
    chunks: list[bytes] = []
    policy = warren.PolicySpec(workspace=str(tmp_path))
    result = warren.run(["sh", "-c", "echo x; echo y >&2"], policy, on_stderr=chunks.append)
    assert result.stdout == b"x\n" and chunks == [b"y\n"] and result.ok
