"""Process hardening (``_core.harden``) applied in a forked child, judged from the
host: Landlock confines writes to the writable roots yet lets renames and links cross
between them (REFER), a denied path stays unreadable, the seccomp filter refuses what
it lists, PID 1's settling leaves no capability and no way to gain one."""

from __future__ import annotations

import dataclasses
import os
import types
from pathlib import Path

import pytest

from warren._core import _sys, harden, kernel
from warren.errors import SetupError
from warren.plan import landlock, seccomp

from .child import attempt, in_child

PR_GET_DUMPABLE = 3


def _abi() -> int:
    abi = kernel.landlock_abi()
    if abi < 2:
        pytest.skip(f"Landlock ABI {abi} on this kernel: these tests need 2 or later (REFER)")
    return abi


def _confined(ruleset: int) -> None:
    """The steps of ``harden.harden`` that the Landlock tests need, without a plan."""
    _sys.prctl(_sys.PR_SET_NO_NEW_PRIVS, 1)
    _sys.landlock_restrict_self(ruleset)


def test_writes_only_beneath_writable_roots_and_renames_cross_between_them(tmp_path: Path) -> None:
    a, b, outside = tmp_path / "a", tmp_path / "b", tmp_path / "outside"
    for d in (a, b, outside):
        d.mkdir()
    (a / "f").write_text("1")
    ll = landlock.plan(_abi(), [str(a), str(b)], (), ())

    def inside() -> dict[str, str]:
        _confined(harden.landlock_ruleset(ll))
        return {
            "outside": attempt(lambda: (outside / "x").write_text("x")),
            "in a": attempt(lambda: (a / "new").write_text("x")),
            "rename a->b": attempt(lambda: os.rename(a / "f", b / "f")),
            "link b->a": attempt(lambda: os.link(b / "f", a / "g")),
            "read outside": attempt(lambda: os.listdir(outside)),
        }

    got = in_child(inside)
    assert got == {
        "outside": "EACCES",
        "in a": "ok",
        "rename a->b": "ok",
        "link b->a": "ok",
        "read outside": "ok",
    }
    assert not (outside / "x").exists()
    assert not (a / "f").exists() and (b / "f").stat().st_ino == (a / "g").stat().st_ino


def test_a_denied_path_stays_unreadable_even_when_made_after_the_rules(tmp_path: Path) -> None:
    """Also through a link that names a directory above it (``up``: a rule for the
    link's target would be a rule for that directory, and everything in it)."""
    ws, secret, public = tmp_path / "ws", tmp_path / "secret", tmp_path / "public"
    for d in (ws, secret, public):
        d.mkdir()
    (public / "p").write_text("p")
    (secret / "old").write_text("s")
    (public / "up").symlink_to(tmp_path)
    ll = landlock.plan(_abi(), [str(ws)], (), (), denied=(str(secret),))

    def inside() -> dict[str, str]:
        ruleset = harden.landlock_ruleset(ll)
        (secret / "late").write_text("made after the ruleset")  # before the domain applies
        _confined(ruleset)
        return {
            "old": attempt(lambda: (secret / "old").read_text()),
            "late": attempt(lambda: (secret / "late").read_text()),
            "via the link": attempt(lambda: (public / "up" / "secret" / "old").read_text()),
            "public": attempt(lambda: (public / "p").read_text()),
            "public via the link": attempt(lambda: (public / "up" / "public" / "p").read_text()),
        }

    assert in_child(inside) == {
        "old": "EACCES",
        "late": "EACCES",
        "via the link": "EACCES",
        "public": "ok",
        "public via the link": "ok",
    }


