"""What a newcomer meets on the command line: flags after NAME in ``exec``, "did you
mean" for typos, completion scripts and the man page made from the parsers themselves,
``exec -d`` + ``logs [-f]`` for background commands, and ``ps`` showing commands as
they were typed with warren's own processes as one word."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import WARREN, Layout, need_tool, run_cli
from warren.cli import catalog


@pytest.fixture
def web(layout: Layout, tmp_path: Path) -> Iterator[tuple[Layout, dict[str, str]]]:
    """A long-lived sandbox ``web`` over the layout's workspace, with private state."""
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    made = run_cli(["create", "web", "-w", str(layout.workspace)], cwd=layout.workspace, env=env)
    assert made.returncode == 0, made.stderr
    try:
        yield layout, env
    finally:
        run_cli(["rm", "-f", "web"], cwd=layout.workspace, env=env)
        run_cli(["shutdown"], cwd=layout.workspace, env=env)


def cli(web: tuple[Layout, dict[str, str]], *args: str) -> subprocess.CompletedProcess[str]:
    layout, env = web
    return run_cli(list(args), cwd=layout.workspace, env=env)


# --- exec: flags between NAME and the command -----------------------------------------


def test_exec_takes_flags_after_name_before_double_dash(web: tuple[Layout, dict[str, str]]) -> None:
    sub = web[0].workspace / "sub"
    sub.mkdir()
    r = cli(web, "exec", "web", "--cwd", str(sub), "--env", "A=1", "--", "sh", "-c", "pwd; echo $A")
    assert (r.returncode, r.stdout, r.stderr) == (0, f"{sub}\n1\n", "")


def test_exec_without_double_dash_starts_the_command_at_the_first_word(
    web: tuple[Layout, dict[str, str]],
) -> None:
    sub = web[0].workspace / "sub"
    sub.mkdir()
    r = cli(web, "exec", "web", "--cwd", str(sub), "pwd")
    assert (r.returncode, r.stdout) == (0, f"{sub}\n"), r.stderr
    # the command's own flags stay the command's
    r = cli(web, "exec", "web", "ls", "-d", "--", "/")
    assert (r.returncode, r.stdout) == (0, "/\n"), r.stderr
    r = cli(web, "exec", "--cwd", str(sub), "web", "sh", "-c", "pwd")
    assert (r.returncode, r.stdout) == (0, f"{sub}\n"), r.stderr


# --- did you mean ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "meant"),
    [
        (["lss"], "'ls'"),
        (["exce", "web", "true"], "'exec'"),
        (["run", "--netwrok", "none", "--", "true"], "'--network'"),
        (["exec", "web", "--cdw", "/", "--", "pwd"], "'--cwd'"),
        (["ps", "--jsno", "web"], "'--json'"),
    ],
)
def test_a_typo_gets_did_you_mean(tmp_path: Path, args: list[str], meant: str) -> None:
    r = run_cli(args, cwd=tmp_path, env={"XDG_STATE_HOME": str(tmp_path / "state")})
    assert r.returncode == 125
    assert f"did you mean {meant}?" in r.stderr
    assert "Traceback" not in r.stderr and r.stderr.startswith("warren: ")


def test_a_word_like_no_command_gets_no_guess(tmp_path: Path) -> None:
    r = run_cli(["xyzzy"], cwd=tmp_path, env={"XDG_STATE_HOME": str(tmp_path / "state")})
    assert r.returncode == 125 and "did you mean" not in r.stderr and "warren --help" in r.stderr


def test_each_command_is_found_in_the_one_module_that_holds_it() -> None:
    """``warren CMD`` imports CMD's module alone (cli.WHERE): the table must name every
    command of every module, each where its handler is."""
    from importlib import import_module

    from warren import cli

    held = {
        name: module
        for module in set(cli.WHERE.values())
        for name in import_module(f"warren.cli.{module}").COMMANDS
    }
    assert held == cli.WHERE
    assert set(cli.commands()) == set(cli.WHERE)


# --- completion and man, from the parsers ---------------------------------------------


def test_catalog_reads_every_command_and_flag_from_its_parser() -> None:
    cmds = {c.name: c for c in catalog.commands()}
    assert {"run", "exec", "create", "ls", "ps", "logs", "completion", "man", "mcp", "serve"} <= set(cmds)
    exec_flags = {n for o in cmds["exec"].options for n in o.names}
    assert {"-d", "--detach", "--cwd", "--env", "--timeout"} <= exec_flags
    network = next(o for o in cmds["run"].options if "--network" in o.names)
    assert network.choices == ("none", "allow", "ask", "open")


