"""``warren sandboxd``: the agent-sandbox sandboxd contract, driven by the real
``k8s-agent-sandbox`` SDK (its ``Sandbox`` class for commands and files, its generated
``process.v1`` stubs for streaming, stdin, signals and the PTY) against one local daemon
per module. There is no cluster here: the SDK's Kubernetes lookups are answered by a
stand-in that reports the pod at 127.0.0.1, so its in-cluster pod-IP mode talks to the
daemon exactly as it would in a pod. Every refusal is judged on the host (a file not
created, a token not printed), each beside a control showing the test would see it."""

from __future__ import annotations

import os
import queue
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("k8s_agent_sandbox")
grpc = pytest.importorskip("grpc")
import httpx  # noqa: E402
import yaml  # noqa: E402
from google.protobuf import empty_pb2  # noqa: E402
from k8s_agent_sandbox.commands._process_stubs import process_pb2 as pb  # noqa: E402
from k8s_agent_sandbox.commands._process_stubs import process_pb2_grpc as pb_grpc  # noqa: E402
from k8s_agent_sandbox.exceptions import SandboxRequestError  # noqa: E402
from k8s_agent_sandbox.models import SandboxdInClusterConnectionConfig  # noqa: E402
from k8s_agent_sandbox.sandbox import Sandbox as SdkSandbox  # noqa: E402

from conftest import module_state  # noqa: E402
from warren.client.sandbox import Sandbox as WarrenSandbox  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TOKEN = f"SA-TOKEN-{secrets.token_hex(8)}"


class LocalPod:
    """The SDK's Kubernetes helper, answering as the API server would for a Sandbox
    whose pod is on this machine's loopback."""

    def get_sandbox(self, name: str, namespace: str) -> dict[str, Any]:
        return {"status": {"podIPs": [{"ip": "127.0.0.1"}]}}


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    tmp: Path
    outside: Path  # in HOME: a sandbox's /tmp is its own, so a file there is no test
    workspace: Path
    grpc_port: int
    rest_port: int
    sdk: SdkSandbox
    stub: Any
    http: httpx.Client


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from module_state(tmp_path_factory)


@pytest.fixture(scope="module")
def daemon(state: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("sandboxd")
    workspace = tmp / "workspace"
    workspace.mkdir()
    outside = Path.home() / f".warren-test-sandboxd-{os.getpid()}"
    outside.mkdir()
    (outside / "outside.txt").write_text("keep me outside\n")
    # Stand-in for /var/run/secrets/kubernetes.io/serviceaccount: a token outside the
    # workspace, denied by the policy flag a pod's manifest would pass for a place of its own.
    (outside / "secrets").mkdir()
    (outside / "secrets" / "token").write_text(TOKEN + "\n")
    env = {**os.environ, "SANDBOX_ID": "sb-test", "SANDBOX_API_TOKEN": TOKEN}
    env.pop("SANDBOXD_GRPC_ADDR", None)
    log = tmp / "sandboxd.log"
    args = [sys.executable, "-m", "warren", "sandboxd", "--workspace", str(workspace)]
    args += ["--deny", str(outside / "secrets"), "--grpc-addr", "127.0.0.1:0", "--rest-addr", "127.0.0.1:0"]
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=out, env=env, cwd=tmp)
    deadline = time.monotonic() + 60
    while not (found := re.search(r"grpc 127\.0\.0\.1:(\d+) rest 127\.0\.0\.1:(\d+)", log.read_text())):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"warren sandboxd did not start: {log.read_text()}")
        time.sleep(0.02)
    grpc_port, rest_port = int(found.group(1)), int(found.group(2))
    config = SandboxdInClusterConnectionConfig(
        mode="in-cluster-pod-ip", rest_port=rest_port, grpc_port=grpc_port
    )
    sdk = SdkSandbox("claim", "sb-test", connection_config=config, k8s_helper=LocalPod())  # type: ignore[arg-type]
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    http = httpx.Client(base_url=f"http://127.0.0.1:{rest_port}", timeout=30)
    try:
        yield Daemon(
            proc,
            tmp,
            outside,
            workspace,
            grpc_port,
            rest_port,
            sdk,
            pb_grpc.ProcessServiceStub(channel),
            http,
        )
    finally:
        http.close()
        channel.close()
        sdk.close_connection()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        shutil.rmtree(outside)
        # A SIGTERM (the kubelet's stop) ends it cleanly and takes its sandbox along.
        assert code == 0, log.read_text()
        assert not [s for s in WarrenSandbox.list() if s.name.startswith("sandboxd-")]


