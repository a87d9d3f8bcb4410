"""warren's distribution name and its optional parts (extras), and the one error a
missing part gets: a line naming the extra to install, never a ``ModuleNotFoundError``.

The distribution is ``warren-sandbox`` (the name ``warren`` on PyPI is another project's);
the import package and the command are ``warren``. Standard library only.
"""

from __future__ import annotations

from .errors import HostError

DISTRIBUTION = "warren-sandbox"

# extra -> the top-level modules it brings (what a missing one looks like)
EXTRAS: dict[str, tuple[str, ...]] = {
    "e2b": ("e2b", "connectrpc"),
    "sandboxd": ("grpc", "k8s_agent_sandbox", "agent_sandbox"),
    "openai-agents": ("agents",),
    "deepagents": ("deepagents", "langchain_core"),
    "mini-swe-agent": ("minisweagent",),
    "otel": ("opentelemetry",),
}


def version() -> str:
    """The installed distribution's version (pyproject.toml's ``version`` is the one place
    it is written), or "unknown" running from a tree that was never installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as of

    try:
        return of(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"


def install_line(extra: str) -> str:
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def missing(extra: str, what: str, error: ModuleNotFoundError | None = None) -> HostError:
    """The error for ``what`` (a command or feature) without ``extra`` installed."""
    module = f" (no module {error.name!r})" if error is not None and error.name else ""
    return HostError(
        f"{what} needs the {extra!r} extra, which is not installed here{module}",
        operation="import",
        hint=f"{install_line(extra)} in the environment warren runs from (with pipx or uv tool, "
        f"install '{DISTRIBUTION}[{extra}]' again with --force)",
    )


def is_missing(extra: str, error: ModuleNotFoundError) -> bool:
    """Whether ``error`` is one of ``extra``'s modules missing (not a bug elsewhere)."""
    top = (error.name or "").split(".")[0]
    return top in EXTRAS[extra]
