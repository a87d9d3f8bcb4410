"""The coding agents' CLIs inside warren with their presets: the real npm packages
(installed by scripts/setup into $WARREN_AGENTS), offline: --network none, or a
loopback stand-in for the model's API reached through warren's proxy.

Each agent starts, writes its config where its preset put its home, and reaches
nothing else; Claude Code runs a whole turn whose Bash call writes the workspace and
is refused outside it: the user's own config (``~/.claude``, ``~/.codex``, ``~/.gemini``, which
the user's unsandboxed agent obeys later) can be neither read nor written, and no
other file of HOME changes. All judged on the host. HOME is a scratch directory under
the real one (the sandbox's /tmp is its own, so a pytest tmp_path is not visible in it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from conftest import module_state, run_cli


@pytest.fixture(scope="module")
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One private supervisor for the module's tests, as a user's serves all of theirs."""
    yield from module_state(tmp_path_factory)


AGENTS_PREFIX = Path(os.environ.get("WARREN_AGENTS", "/opt/warren-agents"))
BIN = AGENTS_PREFIX / "node_modules" / ".bin"


@dataclass(frozen=True)
class Agent:
    preset: str
    command: str
    package: str
    home_var: str
    users: str  # the user's own config directory, below HOME
    add_mcp: tuple[str, ...]  # an offline config write: register an MCP server "warren-probe"
    config: str  # the file that write lands in, below the agent's home
    min_node: int = 0


AGENTS = {
    a.preset: a
    for a in (
        Agent(
            "claude-code",
            "claude",
            "@anthropic-ai/claude-code",
            "CLAUDE_CONFIG_DIR",
            ".claude",
            ("claude", "mcp", "add", "-s", "user", "warren-probe", "--", "echo", "hi"),
            ".claude.json",
        ),
        Agent(
            "codex",
            "codex",
            "@openai/codex",
            "CODEX_HOME",
            ".codex",
            ("codex", "mcp", "add", "warren-probe", "--", "echo", "hi"),
            "config.toml",
        ),
        Agent(
            "gemini-cli",
            "gemini",
            "@google/gemini-cli",
            "GEMINI_CLI_HOME",
            ".gemini",
            ("gemini", "mcp", "add", "-s", "user", "warren-probe", "echo", "hi"),
            ".gemini/settings.json",
            min_node=20,
        ),
    )
}

SECRET = "sk-planted-4f1c9e7a2b"


def _node_major() -> int:
    node = shutil.which("node")
    if node is None:
        return 0
    out = subprocess.run([node, "--version"], capture_output=True, text=True, check=False)
    return int(out.stdout.strip().lstrip("v").split(".", 1)[0] or 0)


def _agent(name: str) -> Agent:
    agent = AGENTS[name]
    if not (BIN / agent.command).exists():
        pytest.skip(f"{agent.package} is not installed in {AGENTS_PREFIX} (scripts/setup installs it)")
    if _node_major() < agent.min_node:
        pytest.skip(f"{agent.package} needs node >= {agent.min_node}; this machine has {_node_major()}")
    return agent


