"""``dcode --sandbox warren``: the Deep Agents Code sandbox provider.

Registered in the ``deepagents_code.sandbox_providers`` entry-point group (see
pyproject.toml); Deep Agents Code builds it with no arguments. ``get_or_create``
makes a ``WarrenSandbox`` (its keyword arguments, e.g. ``[sandboxes.providers.warren
.params]`` in dcode's config, are warren's policy keys), or reattaches to a running
warren sandbox by name; ``delete`` removes one. Needs ``deepagents-code``.
"""

from __future__ import annotations

from typing import Any

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


class WarrenSandboxProvider(SandboxProvider):
    """Sandboxes of this user's warren supervisor, for Deep Agents Code."""

    def __init__(self, policy: PolicyKeys = None) -> None:
        self._spec = spec_from(policy, "WarrenSandboxProvider")

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

    def delete(self, *, sandbox_id: str, **kwargs: Any) -> None:
        for info in Sandbox.list():
            if info.name == sandbox_id:
                Sandbox(info).remove()
                return
        raise SandboxNotFoundError(f"no warren sandbox named {sandbox_id}; hint: see `warren ls`")
