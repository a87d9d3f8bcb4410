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
    assert _open_beneath(tmp_path) == []
    _plan, found, _host = planner.plan(ahead.Request({"workspace": str(ws)}, caller, msg_caller, None, None))
    assert found.roots  # the workspace's descriptor, held for the launch
    assert _open_beneath(tmp_path)  # the control: the check sees them
    found.close()
    assert _open_beneath(tmp_path) == []


def _open_beneath(where: Path) -> list[str]:
    """This process's descriptors on a path beneath ``where``. (Judged by what they name,
    not by comparing the whole table: a thread an earlier test left in this worker may
    open or close descriptors of its own meanwhile, which failed a gate once.)"""
    named = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target == str(where) or target.startswith(f"{where}/"):
            named.append(target)
    return named


# --- a plan made again from what it was made from (``planning.Basis``) -------------------


def _request(caller: CallerFacts, msg_caller: protocol.Caller, spec: dict[str, object]) -> ahead.Request:
    return ahead.Request(spec, caller, msg_caller, None, None)


def test_a_plan_made_from_an_equal_basis_is_the_same_plan_and_is_not_made_again(tmp_path: Path) -> None:
    """``make_plan`` gets fresh random names each time (a secret's nonce, a review layer,
    a trust bundle): for a plan that takes none of them, planning twice with the same
    TMPDIR name gives equal plans from equal bases, so the plan known for that basis is
    returned as it is (the sandbox booted ahead's)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    caller, msg_caller = _caller(tmp_path, ws)
    planner = planning.Planner(str(tmp_path / "state"), links.LinkScanner(), gitkeeper.GitKeeper())
    request = _request(caller, msg_caller, {"workspace": str(ws)})
    first, found, _host, basis = planner.planned(request, scratch_id="a" * 24)
    found.close()
    again, found, _host, basis_again = planner.planned(request, scratch_id="a" * 24)
    found.close()
    assert basis is not None and basis_again == basis
    assert again == first and again is not first  # made again: equal
    known, found, _host, _basis = planner.planned(request, scratch_id="a" * 24, known=(basis, first))
    found.close()
    assert known is first
    # Another TMPDIR name is another basis: the plan is made again (another one where the
    # TMPDIR is made outside the workspace, not under /tmp as here).
    other, found, _host, other_basis = planner.planned(request, scratch_id="b" * 24, known=(basis, first))
    found.close()
    assert other_basis != basis and other is not first


def test_a_plan_is_made_again_when_the_callers_directory_resolves_elsewhere(tmp_path: Path) -> None:
    """The caller's directory resolved is the one thing of the host ``make_plan`` reads
    itself (where commands start): a symlink retargeted since is another basis, and
    the plan known for the old one is not returned."""
    ws = tmp_path / "ws"
    (ws / "a").mkdir(parents=True)
    (ws / "b").mkdir()
    here = tmp_path / "here"
    here.symlink_to(ws / "a")
    caller, msg_caller = _caller(tmp_path, ws)
    caller = CallerFacts(caller.uid, caller.gid, caller.home, caller.env, str(here))
    planner = planning.Planner(str(tmp_path / "state"), links.LinkScanner(), gitkeeper.GitKeeper())
    request = _request(caller, msg_caller, {"workspace": str(ws)})
    first, found, _host, basis = planner.planned(request, scratch_id="c" * 24)
    found.close()
    assert basis is not None and first.cwd == str(ws / "a")
    here.unlink()
    here.symlink_to(ws / "b")
    now, found, _host, now_basis = planner.planned(request, scratch_id="c" * 24, known=(basis, first))
    found.close()
    assert now_basis != basis and now is not first
    assert now.cwd == str(ws / "b")


def test_a_plan_is_made_again_when_the_policy_or_the_caller_changed(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "secret").mkdir()
    caller, msg_caller = _caller(tmp_path, ws)
    planner = planning.Planner(str(tmp_path / "state"), links.LinkScanner(), gitkeeper.GitKeeper())
    first, found, _host, basis = planner.planned(
        _request(caller, msg_caller, {"workspace": str(ws)}), scratch_id="d" * 24
    )
    found.close()
    assert basis is not None
    denied = _request(caller, msg_caller, {"workspace": str(ws), "deny": [str(tmp_path / "secret")]})
    plan, found, _host, _basis = planner.planned(denied, scratch_id="d" * 24, known=(basis, first))
    found.close()
    assert plan is not first and plan != first
    env = {**caller.env, "LANG": "C.UTF-8", "EXTRA_FOR_THE_TEST": "1"}
    moved = CallerFacts(caller.uid, caller.gid, caller.home, env, caller.cwd)
    plan, found, _host, _basis = planner.planned(
        _request(moved, msg_caller, {"workspace": str(ws)}), scratch_id="d" * 24, known=(basis, first)
    )
    found.close()
    assert plan is not first


def test_a_plan_that_takes_fresh_names_has_no_basis(tmp_path: Path) -> None:
    """A review sandbox's layer is a fresh name each time: no plan of it is reused."""
    ws = tmp_path / "ws"
    ws.mkdir()
    caller, msg_caller = _caller(tmp_path, ws)
    planner = planning.Planner(str(tmp_path / "state"), links.LinkScanner(), gitkeeper.GitKeeper())
    request = ahead.Request(
        {"workspace": str(ws), "review": True}, caller, msg_caller, None, None, long_lived=True
    )
    plan, found, _host, basis = planner.planned(request, scratch_id="e" * 24)
    found.close()
    assert basis is None and plan.review is not None