@dataclass
class Home:
    path: Path
    ws: Path

    def run(
        self, agent: Agent, script: str, *flags: str, network: str = "none", **extra: str
    ) -> subprocess.CompletedProcess[str]:
        env = {
            "HOME": str(self.path),
            "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "ANTHROPIC_API_KEY": SECRET,
            **extra,
        }
        for var in ("XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "CLAUDE_CONFIG_DIR", "CODEX_HOME"):
            env[var] = ""  # the defaults below this HOME
        args = ["run", "--preset", agent.preset, "--network", network, *flags, "--", "sh", "-c", script]
        return run_cli(args, cwd=self.ws, env=env, timeout=180)

    def snapshot(self, *, skip: Path) -> dict[str, str]:
        """Every entry of HOME but the agent's own home (and the directories above it,
        which warren creates on launch) and warren's own cache directories, where the
        sandbox's TMPDIR lives while it runs (``~/.cache/warren/tmp``, made if missing;
        that the TMPDIR is gone afterwards is checked by tests/test_tmpdir.py): its type,
        mode, size, content."""
        out: dict[str, str] = {}
        tmp = self.path / ".cache" / "warren" / "tmp"
        for path in sorted(self.path.rglob("*")):
            if path == skip or skip in path.parents or path in skip.parents or path in (tmp, *tmp.parents):
                continue
            st = path.lstat()
            body = path.read_text(errors="replace") if path.is_file() and not path.is_symlink() else ""
            out[str(path.relative_to(self.path))] = f"{st.st_mode:o} {st.st_size} {body}"
        return out


@pytest.fixture
def home(request: pytest.FixtureRequest, state_home: Path) -> Iterator[Home]:
    base = Path(os.path.expanduser("~")) / f".warren-agents-{os.getpid()}-{request.node.name[-40:]}"
    ws = base / "proj"
    ws.mkdir(parents=True)
    for agent in AGENTS.values():
        users = base / agent.users
        users.mkdir()
        (users / "settings.json").write_text('{"hooks": {}}\n')
        (users / "credentials.json").write_text(json.dumps({"token": SECRET}) + "\n")
    (base / ".claude.json").write_text('{"mcpServers": {}}\n')
    (base / ".bashrc").write_text("# the user's\n")
    yield Home(base, ws)
    shutil.rmtree(base, ignore_errors=True)


def _own_home(home: Home, agent: Agent) -> Path:
    return home.path / ".local" / "share" / "warren" / "agents" / agent.preset


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_the_agents_cli_starts_inside_warren_offline(home: Home, name: str) -> None:
    agent = _agent(name)
    package = json.loads((AGENTS_PREFIX / "node_modules" / agent.package / "package.json").read_text())
    r = home.run(agent, f"{agent.command} --version")
    assert r.returncode == 0, r.stderr
    assert package["version"] in r.stdout


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_the_agents_config_write_lands_in_its_own_home_and_nowhere_else(home: Home, name: str) -> None:
    agent = _agent(name)
    own = _own_home(home, agent)
    before = home.snapshot(skip=own)
    r = home.run(agent, f'echo "home=${{{agent.home_var}}}"; ' + " ".join(agent.add_mcp))
    assert r.returncode == 0, r.stderr
    assert f"home={own}\n" in r.stdout
    assert "warren-probe" in (own / agent.config).read_text()
    assert home.snapshot(skip=own) == before  # the user's config, .claude.json, .bashrc: untouched


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_the_users_own_agent_config_is_neither_readable_nor_writable(home: Home, name: str) -> None:
    agent = _agent(name)
    users = home.path / agent.users
    script = (
        f"cat {users}/credentials.json; echo planted > {users}/settings.json; "
        f"echo '{{\"hooks\": 1}}' > {home.path}/.claude.json; touch {home.path}/.profile; "
        f"mkdir -p {home.path}/.config/{agent.command}; echo done"
    )
    r = home.run(agent, script)
    assert "done" in r.stdout
    assert SECRET not in r.stdout + r.stderr
    assert (users / "settings.json").read_text() == '{"hooks": {}}\n'
    assert (home.path / ".claude.json").read_text() == '{"mcpServers": {}}\n'
    assert not (home.path / ".profile").exists()
    assert not (home.path / ".config").exists()


def test_an_api_key_reaches_the_agent_only_when_passed_explicitly(home: Home) -> None:
    agent = _agent("claude-code")
    r = home.run(agent, 'echo "key=${ANTHROPIC_API_KEY:-unset}"')
    assert r.returncode == 0, r.stderr
    assert "key=unset" in r.stdout and SECRET not in r.stdout
    r = home.run(agent, 'echo "key=${ANTHROPIC_API_KEY:-unset}"', "--pass-env", "ANTHROPIC_API_KEY")
    assert f"key={SECRET}" in r.stdout


API_HOSTS = {
    "claude-code": "api.anthropic.com",
    "codex": "api.openai.com",
    "gemini-cli": "generativelanguage.googleapis.com",
}


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_the_agents_api_host_is_on_the_allowlist_and_another_host_is_not(home: Home, name: str) -> None:
    """No real network: both names resolve to a loopback address (--resolve), which the
    proxy then refuses as internal; what matters is the stage each is refused at."""
    agent = AGENTS[name]
    api = API_HOSTS[name]
    script = f"curl -sS -m 20 https://{api}/; curl -sS -m 20 https://elsewhere.test/; true"
    flags = ("--resolve", f"{api}=127.0.0.2", "--resolve", "elsewhere.test=127.0.0.2")
    r = home.run(agent, script, *flags, network="allow")
    assert f"{api}:443 is not on the allowlist" not in r.stderr
    assert f"refused CONNECT {api}:443: {api} resolved only to refused addresses" in r.stderr
    assert "elsewhere.test:443 is not on the allowlist" in r.stderr


@dataclass
class FakeModel:
    """A loopback stand-in for the Anthropic Messages API: to a request that offers the
    Bash tool it answers with one Bash call (``command``), to the request that carries
    that call's result with a text, ``warren-ok``. It records what it was sent."""

    command: str
    requests: list[dict[str, Any]] = field(default_factory=list)

    def start(self) -> ThreadingHTTPServer:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                fake.requests.append({"path": self.path, "key": self.headers.get("x-api-key"), "body": body})
                offered = any(t.get("name") == "Bash" for t in body.get("tools", []))
                answered = "tool_result" in json.dumps(body.get("messages", []))
                if offered and not answered:
                    block: dict[str, Any] = {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}
                    delta = {
                        "type": "input_json_delta",
                        "partial_json": json.dumps({"command": fake.command}),
                    }
                    stop = "tool_use"
                else:
                    block = {"type": "text", "text": ""}
                    delta = {"type": "text_delta", "text": "warren-ok"}
                    stop = "end_turn"
                message = {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": body.get("model", "m"),
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 1, "output_tokens": 1},
                }
                events = [
                    ("message_start", {"message": message}),
                    ("content_block_start", {"index": 0, "content_block": block}),
                    ("content_block_delta", {"index": 0, "delta": delta}),
                    ("content_block_stop", {"index": 0}),
                    ("message_delta", {"delta": {"stop_reason": stop}, "usage": {"output_tokens": 1}}),
                    ("message_stop", {}),
                ]
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                for name, data in events:
                    self.wfile.write(
                        f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()
                    )

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.2", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server


