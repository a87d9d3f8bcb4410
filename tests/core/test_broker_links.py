"""Which link calls PID 1's broker takes (pure: the notification filter), and the groups
a plan turns on. The links themselves, the attack and the clone, are judged on the host
in tests/test_links.py."""

from __future__ import annotations

from warren._core.broker.loop import _groups
from warren.plan import seccomp
from warren.plan.model import GitDir


def _notified(groups: tuple[str, ...], machine: str) -> set[str]:
    numbers = {k for _code, _jt, _jf, k in seccomp.notify_program(groups, machine)}
    return {name for name, nr in seccomp.BROKERED[machine].items() if nr in numbers}


def test_only_link_2_is_brokered_where_it_exists_and_linkat_where_it_does_not() -> None:
    assert {"link"} == _notified(("links",), "x86_64") & {"link", "linkat"}
    assert {"linkat"} == _notified(("links",), "aarch64") & {"link", "linkat"}
    # Control: without the group, neither.
    assert not _notified(("sockets", "metadata"), "x86_64") & {"link", "linkat"}


class _Plan:
    renames = False
    namespaces = True
    git: tuple[GitDir, ...] = ()


def test_links_are_brokered_only_where_git_data_is_bound_in() -> None:
    plan = _Plan()
    assert "links" not in _groups(plan)  # type: ignore[arg-type]
    plan.git = (GitDir("/w/.git", "/store/tree", ("objects", "refs")),)
    assert "links" in _groups(plan)  # type: ignore[arg-type]
    plan.namespaces = False  # the degraded mode binds nothing
    assert "links" not in _groups(plan)  # type: ignore[arg-type]
