"""Reading image archives: docker-archive and OCI image layout, as a directory or a tar.

Owns finding an image's config, manifest and layer blobs in what ``docker save`` /
``podman save`` / ``skopeo copy`` wrote, and checking every digest it can before the
store names anything: a JSON blob is read whole (bounded) and hashed; a layer's blob
digest and diff id are compared by the store after unpacking (``unpack`` hashes while
it reads). Names inside an archive are looked up, never extracted: the outer tar is
read member by member, a directory only beneath its own descriptor (``safepath``).

Also ``tar_of_dir``: a root directory of the caller's as a tar stream, so a root made
elsewhere (``ImageStore.import_root``) passes the same unpacker as any archive.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import platform
import stat
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from .._core import safepath
from ..errors import ImageError
from .store import LayerSource, hex_of, stat_named
from .unpack import HINT, clean_name

_JSON_LIMIT = 8 << 20
_LAYER_TYPES = (
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
)
_INDEX_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)


def _bad(message: str, path: str = "") -> ImageError:
    return ImageError(message, operation="image import", path=path or None, hint=HINT)


class _Source:
    """Files of an archive by their relative name."""

    def open(self, rel: str) -> IO[bytes]:
        raise NotImplementedError

    def has(self, rel: str) -> bool:
        raise NotImplementedError

    def size(self, rel: str) -> int | None:
        return None

    def close(self) -> None:
        pass

    def read(self, rel: str, digest: str | None = None) -> bytes:
        """A small file whole, checked against ``digest`` when one is given."""
        with self.open(rel) as f:
            data = f.read(_JSON_LIMIT + 1)
        if len(data) > _JSON_LIMIT:
            raise _bad(f"{rel} in the archive is larger than {_JSON_LIMIT} bytes", rel)
        if digest is not None and "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise _bad(f"{rel} in the archive does not match its digest {digest}", rel)
        return data

    def json(self, rel: str, digest: str | None = None) -> Any:
        return _parse(self.read(rel, digest), rel)


class _DirSource(_Source):
    def __init__(self, path: Path) -> None:
        self.fd = safepath.open_dir(str(path))

    def _open(self, rel: str) -> int:
        try:
            fd = safepath.open_beneath(self.fd, clean_name(rel), os.O_RDONLY)
        except OSError as e:
            raise ImageError.from_os(
                e, f"cannot read {rel} in the image directory", "image import", rel, hint=HINT
            ) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise _bad(f"{rel} in the image directory is not a regular file", rel)
        return fd

    def open(self, rel: str) -> IO[bytes]:
        return os.fdopen(self._open(rel), "rb")

    def has(self, rel: str) -> bool:
        try:
            return safepath.lstat_beneath(self.fd, clean_name(rel)) is not None
        except OSError:
            return False

    def size(self, rel: str) -> int | None:
        fd = self._open(rel)
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def close(self) -> None:
        os.close(self.fd)


class _TarSource(_Source):
    def __init__(self, path: Path) -> None:
        try:
            self.tar = tarfile.open(path, "r:*")  # noqa: SIM115 - open for the archive's lifetime (close)
            self.members = {clean_name(m.name): m for m in self.tar.getmembers() if m.isreg()}
        except (tarfile.TarError, EOFError) as e:
            raise ImageError(
                f"{path} is not a tar archive ({str(e).splitlines()[0]})",
                operation="image import",
                path=str(path),
                hint="give what docker save, podman save or skopeo copy wrote (an archive or an OCI layout)",
            ) from None

    def open(self, rel: str) -> IO[bytes]:
        m = self.members.get(clean_name(rel))
        if m is None:
            raise _bad(f"the archive has no file {rel}", rel)
        f = self.tar.extractfile(m)
        assert f is not None
        return f

    def has(self, rel: str) -> bool:
        return clean_name(rel) in self.members

    def size(self, rel: str) -> int | None:
        m = self.members.get(clean_name(rel))
        return None if m is None else m.size

    def close(self) -> None:
        self.tar.close()


@dataclass
class Found:
    """An image found in an archive, ready for ``ImageStore.add``."""

    layers: list[LayerSource]
    config: dict[str, Any]
    source: str
    config_blob: bytes
    manifest: bytes | None = None


@contextlib.contextmanager
def open_archive(path: Path) -> Iterator[Found]:
    st = stat_named(path)
    try:
        # the caller named this path: a link in it is theirs (inside it, none is followed)
        real = Path(os.path.realpath(path))
        src: _Source = _DirSource(real) if stat.S_ISDIR(st.st_mode) else _TarSource(path)
    except OSError as e:
        raise ImageError.from_os(
            e, f"cannot read {path}", "image import", str(path), hint="check the path and its permissions"
        ) from None
    try:
        if src.has("oci-layout") and src.has("index.json"):
            yield _oci(src, path)
        elif src.has("manifest.json"):
            yield _docker(src, path)
        else:
            raise ImageError(
                f"{path} is neither a docker-archive (manifest.json) nor an OCI image layout (index.json)",
                operation="image import",
                path=str(path),
                hint="give what docker save, podman save or skopeo copy wrote",
            )
    finally:
        src.close()


def _parse(data: bytes, rel: str) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        raise _bad(f"{rel} in the archive is not valid JSON", rel) from None


def _digest_path(digest: object) -> str:
    return f"blobs/sha256/{hex_of(digest)}"


def _docker(src: _Source, path: Path) -> Found:
    manifest = src.json("manifest.json")
    if not isinstance(manifest, list) or not manifest or not isinstance(manifest[0], dict):
        raise _bad("manifest.json of the docker-archive names no image", "manifest.json")
    entry = manifest[0]
    cfg_name, layer_names = entry.get("Config"), entry.get("Layers")
    if not isinstance(cfg_name, str) or not isinstance(layer_names, list):
        raise _bad("manifest.json of the docker-archive lacks Config or Layers", "manifest.json")
    digest = None
    stem = cfg_name.rsplit("/", 1)[-1].removesuffix(".json")
    if len(stem) == 64:
        digest = "sha256:" + stem  # docker and podman name the config by its digest
    config_blob = src.read(cfg_name, digest)
    config = _parse(config_blob, cfg_name)
    diff_ids = _diff_ids(config, len(layer_names))
    layers = []
    for name, diff_id in zip(layer_names, diff_ids, strict=True):
        if not isinstance(name, str):
            raise _bad("manifest.json names a layer that is not a string", "manifest.json")
        if not src.has(name):
            raise _bad(f"the docker-archive lacks its layer {name}", name)
        layers.append(LayerSource(open=_opener(src, name), diff_id=diff_id, size=src.size(name)))
    return Found(layers, config, f"docker-archive {path}", config_blob, json.dumps(entry).encode())


def _diff_ids(config: Any, count: int) -> list[str]:
    rootfs = config.get("rootfs") if isinstance(config, dict) else None
    ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    if not isinstance(ids, list) or len(ids) != count:
        listed = len(ids) if isinstance(ids, list) else "no"
        raise _bad(f"the image config lists {listed} diff ids for {count} layers")
    for d in ids:
        hex_of(d)
    return ids


def _opener(src: _Source, rel: str) -> Any:
    return lambda: src.open(rel)


def _arch() -> str:
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


def _pick(index: Any, what: str) -> dict[str, Any]:
    manifests = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(manifests, list) or not manifests:
        raise _bad(f"{what} lists no manifest")
    fitting = []
    for m in manifests:
        if not isinstance(m, dict):
            continue
        plat = m.get("platform")
        if isinstance(plat, dict) and (plat.get("os"), plat.get("architecture")) != ("linux", _arch()):
            continue
        fitting.append(m)
    if not fitting:
        raise _bad(f"{what} has no image for linux/{_arch()}")
    return fitting[0]


def _oci(src: _Source, path: Path) -> Found:
    desc = _pick(src.json("index.json"), "index.json")
    for _ in range(4):  # an index may point at an index (multi-platform images)
        if desc.get("mediaType") not in _INDEX_TYPES:
            break
        desc = _pick(src.json(_digest_path(desc.get("digest")), desc.get("digest")), "the image index")
    raw = src.read(_digest_path(desc.get("digest")), desc.get("digest"))
    manifest = _parse(raw, "the image manifest")
    cdesc = manifest.get("config") if isinstance(manifest, dict) else None
    ldescs = manifest.get("layers") if isinstance(manifest, dict) else None
    if not isinstance(cdesc, dict) or not isinstance(ldescs, list):
        raise _bad("the image manifest lacks its config or layers")
    config_blob = src.read(_digest_path(cdesc.get("digest")), cdesc.get("digest"))
    config = _parse(config_blob, "the image config")
    diff_ids = _diff_ids(config, len(ldescs))
    layers = []
    for ldesc, diff_id in zip(ldescs, diff_ids, strict=True):
        if not isinstance(ldesc, dict) or ldesc.get("mediaType") not in _LAYER_TYPES:
            kind = ldesc.get("mediaType") if isinstance(ldesc, dict) else ldesc
            raise _bad(f"a layer of media type {kind!r} cannot be imported")
        rel = _digest_path(ldesc.get("digest"))
        if not src.has(rel):
            raise _bad(f"the image layout lacks the layer blob {ldesc.get('digest')}", rel)
        size = ldesc.get("size")
        layers.append(
            LayerSource(
                open=_opener(src, rel),
                diff_id=diff_id,
                digest=str(ldesc.get("digest")),
                size=size if isinstance(size, int) else None,
            )
        )
    kind = "oci-dir" if isinstance(src, _DirSource) else "oci-archive"
    return Found(layers, config, f"{kind} {path}", config_blob, raw)


class _Piped(io.RawIOBase):
    """The read end of a pipe a thread writes a tar into; raises the writer's error."""

    def __init__(self, fd: int, thread: threading.Thread, errors: list[BaseException]) -> None:
        self.f = os.fdopen(fd, "rb", buffering=0)
        self.thread = thread
        self.errors = errors

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        n = self.f.readinto(buf)
        if not n:
            self.thread.join()
            if self.errors:
                e = self.errors[0]
                raise ImageError(
                    f"cannot read the root directory: {e}",
                    operation="image import",
                    path=getattr(e, "filename", None),
                    errno=getattr(e, "errno", None),
                    hint="the caller must be able to read every file of the root",
                )
        return n or 0

    def close(self) -> None:
        if not self.closed:
            self.f.close()  # the writer gets EPIPE if it is still writing
            self.thread.join()
        super().close()


def tar_of_dir(path: Path) -> IO[bytes]:
    """The directory ``path`` as an uncompressed tar stream (links kept as links)."""
    r, w = os.pipe()
    errors: list[BaseException] = []

    def write() -> None:
        try:
            with (
                os.fdopen(w, "wb") as out,
                tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tf,
            ):
                tf.add(str(path), arcname=".", recursive=True)
        except BrokenPipeError:
            pass
        except BaseException as e:  # reported by the reader
            errors.append(e)

    thread = threading.Thread(target=write, name="warren-tar-of-dir", daemon=True)
    thread.start()
    return io.BufferedReader(_Piped(r, thread, errors), 1 << 20)