def test_claude_runs_a_turn_inside_warren_and_its_bash_tool_writes_only_the_workspace(home: Home) -> None:
    """A whole agent turn, offline: the model is a loopback fake reached through warren's
    proxy (the only host allowed besides the preset's, which resolve to a refused
    address so nothing leaves the machine); the key is passed explicitly."""
    agent = _agent("claude-code")
    escaped = home.path / "escaped-by-agent"
    fake = FakeModel(command=f"touch made-by-agent; touch {escaped}")
    server = fake.start()
    port = server.server_address[1]
    try:
        own = _own_home(home, agent)
        before = home.snapshot(skip=own)
        flags = [
            "--resolve=fake.test=127.0.0.2",
            f"--allow-host=fake.test:{port}",
            f"--allow-host=127.0.0.2:{port}",
        ]
        flags += [
            f"--resolve={h}=127.0.0.3" for h in ("api.anthropic.com", "claude.ai", "platform.claude.com")
        ]
        r = home.run(
            agent,
            "claude -p 'make the file' --dangerously-skip-permissions",
            "--pass-env",
            "ANTHROPIC_API_KEY",
            # claude refuses to skip its permission checks as root outside a sandbox it knows of
            "--env",
            "IS_SANDBOX=1",
            *flags,
            network="allow",
            ANTHROPIC_BASE_URL=f"http://fake.test:{port}",
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        )
    finally:
        server.shutdown()
        server.server_close()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "warren-ok" in r.stdout
    assert fake.requests and all(q["key"] == SECRET for q in fake.requests)
    results = [q for q in fake.requests if "tool_result" in json.dumps(q["body"].get("messages", []))]
    assert results, "the agent never sent its Bash call's result back"
    said = [
        c
        for m in results[-1]["body"]["messages"]
        if isinstance(m.get("content"), list)
        for c in m["content"]
        if c.get("type") == "tool_result"
    ]
    assert (home.ws / "made-by-agent").exists(), said  # the workspace is the agent's
    # the rest of HOME is not, whatever the agent runs: refused, and the agent was told
    assert f"cannot touch '{escaped}'" in json.dumps(said)
    assert not escaped.exists()
    after = home.snapshot(skip=own)
    assert after.pop("proj/made-by-agent")
    assert after == before


def test_claude_sends_its_api_key_as_a_secret_it_cannot_read(home: Home, tmp_path: Path) -> None:
    """The preset's default with --network allow: inside, $ANTHROPIC_API_KEY is a
    placeholder; the fake API (over HTTPS as api.anthropic.com, with a test CA the
    caller trusts) receives the real key. The agent's own Bash tool prints what it sees."""
    import ssl

    from test_secrets_https import _test_ca

    agent = _agent("claude-code")
    ca, cert, key = _test_ca(tmp_path, ("api.anthropic.com",))
    fake = FakeModel(command='echo "seen=$ANTHROPIC_API_KEY" > seen-key')
    server = fake.start()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    port = server.server_address[1]
    try:
        flags = [f"--allow-host=api.anthropic.com:{port}", f"--allow-host=127.0.0.2:{port}"]
        flags += [
            f"--resolve={h}=127.0.0.2" for h in ("api.anthropic.com", "claude.ai", "platform.claude.com")
        ]
        r = home.run(
            agent,
            "claude -p 'look' --dangerously-skip-permissions",
            "--env",
            "IS_SANDBOX=1",
            *flags,
            network="allow",
            ANTHROPIC_BASE_URL=f"https://api.anthropic.com:{port}",
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
            SSL_CERT_FILE=str(ca),
        )
    finally:
        server.shutdown()
        server.server_close()
    assert r.returncode == 0, r.stdout + r.stderr
    assert fake.requests and all(q["key"] == SECRET for q in fake.requests)
    seen = (home.ws / "seen-key").read_text()
    assert seen.startswith("seen=warren-secret-ANTHROPIC_API_KEY-") and SECRET not in seen
    assert SECRET not in r.stdout + r.stderr
