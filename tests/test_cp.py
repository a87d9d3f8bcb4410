"""`warren cp` attacked by the sandbox it copies from or into, judged on the host.

The sandbox plants links where the host end of the copy goes (the destination out of
it, the source into it), or swaps entries for links while the copy runs, offers huge,
endless and odd files and names. Each attack has a control: the same planted state
or the same swapping loop, met by what a host tool (coreutils ``cp``, or an
open-by-path like the code before) does, is seen reaching the host file — so the
judge (a host file unchanged, a marker not created, a token not copied) can see the
attack succeed. Fidelity: plain copies, odd names and links the caller cannot change
still work as ``cp`` would.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import Layout, module_state, run_cli
from warren.client.sandbox import Sandbox
from warren.policy import PolicySpec


@pytest.fixture(scope="module", autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One private supervisor for the module's tests, as a user's serves all of theirs."""
    yield from module_state(tmp_path_factory)


def cp(ws: Path, *args: str) -> tuple[int, str]:
    r = run_cli(["cp", *args], cwd=ws, timeout=120)
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, r.stderr


def _box(layout: Layout, name: str, **extra: object) -> Sandbox:
    return Sandbox.create(PolicySpec(workspace=str(layout.workspace), **extra), name=name)  # type: ignore[arg-type]


def test_cp_out_refuses_destinations_the_sandbox_made_links_to_host_directories(
    layout: Layout, tmp_path: Path
) -> None:
    ws, victim = layout.workspace, tmp_path / "victim"
    victim.mkdir()
    with _box(layout, "plant") as sb:
        script = f"echo payload > p && ln -s {victim} out && mkdir real && ln -s {victim} real/sub"
        assert sb.exec(["sh", "-c", script]).exit_code == 0
        for dest in ("out", "out/", "out/x", "real/sub/", "real/sub/y", f"{ws}/out/z"):
            code, err = cp(ws, "plant:p", dest)
            assert code == 125 and "symbolic link" in err and "does not follow" in err, (dest, err)
            assert os.listdir(victim) == [], dest
        # A link the sandbox made inside a tree copied out is skipped, not recreated.
        assert sb.exec(["sh", "-c", f"mkdir -p t && echo a > t/a && ln -s {victim} t/l"]).exit_code == 0
        code, err = cp(ws, "-r", "plant:t", str(tmp_path / "t-copy"))
        assert code == 0 and "skipped" in err
        assert sorted(os.listdir(tmp_path / "t-copy")) == ["a"]
    # Control: coreutils cp into the same planted destination writes into the victim.
    subprocess.run(["cp", str(ws / "p"), str(ws / "out")], check=True)
    assert os.listdir(victim) == ["p"]


def _swapper(victim: Path) -> list[str]:
    """A sandboxed loop that keeps replacing dst/d (a directory the copy makes) with a
    link to ``victim``, and removes it again so the copy makes it anew."""
    code = f"""
import os, time
end = time.monotonic() + 60
while time.monotonic() < end:
    for step in (lambda: os.rename('dst/d', 'dst/d.aside.%d' % time.monotonic_ns()),
                 lambda: os.symlink({str(victim)!r}, 'dst/d'),
                 lambda: time.sleep(0.0002),
                 lambda: os.unlink('dst/d')):
        try:
            step()
        except OSError:
            pass
"""
    return ["python3", "-c", code]


def test_cp_out_never_writes_through_an_entry_swapped_for_a_link_while_it_copies(
    layout: Layout, tmp_path: Path
) -> None:
    ws, victim = layout.workspace, tmp_path / "victim"
    victim.mkdir()
    with _box(layout, "swap") as sb:
        files = " ".join(f"src/d/f{i}" for i in range(40))
        assert sb.exec(["sh", "-c", f"mkdir -p src/d dst && touch {files}"]).exit_code == 0
        swapper = sb.spawn(_swapper(victim))
        outcomes = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(outcomes) < 10:
            code, _err = cp(ws, "-r", "swap:src/d", f"{ws}/dst/")
            outcomes.append(code)
        assert os.listdir(victim) == [], outcomes
        assert set(outcomes) <= {0, 125}
        # Control: writing by path (what cp did before) against the same loop lands in the victim.
        hit = False
        deadline = time.monotonic() + 20
        while not hit and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                os.makedirs(ws / "dst" / "d", exist_ok=True)
                for i in range(40):
                    with open(os.path.join(ws, "dst", "d", f"f{i}"), "w") as f:
                        f.write("x")
            hit = bool(os.listdir(victim))
        swapper.kill()
        assert hit, "the swapping loop never took effect: the test could not see the attack"


