"""The native front end (native/warren.c) against the Python CLI it stands in for.

Both talk to a scripted supervisor on a private abstract socket (a state directory of
the test's own names it): for each case the same arguments, environment and answers go
to ``warren`` (native) and ``warren-python``, and what the supervisor received and what
the caller saw (stdout, stderr, exit code) must be the same. The plain case must be
answered by the native side alone: a copy of the binary with no Python CLI beside it
still runs it, and fails (naming what is missing) on every case it has to hand over.
The real supervisor is behind every other CLI test (conftest's ``run_cli`` runs the
installed ``warren``).
"""

from __future__ import annotations

import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from warren import protocol, wire
from warren.errors import SandboxNotFound
from warren.net import log as netlog
from warren.net.allowlist import NetEvent

BIN = Path(sys.executable).parent
NATIVE, PYTHON_CLI = BIN / "warren", BIN / "warren-python"

pytestmark = pytest.mark.skipif(
    not PYTHON_CLI.exists(), reason="the native front end was not built (no C compiler at install)"
)

Script = Callable[[wire.Sock, protocol.Message, list[int]], None]


class FakeSupervisor:
    """Answers each connection with ``script``, recording the request it got."""

    def __init__(self, state: Path) -> None:
        token = secrets.token_hex(16)
        self.state = state
        root = state / "warren"
        (root / "sandboxes").mkdir(parents=True, mode=0o700)
        root.chmod(0o700)
        addr = root / "supervisor.addr"
        addr.write_text(f"{token} {os.getpid()}\n")
        addr.chmod(0o600)
        self.listener = wire.listen_abstract(wire.abstract_name(token))
        self.script: Script = lambda conn, msg, fds: None
        self.got: list[tuple[dict[str, object], int]] = []
        self.resets = 0  # connections to close with their request unread (a reset, for the client)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                if self.resets > 0:  # as a supervisor that exits with the request unread
                    self.resets -= 1
                    select.select([conn], [], [], 10)
                    continue
                msg, _, fds = wire.recv(conn)
                self.got.append((msg.to_dict(), len(fds)))
                try:
                    self.script(conn, msg, fds)
                except OSError:
                    pass
                finally:
                    for fd in fds:
                        os.close(fd)


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeSupervisor]:
    state = tmp_path_factory.mktemp("native-state")
    sup = FakeSupervisor(state)
    yield sup
    sup.listener.close()


@pytest.fixture
def both(fake: FakeSupervisor, tmp_path: Path) -> Callable[..., list[tuple[object, ...]]]:
    """Runs argv with the native ``warren``, then ``warren-python``: per side, what the
    supervisor got and what the caller saw."""

    def go(
        argv: list[str], script: Script, program: Path | None = None, env: dict[str, str | None] | None = None
    ) -> list[tuple[object, ...]]:
        fake.script = script
        seen = []
        for cli in (program or NATIVE, PYTHON_CLI):
            fake.got.clear()
            r = subprocess.run(
                [str(cli), *argv],
                cwd=tmp_path,
                env={k: v for k, v in {**_env_for(fake), **(env or {})}.items() if v is not None},
                capture_output=True,
                text=True,
                timeout=30,
            )
            seen.append((fake.got[:], r.stdout, r.stderr, r.returncode))
        return seen

    return go


def _env_for(fake: FakeSupervisor) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/"),
        "LANG": "C.UTF-8",
        "XDG_STATE_HOME": str(fake.state),
        "ODD": 'quote" back\\slash\ttab\x01 ünï',
    }


def _answer(*replies: protocol.Message) -> Script:
    def script(conn: wire.Sock, _msg: protocol.Message, _fds: list[int]) -> None:
        for reply in replies:
            wire.send(conn, reply)

    return script


STARTED = protocol.Started(pid=2, cwd="/w", network="none")
GHOST = SandboxNotFound("no sandbox named ghost", operation="exec", hint="see `warren ls`")