@pytest.mark.parametrize("shell", catalog.SHELLS)
def test_completion_script_names_every_command_and_flag(tmp_path: Path, shell: str) -> None:
    r = run_cli(["completion", shell], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for c in catalog.commands():
        assert c.name in r.stdout
        for o in c.options:
            for n in o.names:
                word = n.lstrip("-") if shell == "fish" else n
                assert word in r.stdout, (shell, c.name, n)
    checker = {"bash": ["bash", "-n"], "zsh": ["zsh", "-n"], "fish": ["fish", "--no-execute"]}[shell]
    need_tool(checker[0], "it checks the completion script's syntax")
    script = tmp_path / f"warren.{shell}"
    script.write_text(r.stdout)
    checked = subprocess.run([*checker, str(script)], capture_output=True, text=True)
    assert checked.returncode == 0 and checked.stderr == "", checked.stderr


def _complete(script: str, words: list[str]) -> list[str]:
    """What bash offers for the last word of ``words``, with the generated script."""
    line = " ".join(shlex.quote(w) for w in words)
    ask = f"COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _warren"
    program = f"{script}\n{ask}\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n"
    r = subprocess.run(["bash", "--norc", "-c", program], capture_output=True, text=True, check=True)
    return r.stdout.split()


def test_bash_completion_completes_commands_flags_and_choices(tmp_path: Path) -> None:
    script = run_cli(["completion", "bash"], cwd=tmp_path).stdout
    assert _complete(script, ["warren", "ex"]) == ["exec"]
    assert _complete(script, ["warren", "exec", "web", "--c"]) == ["--cwd"]
    assert _complete(script, ["warren", "run", "--network", ""]) == ["none", "allow", "ask", "open"]
    assert "--follow" in _complete(script, ["warren", "logs", "--"])


def test_man_page_renders_without_warnings_and_lists_every_command(tmp_path: Path) -> None:
    page = run_cli(["man"], cwd=tmp_path)
    assert page.returncode == 0, page.stderr
    assert page.stdout.startswith(".TH WARREN 1 ")
    source = tmp_path / "warren.1"
    source.write_text(page.stdout)
    env = {**os.environ, "MANWIDTH": "100", "LANG": "C.UTF-8", "MAN_KEEP_FORMATTING": ""}
    if shutil.which("man"):
        shown = subprocess.run(
            ["man", "--warnings", "-l", str(source)], capture_output=True, text=True, env=env
        )
    elif shutil.which("groff"):
        shown = subprocess.run(
            ["groff", "-man", "-ww", "-Tutf8", str(source)], capture_output=True, text=True, env=env
        )
    else:
        pytest.skip("neither man nor groff is installed: the page was not rendered")
    assert shown.returncode == 0 and shown.stderr == "", shown.stderr
    text = shown.stdout
    for c in catalog.commands():
        assert f"warren {c.name}" in text
    assert "--detach" in text and "EXIT STATUS" in text and "124" in text


# --- background commands: exec -d and logs ---------------------------------------------


def test_exec_detach_prints_an_id_and_logs_shows_and_follows_it(web: tuple[Layout, dict[str, str]]) -> None:
    gate = web[0].workspace / "gate"
    script = f"echo first; echo oops >&2; while [ ! -e {gate} ]; do sleep 0.05; done; echo last; exit 3"
    started = cli(web, "exec", "-d", "web", "--", "sh", "-c", script)
    assert started.returncode == 0, started.stderr
    spawn_id = started.stdout.strip()
    assert spawn_id and "\n" not in spawn_id
    # the command runs on after `exec -d` returned; its log so far is there
    while "first" not in (so_far := cli(web, "logs", "web", spawn_id)).stdout:
        assert so_far.returncode == 0, so_far.stderr
        time.sleep(0.05)  # only spacing the polls: the loop ends when the line is there
    assert "last" not in so_far.stdout
    gate.touch()
    followed = cli(web, "logs", "-f", "web", spawn_id)
    assert (followed.returncode, followed.stdout, followed.stderr) == (3, "first\nlast\n", "oops\n")


def test_logs_of_an_unknown_id_is_a_clear_error(web: tuple[Layout, dict[str, str]]) -> None:
    r = cli(web, "logs", "web", "p000000000000")
    assert r.returncode == 125 and "Traceback" not in r.stderr and "hint:" in r.stderr
    r = cli(web, "logs", "web")
    assert r.returncode == 125 and "warren exec -d web" in r.stderr


# --- ps ---------------------------------------------------------------------------------


def test_ps_shows_commands_as_typed_and_warren_own_as_one_word(web: tuple[Layout, dict[str, str]]) -> None:
    started = cli(web, "exec", "-d", "web", "--", "sh", "-c", "sleep 600; echo 'a b'")
    assert started.returncode == 0, started.stderr
    r = cli(web, "ps", "web")
    assert r.returncode == 0, r.stderr
    rows = r.stdout.splitlines()[1:]
    assert "import" not in r.stdout and "sys.exit" not in r.stdout  # no boot code
    by_pid = {int(row.split()[0]): row for row in rows}
    assert by_pid[1].endswith("  [warren]")
    assert any(row.endswith("  sh -c 'sleep 600; echo '\"'\"'a b'\"'\"''") for row in rows), rows
    assert len(rows) == len(r.stdout.splitlines()) - 1  # one line per process


# --- hints after a failure (the CLI prints them, MCP returns them) ----------------------


def test_network_hint_reads_shell_lines_and_resolver_errors() -> None:
    from warren.cli.hints import NO_NETWORK, after_failure

    assert after_failure(["pip", "install", "x"], "none", None) == [NO_NETWORK]
    assert after_failure(["sh", "-c", "cd sub && pip install -e ."], "none", None) == [NO_NETWORK]
    resolver = b"curl: (6) Could not resolve host: pypi.org\n"
    assert after_failure(["sh", "-c", "make"], "none", None, resolver) == [NO_NETWORK]
    assert after_failure(["sh", "-c", "make"], "none", None, b"make: *** no rule\n") == []
    assert after_failure(["pip", "install", "x"], "allow", None, resolver) == []
    both = after_failure(["git", "pull"], "none", "/r")
    assert both[0] == NO_NETWORK and "--workspace /r" in both[1] and len(both) == 2


def test_commands_run_through_a_shell_get_the_hints_direct_ones_get() -> None:
    """Agents run everything through ``sh -c`` or ``bash -lc``: the install and repository
    hints read each simple command of the line, after assignments and ``exec``/``env``."""
    from warren.cli.hints import NO_NETWORK, after_failure, simple_commands

    direct = after_failure(["uv", "tool", "install", "ruff"], "allow", None)
    assert len(direct) == 1 and "`uv tool install`" in direct[0]
    for argv in (
        ["bash", "-lc", "cd proj && uv tool install ruff"],
        ["sh", "-ec", "set -x; exec uv tool install ruff"],
        ["bash", "-l", "-c", "UV_NO_CACHE=1 uv tool install ruff"],
        ["zsh", "-c", "env uv tool install 'ruff==0.6'"],
    ):
        assert after_failure(argv, "allow", None) == direct, argv
    repo = after_failure(["bash", "-lc", "git add -A && git commit -qm wip"], "allow", "/r")
    assert len(repo) == 1 and "--workspace /r" in repo[0]  # said once for the line
    assert after_failure(["bash", "-lc", "pip install x"], "none", None) == [NO_NETWORK]
    assert simple_commands(["bash", "--login", "script.sh"]) == [["bash", "--login", "script.sh"]]
    assert simple_commands(["bash", "-c", "a 'b c' | d"]) == [["a", "b c"], ["d"]]


# --- progress of a long copy ----------------------------------------------------------------


def _cp_with_stderr_on_a_terminal(web: tuple[Layout, dict[str, str]], *args: str) -> tuple[int, str]:
    """``warren cp ARGS`` with its stderr on a pseudo-terminal: (status, what it showed there)."""
    import pty

    layout, env = web
    master, slave = pty.openpty()
    try:
        proc = subprocess.run(
            [*WARREN, "cp", *args],
            cwd=layout.workspace,
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=slave,
            timeout=60,
        )
        os.close(slave)
        shown = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the terminal's other side is closed and drained
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(master)
    return proc.returncode, shown.decode(errors="replace")


def test_cp_of_a_tree_shows_progress_on_a_terminal_and_nothing_in_a_pipe(
    web: tuple[Layout, dict[str, str]], tmp_path: Path
) -> None:
    src = tmp_path / "tree"
    src.mkdir()
    for i in range(5):
        (src / f"f{i}").write_bytes(b"x" * 1000)
    status, shown = _cp_with_stderr_on_a_terminal(web, "-r", str(src), "web:copied")
    assert status == 0, shown
    assert "warren cp: 1 file" in shown and shown.endswith("\r\x1b[K"), repr(shown)  # cleared at the end
    status, shown = _cp_with_stderr_on_a_terminal(web, "-r", "web:copied", str(tmp_path / "back"))
    assert status == 0, shown
    assert "warren cp: 1 file:  20% 1000 B of 4.9 KiB" in shown, repr(shown)  # the total is known
    assert sorted(p.name for p in (tmp_path / "back").iterdir()) == [f"f{i}" for i in range(5)]
    # In a pipe (a log, an agent's capture): nothing but what went wrong.
    again = cli(web, "cp", "-r", str(src), "web:copied2")
    assert (again.returncode, again.stderr) == (0, "")


@pytest.mark.parametrize("front", ["native", "python"])
def test_a_removed_working_directory_is_named_with_a_hint_not_a_traceback(tmp_path: Path, front: str) -> None:
    """``rm -rf`` of the directory the shell is in, then ``warren run``: the seeds' own
    failure (exec after the workspace is removed), in warren's CLI. Without a workspace
    there is none to use: refused, naming the directory; with an absolute
    ``--workspace`` the command runs there."""
    warren = os.path.join(os.path.dirname(sys.executable), "warren-python" if front == "python" else "warren")
    if not os.access(warren, os.X_OK):
        pytest.skip(f"no {front} front end in this install")
    gone, ws = tmp_path / "gone", tmp_path / "ws"
    gone.mkdir()
    ws.mkdir()

    def from_removed(*args: str) -> subprocess.CompletedProcess[str]:
        where = shlex.quote(str(gone))
        line = f"cd {where} && rmdir {where} && exec {shlex.join([warren, *args])}"
        return subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=60)

    r = from_removed("run", "--", "true")
    assert r.returncode == 125, r.stderr
    assert f"your current directory was removed: {gone}" in r.stderr and "hint: cd into" in r.stderr
    assert "Traceback" not in r.stderr
    gone.mkdir()
    r = from_removed("run", "--workspace", str(ws), "--", "sh", "-c", "pwd; touch made")
    assert (r.returncode, r.stdout.strip()) == (0, str(ws)), r.stderr
    assert (ws / "made").exists()
    gone.mkdir()
    r = from_removed("plan")
    assert r.returncode == 125 and "Traceback" not in r.stderr, r.stderr


