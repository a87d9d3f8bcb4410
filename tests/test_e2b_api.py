"""The E2B-compatible API: the unmodified ``e2b`` SDK from PyPI drives a real ``warren
serve`` on loopback (``E2B_API_URL`` = ``E2B_SANDBOX_URL`` = the service). What matters is
judged from the host side: the workspace on disk, warren's own ``/v1`` view of the
sandbox, the planted file's bytes. The service runs with a HOME of its own that holds a
planted credential, so the attack tests never touch the real one."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import gzip
import json
import os
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from conftest import make_wheel, run_cli, shut_down_supervisor
from service_util import Serve
from warren.e2b.envd import MAX_FILE
from warren.e2b.records import root_of

e2b = pytest.importorskip("e2b")
from e2b import (  # noqa: E402
    AsyncSandbox,
    AuthenticationException,
    CommandExitException,
    NotFoundException,
    Sandbox,
    SandboxException,
    SandboxQuery,
    TimeoutException,
)

MARKER = "planted-credential-" + secrets.token_hex(8)
HOME = "/home/user"  # where an E2B sandbox sees its workspace (its host path is World.workspace)


def workspace_of(root: Path, sandbox_id: str) -> Path:
    record = json.loads((root / sandbox_id / "record.json").read_text())
    return Path(record["workspace"])


class World:
    def __init__(self, serve: Serve, home: Path, root: Path) -> None:
        self.serve = serve
        self.home = home
        self.root = root
        self.url = serve.url
        assert serve.token is not None
        self.token = serve.token

    def v1(self) -> httpx.Client:
        """warren's own API: the host's view of a sandbox."""
        return self.serve.client()

    def warren_state(self, sandbox_id: str) -> str | None:
        with self.v1() as c:
            r = c.get(f"/v1/sandboxes/{sandbox_id}")
        if r.status_code == 404:
            return None
        assert r.status_code == 200, r.text
        state: str = r.json()["state"]
        return state

    def workspace(self, sandbox_id: str) -> Path:
        """The sandbox's home on the host: a random name in a directory nobody lists,
        named in its record."""
        return workspace_of(self.root, sandbox_id)

    def raw(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    # Below the real home, not in /tmp: a sandbox has a /tmp of its own, where a planted
    # file would be out of sight whatever the policy, and a write would land unseen.
    # the code interpreter's kernel environment: made once per user, kept between runs
    kernel_env = Path.home() / ".cache" / "warren-e2b-kernel"
    home = Path.home() / f".warren-e2b-test-{secrets.token_hex(6)}"
    home.mkdir()
    (home / ".aws").mkdir()
    (home / ".aws" / "credentials").write_text(f"[default]\naws_secret_access_key = {MARKER}\n")
    (home / "notes.txt").write_text("the caller's own file\n")
    (home / ".config" / "warren").mkdir(parents=True)
    (home / ".config" / "warren" / "config.toml").write_text(
        '[profile.e2b-test]\nenv = { FROM_PROFILE = "yes" }\n'
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        mp.delenv("XDG_CONFIG_HOME", raising=False)
        mp.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
        mp.delenv("WARREN_URL", raising=False)
        mp.setenv("WARREN_E2B_KERNEL_ENV", str(kernel_env))
        serve = Serve(tmp_path_factory.mktemp("serve"))
        mp.setenv("E2B_API_URL", serve.url)
        mp.setenv("E2B_SANDBOX_URL", serve.url)
        mp.setenv("E2B_API_KEY", serve.token or "")
        mp.delenv("E2B_DOMAIN", raising=False)
        mp.delenv("E2B_DEBUG", raising=False)
        world = World(serve, home, Path(root_of(os.environ)))
        try:
            yield world
        finally:
            for info in Sandbox.list().next_items():
                Sandbox.kill(info.sandbox_id)
            serve.stop()
            # Its supervisor ends too, with the sandboxes it booted ahead (no listing shows
            # them): their cgroups were a later module's leftovers on this worker.
            shut_down_supervisor()
            _remove_tree(home)


def _remove_tree(path: Path) -> None:
    """``shutil.rmtree``, opening first the directories warren keeps unlistable (mode
    0300: the directories holding E2B homes and snapshots, which outlive their sandbox
    when kept as a snapshot); they are the caller's own."""

    def opened(func: object, failed: str, exc: tuple[type[BaseException], BaseException, object]) -> None:
        if not (func is os.open or func is os.scandir) or not isinstance(exc[1], PermissionError):
            raise exc[1]
        os.chmod(failed, 0o700)
        shutil.rmtree(failed, onerror=opened)

    shutil.rmtree(path, onerror=opened)


@pytest.fixture
def sb(world: World) -> Iterator[Sandbox]:
    sandbox = Sandbox.create()
    try:
        yield sandbox
    finally:
        Sandbox.kill(sandbox.sandbox_id)


# --- lifecycle ----------------------------------------------------------------------------------


def test_create_gives_a_warren_sandbox_with_a_home_of_its_own(world: World) -> None:
    sandbox = Sandbox.create(metadata={"purpose": "test"}, envs={"GREETING": "hello"})
    try:
        assert world.warren_state(sandbox.sandbox_id) == "running"
        home = world.workspace(sandbox.sandbox_id)
        assert home.is_dir()
        result = sandbox.commands.run('pwd; echo "$HOME $GREETING"; echo made > here.txt')
        # E2B's home, where the workspace is seen: the host has no /home/user of its own
        assert result.stdout == "/home/user\n/home/user hello\n"
        assert (home / "here.txt").read_text() == "made\n"
        info = sandbox.get_info()
        assert info.template_id == "base" and info.metadata == {"purpose": "test"}
        assert sandbox.is_running()
        assert "POST /v2/sandboxes 201" in world.serve.log.read_text()
    finally:
        assert Sandbox.kill(sandbox.sandbox_id) is True
    assert world.warren_state(sandbox.sandbox_id) is None
    assert not home.parent.exists()
    assert not world.root.exists()  # the last sandbox gone, nothing is left in /tmp


def test_the_v1_routes_older_sdks_use_create_and_resume(world: World) -> None:
    key = {"X-API-Key": world.token}
    with world.raw() as c:
        made = c.post("/sandboxes", json={"templateID": "base", "secure": True, "timeout": 60}, headers=key)
        assert made.status_code == 201, made.text
        body = made.json()
        assert body["templateID"] == "base" and body["envdAccessToken"] and body["envdVersion"]
        sandbox_id = body["sandboxID"]
        try:
            assert world.warren_state(sandbox_id) == "running"
            assert c.post(f"/sandboxes/{sandbox_id}/resume", headers=key).status_code == 409
            assert c.post(f"/sandboxes/{sandbox_id}/pause", headers=key).status_code == 204
            resumed = c.post(f"/sandboxes/{sandbox_id}/resume", json={"timeout": 30}, headers=key)
            assert resumed.status_code == 201 and resumed.json()["sandboxID"] == sandbox_id
            assert world.warren_state(sandbox_id) == "running"
            listed = c.get("/sandboxes", headers=key).json()
            assert sandbox_id in [s["sandboxID"] for s in listed]
        finally:
            assert c.delete(f"/sandboxes/{sandbox_id}", headers=key).status_code == 204
        refused = c.post("/sandboxes", json={"templateID": "base", "autoResume": True}, headers=key)
        assert refused.status_code == 400 and "autoResume" in refused.json()["message"]


def test_a_template_names_a_preset_or_a_profile_of_the_users_config(world: World) -> None:
    from_profile = Sandbox.create(template="e2b-test")
    plain = Sandbox.create()
    python = Sandbox.create(template="python")
    try:
        assert from_profile.get_info().template_id == "e2b-test"
        assert from_profile.commands.run('echo "[$FROM_PROFILE]"').stdout == "[yes]\n"
        assert plain.commands.run('echo "[$FROM_PROFILE]"').stdout == "[]\n"
        assert python.get_info().template_id == "python"
        assert python.commands.run("python3 -c 'print(6*7)'").stdout == "42\n"
    finally:
        for sandbox in (from_profile, plain, python):
            sandbox.kill()


def _small_root(root: Path) -> Path:
    """A root of the host's bash and cat with their libraries (E2B runs commands with
    ``bash -l -c``), and a file only the image has."""
    for tool in ("bash", "cat", "pwd"):
        real = os.path.realpath(shutil.which(tool) or tool)
        dest = root / "usr/bin" / tool
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(real, dest)
        out = subprocess.run(["ldd", real], capture_output=True, text=True).stdout
        for lib in (p for line in out.splitlines() for p in line.split() if p.startswith("/")):
            target = root / lib.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(os.path.realpath(lib), target)
    (root / "bin").symlink_to("usr/bin")
    (root / "etc").mkdir()
    (root / "etc" / "marker").write_text("from the image\n")
    return root


def test_template_exists_names_what_a_sandbox_can_be_created_from(world: World) -> None:
    from e2b import Template

    for name in ("base", "python", "e2b-test"):  # default, a preset, a profile of the config
        assert Template.exists(name) is True, name
    assert Template.exists(f"nonexistent-{secrets.token_hex(4)}") is False


def test_a_template_built_from_another_with_nothing_added_is_a_new_name_for_it(world: World) -> None:
    from e2b import BuildException, Template

    name, other = f"built-{secrets.token_hex(4)}", f"stepped-{secrets.token_hex(4)}"
    built = Template.build(Template().from_template("e2b-test"), name)  # a profile of the config
    assert Template.exists(name) is True
    sandbox = Sandbox.create(name)
    try:
        assert sandbox.get_info().template_id == name
        assert sandbox.commands.run("echo $FROM_PROFILE").stdout == "yes\n"  # the profile's policy
    finally:
        Sandbox.kill(sandbox.sandbox_id)
    # what needs E2B's build service (steps, an image) ends in error saying so, and names nothing
    with pytest.raises(BuildException, match="build service"):
        Template.build(Template().from_template("base").run_cmd("true"), other)
    assert Template.exists(other) is False
    with world.raw() as c:
        key = {"X-API-Key": world.token}
        assert c.delete(f"/templates/{built.template_id}", headers=key).status_code == 204
        assert c.delete(f"/templates/{built.template_id}", headers=key).status_code == 404
    assert Template.exists(name) is False


