"""One schema per value: the models own the fields, and the protocol's mirrors, the
HTTP codec and the OpenAPI document agree with them; the client's layer stays above
the server's. Pure checks: no sandbox, no privileges."""

from __future__ import annotations

import ast
import dataclasses
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from warren import codec, protocol
from warren.models import FileInfo, FileOp, ProcessInfo, ProcessState, Result, SandboxInfo, SpawnInfo, Stats
from warren.net.allowlist import NetEvent
from warren.service import fields
from warren.service.openapi import SCHEMAS, document

SRC = Path(__file__).resolve().parent.parent / "src" / "warren"

EVENT = NetEvent(
    time="2026-01-01T00:00:00Z",
    sandbox="sb",
    method="CONNECT",
    host="pypi.org",
    port=443,
    allowed=True,
    reason="ok",
)
VALUES: list[object] = [
    SandboxInfo(
        name="sb",
        id="abc",
        state="running",
        reason="",
        workspace="/w",
        created=1.5,
        warnings=("w",),
        idle_timeout=60.0,
        last_active=2.5,
    ),
    ProcessInfo(pid=2, ppid=1, state="S", argv=("sleep", "9"), spawn_id="p1"),
    FileInfo(name="f", type="file", size=3, mode=0o644, mtime=1.0, uid=0, gid=0),
    Stats(memory=1, pids=2, cpu_time=0.5, source="cgroup", memory_limit=None, pids_limit=64, cpus_limit=0.5),
    EVENT,
    Result(
        exit_code=130,
        stdout=b"text",
        stderr=b"\xff\xfe",
        duration=0.25,
        signal=2,
        warnings=("w",),
        net_log=(EVENT,),
    ),
]

# protocol message -> the model it mirrors (a reply carries the model's fields, and
# maybe a few of its own about the transfer)
MIRRORS: list[tuple[type[protocol.Message], type, set[str]]] = [
    (protocol.SandboxInfo, SandboxInfo, set()),
    (protocol.ProcInfo, ProcessInfo, set()),
    (protocol.FileStat, FileInfo, set()),
    (protocol.Stats, Stats, set()),
    (protocol.NetEventRecord, NetEvent, set()),
    (protocol.ProcessState, ProcessState, {"stdout_len", "stderr_len"}),
    (protocol.SpawnRecord, SpawnInfo, set()),
    # a request, the other way: the model, its sandbox and who asked (for its trail)
    (protocol.FileRequest, FileOp, {"sandbox", "origin"}),
]


@pytest.mark.parametrize(("message", "model", "own"), MIRRORS, ids=lambda x: getattr(x, "__name__", ""))
def test_a_protocol_reply_carries_exactly_its_models_fields(
    message: type[protocol.Message], model: type, own: set[str]
) -> None:
    carried = {name for name, _check, _default in message._fields}
    assert carried - own == {f.name for f in dataclasses.fields(model)}


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_every_model_round_trips_through_the_http_codec(value: object) -> None:
    back = codec.decode(type(value), codec.encode(value))
    if isinstance(value, SandboxInfo):  # pid1 is this host's: never on the HTTP API
        assert "pid1" not in codec.encode(value)
        value = dataclasses.replace(value, pid1=0)
    assert back == value


def test_bytes_that_are_not_utf8_travel_as_base64() -> None:
    out = codec.result(VALUES[-1])  # type: ignore[arg-type]
    assert out["stdout_encoding"] == "utf-8" and out["stderr_encoding"] == "base64"
    assert out["truncated"] is False


@pytest.mark.parametrize(
    ("schema", "value"),
    [
        ("Sandbox", VALUES[0]),
        ("Process", VALUES[1]),
        ("FileInfo", VALUES[2]),
        ("Stats", VALUES[3]),
        ("NetEvent", VALUES[4]),
        ("SpawnRecord", SpawnInfo(spawn_id="p1", pid=3, argv=("sh",), started=1.0, status=256)),
    ],
)
def test_the_openapi_schema_of_a_model_lists_what_the_codec_sends(schema: str, value: object) -> None:
    assert set(SCHEMAS[schema]["properties"]) == set(codec.encode(value))


def test_the_openapi_result_schema_lists_what_the_codec_sends() -> None:
    assert set(SCHEMAS["Result"]["properties"]) == set(codec.result(VALUES[-1]))  # type: ignore[arg-type]


def test_every_request_body_schema_is_the_table_the_handlers_validate_with() -> None:
    doc = document()
    for name, body in fields.BODIES.items():
        schema = doc["components"]["schemas"][name]
        assert set(schema["properties"]) == set(body.fields), name
        assert set(schema.get("required", ())) == set(body.required), name
        assert schema["additionalProperties"] is False, name


