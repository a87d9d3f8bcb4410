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


class _Net:
    mode = "allow"


class _Plan:
    renames = False
    namespaces = True
    git: tuple[GitDir, ...] = ()
    net = _Net()


def test_links_are_brokered_only_where_git_data_is_bound_in() -> None:
    plan = _Plan()
    assert "links" not in _groups(plan)  # type: ignore[arg-type]
    plan.git = (GitDir("/w/.git", "/store/tree", ("objects", "refs")),)
    assert "links" in _groups(plan)  # type: ignore[arg-type]
    plan.namespaces = False  # the degraded mode binds nothing
    assert "links" not in _groups(plan)  # type: ignore[arg-type]


def test_listen_is_brokered_only_in_the_degraded_mode_under_allow_or_none() -> None:
    """Only there does a sandbox share the host's network namespace with a network line
    to hold (``_core.broker.sockets.listen``); elsewhere listen() stays the kernel's."""
    plan = _Plan()
    assert "listeners" not in _groups(plan)  # type: ignore[arg-type]
    plan.namespaces = False
    for mode, brokered in (("allow", True), ("none", True), ("open", False)):
        plan.net = _Net()
        plan.net.mode = mode
        assert ("listeners" in _groups(plan)) == brokered, mode  # type: ignore[arg-type]
    assert "listen" in _notified(("sockets", "listeners"), "x86_64") and "listen" in _notified(
        ("sockets", "listeners"), "aarch64"
    )
    assert "listen" not in _notified(("sockets", "metadata"), "x86_64")  # control