def test_a_writable_root_gone_before_the_rules_is_a_setup_error_naming_it(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    ll = landlock.plan(_abi(), [str(gone)], (), ())
    with pytest.raises(SetupError) as caught:
        harden.landlock_ruleset(ll)
    assert caught.value.path == str(gone) and caught.value.hint


def test_a_read_rule_for_something_gone_meanwhile_is_dropped_not_an_error(tmp_path: Path) -> None:
    """The walk above a denied path lists entries that another process may remove
    before the ruleset is built (a sibling in $HOME): no read to grant, no failure. A
    writable root gone is still an error (the previous test)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    planned = landlock.plan(_abi(), [str(ws)], (), ())
    gone = landlock.LandlockRule(str(tmp_path / "gone"), landlock.READ, "listed, then removed")
    ll = dataclasses.replace(planned, rules=(*planned.rules, gone))

    def inside() -> dict[str, str]:
        _confined(harden.landlock_ruleset(ll))
        return {"ws": attempt(lambda: (ws / "x").write_text("x"))}

    assert in_child(inside) == {"ws": "ok"}
    assert (ws / "x").read_text() == "x"


def test_the_seccomp_filter_refuses_nested_user_namespaces_and_keyrings() -> None:
    """``harden.harden`` reads only the plan's seccomp program: a stand-in plan
    carries just that."""
    plan = types.SimpleNamespace(seccomp=seccomp.build())
    child_ns = 0x10000000  # CLONE_NEWUSER

    def inside() -> dict[str, str]:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)

        def call(result: int) -> None:
            if result != 0:
                raise OSError(ctypes.get_errno(), "refused")

        before = attempt(lambda: os.getpid())
        harden.harden(plan, None)  # type: ignore[arg-type]
        return {
            "before": before,
            "unshare(CLONE_NEWUSER)": attempt(lambda: call(libc.unshare(child_ns))),
            "keyctl": attempt(lambda: call(libc.syscall(_keyctl_nr(), 0, 0, 0, 0, 0))),
            "an ordinary call": attempt(lambda: os.listdir("/")),
        }

    assert in_child(inside) == {
        "before": "ok",
        "unshare(CLONE_NEWUSER)": "EPERM",
        "keyctl": "EPERM",
        "an ordinary call": "ok",
    }


def test_a_real_call_above_the_reviewed_range_gets_enosys() -> None:
    """The cap refuses a call this kernel has: file_getattr (468) under a filter whose
    cap is lowered below it, beside the shipped filter, which allows it."""

    def inside(cap: int) -> dict[str, str]:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)

        def file_getattr() -> None:
            if libc.syscall(468, -100, b"/", 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "file_getattr")

        harden.harden(types.SimpleNamespace(seccomp=seccomp.build(reviewed_up_to=cap)), None)  # type: ignore[arg-type]
        return {"file_getattr": attempt(file_getattr), "an ordinary call": attempt(lambda: os.listdir("/"))}

    # The kernel's own answer (size 0 is too small): the call exists here.
    assert in_child(lambda: inside(seccomp.REVIEWED_UP_TO)) == {
        "file_getattr": "EINVAL",
        "an ordinary call": "ok",
    }
    assert in_child(lambda: inside(467)) == {"file_getattr": "ENOSYS", "an ordinary call": "ok"}


def _keyctl_nr() -> int:
    return {"x86_64": 250, "aarch64": 219}[os.uname().machine]


def test_settled_pid1_has_no_capability_no_bounding_set_and_is_not_dumpable() -> None:
    """In a user namespace (where the child starts with every capability): after
    ``settle_pid1`` it holds none, can regain none, and is not dumpable."""
    plan = types.SimpleNamespace(cap_last_cap=_cap_last_cap(), namespaces=True)

    def inside() -> dict[str, object]:
        had = _status()["CapEff"]
        harden.settle_pid1(plan)  # type: ignore[arg-type]
        now = _status()
        return {
            "had capabilities": int(had, 16) != 0,
            "CapEff": int(now["CapEff"], 16),
            "CapBnd": int(now["CapBnd"], 16),
            "CapAmb": int(now["CapAmb"], 16),
            "NoNewPrivs": now["NoNewPrivs"],
            "dumpable": _sys.prctl(PR_GET_DUMPABLE),
        }

    assert in_child(inside, namespaces=True) == {
        "had capabilities": True,
        "CapEff": 0,
        "CapBnd": 0,
        "CapAmb": 0,
        "NoNewPrivs": "1",
        "dumpable": 0,
    }


def _status() -> dict[str, str]:
    with open("/proc/self/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def _cap_last_cap() -> int:
    with open("/proc/sys/kernel/cap_last_cap") as f:
        return int(f.read())
