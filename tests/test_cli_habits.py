"""The CLI habits of docker and kubectl that a script or a CI job leans on: ``warren wait``
for a background process (its exit status) or a sandbox (until it stops), ``ps -a``
with the exit status of what ``exec -d`` started, ``run --json`` as one document.

One sandbox serves the module: each test starts processes of its own in it."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shlex
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import WARREN, run_cli


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """Sandbox ``hb`` over a workspace of its own, with private state."""
    base = tmp_path_factory.mktemp("habits")
    ws = base / "ws"
    ws.mkdir()
    env = {"XDG_STATE_HOME": str(base / "state")}
    made = run_cli(["create", "hb", "-w", str(ws)], cwd=ws, env=env)
    assert made.returncode == 0, made.stderr
    try:
        yield ws, env
    finally:
        run_cli(["rm", "-f", "--all"], cwd=ws, env=env)
        run_cli(["shutdown"], cwd=ws, env=env)


def cli(
    box: tuple[Path, dict[str, str]], *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    ws, env = box
    return run_cli(list(args), cwd=ws, env=env, timeout=timeout)


def detach(box: tuple[Path, dict[str, str]], script: str) -> str:
    started = cli(box, "exec", "-d", "hb", "--", "sh", "-c", script)
    assert started.returncode == 0, started.stderr
    return started.stdout.strip()


# --- wait ---------------------------------------------------------------------------------


def test_wait_returns_a_background_process_status_once_it_ends(box: tuple[Path, dict[str, str]]) -> None:
    gate = box[0] / "gate-wait"
    spawn_id = detach(box, f"while [ ! -e {gate} ]; do sleep 0.02; done; exit 7")
    # the control: while the gate is closed, wait gives up at its timeout (124), the process runs on
    early = cli(box, "wait", "--timeout", "0.3", "hb", spawn_id)
    assert early.returncode == 124 and "still running" in early.stderr, early.stderr
    gate.touch()
    done = cli(box, "wait", "hb", spawn_id)
    assert (done.returncode, done.stdout) == (7, "7\n"), done.stderr


def test_wait_takes_a_pid_and_shows_a_signal_as_128_plus_n(box: tuple[Path, dict[str, str]]) -> None:
    spawn_id = detach(box, "kill -KILL $$")
    pids = cli(box, "ps", "-a", "--format", "{{.SpawnId}} {{.Pid}}", "hb").stdout.split("\n")
    pid = next(line.split()[1] for line in pids if line.startswith(spawn_id + " "))
    done = cli(box, "wait", "hb", pid)
    assert (done.returncode, done.stdout) == (137, "137\n"), done.stderr


def test_wait_of_an_unknown_process_is_a_clear_error(box: tuple[Path, dict[str, str]]) -> None:
    for ident in ("p000000000000", "999999"):
        r = cli(box, "wait", "hb", ident)
        assert r.returncode == 125 and "hint:" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_wait_for_a_sandbox_returns_once_it_stops(box: tuple[Path, dict[str, str]]) -> None:
    ws, env = box
    made = run_cli(["create", "hb-stop", "-w", str(ws)], cwd=ws, env=env)
    assert made.returncode == 0, made.stderr
    # the control: alive, so wait times out
    assert cli(box, "wait", "--timeout", "0.3", "hb-stop").returncode == 124
    waiter = subprocess.Popen(
        [*WARREN, "wait", "hb-stop"],
        cwd=ws,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert cli(box, "stop", "hb-stop").returncode == 0
        out, err = waiter.communicate(timeout=30)
    finally:
        waiter.kill()
    assert (waiter.returncode, out) == (0, "stopped\n"), err
    cli(box, "rm", "hb-stop")


# --- ps -a: the exit status of what exec -d started ----------------------------------------


def test_ps_all_shows_ended_background_processes_with_their_exit_status(
    box: tuple[Path, dict[str, str]],
) -> None:
    ended = detach(box, "exit 3")
    assert cli(box, "wait", "hb", ended).returncode == 3
    running = detach(box, "sleep 600")
    plain = cli(box, "ps", "--json", "hb")
    assert plain.returncode == 0, plain.stderr
    spawns = {row["spawn_id"]: row for row in json.loads(plain.stdout) if row["spawn_id"]}
    # the control: without -a, only what runs
    assert running in spawns and ended not in spawns
    rows = {row["spawn_id"]: row for row in json.loads(cli(box, "ps", "-a", "--json", "hb").stdout)}
    assert rows[ended]["exit_code"] == 3 and rows[ended]["state"] == "exited"
    assert rows[ended]["argv"] == ["sh", "-c", "exit 3"]
    assert rows[running]["exit_code"] is None
    table = cli(box, "ps", "-a", "hb").stdout.splitlines()
    assert table[0].split() == ["PID", "PPID", "S", "SPAWN", "EXIT", "COMMAND"]
    assert any(line.split()[3:5] == [ended, "3"] for line in table[1:]), table
    cli(box, "exec", "hb", "pkill", "-f", "sleep 600")


# --- run --json ---------------------------------------------------------------------------


def test_run_json_is_one_document_with_the_command_status(box: tuple[Path, dict[str, str]]) -> None:
    r = cli(box, "run", "--json", "--", "sh", "-c", "echo out; printf '\\377' >&2; exit 4")
    assert r.returncode == 4, r.stderr
    doc = json.loads(r.stdout)  # the whole of stdout: one document
    assert (doc["exit_code"], doc["stdout"], doc["stdout_encoding"]) == (4, "out\n", "utf-8")
    assert (doc["stderr"], doc["stderr_encoding"]) == ("/w==", "base64")  # not UTF-8: as the HTTP API says it
    assert doc["timed_out"] is False and isinstance(doc["duration"], float)
    slow = cli(box, "run", "--json", "--timeout", "0.5", "--", "sleep", "30")
    assert slow.returncode == 124 and json.loads(slow.stdout)["timed_out"] is True
    bad = cli(box, "run", "--json", "--memory", "lots", "--", "true")
    assert bad.returncode == 125 and bad.stdout == "" and "hint:" in bad.stderr


# --- port: list and close forwards ---------------------------------------------------------

LISTEN = (
    "import socket\n"
    "s = socket.socket(); s.bind(('127.0.0.1', 8765)); s.listen(8)\n"
    "while True:\n"
    "    c, _ = s.accept(); c.sendall(b'hi'); c.close()\n"
)


def _greeting(address: str) -> bytes | None:
    """What the sandbox's server says through ``address`` on the host; None when the
    host port takes no connection."""
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=5) as conn:
            return conn.recv(16)
    except OSError:
        return None


def test_port_lists_forwards_and_close_stops_new_connections(box: tuple[Path, dict[str, str]]) -> None:
    detach(box, f'exec python3 -c "{LISTEN}"')
    forwarded = cli(box, "port", "hb", "8765")
    assert forwarded.returncode == 0, forwarded.stderr
    address = forwarded.stdout.strip()
    deadline = time.monotonic() + 10
    while (said := _greeting(address)) != b"hi" and time.monotonic() < deadline:
        time.sleep(0.05)  # the server inside may still be starting
    assert said == b"hi"  # the control: forwarded, the host reaches it
    table = cli(box, "port", "hb").stdout.splitlines()
    assert table[0].split() == ["PORT", "HOST", "ADDRESS"] and table[1].split() == ["8765", address], table
    assert cli(box, "port", "-q", "hb").stdout == "8765\n"
    assert json.loads(cli(box, "port", "--format", "json", "hb").stdout) == [
        {"port": 8765, "address": address}
    ]
    closed = cli(box, "port", "--close", "hb", "8765")
    assert closed.returncode == 0, closed.stderr
    assert _greeting(address) is None  # judged on the host: nothing listens there any more
    assert cli(box, "port", "-q", "hb").stdout == ""
    again = cli(box, "port", "--close", "hb", "8765")
    assert again.returncode == 125 and "not forwarded" in again.stderr and "hint:" in again.stderr
    # forwarded again, it works again (the sandbox's server was never touched)
    address = cli(box, "port", "hb", "8765").stdout.strip()
    assert _greeting(address) == b"hi"
    cli(box, "port", "--close", "hb", "8765")


# --- headers and formats on every table ----------------------------------------------------


def test_image_ls_has_a_header_and_takes_quiet_and_formats(tmp_path: Path) -> None:
    from images_util import docker_archive, entry, layer_tar

    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "XDG_STATE_HOME": str(tmp_path / "state")}

    def image(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(["image", *args], cwd=tmp_path, env=env)

    empty = image("ls")
    assert empty.returncode == 0 and empty.stdout.split() == [
        "NAME",
        "ID",
        "LAYERS",
        "SIZE",
        "ADDED",
        "SOURCE",
    ]
    assert "warren image import" in empty.stderr  # the way to make one, not on stdout
    archive = docker_archive(tmp_path / "tiny.tar", [layer_tar([entry("etc/hello", data=b"hi\n")])])
    assert image("import", "tiny", str(archive)).returncode == 0
    table = image("ls").stdout.splitlines()
    assert table[0].split()[:3] == ["NAME", "ID", "LAYERS"] and table[1].split()[0] == "tiny", table
    assert image("ls", "-q").stdout == "tiny\n"
    assert image("ls", "--format", "{{.Name}} {{.Source}}").stdout.startswith("tiny ")
    assert [i["name"] for i in json.loads(image("ls", "--format", "json").stdout)] == ["tiny"]
    assert [i["name"] for i in json.loads(image("ls", "--json").stdout)] == ["tiny"]  # the older flag


def test_snapshot_ls_has_a_header_and_takes_quiet_and_formats(box: tuple[Path, dict[str, str]]) -> None:
    from warren.cli import listing, snapshots

    empty = cli(box, "snapshot", "ls")
    assert empty.returncode == 0 and empty.stdout.split() == [c.title for c in snapshots.COLUMNS]
    assert cli(box, "snapshot", "ls", "-q").stdout == ""
    assert json.loads(cli(box, "snapshot", "ls", "--format", "json").stdout) == []
    # a row as the listing gets it (a snapshot needs a sandbox on an image: test_snapshot_restack)
    row = {
        "id": "s1",
        "sandbox": "hb",
        "image": "deb",
        "size": 2048,
        "created": 0.0,
        "saved": False,
        "workspace": "included",
    }
    ns = argparse.Namespace(quiet=False, json=False, format=None)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        listing.emit(ns, [row], snapshots.COLUMNS, "id")
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["ID", "SANDBOX", "IMAGE", "SIZE", "CREATED", "STATE", "WORKSPACE"]
    assert lines[1].split()[:4] == ["s1", "hb", "deb", "2K"] and "saving" in lines[1], lines


def test_a_table_cell_cannot_drive_the_terminal() -> None:
    from warren.cli import listing

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        listing.print_table([{"c": "a\x1b]0;owned\x07\nb"}], [listing.Column("C", lambda r: r["c"])])
    assert "\x1b" not in out.getvalue() and out.getvalue().count("\n") == 2
    assert "\\x1b]0;owned\\x07\\nb" in out.getvalue()


# --- completion of the caller's names, images, presets, profiles ---------------------------


def _complete(box: tuple[Path, dict[str, str]], words: list[str], **extra: str) -> list[str]:
    """What bash offers for the last word of ``words``, with the generated script, the
    installed ``warren`` first on PATH (the script asks it) and the module's state."""
    ws, env = box
    script = cli(box, "completion", "bash").stdout
    line = " ".join(shlex.quote(w) for w in words)
    ask = f"COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _warren"
    program = f"{script}\n{ask}\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n"
    path = f"{Path(WARREN[0]).parent}:{os.environ['PATH']}" if len(WARREN) == 1 else os.environ["PATH"]
    r = subprocess.run(
        ["bash", "--norc", "-c", program],
        cwd=ws,
        env={**os.environ, **env, **extra, "PATH": path},
        capture_output=True,
        text=True,
        check=True,
    )
    return r.stdout.split()