def _exited(code: int) -> protocol.Exited:
    return protocol.Exited(status=code << 8)


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--", "true"],
        ["run", "sh", "-c", "echo 'a b' \"$ODD\"\n"],
        ["run", "--", "--", "x"],
        ["run", "--network", "none", "--", "true"],
        ["run", "--network=allow", "--allow-host", "pypi.org", "--allow-host=*.example.org:8443", "true"],
        ["run", "--allow-host", "files.pythonhosted.org", "--", "--", "x"],
        ["run", "--network", "open", "--", "sh", "-c", "echo $ODD"],
        ["run", "--network", "ask", "--", "true"],  # asks on a terminal: the Python CLI's
        ["run", "--allow-host", "bad host!", "--", "true"],  # not plain: the Python CLI's
        ["run", "--allow-host", "[::1]:8080", "--", "true"],
        ["run", "--network", "allow", "--network", "none", "--", "true"],
        ["run", "--preset", "python", "--network", "allow", "--", "uv", "pip", "install", "x"],
        ["run", "--preset=node", "--preset", "rust", "true"],
        ["run", "--preset", "Python", "--", "true"],  # not a plain word: the Python CLI's
        ["run", "--env", "A=1", "--env=B=x=y", "--preset", "python", "--env", "A=2", "--", "true"],
        ["run", "--env", "EMPTY=", "--env", 'ODD=quote" back\\slash\ttab\x01 ünï', "--", "env"],
        ["run", "--env", "NO_EQUALS", "--", "true"],  # a usage error: the Python CLI's
        ["run", "--env", "=value", "--", "true"],  # the same
        ["run", "--network", "allow", "--write", "/tmp", "--", "true"],
        [
            "run",
            "-w",
            "ws",
            "--write",
            "/tmp",
            "--write=rel/dir",
            "--read=/etc",
            "--deny",
            "ünï",
            "--",
            "true",
        ],
        ["run", "--workspace=/tmp", "--deny=.env", "--preset", "python", "true"],
        ["run", "-w", "a", "--workspace", "b", "--", "true"],  # twice: the Python CLI's (the last)
        ["run", "-wdir", "--", "true"],  # attached: the Python CLI's
        ["run", "--write=", "--", "true"],  # empty: the Python CLI's
        ["run", "--write", "/tmp", "--memory", "512M", "--", "true"],  # another flag
        ["run", "--network"],
        ["exec", "box", "true"],
        ["exec", "box", "--", "ls", "-la", "ünï"],
        ["exec", "box", "--", "--", "x"],
        ["exec", "box", "--cwd", "/tmp", "pwd"],  # flags after NAME: the Python CLI's
        ["exec", "--cwd", "/tmp", "box", "pwd"],
        ["exec", "--cwd=sub dir/ünï", "box", "--", "ls"],
        ["exec", "--cwd", "/a", "--cwd", "/b", "box", "true"],  # twice: the Python CLI's (the last)
        ["exec", "--cwd", "/tmp", "--env", "A=1", "box", "true"],  # another flag: the Python CLI's
        ["exec", "--cwd", "/tmp", "--", "box", "true"],  # `--` before NAME: the Python CLI's
        ["exec", "-d", "box", "sleep", "1"],
    ],
)
def test_the_native_front_end_sends_the_request_the_python_cli_sends(
    both: Callable[..., list[tuple[object, ...]]], argv: list[str]
) -> None:
    native, python = both(argv, _answer(STARTED, _exited(0)))
    assert native == python
    # -d: the fake answers no spawn; the rest are usage errors
    refused = argv[1] == "-d" or argv == ["run", "--network"] or "NO_EQUALS" in argv or "=value" in argv
    assert native[3] == (125 if refused else 0), native


@pytest.mark.parametrize(
    "locale",
    [{"LANG": None}, {"LANG": ""}, {"LANG": "C"}, {"LANG": "no_such_locale"}, {"LANG": None, "LC_ALL": "C"},
     {"LC_CTYPE": "POSIX"}, {"LANG": None, "PYTHONCOERCECLOCALE": "0"},
     {"LANG": None, "PYTHONCOERCECLOCALE": "warn"}],
)  # fmt: skip
def test_in_the_c_locale_a_run_sends_the_environment_the_python_cli_sends(
    both: Callable[..., list[tuple[object, ...]]], locale: dict[str, str | None]
) -> None:
    """The Python CLI's interpreter sets LC_CTYPE=C.UTF-8 there (PEP 538), and a run
    passes it on."""
    native, python = both(["run", "--", "true"], _answer(STARTED, _exited(0)), env=locale)
    assert native == python


