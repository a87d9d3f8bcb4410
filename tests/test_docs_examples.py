"""Every example in README.md and docs/ runs as written, or says why it cannot here.

Each fenced block of the pages is one of:
- marked ``<!-- not run: REASON -->`` on the line before it (it needs the network, root,
  a built image, an API key, or it is output shown for comparison): the reason must be
  there, and it is listed with the reason in this test's output (``-rs``);
- inside a generated reference block (``<!-- warren:NAME -->``): the command lines'
  synopses, not examples (``test_docs.py`` checks those are current);
- TOML, JSON or YAML: parsed;
- Python: run with this interpreter in an empty workspace of its own;
- shell: run with bash in an empty workspace of its own, ``set -e``. A transcript (lines
  starting with ``$ ``) runs its ``$`` commands; one whose shown output is an error
  (``Permission denied``, ``curl: (``, ``warren: ``) may fail, every other must succeed.

Every block runs with the installed ``warren`` first on PATH and one private state
directory (one supervisor) for the module."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import WARREN

# The examples as a reader runs them: the uid 1001 half, a user who is not root, as most
# readers are (an example that needs root says so and is not run).
pytestmark = pytest.mark.caller_independent(half="user")

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.M | re.S)
NOT_RUN = re.compile(r"<!-- not run: ([^>]*?) -->\n$")
GENERATED = re.compile(r"<!-- warren:([a-z-]+) -->\n.*?<!-- /warren:\1 -->", re.S)
SHELLS = ("", "sh", "bash", "console", "shell")
FAILURE_SHOWN = ("Permission denied", "curl: (", "warren: ")


@dataclass(frozen=True)
class Example:
    page: Path
    line: int
    lang: str
    body: str
    not_run: str | None  # the reason, when marked

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def examples() -> Iterator[Example]:
    for page in PAGES:
        text = page.read_text()
        generated = [m.span() for m in GENERATED.finditer(text)]
        for m in FENCE.finditer(text):
            if any(a <= m.start() < b for a, b in generated):
                continue
            before = text[: m.start()]
            marked = NOT_RUN.search(before[-300:])
            yield Example(
                page, before.count("\n") + 1, m.group(1), m.group(2), marked.group(1) if marked else None
            )


ALL = list(examples())


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    state = tmp_path_factory.mktemp("state")
    path = f"{Path(WARREN[0]).parent}:{os.environ['PATH']}" if len(WARREN) == 1 else os.environ["PATH"]
    env = {**os.environ, "XDG_STATE_HOME": str(state), "PATH": path}
    yield env
    subprocess.run(["warren", "rm", "-f", "--all"], env=env, capture_output=True, check=False)
    subprocess.run(["warren", "shutdown"], env=env, capture_output=True, check=False)


def _transcript(body: str) -> str:
    """A transcript's ``$`` commands as a script: each must succeed unless its shown
    output is an error."""
    lines = body.splitlines()
    out = []
    for i, line in enumerate(lines):
        if not line.startswith("$ "):
            continue
        shown = []
        for after in lines[i + 1 :]:
            if after.startswith("$ "):
                break
            shown.append(after)
        may_fail = any(mark in s for s in shown for mark in FAILURE_SHOWN)
        out.append(line[2:] + (" || true" if may_fail else ""))
    return "\n".join(out)


@pytest.mark.skipif(len(WARREN) != 1, reason="the examples call the installed `warren` command, absent here")
@pytest.mark.parametrize("example", ALL, ids=[e.where for e in ALL])
def test_the_example_runs_as_written(example: Example, env: dict[str, str]) -> None:
    if example.not_run is not None:
        assert example.not_run.strip(), f"{example.where}: say why it cannot run here"
        pytest.skip(f"not run here: {example.not_run}")
    lang = example.lang
    if lang == "toml":
        tomllib.loads(example.body)
        return
    if lang == "json":
        json.loads(example.body)
        return
    if lang == "yaml":
        yaml = pytest.importorskip("yaml")
        yaml.safe_load(example.body)
        return
    # In the home, as a reader runs them (a workspace under /tmp cannot share a mount
    # with the caches: warren would warn, and uv would copy where it links).
    top = Path.home() / f".warren-docs-example-{secrets.token_hex(6)}"
    ws = top / "ws"
    ws.mkdir(parents=True)
    try:
        _run(example, lang, ws, env)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _run(example: Example, lang: str, ws: Path, env: dict[str, str]) -> None:
    if lang == "python":
        argv = [sys.executable, "-c", example.body]
    elif lang in SHELLS:
        transcript = any(line.startswith("$ ") for line in example.body.splitlines())
        script = _transcript(example.body) if transcript else example.body
        argv = ["bash", "-e", "-o", "pipefail", "-c", script]
    else:
        raise AssertionError(f"{example.where}: a ```{lang} block: run it here, or mark it not run")
    r = subprocess.run(argv, cwd=ws, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{example.where} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stderr, f"{example.where}:\n{r.stderr}"
    assert "is under /tmp" not in r.stderr, f"{example.where}:\n{r.stderr}"


def test_every_example_is_found_and_most_run() -> None:
    """The extractor sees the pages' blocks (the control: a page known to hold runnable
    ones), and a marked block is the exception, not the rule."""
    quick = [e for e in ALL if e.page.name == "quickstart.md"]
    assert quick and any(e.not_run is None for e in quick)
    assert len(ALL) > 40
