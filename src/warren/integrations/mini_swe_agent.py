"""warren as a mini-swe-agent environment: ``WarrenEnvironment``.

Named in mini-swe-agent's config as
``environment_class: warren.integrations.mini_swe_agent.WarrenEnvironment``; its keys
are those of mini-swe-agent's own environments (``cwd``, ``env``, ``forward_env``,
``timeout``, ``interpreter``) plus ``policy`` (warren.toml keys) and ``name``. With
none it is a sandbox for the current directory under warren's default policy.

Each action runs in one long-lived warren sandbox made when the environment is, so
files, background processes and the sandbox's /tmp carry from one step to the next
as they do in mini-swe-agent's docker environment. Results have the shape its
environments return (``output`` with stderr folded in, ``returncode``,
``exception_info``), a timeout reads as its local environment's does, and the submit
convention is the same: output whose first line is
``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``, from a command that exited 0, raises
``Submitted`` with the rest as the submission.

``cwd`` is where the local environment runs its commands, a directory of the host;
when the policy names no workspace, that directory is the sandbox's workspace (so a
``cwd`` in the host's temp dir works as it does locally, and what the agent writes
there is on the host). Other directories are in the sandbox only as the policy grants
them: a per-command ``cwd`` that exists on the host but that the sandbox does not see
is an error saying so and how to grant it, not a hint to create it. Template variables hold the config and
the machine's uname, never the host environment (it would reach the model's prompt).
"""

from __future__ import annotations

import contextlib
import os
import platform
import uuid
from typing import Any

from minisweagent.exceptions import Submitted
from minisweagent.utils.serialize import recursive_merge
from pydantic import BaseModel, Field, field_validator

from ..client.sandbox import Sandbox
from ..errors import CwdNotFound, SandboxNotFound, WarrenError
from ..policy.spec import from_mapping
from ._policy import merged_stdout, spec_from, workspace_named

__all__ = ["SUBMIT_MARKER", "WarrenEnvironment", "WarrenEnvironmentConfig"]

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class WarrenEnvironmentConfig(BaseModel):
    cwd: str = ""
    """Where commands run; the sandbox's workspace when empty, and the workspace
    itself when the policy names none."""
    env: dict[str, str] = {}
    """Environment variables set for every command."""
    forward_env: list[str] = []
    """Variables passed from the host environment when set there (``env`` wins)."""
    timeout: int = 30
    """Seconds a command may run; then its whole process tree is killed."""
    interpreter: list[str] = ["bash", "-c"]
    """The command is appended to this as one argument."""
    policy: dict[str, Any] = Field(default_factory=dict)
    """warren's policy keys, as in warren.toml (``workspace``, ``preset``, ``network``...)."""
    name: str | None = None
    """The warren sandbox's name (a fresh one when empty)."""

    @field_validator("policy")
    @classmethod
    def _known_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        from_mapping(value, "WarrenEnvironment policy")  # raises warren's ConfigError
        return value


def _unseen_cwd(error: CwdNotFound, cwd: str, sandbox: Sandbox | None) -> CwdNotFound:
    """``error``, or when ``cwd`` is a directory of the host (outside what the sandbox
    was given) an error that says so: creating it in the sandbox would not help."""
    if not cwd or not os.path.isdir(cwd) or sandbox is None:
        return error
    return CwdNotFound(
        f"the working directory {cwd} is on the host but not in this sandbox "
        f"(its workspace is {sandbox.workspace})",
        operation="exec",
        path=cwd,
        hint="make it the workspace (leave policy's workspace unset and set cwd), grant it "
        '(policy {"write": [...]}), or run beneath the workspace',
    )


class WarrenEnvironment:
    """Runs mini-swe-agent's actions in a warren sandbox; ``cleanup()`` removes it."""

    def __init__(
        self, *, config_class: type[WarrenEnvironmentConfig] = WarrenEnvironmentConfig, **kwargs: Any
    ):
        self.config = config_class(**kwargs)
        spec = spec_from(self.config.policy, "WarrenEnvironment policy")
        if self.config.cwd and not workspace_named(self.config.policy):
            spec.workspace = os.path.abspath(self.config.cwd)
        self.sandbox: Sandbox | None = Sandbox.create(
            spec, self.config.name or f"mini-swe-agent-{uuid.uuid4().hex[:12]}"
        )

    def _env(self) -> dict[str, str]:
        forwarded = {key: os.environ[key] for key in self.config.forward_env if key in os.environ}
        return {**forwarded, **self.config.env}

    def execute(self, action: dict[str, Any], cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Run ``action["command"]``; raises ``Submitted`` on the submit convention."""
        command = str(action.get("command", ""))
        limit = timeout or self.config.timeout
        output: dict[str, Any]
        try:
            if self.sandbox is None:
                raise SandboxNotFound(
                    "the environment's sandbox was removed by cleanup()",
                    operation="exec",
                    hint="make a new WarrenEnvironment",
                )
            result = self.sandbox.exec(
                merged_stdout([*self.config.interpreter, command]),
                cwd=cwd or self.config.cwd or None,
                env=self._env() or None,
                timeout=limit,
            )
        except CwdNotFound as e:
            error = _unseen_cwd(e, cwd or self.config.cwd, self.sandbox)
            output = {
                "output": "",
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {error}",
                "extra": {"exception_type": type(error).__name__, "exception": str(error)},
            }
        except WarrenError as e:
            output = {
                "output": "",
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {e}",
                "extra": {"exception_type": type(e).__name__, "exception": str(e)},
            }
        else:
            text = result.stdout.decode("utf-8", errors="replace")
            if result.timed_out:
                message = f"Command '{command}' timed out after {limit} seconds"
                output = {
                    "output": text,
                    "returncode": -1,
                    "exception_info": f"An error occurred while executing the command: {message}",
                    "extra": {"exception_type": "TimeoutExpired", "exception": message},
                }
            else:
                output = {"output": text, "returncode": result.exit_code, "exception_info": ""}
        self._check_finished(output)
        return output

    def _check_finished(self, output: dict[str, Any]) -> None:
        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted(
                {
                    "role": "exit",
                    "content": submission,
                    "extra": {"exit_status": "Submitted", "submission": submission},
                }
            )

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        merged: dict[str, Any] = recursive_merge(self.config.model_dump(), platform.uname()._asdict(), kwargs)
        return merged

    def serialize(self) -> dict[str, Any]:
        return {
            "info": {
                "config": {
                    "environment": self.config.model_dump(mode="json"),
                    "environment_type": f"{self.__class__.__module__}.{self.__class__.__name__}",
                }
            }
        }

    def cleanup(self) -> None:
        """Remove the sandbox (its workspace stays)."""
        sandbox, self.sandbox = getattr(self, "sandbox", None), None
        if sandbox is not None:
            with contextlib.suppress(SandboxNotFound):
                sandbox.remove()

    def __del__(self) -> None:
        # As mini-swe-agent's docker environment: a forgotten environment takes its
        # sandbox with it. At interpreter exit the supervisor may already be unreachable.
        with contextlib.suppress(Exception):
            self.cleanup()