def config(*argv: str, **kw: Any) -> Any:
    return pb.ProcessConfig(command=list(argv), **kw)


class Stream:
    """A ``Start`` call read on a thread: its events as they come."""

    def __init__(self, stub: Any, request: Any) -> None:
        self.call = stub.Start(request, timeout=60)
        self.events: queue.Queue[Any] = queue.Queue()
        self.out = b""
        threading.Thread(target=self._read, daemon=True).start()
        first = self.events.get(timeout=30)
        assert first.WhichOneof("event") == "init", first
        self.pid = first.init.process_id

    def _read(self) -> None:
        try:
            for event in self.call:
                self.events.put(event)
        except grpc.RpcError as e:
            self.events.put(e)

    def until(self, text: bytes, timeout: float = 30) -> bytes:
        """Stdout so far, once it holds ``text`` (stderr goes to ``self.err``)."""
        deadline = time.monotonic() + timeout
        while text not in self.out:
            event = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            assert not isinstance(event, Exception), event
            kind = event.WhichOneof("event")
            assert kind != "exit", f"ended ({event.exit.exit_code}) before {text!r}: {self.out!r}"
            if kind == "stdout":
                self.out += event.stdout
        return self.out

    def exit_code(self, timeout: float = 30) -> tuple[int, bytes, bytes]:
        err = b""
        while True:
            event = self.events.get(timeout=timeout)
            assert not isinstance(event, Exception), event
            kind = event.WhichOneof("event")
            if kind == "exit":
                return event.exit.exit_code, self.out, err
            if kind == "stdout":
                self.out += event.stdout
            elif kind == "stderr":
                err += event.stderr


def code_of(call: Any) -> Any:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


# --- ProcessService ---------------------------------------------------------------------


def test_execute_returns_stdout_stderr_and_exit_code(daemon: Daemon) -> None:
    assert daemon.sdk.commands is not None
    result = daemon.sdk.commands.run("echo out; echo err >&2; exit 3")
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 3)
    (daemon.workspace / "sub").mkdir(exist_ok=True)
    result = daemon.sdk.commands.run('pwd; echo "$FOO"; id -u', env={"FOO": "bar"}, cwd="sub")
    assert result.stdout.splitlines() == [str(daemon.workspace / "sub"), "bar", str(os.getuid())]


def test_execute_with_a_cwd_out_of_the_workspace_is_permission_denied(daemon: Daemon) -> None:
    for cwd in ("..", str(daemon.tmp)):
        request = pb.ExecuteRequest(config=config("pwd", cwd=cwd))
        assert (
            code_of(lambda r=request: daemon.stub.Execute(r, timeout=30)) == grpc.StatusCode.PERMISSION_DENIED
        )
    empty = pb.ExecuteRequest(config=config())
    assert code_of(lambda: daemon.stub.Execute(empty, timeout=30)) == grpc.StatusCode.INVALID_ARGUMENT


def test_start_streams_output_and_takes_stdin_then_eof(daemon: Daemon) -> None:
    script = 'echo ready; while read line; do echo "got:$line"; done; echo eof-seen; echo bye >&2'
    stream = Stream(daemon.stub, pb.StartRequest(config=config("/bin/sh", "-c", script)))
    stream.until(b"ready\n")  # streamed before the process has ended
    daemon.stub.WriteStdin(pb.WriteStdinRequest(process_id=stream.pid, input=b"hello\n"), timeout=30)
    stream.until(b"got:hello\n")
    daemon.stub.WriteStdin(pb.WriteStdinRequest(process_id=stream.pid, eof=empty_pb2.Empty()), timeout=30)
    code, out, err = stream.exit_code()
    assert (code, err) == (0, b"bye\n")
    assert out == b"ready\ngot:hello\neof-seen\n"