def test_listings_take_quiet_json_and_templates_and_several_names_at_once(tmp_path: Path) -> None:
    """docker's and kubectl's habits: ``ls -q`` for names alone, ``--format json|table|
    TEMPLATE``, ``rm``/``stop``/``pause``/``resume`` of several names or ``--all``, each
    failure said and the rest done (exit 125)."""
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    ws = tmp_path / "ws"
    ws.mkdir()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(list(args), cwd=ws, env=env)

    try:
        for name in ("l1", "l2"):
            assert cli("create", name).returncode == 0
        assert cli("ls", "-q").stdout.split() == ["l1", "l2"]
        table = cli("ls").stdout.splitlines()
        assert table[0].split()[:4] == ["NAME", "STATE", "AGE", "IDLE"] and len(table) == 3
        assert cli("ls", "--format", "{{.Name}}:{{.State}}").stdout.split() == ["l1:running", "l2:running"]
        import json

        assert [row["name"] for row in json.loads(cli("ls", "--format", "json").stdout)] == ["l1", "l2"]
        bad = cli("ls", "--format", "{{.Nope}}")
        assert bad.returncode == 125 and "hint: fields: .name" in bad.stderr
        paused = cli("pause", "l1", "nope", "l2")
        assert paused.returncode == 125 and paused.stdout.split() == ["l1", "l2"]
        assert "nope: no sandbox named nope" in paused.stderr
        assert cli("ls", "--format", "{{.State}}").stdout.split() == ["paused", "paused"]
        assert cli("resume", "--all").returncode == 0
        ps = cli("ps", "-q", "l1")
        assert ps.returncode == 0 and all(pid.isdigit() for pid in ps.stdout.split())
        assert cli("rm", "l1").returncode == 125  # running: -f says so
        missing = cli("cp", "l1:no-such-file", str(tmp_path / "out"))  # every failure of warren's: 125
        assert missing.returncode == 125 and "no-such-file" in missing.stderr, missing.stderr
        assert cli("rm", "-f", "--all").stdout.split() == ["l1", "l2"]
        assert cli("ls", "-q").stdout == ""
    finally:
        cli("rm", "-f", "--all")
        cli("shutdown")
