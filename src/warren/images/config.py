"""The JSON of an image: its OCI config read into ``ImageConfig`` (type-checked) and
written from one (for a root made here), and ``ImageInfo``, what ``warren image ls``
and ``inspect`` show. Pure: nothing here touches the disk."""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from typing import Any

from .ref import ImageConfig

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class ImageInfo:
    """What ``warren image ls`` and ``inspect`` show of one image."""

    name: str
    id: str
    layers: tuple[str, ...]  # diff ids, lowest first
    size: int  # bytes of file data in its layers
    created: float  # when it was added to this store (epoch seconds)
    source: str  # how: "debian bookworm", "docker-archive FILE", "rootfs DIR" ...
    config: ImageConfig = field(default_factory=ImageConfig)

    def to_json(self) -> dict[str, Any]:
        c = self.config
        return {
            "name": self.name,
            "id": self.id,
            "layers": list(self.layers),
            "size": self.size,
            "created": self.created,
            "source": self.source,
            "config": {
                "env": [f"{k}={v}" for k, v in c.env],
                "user": c.user,
                "workdir": c.workdir,
                "entrypoint": list(c.entrypoint),
                "cmd": list(c.cmd),
            },
        }


def oci_config(c: ImageConfig) -> dict[str, Any]:
    """An OCI image config for ``c`` (the runtime part; rootfs is filled in by ``add``)."""
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    inner: dict[str, Any] = {"Env": [f"{k}={v}" for k, v in c.env]}
    if c.user:
        inner["User"] = c.user
    if c.workdir:
        inner["WorkingDir"] = c.workdir
    if c.entrypoint:
        inner["Entrypoint"] = list(c.entrypoint)
    if c.cmd:
        inner["Cmd"] = list(c.cmd)
    return {"architecture": arch, "os": "linux", "config": inner}


def parse_config(data: object) -> ImageConfig:
    """The runtime settings of an OCI (or docker) image config, type-checked."""

    def strings(value: object, what: str) -> tuple[str, ...]:
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{what} is not a list of strings")
        return tuple(value)

    def text(value: object, what: str) -> str:
        if value is None:
            return ""
        if not isinstance(value, str):
            raise ValueError(f"{what} is not a string")
        return value

    if not isinstance(data, dict):
        raise ValueError("the config is not an object")
    inner = data.get("config") or {}
    if not isinstance(inner, dict):
        raise ValueError("config.config is not an object")
    env = []
    for item in strings(inner.get("Env"), "Env"):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"Env entry {item!r} is not KEY=VALUE")
        env.append((key, value))
    return ImageConfig(
        env=tuple(env),
        user=text(inner.get("User"), "User"),
        workdir=text(inner.get("WorkingDir"), "WorkingDir"),
        entrypoint=strings(inner.get("Entrypoint"), "Entrypoint"),
        cmd=strings(inner.get("Cmd"), "Cmd"),
    )
