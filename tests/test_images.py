"""The image store: imports from archives podman made, layers in the overlay format
the kernel reads, sharing and collection, leases, and hostile archives refused with
nothing written outside the store. Runs as root and as uid 1001 (podman is rootless
for uid 1001: its storage is private to each test module)."""

from __future__ import annotations

import errno
import io
import os
import stat
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from images_util import Podman, docker_archive, entry, in_overlay, layer_tar, sha, tree
from warren.errors import ImageError, ImageInUse
from warren.images.store import ImageStore

ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def podman_images(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """A two-layer image made by podman (a base imported from a directory, one file
    added by ``podman build``), saved as docker-archive, oci-archive and oci-dir."""
    base = tmp_path_factory.mktemp("podman")
    root = base / "root"
    (root / "etc").mkdir(parents=True)
    (root / "bin").mkdir()
    (root / "etc" / "base").write_text("base\n")
    (root / "bin" / "tool").write_text("#!/bin/sh\necho tool\n")
    (root / "bin" / "tool").chmod(0o755)
    os.symlink("/etc/base", root / "etc" / "link")
    os.link(root / "etc" / "base", root / "etc" / "hard")
    ctx = base / "ctx"
    ctx.mkdir()
    (ctx / "added").write_text("added\n")
    (ctx / "Containerfile").write_text('FROM localhost/base\nCOPY added /etc/added\nCMD ["/bin/tool"]\n')
    podman = Podman(base)
    try:
        podman.import_root(root, "localhost/base")
        podman("build", "-q", "-t", "localhost/two", str(ctx))
        out = {}
        for fmt, name in (
            ("docker-archive", "two-docker.tar"),
            ("oci-archive", "two-oci.tar"),
            ("oci-dir", "two-oci"),
        ):
            podman("save", "--format", fmt, "-o", str(base / name), "localhost/two")
            out[fmt] = base / name
        podman("save", "--format", "docker-archive", "-o", str(base / "base.tar"), "localhost/base")
        out["base"] = base / "base.tar"
        out["root"] = root
        yield out
    finally:
        podman.close()


def test_podman_archives_of_every_format_import_to_the_same_image_with_shared_layers(
    podman_images: dict[str, Path], tmp_path: Path
) -> None:
    store = ImageStore(tmp_path / "store")
    refs = [
        store.import_archive(f"two-{fmt}", podman_images[fmt])
        for fmt in ("docker-archive", "oci-archive", "oci-dir")
    ]
    assert len({r.id for r in refs}) == 1 and len({r.layers for r in refs}) == 1
    ref = refs[0]
    assert len(ref.layers) == 2 and ref.config.cmd == ("/bin/tool",)
    assert dict(ref.config.env)["PATH"]
    assert sorted(p.name for p in (tmp_path / "store" / "layers").iterdir()) == sorted(
        p.name for p in ref.layers
    )
    # the kernel's view of the stacked layers is the root podman was given
    shown = in_overlay(
        ref.lowerdirs,
        "cat $M/etc/base $M/etc/added && readlink $M/etc/link && stat -c %h $M/etc/hard",
        tmp_path,
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split() == ["base", "added", "/etc/base", "2"]
    mine = tree(podman_images["root"])
    got = tree(ref.layers[0])
    assert got == mine
    if not ROOT:
        assert {p.lstat().st_uid for p in ref.layers[0].rglob("*")} == {os.getuid()}


def test_a_shared_layer_stays_until_no_image_names_it_and_no_lease_holds_it(
    podman_images: dict[str, Path], tmp_path: Path
) -> None:
    store = ImageStore(tmp_path / "store")
    two = store.import_archive("two", podman_images["docker-archive"])
    base = store.import_archive("base", podman_images["base"])
    assert base.layers == two.layers[:1]  # the base layer is kept once
    assert store.remove("two") == ["sha256:" + two.layers[1].name]
    assert two.layers[0].is_dir() and not two.layers[1].exists()
    with store.lease("base", "sandbox demo") as lease:
        assert lease.ref.layers == base.layers
        with pytest.raises(ImageInUse, match="in use by sandbox demo") as refused:
            store.remove("base")
        assert refused.value.errno == errno.EBUSY and "--force" in refused.value.hint
        assert store.resolve("base").layers == base.layers  # refused: nothing changed
        assert store.remove("base", force=True) == []  # in use: the layer stays
        assert base.layers[0].is_dir()
        with pytest.raises(ImageError, match="no image named 'base'") as e:
            store.resolve("base")
        assert "warren image ls" in e.value.hint
    assert store.gc() == ["sha256:" + base.layers[0].name]
    assert not base.layers[0].exists()
    assert [p.name for p in (tmp_path / "store" / "layers").iterdir()] == []


def _opaque(path: Path) -> bytes | None:
    try:
        return os.getxattr(path, "user.overlay.opaque", follow_symlinks=False)
    except OSError:
        return None


def test_whiteouts_and_opaque_directories_hide_lower_files_in_a_real_overlay(tmp_path: Path) -> None:
    lower = layer_tar(
        [
            entry("etc", tarfile.DIRTYPE),
            entry("etc/gone", data=b"gone\n"),
            entry("etc/kept", data=b"kept\n"),
            entry("opt", tarfile.DIRTYPE),
            entry("opt/old", data=b"old\n"),
        ]
    )
    upper = layer_tar(
        [
            entry("etc/.wh.gone"),
            entry("opt", tarfile.DIRTYPE),
            entry("opt/.wh..wh..opq"),
            entry("opt/new", data=b"new\n"),
        ]
    )
    store = ImageStore(tmp_path / "store")
    ref = store.import_archive("wh", docker_archive(tmp_path / "wh.tar", [lower, upper]))
    top = ref.layers[1]
    st = (top / "etc" / "gone").lstat()
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(0, 0)
    assert _opaque(top / "opt") == b"y"
    assert not (top / "etc" / ".wh.gone").exists() and not (top / "opt" / ".wh..wh..opq").exists()
    shown = in_overlay(ref.lowerdirs, "ls $M/etc $M/opt", tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split() == [f"{tmp_path}/mnt/etc:", "kept", f"{tmp_path}/mnt/opt:", "new"]
    # control: the lower layer alone still shows what the upper one hides
    shown = in_overlay(ref.layers[:1], "ls $M/etc $M/opt", tmp_path)
    assert "gone" in shown.stdout.split() and "old" in shown.stdout.split(), shown.stderr


def test_a_whiteout_of_dot_or_dotdot_removes_nothing(tmp_path: Path) -> None:
    """``.wh..`` names the parent of its directory and ``.wh.`` the directory itself: a
    naive unpacker removes (and hides) those. Judged on the host: the layer's own files
    and the store's other layer stay, and the only whiteout made is the control's, of a
    real name beside them."""
    lower = layer_tar([entry("a", tarfile.DIRTYPE), entry("a/f", data=b"f\n"), entry("g", data=b"g\n")])
    upper = layer_tar(
        [
            entry("a", tarfile.DIRTYPE),
            entry("a/.wh.."),
            entry("a/.wh."),
            entry(".wh.."),
            entry("a/kept", data=b"kept\n"),
            entry("a/.wh.f"),  # the control: a real name is whited out
        ]
    )
    store = ImageStore(tmp_path / "store")
    ref = store.import_archive("dots", docker_archive(tmp_path / "dots.tar", [lower, upper]))
    low, top = ref.layers
    assert (low / "a" / "f").read_text() == "f\n" and (low / "g").read_text() == "g\n"
    assert sorted(os.listdir(top)) == ["a"] and sorted(os.listdir(top / "a")) == ["f", "kept"]
    assert stat.S_ISCHR((top / "a" / "f").lstat().st_mode) and (top / "a" / "kept").read_text() == "kept\n"
    assert sorted(os.listdir(tmp_path)) == ["dots.tar", "store"]


def test_setuid_bits_are_kept_only_for_root_and_owners_for_no_one(tmp_path: Path) -> None:
    """A sandbox maps one id to the caller: a file of any other owner would be nobody's
    inside (apt's ``_apt``-owned lists unreadable to root there), so every file is the
    caller's, root's included."""
    layer = layer_tar(
        [
            entry("bin", tarfile.DIRTYPE),
            entry("bin/su", data=b"x", mode=0o4755, uid=0, gid=0),
            entry("home", tarfile.DIRTYPE, mode=0o755),
            entry("home/u", tarfile.DIRTYPE, mode=0o2750, uid=1000, gid=1000),
            entry("home/u/f", data=b"f", mode=0o600, uid=1000, gid=1000),
            entry("ro", tarfile.DIRTYPE, mode=0o555),
            entry("ro/file", data=b"r", mode=0o444),
        ]
    )
    store = ImageStore(tmp_path / "store")
    ref = store.import_archive("own", docker_archive(tmp_path / "own.tar", [layer]))
    top = ref.layers[0]
    su, home, f = (top / "bin/su").stat(), (top / "home/u").stat(), (top / "home/u/f").stat()
    if ROOT:
        assert stat.S_IMODE(su.st_mode) == 0o4755 and stat.S_IMODE(home.st_mode) == 0o2750
    else:
        assert stat.S_IMODE(su.st_mode) == 0o755 and stat.S_IMODE(home.st_mode) == 0o750
    assert {su.st_uid, f.st_uid, home.st_uid} == {os.getuid()}
    assert {f.st_gid, home.st_gid} == {os.getgid()}
    assert stat.S_IMODE((top / "ro").stat().st_mode) == 0o555
    store.remove("own")  # a 0555 directory does not stop the collection
    assert not top.exists()


# -- hostile archives ---------------------------------------------------------------------


def _hostile(outside: Path) -> dict[str, list[tuple[tarfile.TarInfo, bytes | None]]]:
    """Layers that, unpacked naively, write ``outside/marker`` (the controls prove it)."""
    up = os.path.relpath(outside, "/")
    return {
        "dotdot": [entry("../" * 40 + up + "/marker", data=b"pwned")],
        "absolute": [entry(str(outside / "marker"), data=b"pwned")],
        "symlink-dir": [
            entry("esc", tarfile.SYMTYPE, linkname=str(outside)),
            entry("esc/marker", data=b"pwned"),
        ],
        "symlink-relative": [
            entry("a", tarfile.DIRTYPE),
            entry("a/esc", tarfile.SYMTYPE, linkname="../" * 40 + up),
            entry("a/esc/marker", data=b"pwned"),
        ],
        "hardlink-out": [entry("marker", tarfile.LNKTYPE, linkname=str(outside / "target"))],
        "hardlink-dotdot": [entry("marker", tarfile.LNKTYPE, linkname="../" * 40 + up + "/target")],
    }


@pytest.fixture
def outside_dir(tmp_path: Path) -> Path:
    out = tmp_path / "outside"
    out.mkdir()
    (out / "target").write_text("host file\n")
    return out


@pytest.mark.parametrize("kind", list(_hostile(Path("/x"))))
def test_a_hostile_archive_is_refused_and_writes_nothing_outside_the_store(
    kind: str, tmp_path: Path, outside_dir: Path
) -> None:
    layer = layer_tar(_hostile(outside_dir)[kind])
    archive = docker_archive(tmp_path / f"{kind}.tar", [layer])
    store = ImageStore(tmp_path / "store")
    with pytest.raises(ImageError) as e:
        store.import_archive("evil", archive)
    assert e.value.operation == "image import" and e.value.hint
    assert sorted(p.name for p in outside_dir.iterdir()) == ["target"]
    assert (outside_dir / "target").read_text() == "host file\n"
    assert list((tmp_path / "store" / "layers").iterdir()) == []  # no half layer left
    assert "evil" not in store.names()


@pytest.mark.parametrize("kind", ["dotdot", "symlink-dir", "symlink-relative", "hardlink-out"])
def test_control_the_hostile_archives_do_escape_a_naive_extractor(
    kind: str, tmp_path: Path, outside_dir: Path
) -> None:
    """The attacks are real: Python's tarfile with no filter writes (or links) the marker."""
    dest = tmp_path / "naive"
    dest.mkdir()
    layer = tmp_path / "layer.tar"
    layer.write_bytes(layer_tar(_hostile(outside_dir)[kind]))
    script = (
        "import sys,tarfile; "
        "kw = {'filter': 'fully_trusted'} if hasattr(tarfile, 'fully_trusted_filter') else {}; "
        "tarfile.open(sys.argv[1]).extractall(sys.argv[2], **kw)"
    )
    subprocess.run([sys.executable, "-c", script, str(layer), str(dest)], capture_output=True, timeout=30)
    assert (outside_dir / "marker").exists() or (dest / "marker").stat().st_nlink == 2


def test_a_huge_file_is_refused_before_its_data_is_read(tmp_path: Path) -> None:
    info = tarfile.TarInfo("big")
    info.size = 1 << 40  # a terabyte announced, none of it in the archive
    header = info.tobuf(tarfile.PAX_FORMAT)
    archive = docker_archive(
        tmp_path / "big.tar", [header + b"\0" * 1024], diff_ids=[sha(header + b"\0" * 1024)]
    )
    store = ImageStore(tmp_path / "store")
    with pytest.raises(ImageError, match="--max-size") as e:
        store.import_archive("big", archive, max_size=1 << 30)
    assert e.value.errno == errno.EFBIG
    assert list((tmp_path / "store" / "layers").iterdir()) == []
    # control: under the limit the same kind of entry is written
    ok = docker_archive(tmp_path / "ok.tar", [layer_tar([entry("small", data=b"x" * 4096)])])
    ref = store.import_archive("ok", ok, max_size=1 << 20)
    assert (ref.layers[0] / "small").stat().st_size == 4096


def test_a_layer_that_does_not_match_its_diff_id_is_refused_and_left_nowhere(tmp_path: Path) -> None:
    layer = layer_tar([entry("f", data=b"data")])
    archive = docker_archive(tmp_path / "bad.tar", [layer], diff_ids=[sha(b"something else")])
    store = ImageStore(tmp_path / "store")
    with pytest.raises(ImageError, match="does not match its diff id"):
        store.import_archive("bad", archive)
    assert list((tmp_path / "store" / "layers").iterdir()) == []


def test_device_nodes_are_skipped_with_a_warning_and_overlay_attributes_in_an_archive_are_dropped(
    tmp_path: Path,
) -> None:
    dev = entry("null", tarfile.CHRTYPE, devmajor=1, devminor=3, mode=0o666)
    redirect = entry("d", tarfile.DIRTYPE, pax_headers={"SCHILY.xattr.user.overlay.redirect": "/etc"})
    kept = entry("f", data=b"f", pax_headers={"SCHILY.xattr.user.note": "kept"})
    setuid_hard = [entry("s", data=b"s", mode=0o4755), entry("h", tarfile.LNKTYPE, linkname="s")]
    archive = docker_archive(tmp_path / "dev.tar", [layer_tar([dev, redirect, kept, *setuid_hard])])
    store = ImageStore(tmp_path / "store")
    warnings: list[str] = []
    ref = store.import_archive("dev", archive, warn=warnings.append)
    top = ref.layers[0]
    assert not (top / "null").exists() and any("device node /null" in w for w in warnings)
    assert "user.overlay.redirect" not in os.listxattr(top / "d")
    assert os.getxattr(top / "f", "user.note") == b"kept"  # the rule drops only overlay's own
    assert (top / "h").stat().st_ino == (top / "s").stat().st_ino
    if ROOT:
        ref = store.import_archive(
            "dev2", docker_archive(tmp_path / "dev2.tar", [layer_tar([dev])]), allow_devices=True
        )
        assert (ref.layers[0] / "null").stat().st_rdev == os.makedev(1, 3)


def test_a_hard_link_to_a_later_or_missing_member_is_refused(tmp_path: Path) -> None:
    layer = layer_tar([entry("h", tarfile.LNKTYPE, linkname="later"), entry("later", data=b"x")])
    store = ImageStore(tmp_path / "store")
    with pytest.raises(ImageError, match="not an earlier entry"):
        store.import_archive("h", docker_archive(tmp_path / "h.tar", [layer]))


def test_a_crashed_import_leaves_no_layer_under_a_digest_and_gc_removes_its_remains(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "store")
    store.names()  # makes the store
    half = tmp_path / "store" / "layers" / ".tmp-0123456789abcdef"
    (half / "usr").mkdir(parents=True)
    (half / "usr").chmod(0o555)
    assert store.gc() == []
    assert not half.exists()


def test_cli_imports_lists_inspects_and_removes_images(
    podman_images: dict[str, Path], tmp_path: Path
) -> None:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "warren", "image", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )

    done = cli("import", "two", str(podman_images["oci-archive"]))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("two ")
    import json

    listed = json.loads(cli("ls", "--json").stdout)
    assert [i["name"] for i in listed] == ["two"] and len(listed[0]["layers"]) == 2
    shown = cli("inspect", "two")
    assert 'cmd: ["/bin/tool"]' in shown.stdout
    missing = cli("inspect", "nope")
    assert (
        missing.returncode == 125 and "no image named 'nope'" in missing.stderr and "hint:" in missing.stderr
    )
    assert "Traceback" not in missing.stderr
    bad = cli("import", "x", str(tmp_path))
    assert bad.returncode == 125 and "neither a docker-archive" in bad.stderr
    assert cli("rm", "two").returncode == 0
    assert json.loads(cli("ls", "--json").stdout) == []
    assert list((tmp_path / "data" / "warren" / "images" / "layers").iterdir()) == []


def test_a_lease_passed_to_another_process_holds_the_layers_until_that_process_ends(
    podman_images: dict[str, Path], tmp_path: Path
) -> None:
    store = ImageStore(tmp_path / "store")
    ref = store.import_archive("base", podman_images["base"])
    lease = store.acquire("base")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, pass_fds=lease.fds
    )
    try:
        lease.release()  # this process lets go; the holder still has the descriptors
        with pytest.raises(ImageInUse, match=f"in use by process {os.getpid()}"):
            store.remove("base")
        assert store.remove("base", force=True) == []
        assert ref.layers[0].is_dir()
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    assert store.gc() == ["sha256:" + ref.layers[0].name]  # its end released the lease


def test_a_hold_names_its_holder_until_it_is_gone_and_only_for_the_layers_removal_takes(
    podman_images: dict[str, Path], tmp_path: Path
) -> None:
    store = ImageStore(tmp_path / "store")
    two = store.import_archive("two", podman_images["docker-archive"])
    store.import_archive("base", podman_images["base"])
    snap_dir = tmp_path / "snapshots" / "abc123"
    snap_dir.mkdir(parents=True)
    store.hold_for_snapshot("abc123", str(snap_dir), "two", two.layers)
    # "base" shares the bottom layer only: its removal takes nothing the snapshot needs.
    assert store.remove("base") == []
    with pytest.raises(ImageInUse, match="in use by snapshot abc123"):
        store.remove("two")
    assert store.remove("two", force=True) == []
    assert all(p.is_dir() for p in two.layers) and store.gc() == []
    # The snapshot's directory gone (a crash between the two steps): the hold is stale.
    snap_dir.rmdir()
    assert sorted(store.gc()) == sorted("sha256:" + p.name for p in two.layers)
    assert list((tmp_path / "store" / "holds").iterdir()) == []
    # A lease's holder that exited without releasing: stale, and gc removes the record.
    ref = store.import_archive("base", podman_images["base"])
    code = (
        "import sys; from pathlib import Path; from warren.images.store import ImageStore; "
        "ImageStore(Path(sys.argv[1])).acquire('base', 'sandbox gone'); print('held')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "store")], capture_output=True, text=True
    )
    assert done.stdout == "held\n", done.stderr
    assert len(list((tmp_path / "store" / "holds").iterdir())) == 1
    assert store.holders() == []
    assert store.remove("base") == ["sha256:" + ref.layers[0].name]
    assert list((tmp_path / "store" / "holds").iterdir()) == []


def test_a_gzip_layer_is_read_and_its_diff_id_checked_on_the_uncompressed_tar(tmp_path: Path) -> None:
    import gzip

    layer = layer_tar([entry("etc", tarfile.DIRTYPE), entry("etc/z", data=b"zipped\n")])
    archive = docker_archive(tmp_path / "gz.tar", [gzip.compress(layer)], diff_ids=[sha(layer)])
    store = ImageStore(tmp_path / "store")
    ref = store.import_archive("gz", archive)
    assert ref.layers[0].name == sha(layer)[7:] and (ref.layers[0] / "etc" / "z").read_bytes() == b"zipped\n"


def test_an_oversized_tar_header_or_trailer_is_refused_before_it_is_held(tmp_path: Path) -> None:
    long_name = entry("x" * (2 << 20), data=b"x")  # written as a 2 MiB pax header
    trailer = layer_tar([entry("f", data=b"f")]) + b"\0" * (3 << 20)
    store = ImageStore(tmp_path / "store")
    cases = (("header", layer_tar([long_name]), "a tar header of"), ("trailer", trailer, "after its end"))
    for name, layer, why in cases:
        with pytest.raises(ImageError, match=why):
            store.import_archive(name, docker_archive(tmp_path / f"{name}.tar", [layer]))
    assert list((tmp_path / "store" / "layers").iterdir()) == []


@pytest.mark.parametrize(
    ("suite", "include", "mirror", "why"),
    [
        ("bookworm;touch x", [], None, "invalid Debian suite"),
        ("bookworm", ["ok", "--hook=x"], None, "invalid package name"),
        ("bookworm", [], "ftp://example/debian -x", "invalid mirror"),
    ],
)
def test_a_build_with_a_bad_suite_package_or_mirror_is_refused_before_mmdebstrap_runs(
    suite: str, include: list[str], mirror: str | None, why: str, tmp_path: Path
) -> None:
    from warren.images import build

    store = ImageStore(tmp_path / "store")
    with pytest.raises(ImageError, match=why) as e:
        build.debian(store, "deb", suite, include=include, mirror=mirror)
    assert e.value.hint and store.names() == []
    assert [p.name for p in (tmp_path / "store").iterdir() if p.name.startswith(".build-")] == []


def test_an_unusable_config_is_refused_before_any_layer_is_read(tmp_path: Path) -> None:
    from warren.images.store import LayerSource

    def never() -> io.BytesIO:
        raise AssertionError("a layer was read")

    store = ImageStore(tmp_path / "store")
    for bad in ({"config": {"Env": "PATH=/bin"}}, {"config": {"Cmd": [1]}}, {"config": {"Env": ["novalue"]}}):
        with pytest.raises(ImageError, match="config is unusable"):
            store.add("bad", [LayerSource(open=never, diff_id=None)], bad, source="test")
    assert store.names() == []