def test_a_signal_ends_a_sleeping_process_and_its_id_is_then_unknown(daemon: Daemon) -> None:
    stream = Stream(daemon.stub, pb.StartRequest(config=config("sleep", "300")))
    unspecified = pb.SendSignalRequest(process_id=stream.pid, signal=pb.SIGNAL_UNSPECIFIED)
    assert (
        code_of(lambda: daemon.stub.SendSignal(unspecified, timeout=30)) == grpc.StatusCode.INVALID_ARGUMENT
    )
    started = time.monotonic()
    daemon.stub.SendSignal(pb.SendSignalRequest(process_id=stream.pid, signal=pb.SIGNAL_SIGTERM), timeout=30)
    code, _, _ = stream.exit_code()
    assert code == -1 and time.monotonic() - started < 20  # the contract's code for "ended by a signal"
    again = pb.SendSignalRequest(process_id=stream.pid, signal=pb.SIGNAL_SIGKILL)
    assert code_of(lambda: daemon.stub.SendSignal(again, timeout=30)) == grpc.StatusCode.NOT_FOUND


def test_a_dropped_stream_takes_its_process_and_a_deadline_ends_an_execute(daemon: Daemon) -> None:
    [box] = [s for s in WarrenSandbox.list() if s.name.startswith("sandboxd-")]
    marker = secrets.token_hex(6)
    stream = Stream(daemon.stub, pb.StartRequest(config=config("/bin/sh", "-c", f"sleep 300; : {marker}")))

    def sleeping() -> bool:
        return any(marker in " ".join(p.argv) for p in WarrenSandbox(box).processes())

    assert sleeping()  # control: the process runs while its stream is open
    stream.call.cancel()
    deadline = time.monotonic() + 20
    while sleeping():
        assert time.monotonic() < deadline, "the process outlived its stream"
        time.sleep(0.05)
    assert daemon.sdk.commands is not None
    result = daemon.sdk.commands.run("sleep 30", command_timeout=1)
    assert result.timed_out and result.exit_code == 124


def test_long_executes_at_once_leave_the_daemon_answering(daemon: Daemon) -> None:
    """More long commands than a default thread pool holds (6 on 2 cores): they run side
    by side and health keeps answering meanwhile."""
    request = pb.ExecuteRequest(config=config("sleep", "3"))
    started = time.monotonic()
    futures = [daemon.stub.Execute.future(request, timeout=60) for _ in range(12)]
    time.sleep(0.3)  # the calls in flight (nothing to wait on from here)
    assert daemon.http.get("/v1/health", timeout=1.5).status_code == 200  # not after a sleep ends
    assert [f.result().exit_code for f in futures] == [0] * 12
    assert time.monotonic() - started < 10


def test_pty_start_sizes_the_terminal_and_resize_changes_it(daemon: Daemon) -> None:
    script = "tty; stty size; read x; stty size"
    request = pb.StartRequest(config=config("/bin/sh", "-c", script), pty=pb.PTY(cols=100, rows=30))
    stream = Stream(daemon.stub, request)
    out = stream.until(b"30 100")
    assert b"/dev/pts/" in out
    daemon.stub.ResizeTTY(pb.ResizeTTYRequest(process_id=stream.pid, cols=120, rows=40), timeout=30)
    daemon.stub.WriteStdin(pb.WriteStdinRequest(process_id=stream.pid, input=b"\n"), timeout=30)
    stream.until(b"40 120")
    assert stream.exit_code()[0] == 0
    script = 'trap "echo got-int; exit 7" INT; echo ready; while :; do sleep 0.1; done'
    request = pb.StartRequest(config=config("/bin/sh", "-c", script), pty=pb.PTY(cols=80, rows=24))
    ctrl_c = Stream(daemon.stub, request)
    ctrl_c.until(b"ready")
    daemon.stub.SendSignal(pb.SendSignalRequest(process_id=ctrl_c.pid, signal=pb.SIGNAL_SIGINT), timeout=30)
    ctrl_c.until(b"got-int")
    assert ctrl_c.exit_code()[0] == 7  # the command's own handler ran: the signal reached it
    plain = Stream(daemon.stub, pb.StartRequest(config=config("sleep", "300")))
    resize = pb.ResizeTTYRequest(process_id=plain.pid, cols=10, rows=10)
    assert code_of(lambda: daemon.stub.ResizeTTY(resize, timeout=30)) == grpc.StatusCode.FAILED_PRECONDITION
    daemon.stub.SendSignal(pb.SendSignalRequest(process_id=plain.pid, signal=pb.SIGNAL_SIGKILL), timeout=30)
    assert plain.exit_code()[0] == -1


