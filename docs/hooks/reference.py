"""MkDocs hook: the reference pages, generated from warren's own tables.

A page holds a block ``<!-- warren:cli -->`` ... ``<!-- /warren:cli -->`` whose text is
markdown made from the code: the policy keys (``policy/spec.py``, ``policy/config.py``),
the command-line flags (``cli/flags.py`` and each sub-command's parser, as ``warren
COMMAND --help`` builds it), the OpenAPI document ``warren serve`` serves
(``service/openapi.py``), the public Python API (``warren.__all__``) and the MCP tools
(``mcp/server.py``). Nothing here is typed twice, so the reference cannot drift; a key
or flag this hook cannot describe stops the build (and ``tests/test_docs.py``).

The generated text is committed inside each block, so the pages read on GitHub (and
anywhere Markdown is shown) as on the site: ``python docs/hooks/reference.py`` writes it
again after a change, ``--check`` says which pages are stale (``tests/test_docs.py`` fails
on one), and the build regenerates it, so the site is current whatever was committed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import inspect
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[2] / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

# A marker, and the note after it for readers of the plain Markdown (on GitHub), which
# the generated text replaces.
BLOCK = re.compile(r"<!-- warren:([a-z-]+) -->\n.*?<!-- /warren:\1 -->", re.S)

# Policy keys with no flag of their own, or whose flag says the opposite (a switch that
# turns a default off): what the key means, in the words of a config file.
KEY_MEANING = {
    "default_deny": "hide `~/.ssh`, `~/.aws` and the other credential stores and system secrets "
    "(default `true`; `--no-default-deny` sets `false`)",
    "workspace_writable": "the workspace is writable (default `true`; `--read-only-workspace` sets `false`)",
    "allow_nested": "let commands in the sandbox create user namespaces mapping your own uid "
    "(`unshare -Ur`; see Security) (default `false`; no flag: your own config only)",
    "workspace_at": "where the sandbox sees its workspace when not at its host path: an absolute "
    "path whose parent exists on the host (E2B's `/home/user`); made inside the sandbox only, the "
    "host is not changed (no flag: your config or the API)",
    "workspace_link": "with `workspace_at`: that path is a symbolic link to the workspace, which "
    "stays at its host path, on one mount with the caches (hard links from them work; `getcwd` "
    "names the host path), instead of a mount of it (default `false`; E2B's `/home/user`; no flag: "
    "your config or the API)",
    "ask_timeout": 'with `network = "ask"`: how long a connection to a host not on the list waits '
    "for `warren net NAME approve` before the proxy refuses it (default 60 s, at most an hour; no "
    "flag: your config or the API)",
    "profile": "`[profile.NAME]` tables: named sets of these keys, chosen with `--profile NAME`",
}
KIND_TEXT = {
    "list": "list of strings (a single string is a list of one)",
    "bool": "`true` or `false`",
    "str": "string",
    "table": "table of strings",
    "limit": 'number or size (`512M`, `64`, `0.5`, `30m`, `"none"`)',
    "duration": 'seconds or a duration (`30`, `"2m"`)',
}


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


@contextmanager
def _capturing_parsers() -> Iterator[None]:
    """Every sub-command builds its argparse parser and parses at once: stop it there."""

    def capture(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Captured(self)

    saved = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = saved  # type: ignore[method-assign]


def command_names() -> list[str]:
    """Every sub-command, in the order of ``warren --help``."""
    from warren import cli

    known = {"run", "exec", *cli.commands()}
    ordered = [w for w in re.findall(r"\b[a-z]+\b", cli.USAGE) if w in known]
    return list(dict.fromkeys([*ordered, *sorted(known)]))


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Each sub-command's parser, exactly as ``warren COMMAND --help`` builds it."""
    from warren import cli

    out: dict[str, argparse.ArgumentParser] = {}
    with _capturing_parsers():
        for name in command_names():
            try:
                cli._dispatch([name, "--help"])
            except _Captured as c:
                out[name] = c.parser
            else:
                raise RuntimeError(f"warren {name} --help built no parser")
    return out


def cli_flags() -> dict[str, list[str]]:
    """Every option string of every sub-command (``-h``/``--help`` left out)."""
    return {
        name: [s for a in p._actions for s in a.option_strings if s not in ("-h", "--help")]
        for name, p in parsers().items()
    }


