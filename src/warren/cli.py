"""The ``warren`` command line. Parses flags into a PolicySpec and calls the library.

Exit codes: the command's own status (128+N for signal N); 125 the sandbox could not
be set up (including bad flags and invalid policy); 126 the command could not be
executed; 127 the command was not found. Errors print one line and a hint, never a
traceback.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from . import cli_sandbox, config, guard, hostinfo, launch, netns, presets
from . import plan as _plan
from .errors import WarrenError
from .netpolicy import NetEvent, parse_resolve
from .policy import Policy, PolicySpec, build

_RUN_SETTINGS = {"ignore_unknown_options": False, "allow_interspersed_args": False}


def _policy_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option("--workspace", "-w", metavar="DIR", help="The workspace (default: current directory)."),
        click.option("--write", multiple=True, metavar="PATH", help="Also writable (repeatable)."),
        click.option("--read", multiple=True, metavar="PATH", help="Read-only, even inside a writable root."),
        click.option("--deny", multiple=True, metavar="PATH", help="Unreadable: hidden by an empty mount."),
        click.option("--env", "env", multiple=True, metavar="K=V", help="Set an environment variable."),
        click.option("--pass-env", multiple=True, metavar="NAME", help="Pass a variable from the caller."),
        click.option(
            "--preset",
            multiple=True,
            metavar="NAME",
            help="Tool caches: " + ", ".join(presets.names()) + ".",
        ),
        click.option(
            "--profile", metavar="NAME", help="A [profile.NAME] from warren.toml or the user config."
        ),
        click.option(
            "--network",
            type=click.Choice(["none", "allow", "open"]),
            default=None,
            help="none (default): only loopback; allow: through warren's proxy to --allow-host "
            "hosts only; open: outbound through pasta, never the host's loopback.",
        ),
        click.option(
            "--allow-host",
            multiple=True,
            metavar="HOST[:PORT]",
            help="Reachable in --network allow (implies it): pypi.org, *.example.org, "
            "host:8443, 10.0.0.5:80, [::1]:8080. Presets add their registries.",
        ),
        click.option(
            "--resolve",
            multiple=True,
            metavar="NAME=ADDR",
            help="Answer NAME with ADDR instead of DNS, in the proxy (like curl --resolve).",
        ),
        click.option(
            "--no-default-deny", is_flag=True, help="Do not hide ~/.ssh, ~/.aws and other credentials."
        ),
        click.option("--read-only-workspace", is_flag=True, help="Mount the workspace read-only."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _parse_env(pairs: tuple[str, ...]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise WarrenError(
                f"--env expects KEY=VALUE, got {pair!r}",
                operation="cli",
                hint="write it as --env NAME=value",
            )
        env[key] = value
    return env


def policy_from_flags(opts: dict[str, Any]) -> Policy:
    cwd = Path.cwd()
    flags = PolicySpec(
        workspace=opts.get("workspace"),
        write=list(opts.get("write", ())),
        read=list(opts.get("read", ())),
        deny=list(opts.get("deny", ())),
        env=_parse_env(tuple(opts.get("env", ()))),
        env_pass=list(opts.get("pass_env", ())),
        presets=list(opts.get("preset", ())),
        network=opts.get("network"),
        allow_hosts=list(opts.get("allow_host", ())),
        resolve=parse_resolve(opts.get("resolve", ())),
        default_deny=False if opts.get("no_default_deny") else None,
        workspace_writable=False if opts.get("read_only_workspace") else None,
    )
    home = Path(os.environ.get("HOME") or os.path.expanduser("~"))
    workspace = Path(os.path.realpath(cwd / flags.workspace)) if flags.workspace else cwd.resolve()
    if not workspace.is_dir():
        # Let build() produce the precise error (missing, not a directory).
        return build(flags, cwd=cwd, home=home)
    files = config.load_spec(workspace, opts.get("profile"), home=home)
    return build(files.merged(flags), cwd=cwd, home=home)


def _make_plan(policy: Policy) -> _plan.Plan:
    paths = [r.path for r in (*policy.writable, *policy.readable, *policy.denied)]
    return _plan.make_plan(policy, hostinfo.gather_for(paths))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="warren")
def main() -> None:
    """warren: a sandbox for AI coding agents in which real developer tools work."""


@main.command(context_settings=_RUN_SETTINGS)
@_policy_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(command: tuple[str, ...], **opts: Any) -> None:
    """Run COMMAND in a one-shot sandbox: warren run [FLAGS] -- CMD [ARGS]..."""
    plan = _make_plan(policy_from_flags(opts))
    for warning in plan.warnings:
        click.echo(f"warren: WARNING: {warning}", err=True)
    sys.exit(_run_attached(plan, list(command)))


def _run_attached(plan: _plan.Plan, argv: list[str]) -> int:
    """Run with the caller's stdio and terminal; return the exit status to use."""
    from .oneshot import start_network

    before = guard.snapshot(plan)
    child = launch.start(plan, argv)
    net = start_network(plan, child, _print_denial)

    def forward(signum: int, _frame: object) -> None:
        child.kill(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    for sig in (signal.SIGINT, signal.SIGQUIT):
        # On a terminal the command receives these itself; otherwise relay them.
        signal.signal(sig, signal.SIG_IGN if not plan.new_session else forward)
    try:
        outcome = child.wait()
    finally:
        netns.stop(net)
    assert outcome is not None
    for note in guard.restore(before):
        click.echo(f"warren: WARNING: {note}", err=True)
    if outcome.error is not None:
        raise outcome.error
    return outcome.exit_code


def _print_denial(event: NetEvent) -> None:
    if not event.allowed:
        click.echo(
            f"warren: network: refused {event.method} {event.host}:{event.port}: {event.reason}", err=True
        )


@main.command("plan")
@_policy_options
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan_cmd(as_json: bool, **opts: Any) -> None:
    """Print exactly what `warren run` with these flags would set up."""
    from .render import render

    plan = _make_plan(policy_from_flags(opts))
    if as_json:
        click.echo(json.dumps(plan.to_dict(), indent=2, default=str))
    else:
        click.echo(render(plan))


@main.command("presets")
def presets_cmd() -> None:
    """List the tool presets and what they make writable."""
    for name, summary in presets.describe():
        click.echo(f"{name:8} {summary}")


@main.command("doctor")
@_policy_options
@click.option("--cache", multiple=True, metavar="DIR", help="A cache to probe (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (schema warren-doctor/1).")
@click.option(
    "--sandbox",
    is_flag=True,
    help="Run the probes inside a warren sandbox built from the policy flags.",
)
def doctor_cmd(cache: tuple[str, ...], as_json: bool, sandbox: bool, **opts: Any) -> None:
    """Probe the filesystem semantics developer tools need, here; name each failure's cause."""
    from .doctor import probe_main

    if sandbox:
        sys.exit(_doctor_in_sandbox(opts, cache, as_json))
    given = [name for name, value in opts.items() if value and name != "workspace"]
    if given:
        raise WarrenError(
            f"policy flags need --sandbox: {', '.join('--' + g.replace('_', '-') for g in given)}",
            operation="doctor",
            hint="add --sandbox to probe inside a sandbox built from them",
        )
    try:
        text, code = probe_main.run(opts.get("workspace"), cache, as_json=as_json)
    except probe_main.UsageError as e:
        raise WarrenError(str(e), operation="doctor", hint="pass an existing directory") from None
    click.echo(text)
    sys.exit(code)


def _doctor_in_sandbox(opts: dict[str, Any], cache: tuple[str, ...], as_json: bool) -> int:
    """The same probes, run by the same interpreter inside the sandbox the policy makes."""
    from dataclasses import replace

    from .oneshot import run_plan

    package_parent = str(Path(__file__).resolve().parent.parent)
    opts = {**opts, "env": (*opts.get("env", ()), f"PYTHONPATH={package_parent}")}
    policy = policy_from_flags(opts)
    caches = list(cache) or [str(r.path) for r in policy.writable if r.path != policy.workspace]
    plan = replace(_make_plan(policy), new_session=True)
    for warning in plan.warnings:
        click.echo(f"warren: WARNING: {warning}", err=True)
    argv = [sys.executable, "-m", "warren.doctor.probe_main", "--only-given"]
    argv += ["--workspace", str(policy.workspace)]
    for c in caches:
        argv += ["--cache", c]
    if as_json:
        argv.append("--json")
    result = run_plan(plan, argv, cwd=str(policy.workspace))
    sys.stdout.buffer.write(result.stdout)
    sys.stderr.buffer.write(result.stderr)
    return result.exit_code


cli_sandbox.register(main, _policy_options, policy_from_flags, _parse_env)


def entrypoint(argv: list[str] | None = None) -> int:
    try:
        main.main(args=argv, prog_name="warren", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as e:
        click.echo(e.ctx.get_help() if e.ctx else str(e))
        return 0
    except click.UsageError as e:
        cmd = e.ctx.command_path if e.ctx else "warren"
        click.echo(f"warren: {e.format_message()}", err=True)
        click.echo(f"  hint: see `{cmd} --help`", err=True)
        return 125
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.Abort:
        click.echo("warren: aborted", err=True)
        return 130
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 0
    except WarrenError as e:
        click.echo(str(e), err=True)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    return 0


def console_main() -> None:
    sys.exit(entrypoint())
