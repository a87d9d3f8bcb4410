"""``dcode --sandbox warren``: the Deep Agents Code sandbox provider.

Registered in the ``deepagents_code.sandbox_providers`` entry-point group (see
pyproject.toml); Deep Agents Code builds it with no arguments. ``get_or_create``
makes a ``WarrenSandbox`` (its keyword arguments, e.g. ``[sandboxes.providers.warren
.params]`` in dcode's config, are warren's policy keys), or reattaches to a running
warren sandbox by name; ``delete`` removes one. Needs ``deepagents-code``.

Deep Agents Code calls the provider synchronously from its server's event loop,
where a checker (blockbuster) refuses blocking calls such as ``os.getcwd`` and
socket I/O. Those calls (the current directory, the supervisor's socket) run in a
worker thread, which the loop's thread waits for, as it would for any provider.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from deepagents_code.integrations.sandbox_provider import (
    SandboxInstallHint,
    SandboxNotFoundError,
    SandboxProvider,
    SandboxProviderMetadata,
)

from ...client.sandbox import Sandbox
from ...errors import SandboxDead, SandboxNotFound
from .._policy import PolicyKeys, spec_from
from . import WarrenSandbox

__all__ = ["WarrenSandboxProvider"]

_T = TypeVar("_T")


def _off_loop(fn: Callable[[], _T]) -> _T:
    """``fn()``, in a worker thread when this thread runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return fn()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="warren-provider") as pool:
        return pool.submit(fn).result()


class WarrenSandboxProvider(SandboxProvider):
    """Sandboxes of this user's warren supervisor, for Deep Agents Code."""

    def __init__(self, policy: PolicyKeys = None) -> None:
        self._spec = _off_loop(lambda: spec_from(policy, "WarrenSandboxProvider"))

    @property
    def metadata(self) -> SandboxProviderMetadata:
        return SandboxProviderMetadata(
            name="warren",
            working_dir=str(self._spec.workspace),
            install=SandboxInstallHint(kind="package", name="warren-sandbox[deepagents]"),
            supports_sandbox_id=True,
            supports_snapshot_name=False,
            backend_module="warren.integrations.deepagents",
        )

    def get_or_create(self, *, sandbox_id: str | None = None, **kwargs: Any) -> WarrenSandbox:
        return _off_loop(lambda: self._get_or_create(sandbox_id, kwargs))

    def delete(self, *, sandbox_id: str, **kwargs: Any) -> None:
        _off_loop(lambda: self._delete(sandbox_id))

    def _get_or_create(self, sandbox_id: str | None, kwargs: dict[str, Any]) -> WarrenSandbox:
        if sandbox_id is None:
            backend = WarrenSandbox(
                self._spec.merged(spec_from(kwargs, "sandbox params")) if kwargs else self._spec
            )
            backend.sandbox  # noqa: B018 - create it now, so a bad policy fails here
            return backend
        try:
            return WarrenSandbox(sandbox=Sandbox.get(sandbox_id))
        except (SandboxNotFound, SandboxDead) as e:
            raise SandboxNotFoundError(f"{e.message}; hint: {e.hint}") from e

    def _delete(self, sandbox_id: str) -> None:
        for info in Sandbox.list():
            if info.name == sandbox_id:
                Sandbox(info).remove()
                return
        raise SandboxNotFoundError(f"no warren sandbox named {sandbox_id}; hint: see `warren ls`")