def _policy_dests() -> set[str]:
    from warren.cli import flags

    return {f.dest for f in flags.POLICY_FLAGS}


def _flag_for_key() -> dict[str, Any]:
    """Policy key -> the flag that sets it, learnt by giving ``spec_of`` each flag alone."""
    from warren.cli import flags

    def blank() -> dict[str, Any]:
        return {
            f.dest: [] if f.kind == "multi" else (False if f.kind == "switch" else None)
            for f in flags.POLICY_FLAGS
        }

    out: dict[str, Any] = {}
    for flag in flags.POLICY_FLAGS:
        values = blank()
        if flag.kind == "multi":
            values[flag.dest] = ["NAME=VALUE"]
        elif flag.kind == "switch":
            values[flag.dest] = True
        else:
            values[flag.dest] = flag.choices[0] if flag.choices else "1"
        for key in flags.spec_of(flags.Namespace(**values)):
            out[key] = flag
    return out


def _kind(key: str) -> str:
    from warren.policy import spec

    if key in spec.LIST_KEYS:
        return "list"
    if key in spec.BOOL_KEYS:
        return "bool"
    if key in spec.TABLE_KEYS:
        return "table"
    if key in spec.LIMIT_KEYS:
        return "limit"
    if key in spec.ASK_KEYS:
        return "duration"
    return "str"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def policy_keys_md() -> str:
    from warren.policy import config, spec

    by_key = _flag_for_key()
    canonical: dict[str, str] = {}
    for list_key, attr in spec.LIST_KEYS.items():
        canonical.setdefault(attr, list_key)
    rows = [
        "| key | value | flag | meaning | in a workspace `warren.toml` |",
        "| --- | --- | --- | --- | --- |",
    ]
    for key in [*spec.KNOWN, "profile"]:
        if key in spec.LIST_KEYS and canonical[spec.LIST_KEYS[key]] != key:
            main = canonical[spec.LIST_KEYS[key]]
            rows.append(f"| `{key}` | same as `{main}` | | another spelling of `{main}` | as `{main}` |")
            continue
        flag = by_key.get(key)
        meaning = KEY_MEANING.get(key) or (flag.help if flag else None)
        if not meaning:
            raise RuntimeError(f"policy key {key!r} has neither a flag nor a meaning in docs/hooks")
        flag_text = ""
        if flag is not None:
            flag_text = "`" + ", ".join(flag.names) + (f" {flag.metavar}" if flag.metavar else "") + "`"
        elif key == "profile":
            flag_text = "`--profile NAME`"
        kind = "table of tables" if key == "profile" else KIND_TEXT[_kind(key)]
        if key == "network":
            kind = '`"none"`, `"allow"`, `"ask"` or `"open"`'
        narrowing = config._NARROWING.get(key)
        if key == "profile":
            ws = "yes (each key in it as at top level)"
        elif narrowing == "any path":
            ws = "yes"
        elif narrowing:
            ws = f"only {narrowing}"
        else:
            ws = "no: refused (exit 125)"
        rows.append(f"| `{key}` | {kind} | {flag_text} | {_cell(meaning)} | {ws} |")
    return "\n".join(rows) + "\n"


def _option_row(a: argparse.Action) -> str:
    names = ", ".join(f"`{s}`" for s in a.option_strings)
    if a.choices:
        value = " \\| ".join(f"`{c}`" for c in a.choices)
    elif a.nargs == 0:
        value = ""
    else:
        value = f"`{a.metavar or a.dest.upper()}`"
    if isinstance(a, argparse._AppendAction):
        value += " (repeatable)"
    help_text = a.help if a.help and a.help != argparse.SUPPRESS else ""
    if a.default not in (None, False, [], argparse.SUPPRESS) and "default" not in help_text:
        help_text += f" (default: {a.default})"
    return f"| {names} | {value} | {_cell(help_text)} |"


def _usage(p: argparse.ArgumentParser) -> str:
    fmt = argparse.HelpFormatter(p.prog, width=88)
    fmt.add_usage(p.usage, p._actions, p._mutually_exclusive_groups)
    return fmt.format_help().strip()


