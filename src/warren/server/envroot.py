"""Which image a sandbox runs on: a policy's ``image`` resolved to an ``ImageRef``.

An absolute path names a root directory on the host, used as the one read-only layer
(a directory made with ``mmdebstrap`` or unpacked by hand); any other value is a name
in the image store (``images.store``), leased while a sandbox runs on it. The layers
are only read: the sandbox's changes go to its own layer (``plan.envroot``).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from ..errors import PolicyError
from ..images.location import default_root
from ..images.ref import ImageRef
from ..plan.model import Plan

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..images.store import ImageStore, Lease


def store_root(env: Mapping[str, str]) -> Path:
    """The caller's image store (its XDG_DATA_HOME, not the supervisor's)."""
    return default_root(dict(env))


def image_store(root: str | Path) -> ImageStore:
    """The image store at ``root``, loaded when an image sandbox (or a snapshot of one)
    needs it, not on every supervisor's start."""
    from ..images.store import ImageStore

    return ImageStore(Path(root))


def resolve_image(name: str, env: Mapping[str, str]) -> ImageRef:
    if name.startswith("/"):
        return _directory(name)
    return image_store(store_root(env)).resolve(name)


def lease(plan: Plan, holder: str) -> Lease | None:
    """Hold the image a launched sandbox runs on, so ``warren image rm`` names
    ``holder`` and gc keeps its layers while it runs. A sandbox made from a snapshot
    holds the store's layers under it (a root directory or a snapshot's own layer is
    not the store's)."""
    name = plan.image
    if name is None or plan.image_store is None:
        return None
    store = image_store(plan.image_store)
    if "+" in name:
        layers = [Path(p) for p in plan.mounts[0].layers] if plan.mounts else []
        return store.acquire_layers(name, layers, holder)
    return store.acquire(name, holder)


def _directory(path: str) -> ImageRef:
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError as e:
        raise PolicyError.from_os(
            e,
            f"image {path}: {e.strerror}",
            "image",
            path,
            hint="--image takes an image name or the absolute path of a root directory",
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise PolicyError(
            f"image {path}: not a directory",
            operation="image",
            path=path,
            hint="--image takes an image name or the absolute path of a root directory",
        )
    digest = hashlib.sha256(f"dir:{real}:{st.st_dev}:{st.st_ino}".encode()).hexdigest()
    return ImageRef(name=real, id=f"sha256:{digest}", layers=(Path(real),))
