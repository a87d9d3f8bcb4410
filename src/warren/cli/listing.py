"""How every listing of the CLI prints, as docker and kubectl users expect: a table with
a header by default, ``-q`` for the names alone (one per line, for ``xargs``),
``--format json`` (or the older ``--json``) for one JSON array, ``--format table`` for the
default, and ``--format '{{.Name}} {{.State}}'`` for a line per item from a template
(Go-template field names, ``{{.Name}}`` or ``{{.name}}``; ``{{json .}}`` is the item).

A listing gives rows as mappings of plain values and the table's columns; nothing here
knows what a sandbox or a process is."""

from __future__ import annotations

import argparse
import json
import re

from ..errors import PolicyError
from ..terminal import printable

TYPE_CHECKING = False  # not typing's: `warren ls` is on a fast path (cli.ls); mypy knows the name
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

    Row = Mapping[str, Any]

_FIELD = re.compile(r"\{\{\s*(json\s+\.|\.[A-Za-z_][A-Za-z0-9_]*|\.)\s*\}\}")


class Column:
    """A table's column: its title, the cell of each row, a least width (0: as wide as
    its widest cell) and whether it is aligned right. A plain class: importing
    ``dataclasses`` costs `warren ls` milliseconds."""

    __slots__ = ("cell", "right", "title", "width")

    def __init__(self, title: str, cell: Callable[[Row], str], width: int = 0, right: bool = False) -> None:
        self.title = title
        self.cell = cell
        self.width = width
        self.right = right


def add_flags(p: argparse.ArgumentParser, key: str = "name", json_flag: bool = True) -> None:
    """-q, --format and (unless the command has its own) --json."""
    p.add_argument("-q", "--quiet", action="store_true", help=f"only each item's {key}, one per line")
    p.add_argument(
        "--format",
        metavar="FORMAT",
        help="table (the default), json, or a template such as '{{.Name}} {{.State}}'",
    )
    if json_flag:
        p.add_argument("--json", action="store_true", help="the same as --format json")


def emit(ns: argparse.Namespace, rows: Sequence[Row], columns: Sequence[Column], key: str = "name") -> None:
    fmt = "json" if ns.json else (ns.format or "table")
    if ns.quiet:
        for row in rows:
            print(row[key])
    elif fmt == "json":
        print(json.dumps(list(rows), indent=2, default=str))
    elif fmt == "table":
        print_table(rows, columns)
    else:
        template = fmt.replace("\\t", "\t").replace("\\n", "\n")
        _check(template)
        for row in rows:
            print(_fill(template, row))


def print_table(rows: Sequence[Row], columns: Sequence[Column]) -> None:
    # A cell can hold what a sandbox chose (a command line, an image's source): each is
    # one inert line on the terminal, whatever control characters it carries.
    cells = [[printable(c.cell(row)) for c in columns] for row in rows]
    widths = [max([c.width, len(c.title), *(len(line[i]) for line in cells)]) for i, c in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if c.right else v.ljust(w) for v, w, c in zip(values, widths, columns, strict=True)
        ]
        return "  ".join(parts).rstrip()

    print(line([c.title for c in columns]))
    for values in cells:
        print(line(values))


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def _check(template: str) -> None:
    if "{{" not in template:
        raise PolicyError(
            f"--format {template!r} is neither table, json nor a template",
            operation="cli",
            hint="use --format table, --format json, or a template such as '{{.Name}}\\t{{.State}}'",
        )


def _fill(template: str, row: Row) -> str:
    def value(match: re.Match[str]) -> str:
        ref = match.group(1)
        if ref == "." or ref.startswith("json"):
            return json.dumps(dict(row), default=str)
        name = _snake(ref[1:])
        if name not in row:
            raise PolicyError(
                f"--format names {ref}, which items here do not have",
                operation="cli",
                hint="fields: " + ", ".join("." + k for k in row),
            )
        got = row[name]
        return json.dumps(got) if isinstance(got, (dict, list)) else "" if got is None else str(got)

    return _FIELD.sub(value, template)