def policy_flags_md() -> str:
    from warren.cli import flags

    rows = ["| flag | value | meaning |", "| --- | --- | --- |"]
    dests = {f.dest for f in flags.POLICY_FLAGS}
    rows.extend(_option_row(a) for a in parsers()["run"]._actions if a.dest in dests)
    return "\n".join(rows) + "\n"


def cli_md() -> str:
    policy = _policy_dests()
    out: list[str] = []
    for name, p in parsers().items():
        out.append(f"### warren {name}\n")
        if p.description:
            out.append(p.description + "\n")
        out.append("```\n" + _usage(p) + "\n```\n")
        has_policy = policy <= {a.dest for a in p._actions}
        own = [
            a
            for a in p._actions
            if a.option_strings and a.dest != "help" and not (has_policy and a.dest in policy)
        ]
        positionals = [a for a in p._actions if not a.option_strings]
        if has_policy:
            out.append("Takes every [policy flag](#policy-flags).\n")
        if positionals:
            out.append(
                "Arguments: "
                + "; ".join(
                    f"`{a.metavar or a.dest.upper()}`" + (f": {a.help}" if a.help else "")
                    for a in positionals
                )
                + ".\n"
            )
        if own:
            out.append("| flag | value | meaning |\n| --- | --- | --- |")
            out.extend(_option_row(a) for a in own)
            out.append("")
    return "\n".join(out)


# --- HTTP API ------------------------------------------------------------------------------


