"""The documentation: its reference pages name every flag, policy key, route, tool and
exported name the code has (a new flag without docs fails here), it builds with
``mkdocs build --strict``, and no page names a path outside the project."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

# The documents and the reference are the same whoever reads them.
pytestmark = pytest.mark.caller_independent(half="root")

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
WARREN = [sys.executable, "-m", "warren"]


def _load_hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("warren_docs_reference", DOCS / "hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hook = _load_hook()


def _help(*args: str) -> str:
    r = subprocess.run([*WARREN, *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _commands_in_usage() -> list[str]:
    """Every command `warren --help` lists ("pause NAME / resume NAME" names two)."""
    return re.findall(r"(?:^  |/ )([a-z]+)\b", _help("--help"), re.M)


def _sections(markdown: str) -> dict[str, str]:
    parts = re.split(r"^### warren ([a-z]+)\n", markdown, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_every_command_of_warren_help_has_a_section() -> None:
    sections = _sections(hook.cli_md())
    missing = sorted(set(_commands_in_usage()) - set(sections))
    assert not missing, f"commands without a reference section: {missing}"


def test_the_committed_reference_is_the_generated_one() -> None:
    """The reference pages carry the generated text (so they read on GitHub too): it must
    be what the code makes now."""
    pages = sorted((DOCS / "reference").glob("*.md"))
    blocks = {page.name: hook.BLOCK.findall(page.read_text()) for page in pages}
    assert sum(len(b) for b in blocks.values()) == len(hook.GENERATORS), blocks  # each block once
    for page in pages:
        text = page.read_text()
        assert hook.fill(text) == text, f"{page} is stale: run python docs/hooks/reference.py"
    # the control: a block whose text is not the generated one is seen as stale
    edited = (DOCS / "reference" / "cli.md").read_text().replace("| `--workspace`, `-w` |", "| `--w` |", 1)
    assert hook.fill(edited) != edited


def test_every_flag_of_every_command_is_in_the_reference() -> None:
    """Flags as `warren COMMAND --help` prints them (not as the hook finds them)."""
    sections = _sections(hook.cli_md())
    policy_table = hook.policy_flags_md()
    missing = []
    for command in _commands_in_usage():
        text = _help(command, "--help")
        options = text.split("options:", 1)[-1]
        columns = re.findall(r"^  (-\S.*?)(?:  |$)", options, re.M)  # the option column only
        flags = {f for c in columns for f in re.findall(r"(?:^|, )(--?[a-z][a-z-]*)", c)} - {"-h", "--help"}
        flagless = (
            "pause",
            "resume",
            "stop",
            "shutdown",
            "presets",
            "completion",
            "man",
            "discard",
            "checkpoint",
        )
        assert command in flagless or flags, text
        section = sections[command]
        takes_policy = "Takes every [policy flag]" in section
        for flag in sorted(flags):
            if f"`{flag}`" not in section and not (takes_policy and f"`{flag}`" in policy_table):
                missing.append(f"warren {command} {flag}")
    assert not missing, f"flags missing from the reference: {missing}"


def test_every_flag_says_what_it_does() -> None:
    for name, parser in hook.parsers().items():
        for action in parser._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"warren {name} {action.option_strings[0]} has no help text"


def test_every_policy_key_is_in_the_reference_with_a_meaning() -> None:
    from warren.policy import spec

    rows = {
        m.group(1): m.group(0) for m in re.finditer(r"^\| `([a-z_]+)` \|.*$", hook.policy_keys_md(), re.M)
    }
    for key in [*spec.KNOWN, "profile"]:
        assert key in rows, f"policy key {key!r} is not in the reference"
        cells = [c.strip() for c in rows[key].strip("|").split(" | ")]
        assert cells[3], f"policy key {key!r} has no meaning in the reference"


def test_every_route_of_the_openapi_document_is_in_the_reference() -> None:
    from warren.service import openapi

    text = hook.http_api_md()
    for path, methods in openapi.document()["paths"].items():
        for method in methods:
            assert f"### {method.upper()} {path}\n" in text


def test_every_mcp_tool_is_in_the_reference() -> None:
    from warren.mcp.sdk import input_schema

    text = hook.mcp_tools_md()
    tools = hook.mcp_tools()
    assert len(tools) >= 10
    for tool in tools:
        assert f"### {tool.name}\n" in text
        for argument in input_schema(tool).get("properties", {}):
            assert f"`{argument}`" in text


def test_every_exported_name_is_in_the_python_reference() -> None:
    import warren

    text = hook.python_api_md()
    for name in warren.__all__:
        assert f"### {name}\n" in text or f"| `{name}` |" in text, name


def _doc_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "mkdocs.yml", *DOCS.rglob("*.md"), *DOCS.rglob("*.py")]
    assert len(files) > 10
    return files


def test_no_doc_names_a_path_outside_the_project() -> None:
    outside = re.compile(r"\.\./shared|/work/|shared/(?:STYLE|DESIGN)\.md")
    for path in _doc_files():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            assert not outside.search(line), f"{path.relative_to(ROOT)}:{n} names a path outside: {line}"


def test_no_relative_link_leaves_the_project() -> None:
    link = re.compile(r"\]\(([^)#\s]+)")
    for path in _doc_files():
        if path.suffix != ".md":
            continue
        for target in link.findall(path.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            resolved = (path.parent / target).resolve()
            assert resolved.is_relative_to(ROOT), f"{path.relative_to(ROOT)} links outside: {target}"
            assert resolved.exists(), f"{path.relative_to(ROOT)} links to a missing file: {target}"


def test_mkdocs_builds_strictly(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "NO_MKDOCS_2_WARNING": "1",
            "PYTHONPATH": str(ROOT / "src"),
        },
    )
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()
