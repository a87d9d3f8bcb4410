"""`warren run` and `warren plan` as a user meets them: exit codes, messages, stdio, tty."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

from conftest import WARREN, Layout, run_cli
from warren.plan.mounts import WRITABLE_FRESH, within


def test_exit_status_is_the_commands(layout: Layout) -> None:
    assert layout.run(["sh", "-c", "exit 7"]).returncode == 7
    assert layout.run(["true"]).returncode == 0


def test_signal_death_is_128_plus_n(layout: Layout) -> None:
    r = layout.run(["sh", "-c", "kill -TERM $$"])
    assert r.returncode == 128 + 15


def test_stdin_and_stdout_pass_through(layout: Layout) -> None:
    r = layout.run(["sh", "-c", "tr a-z A-Z; echo err >&2"], stdin="hello\n")
    assert r.stdout == "HELLO\n"
    assert r.stderr == "err\n"


def test_missing_command_is_127_with_one_line_cause(layout: Layout) -> None:
    r = layout.run(["no-such-command-xyz"])
    assert r.returncode == 127
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("warren: command not found in the sandbox: no-such-command-xyz")
    assert lines[1].strip().startswith("hint:")
    assert "Traceback" not in r.stderr


def test_non_executable_file_is_126(layout: Layout) -> None:
    script = layout.workspace / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    r = layout.run(["./script.sh"])
    assert r.returncode == 126
    assert "cannot execute" in r.stderr and "hint:" in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_flag_is_125_with_hint(layout: Layout) -> None:
    r = run_cli(["run", "--no-such-flag", "--", "true"], cwd=layout.workspace)
    assert r.returncode == 125
    assert "unrecognized arguments: --no-such-flag" in r.stderr and "hint:" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_bad_timeout_is_125_with_hint(layout: Layout) -> None:
    for argv in (["run", "--timeout", "-5", "--", "true"], ["wait", "nosuch", "--timeout", "inf"]):
        r = run_cli(argv, cwd=layout.workspace)
        assert r.returncode == 125, r.stderr
        assert "--timeout must be a positive number of seconds" in r.stderr
        assert "hint: e.g. --timeout 30" in r.stderr and "Traceback" not in r.stderr


def test_nonexistent_workspace_is_125_naming_it(layout: Layout) -> None:
    missing = layout.root / "nope"
    r = run_cli(["run", "--workspace", str(missing), "--", "true"], cwd=layout.workspace)
    assert r.returncode == 125
    assert f"workspace does not exist: {missing}" in r.stderr
    assert "hint:" in r.stderr and "Traceback" not in r.stderr


def test_invalid_policy_is_caught_before_anything_starts(layout: Layout) -> None:
    marker = layout.workspace / "ran"
    r = run_cli(
        ["run", "--write", "relative/missing", "--", "touch", str(marker)],
        cwd=layout.workspace,
    )
    assert r.returncode == 125
    assert "does not exist" in r.stderr
    assert not marker.exists()


def test_write_inside_denied_path_is_rejected(layout: Layout) -> None:
    inner = layout.cache / "inner"
    inner.mkdir()
    r = run_cli(
        ["run", "--deny", str(layout.cache), "--write", str(inner), "--", "true"], cwd=layout.workspace
    )
    assert r.returncode == 125
    assert "inside denied path" in r.stderr


def test_cwd_inside_workspace_is_kept(layout: Layout) -> None:
    sub = layout.workspace / "sub"
    sub.mkdir()
    r = layout.run(["pwd"], cwd=sub)
    assert r.stdout.strip() == str(sub)


def test_env_is_allowlisted_and_explicit_values_set(layout: Layout) -> None:
    r = layout.run(
        ["sh", "-c", 'echo "$AWS_SECRET_ACCESS_KEY|$GITHUB_TOKEN|$FOO|$LANG"'],
        "--env",
        "FOO=bar",
        env={"AWS_SECRET_ACCESS_KEY": "s3cr3t", "GITHUB_TOKEN": "ghp_x", "LANG": "C.UTF-8"},
    )
    assert r.stdout.strip() == "||bar|C.UTF-8"


def test_plan_json_describes_the_shared_mount(any_layout: Layout) -> None:
    layout = any_layout
    r = run_cli(["plan", "--write", str(layout.cache), "--json"], cwd=layout.workspace)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    rules = {rule["path"]: rule["access"] for rule in plan["landlock"]["rules"]}
    assert "refer" in rules[str(layout.workspace)] and "refer" in rules[str(layout.cache)]
    text = run_cli(["plan", "--write", str(layout.cache)], cwd=layout.workspace)
    if within(str(layout.root), WRITABLE_FRESH):
        # Under /tmp each root is grafted alone, on a read-only view of their directory.
        for root in (layout.cache, layout.workspace):
            assert {"mount_at": str(root), "roots": [str(root)]} in plan["groups"]
        assert {"kind": "bind_ro", "target": str(layout.root)}.items() <= next(
            op for op in plan["mounts"] if op["target"] == str(layout.root)
        ).items()
        assert "each is a mount of its own" in text.stdout
        return
    # One mount for both (the sandbox's TMPDIR beside the workspace may join it too).
    [group] = [g for g in plan["groups"] if str(layout.workspace) in g["roots"]]
    assert str(layout.cache) in group["roots"] and within(str(layout.root), group["mount_at"])
    assert "share this one mount" in text.stdout


def test_old_kernel_fallback_warns_loudly_and_still_confines(layout: Layout) -> None:
    r = layout.run(
        ["sh", "-c", f"touch ok && touch {layout.root}/escape"],
        env={"WARREN_LANDLOCK_ABI": "1"},
    )
    assert "WARNING" in r.stderr and "EXDEV" in r.stderr
    assert (layout.workspace / "ok").exists()
    assert not (layout.root / "escape").exists()


def test_terminal_passes_through_and_ctrl_c_reaches_the_command(layout: Layout) -> None:
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(layout.workspace)
        code = "import os,sys,time; print('tty', os.isatty(0), os.isatty(1), flush=True); time.sleep(30)"
        os.execv(WARREN[0], [*WARREN, "run", "--", "python3", "-c", code])
    out = b""
    deadline = time.monotonic() + 20
    while b"tty" not in out and time.monotonic() < deadline:
        if select.select([fd], [], [], 1)[0]:
            out += os.read(fd, 1024)
    assert b"tty True True" in out, out
    os.write(fd, b"\x03")
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 130


def test_python_dash_m_warren_help_works(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "warren", "--help"], capture_output=True, text=True, cwd=tmp_path
    )
    assert r.returncode == 0 and "run" in r.stdout and "plan" in r.stdout
