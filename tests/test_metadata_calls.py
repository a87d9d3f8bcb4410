"""chmod and utimensat as tools call them, through the metadata broker.

glibc changes a file ``AT_SYMLINK_NOFOLLOW`` through ``/proc/self/fd/N`` of an
``O_PATH`` descriptor (``fchmodat``), and GNU tar sets a symlink's own times with
``utimensat(..., AT_SYMLINK_NOFOLLOW)``: the broker, which makes these calls for the
process, must read ``/proc/self`` (and ``/dev/fd``) as the caller's, and set a link's
times on the link. Fidelity: ``tar -x`` restores modes and times inside exactly as on
the host. Protection: a descriptor of a file outside the roots, named through
``/proc/self/fd`` or ``/dev/fd``, is still refused (judged on the host).
"""

from __future__ import annotations

import os
import subprocess
import tarfile
import textwrap
from pathlib import Path

from conftest import Layout


def _archive(where: Path) -> Path:
    src = where / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f").write_text("hi\n")
    os.chmod(src / "d" / "f", 0o640)
    os.chmod(src / "d", 0o750)
    (src / "d" / "l").symlink_to("f")
    for path in (src / "d" / "f", src / "d"):
        os.utime(path, (1_000_000, 1_000_000))
    os.utime(src / "d" / "l", (2_000_000, 2_000_000), follow_symlinks=False)
    archive = where / "a.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(src / "d", arcname="d")
    return archive


def _listing(top: Path) -> list[tuple[str, int, int]]:
    out = []
    for path in sorted(top.rglob("*")):
        st = path.lstat()
        out.append((str(path.relative_to(top)), st.st_mode, int(st.st_mtime)))
    return out


def test_gnu_tar_restores_modes_and_times_inside_as_on_the_host(layout: Layout) -> None:
    archive = _archive(layout.root)
    host = layout.root / "host-out"
    host.mkdir()
    subprocess.run(["tar", "xf", str(archive), "-C", str(host)], check=True)
    r = layout.run(["sh", "-c", f"mkdir out && tar xf {archive} -C out"])
    assert r.returncode == 0, r.stderr
    assert _listing(layout.workspace / "out") == _listing(host)


def test_nofollow_chmod_and_link_times_inside(layout: Layout) -> None:
    code = textwrap.dedent(
        """
        import os
        open("x", "w").close()
        os.symlink("x", "lnk")
        os.chmod("x", 0o600, follow_symlinks=False)
        os.utime("x", (3, 3), follow_symlinks=False)
        os.utime("lnk", (5, 5), follow_symlinks=False)
        fd = os.open("x", os.O_RDONLY)
        os.chmod(f"/dev/fd/{fd}", 0o604)
        """
    )
    r = layout.py(code)
    assert r.returncode == 0, r.stderr
    x, lnk = layout.workspace / "x", layout.workspace / "lnk"
    assert (x.stat().st_mode & 0o777, x.stat().st_mtime) == (0o604, 3)
    assert lnk.lstat().st_mtime == 5 and x.stat().st_mtime == 3


def test_a_descriptor_of_an_outside_file_named_through_proc_self_is_still_refused(layout: Layout) -> None:
    outside = layout.outside
    before = outside.stat()
    code = textwrap.dedent(
        f"""
        import os
        fd = os.open({str(outside)!r}, os.O_RDONLY)
        path = os.open({str(outside)!r}, os.O_PATH)
        for name in (f"/proc/self/fd/{{fd}}", f"/dev/fd/{{fd}}", f"/proc/thread-self/fd/{{path}}"):
            for call in (lambda: os.chmod(name, 0o666), lambda: os.utime(name, (1, 1))):
                try:
                    call()
                    print("CHANGED", name)
                except OSError as e:
                    print("refused", name, e.errno)
        """
    )
    r = layout.py(code)
    assert r.returncode == 0, r.stderr
    assert "CHANGED" not in r.stdout and r.stdout.count("refused") == 6, r.stdout
    after = outside.stat()
    assert (after.st_mode, after.st_mtime_ns) == (before.st_mode, before.st_mtime_ns)
