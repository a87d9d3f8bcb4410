"""langchain-tests' standard ``SandboxIntegrationTests`` (the documented way a Deep
Agents sandbox backend is tested: subclass it and give a ``sandbox`` fixture), run by
scripts/framework-suites on warren's ``WarrenSandbox`` or (``FRAMEWORK_SIDE=local``) on
Deep Agents' own ``LocalShellBackend`` for the figures beside it. Not part of warren's
suite (it lives outside tests/ and needs langchain-tests)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest
from deepagents.backends.protocol import SandboxBackendProtocol
from langchain_tests.integration_tests.sandboxes import SandboxIntegrationTests

SIDE = os.environ.get("FRAMEWORK_SIDE", "warren")


class TestDeepAgentsSandbox(SandboxIntegrationTests):
    @pytest.fixture(scope="class")
    def sandbox(self) -> Iterator[SandboxBackendProtocol]:
        work = tempfile.mkdtemp(prefix="warren-suite-")
        try:
            if SIDE == "warren":
                from warren.integrations.deepagents import WarrenSandbox

                backend = WarrenSandbox({"workspace": work})
                try:
                    yield backend
                finally:
                    backend.close()
            else:
                from deepagents.backends.local_shell import LocalShellBackend

                yield LocalShellBackend(root_dir=work, virtual_mode=False, inherit_env=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
