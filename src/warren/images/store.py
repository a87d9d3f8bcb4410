"""The image store: a content-addressed directory of unpacked layers and image records.

Owns where images live, how they are named, added, resolved, leased, removed and
garbage-collected. Reading archives is ``archive``, unpacking one layer ``unpack``.

Layout (``$XDG_DATA_HOME/warren/images``, default ``~/.local/share/warren/images``,
mode 0700)::

    store.lock              flock: shared while importing or leasing, exclusive for gc
    blobs/sha256/<hex>      the JSON an image was described by (its config, manifest)
    layers/<hex>/           one unpacked layer, <hex> its diff id (sha256 of its tar):
                            shared by every image that has it, never written again
    layers/.tmp-<random>/   a layer being unpacked: renamed to its digest when complete
                            and verified, so a crash leaves no half layer under a digest
    images/<name>.json      {"name", "id": config digest, "layers": [diff ids], ...}

Everything below the root is reached from the root's descriptor (``safepath``: never
through a link). Records are replaced with ``write_atomic``.

Holds: whoever needs an image's layers beyond the image's name says so with a record
in ``holds/``, naming itself (``sandbox dev``, ``snapshot 3f9c2a1b7d04 of sandbox dev``)
and the layers it needs:

    holds/sandbox-<random>.json    a running sandbox's lease (``ImageStore.acquire``):
                                   live while someone holds a ``flock`` on it. The record
                                   is locked before it is renamed into place, and the lock
                                   belongs to the descriptors in ``Lease.fds`` (with a
                                   shared lock on each layer directory): a process that
                                   inherits them keeps the lease, the kernel drops it when
                                   the last holder exits, however it exits
    holds/snapshot-<id>.json       a snapshot (``hold_for_snapshot``): live while the
                                   snapshot's directory exists, released by ``snapshot rm``

``remove`` refuses (``ImageInUse``, naming the holders) an image whose removal would
take layers a live hold needs; ``remove(force=True)`` forgets the name, and the layers
stay until the last holder is gone. ``gc`` never removes a layer a live hold names or a
lease has locked, and removes the records of holders that are gone.

Concurrency: imports take the store lock shared (two imports run side by side; a layer
both unpack is kept once: the second rename finds the first in place); gc takes it
exclusively, so it never removes a layer an import is about to name.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from .._core import safepath
from ..errors import ImageError, ImageInUse
from . import holds, unpack
from .config import DEFAULT_PATH, ImageInfo, oci_config, parse_config
from .holds import HEX, RECORD_LIMIT, TMP, Holder
from .location import default_root
from .ref import ImageConfig, ImageRef

HINT = "warren image ls lists what is here; warren image build/import makes one"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")

Progress = Callable[[str, int, int | None], None]
"""Called as (label, bytes done, bytes in all or None) while a layer is read."""


def check_name(name: object) -> str:
    """An image name: 1-128 letters, digits, '.', '_', ':', '-', starting with a letter
    or digit (it names a file in the store)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ImageError(
            f"invalid image name {name!r}",
            operation="image",
            hint="use 1-128 letters, digits, '.', '_', ':' or '-', starting with a letter or digit",
        )
    return name


def hex_of(digest: object) -> str:
    """The hex of a "sha256:<hex>" digest; anything else is refused (it names a file)."""
    if isinstance(digest, str) and digest.startswith("sha256:") and HEX.fullmatch(digest[7:]):
        return digest[7:]
    raise ImageError(
        f"not a sha256 digest: {str(digest)[:80]!r}",
        operation="image",
        hint="only sha256 digests are supported",
    )


