"""``warren events NAME [-f] [--json] [--otlp URL]``: a sandbox's trail (commands, file
operations, signals, network decisions, policy changes), as lines for a person, as JSON
records, or exported to an OpenTelemetry collector."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable

from ..client.local import LocalTransport
from ..client.transport import trail_of
from ..names import check_name
from . import flags


def events(args: list[str]) -> int:
    p = flags.parser(
        "warren events",
        "Show sandbox NAME's trail: every command asked of it (who asked, argv, cwd, how it "
        "ended), file operation through the API, signal, and network decision, oldest first; "
        "-f follows it until the sandbox ends.",
    )
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new events until NAME ends")
    p.add_argument("--json", action="store_true", help="one JSON record per line, as the trail holds it")
    p.add_argument(
        "--otlp",
        metavar="URL",
        help="also send them to an OpenTelemetry collector over OTLP/HTTP (e.g. "
        "http://127.0.0.1:4318): a span per command, its network events as span events "
        "(needs the otel extra: pip install 'warren-sandbox[otel]')",
    )
    p.add_argument("name")
    ns = p.parse_args(args)
    name = check_name(ns.name)
    records = trail_of(LocalTransport(), name, follow=ns.follow)
    if ns.otlp is not None:
        from ..client import otlp

        exporter = otlp.Exporter(ns.otlp, name)
        try:
            _print(exporter.passing(records), ns.json)
        finally:
            exporter.close()
        return 0
    _print(records, ns.json)
    return 0


def _print(records: Iterable[dict[str, object]], as_json: bool) -> None:
    for record in records:
        print(json.dumps(record, separators=(",", ":")) if as_json else line(record), flush=True)


def _clean(value: object) -> str:
    """Text from the trail for a terminal: host names and paths may come from the
    sandbox, so no control character of theirs reaches it."""
    text = str(value)
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _who(r: dict[str, object]) -> str:
    return f"[{_clean(r.get('origin', '?'))}, pid {_clean(r.get('peer_pid', '?'))}]"


def line(r: dict[str, object]) -> str:
    """One record as one line for a person."""
    kind = str(r.get("kind", "?"))
    head = f"{_clean(r.get('time', ''))} {_clean(kind):<8}"
    if kind in ("exec", "spawn"):
        argv = r.get("argv")
        cmd = shlex.join(str(a) for a in argv) if isinstance(argv, list) else "?"
        cwd = f" (in {_clean(r['cwd'])})" if r.get("cwd") else ""
        return f"{head} {_clean(r.get('id', ''))} {_who(r)} $ {_clean(cmd)}{cwd}"
    if kind == "exec.end":
        if r.get("timed_out"):
            how = "timed out"
        elif r.get("signal") is not None:
            how = f"killed by signal {_clean(r['signal'])}"
        elif r.get("exit") is not None:
            how = f"exit {_clean(r['exit'])}"
        else:
            how = _clean(r.get("note", "ended"))
        limit = f", {_clean(r['limit'])}" if r.get("limit") else ""
        return f"{head} {_clean(r.get('id', ''))} {how}{limit} after {_clean(r.get('duration', '?'))} s"
    if kind == "file":
        dst = f" -> {_clean(r['dst'])}" if r.get("dst") else ""
        return f"{head} {_clean(r.get('op', '?'))} {_clean(r.get('path', ''))}{dst} {_who(r)}"
    if kind == "signal":
        return f"{head} signal {_clean(r.get('signal'))} to pid {_clean(r.get('pid'))} {_who(r)}"
    if kind == "net":
        verdict = "allowed" if r.get("allowed") else "REFUSED"
        target = f"{_clean(r.get('method', ''))} {_clean(r.get('host', ''))}:{_clean(r.get('port', ''))}"
        return f"{head} {verdict} {target}: {_clean(r.get('reason', ''))}"
    if kind == "policy":
        by = f" by {_clean(r['by'])}" if r.get("by") else ""
        change = f"{_clean(r.get('method', ''))} {_clean(r.get('host', ''))}{by}"
        return f"{head} {change}: {_clean(r.get('reason', ''))}"
    if kind == "pending":
        target = f"{_clean(r.get('method', ''))} {_clean(r.get('host', ''))}:{_clean(r.get('port', ''))}"
        return f"{head} request {_clean(r.get('request', '?'))} waits: {target}"
    if kind == "end":
        return f"{head} the sandbox ended"
    if kind == "lost":
        return f"{head} {_clean(r.get('count', '?'))} records lost (the state disk was full)"
    rest = {k: v for k, v in r.items() if k not in ("time", "kind")}
    return f"{head} {_clean(json.dumps(rest, separators=(',', ':')))}"


COMMANDS = {"events": events}
