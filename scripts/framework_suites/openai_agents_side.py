"""pytest plugin for scripts/framework-suites: runs the OpenAI Agents SDK's own sandbox
tests (from its pinned sdist) with warren's client in place of ``UnixLocalSandboxClient``,
or with the SDK's own client (``FRAMEWORK_SIDE=local``) for the figures beside it.

Only tests that make a client count ("the client tests"): the plugin notes which ones
construct it, and prints their passed/failed at the end (and writes them as JSON to
``FRAMEWORK_RESULT`` when set). The SDK's tests are not copied: the name the test
modules import is swapped before they are collected.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from typing import Any

import pytest
from agents.sandbox import sandboxes
from agents.sandbox.manifest import Manifest
from agents.sandbox.sandboxes import unix_local

SIDE = os.environ.get("FRAMEWORK_SIDE", "warren")
_made_client: set[str] = set()
_current = {"test": ""}
_outcomes: dict[str, str] = {}
_made_sandboxes: list[str] = []
_made_roots: list[str] = []  # removed after the test, as the local client removes its own
_DEFAULT_ROOT = Manifest.model_fields["root"].default


def _noted() -> None:
    _made_client.add(_current["test"])


if SIDE == "warren":
    from warren.integrations.openai_agents import WarrenSandboxClient, WarrenSandboxClientOptions

    class Client(WarrenSandboxClient):
        """warren's client with the local client's constructor; a session made on the
        SDK's default root gets a fresh directory, as the local client gives it."""

        # The tests compare the run state's backend name with the local client's and a
        # resumed state must name the client resuming it: under this name what they
        # check past it (the workspace and tool state carried across resume) counts.
        # warren's own name is "warren".
        backend_id = "unix_local"

        def __init__(
            self,
            *,
            instrumentation: Any = None,
            dependencies: Any = None,
            inherit_host_environment: bool = True,
            host_environment_allowlist: Any = None,
        ) -> None:
            _noted()
            super().__init__(instrumentation=instrumentation, dependencies=dependencies)

        async def create(self, *, snapshot: Any = None, manifest: Any = None, options: Any = None) -> Any:
            manifest = manifest if manifest is not None else Manifest()
            if manifest.root == _DEFAULT_ROOT:
                root = tempfile.mkdtemp(prefix="warren-suite-")
                _made_roots.append(root)
                manifest = manifest.model_copy(update={"root": root}, deep=True)
            if options is not None and not isinstance(options, WarrenSandboxClientOptions):
                ports = tuple(getattr(options, "exposed_ports", ()))
                options = WarrenSandboxClientOptions(exposed_ports=ports)
            session = await super().create(snapshot=snapshot, manifest=manifest, options=options)
            _made_sandboxes.append(session.state.sandbox_name)
            return session

else:

    class Client(unix_local.UnixLocalSandboxClient):  # type: ignore[no-redef]
        def __init__(self, **kwargs: Any) -> None:
            _noted()
            super().__init__(**kwargs)


unix_local.UnixLocalSandboxClient = Client  # type: ignore[misc]
sandboxes.UnixLocalSandboxClient = Client  # type: ignore[attr-defined]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    _current["test"] = item.nodeid
    try:
        return (yield)
    finally:
        _current["test"] = ""
        _remove_made()


def _remove_made() -> None:
    """Remove the sandboxes a test's sessions made (many tests end a session without
    the client's delete, which would leave a stopped sandbox on warren's record),
    then the fresh directories given to sessions on the SDK's default root."""
    if SIDE != "warren":
        return
    from warren import Sandbox
    from warren.errors import WarrenError

    if _made_sandboxes:
        names, _made_sandboxes[:] = set(_made_sandboxes), []
        for info in Sandbox.list():
            if info.name in names:
                with contextlib.suppress(WarrenError):
                    Sandbox(info).remove()
    while _made_roots:
        shutil.rmtree(_made_roots.pop(), ignore_errors=True)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    counts = report.when == "call" or report.outcome != "passed"
    if counts and _outcomes.get(report.nodeid) in (None, "passed"):
        _outcomes[report.nodeid] = report.outcome


def pytest_sessionfinish(session: pytest.Session) -> None:
    counted = {t: o for t, o in _outcomes.items() if t in _made_client}
    figures = {
        "side": SIDE,
        "passed": sum(o == "passed" for o in counted.values()),
        "failed": sum(o == "failed" for o in counted.values()),
        "skipped": sum(o == "skipped" for o in counted.values()),
        "failures": sorted(t for t, o in counted.items() if o == "failed"),
        "passes": sorted(t for t, o in counted.items() if o == "passed"),
    }
    print(f"\nopenai-agents client tests on {SIDE}: {figures['passed']} passed, {figures['failed']} failed")
    if os.environ.get("FRAMEWORK_RESULT"):
        with open(os.environ["FRAMEWORK_RESULT"], "w") as out:
            json.dump(figures, out, indent=1)