@dataclass
class Lease:
    """An image held in use: its layers cannot be collected while ``fds`` are open.
    Releasing closes them; the hold record goes at the next ``gc``."""

    ref: ImageRef
    fds: list[int]

    def release(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()


@dataclass
class LayerSource:
    """One layer to add: ``open`` gives its blob; ``diff_id`` is what the config says
    it must hash to (None: whatever it hashes to, for a root made here); ``digest`` is
    the blob's own digest where a manifest names it."""

    open: Callable[[], IO[bytes]]
    diff_id: str | None
    digest: str | None = None
    size: int | None = None


class ImageStore:
    """The images of one user (or of ``root``, for tests and tools)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()

    # -- paths and locks ----------------------------------------------------------------

    def _open_root(self, create: bool = True) -> int:
        try:
            if create:
                os.makedirs(self.root, mode=0o700, exist_ok=True)
            fd = safepath.open_dir(str(self.root))
            if create:
                for sub in ("blobs", "blobs/sha256", "layers", "images"):
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(sub, 0o700, dir_fd=fd)
            return fd
        except OSError as e:
            raise ImageError.from_os(
                e,
                f"cannot open the image store {self.root}",
                "image store",
                str(self.root),
                hint="check that it is a directory you own (XDG_DATA_HOME moves it)",
            ) from None

    @contextlib.contextmanager
    def _locked(self, exclusive: bool, blocking: bool = True) -> Iterator[int]:
        """The store's root descriptor, the store locked. Not ``blocking``: yields -1 at
        once when the lock is taken (``_try_locked``)."""
        root = self._open_root()
        try:
            lock = safepath.open_beneath(root, "store.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                how = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
                try:
                    fcntl.flock(lock, how if blocking else how | fcntl.LOCK_NB)
                except BlockingIOError:
                    yield -1
                    return
                yield root
            finally:
                os.close(lock)
        finally:
            os.close(root)

    # -- reading --------------------------------------------------------------------------

    def _record(self, root: int, name: str) -> dict[str, Any]:
        check_name(name)
        try:
            data = safepath.read_file(root, f"images/{name}.json", RECORD_LIMIT)
        except FileNotFoundError:
            raise ImageError(
                f"no image named {name!r}", operation="image", path=str(self.root / "images"), hint=HINT
            ) from None
        except OSError as e:
            raise ImageError.from_os(
                e, f"cannot read the record of image {name!r}", "image", hint=HINT
            ) from None
        try:
            rec = json.loads(data)
            hex_of(rec["id"])
            for d in rec["layers"]:
                hex_of(d)
        except (ValueError, KeyError, TypeError, ImageError):
            raise ImageError(
                f"the record of image {name!r} is damaged",
                operation="image",
                path=str(self.root / "images" / f"{name}.json"),
                hint=f"warren image rm {name} and import it again",
            ) from None
        if not isinstance(rec, dict):
            raise ImageError(f"the record of image {name!r} is damaged", operation="image", hint=HINT)
        return rec

    def _config(self, root: int, rec: dict[str, Any]) -> ImageConfig:
        try:
            data = safepath.read_file(root, f"blobs/sha256/{hex_of(rec['id'])}", RECORD_LIMIT)
            return parse_config(json.loads(data))
        except (OSError, ValueError) as e:
            raise ImageError(
                f"the config of image {rec.get('name')!r} is missing or damaged",
                operation="image",
                hint=f"warren image rm {rec.get('name')} and import it again",
            ) from e

    def _ref(self, root: int, name: str) -> ImageRef:
        rec = self._record(root, name)
        layers = tuple(self.root / "layers" / hex_of(d) for d in rec["layers"])
        for d in rec["layers"]:
            if safepath.lstat_beneath(root, f"layers/{hex_of(d)}") is None:
                raise ImageError(
                    f"image {name!r} lacks its layer {d[:19]}",
                    operation="image",
                    hint=f"warren image rm {name} and import it again",
                )
        return ImageRef(name=name, id=rec["id"], layers=layers, config=self._config(root, rec))

    def resolve(self, name: str) -> ImageRef:
        """The image called ``name``: its layer directories and runtime settings."""
        with self._locked(exclusive=False) as root:
            return self._ref(root, name)

    def names(self) -> list[str]:
        root = self._open_root()
        try:
            with safepath.listed(root, "images") as (_fd, present):
                found = [n[:-5] for n in present if n.endswith(".json") and not n.startswith(".")]
        finally:
            os.close(root)
        return sorted(n for n in found if _NAME.fullmatch(n))

    def inspect(self, name: str) -> ImageInfo:
        with self._locked(exclusive=False) as root:
            rec = self._record(root, name)
            return ImageInfo(
                name=name,
                id=rec["id"],
                layers=tuple(rec["layers"]),
                size=int(rec.get("size", 0)),
                created=float(rec.get("created", 0)),
                source=str(rec.get("source", "")),
                config=self._config(root, rec),
            )

    def images(self) -> list[ImageInfo]:
        out = []
        for name in self.names():
            with contextlib.suppress(ImageError):  # removed meanwhile
                out.append(self.inspect(name))
        return out

    @contextlib.contextmanager
    def lease(self, name: str, holder: str | None = None) -> Iterator[Lease]:
        """Hold image ``name`` in use (see the module docstring): its layers stay until
        the lease ends, even if the image is removed meanwhile (``force``)."""
        got = self.acquire(name, holder)
        try:
            yield got
        finally:
            got.release()

    def acquire(self, name: str, holder: str | None = None) -> Lease:
        """``lease`` without the context manager: the caller calls ``release`` (or
        passes ``fds`` to the process that keeps the image in use). ``holder`` is how
        a refused ``warren image rm`` names it."""
        with self._locked(exclusive=False) as root:
            ref = self._ref(root, name)
            return Lease(ref, self._lock_layers(root, name, ref.layers, holder))

    def acquire_layers(self, image: str, layers: Sequence[Path], holder: str | None = None) -> Lease | None:
        """Hold those of ``layers`` that are this store's (a sandbox made from a snapshot
        runs on the image's layers and the snapshot's own): None when there are none."""
        mine = tuple(p for p in layers if self._own_layer(p))
        if not mine:
            return None
        with self._locked(exclusive=False) as root:
            for p in mine:
                if safepath.lstat_beneath(root, f"layers/{p.name}") is None:
                    raise ImageError(
                        f"a layer of image {image!r} is gone from the store",
                        operation="image lease",
                        path=str(p),
                        errno=errno.ENOENT,
                        hint="the image was removed; what was made on it cannot start without it",
                    )
            ref = ImageRef(name=image, id="", layers=mine)
            return Lease(ref, self._lock_layers(root, image, mine, holder))

    def _own_layer(self, path: Path) -> bool:
        return path.parent == self.root / "layers" and bool(HEX.fullmatch(path.name))

    def _lock_layers(self, root: int, image: str, layers: Sequence[Path], holder: str | None) -> list[int]:
        fds: list[int] = []
        try:
            for layer in layers:
                fd = safepath.dir_beneath(root, f"layers/{layer.name}")
                fds.append(fd)
                fcntl.flock(fd, fcntl.LOCK_SH)
            what = holder or f"process {os.getpid()}"
            fds.append(holds.put(root, "sandbox-" + secrets.token_hex(8), what, image, layers, ""))
        except OSError as e:
            for fd in fds:
                os.close(fd)
            raise ImageError.from_os(
                e, f"cannot hold the layers of image {image!r}", "image lease", hint=HINT
            ) from None
        return fds

    def hold_for_snapshot(self, snap_id: str, snapshot_dir: str, image: str, layers: Sequence[Path]) -> None:
        """Keep this store's ``layers`` (of the image snapshot ``snap_id`` was taken on)
        for as long as ``snapshot_dir`` exists or until ``release_snapshot``."""
        mine = tuple(p for p in layers if self._own_layer(p))
        if not mine:
            return
        with self._locked(exclusive=False) as root:
            what = f"snapshot {snap_id}"
            os.close(holds.put(root, f"snapshot-{snap_id}", what, image, mine, snapshot_dir))

    def release_snapshot(self, snap_id: str) -> None:
        """Snapshot ``snap_id`` is gone: its hold goes, and the layers nothing else
        needs with it (unless the store is busy: the next gc does it then)."""
        with self._locked(exclusive=True, blocking=False) as root:
            if root < 0:
                return
            with contextlib.suppress(OSError):
                safepath.unlink(root, f"holds/snapshot-{snap_id}.json")
        self.gc(blocking=False)

    def holders(self) -> list[Holder]:
        """The live holds (stale records are skipped here, removed by ``gc``)."""
        with self._locked(exclusive=False) as root:
            return [h for h, _stale in holds.read_all(root) if not _stale]

    # -- adding ---------------------------------------------------------------------------

    def add(
        self,
        name: str,
        layers: Sequence[LayerSource],
        config: dict[str, Any],
        *,
        source: str,
        config_blob: bytes | None = None,
        manifest: bytes | None = None,
        max_size: int = unpack.DEFAULT_MAX_SIZE,
        allow_devices: bool = False,
        progress: Progress | None = None,
        warn: Callable[[str], None] | None = None,
    ) -> ImageRef:
        """Add image ``name`` (replacing one of that name) from its layer blobs and its
        OCI config: ``config_blob`` as the archive had it (its digest is the image's id),
        else ``config`` with ``rootfs.diff_ids`` filled in from the layers read. Layers
        already in the store are not read again."""
        check_name(name)
        try:
            parse_config(config)  # refuse an unusable config before reading a layer
        except ValueError as e:
            raise ImageError(
                f"the image's config is unusable: {e}", operation="image import", hint=unpack.HINT
            ) from None
        budget = unpack.Budget(max_size)
        diff_ids: list[str] = []
        size = 0
        replaced = False
        with self._locked(exclusive=False) as root:
            for i, src in enumerate(layers):
                label = f"layer {i + 1}/{len(layers)}"
                d, n = self._add_layer(root, src, budget, allow_devices, label, progress, warn)
                diff_ids.append(d)
                size += n
            if config_blob is not None and all(src.diff_id is not None for src in layers):
                blob = config_blob
            else:
                config = dict(config)
                config["rootfs"] = {"type": "layers", "diff_ids": diff_ids}
                blob = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
            image_id = "sha256:" + hashlib.sha256(blob).hexdigest()
            self._put_blob(root, image_id, blob)
            record: dict[str, Any] = {"name": name, "id": image_id}
            if manifest is not None:
                record["manifest"] = "sha256:" + hashlib.sha256(manifest).hexdigest()
                self._put_blob(root, record["manifest"], manifest)
            record |= {
                "layers": diff_ids,
                "size": size,
                "created": time.time(),
                "source": source,
            }
            replaced = safepath.lstat_beneath(root, f"images/{name}.json") is not None
            try:
                safepath.write_atomic(
                    root, f"images/{name}.json", json.dumps(record, indent=1).encode(), 0o600
                )
            except OSError as e:
                raise ImageError.from_os(
                    e, f"cannot record image {name!r}", "image import", hint=HINT
                ) from None
            ref = self._ref(root, name)
        if replaced:
            self.gc()
        return ref

    def _put_blob(self, root: int, digest: str, data: bytes) -> None:
        rel = f"blobs/sha256/{hex_of(digest)}"
        if safepath.lstat_beneath(root, rel) is None:
            safepath.write_atomic(root, rel, data, 0o600, fsync=False)  # layers are not synced either

    def _add_layer(
        self,
        root: int,
        src: LayerSource,
        budget: unpack.Budget,
        allow_devices: bool,
        label: str,
        progress: Progress | None,
        warn: Callable[[str], None] | None,
    ) -> tuple[str, int]:
        if (
            src.diff_id is not None
            and safepath.lstat_beneath(root, f"layers/{hex_of(src.diff_id)}") is not None
        ):
            if progress is not None:
                progress(f"{label} (already here)", src.size or 0, src.size)
            return src.diff_id, self._layer_size(root, src.diff_id)
        layers = safepath.dir_beneath(root, "layers")
        tmp = TMP + secrets.token_hex(8)
        try:
            os.mkdir(tmp, 0o700, dir_fd=layers)
            fd = safepath.dir_beneath(layers, tmp)
            done = 0

            def read(n: int) -> None:
                nonlocal done
                done += n
                if progress is not None:
                    progress(label, done, src.size)

            before = budget.used
            try:
                stream = src.open()
                try:
                    got = unpack.unpack(
                        stream,
                        fd,
                        budget,
                        as_root=os.geteuid() == 0,
                        allow_devices=allow_devices,
                        on_read=read,
                    )
                finally:
                    stream.close()
            finally:
                os.close(fd)
            for line in got.warnings:
                if warn is not None:
                    warn(line)
            if src.digest is not None and got.blob != src.digest:
                raise unpack.refuse(
                    f"{label} does not match its digest {src.digest} (read {got.blob})", label
                )
            if src.diff_id is not None and got.diff_id != src.diff_id:
                raise unpack.refuse(
                    f"{label} does not match its diff id {src.diff_id} (read {got.diff_id})", label
                )
            final = hex_of(got.diff_id)
            written = budget.used - before
            try:
                os.rename(tmp, final, src_dir_fd=layers, dst_dir_fd=layers)
            except OSError as e:
                if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                unpack.remove_tree(layers, tmp)  # another import made the same layer meanwhile
            self._note_size(root, got.diff_id, written)
            return got.diff_id, written
        except BaseException:
            with contextlib.suppress(OSError):
                unpack.remove_tree(layers, tmp)
            raise
        finally:
            os.close(layers)

    def _note_size(self, root: int, diff_id: str, size: int) -> None:
        with contextlib.suppress(OSError):
            rel = f"blobs/sha256/{hex_of(diff_id)}.size"
            safepath.write_atomic(root, rel, str(size).encode(), 0o600, fsync=False)

    def _layer_size(self, root: int, diff_id: str) -> int:
        try:
            return int(safepath.read_file(root, f"blobs/sha256/{hex_of(diff_id)}.size", 64))
        except (OSError, ValueError):
            return 0

    def import_root(
        self,
        name: str,
        path: Path | str,
        *,
        config: ImageConfig | None = None,
        source: str | None = None,
        max_size: int = unpack.DEFAULT_MAX_SIZE,
        progress: Progress | None = None,
        warn: Callable[[str], None] | None = None,
    ) -> ImageRef:
        """Add image ``name`` of one layer: a root filesystem, as a tarball or as a
        directory of the caller's (e.g. what mmdebstrap made), which goes through the
        same unpacker as any archive."""
        from . import archive

        path = Path(path)
        if path.is_dir() and not path.is_symlink():
            layer = LayerSource(open=lambda: archive.tar_of_dir(path), diff_id=None)
            what = "rootfs"
        else:
            layer = LayerSource(open=lambda: path.open("rb"), diff_id=None, size=_size_of(path))
            what = "tarball"
        return self.add(
            name,
            [layer],
            oci_config(config or ImageConfig(env=(("PATH", DEFAULT_PATH),))),
            source=source or f"{what} {path}",
            max_size=max_size,
            progress=progress,
            warn=warn,
        )

    def import_archive(
        self,
        name: str,
        path: Path | str,
        *,
        max_size: int = unpack.DEFAULT_MAX_SIZE,
        allow_devices: bool = False,
        progress: Progress | None = None,
        warn: Callable[[str], None] | None = None,
    ) -> ImageRef:
        """Add image ``name`` from a docker-archive or an OCI image layout (a directory
        or a tar of one), verifying every digest read."""
        from . import archive

        with archive.open_archive(Path(path)) as found:
            return self.add(
                name,
                found.layers,
                found.config,
                source=found.source,
                config_blob=found.config_blob,
                manifest=found.manifest,
                max_size=max_size,
                allow_devices=allow_devices,
                progress=progress,
                warn=warn,
            )

    # -- removing -------------------------------------------------------------------------

    def remove(self, name: str, *, collect: bool = True, force: bool = False) -> list[str]:
        """Forget image ``name``; then collect what no image uses (the diff ids of the
        layers removed are returned). Refused (``ImageInUse``) when a sandbox or a
        snapshot needs a layer the removal would take, unless ``force``: then the name
        goes, and those layers stay until their last holder is gone."""
        with self._locked(exclusive=False) as root:
            rec = self._record(root, name)
            if not force:
                others: set[str] = set()
                for other in self.names():
                    if other != name:
                        with contextlib.suppress(ImageError):
                            others.update(hex_of(d) for d in self._record(root, other)["layers"])
                freed = {hex_of(d) for d in rec["layers"]} - others
                users = [h for h, stale in holds.read_all(root) if not stale and h.layers & freed]
                if users:
                    raise ImageInUse(
                        f"image {name!r} is in use by " + ", ".join(h.what for h in users),
                        operation="image rm",
                        path=name,
                        errno=errno.EBUSY,
                        hint="remove them first (warren rm NAME, warren snapshot rm ID), or "
                        f"`warren image rm --force {name}`: the name goes now, its layers when "
                        "the last of them is gone",
                    )
            safepath.unlink(root, f"images/{name}.json")
        return self.gc() if collect else []

    def gc(self, blocking: bool = True) -> list[str]:
        """Remove the layers and blobs no image names and nothing holds; and what a
        crashed import left, and the records of holders that are gone. Returns the diff
        ids of the layers removed. Not ``blocking``: nothing when the store is busy."""
        removed: list[str] = []
        with self._locked(exclusive=True, blocking=blocking) as root:
            if root < 0:
                return removed
            keep_layers: set[str] = set()
            keep_blobs: set[str] = set()
            for name in self.names():
                try:
                    rec = self._record(root, name)
                except ImageError:
                    continue  # damaged: its layers are not kept for it
                keep_layers.update(hex_of(d) for d in rec["layers"])
                keep_blobs.add(hex_of(rec["id"]))
                if "manifest" in rec:
                    keep_blobs.add(hex_of(rec["manifest"]))
            for holder, stale in holds.read_all(root):
                if stale:
                    with contextlib.suppress(OSError):
                        safepath.unlink(root, f"holds/{holder.key}.json")
                else:
                    keep_layers |= holder.layers
            holds.sweep_temps(root)
            with safepath.listed(root, "layers") as (layers, present):
                for entry in present:
                    if entry.startswith(TMP):
                        unpack.remove_tree(layers, entry)  # no import runs: the lock is ours
                        continue
                    if entry in keep_layers or not HEX.fullmatch(entry):
                        continue
                    fd = safepath.dir_beneath(layers, entry)
                    try:
                        try:
                            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        except BlockingIOError:
                            continue  # locked by a lease whose record is gone
                        unpack.remove_tree(layers, entry)
                        removed.append("sha256:" + entry)
                    finally:
                        os.close(fd)
            with safepath.listed(root, "blobs/sha256") as (blobs, present):
                for entry in present:
                    base = entry.removesuffix(".size")
                    if HEX.fullmatch(base) and base not in keep_blobs and base not in keep_layers:
                        if (
                            entry.endswith(".size")
                            and safepath.lstat_beneath(root, f"layers/{base}") is not None
                        ):
                            continue  # a leased layer's size
                        safepath.unlink(blobs, entry)
        return removed


def stat_named(path: Path) -> os.stat_result:
    """The file an import was asked to read (the caller named it: a link is theirs)."""
    try:
        return os.stat(path)
    except OSError as e:
        raise ImageError.from_os(
            e, f"cannot read {path}", "image import", str(path), hint="check the path"
        ) from None


def _size_of(path: Path) -> int | None:
    st = stat_named(path)
    return st.st_size if stat.S_ISREG(st.st_mode) else None
