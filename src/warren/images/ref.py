"""What a sandbox needs to know about an image: its layers and its runtime settings.

The store resolves a name to an ``ImageRef``; the sandbox side mounts the layers as
the lower directories of a copy-on-write root and applies the config. Nothing here
touches the disk.

Layer directories are in the format an unprivileged overlay mount with ``userxattr``
reads: a whiteout is a 0/0 character device, an opaque directory carries the
``user.overlay.opaque`` attribute set to ``y``. They are never written after the
store made them (a sandbox's changes go to its own upper directory).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class ImageConfig:
    """The runtime part of an image's config (OCI ``config``), already validated."""

    env: tuple[tuple[str, str], ...] = ()  # the image's Env, in order; PATH among them
    user: str = ""  # "" or "0" or "root": root (mapped to the caller); else NAME[:GROUP] or UID[:GID]
    workdir: str = ""  # "" means /
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()


@dataclass(frozen=True)
class ImageRef:
    """One image, resolved: ``layers`` lowest (the base) first, every one a directory."""

    name: str
    id: str  # "sha256:<hex>" of the image's config (what `warren image ls` shows, shortened)
    layers: tuple[Path, ...]
    config: ImageConfig = field(default_factory=ImageConfig)

    @property
    def lowerdirs(self) -> tuple[Path, ...]:
        """The layers in overlayfs ``lowerdir=`` order: topmost first."""
        return tuple(reversed(self.layers))