# --- files ------------------------------------------------------------------------------


def test_files_put_get_head_list_delete_round_trip(daemon: Daemon) -> None:
    files = daemon.sdk.files
    assert files is not None
    files.write("dir/nested/a.txt", b"first\n")
    files.write("dir/nested/a.txt", b"second\x00bytes\n")  # replaced whole
    assert files.read("dir/nested/a.txt") == b"second\x00bytes\n"
    assert (daemon.workspace / "dir/nested/a.txt").read_bytes() == b"second\x00bytes\n"
    assert files.exists("dir/nested/a.txt") and not files.exists("dir/nope")
    [entry] = files.list("dir/nested")
    assert (entry.name, entry.size, entry.type) == ("a.txt", 13, "file")
    head = daemon.http.head("/v1/files/dir%2Fnested%2Fa.txt")
    assert (head.status_code, head.headers["content-length"]) == (200, "13")
    assert daemon.http.put("/v1/files/run.sh?mode=0755", content=b"#!/bin/sh\n").status_code == 204
    assert (daemon.workspace / "run.sh").stat().st_mode & 0o111
    form = daemon.http.put("/v1/files/form.txt", files={"file": ("x", b"from a form\n")})
    assert form.status_code == 204 and (daemon.workspace / "form.txt").read_bytes() == b"from a form\n"
    refused = daemon.http.delete("/v1/files/dir")
    assert (refused.status_code, refused.json()["code"]) == (409, "CONFLICT")
    files.delete("dir", recursive=True)
    assert not (daemon.workspace / "dir").exists() and not files.exists("dir")
    missing = daemon.http.get("/v1/files/dir")
    assert (missing.status_code, missing.json()["code"]) == (404, "NOT_FOUND")
    bad = daemon.http.put("/v1/files/x?mode=999", content=b"")
    assert (bad.status_code, bad.json()["code"]) == (400, "INVALID_ARGUMENT")


def test_traversal_and_absolute_paths_out_are_refused_and_nothing_is_written_outside(daemon: Daemon) -> None:
    files = daemon.sdk.files
    assert files is not None
    files.write("control.txt", b"in\n")  # control: a write this test can see land
    assert (daemon.workspace / "control.txt").read_bytes() == b"in\n"
    for path in ("../evil.txt", "sub/../../evil.txt", str(daemon.outside / "evil.txt")):
        put = daemon.http.put(f"/v1/files/{path.replace('/', '%2F')}", content=b"owned\n")
        assert (put.status_code, put.json()["code"]) == (403, "PERMISSION_DENIED"), path
        get = daemon.http.get(f"/v1/files/{path.replace('/', '%2F').replace('evil', 'outside')}")
        # (../outside.txt is pytest's directory here; the absolute one is the real outside file)
        assert get.status_code == 403 and b"keep me" not in get.content
    with pytest.raises(SandboxRequestError) as refused:
        files.write("../evil.txt", b"owned\n", allow_unsafe_paths=True)
    assert refused.value.status_code == 403
    assert not (daemon.tmp / "evil.txt").exists() and not (daemon.outside / "evil.txt").exists()
    assert (daemon.outside / "outside.txt").read_text() == "keep me outside\n"


def test_a_symlink_out_of_the_workspace_is_refused_and_one_inside_is_followed(daemon: Daemon) -> None:
    assert daemon.sdk.commands is not None
    outside = daemon.outside / "outside.txt"
    (daemon.workspace / "inner").mkdir(exist_ok=True)
    (daemon.workspace / "to-file").symlink_to(outside)
    (daemon.workspace / "to-dir").symlink_to("..")
    (daemon.workspace / "to-inner").symlink_to("inner")
    # Control: the sandbox itself can read the file, so a refusal is the confinement's.
    assert "keep me" in daemon.sdk.commands.run(f"cat {outside}").stdout
    got = daemon.http.get("/v1/files/to-file")
    assert (got.status_code, got.json()["code"]) == (
        403,
        "PERMISSION_DENIED",
    ) and b"keep me" not in got.content
    put = daemon.http.put("/v1/files/to-dir%2Fplanted.txt", content=b"owned\n")
    assert put.status_code == 403 and not (daemon.tmp / "planted.txt").exists()
    assert daemon.http.put("/v1/files/to-inner%2Fok.txt", content=b"ok\n").status_code == 204
    assert (daemon.workspace / "inner" / "ok.txt").read_bytes() == b"ok\n"
    names = {e["name"] for e in daemon.http.get("/v1/files/").json()["entries"]}
    assert "to-inner" in names and not names & {"to-file", "to-dir"}