def test_a_model_reply_becomes_the_model_with_tuples() -> None:
    msg = protocol.ProcInfo(pid=2, ppid=1, state="S", argv=["sleep", "9"], spawn_id="p1")
    assert codec.model_of(ProcessInfo, msg.to_fields()) == VALUES[1]


def test_one_exit_code_for_a_wait_status() -> None:
    assert protocol.exit_code(3 << 8) == 3
    assert protocol.exit_code(signal.SIGKILL) == 128 + signal.SIGKILL


def test_an_error_record_is_raised_as_its_own_class() -> None:
    from warren.errors import SandboxNotFound

    record = protocol.error_message(SandboxNotFound("no sandbox x", operation="get", hint="see ls")).error
    with pytest.raises(SandboxNotFound, match="no sandbox x"):
        protocol.raise_error(record)


def _imports(path: Path) -> set[str]:
    """The modules a source file imports, as absolute names under ``warren``."""
    package = ".".join(path.relative_to(SRC.parent).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = f"{base}.{node.module}" if base and node.module else (node.module or base)
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_client_imports_neither_the_service_nor_the_server() -> None:
    for path in sorted((SRC / "client").glob("*.py")):
        bad = {m for m in _imports(path) if m.startswith(("warren.service", "warren.server"))}
        assert not bad, f"{path.name} imports {sorted(bad)}"


def test_the_import_walk_resolves_relative_imports() -> None:
    # the check above must be able to fail: a relative import of a sibling package is seen
    assert "warren.names.check_name" in _imports(SRC / "server" / "registry.py")
    assert "warren.statedir" in _imports(SRC / "client" / "connect.py")


def test_the_spec_message_declares_every_key_a_policy_spec_sends() -> None:
    from warren.policy.spec import PolicySpec

    everything = PolicySpec(
        workspace="/w",
        workspace_at="/home/user",
        workspace_link=True,
        write=["/a"],
        read=["/b"],
        deny=["/c"],
        env={"A": "b"},
        env_pass=["HOME"],
        presets=["python"],
        network="allow",
        allow_hosts=["pypi.org"],
        resolve={"pypi.org": "127.0.0.1"},
        default_deny=False,
        workspace_writable=True,
        allow_nested=False,
        allow_broad_workspace=True,
        memory="512M",
        pids=64,
        cpus=0.5,
        tmp_size="1G",
        idle_timeout="10m",
        image="/srv/root",
        disk="4G",
        from_snapshot="0123abcd",
        secrets=["TOKEN=GH_TOKEN@pypi.org"],
        allow_http=["GET pypi.org/simple/"],
        require_namespaces=True,
        review=True,
        ask_timeout="2m",
    )
    assert {f.name for f in dataclasses.fields(PolicySpec)} <= {
        "workspace", "write", "read", "deny", "env", "env_pass", "presets", "network", "allow_hosts",
        "resolve", "default_deny", "workspace_writable", "allow_nested", "allow_broad_workspace",
        "memory", "pids", "cpus", "tmp_size", "idle_timeout", "secrets", "allow_http",
        "require_namespaces", "image", "disk", "from_snapshot", "workspace_at", "workspace_link", "review",
        "ask_timeout",
    }  # fmt: skip
    mapping = everything.to_mapping()
    assert set(mapping) == {name for name, _check, _default in protocol.Spec._fields}
    spec = protocol.Spec.of(mapping)
    request = protocol.RunRequest(
        spec=spec, caller=protocol.Caller(cwd="/", env={}), command=protocol.Command(argv=["x"])
    )
    assert protocol.decode(request.encode()) == request
    assert spec.to_mapping() == mapping


@pytest.mark.parametrize("value", ["512M", 64, 0.5, None])
def test_a_limit_in_a_spec_is_text_or_a_number(value: object) -> None:
    assert protocol.Spec.of({"memory": value}).memory == value


@pytest.mark.parametrize("value", [True, [512], {"a": 1}, "5\x00M"])
def test_a_limit_of_another_type_is_a_protocol_error_naming_it(value: object) -> None:
    from warren.errors import ProtocolError

    with pytest.raises(ProtocolError, match=r"spec\.memory"):
        protocol.Spec.of({"memory": value})


def test_the_local_transport_refuses_a_bad_policy_value_as_a_policy_error() -> None:
    from warren.client.local import _spec
    from warren.errors import PolicyError
    from warren.policy.spec import PolicySpec

    with pytest.raises(PolicyError, match="memory"):
        _spec(PolicySpec(memory=[512]))  # type: ignore[arg-type]


def test_every_described_operation_is_a_route_and_every_route_is_described() -> None:
    from warren.service.openapi import OPS
    from warren.service.routes import ROUTES

    assert set(OPS) == {(path, method) for path, method, _handler in ROUTES}


def _handoff(request: protocol.Message) -> dict[str, object]:
    return protocol.Handoff(request=request, payload=3).to_dict()  # type: ignore[arg-type]


def test_a_handoff_carries_its_request_as_a_declared_message_of_one_of_its_kinds() -> None:
    command = protocol.Command(argv=["true"], env={"A": "b"}, stdio=[False, True, True])
    for request in (
        protocol.ExecRequest(sandbox="sb", command=command),
        protocol.SpawnRequest(sandbox="sb", command=command, stdin=True),
        protocol.SignalRequest(sandbox="sb", pid=7, signal=15),
        protocol.ConnectorRequest(),
    ):
        wire_form = _handoff(request)
        assert wire_form["request"] == {"t": request.TAG, **request.to_fields()}  # no version inside
        back = protocol.from_dict(wire_form, (protocol.Handoff,))
        assert isinstance(back, protocol.Handoff) and back.request == request


@pytest.mark.parametrize(
    ("request_field", "named"),
    [
        ("not an object", r"request must be .*ExecRequest or SpawnRequest.*, not str"),
        ({"sandbox": "sb", "pid": 7, "signal": 15}, r"request is of kind '', not one of 'exec', 'spawn'"),
        ({"t": "stop", "name": "sb"}, r"request is of kind 'stop', not one of"),
        ({"t": "signal", "sandbox": "sb", "pid": "7", "signal": 15}, r"request\.pid must be an integer"),
        ({"t": "signal", "sandbox": "sb", "signal": 15}, r"signal lacks request\.pid"),
        ({"t": "signal", "sandbox": "sb", "pid": 7, "signal": 15, "v": 5}, r"unknown field request\.v"),
        ({"t": "exec", "sandbox": "sb", "command": {"argv": ["tr\x00ue"]}}, r"request\.command\.argv\[0\]"),
    ],
)
def test_a_malformed_message_in_a_union_field_is_refused_naming_the_field(
    request_field: object, named: str
) -> None:
    from warren.errors import ProtocolError

    wire_form = _handoff(protocol.PsRequest(sandbox="sb"))
    assert protocol.from_dict(wire_form, (protocol.Handoff,))  # the control: well formed, it decodes
    wire_form["request"] = request_field
    with pytest.raises(ProtocolError, match=named):
        protocol.from_dict(wire_form, (protocol.Handoff,))


def test_a_nested_message_of_one_class_is_checked_naming_the_field() -> None:
    from warren.errors import ProtocolError

    good = protocol.Error(error=protocol.ErrorRecord(kind="SandboxNotFound", message="gone")).to_dict()
    assert "t" not in good["error"]  # type: ignore[operator]  # an untagged class carries no kind
    assert protocol.from_dict(good) == protocol.from_dict(dict(good))
    for bad, named in (([1], r"error must be a ErrorRecord object, not list"), ({"kind": 3}, r"error\.kind")):
        with pytest.raises(ProtocolError, match=named):
            protocol.from_dict({**good, "error": bad})


def test_a_message_from_a_newer_client_says_how_to_end_the_older_supervisor() -> None:
    """A supervisor still running from before an upgrade cannot read a newer client's
    field: the refusal names the field and says what to do (``warren shutdown``)."""
    import json

    from warren.errors import ProtocolError

    data = json.loads(protocol.ShutdownRequest().encode())
    assert isinstance(protocol.decode(json.dumps(data).encode()), protocol.ShutdownRequest)  # control
    with pytest.raises(ProtocolError) as got:
        protocol.decode(json.dumps({**data, "from_the_future": 1}).encode())
    assert "unknown field" in str(got.value) and "from_the_future" in str(got.value)
    assert "warren shutdown" in (got.value.hint or "")


def test_a_cut_message_is_a_value_error_where_json_was_never_imported() -> None:
    """The protocol's JSON (``jsonc``, without ``json``: a client's start) answers a cut
    line with ValueError, as ``json`` would, not a SystemError: a network event cut off
    by its writer's end reached the CLI as a traceback."""
    code = (
        f"import sys; sys.path.insert(0, {str(SRC.parent)!r})\n"
        "from warren import jsonc\n"
        "assert 'json.decoder' not in sys.modules\n"
        "for text in ('{\"host\":\"x', '\"abc', '{\"a\":', '[1,'):\n"
        "    try:\n"
        "        jsonc.loads(text)\n"
        "    except ValueError:\n"
        "        pass\n"
        "    else:\n"
        "        raise SystemExit(f'{text!r} was taken')\n"
        "assert 'json.decoder' not in sys.modules\n"
    )
    r = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
