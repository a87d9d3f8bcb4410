"""The integrations' documented examples run as written, and warren itself never
imports an agent framework (each is loaded only with its integration module)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import module_state
from warren import Sandbox

# The integrations' examples as a reader runs them: the uid 1001 half (the backends
# themselves run in both halves: tests/test_integration_*.py).
pytestmark = pytest.mark.caller_independent(half="user")

DOCS = Path(__file__).resolve().parent.parent / "docs" / "integrations"
FRAMEWORKS = ("agents", "deepagents", "deepagents_code", "minisweagent", "langchain", "litellm")


@pytest.fixture(scope="module", autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from module_state(tmp_path_factory)


def _first_python_block(doc: Path) -> str:
    found = re.search(r"```python\n(.*?)```", doc.read_text(), re.S)
    assert found, f"{doc} has no python example"
    return found.group(1)


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ("openai-agents.md", ["hello from the manifest", "written by the SDK", "workspace archive:"]),
        ("deepagents.md", ["hello\n\noops\n", "1. read", "exit code: 1"]),
        ("mini-swe-agent.md", ["'returncode': 3", "'output': 'out\\nerr\\n'", "my answer"]),
    ],
)
def test_the_documented_example_runs_without_a_model(doc: str, expected: list[str], tmp_path: Path) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    env = {**os.environ, "MSWEA_GLOBAL_CONFIG_DIR": str(tmp_path / "mswea"), "MSWEA_SILENT_STARTUP": "1"}
    ran = subprocess.run(
        [sys.executable, "-c", _first_python_block(DOCS / doc)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr
    for text in expected:
        assert text in ran.stdout
    assert not Sandbox.list()  # each example removes the sandbox it made


def test_warren_never_imports_an_agent_framework() -> None:
    code = (
        "import sys, warren, warren.client.sandbox, warren.client.aio, warren.cli, warren.mcp.server, "
        "warren.integrations, warren.integrations._policy\n"
        f"print(sorted(m for m in {FRAMEWORKS!r} if m in sys.modules))"
    )
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "[]"
