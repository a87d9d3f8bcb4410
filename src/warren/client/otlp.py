"""A sandbox's trail as OpenTelemetry traces, sent over OTLP/HTTP to a collector the
user names (``warren events --otlp URL``, ``Exporter``), with the official SDK (the
``otel`` extra: ``opentelemetry-sdk``, ``opentelemetry-exporter-otlp-proto-http``).

A span per command (``exec``), from its start to its end, with its argv, cwd, who asked
and how it ended; the network decisions made while it ran are its span events (by time:
a decision made while two commands ran goes to the later one); everything else (a file
operation, a background process's start, a signal, a decision while no command ran) is
a span of its own, of no duration. The exporter's own settings (headers, certificates,
timeout) are the SDK's ``OTEL_EXPORTER_OTLP_*`` variables.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import urlsplit

from .. import extras
from ..errors import WarrenError

EXTRA = "otel"
TRACES_PATH = "/v1/traces"


def endpoint(url: str) -> str:
    """The collector's traces URL: ``url`` itself when it names a path, else
    ``url/v1/traces`` (as ``OTEL_EXPORTER_OTLP_ENDPOINT`` is read)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WarrenError(
            f"--otlp wants a collector's http:// or https:// URL, got {url!r}",
            operation="otlp",
            path=url,
            hint="for a collector on this machine: --otlp http://127.0.0.1:4318",
        )
    return url if parts.path not in ("", "/") else url.rstrip("/") + TRACES_PATH


def nanos(time: object) -> int:
    """A trail record's time (ISO UTC, to the millisecond) in nanoseconds since the epoch."""
    text = str(time).removesuffix("Z")
    try:
        moment = datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.UTC)
    except ValueError:
        moment = datetime.datetime.now(datetime.UTC)
    return int(moment.timestamp() * 1000) * 1_000_000


def _attrs(record: dict[str, Any], *keys: str) -> dict[str, Any]:
    """``warren.*`` attributes of a record's fields: OTLP takes scalars and lists of one type."""
    out: dict[str, Any] = {}
    for key in keys:
        value = record.get(key)
        if value is None:
            continue
        if isinstance(value, list):
            value = [str(v) for v in value]
        elif not isinstance(value, (str, bool, int, float)):
            value = str(value)
        out[f"warren.{key}"] = value
    return out


class Exporter:
    """Turns trail records into spans as they pass (``passing``) and sends them in
    batches; ``close`` ends what is still open (a command still running when the
    trail was read) and sends the rest."""

    def __init__(self, url: str, sandbox: str) -> None:
        target = endpoint(url)
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.trace import Status, StatusCode
        except ModuleNotFoundError as e:
            raise extras.missing(EXTRA, "exporting a trail over OTLP (--otlp)", e) from None
        self._status, self._code = Status, StatusCode
        resource = Resource.create({"service.name": "warren", "warren.sandbox": sandbox})
        self.provider = TracerProvider(resource=resource)
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=target)))
        self.tracer = self.provider.get_tracer("warren.trail")
        self.sandbox = sandbox
        self.open: dict[str, Any] = {}  # exec id -> its span, until its end comes

    def passing(self, records: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for record in records:
            self.add(record)
            yield record

    def add(self, r: dict[str, Any]) -> None:
        kind = str(r.get("kind", ""))
        at = nanos(r.get("time"))
        if kind == "exec":
            argv = r.get("argv") or ["?"]
            attrs = _attrs(r, "id", "argv", "cwd", "env", "origin", "peer_pid", "uid", "timeout")
            span = self.tracer.start_span(f"exec {argv[0]}", start_time=at, attributes=attrs)
            self.open[str(r.get("id"))] = span
        elif kind == "exec.end":
            span = self.open.pop(str(r.get("id")), None)
            if span is None:
                return  # its start went with a rotation
            span.set_attributes(_attrs(r, "exit", "signal", "timed_out", "limit", "duration", "note"))
            if r.get("exit") != 0:
                span.set_status(self._status(self._code.ERROR, self._ended(r)))
            span.end(end_time=at)
        elif kind == "net" and self.open:
            span = list(self.open.values())[-1]
            attrs = _attrs(r, "method", "host", "port", "allowed", "reason", "address")
            span.add_event("net " + ("allowed" if r.get("allowed") else "refused"), attrs, timestamp=at)
        elif kind == "end":
            for span in self.open.values():
                span.set_attribute("warren.note", "the sandbox ended while it ran")
                span.end(end_time=at)
            self.open.clear()
        else:
            keys = [k for k in r if k not in ("time", "kind")]
            name = f"{kind} {r.get('op') or r.get('host') or ''}".strip()
            span = self.tracer.start_span(name, start_time=at, attributes=_attrs(r, *keys))
            span.end(end_time=at)

    @staticmethod
    def _ended(r: dict[str, Any]) -> str:
        if r.get("timed_out"):
            return "timed out"
        if r.get("signal") is not None:
            return f"killed by signal {r['signal']}"
        if r.get("exit") is not None:
            return f"exit {r['exit']}"
        return str(r.get("note") or "ended without a status")

    def close(self) -> None:
        for span in self.open.values():
            span.set_attribute("warren.note", "still running when the trail was read")
            span.end()
        self.open.clear()
        self.provider.force_flush()
        self.provider.shutdown()