# --- what a command cannot reach -------------------------------------------------------


def test_a_command_cannot_read_the_service_account_token(daemon: Daemon) -> None:
    assert daemon.sdk.commands is not None
    token = daemon.outside / "secrets" / "token"
    result = daemon.sdk.commands.run(f"cat {token}; ls {token.parent}; env")
    assert TOKEN not in result.stdout + result.stderr
    control = daemon.sdk.commands.run(f"cat {daemon.outside / 'outside.txt'}")
    assert control.stdout == "keep me outside\n"  # the same kind of read outside works
    (daemon.workspace / "token-link").symlink_to(token)
    assert daemon.http.get("/v1/files/token-link").status_code == 403
    metadata = daemon.http.get("/v1/metadata").json()["env"]
    assert metadata.get("SANDBOX_ID") == "sb-test" and "SANDBOX_API_TOKEN" not in metadata
    if os.getuid() == 0:  # the real place, hidden with /var/run from every sandbox by default
        place = Path("/run/secrets/kubernetes.io/serviceaccount")
        made = not Path("/run/secrets").exists()
        if made:
            place.mkdir(parents=True)
            (place / "token").write_text(TOKEN + "\n")
            try:
                assert (place / "token").read_text().strip() == TOKEN  # control: there on the host
                result = daemon.sdk.commands.run(
                    f"cat {place}/token /var/run/secrets/kubernetes.io/serviceaccount/token"
                )
                assert result.exit_code != 0 and TOKEN not in result.stdout + result.stderr
            finally:
                (place / "token").unlink()
                for d in (place, place.parent, place.parent.parent):
                    d.rmdir()


def test_a_command_cannot_reach_the_daemon_listeners(daemon: Daemon) -> None:
    assert daemon.sdk.commands is not None
    with socket.create_connection(("127.0.0.1", daemon.rest_port), timeout=5):
        pass  # control: reachable from the pod
    probe = (
        "import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 3); print('reached')"
    )
    for port in (daemon.rest_port, daemon.grpc_port):
        result = daemon.sdk.commands.run(f'python3 -c "{probe}" {port}')
        assert result.exit_code != 0 and "reached" not in result.stdout


def test_health_answers_ok(daemon: Daemon) -> None:
    health = daemon.http.get("/v1/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"


def test_a_bad_address_is_one_line_not_a_traceback() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "warren", "sandboxd", "--grpc-addr", "nowhere"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 125 and "Traceback" not in result.stderr
    assert "gRPC address 'nowhere' is not HOST:PORT" in result.stderr


# --- the Kubernetes files ---------------------------------------------------------------


def test_kubernetes_manifests_parse_and_the_containerfile_installs_this_wheel() -> None:
    deploy = ROOT / "deploy" / "kubernetes"
    docs = [d for f in sorted(deploy.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text())]
    template = next(d for d in docs if d["kind"] == "SandboxTemplate")
    assert template["apiVersion"] == "extensions.agents.x-k8s.io/v1beta1"
    pod = template["spec"]["podTemplate"]["spec"]
    assert pod["automountServiceAccountToken"] is False and pod["hostUsers"] is False
    [container] = pod["containers"]
    assert {p["containerPort"] for p in container["ports"]} == {8080, 9090}
    assert container["readinessProbe"]["httpGet"]["path"] == "/v1/health"
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    containerfile = (deploy / "Containerfile").read_text()
    assert f"warren-{version}-py3-none-any.whl" in containerfile
    assert "[sandboxd]" in containerfile and 'warren", "sandboxd"' in containerfile