def test_a_template_naming_an_image_runs_the_sandbox_on_that_image(world: World, tmp_path: Path) -> None:
    from warren.images.store import ImageStore

    ImageStore().import_root("e2b-img", _small_root(tmp_path / "root"))
    sandbox = Sandbox.create(template="e2b-img")
    try:
        assert sandbox.get_info().template_id == "e2b-img"
        got = sandbox.commands.run(f"cat /etc/marker; pwd; echo $HOME; cat {world.home}/notes.txt || true")
        assert got.stdout == "from the image\n/workspace\n/workspace\n", got
        sandbox.files.write("note.txt", "relative, in the home")
        assert sandbox.files.read("/etc/marker") == "from the image\n"
        sandbox.files.write("/etc/marker", "changed in the sandbox's layer\n")
        # The workspace is the host directory E2B's kill removes; the image is untouched.
        assert (world.workspace(sandbox.sandbox_id) / "note.txt").read_text() == "relative, in the home"
    finally:
        sandbox.kill()
    assert (tmp_path / "root" / "etc" / "marker").read_text() == "from the image\n"
    made = set(os.listdir(world.root)) if world.root.exists() else set()
    with pytest.raises(SandboxException, match="review mode on an image is not offered"):
        Sandbox.create(template="e2b-img", metadata={"warren.review": "true"})
    assert (set(os.listdir(world.root)) if world.root.exists() else set()) == made  # nothing left of it
    again = Sandbox.create(template="e2b-img")
    try:
        assert again.files.read("/etc/marker") == "from the image\n"
    finally:
        again.kill()


def test_a_sandbox_removed_with_warrens_own_api_leaves_no_workspace_behind(world: World) -> None:
    sandbox = Sandbox.create()
    home = world.workspace(sandbox.sandbox_id)
    assert home.is_dir()
    with world.v1() as c:
        assert c.delete(f"/v1/sandboxes/{sandbox.sandbox_id}").status_code == 200
    deadline = time.monotonic() + 10
    while home.parent.exists() and time.monotonic() < deadline:  # not home: rmtree ends with its parent
        time.sleep(0.2)
    assert not home.parent.exists()


def test_list_shows_running_sandboxes_with_metadata_and_kill_removes_them(world: World) -> None:
    tag = secrets.token_hex(4)
    a = Sandbox.create(metadata={"tag": tag, "n": "1"})
    b = Sandbox.create(metadata={"tag": tag, "n": "2"})
    from e2b import SandboxQuery

    listed = Sandbox.list(query=SandboxQuery(metadata={"tag": tag})).next_items()
    assert {s.sandbox_id for s in listed} == {a.sandbox_id, b.sandbox_id}
    assert {s.metadata["n"] for s in listed} == {"1", "2"}
    a.kill()
    listed = Sandbox.list(query=SandboxQuery(metadata={"tag": tag})).next_items()
    assert [s.sandbox_id for s in listed] == [b.sandbox_id]
    assert world.warren_state(a.sandbox_id) is None
    assert Sandbox.kill(a.sandbox_id) is False
    b.kill()


def test_kill_removes_the_workspace_without_following_links_planted_in_it(
    world: World, tmp_path: Path
) -> None:
    """The workspace is removed beneath the root's descriptor: links the sandbox left in
    it (to a host directory and a host file) are removed as links, their targets kept."""
    victim_dir = tmp_path / "victim-dir"
    victim_dir.mkdir()
    (victim_dir / "keep.txt").write_text("keep me\n")
    victim_file = tmp_path / "victim.txt"
    victim_file.write_text("keep me too\n")
    sandbox = Sandbox.create()
    workspace = world.workspace(sandbox.sandbox_id)
    sandbox.commands.run(
        f"mkdir -p deep/er && ln -s {victim_dir} deep/er/dir && ln -s {victim_file} file && echo x > deep/f"
    )
    assert (workspace / "deep" / "er" / "dir").is_symlink()
    assert sandbox.kill() is True
    assert not workspace.exists() and not workspace.parent.exists()
    assert (victim_dir / "keep.txt").read_text() == "keep me\n"
    assert victim_file.read_text() == "keep me too\n"


def test_a_sandbox_made_with_warrens_own_api_is_listed_and_usable(world: World, tmp_path: Path) -> None:
    name = f"v1-{secrets.token_hex(4)}"
    with world.v1() as c:
        r = c.post("/v1/sandboxes", json={"name": name, "workspace": str(tmp_path)})
        assert r.status_code == 201, r.text
    try:
        listed = {s.sandbox_id: s for s in Sandbox.list().next_items()}
        assert listed[name].template_id == "warren"
        sandbox = Sandbox.connect(name)
        assert sandbox.commands.run("pwd").stdout == f"{tmp_path}\n"
        sandbox.files.write("from-e2b.txt", "hi")
        assert (tmp_path / "from-e2b.txt").read_text() == "hi"
        with pytest.raises(SandboxException, match="not created through the E2B API"):
            sandbox.set_timeout(5)
        assert sandbox.kill() is True
        assert world.warren_state(name) is None
        assert (tmp_path / "from-e2b.txt").exists()  # its workspace is the caller's: kept
    finally:
        with world.v1() as c:
            c.delete(f"/v1/sandboxes/{name}")