def test_cp_in_never_reads_a_host_file_through_a_link_the_sandbox_planted_or_swapped(
    layout: Layout, tmp_path: Path
) -> None:
    ws = layout.workspace
    secret = tmp_path / "secret"
    secret.mkdir()
    token = "TOKEN-" + os.urandom(8).hex()
    (secret / "key").write_text(token)
    with _box(layout, "exfil", deny=[str(secret)]) as sb:
        assert sb.exec(["cat", str(secret / "key")]).exit_code != 0  # it cannot read it itself
        assert (
            sb.exec(
                ["sh", "-c", f"ln -s {secret}/key leak && mkdir -p src && ln -s {secret}/key src/l"]
            ).exit_code
            == 0
        )
        code, err = cp(ws, "leak", "exfil:got")
        assert code == 125 and "symbolic link" in err
        code, err = cp(ws, f"{ws}/src", "exfil:in1")
        assert code == 125 and "is a directory" in err
        code, err = cp(ws, "-r", "src", "exfil:in1")
        assert code == 0 and "skipped" in err
        # Swapped while copying: src/f turns between a file and a link to the secret.
        swap = f"""
import os, time
end = time.monotonic() + 60
while time.monotonic() < end:
    for step in (lambda: os.symlink({str(secret / "key")!r}, 'src/f.l'),
                 lambda: os.rename('src/f.l', 'src/f'),
                 lambda: open('src/f.n', 'w').write('plain'),
                 lambda: os.rename('src/f.n', 'src/f')):
        try:
            step()
        except OSError:
            pass
"""
        swapper = sb.spawn(["python3", "-c", swap])
        deadline = time.monotonic() + 15
        runs = 0
        while time.monotonic() < deadline and runs < 8:
            cp(ws, "-r", "src", f"exfil:in-{runs}")
            cp(ws, "src/f", f"exfil:one-{runs}")
            runs += 1
        leaked = subprocess.run(["grep", "-rl", token, str(ws)], capture_output=True, text=True).stdout
        assert leaked == "", leaked
        # Control: reading by path (what cp did before) against the same loop reads the secret.
        seen = False
        deadline = time.monotonic() + 20
        while not seen and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                seen = token in (ws / "src" / "f").read_text()
        swapper.kill()
        assert seen, "the swapping loop never took effect: the test could not see the attack"


def test_cp_in_does_not_write_through_a_link_at_the_sandbox_destination(
    layout: Layout, tmp_path: Path
) -> None:
    ws = layout.workspace
    (tmp_path / "new.txt").write_text("from the host\n")
    victim = Path.home() / f".warren-cp-victim-{os.getpid()}"  # visible (read-only) inside
    victim.write_text("keep me\n")
    try:
        with _box(layout, "dstlink") as sb:
            assert sb.exec(["ln", "-s", str(victim), "dst"]).exit_code == 0
            code, err = cp(ws, str(tmp_path / "new.txt"), "dstlink:dst")
            assert code != 0 and ("Permission denied" in err or "Read-only" in err), err
            assert victim.read_text() == "keep me\n"
        # Control: the link does lead to the host file (coreutils cp writes through it).
        subprocess.run(["cp", str(tmp_path / "new.txt"), str(ws / "dst")], check=True)
        assert victim.read_text() == "from the host\n"
    finally:
        victim.unlink()