@pytest.mark.parametrize(
    ("argv", "replies"),
    [
        (["run", "--", "curl", "http://x"], [STARTED, _exited(6)]),  # a hint: no network
        (["exec", "box", "sh", "-c", "exit 3"], [STARTED, _exited(3)]),
        (["exec", "box", "true"], [STARTED, protocol.Exited(status=9, limit="memory limit 64M reached")]),
        (["exec", "box", "true"], [STARTED, protocol.Exited(status=0, timed_out=True)]),
        (["exec", "ghost", "true"], [protocol.error_message(GHOST)]),
        (["exec", "box", "true"], [STARTED]),  # the connection lost before the exit
        (["exec", "box", "true"], []),
    ],
)
def test_what_is_not_plain_is_shown_by_the_python_cli_as_it_would_itself(
    both: Callable[..., list[tuple[object, ...]]], argv: list[str], replies: list[protocol.Message]
) -> None:
    native, python = both(argv, _answer(*replies))
    assert native == python


WARNED = ["a warning", 'two "quoted" \\ lines\nand ünïcødé \u2603 \U0001f600 \x01\t', ""]


@pytest.mark.parametrize(
    "replies",
    [
        [protocol.Started(pid=2, cwd="/w", warnings=WARNED), _exited(0)],
        [STARTED, protocol.Exited(status=0, warnings=["after", *WARNED])],
        [
            protocol.Started(pid=2, cwd="/w", warnings=["before"]),
            protocol.Exited(status=0, warnings=["after"]),
        ],
        # not plain at the end: the Python CLI carries on, and says the first warnings once
        [protocol.Started(pid=2, cwd="/w", warnings=["before"]), _exited(3)],
        [
            protocol.Started(pid=2, cwd="/w", warnings=["before"]),
            protocol.Exited(status=1, warnings=["after"]),
        ],
    ],
)
def test_warnings_are_shown_by_the_native_side_as_the_python_cli_shows_them(
    both: Callable[..., list[tuple[object, ...]]], tmp_path: Path, replies: list[protocol.Message]
) -> None:
    """A plan's warnings (a workspace that shares no mount with its caches, one under
    /tmp) come with every run in such a place: printed by the native side, as the Python
    CLI prints them, without the Python CLI's start (about 35 ms) when the rest is plain."""
    native, python = both(["run", "--", "true"], _answer(*replies))
    assert native == python
    exited = replies[-1]
    assert isinstance(exited, protocol.Exited)
    if exited.status == 0:
        alone = tmp_path / "alone" / "warren"
        alone.parent.mkdir()
        shutil.copy(NATIVE, alone)
        by_itself, _ = both(["run", "--", "true"], _answer(*replies), program=alone)
        assert by_itself[1:] == python[1:]


def test_network_refusals_are_shown_as_the_python_cli_shows_them(
    both: Callable[..., list[tuple[object, ...]]],
) -> None:
    event = b'{"allowed":false,"method":"CONNECT","host":"evil.example","port":443,"reason":"not allowed"}\n'

    def script(conn: wire.Sock, _msg: protocol.Message, fds: list[int]) -> None:
        os.write(fds[3], event)
        wire.send(conn, STARTED)
        wire.send(conn, _exited(0))

    native, python = both(["run", "--", "true"], script)
    assert native == python
    assert "warren: network: refused CONNECT evil.example:443: not allowed" in str(native[2])


# A host a sandbox names can hold anything: the real writer escapes it.
_TRICKY = 'x","allowed":true,"y":"\\'


def _events(*allowed: bool, at_once: Path | None = None) -> Script:
    """Writes decisions through the network helper's own writer, then the command ends.
    ``at_once``: written to that file first, then to the client in one write (more
    than the client reads at a time waits for it together)."""

    def script(conn: wire.Sock, _msg: protocol.Message, fds: list[int]) -> None:
        if at_once is not None:
            at_once.unlink(missing_ok=True)
        writer = netlog.Writer(at_once, pipe=None if at_once is not None else os.dup(fds[3]))
        for i, ok in enumerate(allowed):
            host = f"{_TRICKY}{i}.example"
            writer(NetEvent("t", "s", "CONNECT", host, 443, ok, "allowed" if ok else "not on the list"))
        if at_once is not None:
            os.close(writer.fd)
            with open(fds[3], "wb", closefd=False) as events:
                events.write(at_once.read_bytes())
        else:
            os.close(writer.pipe or os.dup(0))
        wire.send(conn, STARTED)
        wire.send(conn, _exited(0))

    return script