def _schema_text(s: dict[str, Any]) -> str:
    if "$ref" in s:
        name = s["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "oneOf" in s:
        return " or ".join(_schema_text(x) for x in s["oneOf"])
    if "enum" in s:
        return " or ".join(f"`{v!r}`".replace("'", '"') for v in s["enum"])
    kind = s.get("type", "any")
    kinds = kind if isinstance(kind, list) else [kind]
    text = " or ".join(kinds)
    if "array" in kinds:
        items = s.get("items")
        text = text.replace("array", f"array of {_schema_text(items)}" if items else "array")
    if "object" in kinds and "properties" not in s and isinstance(s.get("additionalProperties"), dict):
        text = text.replace("object", f"object of {_schema_text(s['additionalProperties'])}")
    limits = []
    for key, word in (
        ("minimum", ">="),
        ("exclusiveMinimum", ">"),
        ("maximum", "<="),
        ("minLength", "length >="),
        ("maxLength", "length <="),
        ("minItems", "items >="),
    ):
        if key in s:
            limits.append(f"{word} {s[key]}")
    if s.get("format"):
        limits.append(s["format"])
    if s.get("pattern") and s["pattern"] != "^[^\\u0000]*$":
        limits.append(f"pattern `{s['pattern']}`")
    elif s.get("pattern"):
        limits.append("no NUL")
    return text + (f" ({', '.join(limits)})" if limits else "")


def _properties(s: dict[str, Any]) -> list[str]:
    required = set(s.get("required", ()))
    rows = ["| field | type | required | description |", "| --- | --- | --- | --- |"]
    for name, sub in s.get("properties", {}).items():
        rows.append(
            f"| `{name}` | {_cell(_schema_text(sub))} | {'yes' if name in required else ''} "
            f"| {_cell(sub.get('description', ''))} |"
        )
    return rows


def http_api_md() -> str:
    from warren.service import openapi

    doc = openapi.document()
    out = [f"OpenAPI {doc['openapi']}, API version {doc['info']['version']}: {doc['info']['description']}\n"]
    errors: dict[str, str] = {}
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            out.append(f"### {method.upper()} {path}\n")
            out.append(op["summary"] + "\n")
            params = op.get("parameters", [])
            if params:
                out.append(
                    "| parameter | in | type | required | description |\n| --- | --- | --- | --- | --- |"
                )
                for prm in params:
                    out.append(
                        f"| `{prm['name']}` | {prm['in']} | {_cell(_schema_text(prm.get('schema', {})))} "
                        f"| {'yes' if prm.get('required') else ''} | {_cell(prm.get('description', ''))} |"
                    )
                out.append("")
            body = op.get("requestBody")
            if body:
                forms = [f"`{ctype}`: {_schema_text(c['schema'])}" for ctype, c in body["content"].items()]
                out.append("Body: " + "; ".join(forms) + "\n")
            for status, resp in op["responses"].items():
                if status.startswith("2"):
                    forms = [
                        f"`{ctype}`: {_schema_text(c['schema'])}"
                        for ctype, c in resp.get("content", {}).items()
                    ]
                    out.append(f"Success: `{status}`, " + "; ".join(forms) + "\n")
                else:
                    errors[status] = resp["description"]
    out.append("## Error statuses\n")
    out.append("Every operation answers an error with an [Error](#error) body and one of these statuses:\n")
    out.append("| status | when |\n| --- | --- |")
    out.extend(f"| {code} | {_cell(text)} |" for code, text in sorted(errors.items()))
    out.append("\n## Schemas\n")
    for name, schema in doc["components"]["schemas"].items():
        out.append(f"### {name}\n")
        if schema.get("properties"):
            out.extend(_properties(schema))
            out.append("")
        else:
            out.append(_schema_text(schema) + "\n")
        for pname, sub in schema.get("properties", {}).items():
            if sub.get("type") == "object" and sub.get("properties"):
                out.append(f"`{pname}`:\n")
                out.extend(_properties(sub))
                out.append("")
    return "\n".join(out)


# --- Python API ----------------------------------------------------------------------------


def _annotation(a: Any) -> str:
    return a if isinstance(a, str) else getattr(a, "__name__", repr(a))


def _signature(fn: Callable[..., Any], skip_self: bool) -> str:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return "(...)"
    parts: list[str] = []
    star_done = False
    params = list(sig.parameters.values())
    if skip_self and params and params[0].name in ("self", "cls"):
        params = params[1:]
    for prm in params:
        if prm.kind is prm.KEYWORD_ONLY and not star_done:
            parts.append("*")
            star_done = True
        text = prm.name
        if prm.kind is prm.VAR_POSITIONAL:
            text, star_done = "*" + text, True
        elif prm.kind is prm.VAR_KEYWORD:
            text = "**" + text
        if prm.annotation is not prm.empty:
            text += f": {_annotation(prm.annotation)}"
        if prm.default is not prm.empty:
            text += f" = {prm.default!r}"
        parts.append(text)
    ret = f" -> {_annotation(sig.return_annotation)}" if sig.return_annotation is not sig.empty else ""
    return f"({', '.join(parts)}){ret}"


def _doc(obj: Any) -> str:
    """The object's own docstring (a class's is never inherited: ABC's says nothing here)."""
    raw = obj.__dict__.get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    text = inspect.cleandoc(raw) if isinstance(raw, str) else ""
    return re.sub(r":\w+:`~?(?:[\w.]*\.)?(\w+)`", r"`\1`", text)  # Sphinx roles: plain code


def _fields(cls: type) -> list[str]:
    """A dataclass's fields, with short defaults (long ones are in the code)."""
    out = []
    for f in dataclasses.fields(cls):
        text = f"{f.name}: {_annotation(f.type)}"
        if f.default is not dataclasses.MISSING and len(repr(f.default)) <= 40:
            text += f" = {f.default!r}"
        out.append(f"`{text}`")
    return out


def _class_md(name: str, cls: type) -> list[str]:
    out = [f"### {name}\n"]
    bases = [b.__name__ for b in cls.__bases__ if b is not object and b.__name__ != "ABC"]
    if bases:
        out.append(f"Subclass of {', '.join(f'`{b}`' for b in bases)}.\n")
    doc = _doc(cls)
    if doc and not (dataclasses.is_dataclass(cls) and doc.startswith(f"{cls.__name__}(")):
        out.append(doc + "\n")
    if dataclasses.is_dataclass(cls):
        out.append("Fields: " + ", ".join(_fields(cls)) + ".\n")
    for mname, value in cls.__dict__.items():
        if mname.startswith("_"):
            continue
        if isinstance(value, property):
            out.append(f"- `{mname}` (property)" + (f": {_doc(value)}" if _doc(value) else ""))
            continue
        fn = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
        if not inspect.isfunction(fn):
            continue
        prefix = "async " if inspect.iscoroutinefunction(fn) else ""
        kind = "classmethod " if isinstance(value, classmethod) else ""
        sig = _signature(fn, skip_self=not isinstance(value, staticmethod))
        text = _doc(fn)
        out.append(f"- `{kind}{prefix}{mname}{sig}`" + (f"\n\n    {_indent(text)}\n" if text else ""))
    out.append("")
    return out


def _indent(text: str) -> str:
    return text.replace("\n", "\n    ")


# The order a reader needs them in; anything else exported follows.
PYTHON_ORDER = (
    "run",
    "Sandbox",
    "Process",
    "Files",
    "AsyncSandbox",
    "PolicySpec",
    "build",
    "Policy",
    "Result",
    "SandboxInfo",
    "ProcessInfo",
    "FileInfo",
    "Transport",
    "LocalTransport",
)


def python_api_md() -> str:
    import warren
    from warren.client.sandbox import Files

    out: list[str] = []
    errors: list[str] = []
    for name in dict.fromkeys([*PYTHON_ORDER, *warren.__all__]):
        obj = Files if name == "Files" else getattr(warren, name)
        if inspect.isclass(obj) and issubclass(obj, Exception):
            errors.append(name)
        elif inspect.isclass(obj):
            out.extend(_class_md(name, obj))
        else:
            out.append(f"### {name}\n\n`warren.{name}{_signature(obj, skip_self=False)}`\n\n{_doc(obj)}\n")
    out.append("### Exceptions\n")
    out.append(
        "Every error is a `WarrenError` with `.operation`, `.path`, `.errno` and `.hint`.\n\n"
        "| exception | subclass of | CLI exit code | meaning |\n| --- | --- | --- | --- |"
    )
    for name in errors:
        cls = getattr(warren, name)
        base = cls.__bases__[0].__name__
        code = getattr(cls, "exit_code", "")
        first = _doc(cls).split("\n\n")[0]
        out.append(f"| `{name}` | `{base}` | {code} | {_cell(first)} |")
    return "\n".join(out) + "\n"


# --- MCP tools -----------------------------------------------------------------------------


def mcp_tools() -> list[Any]:
    from warren.mcp.server import build

    server = build(None, None, "/")  # type: ignore[arg-type]  # listing tools calls no transport
    return list(asyncio.run(server.list_tools()))


def mcp_tools_md() -> str:
    from warren.mcp.sdk import input_schema

    out: list[str] = []
    for tool in mcp_tools():
        out.append(f"### {tool.name}\n")
        out.append(inspect.cleandoc(tool.description or "") + "\n")
        schema = input_schema(tool)
        props = schema.get("properties", {})
        required = set(schema.get("required", ()))
        if props:
            out.append("| argument | type | default | description |\n| --- | --- | --- | --- |")
            for pname, sub in props.items():
                kinds = sub.get("anyOf") or [sub]
                kind = " or ".join(_schema_text(k) for k in kinds)
                default = "required" if pname in required else f"`{sub.get('default')!r}`".replace("'", '"')
                out.append(f"| `{pname}` | {_cell(kind)} | {default} | {_cell(sub.get('description', ''))} |")
            out.append("")
        else:
            out.append("No arguments.\n")
    return "\n".join(out)


GENERATORS: dict[str, Callable[[], str]] = {
    "policy-keys": policy_keys_md,
    "policy-flags": policy_flags_md,
    "cli": cli_md,
    "http-api": http_api_md,
    "python-api": python_api_md,
    "mcp-tools": mcp_tools_md,
}


def fill(markdown: str) -> str:
    """``markdown`` with each block's text made again from the code."""

    def replace(m: re.Match[str]) -> str:
        name = m.group(1)
        gen = GENERATORS.get(name)
        if gen is None:
            raise RuntimeError(f"unknown block {name!r}; known: {', '.join(GENERATORS)}")
        return f"<!-- warren:{name} -->\n\n{gen().strip()}\n\n<!-- /warren:{name} -->"

    return BLOCK.sub(replace, markdown)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return fill(markdown)


def main(argv: list[str]) -> int:
    """Write the generated text into the pages (``--check``: only say which are stale)."""
    check = argv[1:] == ["--check"]
    stale = []
    for page in sorted((Path(__file__).resolve().parents[1] / "reference").glob("*.md")):
        text = page.read_text()
        new = fill(text)
        if new != text:
            stale.append(page)
            if not check:
                page.write_text(new)
    for page in stale:
        print(f"{page}: {'stale' if check else 'written'}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