def test_cp_refuses_huge_and_endless_files_without_leaving_anything(layout: Layout, tmp_path: Path) -> None:
    ws, out = layout.workspace, tmp_path / "out"
    out.mkdir()
    with _box(layout, "big") as sb:
        script = "truncate -s 300M big && mkfifo fifo && (sleep 100 > fifo &) && echo ok > small"
        assert sb.exec(["sh", "-c", script]).exit_code == 0
        for src, says in (
            ("big", "more than the limit"),
            ("fifo", "not a file"),
            ("/dev/zero", "not a file"),
        ):
            start = time.monotonic()
            code, err = cp(ws, f"big:{src}", f"{out}/")
            assert code != 0 and says in err, (src, err)
            assert time.monotonic() - start < 30 and os.listdir(out) == [], src
        assert cp(ws, "big:small", f"{out}/")[0] == 0  # control: the route copies what it may
        assert (out / "small").read_text() == "ok\n"
        # Into the sandbox: a huge host file, a FIFO nobody writes, a device.
        host = tmp_path / "host"
        host.mkdir()
        with open(host / "huge", "wb") as f:
            f.truncate(300 * 1024 * 1024)
        os.mkfifo(host / "fifo")
        for src, says in (
            (host / "huge", "larger than"),
            (host / "fifo", "not a regular file"),
            (Path("/dev/zero"), ""),
        ):
            start = time.monotonic()
            code, err = cp(ws, str(src), "big:in/")
            assert code == 125 and says in err, (src, err)
            assert time.monotonic() - start < 30
        assert not (ws / "in").exists()


ODD = ["with space", "new\nline", "-dash", "ünï", "x" * 255, "...", ".hidden", "tab\there"]
NOT_UTF8 = os.fsdecode(b"bad\xff\xfebytes")


def test_cp_round_trips_odd_names_both_ways(layout: Layout, tmp_path: Path) -> None:
    ws = layout.workspace
    src = tmp_path / "odd"
    (src / "sub dir").mkdir(parents=True)
    for i, name in enumerate(ODD):
        (src / name).write_bytes(f"{i}\n".encode())
        (src / "sub dir" / name).write_bytes(b"deep")
    (src / NOT_UTF8).write_bytes(b"cannot be named in a message")
    with _box(layout, "odd") as sb:
        code, err = cp(ws, "-r", str(src), "odd:in/")
        assert code == 0 and "is not UTF-8" in err, err
        assert sorted(os.listdir(ws / "in" / "odd")) == sorted([*ODD, "sub dir"])
        # A name the sandbox made that is not UTF-8 is left out of listings, not a failure.
        (ws / "in" / "odd" / NOT_UTF8).write_bytes(b"x")
        assert NOT_UTF8 not in [e.name for e in sb.files.list("in/odd")]
        assert cp(ws, "-r", "odd:in/odd", str(tmp_path / "back"))[0] == 0
    assert sorted(os.listdir(tmp_path / "back")) == sorted([*ODD, "sub dir"])
    for i, name in enumerate(ODD):
        assert (tmp_path / "back" / name).read_bytes() == f"{i}\n".encode(), repr(name)
        assert (tmp_path / "back" / "sub dir" / name).read_bytes() == b"deep"


def test_cp_replaces_host_files_whole_and_keeps_their_mode(layout: Layout, tmp_path: Path) -> None:
    ws = layout.workspace
    dest = tmp_path / "kept.txt"
    dest.write_text("old")
    dest.chmod(0o600)
    linked = tmp_path / "other-name.txt"
    os.link(dest, linked)
    with _box(layout, "whole") as sb:
        sb.files.write("new.txt", "new")
        assert cp(ws, "whole:new.txt", str(dest))[0] == 0
    assert dest.read_text() == "new" and dest.stat().st_mode & 0o777 == 0o600
    assert linked.read_text() == "old"  # a new file took its name: no write through another link
    assert [n for n in os.listdir(tmp_path) if ".warren-" in n] == []


def test_cp_follows_a_system_link_only_the_caller_cannot_change(layout: Layout) -> None:
    ws = layout.workspace
    name = f"warren-cp-{os.getpid()}"
    with _box(layout, "syslink") as sb:
        sb.files.write("p", "payload")
        code, err = cp(ws, "syslink:p", f"/var/lock/{name}")  # /var/lock -> /run/lock, in root's /var
        try:
            if os.geteuid() == 0:  # root could change /var: no link is followed for root
                assert code == 125 and "/var/lock is a symbolic link" in err, err
                assert not Path(f"/run/lock/{name}").exists()
            else:
                assert code == 0, err
                assert Path(f"/run/lock/{name}").read_text() == "payload"
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"/run/lock/{name}")