def test_allowed_requests_need_no_python_and_a_refusal_among_them_is_shown_as_python_shows_it(
    both: Callable[..., list[tuple[object, ...]]], tmp_path: Path
) -> None:
    """The Python CLI says nothing of an allowed request: a run whose every request was
    allowed (an agent's `uv sync` through the proxy) stays with the native front end."""
    alone = tmp_path / "alone" / "warren"
    alone.parent.mkdir()
    shutil.copy(NATIVE, alone)
    run = ["run", "--network", "allow", "--", "true"]
    plain, python = both(run, _events(True, True, True), program=alone)
    assert plain[1:] == python[1:] == ("", "", 0)
    # more than one read's worth (64 KiB) waiting at once: a line cut by a read's end is
    # read on, not handed over
    many, _ = both(run, _events(*[True] * 3000, at_once=tmp_path / "net.jsonl"), program=alone)
    assert many[1:] == ("", "", 0)
    assert (tmp_path / "net.jsonl").stat().st_size > 4 * 65536
    native, python = both(run, _events(True, False, True, False))
    assert native == python
    assert str(native[2]).count("warren: network: refused CONNECT") == 2, native  # the two refused
    refused, _ = both(run, _events(True, False), program=alone)
    assert refused[3] == 125 and "cannot start the Python CLI" in str(refused[2])

    # The start of a line whose end never comes (its writer gone): the Python CLI's.
    def cut(conn: wire.Sock, _msg: protocol.Message, fds: list[int]) -> None:
        os.write(fds[3], b'{"time":"t","sandbox":"s","method":"CONNECT","host":"x')
        os.close(fds.pop(3))
        wire.send(conn, STARTED)
        wire.send(conn, _exited(0))

    native, python = both(run, cut)
    assert native == python and native[3] == 0
    handed, _ = both(run, cut, program=alone)
    assert handed[3] == 125 and "cannot start the Python CLI" in str(handed[2])


def test_a_signal_during_the_command_is_forwarded_by_either_cli(
    fake: FakeSupervisor, both: Callable[..., list[tuple[object, ...]]]
) -> None:
    def script(conn: wire.Sock, _msg: protocol.Message, _fds: list[int]) -> None:
        os.kill(wire.peer_creds(conn)[0], signal.SIGTERM)  # the client is waiting by now
        wire.send(conn, STARTED)
        sig, _, _ = wire.recv(conn, (protocol.Signal,))
        assert isinstance(sig, protocol.Signal)
        fake.got.append(({"forwarded": sig.signal}, 0))
        wire.send(conn, protocol.Exited(status=sig.signal))

    native, python = both(["exec", "box", "sleep", "9"], script)
    assert native == python
    assert native[0][1] == ({"forwarded": signal.SIGTERM}, 0) and native[3] == 128 + signal.SIGTERM