def test_set_timeout_ends_the_sandbox_when_its_time_is_up(world: World) -> None:
    sandbox = Sandbox.create(timeout=120)
    sandbox.set_timeout(2)
    assert world.warren_state(sandbox.sandbox_id) == "running"
    top = world.workspace(sandbox.sandbox_id).parent
    deadline = time.monotonic() + 15
    # the reaper stops the sandbox, then deletes its workspace: wait for both
    while (world.warren_state(sandbox.sandbox_id) or top.exists()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert world.warren_state(sandbox.sandbox_id) is None
    assert not top.exists()
    with pytest.raises(NotFoundException):
        Sandbox.connect(sandbox.sandbox_id)


def test_a_sandbox_created_to_pause_on_timeout_is_paused_then_resumed(world: World) -> None:
    sandbox = Sandbox.create(timeout=120, lifecycle={"on_timeout": "pause"})
    try:
        handle = sandbox.commands.run("sleep 300", background=True)
        sandbox.set_timeout(1)
        deadline = time.monotonic() + 15
        while world.warren_state(sandbox.sandbox_id) != "paused" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert world.warren_state(sandbox.sandbox_id) == "paused"
        time.sleep(2)  # a paused sandbox does not time out
        assert world.warren_state(sandbox.sandbox_id) == "paused"
        resumed = Sandbox.connect(sandbox.sandbox_id, timeout=60)
        time.sleep(2)  # and resuming gave it time again
        assert world.warren_state(sandbox.sandbox_id) == "running"
        assert handle.pid in [p.pid for p in resumed.commands.list()]
    finally:
        Sandbox.kill(sandbox.sandbox_id)


# The service's own bookkeeping (its token file, its reaper): the same whoever calls.
@pytest.mark.caller_independent(half="root")
def test_a_restarted_service_keeps_the_access_tokens_and_still_ends_sandboxes_on_time(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a state of its own: the module's service must not be the one that ends it
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    token = secrets.token_hex(16)
    token_file = tmp_path / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)

    def start(n: int) -> Serve:
        (tmp_path / f"serve{n}").mkdir()
        return Serve(tmp_path / f"serve{n}", token=False, extra=("--token-file", str(token_file)))

    first = start(1)
    sandbox = Sandbox.create(timeout=120, api_key=token, api_url=first.url, sandbox_url=first.url)
    sandbox.set_timeout(8)
    first.stop()
    second = start(2)
    try:
        again = Sandbox.connect(sandbox.sandbox_id, api_key=token, api_url=second.url, sandbox_url=second.url)
        assert again._envd_access_token == sandbox._envd_access_token
        assert again.commands.run("echo alive").stdout == "alive\n"
        root = Path(root_of(os.environ))
        assert workspace_of(root, sandbox.sandbox_id).is_dir()
        headers = {"Authorization": f"Bearer {token}"}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            gone = httpx.get(f"{second.url}/v1/sandboxes/{sandbox.sandbox_id}", headers=headers)
            if gone.status_code == 404 and not (root / sandbox.sandbox_id).exists():
                break
            time.sleep(0.3)
        assert gone.status_code == 404
        assert not (root / sandbox.sandbox_id).exists()
    finally:
        Sandbox.kill(sandbox.sandbox_id, api_key=token, api_url=second.url)
        second.stop()


# The service's reaper: the same whoever calls.
@pytest.mark.caller_independent(half="user")
def test_an_idle_service_does_not_start_the_supervisor_to_reap_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    serve = Serve(tmp_path)
    try:
        time.sleep(2.5)  # the reaper looks every second
        lock = tmp_path / "state" / "warren" / "supervisor.lock"
        assert not lock.exists()
        sandbox = Sandbox.create(api_key=serve.token, api_url=serve.url, sandbox_url=serve.url)
        assert lock.exists()  # the check above can fail
        sandbox.kill()
    finally:
        serve.stop()


def test_is_running_turns_false_once_paused_killed_or_past_its_end(world: World) -> None:
    sandbox = Sandbox.create(timeout=120)
    try:
        assert sandbox.is_running() is True  # the control: the same probe on a running one
        sandbox.beta_pause()
        assert world.warren_state(sandbox.sandbox_id) == "paused"
        assert sandbox.is_running() is False
        Sandbox.connect(sandbox.sandbox_id)
        assert sandbox.is_running() is True
        # anyone may ask /health, but only the sandbox's own token learns its state
        with world.raw() as c:
            paused_probe = {"E2b-Sandbox-Id": sandbox.sandbox_id, "X-Access-Token": "0" * 64}
            sandbox.beta_pause()
            assert c.get("/health", headers=paused_probe).status_code == 204
            assert c.get("/health").status_code == 204
            Sandbox.connect(sandbox.sandbox_id)
    finally:
        Sandbox.kill(sandbox.sandbox_id)
    assert sandbox.is_running() is False
    ending = Sandbox.create(timeout=120)
    try:
        assert ending.is_running() is True
        ending.set_timeout(0)  # past its end before the reaper's next round has ended it
        assert ending.is_running() is False
    finally:
        with contextlib.suppress(NotFoundException):
            Sandbox.kill(ending.sandbox_id)


def test_v2_listing_pages_orders_and_filters_by_start_and_template(world: World) -> None:
    tag = {"listing": secrets.token_hex(6)}
    first = Sandbox.create(metadata=tag)
    second = Sandbox.create(metadata=tag)
    try:
        query = SandboxQuery(metadata=tag)
        pages = Sandbox.list(query=query, limit=1)
        one = pages.next_items()
        assert [s.sandbox_id for s in one] == [second.sandbox_id]  # newest first, as E2B
        assert pages.has_next and pages.next_token
        two = pages.next_items()
        assert [s.sandbox_id for s in two] == [first.sandbox_id] and not pages.has_next
        ascending = Sandbox.list(query=query, order="asc").next_items()
        assert [s.sandbox_id for s in ascending] == [first.sandbox_id, second.sandbox_id]
        started = second.get_info().started_at
        after = Sandbox.list(query=SandboxQuery(metadata=tag, started_after=started)).next_items()
        assert [s.sandbox_id for s in after] == [second.sandbox_id]
        later = SandboxQuery(metadata=tag, started_after=started + datetime.timedelta(seconds=1))
        assert Sandbox.list(query=later).next_items() == []
        assert len(Sandbox.list(query=SandboxQuery(metadata=tag, template="base")).next_items()) == 2
        assert Sandbox.list(query=SandboxQuery(metadata=tag, template="uv")).next_items() == []
        with world.raw() as c:
            headers = {"X-API-Key": world.token}
            bad = ({"limit": "0"}, {"order": "sideways"}, {"nextToken": "x"}, {"startedAfter": "soon"})
            for params in bad:
                r = c.get("/v2/sandboxes", params=params, headers=headers)
                assert r.status_code == 400 and r.json()["message"], (params, r.text)
    finally:
        Sandbox.kill(first.sandbox_id)
        Sandbox.kill(second.sandbox_id)


def test_lifecycle_options_are_honoured_or_refused_never_ignored(world: World) -> None:
    sandbox = Sandbox.create(timeout=60, lifecycle={"on_timeout": "pause", "auto_resume": False})
    Sandbox.kill(sandbox.sandbox_id)
    with world.raw() as c:
        body = {
            "templateID": "base",
            "autoPause": True,
            "autoPauseMemory": False,
            "autoResume": {"enabled": True},
        }
        r = c.post("/sandboxes", json=body, headers={"X-API-Key": world.token})
        assert r.status_code == 400 and "filesystem-only" in r.json()["message"], r.text
        r = c.post(
            "/sandboxes",
            json={"templateID": "base", "autoResume": {"enabled": "yes"}},
            headers={"X-API-Key": world.token},
        )
        assert r.status_code == 400 and "autoResume" in r.json()["message"], r.text


def test_auto_resume_wakes_a_paused_sandbox_on_its_next_request_with_its_processes(world: World) -> None:
    sandbox = Sandbox.create(timeout=2, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        handle = sandbox.commands.run("sleep 300", background=True)
        deadline = time.monotonic() + 15
        while world.warren_state(sandbox.sandbox_id) != "paused" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert world.warren_state(sandbox.sandbox_id) == "paused"
        assert not sandbox.is_running()  # a question about it is no request to it
        assert world.warren_state(sandbox.sandbox_id) == "paused"
        assert sandbox.commands.run("echo woke").stdout == "woke\n"  # envd's request resumes it
        assert world.warren_state(sandbox.sandbox_id) == "running"
        assert handle.pid in [p.pid for p in sandbox.commands.list()]
        assert sandbox.get_info().end_at.timestamp() > time.time()  # with its time again
    finally:
        Sandbox.kill(sandbox.sandbox_id)


def test_a_filesystem_only_pause_ends_the_processes_and_keeps_the_files(world: World) -> None:
    sandbox = Sandbox.create()
    try:
        sandbox.files.write("kept.txt", "still here")
        sandbox.commands.run("echo in-tmp > /tmp/t; sleep 300 & sleep 301 &")
        # the control (a background child is named sleep once it has exec'd: under load,
        # a moment after the shell that started it has gone)
        sleeping = sandbox.commands.run(
            "for i in $(seq 100); do [ $(pgrep -cx sleep) = 2 ] && break; sleep 0.1; done; pgrep -x sleep"
        )
        assert len(sleeping.stdout.split()) == 2, sleeping.stdout
        assert sandbox.pause(keep_memory=False) is True
        assert world.warren_state(sandbox.sandbox_id) == "paused"
        with pytest.raises(SandboxException):  # no auto-resume: a request does not wake it
            sandbox.commands.run("true", request_timeout=10)
        resumed = Sandbox.connect(sandbox.sandbox_id)
        assert world.warren_state(sandbox.sandbox_id) == "running"
        assert resumed.commands.run("pgrep -x sleep || echo none").stdout == "none\n"
        assert resumed.files.read("kept.txt") == "still here"
        assert resumed.files.read("/tmp/t") == "in-tmp\n"
    finally:
        Sandbox.kill(sandbox.sandbox_id)


def test_a_snapshot_copies_the_home_without_following_links_and_sandboxes_and_forks_start_from_it(
    world: World, sb: Sandbox
) -> None:
    home = world.workspace(sb.sandbox_id)
    sb.files.write("keep.txt", "kept")
    sb.commands.run("ln -s /etc/hostname link && mkfifo pipe && mkdir -p d/e && echo deep > d/e/f")
    (home / "tool").write_text("#!/bin/sh\n")
    os.chmod(home / "tool", 0o4755)  # the control: the original has the setuid bit
    assert os.stat(home / "tool").st_mode & stat.S_ISUID
    worker = sb.commands.run("sleep 300", background=True)
    snap = sb.create_snapshot(name="kept-state")
    assert any("kept-state" in n for n in snap.names)
    assert worker.pid in [p.pid for p in sb.commands.list()]  # paused for the copy, then thawed
    assert world.warren_state(sb.sandbox_id) == "running"
    top = Path(f"{world.root}-snapshots") / snap.snapshot_id
    copy = top / json.loads((top / "meta.json").read_text())["home"]
    assert (copy / "keep.txt").read_text() == "kept" and (copy / "d" / "e" / "f").read_text() == "deep\n"
    assert (copy / "link").is_symlink() and os.readlink(copy / "link") == "/etc/hostname"
    assert not (copy / "pipe").exists()
    assert not os.stat(copy / "tool").st_mode & stat.S_ISUID
    sb.files.write("later.txt", "after the snapshot")
    child = Sandbox.create(snap.snapshot_id)
    try:
        assert child.files.read("keep.txt") == "kept" and child.files.read("d/e/f") == "deep\n"
        assert not child.files.exists("later.txt")
        child.files.write("keep.txt", "changed in the child")
        assert sb.files.read("keep.txt") == "kept"
        assert [s.snapshot_id for s in Sandbox.list_snapshots(sandbox_id=sb.sandbox_id).next_items()] == [
            snap.snapshot_id
        ]
        assert [s.snapshot_id for s in Sandbox.list_snapshots(name="kept-state").next_items()] == [
            snap.snapshot_id
        ]
        assert Sandbox.list_snapshots(name="no-such-name").next_items() == []
    finally:
        Sandbox.kill(child.sandbox_id)
    forks = sb.fork(count=2, timeout=60)
    try:
        assert len(forks) == 2 and all(isinstance(f, Sandbox) for f in forks)
        for fork in forks:
            assert isinstance(fork, Sandbox) and fork.sandbox_id != sb.sandbox_id
            assert fork.files.read("later.txt") == "after the snapshot"  # the files as they are now
            assert worker.pid not in [p.pid for p in fork.commands.list()]  # not its processes
    finally:
        for fork in forks:
            if isinstance(fork, Sandbox):
                Sandbox.kill(fork.sandbox_id)
    assert [s.snapshot_id for s in Sandbox.list_snapshots().next_items()] == [snap.snapshot_id]  # fork's went
    assert Sandbox.delete_snapshot(snap.snapshot_id) is True
    assert not copy.exists() and not copy.parent.parent.exists()  # no litter left in /tmp
    assert Sandbox.delete_snapshot(snap.snapshot_id) is False
    with pytest.raises(SandboxException, match="not found"):
        Sandbox.create(snap.snapshot_id)


def test_pause_freezes_the_sandbox_and_connect_resumes_it_with_its_processes(world: World) -> None:
    sandbox = Sandbox.create()
    try:
        sandbox.files.write("kept.txt", "still here")
        handle = sandbox.commands.run("sleep 300", background=True)
        assert sandbox.pause() is True
        assert world.warren_state(sandbox.sandbox_id) == "paused"
        assert sandbox.get_info().state.value == "paused"
        assert sandbox.pause() is False  # already paused: E2B's 409
        with pytest.raises(SandboxException):
            sandbox.commands.run("true", request_timeout=10)
        resumed = Sandbox.connect(sandbox.sandbox_id)
        assert world.warren_state(sandbox.sandbox_id) == "running"
        assert handle.pid in [p.pid for p in resumed.commands.list()]
        assert resumed.files.read("kept.txt") == "still here"
    finally:
        Sandbox.kill(sandbox.sandbox_id)


# --- commands -------------------------------------------------------------------------------------


def test_metrics_are_a_sample_of_the_sandboxs_use_now(world: World, sb: Sandbox) -> None:
    before = datetime.datetime.now(datetime.UTC)
    first = sb.get_metrics()
    assert len(first) == 1
    time.sleep(1)  # an idle second: the control for the busy one below
    idle = sb.get_metrics()[0]
    sb.commands.run("timeout 1.5 sh -c 'while :; do :; done' || true")
    busy = sb.get_metrics()[0]
    assert busy.cpu_used_pct > idle.cpu_used_pct, (idle, busy)
    assert busy.mem_used > 0 and busy.mem_total >= busy.mem_used and busy.cpu_count >= 1
    assert busy.disk_total == shutil.disk_usage(world.workspace(sb.sandbox_id)).total
    assert abs(busy.timestamp.timestamp() - time.time()) < 5
    assert (
        sb.get_metrics(
            start=before - datetime.timedelta(hours=1), end=before - datetime.timedelta(minutes=30)
        )
        == []
    )


def test_a_foreground_command_gives_stdout_stderr_and_exit_code(sb: Sandbox) -> None:
    result = sb.commands.run("echo out; echo err >&2")
    assert result.exit_code == 0 and result.stdout == "out\n" and "err\n" in result.stderr
    with pytest.raises(CommandExitException) as failed:
        sb.commands.run("echo partial; exit 3")
    assert failed.value.exit_code == 3 and failed.value.stdout == "partial\n"
    moved = sb.commands.run("pwd; echo $X", cwd="/tmp", envs={"X": "per-command"})
    assert moved.stdout == "/tmp\nper-command\n"


def test_output_callbacks_get_each_line_as_it_comes(sb: Sandbox) -> None:
    seen: list[tuple[float, str]] = []
    errors: list[str] = []
    sb.commands.run(
        "for i in 1 2 3; do echo line$i; sleep 0.4; done; echo oops >&2",
        on_stdout=lambda line: seen.append((time.monotonic(), line)),
        on_stderr=errors.append,
    )
    assert "".join(text for _, text in seen) == "line1\nline2\nline3\n"
    assert seen[-1][0] - seen[0][0] > 0.6  # streamed, not delivered at the end
    assert "oops\n" in "".join(errors)


def test_a_background_process_reads_stdin_and_is_killed(world: World, sb: Sandbox) -> None:
    reader = sb.commands.run('read line; echo "got:$line"', background=True, stdin=True)
    reader.send_stdin("hello\n")
    assert reader.wait().stdout == "got:hello\n"

    cat = sb.commands.run("cat", background=True, stdin=True)
    sb.commands.send_stdin(cat.pid, "abc\n")
    sb.commands.close_stdin(cat.pid)
    assert cat.wait().stdout == "abc\n"

    sleeper = sb.commands.run("sleep 300", background=True)
    assert sleeper.pid in [p.pid for p in sb.commands.list()]
    assert sleeper.kill() is True
    with pytest.raises(CommandExitException) as killed:
        sleeper.wait()
    assert killed.value.exit_code == -1 and killed.value.error == "signal: killed"
    assert sleeper.pid not in [p.pid for p in sb.commands.list()]
    # a later client attaches to a running process by its pid
    ticker = sb.commands.run("sleep 0.5; echo late", background=True)
    again = sb.commands.connect(ticker.pid)
    assert again.wait().stdout == "late\n"


def test_the_async_sdk_streams_output_ordered_stdin_and_directory_events(world: World) -> None:

    async def main() -> tuple[list[str], str, str, list[tuple[str, str]]]:
        sandbox = await AsyncSandbox.create()
        try:
            lines: list[str] = []
            await sandbox.commands.run("echo one; sleep 0.2; echo two", on_stdout=lines.append)
            cat = await sandbox.commands.run("cat", background=True, stdin=True)
            stream = sandbox.commands.stream_input(cat.pid)
            for part in ("first ", "second ", "third"):
                await stream.send(part)
            await stream.close()
            await sandbox.commands.close_stdin(cat.pid)
            result = await cat.wait()
            await sandbox.files.make_dir("watched")
            events: list[tuple[str, str]] = []
            watch = await sandbox.files.watch_dir(
                "watched", on_event=lambda e: events.append((e.name, e.type.value)), recursive=True
            )

            async def seen(event: tuple[str, str]) -> None:
                for _ in range(50):
                    if event in events:
                        return
                    await asyncio.sleep(0.1)

            await sandbox.files.write("watched/sub/deep.txt", "x")
            await seen(("sub/deep.txt", "create"))  # the watch polls: a file made and gone between
            await sandbox.files.remove("watched/sub/deep.txt")  # two looks would go unseen
            await seen(("sub/deep.txt", "remove"))
            await watch.stop()
            await sandbox.files.write("async.txt", "from async")
            return lines, result.stdout, await sandbox.files.read("async.txt"), events
        finally:
            await sandbox.kill()

    lines, echoed, read, events = asyncio.run(main())
    assert "".join(lines) == "one\ntwo\n"
    assert echoed == "first second third"
    assert read == "from async"
    assert ("sub", "create") in events and ("sub/deep.txt", "create") in events
    assert ("sub/deep.txt", "remove") in events


def test_a_killed_sandbox_ends_a_running_stream_as_e2b_does(world: World) -> None:
    sandbox = Sandbox.create()
    try:
        # the control: a process killed in a live sandbox ends with its exit, not a cut
        alive = sandbox.commands.run("sleep 60", background=True)
        sandbox.commands.kill(alive.pid)
        with pytest.raises(CommandExitException):
            alive.wait()
        running = sandbox.commands.run("sleep 60", background=True)
        raw = _raw_stream(world, sandbox, "sleep 60")
    finally:
        Sandbox.kill(sandbox.sandbox_id)
    with pytest.raises(TimeoutException, match="killed or reached its end of life"):
        running.wait()
    # On the wire: the stream ends with a reset, as E2B's HTTP/2 stream reset reads to the
    # SDK (a connection failure, which it checks the sandbox's health for). A plain close
    # read as "unexpected EOF during chunk size line", a protocol error that e2b 2.45
    # (pyqwest 0.10) took for no connection failure: it never said the sandbox was killed.
    with raw, pytest.raises(ConnectionResetError):
        raw.settimeout(30)
        while raw.recv(65536):
            pass
    # An end on purpose, not an error of the service's own (uvicorn logged one per cut stream).
    assert "without completing response" not in world.serve.log.read_text()


def _raw_stream(world: World, sandbox: Sandbox, command: str) -> socket.socket:
    """A ``Process/Start`` stream of ``command`` over a socket of its own (HTTP/1.1, the
    Connect protocol's JSON framing), its response head read."""
    host, port = world.url.removeprefix("http://").rsplit(":", 1)
    frame = json.dumps({"process": {"cmd": "/bin/sh", "args": ["-c", command]}}).encode()
    body = b"\0" + len(frame).to_bytes(4, "big") + frame
    head = (
        f"POST /process.Process/Start HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/connect+json\r\n"
        f"E2b-Sandbox-Id: {sandbox.sandbox_id}\r\nX-Access-Token: {sandbox._envd_access_token or ''}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    raw = socket.create_connection((host, int(port)), timeout=30)
    raw.sendall(head.encode() + body)
    assert raw.recv(65536).startswith(b"HTTP/1.1 200"), "the stream did not start"
    return raw


# The stream's end over HTTP: the same whoever calls (a command's timeout itself runs in
# both halves).
@pytest.mark.caller_independent(half="root")
def test_a_commands_timeout_ends_its_stream_in_the_async_sdk_too(world: World, sb: Sandbox) -> None:
    async def run(timeout: float) -> None:
        sandbox = await AsyncSandbox.connect(sb.sandbox_id)
        await sandbox.commands.run("sleep 3", timeout=timeout)

    started = time.monotonic()
    with pytest.raises(TimeoutException):
        asyncio.run(run(1))
    assert time.monotonic() - started < 2.5
    asyncio.run(run(30))  # the control: the same command with time enough ends normally


def test_a_pty_runs_an_interactive_shell_that_can_be_resized(sb: Sandbox) -> None:
    from e2b import PtySize

    seen = bytearray()
    terminal = sb.pty.create(size=PtySize(rows=30, cols=100))

    def until(text: bytes) -> None:
        deadline = time.monotonic() + 10
        for _, _, chunk in terminal:
            seen.extend(chunk or b"")
            if text in seen or time.monotonic() > deadline:
                return

    sb.pty.send_stdin(terminal.pid, b"tty; stty size; echo sum-$((2+3))\n")
    until(b"sum-5")
    assert b"/dev/pts/" in seen and b"30 100" in seen and b"sum-5" in seen
    sb.pty.resize(terminal.pid, PtySize(rows=40, cols=132))
    sb.pty.send_stdin(terminal.pid, b"stty size\n")
    until(b"40 132")
    assert b"40 132" in seen
    sb.pty.send_stdin(terminal.pid, b"exit 7\n")
    with pytest.raises(CommandExitException) as ended:
        terminal.wait()
    assert ended.value.exit_code == 7


# --- files --------------------------------------------------------------------------------------------


def test_files_write_read_list_exists_make_dir_rename_remove(world: World, sb: Sandbox) -> None:
    home = world.workspace(sb.sandbox_id)
    info = sb.files.write("dir/a.txt", "alpha")
    assert info.path == f"{HOME}/dir/a.txt"
    assert (home / "dir" / "a.txt").read_text() == "alpha"  # on the host, in its workspace
    assert sb.files.read("dir/a.txt") == "alpha"
    sb.files.write(f"{HOME}/bin.dat", b"\x00\xffraw")
    assert bytes(sb.files.read("bin.dat", format="bytes")) == b"\x00\xffraw"
    names = {e.name: e for e in sb.files.list(HOME)}
    assert set(names) == {"dir", "bin.dat"}
    assert names["dir"].type is not None and names["dir"].type.value == "dir"
    assert names["bin.dat"].size == 5
    assert sb.files.exists("dir/a.txt") and not sb.files.exists("nope.txt")
    assert sb.files.make_dir("made/deep") is True
    assert sb.files.make_dir("made/deep") is False
    assert (home / "made" / "deep").is_dir()
    moved = sb.files.rename("dir/a.txt", "made/b.txt")
    assert moved.path == f"{HOME}/made/b.txt" and (home / "made" / "b.txt").read_text() == "alpha"
    assert not (home / "dir" / "a.txt").exists()
    sb.files.remove("made")
    assert not (home / "made").exists() and not sb.files.exists("made")
    with pytest.raises(NotFoundException):
        sb.files.read("made/b.txt")
    assert sb.commands.run("cat bin.dat | wc -c").stdout.strip() == "5"
    many = sb.files.write_files([{"path": "m/one.txt", "data": "1"}, {"path": "m/two.txt", "data": b"2"}])
    assert sorted(w.path for w in many) == [f"{HOME}/m/one.txt", f"{HOME}/m/two.txt"]
    assert (home / "m" / "one.txt").read_text() == "1" and (home / "m" / "two.txt").read_text() == "2"
    stat = sb.files.get_info("m/one.txt")
    assert stat.size == 1 and stat.path == f"{HOME}/m/one.txt" and stat.type is not None
    assert stat.type.value == "file"
    with pytest.raises(NotFoundException):
        sb.files.get_info("m/none.txt")


def test_a_gzip_upload_is_stored_as_its_content_not_compressed(world: World, sb: Sandbox) -> None:
    home = world.workspace(sb.sandbox_id)
    text = "gzip on the wire, plain on disk\n" * 50
    sb.files.write("zipped.txt", text, gzip=True)
    assert (home / "zipped.txt").read_text() == text  # judged on the host
    assert sb.files.read("zipped.txt", gzip=True) == text
    envd = {"E2b-Sandbox-Id": sb.sandbox_id, "X-Access-Token": sb._envd_access_token or ""}
    packed = gzip.compress(b"raw bytes")
    with world.raw() as c:
        # the control: the same bytes without the header are a file's content as sent
        r = c.post("/files", params={"path": "sent.gz"}, headers=envd, content=packed)
        assert r.status_code == 200, r.text
        assert (home / "sent.gz").read_bytes() == packed
        deflate = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # gzip, fast
        zeros = b"\0" * (1 << 20)
        bomb = b"".join(deflate.compress(zeros) for _ in range(MAX_FILE // len(zeros) + 1)) + deflate.flush()
        zipped = {**envd, "Content-Encoding": "gzip"}
        r = c.post("/files", params={"path": "bomb"}, content=bomb, headers=zipped)
        assert r.status_code == 413 and not (home / "bomb").exists()
        r = c.post("/files", params={"path": "odd"}, content=b"x", headers={**envd, "Content-Encoding": "br"})
        assert r.status_code == 415 and not (home / "odd").exists()


def test_entries_have_type_char_symlink_target_and_envds_walk_order(world: World, sb: Sandbox) -> None:
    home = world.workspace(sb.sandbox_id)
    for d in ("t/a/a1", "t/a/a2", "t/b/b1"):
        sb.files.make_dir(d)
    sb.files.write("t/file.txt", "x")
    sb.commands.run("ln -s file.txt t/link && ln -s nowhere t/dangling")
    info = sb.files.get_info("t/file.txt")
    assert info.permissions == "-rw-r--r--" and sb.files.get_info("t/a").permissions == "drwxr-xr-x"
    # in its home the sandbox's one user is E2B's "user"; elsewhere an owner keeps its name
    # (root's file, seen from a uid-1001 sandbox, is the overflow id: nobody)
    assert (info.owner, info.group) == ("user", "user")
    etc = sb.files.get_info("/etc/hostname")
    assert (etc.owner, etc.group) == (("root", "root") if os.getuid() == 0 else ("nobody", "nogroup"))
    link = sb.files.get_info("t/link")
    # the target's size, the resolved target (this SDK shows the link's own type, older ones
    # the target's: envd sends both)
    assert link.size == 1 and link.symlink_target == f"{HOME}/t/file.txt"
    assert sb.files.get_info("t/file.txt").symlink_target is None
    dangling = sb.files.get_info("t/dangling")
    assert dangling.type is not None and dangling.type.value == "symlink" and dangling.symlink_target is None
    walked = [e.path[len(f"{HOME}/t/") :] for e in sb.files.list("t", depth=2)]
    assert walked == ["a", "a/a1", "a/a2", "b", "b/b1", "dangling", "file.txt", "link"]
    sb.files.remove("t/never-was")  # envd removes like os.RemoveAll: gone already is success
    sb.files.remove("t")
    assert not (home / "t").exists()


def test_signed_urls_open_their_own_sandboxs_file_and_nothing_else(world: World) -> None:
    sandbox = Sandbox.create(secure=True)
    other = Sandbox.create(secure=True)
    try:
        home = world.workspace(sandbox.sandbox_id)
        sandbox.files.write("shared.txt", "for the link")
        with httpx.Client(timeout=30) as c:  # no headers: the URL alone
            got = c.get(sandbox.download_url("shared.txt", "user", 60))
            assert got.status_code == 200 and got.text == "for the link", got.text
            forever = c.get(sandbox.download_url("shared.txt"))
            assert forever.status_code == 200 and forever.text == "for the link"
            upload = sandbox.upload_url("up.txt", "user", 60)
            assert c.post(upload, files={"file": ("up.txt", b"uploaded")}).status_code == 200
            assert (home / "up.txt").read_bytes() == b"uploaded"
            # a plain form field is the content of the file the link names, as envd takes it
            field = c.post(sandbox.upload_url("field.txt", "user", 60), files={"file": (None, "as a field")})
            assert field.status_code == 200 and field.json()[0]["path"] == f"{HOME}/field.txt"
            assert (home / "field.txt").read_text() == "as a field"
            expired = c.get(sandbox.download_url("shared.txt", "user", use_signature_expiration=-120))
            assert expired.status_code == 401
            assert expired.json() == {"code": 401, "message": "signature is already expired"}
            # a read link does not write, and another path, user or sandbox is not this link's
            url = sandbox.download_url("shared.txt", "user", 60)
            assert c.post(url, files={"file": ("x", b"x")}).status_code == 401
            assert c.get(url.replace("shared.txt", "up.txt")).status_code == 401
            assert c.get(url.replace("username=user", "username=root")).status_code == 401
            theirs = other.download_url("shared.txt", "user", 60)
            assert c.get(theirs).status_code == 404  # signed by the other's token: its own home
            assert c.get(url.split("&signature=")[0]).status_code == 401  # the control: unsigned
    finally:
        Sandbox.kill(sandbox.sandbox_id)
        Sandbox.kill(other.sandbox_id)


def test_snapshots_are_held_to_the_users_snapshot_budget_and_a_refused_one_leaves_nothing(
    world: World, sb: Sandbox
) -> None:
    """The E2B API's snapshots count against ``snapshot_budget`` as ``warren snapshot``'s
    do: past it the copy stops, the caller gets E2B's 507 naming the budget, and nothing
    is left beside the other snapshots. The control: the same snapshot without the
    budget is taken whole."""
    config = world.home / ".config" / "warren" / "config.toml"
    before = config.read_text()
    snaps = Path(f"{world.root}-snapshots")
    listed = sorted(os.listdir(snaps)) if snaps.exists() else []
    sb.files.write("big.bin", os.urandom(3 << 20))
    sb.commands.run("mkdir -p d && for i in 1 2 3; do head -c 1000000 /dev/urandom > d/$i; done")
    try:
        config.write_text('snapshot_budget = "4M"\n' + before)
        with pytest.raises(SandboxException, match="snapshot budget") as refused:
            sb.create_snapshot()
        assert "4M" in str(refused.value)
        assert (sorted(os.listdir(snaps)) if snaps.exists() else []) == listed
        config.write_text(before)
        snap = sb.create_snapshot()
    finally:
        config.write_text(before)
    try:
        home = (
            snaps
            / snap.snapshot_id
            / json.loads((snaps / snap.snapshot_id / "meta.json").read_text())["home"]
        )
        assert (home / "big.bin").stat().st_size == 3 << 20 and len(os.listdir(home / "d")) == 3
    finally:
        assert Sandbox.delete_snapshot(snap.snapshot_id) is True


def test_a_signed_upload_link_writes_its_own_path_and_no_other(world: World) -> None:
    """The signature covers ``path``; a form of several files names each by its own file
    name. Judged on the host, in the sandbox's home: the link's path is written, the
    other part's name is not; the control, the same form sent with the sandbox's access
    token (which may write anything there), writes both."""
    sandbox = Sandbox.create(secure=True)
    try:
        home = world.workspace(sandbox.sandbox_id)
        form = {"a": ("up.txt", b"meant"), "b": ("planted.txt", b"not meant")}
        with httpx.Client(timeout=30) as c:
            link = sandbox.upload_url("up.txt", "user", 60)
            refused = c.post(link, files=form)
            assert refused.status_code == 400 and "up.txt alone" in refused.text, refused.text
            assert not (home / "planted.txt").exists() and not (home / "up.txt").exists()
            assert c.post(link, files={"file": ("whatever", b"meant")}).status_code == 200
            assert (home / "up.txt").read_bytes() == b"meant"
            envd = {"E2b-Sandbox-Id": sandbox.sandbox_id, "X-Access-Token": sandbox._envd_access_token or ""}
            both = c.post(f"{world.url}/files", params={"username": "user"}, headers=envd, files=form)
            assert both.status_code == 200, both.text
        assert (home / "planted.txt").read_bytes() == b"not meant"  # the control
    finally:
        Sandbox.kill(sandbox.sandbox_id)


def test_watching_a_directory_reports_created_files_with_their_entries_when_asked(sb: Sandbox) -> None:
    sb.files.make_dir("watched")
    plain = sb.files.watch_dir("watched")
    with_entries = sb.files.watch_dir("watched", include_entry=True)
    try:
        sb.files.write("watched/new.txt", "x")
        sb.files.write("watched/empty.txt", "")
        assert sb.commands.run("echo y > watched/made.txt").exit_code == 0
        deadline = time.monotonic() + 5
        events: list = []
        while len(events) < 7 and time.monotonic() < deadline:
            events += plain.get_new_events()
            time.sleep(0.1)
        # A file that appeared with content was made, then written (inotify tells both);
        # one uploaded then had its owner set, as envd's upload does (a chmod event); one
        # a command wrote had not.
        # (each file's events in order; the files in the order of the polls that saw them)
        events = sorted(events, key=lambda e: e.name)
        assert [(e.name, e.type.value) for e in events] == [
            ("empty.txt", "create"),
            ("empty.txt", "chmod"),
            ("made.txt", "create"),
            ("made.txt", "write"),
            ("new.txt", "create"),
            ("new.txt", "write"),
            ("new.txt", "chmod"),
        ]
        assert all(e.entry is None for e in events)  # not asked for
        shown = sorted(with_entries.get_new_events(), key=lambda e: e.name)
        assert [(e.name, e.type.value) for e in shown] == [(e.name, e.type.value) for e in events]
        entry = next(e.entry for e in shown if (e.name, e.type.value) == ("new.txt", "create"))
        assert entry is not None and entry.path == f"{HOME}/watched/new.txt" and entry.size == 1
        assert entry.type is not None and entry.type.value == "file"
    finally:
        plain.stop()
        with_entries.stop()


def test_file_metadata_is_kept_as_user_e2b_xattrs_of_the_file_itself(world: World, sb: Sandbox) -> None:
    host = world.workspace(sb.sandbox_id) / "meta.txt"
    info = sb.files.write("meta.txt", "x", metadata={"author": "mish", "Stage": "one"})
    assert info.metadata == {"author": "mish", "stage": "one"}  # keys lowercased, as envd's
    assert os.getxattr(host, "user.e2b.author") == b"mish"  # judged on the host: on the file
    assert sb.files.get_info("meta.txt").metadata == {"author": "mish", "stage": "one"}
    assert {e.name: e.metadata for e in sb.files.list(".")}["meta.txt"] == {"author": "mish", "stage": "one"}
    moved = sb.files.rename("meta.txt", "moved.txt")
    assert moved.metadata == {"author": "mish", "stage": "one"}
    # an attribute set from inside the sandbox is metadata too
    sb.commands.run("python3 -c \"import os; os.setxattr('moved.txt', 'user.e2b.inside', b'yes')\"")
    assert sb.files.get_info("moved.txt").metadata == {"author": "mish", "stage": "one", "inside": "yes"}
    # an upload replaces it all: with none, none is left (the control: there were some)
    assert sb.files.write("moved.txt", "y").metadata is None
    assert [
        n for n in os.listxattr(world.workspace(sb.sandbox_id) / "moved.txt") if n.startswith("user.e2b.")
    ] == []
    assert sb.files.get_info("moved.txt").metadata is None


def test_metadata_over_envds_limits_is_refused_before_anything_is_written(world: World, sb: Sandbox) -> None:
    headers = {"E2b-Sandbox-Id": sb.sandbox_id, "X-Access-Token": sb._envd_access_token or ""}
    host = world.workspace(sb.sandbox_id)
    with world.raw() as c:
        big = c.post(
            "/files",
            params={"path": "big.txt"},
            content=b"x",
            headers={**headers, "Content-Type": "application/octet-stream", "X-Metadata-Big": "v" * 5000},
        )
        assert big.status_code == 400 and "limit" in big.json()["message"]
        ok = c.post(
            "/files",
            params={"path": "ok.txt"},
            content=b"x",
            headers={**headers, "Content-Type": "application/octet-stream", "X-Metadata-Small": "v"},
        )
        assert ok.status_code == 200 and ok.json()[0]["metadata"] == {"small": "v"}  # the control
    assert not (host / "big.txt").exists() and (host / "ok.txt").exists()


def test_the_reaper_never_sweeps_a_sandbox_whose_create_finished_during_its_listing(tmp_path: Path) -> None:
    """The flake this pins: a workspace deleted under a sandbox just made (its first write
    found no home), because the reaper listed warren's sandboxes before the create had
    made it, then swept the record the create had saved meanwhile."""
    from warren.e2b.core import Core
    from warren.e2b.records import Record, Records

    records = Records(str(tmp_path / "root"), "e2b_" + "0" * 40)

    def made(sandbox_id: str) -> str:
        workspace = records.new_workspace(sandbox_id)
        records.save(Record(sandbox_id, "base", 0.0, 1e12, workspace))
        return workspace

    class Listing:
        def list(self) -> list:
            fresh.append(made("e2b-made-meanwhile"))  # a create finishing as warren is listed
            return []

    fresh: list[str] = []
    orphan = made("e2b-orphan")  # warren has no such sandbox: its workspace goes (the control)
    Core(Listing(), records).reap_once()  # type: ignore[arg-type]
    assert not os.path.exists(orphan)
    assert os.path.isdir(fresh[0]) and records.get("e2b-made-meanwhile") is not None


# --- security ------------------------------------------------------------------------------------------


def test_a_wrong_or_missing_api_key_is_refused_and_creates_nothing(world: World) -> None:
    before = len(Sandbox.list().next_items())
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="wrong-" + secrets.token_hex(16))
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key="wrong-" + secrets.token_hex(16)).next_items()
    with world.raw() as c:
        r = c.post("/v2/sandboxes", json={"templateID": "base"})
        assert r.status_code == 401 and "API key" in r.json()["message"]
        r = c.post("/v2/sandboxes", json={"templateID": "base"}, headers={"X-API-Key": "x" * 32})
        assert r.status_code == 401
    assert len(Sandbox.list().next_items()) == before


def test_no_sandbox_reaches_another_sandboxs_home_made_before_or_after_it(world: World) -> None:
    # The homes live on the caller's filesystem, beside the caches (not in a private /tmp):
    # judged from the host, no E2B sandbox reads, lists, writes or removes another's,
    # whether that one existed when it started or came later.
    first = Sandbox.create()
    prying = Sandbox.create()
    later = Sandbox.create()
    try:
        secret = "home-secret-" + secrets.token_hex(8)
        homes = [world.workspace(s.sandbox_id) for s in (first, later)]
        for home in homes:
            (home / "secret.txt").write_text(secret)
            (home / "sub").mkdir()
        assert prying.commands.run("echo own > mine.txt").exit_code == 0
        # a home there when the sandbox started is hidden outright
        listed = prying.commands.run(f"ls -a {homes[0]} 2>&1; true").stdout
        assert "secret.txt" not in listed and "denied" in listed, listed
        for home in homes:
            top = home.parent
            # what a sandbox can find out: the other sandboxes' ids (in the root it lists),
            # never what lies below them, nor the random name of a home. Searched where a
            # home could show: every mount the sandbox has (any place another home were
            # mounted at) and the trees that hold or show homes. (Not `find /`: it walked
            # the host's whole disk, a minute on a machine with big trees, and timed out.)
            found = prying.commands.run(
                f"ls -aR {world.root.parent}; cat /proc/self/mountinfo; "
                f"find {world.home} /home /tmp /run /mnt /srv /media -name secret.txt 2>/dev/null; true"
            )
            assert " - proc proc " in found.stdout, found.stdout  # the mount table was listed
            assert home.name not in found.stdout and "secret.txt" not in found.stdout, found.stdout
            # and given the path (which nothing inside shows): no read, no write
            script = (
                f"cat {home}/secret.txt; ls -a {top}; cat {top}/record.json; "
                f"echo x > {home}/planted; rm -rf {home}/sub; mkdir {home}/made; mv {home} {top}/moved; true"
            )
            r = prying.commands.run(script)
            assert secret not in r.stdout and "home-secret" not in r.stderr and "workspace" not in r.stdout
            assert sorted(p.name for p in home.iterdir()) == ["secret.txt", "sub"]
            assert (home / "secret.txt").read_text() == secret
            assert not (top / "moved").exists() and (top / "record.json").is_file()
        # nor does any other sandbox of the user: there the whole directory is hidden
        plain = world.home / f"plain-{secrets.token_hex(4)}"
        plain.mkdir()
        r = run_cli(
            ["run", "--", "sh", "-c", f"cat {homes[0]}/secret.txt; ls -a {world.root}; true"], cwd=plain
        )
        assert r.returncode == 0 and secret not in r.stdout and homes[0].parent.name not in r.stdout, r.stdout
        # the control: the same commands reach the prying sandbox's own home
        own = world.workspace(prying.sandbox_id)
        r = prying.commands.run(f"cat {own}/mine.txt; cat /home/user/mine.txt")
        assert r.stdout == "own\nown\n"
    finally:
        for s in (first, prying, later):
            Sandbox.kill(s.sandbox_id)
    for s in (first, prying, later):
        assert not (world.root / s.sandbox_id).exists()  # removed with their sandboxes


def test_uv_hardlinks_from_its_cache_into_a_venv_in_the_home(world: World) -> None:
    # The home is on the caller's filesystem with the uv preset's cache, seen at
    # /home/user through a link: uv's hard links work there as in a workspace in the home.
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    wheels = world.home / f"wheels-{secrets.token_hex(4)}"
    make_wheel(wheels)
    cache = world.home / ".cache" / "uv"
    env = {**os.environ, "UV_CACHE_DIR": str(cache), "UV_NO_PROGRESS": "1"}
    warm = world.home / f"warm-{secrets.token_hex(4)}"
    subprocess.run([uv, "venv", "-q", "--python", "/usr/bin/python3", str(warm)], env=env, check=True)
    install = ["pip", "install", "--offline", "--find-links", str(wheels), "warrendemo"]
    subprocess.run([uv, *install, "--python", str(warm / "bin" / "python")], env=env, check=True)
    sandbox = Sandbox.create(template="uv")
    try:
        venv = f"{uv} venv -q --python /usr/bin/python3"
        args = " ".join(install)
        envs = {"UV_CACHE_DIR": str(cache), "UV_NO_PROGRESS": "1"}
        r = sandbox.commands.run(f"{venv} .venv && {uv} {args} --python .venv/bin/python", envs=envs)
        assert "falling back" not in r.stderr.lower(), r.stderr
        home = world.workspace(sandbox.sandbox_id)
        installed = next(home.glob(".venv/lib/python3*/site-packages/warrendemo/data.py"))
        assert installed.stat().st_nlink > 1, "a copy, not a hard link from the cache"
        assert installed.stat().st_ino in {p.stat().st_ino for p in cache.rglob("data.py")}
        # the control: the sandbox's own /tmp is another mount, where uv copies (and says so)
        r = sandbox.commands.run(
            f"{venv} /tmp/venv && {uv} {args} --python /tmp/venv/bin/python && "
            "stat -c %h /tmp/venv/lib/python3*/site-packages/warrendemo/data.py",
            envs=envs,
        )
        assert r.stdout.strip() == "1" and "falling back" in r.stderr.lower(), r.stderr
    finally:
        Sandbox.kill(sandbox.sandbox_id)
        shutil.rmtree(wheels)
        shutil.rmtree(warm)


def test_one_sandboxs_access_token_opens_no_other(world: World) -> None:
    a, b = Sandbox.create(), Sandbox.create()
    try:
        b.files.write("secret.txt", "b's data")
        token_a = a._envd_access_token
        assert token_a and token_a != b._envd_access_token
        tries = {
            "a's token": token_a,
            "the API key": world.token,
            "none": None,
        }
        with world.raw() as c:
            for what, token in tries.items():
                headers = {"E2b-Sandbox-Id": b.sandbox_id}
                if token is not None:
                    headers["X-Access-Token"] = token
                r = c.get("/files", params={"path": "secret.txt"}, headers=headers)
                assert r.status_code == 401 and "b's data" not in r.text, what
                r = c.post(
                    "/process.Process/Start",
                    headers={**headers, "Content-Type": "application/json"},
                    content=json.dumps({"process": {"cmd": "/bin/touch", "args": ["pwned"]}}),
                )
                assert r.status_code == 401 and r.json()["code"] == "unauthenticated", what
            ok = c.get(
                "/files",
                params={"path": "secret.txt"},
                headers={"E2b-Sandbox-Id": b.sandbox_id, "X-Access-Token": b._envd_access_token or ""},
            )
            assert ok.status_code == 200 and ok.text == "b's data"  # the check can pass
            health = c.get("/health")  # envd's health says only "up", to anyone
            assert health.status_code == 204 and health.content == b""
        assert not (world.workspace(b.sandbox_id) / "pwned").exists()
    finally:
        a.kill()
        b.kill()


def test_a_sandbox_sees_nothing_of_another_sandboxs_workspace(world: World) -> None:
    a, b = Sandbox.create(), Sandbox.create()
    try:
        b.files.write("private.txt", "b only")
        theirs = world.workspace(b.sandbox_id)
        assert (theirs / "private.txt").read_text() == "b only"  # there on the host
        # b came after a: its id may be listed (not what lies below it, nor its home's name)
        seen = a.commands.run(f"ls -R {world.root}; cat {theirs}/private.txt; true")
        assert "b only" not in seen.stdout and theirs.name not in seen.stdout and "private" not in seen.stdout
        with pytest.raises(SandboxException, match="Permission denied"):
            a.files.read(f"{theirs}/private.txt")
        with pytest.raises(CommandExitException):
            a.commands.run(f"echo tampered > {theirs}/private.txt")
        assert (theirs / "private.txt").read_text() == "b only"
    finally:
        a.kill()
        b.kill()


def test_the_sandbox_cannot_read_a_credential_in_the_callers_home(world: World, sb: Sandbox) -> None:
    planted = world.home / ".aws" / "credentials"
    # the home is in sight (so the denial below is the policy's, not a missing path)
    assert sb.commands.run(f"cat {world.home}/notes.txt").stdout == "the caller's own file\n"
    with pytest.raises(CommandExitException) as denied:
        sb.commands.run(f"cat {planted}")
    assert MARKER not in denied.value.stdout + denied.value.stderr
    grep = sb.commands.run(f"grep -rs {MARKER[:20]} {world.home} || true")
    assert MARKER not in grep.stdout + grep.stderr
    with pytest.raises(SandboxException) as read:
        sb.files.read(str(planted))
    assert MARKER not in str(read.value)


def test_a_write_outside_the_workspace_is_refused_and_the_host_file_unchanged(
    world: World, sb: Sandbox
) -> None:
    notes = world.home / "notes.txt"
    with pytest.raises(SandboxException):
        sb.files.write(str(notes), "overwritten")
    with pytest.raises(CommandExitException):
        sb.commands.run(f"echo overwritten > {notes}")
    with pytest.raises(SandboxException):
        sb.files.remove(str(notes))
    assert notes.read_text() == "the caller's own file\n"


# --- bad input and what is not offered --------------------------------------------------------------


def test_bad_requests_get_a_typed_4xx_with_a_message(world: World) -> None:
    key = {"X-API-Key": world.token}
    with world.raw() as c:
        cases = [
            (c.post("/v2/sandboxes", content=b"{not json", headers=key), 400),
            (c.post("/v2/sandboxes", json=[], headers=key), 400),
            (c.post("/v2/sandboxes", json={}, headers=key), 400),
            (c.post("/v2/sandboxes", json={"templateID": "base", "timeout": -1}, headers=key), 400),
            (c.post("/v2/sandboxes", json={"templateID": "base", "envVars": {"A": 1}}, headers=key), 400),
            (c.post("/v2/sandboxes", json={"templateID": "no-such-template"}, headers=key), 404),
            (c.get("/sandboxes/no-such-box", headers=key), 404),
            (c.post("/sandboxes/no-such-box/timeout", json={"timeout": 5}, headers=key), 404),
        ]
        for response, status in cases:
            assert response.status_code == status, response.text
            body = response.json()
            assert body["code"] == status and body["message"]
    sandbox = Sandbox.create()
    envd = {"E2b-Sandbox-Id": sandbox.sandbox_id, "X-Access-Token": sandbox._envd_access_token or ""}
    try:
        with world.raw() as c:
            rpc = {**envd, "Content-Type": "application/json"}
            # a server stream answers 200 and ends with the error (Connect's framing)
            frame = json.dumps({"process": {"cmd": ""}}).encode()
            streamed = c.post(
                "/process.Process/Start",
                headers={**envd, "Content-Type": "application/connect+json"},
                content=b"\0" + len(frame).to_bytes(4, "big") + frame,
            )
            assert streamed.status_code == 200
            end = json.loads(streamed.content[5:])
            assert end["error"]["code"] == "invalid_argument" and "cmd" in end["error"]["message"]
            envd_cases = [
                c.post("/process.Process/List", headers=rpc, content=b"{not json"),
                c.post("/filesystem.Filesystem/Stat", headers=rpc, content=b'{"path": 7}'),
                c.post("/filesystem.Filesystem/ListDir", headers=rpc, content=b'{"path": "/nope-nowhere"}'),
                c.post("/files", headers=envd, content=b"data"),
                c.get("/files", headers=envd, params={"path": "."}),
                c.get("/files", headers=envd),
            ]
            for response in envd_cases:
                assert 400 <= response.status_code < 500, response.text
                assert response.json()["message"]
    finally:
        sandbox.kill()
    with pytest.raises(SandboxException, match="template 'no-such-template' not found") as missing:
        Sandbox.create(template="no-such-template")
    assert missing.value.status_code == 404


def test_a_request_naming_a_sandbox_gets_e2bs_answer_never_warrens_own(world: World, sb: Sandbox) -> None:
    envd = {"E2b-Sandbox-Id": sb.sandbox_id, "X-Access-Token": sb._envd_access_token or ""}
    with world.raw() as c:
        other = c.post("/execute", json={"code": "1"}, headers={**envd, "E2b-Sandbox-Port": "8080"})
        assert other.status_code == 502 and "port 8080 is not open" in other.json()["message"]
        assert c.get("/contexts", headers={**envd, "E2b-Sandbox-Port": "8080"}).status_code == 502
        unknown = c.get("/v1/sandboxes", headers=envd)
        assert unknown.status_code == 404 and unknown.json()["code"] == 404, unknown.text
        assert "E2B API" in unknown.json()["message"]
        stranger = c.get("/v1/sandboxes", headers={**envd, "X-Access-Token": "0" * 64})
        assert stranger.status_code == 401 and stranger.json()["code"] == 401
        # the control: the same path without E2B's headers is warren's own API
        own = c.get("/v1/sandboxes")
        assert own.status_code == 401 and "E2B" not in own.text
    interpreter = Sandbox.create("code-interpreter-v1")  # e2b-code-interpreter's default template
    try:
        assert interpreter.commands.run("python3 -c 'print(6 * 7)'").stdout == "42\n"
    finally:
        Sandbox.kill(interpreter.sandbox_id)


def _execute(c: httpx.Client, headers: dict[str, str], code: str) -> list[dict]:
    """``/execute`` on the kernel port as e2b-code-interpreter's ``run_code`` calls it: its
    NDJSON lines."""
    r = c.post("/execute", json={"code": code, "context_id": None, "language": None, "env_vars": None},
               headers=headers, timeout=300)  # fmt: skip
    assert r.status_code == 200, r.text
    return [json.loads(line) for line in r.text.splitlines() if line]


def test_run_code_runs_in_a_jupyter_kernel_inside_the_sandbox(world: World) -> None:
    sandbox = Sandbox.create("code-interpreter-v1")
    home = world.workspace(sandbox.sandbox_id)
    token = sandbox._envd_access_token or ""
    headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "X-Access-Token": token, "E2b-Sandbox-Port": "49999"}
    kernel_env = Path(os.environ["WARREN_E2B_KERNEL_ENV"])
    try:
        with world.raw() as c:
            out = _execute(c, headers, "x = 41\nprint('hi')\nx + 1")
            assert {"type": "stdout", "text": "hi\n"}.items() <= out[1].items()
            result = next(line for line in out if line["type"] == "result")
            assert result["text"] == "42" and result["is_main_result"] is True
            assert [line["type"] for line in _execute(c, headers, "x")] == ["number_of_executions", "result"]
            error = _execute(c, headers, "1/0")[-1]
            assert error["type"] == "error" and error["name"] == "ZeroDivisionError"
            chart = _execute(c, headers, "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
            png = next(line["png"] for line in chart if line["type"] == "result")
            assert png.startswith("iVBORw0KGgo")  # base64 of the PNG signature
            # judged on the host: the kernel's code runs inside, where the sandbox may write ...
            planted = kernel_env / "planted.pth"
            code = (
                "open('made-by-kernel.txt', 'w').write('k')\n"
                f"try:\n    open({str(planted)!r}, 'w').write('import os')\nexcept OSError as e:\n"
                "    print(type(e).__name__)"
            )
            said = "".join(line.get("text", "") for line in _execute(c, headers, code))
            assert (home / "made-by-kernel.txt").read_text() == "k"  # the control: it writes its home
            # ... and the kernel environment every sandbox runs from is not such a place
            assert said in ("OSError\n", "PermissionError\n") and not planted.exists()
            # the kernel port needs the sandbox's access token, as envd does
            for wrong in ("", "0" * 64):
                refused = c.post("/execute", json={"code": "1"}, headers={**headers, "X-Access-Token": wrong})
                assert refused.status_code == 401
            made = c.post("/contexts", json={"language": "python"}, headers=headers)
            assert made.status_code == 200 and made.json()["language"] == "python", made.text
            listed = c.get("/contexts", headers=headers).json()
            assert made.json()["id"] in [ctx["id"] for ctx in listed]
            assert c.delete(f"/contexts/{made.json()['id']}", headers=headers).status_code == 204
            gone = c.delete(f"/contexts/{made.json()['id']}", headers=headers)
            assert gone.status_code == 404 and gone.json()["code"] == 404
    finally:
        Sandbox.kill(sandbox.sandbox_id)


def test_mcp_is_accepted_and_the_sdk_finds_no_gateway_in_the_sandbox(world: World) -> None:
    tag = {"mcp-test": secrets.token_hex(4)}
    with pytest.raises(SandboxException, match="Failed to start MCP gateway"):
        Sandbox.create("base", mcp={"github": {}}, metadata=tag)  # type: ignore[typeddict-item]
    assert Sandbox.list(query=SandboxQuery(metadata=tag)).next_items() == []  # the SDK killed it


def test_sudo_runs_as_the_sandboxs_own_user_and_python_is_python3(world: World, sb: Sandbox) -> None:
    me = sb.commands.run("id -u").stdout
    assert me == f"{os.getuid()}\n"
    assert sb.commands.run("sudo id -u").stdout == me  # no privilege is gained
    assert sb.commands.run("sudo -u root -E id -u").stdout == me
    assert sb.commands.run("sudo -s 'echo $((1 + 2))'").stdout == "3\n"
    assert sb.commands.run("sudo FOO=bar sh -c 'echo $FOO'").stdout == "bar\n"
    with pytest.raises(CommandExitException, match="one user"):
        sb.commands.run("sudo -u nobody true")
    out = sb.commands.run("python -c 'import sys; print(sys.version_info[0])'", envs={"X": "1"})
    assert out.stdout == "3\n"
    # what a process started without a login shell sees too, and never setuid
    path = sb.commands.run("command -v sudo").stdout.strip()
    assert not os.stat(path).st_mode & (stat.S_ISUID | stat.S_ISGID)
    listed = sb.commands.run("ls $(dirname $(command -v sudo))").stdout.split()
    assert listed == ["sudo"]
    if shutil.which("python") is None:  # the control: the host has no python of its own here
        assert sb.commands.run("command -v python").stdout.strip().endswith("/last/python")


def test_network_rules_allow_what_allow_out_names_and_a_change_replaces_them(world: World) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.server.server_address[0])  # type: ignore[index]
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"reached")

        def log_message(self, *args: object) -> None:
            pass

    servers = [ThreadingHTTPServer((host, 0), Handler) for host in ("127.0.0.1", "127.0.0.2")]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    one, two = (
        f"http://{h}:{s.server_address[1]}/" for h, s in zip(("127.0.0.1", "127.0.0.2"), servers, strict=True)
    )
    curl = "curl -s --noproxy '' -o /dev/null -w '%{http_code}' "
    network = {"deny_out": ["0.0.0.0/0"], "allow_out": ["127.0.0.1"]}
    sandbox = Sandbox.create(network=network)  # type: ignore[arg-type]
    try:
        assert sandbox.commands.run(curl + one).stdout == "200"
        assert sandbox.commands.run(curl + two).stdout == "403"  # warren's proxy refuses it
        assert seen == ["127.0.0.1"]
        sandbox.update_network({"deny_out": ["0.0.0.0/0"], "allow_out": ["127.0.0.2"]})
        assert sandbox.commands.run(curl + two).stdout == "200"
        assert sandbox.commands.run(curl + one).stdout == "403"  # no longer allowed
        assert seen == ["127.0.0.1", "127.0.0.2"]
        with pytest.raises(SandboxException, match="opening a sandbox made with a network list"):
            sandbox.update_network({})
        with world.v1() as c:
            log = c.get(f"/v1/sandboxes/{sandbox.sandbox_id}/network").text
        assert "127.0.0.2:*" in log and "127.0.0.1:*" in log  # allowed at run time, denied since
    finally:
        Sandbox.kill(sandbox.sandbox_id)
        for server in servers:
            server.shutdown()
    with pytest.raises(SandboxException, match="denyOut of some addresses"):
        Sandbox.create(allow_internet_access=True, network={"deny_out": ["8.8.8.8"]})
    with pytest.raises(SandboxException, match="egressProxy"):
        Sandbox.create(network={"egress_proxy": {"address": "proxy.example.com:1080"}})
    with pytest.raises(SandboxException, match="invalid allowed host"):
        Sandbox.create(network={"deny_out": ["0.0.0.0/0"], "allow_out": ["169.254.169.254"]})


def test_network_rules_on_a_sandbox_without_a_list_deny_but_never_open(sb: Sandbox) -> None:
    sb.update_network({"deny_out": ["0.0.0.0/0"]})  # it reaches nothing: the denial holds
    for opening in ({"allow_out": ["example.com"], "deny_out": ["0.0.0.0/0"]}, {"deny_out": ["8.8.8.8"]}):
        with pytest.raises(SandboxException, match="without a network list"):
            sb.update_network(opening)  # type: ignore[arg-type]
    assert sb.commands.run("env | grep -ci proxy || true").stdout == "0\n"  # still none


def test_what_an_e2b_client_does_is_in_the_sandboxs_trail_as_e2b(world: World, sb: Sandbox) -> None:
    assert sb.commands.run("echo from-e2b").stdout == "from-e2b\n"
    sb.files.write("trail.txt", "x")
    with world.v1() as c:
        page = c.get(f"/v1/sandboxes/{sb.sandbox_id}/events")
    assert page.status_code == 200, page.text
    records = page.json()["records"]
    ran = [r for r in records if r["kind"] in ("exec", "spawn") and "echo from-e2b" in " ".join(r["argv"])]
    wrote = [r for r in records if r["kind"] == "file" and r["path"].endswith("trail.txt")]
    assert ran and {r["origin"] for r in ran} == {"e2b"}, records
    assert wrote and {r["origin"] for r in wrote} == {"e2b"}, records
    assert world.token.encode() not in json.dumps(records).encode()  # E2B's API key is no origin


def _host_tree(root: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = Path(d, n)
            out[str(p.relative_to(root))] = "dir" if p.is_dir() else p.read_text()
    return out


def test_a_review_sandbox_keeps_its_changes_off_the_host_until_applied_through_v1(world: World) -> None:
    # E2B has no review field: the create's metadata asks for one; warren's /v1 routes
    # (the same service and token) diff, checkpoint, roll back and apply it
    base = Sandbox.create()
    try:
        base.commands.run("mkdir src && echo keep > keep.txt && echo bye > gone.txt && echo old > src/old.py")
        snap = base.create_snapshot()
    finally:
        Sandbox.kill(base.sandbox_id)
    with pytest.raises(SandboxException, match=r"warren\.review must be 'true' or 'false'"):
        Sandbox.create(metadata={"warren.review": "yes"})
    sandbox = Sandbox.create(snap.snapshot_id, metadata={"warren.review": "true"})
    sid, home = sandbox.sandbox_id, world.workspace(sandbox.sandbox_id)
    before = _host_tree(home)
    assert before == {"src": "dir", "keep.txt": "keep\n", "gone.txt": "bye\n", "src/old.py": "old\n"}
    try:
        out = sandbox.commands.run(
            "echo made > made.txt && rm gone.txt && mkdir lib && mv src/old.py lib/new.py && ls"
        )
        assert out.stdout == "keep.txt\nlib\nmade.txt\nsrc\n"
        sandbox.files.write("lib/written.txt", "by the files API")
        assert _host_tree(home) == before  # the host saw nothing
        expected = {
            ("added", "made.txt"),
            ("removed", "gone.txt"),
            ("added", "lib"),
            ("renamed", "lib/new.py"),
            ("added", "lib/written.txt"),
        }
        with world.v1() as c:
            r = c.get(f"/v1/sandboxes/{sid}/diff")
            assert r.status_code == 200, r.text
            assert {(x["kind"], x["path"]) for x in r.json()["changes"]} == expected
            r = c.post(f"/v1/sandboxes/{sid}/checkpoints")
            assert r.status_code == 201, r.text
            point = r.json()["id"]
            assert sandbox.commands.run("rm -rf /home/user/* && ls -A /home/user").stdout == ""
            assert ("removed", "keep.txt") in {
                (x["kind"], x["path"]) for x in c.get(f"/v1/sandboxes/{sid}/diff").json()["changes"]
            }
            r = c.post(f"/v1/sandboxes/{sid}/rollback", json={"id": point})
            assert r.status_code == 200 and r.json()["id"] == point, r.text
            assert sandbox.files.read("lib/written.txt") == "by the files API"
            assert sandbox.commands.run("cat keep.txt made.txt lib/new.py").stdout == "keep\nmade\nold\n"
            assert {
                (x["kind"], x["path"]) for x in c.get(f"/v1/sandboxes/{sid}/diff").json()["changes"]
            } == expected
            # a snapshot would copy the home without the layer: refused, nothing taken
            with pytest.raises(SandboxException, match="review sandbox"):
                sandbox.create_snapshot()
            assert _host_tree(home) == before
            assert c.delete(f"/v1/sandboxes/{sid}", params={"remove": "false"}).status_code == 200
            r = c.post(f"/v1/sandboxes/{sid}/apply", json={})
            assert r.status_code == 200, r.text
        after = dict(before)
        del after["gone.txt"], after["src/old.py"]
        after.update(
            {"made.txt": "made\n", "lib": "dir", "lib/new.py": "old\n", "lib/written.txt": "by the files API"}
        )
        assert _host_tree(home) == after
    finally:
        with world.v1() as c:
            c.delete(f"/v1/sandboxes/{sid}")
        Sandbox.delete_snapshot(snap.snapshot_id)
