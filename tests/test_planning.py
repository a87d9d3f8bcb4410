"""Planning a request changes nothing on disk: the repositories a sandbox will have
get their stores when it launches (``GitKeeper.lease``), not when it is planned, and
what the plan says of them is what the launch makes. Judged on disk, with host git."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import host_git
from warren import protocol
from warren.plan import CallerFacts
from warren.server import ahead, gitkeeper, gitstore, links, planning


def _caller(tmp_path: Path, ws: Path) -> tuple[CallerFacts, protocol.Caller]:
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "XDG_DATA_HOME": str(home / "data"), "PATH": os.environ.get("PATH", "/usr/bin")}
    return CallerFacts.here(env=env, cwd=str(ws)), protocol.Caller(cwd=str(ws), env=env)


def test_planning_makes_no_git_store_and_the_launch_makes_the_one_planned(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    host_git(ws, "init", "-q")
    caller, msg_caller = _caller(tmp_path, ws)
    keeper = gitkeeper.GitKeeper()
    planner = planning.Planner(str(tmp_path / "state"), links.LinkScanner(), keeper)
    gitdir = str(ws / ".git")
    store = gitstore.location(gitdir, caller.env)
    before = sorted(os.listdir(gitdir))

    request = ahead.Request({"workspace": str(ws)}, caller, msg_caller, None, None, long_lived=True)
    plan, found, _host = planner.plan(request)

    assert [g.path for g in plan.git] == [gitdir]
    assert not os.path.exists(store) and sorted(os.listdir(gitdir)) == before
    lease = keeper.lease(found)
    try:
        assert [(s.path, s.tree, s.shared) for s in lease.shadows] == [
            (g.path, g.tree, g.shared) for g in plan.git
        ]
        assert os.path.isdir(os.path.join(store, "tree"))
        assert all(os.path.isdir(os.path.join(gitdir, name)) for name in plan.git[0].shared)
    finally:
        keeper.release(lease)


def test_a_plan_not_launched_lets_go_of_what_it_opened(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    host_git(ws, "init", "-q")
    caller, msg_caller = _caller(tmp_path, ws)
    planner = planning.Planner(None, links.LinkScanner(), gitkeeper.GitKeeper())
    fds_before = set(os.listdir("/proc/self/fd"))
    _plan, found, _host = planner.plan(ahead.Request({"workspace": str(ws)}, caller, msg_caller, None, None))
    assert found.roots  # the workspace's descriptor, held for the launch
    found.close()
    assert set(os.listdir("/proc/self/fd")) == fds_before