def test_the_plain_case_needs_no_python_and_the_rest_says_what_is_missing(
    both: Callable[..., list[tuple[object, ...]]], tmp_path: Path
) -> None:
    alone = tmp_path / "alone" / "warren"
    alone.parent.mkdir()
    shutil.copy(NATIVE, alone)
    plain, _ = both(["exec", "box", "true"], _answer(STARTED, _exited(0)), program=alone)
    assert plain[1:] == ("", "", 0)
    # A run through warren's proxy to named hosts is plain too (the agent's `uv pip install`).
    flags = ["--network", "allow", "--allow-host", "pypi.org", "--allow-host=files.pythonhosted.org"]
    plain, _ = both(["run", *flags, "--", "true"], _answer(STARTED, _exited(0)), program=alone)
    assert plain[1:] == ("", "", 0)
    [(request, _fds)] = plain[0]
    spec = request["spec"]
    assert isinstance(spec, dict)
    assert (spec["network"], spec["allow_host"]) == ("allow", ["pypi.org", "files.pythonhosted.org"])
    # So is one with presets and variables set (a project's `uv sync` with its UV_PYTHON).
    flags = ["--preset", "python", "--preset=node", "--env", "UV_PYTHON=/usr/bin/python3", "--env=A=b=c"]
    plain, _ = both(["run", *flags, "--", "true"], _answer(STARTED, _exited(0)), program=alone)
    assert plain[1:] == ("", "", 0)
    [(request, _fds)] = plain[0]
    spec = request["spec"]
    assert isinstance(spec, dict)
    assert spec["preset"] == ["python", "node"]
    assert spec["env"] == {"UV_PYTHON": "/usr/bin/python3", "A": "b=c"}
    # And one with the paths it may write, read, not see (a test suite's `warren run --write`).
    flags = ["-w", "/w", "--write", "/tmp", "--write=cache", "--read", "/etc", "--deny=.env"]
    plain, _ = both(["run", *flags, "--", "true"], _answer(STARTED, _exited(0)), program=alone)
    assert plain[1:] == ("", "", 0)
    [(request, _fds)] = plain[0]
    spec = request["spec"]
    assert isinstance(spec, dict)
    given = {k: spec[k] for k in ("workspace", "write", "read", "deny")}
    assert given == {"workspace": "/w", "write": ["/tmp", "cache"], "read": ["/etc"], "deny": [".env"]}
    # An exec in a directory of the sandbox (the tests' create, exec --cwd, rm -f).
    plain, _ = both(["exec", "--cwd", "/w/sub", "box", "pwd"], _answer(STARTED, _exited(0)), program=alone)
    assert plain[1:] == ("", "", 0)
    [(request, _fds)] = plain[0]
    command = request["command"]
    assert isinstance(command, dict) and (command["cwd"], command["argv"]) == ("/w/sub", ["pwd"])
    failed, _ = both(["exec", "box", "false"], _answer(STARTED, _exited(1)), program=alone)
    assert failed[3] == 125 and "cannot start the Python CLI" in str(failed[2])


def _made(name: str = "box", warnings: list[str] | None = None) -> protocol.SandboxInfo:
    return protocol.SandboxInfo(
        name=name, id="0123abcd", state="running", workspace="/w", created=1.0, warnings=warnings or []
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["create", "box"],
        ["create", "Box.1_a-b"],
        [
            "create",
            "-w",
            "ws",
            "--write",
            "/tmp",
            "--read=/etc",
            "--deny",
            "ünï",
            "--preset",
            "python",
            "--network",
            "allow",
            "--allow-host",
            "pypi.org",
            "--env",
            'ODD=quote" back\\slash',
            "box",
        ],
        ["create", "box", "--write", "/tmp"],  # a flag after NAME: the Python CLI's
        ["create", "--", "box"],  # the same
        ["create", "--memory", "512M", "box"],  # another flag
        ["create", "--profile", "ci", "box"],
        ["create", "bad name!"],  # a usage error: the Python CLI's
        ["create", "-box"],
        ["create", "a", "b"],
    ],
)
def test_a_create_sends_the_request_the_python_cli_sends_and_prints_the_same(
    both: Callable[..., list[tuple[object, ...]]], argv: list[str]
) -> None:
    def script(conn: wire.Sock, msg: protocol.Message, _fds: list[int]) -> None:
        assert isinstance(msg, protocol.CreateRequest)
        wire.send(conn, _made(msg.name))

    native, python = both(argv, script)
    assert native == python
    refused = argv[1:] in (["bad name!"], ["-box"], ["a", "b"])  # usage errors
    assert native[3] == (125 if refused else 0), native
    if not refused:
        [(request, fds)] = native[0]
        assert (request["t"], fds) == ("create", 0)
        assert native[1:3] == (f"{request['name']}\n", "")


