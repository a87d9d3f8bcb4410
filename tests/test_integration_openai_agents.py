"""warren as the OpenAI Agents SDK's sandbox backend, against the real ``openai-agents``.

The behaviours of the SDK's own local backend (``unix_local``: exec, manifest, files,
archives, snapshots, resume, ports) ported to run in warren, where warren differs on
purpose (the host environment is not inherited), the test says so; and one
``SandboxAgent`` run with a scripted model whose shell call runs in warren and tries
to read a secret planted in the caller's HOME and to write outside the workspace,
judged on the host."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import textwrap
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import (
    Agent,
    ModelSettings,
    RunConfig,
    Runner,
    RunState,
    Tool,
    function_tool,
    set_tracing_disabled,
)
from agents.items import ModelResponse
from agents.models.interface import Model, ModelTracing
from agents.sandbox import Manifest, SandboxAgent, SandboxPathGrant, SandboxRunConfig, User
from agents.sandbox.capabilities import Shell
from agents.sandbox.entries import Dir, File
from agents.sandbox.errors import (
    ConfigurationError,
    ExecNonZeroError,
    ExecTimeoutError,
    InvalidManifestPathError,
    PtySessionNotFoundError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
)
from agents.sandbox.manifest import Environment
from agents.sandbox.snapshot import LocalSnapshotSpec
from agents.usage import Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from conftest import module_state
from warren import ConfigError, Sandbox
from warren.integrations import _workspace_archive
from warren.integrations.openai_agents import (
    WarrenSandboxClient,
    WarrenSandboxClientOptions,
    WarrenSandboxSessionState,
)

set_tracing_disabled(True)


@pytest.fixture(scope="module", autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from module_state(tmp_path_factory)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


def _client(ws: Path) -> WarrenSandboxClient:
    return WarrenSandboxClient({"workspace": str(ws)})


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def _names() -> set[str]:
    return {info.name for info in Sandbox.list()}


def test_client_and_options_need_no_arguments_and_use_the_current_directory(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ws)

    async def go() -> tuple[str, bytes]:
        client = WarrenSandboxClient()
        session = await client.create(options=WarrenSandboxClientOptions())
        async with session:
            out = await session.exec("pwd")
        await client.delete(session)
        return session.state.manifest.root, out.stdout

    root, pwd = _run(go())
    assert root == os.path.realpath(ws)
    assert pwd.decode().strip() == os.path.realpath(ws)


def test_exec_returns_output_status_and_sees_the_manifest_environment(ws: Path) -> None:
    manifest = Manifest(environment=Environment(value={"MANIFEST_ONLY": "configured"}))

    async def go() -> tuple[Any, Any]:
        client = _client(ws)
        session = await client.create(manifest=manifest)
        async with session:
            shell = await session.exec("echo out; echo err >&2; echo $MANIFEST_ONLY; exit 3")
            direct = await session.exec("printf", "%s", "a b", shell=False)
        await client.delete(session)
        return shell, direct

    shell, direct = _run(go())
    assert (shell.stdout, shell.stderr, shell.exit_code) == (b"out\nconfigured\n", b"err\n", 3)
    assert (direct.stdout, direct.exit_code) == (b"a b", 0)


def test_host_secrets_in_the_environment_do_not_reach_commands(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """unix_local inherits the whole host environment; warren passes an allowlist. A
    name that only looks like a locale category is not one (it passed as "LC_*"); the
    control: the real categories do pass."""
    monkeypatch.setenv("OPENAI_API_KEY", "host-secret-value")
    monkeypatch.setenv("LC_PRIVATE_TOKEN", "host-secret-value")
    monkeypatch.setenv("LC_TIME", "C.UTF-8")
    monkeypatch.setenv("LC_MESSAGES", "C")

    async def go() -> bytes:
        client = _client(ws)
        session = await client.create()
        async with session:
            out = await session.exec(
                'printf %s/%s/%s/%s "${OPENAI_API_KEY-unset}" "${LC_PRIVATE_TOKEN-unset}" '
                '"$LC_TIME" "$LC_MESSAGES"'
            )
        await client.delete(session)
        return out.stdout

    assert _run(go()) == b"unset/unset/C.UTF-8/C"


def test_exec_timeout_raises_the_sdk_timeout_error(ws: Path) -> None:
    async def go() -> None:
        client = _client(ws)
        session = await client.create()
        try:
            async with session:
                await session.exec("sleep 30", timeout=0.5)
        finally:
            await client.delete(session)

    with pytest.raises(ExecTimeoutError):
        _run(go())


def test_manifest_entries_are_written_under_the_root(ws: Path) -> None:
    manifest = Manifest(
        entries={
            "hello.txt": File(content=b"hi\n"),
            "pkg": Dir(children={"mod.py": File(content=b"x = 1\n")}),
        }
    )

    async def go() -> None:
        client = _client(ws)
        session = await client.create(manifest=manifest)
        async with session:
            pass
        await client.delete(session)

    _run(go())
    assert (ws / "hello.txt").read_bytes() == b"hi\n"
    assert (ws / "pkg" / "mod.py").read_bytes() == b"x = 1\n"


def test_files_round_trip_and_a_missing_file_is_not_found(ws: Path) -> None:
    async def go() -> tuple[bytes, list[str]]:
        client = _client(ws)
        session = await client.create()
        async with session:
            await session.write(Path("a/b.txt"), io.BytesIO(b"data"))
            data = (await session.read(Path("a/b.txt"))).read()
            await session.mkdir("made")
            await session.mv("a/b.txt", "made/c.txt")
            names = sorted(Path(e.path).name for e in await session.ls("made"))
            with pytest.raises(WorkspaceReadNotFoundError):
                await session.read(Path("missing.txt"))
        await client.delete(session)
        return data, names

    data, names = _run(go())
    assert data == b"data"
    assert names == ["c.txt"]
    assert (ws / "made" / "c.txt").read_bytes() == b"data"


def test_writes_outside_the_root_are_refused_and_the_host_file_is_unchanged(ws: Path, outside: Path) -> None:
    async def go() -> Any:
        client = _client(ws)
        session = await client.create()
        async with session:
            with pytest.raises(InvalidManifestPathError):
                await session.write(outside, io.BytesIO(b"pwned"))
            result = await session.exec(f"echo pwned > {outside}")
        await client.delete(session)
        return result

    result = _run(go())
    assert result.exit_code != 0
    assert outside.read_text() == "keep me\n"


def test_read_and_write_refuse_paths_escaping_the_root(ws: Path) -> None:
    async def go() -> None:
        client = _client(ws)
        session = await client.create()
        async with session:
            with pytest.raises(InvalidManifestPathError, match="must not escape root"):
                await session.write(Path("../secret.txt"), io.BytesIO(b"nope"))
            with pytest.raises(InvalidManifestPathError, match="must not escape root"):
                await session.read(Path("../secret.txt"))
        await client.delete(session)

    _run(go())
    assert not (ws.parent / "secret.txt").exists()


def test_file_helpers_refuse_a_symlink_that_leads_out_of_the_root(ws: Path, tmp_path: Path) -> None:
    out_dir = tmp_path / "outside-dir"
    out_dir.mkdir()
    (out_dir / "file.txt").write_text("keep\n")
    (ws / "link").symlink_to(out_dir, target_is_directory=True)

    async def go() -> None:
        client = _client(ws)
        session = await client.create()
        async with session:
            with pytest.raises(InvalidManifestPathError, match="must not escape root"):
                await session.mkdir("link/nested", parents=True)
            with pytest.raises(InvalidManifestPathError, match="must not escape root"):
                await session.ls("link")
            with pytest.raises(InvalidManifestPathError, match="must not escape root"):
                await session.rm("link/file.txt")
            with pytest.raises(InvalidManifestPathError, match="must not escape root"):
                await session.read(Path("link/file.txt"))
            with pytest.raises(InvalidManifestPathError, match="must not escape root"):
                await session.write(Path("link/new.txt"), io.BytesIO(b"x"))
        await client.delete(session)

    _run(go())
    assert sorted(p.name for p in out_dir.iterdir()) == ["file.txt"]
    assert (out_dir / "file.txt").read_text() == "keep\n"


def test_rm_recursive_ignores_a_missing_path_and_plain_rm_does_not(ws: Path) -> None:
    async def go() -> None:
        client = _client(ws)
        session = await client.create()
        async with session:
            await session.rm("missing-dir", recursive=True)
            with pytest.raises(ExecNonZeroError):
                await session.rm("missing-dir")
        await client.delete(session)

    _run(go())


def test_a_non_default_root_is_the_workspace_and_is_created(tmp_path: Path) -> None:
    root = tmp_path / "made" / "here"

    async def go() -> bytes:
        client = WarrenSandboxClient()
        session = await client.create(manifest=Manifest(root=str(root), entries={"f": File(content=b"1")}))
        async with session:
            out = await session.exec("pwd; cat f")
        await client.delete(session)
        return out.stdout

    assert _run(go()) == f"{root}\n1".encode()


def test_a_root_other_than_the_policy_workspace_is_a_configuration_error(ws: Path, tmp_path: Path) -> None:
    async def go() -> None:
        await _client(ws).create(manifest=Manifest(root=str(tmp_path / "elsewhere")))

    with pytest.raises(ConfigurationError) as info:
        _run(go())
    assert "hint" in info.value.context


def test_persist_then_hydrate_round_trips_files_modes_and_links(ws: Path, tmp_path: Path) -> None:
    (ws / "dir").mkdir()
    (ws / "dir" / "tool.sh").write_text("#!/bin/sh\necho hi\n")
    (ws / "dir" / "tool.sh").chmod(0o755)
    (ws / "link").symlink_to("dir/tool.sh")
    (ws / "skip.txt").write_text("ephemeral\n")
    other = tmp_path / "other"
    other.mkdir()

    async def go() -> None:
        client = _client(ws)
        session = await client.create()
        async with session:
            session.register_persist_workspace_skip_path("skip.txt")
            archive = await session.persist_workspace()
        await client.delete(session)
        fresh_client = WarrenSandboxClient({"workspace": str(other)})
        fresh = await fresh_client.create()
        async with fresh:
            await fresh.hydrate_workspace(archive)
        await fresh_client.delete(fresh)

    _run(go())
    assert (other / "dir" / "tool.sh").read_text() == "#!/bin/sh\necho hi\n"
    assert os.access(other / "dir" / "tool.sh", os.X_OK)
    assert os.readlink(other / "link") == "dir/tool.sh"
    assert not (other / "skip.txt").exists()


def test_hydrate_refuses_an_archive_that_escapes_the_root(ws: Path, tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("../escaped.txt")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"pwned"))
    buf.seek(0)

    async def go() -> None:
        client = _client(ws)
        session = await client.create()
        try:
            async with session:
                await session.hydrate_workspace(buf)
        finally:
            await client.delete(session)

    with pytest.raises(WorkspaceArchiveWriteError):
        _run(go())
    assert not (tmp_path / "escaped.txt").exists()


def test_a_local_snapshot_restores_the_workspace_on_resume(ws: Path, tmp_path: Path) -> None:
    snapshots = tmp_path / "snapshots"
    snapshots.mkdir()

    async def go() -> bytes:
        client = _client(ws)
        session = await client.create(snapshot=LocalSnapshotSpec(base_path=snapshots))
        async with session:
            await session.exec("echo kept > kept.txt")
        payload = client.serialize_session_state(session.state)
        (ws / "kept.txt").unlink()  # the workspace drifted while nothing ran
        resumed = await client.resume(client.deserialize_session_state(payload))
        async with resumed:
            out = await resumed.exec("cat kept.txt")
        await client.delete(resumed)
        return out.stdout

    assert _run(go()) == b"kept\n"


_FIRST_PROCESS = textwrap.dedent(
    """
    import asyncio, json, os, sys
    from warren.integrations.openai_agents import WarrenSandboxClient

    async def main():
        client = WarrenSandboxClient({"workspace": sys.argv[1]})
        session = await client.create()
        await session.start()
        await session.exec("echo only-in-this-sandbox > /tmp/marker")
        print(json.dumps(client.serialize_session_state(session.state)), flush=True)
        os._exit(0)  # the client process dies: no aclose, no delete

    asyncio.run(main())
    """
)


def test_resume_after_the_client_process_restarts_reattaches_to_the_same_sandbox(ws: Path) -> None:
    first = subprocess.run(
        [sys.executable, "-c", _FIRST_PROCESS, str(ws)], capture_output=True, text=True, timeout=120
    )
    assert first.returncode == 0, first.stderr
    payload = json.loads(first.stdout)
    name = payload["sandbox_name"]
    assert name in _names()

    async def go() -> bytes:
        client = WarrenSandboxClient()
        state = client.deserialize_session_state(payload)
        assert isinstance(state, WarrenSandboxSessionState)
        resumed = await client.resume(state)
        await resumed.start()
        out = await resumed.exec("cat /tmp/marker")  # the sandbox's private /tmp
        await client.delete(resumed)
        return out.stdout

    assert _run(go()) == b"only-in-this-sandbox\n"
    assert name not in _names()


def test_resume_after_shutdown_replaces_the_sandbox_under_the_same_name(ws: Path) -> None:
    async def go() -> tuple[bytes, bytes, bool]:
        client = _client(ws)
        session = await client.create(options=WarrenSandboxClientOptions(name=f"t-{os.getpid()}-shut"))
        async with session:
            await session.exec("echo gone > /tmp/marker; echo stays > file.txt")
        assert not await session.running()
        resumed = await client.resume(session.state)
        async with resumed:
            tmp = await resumed.exec("cat /tmp/marker 2>/dev/null || echo none")
            kept = await resumed.exec("cat file.txt")
            alive = await resumed.running()
        await client.delete(resumed)
        return tmp.stdout, kept.stdout, alive

    tmp, kept, alive = _run(go())
    assert (tmp, kept, alive) == (b"none\n", b"stays\n", True)
    assert f"t-{os.getpid()}-shut" not in _names()


def test_an_exposed_port_resolves_to_a_host_address_that_answers(ws: Path) -> None:
    """The same port number on the host when it is free there, as the SDK's local backend
    serves it; the control: a port taken on the host gets another one, which answers."""
    (ws / "index.html").write_text("served from the sandbox\n")

    async def go(port: int) -> tuple[str, int, tuple[int, ...]]:
        client = _client(ws)
        session = await client.create(options=WarrenSandboxClientOptions(exposed_ports=(port, port)))
        async with session:
            inner = session._inner
            server = inner.sandbox.spawn(["python3", "-m", "http.server", "--bind", "127.0.0.1", str(port)])  # type: ignore[attr-defined]
            endpoint = await session.resolve_exposed_port(port)
            body = await asyncio.to_thread(_fetch, f"http://{endpoint.host}:{endpoint.port}/index.html")
            server.kill()
        await client.delete(session)
        return body, endpoint.port, session.state.exposed_ports

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        body, got, declared = _run(go(busy))
        assert body == "served from the sandbox\n" and got != busy and declared == (busy,)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    body, got, declared = _run(go(free))
    assert body == "served from the sandbox\n" and got == free and declared == (free,)


def _fetch(url: str) -> str:
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return str(response.read().decode())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_a_background_command_keeps_a_session_fed_by_write_stdin(ws: Path) -> None:
    """The SDK's PTY-session contract: a command still running after its yield time
    keeps an id; write_stdin types into its terminal and collects the rest. Without a
    terminal it has no stdin, as with the SDK's local and docker backends, and can
    still be polled."""

    async def go() -> None:
        client = _client(ws)
        session = await client.create()
        async with session:
            assert session.supports_pty()
            quick = await session.pty_exec_start("echo hi; echo err >&2; exit 3")
            assert (quick.process_id, quick.output, quick.exit_code) == (None, b"hi\nerr\n", 3)

            started = await session.pty_exec_start(
                "echo first; read line; echo got $line > answer.txt; echo got $line",
                tty=True,
                yield_time_s=0.3,
            )
            assert started.process_id is not None and started.exit_code is None  # it waits on stdin
            done = await session.pty_write_stdin(
                session_id=started.process_id, chars="hello\n", yield_time_s=30
            )
            assert (done.process_id, done.exit_code) == (None, 0)
            both = started.output + done.output
            assert both.count(b"first") == 1 and both.count(b"got hello") == 1  # each part returned once

            piped = await session.pty_exec_start("echo waiting; sleep 0.5; echo over", yield_time_s=0.1)
            assert piped.process_id is not None
            with pytest.raises(RuntimeError, match="stdin is not available"):
                await session.pty_write_stdin(session_id=piped.process_id, chars="ignored\n")
            polled = await session.pty_write_stdin(session_id=piped.process_id, chars="", yield_time_s=10)
            assert (polled.exit_code, piped.output + polled.output) == (0, b"waiting\nover\n")
            with pytest.raises(PtySessionNotFoundError):
                await session.pty_write_stdin(session_id=started.process_id, chars="")
            with pytest.raises(PtySessionNotFoundError):
                await session.pty_write_stdin(session_id=999_999, chars="")
        await client.delete(session)

    _run(go())
    assert (ws / "answer.txt").read_text() == "got hello\n"


def test_stop_ends_background_commands(ws: Path) -> None:
    async def go() -> int:
        client = _client(ws)
        session = await client.create()
        await session.start()
        started = await session.pty_exec_start("read never", tty=True, yield_time_s=0.3)
        assert started.process_id is not None
        process = session._inner._background[started.process_id].process  # type: ignore[attr-defined]
        await session.stop()
        with pytest.raises(PtySessionNotFoundError):
            await session.pty_write_stdin(session_id=started.process_id, chars="")
        status = await asyncio.to_thread(process.wait, 60)
        raw = await asyncio.to_thread(lambda: process.status)
        await client.delete(session)
        assert raw is not None and os.WIFSIGNALED(raw) and os.WTERMSIG(raw) == signal.SIGKILL
        return int(status)

    assert _run(go()) == 128 + signal.SIGKILL


def test_what_warren_cannot_do_raises_the_sdk_configuration_error_with_a_hint(
    ws: Path, tmp_path: Path
) -> None:
    client = _client(ws)

    async def users() -> None:
        # refused when the manifest is applied (at start), as by the SDK's local backend
        session = await client.create(manifest=Manifest(users=[User(name="alice")]))
        try:
            await session.start()
        finally:
            await client.delete(session)

    async def moved_grant() -> None:
        grant = SandboxPathGrant(path="/mnt/data", host_path=str(tmp_path))
        await _client(ws).create(manifest=Manifest(extra_path_grants=(grant,)))

    for attempt, said in ((users, "does not support manifest users or groups"), (moved_grant, "host_path")):
        with pytest.raises(ConfigurationError, match=said) as info:
            _run(attempt())
        assert info.value.context["hint"]
        assert isinstance(info.value, ValueError)  # what the local backend raises for the same


def test_tty_gives_the_command_a_terminal_of_its_own_that_write_stdin_feeds(ws: Path) -> None:
    """The model's ``exec_command`` with ``tty=true`` (it ended the whole run with a
    ConfigurationError). The control: the same command without tty has no terminal."""
    probe = "if test -t 0 && test -t 1; then tty; stty size; else echo no-terminal; fi"

    async def go() -> tuple[str, str, str]:
        client = _client(ws)
        session = await client.create()
        try:
            async with session:
                with_tty = await session.pty_exec_start(probe, tty=True, yield_time_s=5)
                without = await session.pty_exec_start(probe, tty=False, yield_time_s=5)
                started = await session.pty_exec_start(
                    "read line; echo got:$line", tty=True, yield_time_s=0.3
                )
                assert started.process_id is not None and started.exit_code is None
                fed = await session.pty_write_stdin(
                    session_id=started.process_id, chars="hello\n", yield_time_s=5
                )
                return with_tty.output.decode(), without.output.decode(), fed.output.decode()
        finally:
            await client.delete(session)

    with_tty, without, fed = _run(go())
    assert "/dev/pts/" in with_tty and "24 80" in with_tty
    assert without.strip() == "no-terminal"
    assert "got:hello" in fed


def test_a_terminal_command_killed_by_a_signal_ends_with_minus_n_as_on_the_sdk_local_backend(
    ws: Path,
) -> None:
    """^C and ^\\ typed into a tty command kill it by SIGINT and SIGQUIT, which the SDK
    (its local backend, Python's convention) reports as -2 and -3, even when the
    caller ignores those signals. The control: a command that itself exits 130 (what
    util-linux ``script`` reported for ^C) still ends with 130."""

    async def go() -> list[int | None]:
        client = _client(ws)
        session = await client.create()
        codes: list[int | None] = []
        try:
            async with session:
                for chars in ("\x03", "\x1c"):
                    started = await session.pty_exec_start(
                        "sleep", "30", shell=False, tty=True, yield_time_s=0.3
                    )
                    assert started.process_id is not None
                    ended = await session.pty_write_stdin(
                        session_id=started.process_id, chars=chars, yield_time_s=20
                    )
                    codes.append(ended.exit_code)
                exits = await session.pty_exec_start("exit 130", tty=True, yield_time_s=20)
                codes.append(exits.exit_code)
        finally:
            await client.delete(session)
        return codes

    ignored = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGQUIT)}
    try:
        assert _run(go()) == [-signal.SIGINT, -signal.SIGQUIT, 130]
    finally:
        for sig, handler in ignored.items():
            signal.signal(sig, handler)


def test_a_session_serves_commands_and_files_before_start(ws: Path) -> None:
    """The SDK's local and docker backends work right after ``client.create()``; the
    sandbox is made on first use, and the files land in the workspace on the host."""

    async def go() -> tuple[bytes, bytes]:
        client = _client(ws)
        session = await client.create()
        try:
            await session.write(Path("before.txt"), io.BytesIO(b"written before start\n"))
            out = await session.exec("cat before.txt; echo ran > ran.txt")
            read = await session.read(Path("ran.txt"))
            return out.stdout, read.read()
        finally:
            await client.delete(session)

    before = _names()
    assert _run(go()) == (b"written before start\n", b"ran\n")
    assert (ws / "before.txt").read_text() == "written before start\n"
    assert (ws / "ran.txt").read_text() == "ran\n"
    assert _names() == before


def test_a_path_grant_without_host_path_becomes_readable_in_the_sandbox(ws: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "in.txt").write_text("granted\n")

    async def go() -> tuple[bytes, int]:
        client = _client(ws)
        grant = SandboxPathGrant(path=str(data), read_only=True)
        session = await client.create(manifest=Manifest(extra_path_grants=(grant,)))
        async with session:
            read = await session.exec(f"cat {data}/in.txt")
            write = await session.exec(f"echo no > {data}/in.txt")
        await client.delete(session)
        return read.stdout, write.exit_code

    out, status = _run(go())
    assert out == b"granted\n"
    assert status != 0
    assert (data / "in.txt").read_text() == "granted\n"


def test_an_unknown_policy_key_is_warrens_config_error_with_a_hint() -> None:
    with pytest.raises(ConfigError) as info:
        WarrenSandboxClientOptions(policy={"netwrok": "open"})
    assert "known keys" in info.value.hint
    with pytest.raises(ConfigError):
        WarrenSandboxClient({"netwrok": "open"})


def test_options_and_state_round_trip_through_json(ws: Path) -> None:
    options = WarrenSandboxClientOptions(policy={"preset": ["python"]}, name="n1", exposed_ports=(80,))
    assert WarrenSandboxClientOptions.parse(json.loads(options.model_dump_json())) == options

    async def go() -> None:
        client = _client(ws)
        session = await client.create(options=WarrenSandboxClientOptions(policy={"preset": ["python"]}))
        payload = json.loads(json.dumps(client.serialize_session_state(session.state)))
        state = client.deserialize_session_state(payload)
        assert isinstance(state, WarrenSandboxSessionState)
        assert state.sandbox_name == session.state.sandbox_name
        assert state.policy["preset"] == ["python"]
        assert state.manifest.root == os.path.realpath(ws)

    _run(go())


# --- one agent run, end to end ------------------------------------------------------------


def _call(name: str, arguments: dict[str, Any], n: int) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        id=f"fc_{n}",
        call_id=f"call_{n}",
        name=name,
        arguments=json.dumps(arguments),
        type="function_call",
        status="completed",
    )


def _final(text: str) -> ResponseOutputMessage:
    content = [ResponseOutputText(text=text, type="output_text", annotations=[])]
    return ResponseOutputMessage(
        id="msg_1", role="assistant", status="completed", type="message", content=content
    )


class ScriptedModel(Model):
    """Answers each turn with the next scripted output (no network model) and records
    what the tools returned."""

    def __init__(self, turns: list[list[Any]]) -> None:
        self.turns = list(turns)
        self.tool_outputs: list[str] = []

    async def get_response(
        self,
        system_instructions: str | None,
        input: Any,
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: Any,
        handoffs: list[Any],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        assert "exec_command" in {tool.name for tool in tools}
        items = input if isinstance(input, list) else []
        self.tool_outputs = [
            str(i["output"]) for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"
        ]
        return ModelResponse(output=self.turns.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the scripted model answers only get_response")


def test_a_sandbox_agent_shell_call_runs_in_warren_and_stays_confined(
    ws: Path, outside: Path, planted_secret: Path
) -> None:
    before = _names()
    command = f"cat {planted_secret}; echo pwned > {outside}; echo ran > inside.txt; echo done"
    model = ScriptedModel([[_call("exec_command", {"cmd": command}, 1)], [_final("finished")]])
    agent: Agent[Any] = SandboxAgent(
        name="worker", instructions="Do the task.", model=model, capabilities=[Shell()]
    )
    config = RunConfig(
        sandbox=SandboxRunConfig(client=_client(ws), options=WarrenSandboxClientOptions()),
        tracing_disabled=True,
    )
    result = _run(Runner.run(agent, "run the command", run_config=config))

    assert result.final_output == "finished"
    assert len(model.tool_outputs) == 1
    output = model.tool_outputs[0]
    assert "done" in output
    assert "PLANTED-SECRET" not in output
    assert "PLANTED-SECRET" not in str(result.final_output)
    assert outside.read_text() == "keep me\n"
    assert (ws / "inside.txt").read_text() == "ran\n"
    assert _names() == before  # the run deleted the sandbox it created


def test_a_paused_run_resumes_from_its_json_state_with_a_new_client(ws: Path) -> None:
    """The SDK's resume path: a run stops for an approval, its state goes to JSON, and
    a new client (as after a restart) continues it in the same workspace."""

    @function_tool(name_override="approval_tool", needs_approval=True)
    def approval_tool() -> str:
        return "approved"

    def agent(model: ScriptedModel) -> SandboxAgent[Any]:
        return SandboxAgent(
            name="worker",
            instructions="Do the task.",
            model=model,
            tools=[approval_tool],
            capabilities=[Shell()],
        )

    def config() -> RunConfig:
        return RunConfig(sandbox=SandboxRunConfig(client=_client(ws)), tracing_disabled=True)

    before = _names()
    first_model = ScriptedModel(
        [[_call("exec_command", {"cmd": "echo persist me > note.txt"}, 1)], [_call("approval_tool", {}, 2)]]
    )
    first = _run(Runner.run(agent(first_model), "start", run_config=config()))
    assert len(first.interruptions) == 1
    state = first.to_state()
    assert state._sandbox is not None and state._sandbox["backend_id"] == "warren"
    state_json = state.to_json()

    second_model = ScriptedModel([[_call("exec_command", {"cmd": "cat note.txt"}, 3)], [_final("done")]])
    second_agent = agent(second_model)
    restored = _run(RunState.from_json(second_agent, state_json))
    restored.approve(restored.get_interruptions()[0])
    resumed = _run(Runner.run(second_agent, restored, run_config=config()))

    assert resumed.final_output == "done"
    assert any("persist me" in output for output in second_model.tool_outputs)
    assert _names() == before  # neither run left a sandbox behind


# --- resume never loses the workspace -------------------------------------------------------


def _hardlinked_workspace(ws: Path) -> dict[str, bytes]:
    """A workspace with a hard-linked pair, a symlink, an executable, an empty directory
    and a dotfile; returns its files' contents."""
    (ws / "src").mkdir()
    (ws / "src" / "main.py").write_text("print('main')\n")
    os.link(ws / "src" / "main.py", ws / "main-link.py")
    (ws / "run.sh").write_text("#!/bin/sh\necho run\n")
    (ws / "run.sh").chmod(0o750)
    (ws / "latest").symlink_to("src/main.py")
    (ws / "empty").mkdir()
    (ws / ".env").write_text("X=1\n")
    return {p: (ws / p).read_bytes() for p in ("src/main.py", "main-link.py", "run.sh", ".env")}


def _assert_workspace_kept(ws: Path, files: dict[str, bytes], *extra: str) -> None:
    for rel, content in files.items():
        assert (ws / rel).read_bytes() == content, rel
    assert os.readlink(ws / "latest") == "src/main.py"
    assert (ws / "empty").is_dir() and not any((ws / "empty").iterdir())
    assert (ws / "run.sh").stat().st_mode & 0o777 == 0o750
    names = [".env", "empty", "latest", "main-link.py", "run.sh", "src", *extra]
    assert sorted(p.name for p in ws.iterdir()) == sorted(names)


def test_a_paused_run_with_a_hard_linked_pair_resumes_with_every_file(ws: Path, tmp_path: Path) -> None:
    """The run of the issue: paused for an approval with a snapshot, resumed by a new
    client. The SDK's default resume emptied the workspace when the snapshot held a
    hard link; judged on the host, every file is there after the resume (the pair as
    two files with its content, as the SDK's local backend restores it)."""
    files = _hardlinked_workspace(ws)
    snapshots = tmp_path / "snapshots"
    snapshots.mkdir()

    @function_tool(name_override="approval_tool", needs_approval=True)
    def approval_tool() -> str:
        return "approved"

    def agent(model: ScriptedModel) -> SandboxAgent[Any]:
        return SandboxAgent(
            name="worker",
            instructions="Do the task.",
            model=model,
            tools=[approval_tool],
            capabilities=[Shell()],
        )

    def config() -> RunConfig:
        sandbox = SandboxRunConfig(client=_client(ws), snapshot=LocalSnapshotSpec(base_path=snapshots))
        return RunConfig(sandbox=sandbox, tracing_disabled=True)

    first_model = ScriptedModel([[_call("exec_command", {"cmd": "ls"}, 1)], [_call("approval_tool", {}, 2)]])
    first = _run(Runner.run(agent(first_model), "start", run_config=config()))
    assert len(first.interruptions) == 1
    assert any(snapshots.iterdir())  # the pause persisted a snapshot, which resume restores
    (ws / "drifted.txt").write_text("made while paused\n")  # resume must restore, not reuse

    second_model = ScriptedModel([[_call("exec_command", {"cmd": "cat main-link.py"}, 3)], [_final("done")]])
    second_agent = agent(second_model)
    restored = _run(RunState.from_json(second_agent, first.to_state().to_json()))
    restored.approve(restored.get_interruptions()[0])
    resumed = _run(Runner.run(second_agent, restored, run_config=config()))

    assert resumed.final_output == "done"
    assert any("print('main')" in output for output in second_model.tool_outputs)
    _assert_workspace_kept(ws, files)
    assert os.stat(ws / "src" / "main.py").st_ino != os.stat(ws / "main-link.py").st_ino


def _resume_with_archive(ws: Path, tmp_path: Path, archive: bytes) -> BaseException | None:
    """Resume a session whose snapshot is ``archive``; the error it raised, if any."""
    snapshots = tmp_path / "snapshots"
    snapshots.mkdir(exist_ok=True)

    async def go() -> BaseException | None:
        client = _client(ws)
        session = await client.create(snapshot=LocalSnapshotSpec(base_path=snapshots))
        async with session:
            pass
        (snapshots / f"{session.state.snapshot.id}.tar").write_bytes(archive)
        (ws / "drifted.txt").write_text("made while paused\n")  # resume must restore, not reuse
        resumed = await client.resume(
            client.deserialize_session_state(client.serialize_session_state(session.state))
        )
        try:
            async with resumed:
                pass
        except Exception as e:
            return e
        finally:
            await client.delete(resumed)
        return None

    error: BaseException | None = _run(go())
    return error


def _tar(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _hardlink(name: str, target: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.LNKTYPE, target
    return info, None


def _symlink(name: str, target: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info, None


@pytest.mark.parametrize(
    "archive",
    [
        pytest.param(_tar(_file("./a.txt", b"a"), _hardlink("./b.txt", "./a.txt")), id="hardlink"),
        pytest.param(_tar(_file("./a.txt", b"a"), _symlink("./b.txt", "../../outside")), id="symlink-out"),
        pytest.param(_tar(_file("./a.txt", b"a"), _file("../escape.txt", b"x")), id="parent-traversal"),
        pytest.param(_tar(_file("./a.txt", b"a"))[:700], id="truncated"),
        pytest.param(b"not a tar at all" * 64, id="garbage"),
    ],
)
def test_a_snapshot_that_cannot_be_restored_leaves_the_workspace_untouched(
    ws: Path, tmp_path: Path, archive: bytes
) -> None:
    files = _hardlinked_workspace(ws)
    error = _resume_with_archive(ws, tmp_path, archive)
    assert isinstance(error, WorkspaceArchiveWriteError)
    _assert_workspace_kept(ws, files, "drifted.txt")
    assert not (tmp_path / "escape.txt").exists()


def test_a_valid_snapshot_replaces_the_workspace_on_resume(ws: Path, tmp_path: Path) -> None:
    """The control of the test above: the same resume with a sound archive does replace
    the workspace (what the archive holds in, what it does not out)."""
    _hardlinked_workspace(ws)
    archive = _tar(_file("./a.txt", b"from the snapshot"), _symlink("./b.txt", "a.txt"))
    assert _resume_with_archive(ws, tmp_path, archive) is None
    assert sorted(p.name for p in ws.iterdir()) == ["a.txt", "b.txt"]
    assert (ws / "b.txt").read_bytes() == b"from the snapshot"


def test_a_restore_that_fails_while_unpacking_leaves_the_workspace_untouched(
    ws: Path, tmp_path: Path
) -> None:
    """An archive that passes every check but that GNU tar cannot unpack whole (a
    name longer than the file system allows, after a file it did unpack). Unpacking
    happens beside the live files, so they are all still there."""
    files = _hardlinked_workspace(ws)
    archive = _tar(_file("./new.txt", b"n"), _file("./" + "n" * 300, b"too long a name"))
    _workspace_archive.validate(archive)  # the checks pass: this fails in tar itself
    error = _resume_with_archive(ws, tmp_path, archive)
    assert isinstance(error, WorkspaceArchiveWriteError)
    assert "tar failed" in str(error.context)
    _assert_workspace_kept(ws, files, "drifted.txt")


def test_a_restored_archive_keeps_modes_but_never_setuid_or_setgid(ws: Path) -> None:
    """Restores unpack with umask 0 so modes round-trip; judged on the host, the
    setuid and setgid bits an archive asks for are not set (warren refuses them), while
    the control, an ordinary mode, comes back exactly."""
    modes = {"suid": 0o4755, "sgid": 0o2755, "plain": 0o640, "tool": 0o750}
    archive = _tar(*[_file(f"./{name}", b"x\n") for name in modes])
    buf = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(archive)) as src, tarfile.open(fileobj=buf, mode="w") as out:
        for member in src.getmembers():
            member.mode = modes[member.name[2:]]
            out.addfile(member, src.extractfile(member))
    buf.seek(0)

    async def go() -> None:
        client = _client(ws)
        session = await client.create()
        async with session:
            await session.hydrate_workspace(buf)
        await client.delete(session)

    _run(go())
    got = {name: (ws / name).stat().st_mode & 0o7777 for name in modes}
    assert got == {"suid": 0o755, "sgid": 0o755, "plain": 0o640, "tool": 0o750}


def test_a_review_session_undoes_an_agents_step_with_a_rollback_and_applies_on_request(ws: Path) -> None:
    """The SDK's snapshots are workspace archives (for a later session, anywhere); undoing a
    step of a live session is a checkpoint's job: a session under a review policy takes one
    before each command that follows a change, its sandbox's ``rollback(ID)`` goes back
    to the one before the step, and nothing reaches the host until ``apply``."""
    (ws / "keep.txt").write_text("kept\n")

    async def go() -> tuple[bytes, bytes, list[str]]:
        client = WarrenSandboxClient({"workspace": str(ws), "review": True})
        session = await client.create(options=WarrenSandboxClientOptions(name=f"t-{os.getpid()}-review"))
        async with session:
            await session.exec("echo draft > notes.txt")
            await session.exec("rm -rf ./*")  # the step to undo
            gone = (await session.exec("ls")).stdout
            box = Sandbox.get(session.state.sandbox_name)
            taken = await asyncio.to_thread(box.checkpoints)
            before_rm = next((c for c in taken if "rm -rf" in c.command), None)  # names what followed it
            assert before_rm is not None, taken
            await asyncio.to_thread(box.rollback, before_rm.id)
            back = (await session.exec("cat keep.txt notes.txt")).stdout
            changed = [c.path for c in (await asyncio.to_thread(box.diff)).changes]
        assert not (ws / "notes.txt").exists() and (ws / "keep.txt").exists()  # the host: untouched
        await asyncio.to_thread(box.stop)
        await asyncio.to_thread(box.apply)
        await client.delete(session)
        return gone, back, changed

    gone, back, changed = _run(go())
    assert gone == b""
    assert back == b"kept\ndraft\n"
    assert changed == ["notes.txt"]
    assert (ws / "notes.txt").read_text() == "draft\n"