@pytest.mark.skipif(len(WARREN) != 1, reason="the scripts call the installed `warren` command, absent here")
def test_completion_offers_sandbox_names_images_presets_and_profiles(
    box: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    assert _complete(box, ["warren", "exec", "h"]) == ["hb"]
    assert "hb" in _complete(box, ["warren", "rm", "-f", "x", ""])  # rm takes several names
    # after NAME comes the command: files, not sandboxes (the control for the names above)
    (box[0] / "hbfile").write_text("")
    assert _complete(box, ["warren", "exec", "hb", "hb"]) == ["hbfile"]
    assert _complete(box, ["warren", "run", "--preset", "pyth"]) == ["python"]
    assert _complete(box, ["warren", "image", "ins"]) == ["inspect"]
    data = tmp_path / "data"
    assert _complete(box, ["warren", "image", "rm", ""], XDG_DATA_HOME=str(data)) == []
    from images_util import docker_archive, entry, layer_tar

    archive = docker_archive(tmp_path / "tiny.tar", [layer_tar([entry("etc/hello", data=b"hi\n")])])
    made = run_cli(["image", "import", "tiny", str(archive)], cwd=tmp_path, env={"XDG_DATA_HOME": str(data)})
    assert made.returncode == 0, made.stderr
    assert _complete(box, ["warren", "image", "rm", ""], XDG_DATA_HOME=str(data)) == ["tiny"]
    assert _complete(box, ["warren", "create", "--image", "t"], XDG_DATA_HOME=str(data)) == ["tiny"]
    (box[0] / "warren.toml").write_text("[profile.ci]\nmemory = '1G'\n[profile.dev]\n")
    try:
        assert _complete(box, ["warren", "run", "--profile", ""]) == ["ci", "dev"]
    finally:
        (box[0] / "warren.toml").unlink()


def test_completion_values_start_no_supervisor(tmp_path: Path) -> None:
    from warren import statedir

    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    for kind in ("names", "snapshots"):
        r = run_cli(["completion", "--values", kind], cwd=tmp_path, env=env)
        assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    assert statedir.read_address(statedir.location(env)) is None
    # the control: with a supervisor running, the same call names the sandbox
    ws = tmp_path / "ws"
    ws.mkdir()
    assert run_cli(["create", "cv", "-w", str(ws)], cwd=tmp_path, env=env).returncode == 0
    try:
        assert run_cli(["completion", "--values", "names"], cwd=tmp_path, env=env).stdout == "cv\n"
    finally:
        run_cli(["rm", "-f", "cv"], cwd=tmp_path, env=env)
        run_cli(["shutdown"], cwd=tmp_path, env=env)


# --- nothing lingers: create, rm, shutdown in a loop -----------------------------------------


def _descendants(root: int) -> set[int]:
    """``root`` and every process below it now, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo.extend(children.get(pid, []))
    return found


def test_no_warren_process_remains_after_rm_and_shutdown_in_a_loop(tmp_path: Path) -> None:
    """A supervisor once stayed half an hour after ``rm`` of everything and ``shutdown``.
    Each round starts what a day's use does (a sandbox, a background process, a forwarded
    port, so the network helper), takes pidfds of the supervisor and every process below
    it, then ``rm -f --all`` and ``shutdown``: each of them must end."""
    import select

    from warren import statedir

    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    ws = tmp_path / "ws"
    ws.mkdir()
    for round_ in range(3):
        assert run_cli(["create", f"loop{round_}", "-w", str(ws)], cwd=ws, env=env).returncode == 0
        assert run_cli(["exec", "-d", f"loop{round_}", "sleep", "600"], cwd=ws, env=env).returncode == 0
        assert run_cli(["port", f"loop{round_}", "9"], cwd=ws, env=env).returncode == 0
        found = statedir.read_address(statedir.location(env))
        assert found is not None
        pids = _descendants(found[1])
        assert len(pids) >= 3, pids  # the control: the supervisor, the sandbox's PID 1, its helpers
        fds = {}
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):  # a short-lived helper, gone already
                fds[pid] = os.pidfd_open(pid)
        try:
            assert run_cli(["rm", "-f", "--all"], cwd=ws, env=env).returncode == 0
            assert run_cli(["shutdown"], cwd=ws, env=env).returncode == 0
            deadline = time.monotonic() + 15
            left = dict(fds)
            while left and time.monotonic() < deadline:
                ready, _, _ = select.select(
                    list(left.values()), [], [], max(0.0, deadline - time.monotonic())
                )
                left = {pid: fd for pid, fd in left.items() if fd not in ready}
            assert not left, f"round {round_}: still running after rm and shutdown: " + ", ".join(
                f"{pid} {Path(f'/proc/{pid}/cmdline').read_bytes()[:120]!r}" for pid in left
            )
        finally:
            for fd in fds.values():
                os.close(fd)


def test_a_spawn_listing_is_bounded(tmp_path: Path) -> None:
    """However many background processes a sandbox started, and however long their
    command lines, one listing is the newest LISTED_MAX, each line cut: it fits a reply."""
    from warren.server import spawns

    root = str(tmp_path)
    for i in range(spawns.LISTED_MAX + 2):
        _, fds = spawns.create(root, "many")
        meta = {"pid": i + 2, "argv": ["sh", "-c", "x" * (10_000 if i == 0 else 3)], "started": float(i)}
        os.write(fds[3], json.dumps(meta).encode())
        for fd in fds:
            os.close(fd)
    listed = spawns.listing(root, "many", alive=True).items
    assert len(listed) == spawns.LISTED_MAX and listed[-1].pid == spawns.LISTED_MAX + 3
    assert listed[0].pid == 4  # the two oldest left out, the long one among them
    first = spawns.listing(root, "many", alive=True)
    assert len(first.encode()) < 1 << 20
    long_one = spawns._cut(["sh", "-c", "x" * 10_000])
    assert sum(map(len, long_one)) <= spawns.LISTED_ARGV + 3 and long_one[-1].endswith("...")