@pytest.mark.parametrize(
    "replies",
    [
        [_made(warnings=WARNED)],  # printed by the native side
        [_made("other")],  # not the name asked for: the Python CLI says what it got
        [protocol.error_message(SandboxNotFound("no room for box", operation="create", hint="see `ls`"))],
        [],  # the connection closed with no reply
    ],
)
def test_a_create_s_reply_is_shown_as_the_python_cli_shows_it(
    both: Callable[..., list[tuple[object, ...]]], tmp_path: Path, replies: list[protocol.Message]
) -> None:
    native, python = both(["create", "box"], _answer(*replies))
    assert native == python
    alone = tmp_path / "alone" / "warren"
    alone.parent.mkdir()
    shutil.copy(NATIVE, alone)
    by_itself, _ = both(["create", "box"], _answer(*replies), program=alone)
    if replies and isinstance(replies[0], protocol.SandboxInfo) and replies[0].name == "box":
        assert by_itself[1:] == python[1:] and "warren: WARNING: a warning\n" in str(by_itself[2])
    else:  # handed over: without the Python CLI, it says what is missing
        assert by_itself[3] == 125 and "cannot start the Python CLI" in str(by_itself[2]), by_itself


def test_a_create_the_supervisor_never_read_goes_again_to_the_next(
    fake: FakeSupervisor, both: Callable[..., list[tuple[object, ...]]]
) -> None:
    """A connection reset before any reply (a supervisor that exited with the request
    unread): the request goes once more, as the Python CLI's own does."""
    seen = []
    for program in (NATIVE, PYTHON_CLI):
        fake.resets = 1
        [side, _] = both(["create", "box"], _answer(_made()), program=program)
        assert fake.resets == 0, "the request did not come"
        seen.append(side)
    native, python = seen
    assert native == python
    assert native[1:] == ("box\n", "", 0) and len(native[0]) == 1, native


def _ended(warnings: list[str] | None = None) -> Script:
    """A supervisor's answer to a get or stop: the sandbox named, stopped (or removed)."""

    def script(conn: wire.Sock, msg: protocol.Message, _fds: list[int]) -> None:
        assert isinstance(msg, protocol.GetRequest | protocol.StopRequest)
        state = "removed" if isinstance(msg, protocol.StopRequest) and msg.remove else "stopped"
        info = protocol.SandboxInfo(name=msg.name, id="0123abcd", state=state, warnings=warnings or [])
        wire.send(conn, info)

    return script


@pytest.mark.parametrize(
    "argv",
    [
        ["stop", "box"],
        ["rm", "-f", "box"],
        ["rm", "--force", "Box.1_a-b"],
        ["rm", "box"],  # asks first whether it runs: the Python CLI's
        ["stop", "a", "b"],  # several: the Python CLI's (it prints each name)
        ["rm", "-f", "a", "b"],
        ["rm", "-f", "bad name!"],  # a usage error
        ["stop", "-box"],
    ],
)
def test_stop_and_rm_f_send_the_request_the_python_cli_sends_and_print_the_same(
    both: Callable[..., list[tuple[object, ...]]], argv: list[str]
) -> None:
    native, python = both(argv, _ended())
    assert native == python
    refused = argv[-1] in ("bad name!", "-box")
    assert native[3] == (125 if refused else 0), native
    if argv in (["stop", "box"], ["rm", "-f", "box"], ["rm", "--force", "Box.1_a-b"]):
        [(request, fds)] = native[0]
        asked = (request["t"], request["name"], request["remove"], fds)
        assert asked == ("stop", argv[-1], argv[0] == "rm", 0)
        assert native[1:3] == ("", "")


@pytest.mark.parametrize("argv", [["stop", "box"], ["rm", "-f", "box"]])
@pytest.mark.parametrize(
    "script",
    [
        _ended(WARNED),  # printed by the native side
        _answer(protocol.error_message(GHOST)),
        _answer(),  # closed with no reply
    ],
)
def test_the_reply_to_stop_and_rm_f_is_shown_as_the_python_cli_shows_it(
    both: Callable[..., list[tuple[object, ...]]], tmp_path: Path, argv: list[str], script: Script
) -> None:
    native, python = both(argv, script)
    assert native == python
    alone = tmp_path / "alone" / "warren"
    alone.parent.mkdir()
    shutil.copy(NATIVE, alone)
    by_itself, _ = both(argv, script, program=alone)
    if python[3] == 0:
        assert by_itself[1:] == python[1:] and "warren: WARNING: a warning\n" in str(by_itself[2])
    else:  # handed over: without the Python CLI, it says what is missing
        assert by_itself[3] == 125 and "cannot start the Python CLI" in str(by_itself[2]), by_itself
