"""warren as a mini-swe-agent environment, against the real ``mini-swe-agent``: the
result shape and submit convention of its own environments, loading by
``environment_class``, confinement judged on the host, and one ``DefaultAgent`` run
with its deterministic test model."""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from conftest import module_state
from warren import ConfigError, Sandbox

ENV_CLASS = "warren.integrations.mini_swe_agent.WarrenEnvironment"


@pytest.fixture(scope="module", autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from module_state(tmp_path_factory)


@pytest.fixture(scope="module")
def msa(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """The integration module; mini-swe-agent makes its global config directory on
    import, so it is pointed at a private one first."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MSWEA_GLOBAL_CONFIG_DIR", str(tmp_path_factory.mktemp("mswea")))
        mp.setenv("MSWEA_SILENT_STARTUP", "1")
        yield importlib.import_module("warren.integrations.mini_swe_agent")


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


@pytest.fixture
def env(msa: ModuleType, ws: Path) -> Iterator[Any]:
    environment = msa.WarrenEnvironment(policy={"workspace": str(ws)})
    yield environment
    environment.cleanup()


def _names() -> set[str]:
    return {info.name for info in Sandbox.list()}


def test_constructible_with_no_arguments_for_the_current_directory(
    msa: ModuleType, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ws)
    environment = msa.WarrenEnvironment()
    try:
        assert environment.execute({"command": "pwd"})["output"] == f"{ws}\n"
    finally:
        environment.cleanup()


def test_results_have_the_shape_of_mini_swe_agent_environments(env: Any) -> None:
    out = env.execute({"command": "echo a; echo b >&2; echo c; exit 4"})
    assert out == {"output": "a\nb\nc\n", "returncode": 4, "exception_info": ""}


def test_environment_class_in_the_config_loads_it(msa: ModuleType, ws: Path) -> None:
    from minisweagent.environments import get_environment

    environment = get_environment(
        {"environment_class": ENV_CLASS, "policy": {"workspace": str(ws)}, "env": {"SET_BY_CONFIG": "yes"}}
    )
    try:
        assert isinstance(environment, msa.WarrenEnvironment)
        assert environment.execute({"command": "echo $SET_BY_CONFIG; pwd"})["output"] == f"yes\n{ws}\n"
        assert environment.serialize()["info"]["config"]["environment_type"] == ENV_CLASS
    finally:
        environment.cleanup()


def test_the_submit_convention_raises_submitted_with_the_rest_of_the_output(env: Any) -> None:
    from minisweagent.exceptions import Submitted

    with pytest.raises(Submitted) as info:
        env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo the patch"})
    message = info.value.messages[0]
    assert message["extra"] == {"exit_status": "Submitted", "submission": "the patch\n"}
    failed = env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; exit 1"})
    assert failed["returncode"] == 1  # only a command that succeeded submits


def test_a_timeout_reads_as_the_local_environments_does(env: Any) -> None:
    out = env.execute({"command": "echo started; sleep 60"}, timeout=1)
    assert out["returncode"] == -1
    assert "timed out after 1 seconds" in out["exception_info"]
    assert out["extra"]["exception_type"] == "TimeoutExpired"
    assert out["output"] == "started\n"


def test_the_sandbox_carries_state_from_one_step_to_the_next(env: Any) -> None:
    env.execute({"command": "echo remembered > /tmp/step1"})
    assert env.execute({"command": "cat /tmp/step1"})["output"] == "remembered\n"


def test_forward_env_passes_named_host_variables_only(
    msa: ModuleType, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORWARD_ME", "forwarded")
    monkeypatch.setenv("HOST_TOKEN", "secret-token")
    environment = msa.WarrenEnvironment(policy={"workspace": str(ws)}, forward_env=["FORWARD_ME"])
    try:
        out = environment.execute({"command": 'echo "$FORWARD_ME ${HOST_TOKEN-unset}"'})
        assert out["output"] == "forwarded unset\n"
        assert "secret-token" not in str(environment.get_template_vars())
    finally:
        environment.cleanup()


def test_commands_cannot_read_secrets_or_write_outside(env: Any, outside: Path, planted_secret: Path) -> None:
    out = env.execute({"command": f"cat {planted_secret}; echo pwned > {outside}; echo done"})
    assert "done" in out["output"]
    assert "PLANTED-SECRET" not in out["output"]
    assert outside.read_text() == "keep me\n"


def test_a_cwd_in_the_hosts_temp_dir_is_where_commands_run_as_with_the_local_environment(
    msa: ModuleType, tmp_path: Path
) -> None:
    """mini-swe-agent's local environment runs in ``cwd``, a host directory (its tests
    use one in the host's temp dir); with no workspace in the policy that directory is
    the sandbox's workspace, and what a command writes there is on the host."""
    from minisweagent.environments.local import LocalEnvironment

    work = tmp_path / "task"
    work.mkdir()
    local = LocalEnvironment(cwd=str(work)).execute({"command": "pwd; echo local > local.txt"})
    environment = msa.WarrenEnvironment(cwd=str(work))
    try:
        result = environment.execute({"command": "pwd; echo sandboxed > sandboxed.txt"})
    finally:
        environment.cleanup()
    assert (result["output"], result["returncode"]) == (local["output"], 0) == (f"{work}\n", 0)
    assert (work / "local.txt").read_text() == "local\n"
    assert (work / "sandboxed.txt").read_text() == "sandboxed\n"


def test_a_cwd_the_sandbox_was_not_given_says_so_without_a_hint_to_create_it(
    env: Any, ws: Path, tmp_path: Path
) -> None:
    """A per-command cwd outside the workspace, existing on the host: the sandbox does
    not see it, and the error says that and how to grant it (creating it in the
    sandbox, the hint it had, is wrong). The control: a directory the host does not
    have either keeps warren's hint to create it."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = env.execute({"command": "pwd"}, cwd=str(elsewhere))
    assert result["returncode"] == -1 and result["extra"]["exception_type"] == "CwdNotFound"
    assert "on the host but not in this sandbox" in result["exception_info"]
    assert str(ws) in result["exception_info"] and "mkdir" not in result["exception_info"]
    missing = env.execute({"command": "pwd"}, cwd=str(tmp_path / "nowhere"))
    assert missing["returncode"] == -1 and "mkdir -p" in missing["exception_info"]


def test_an_unknown_policy_key_is_warrens_config_error_with_a_hint(msa: ModuleType) -> None:
    with pytest.raises(ConfigError) as info:
        msa.WarrenEnvironment(policy={"netwrok": "open"})
    assert "known keys" in info.value.hint


def test_cleanup_removes_the_sandbox_and_later_actions_say_why(msa: ModuleType, ws: Path) -> None:
    environment = msa.WarrenEnvironment(policy={"workspace": str(ws)}, name=f"t-{os.getpid()}-msa")
    assert f"t-{os.getpid()}-msa" in _names()
    environment.cleanup()
    assert f"t-{os.getpid()}-msa" not in _names()
    out = environment.execute({"command": "true"})
    assert out["returncode"] == -1
    assert "hint:" in out["exception_info"]


def test_a_default_agent_run_works_in_warren_and_submits(
    msa: ModuleType, env: Any, ws: Path, outside: Path, planted_secret: Path
) -> None:
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.models.test_models import DeterministicModel

    def say(command: str) -> dict[str, Any]:
        return {"role": "assistant", "content": command, "extra": {"actions": [{"command": command}]}}

    model = DeterministicModel(
        outputs=[
            say(f"cat {planted_secret}; echo pwned > {outside}; echo fixed > fix.txt"),
            say("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; cat fix.txt"),
        ]
    )
    agent = DefaultAgent(model, env, system_template="You fix things.", instance_template="{{task}}")
    result = agent.run("fix it")

    assert result["exit_status"] == "Submitted"
    assert result["submission"] == "fixed\n"
    assert (ws / "fix.txt").read_text() == "fixed\n"
    assert "PLANTED-SECRET" not in str(agent.messages)
    assert outside.read_text() == "keep me\n"
