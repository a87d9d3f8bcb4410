"""A policy kept for a sandbox booted ahead (``server.policymemo``): it stands for a
fresh resolution only while nothing it was resolved from changed, and what a
resolution reads of the host is all recorded (``policy.lookups``), so the watch covers
it. Runs as root and as uid 1001, with a home, config files and links of its own.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from warren import protocol
from warren.errors import WarrenError
from warren.plan import CallerFacts
from warren.policy import lookups
from warren.policy import resolve as resolve_mod
from warren.server import markwatch, planning, policymemo


class Place:
    """A home (with a user config), a workspace (with a warren.toml), links between."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.home = base / "home"
        self.ws = base / "ws"
        self.config = self.home / ".config" / "warren" / "config.toml"
        self.ws.mkdir(parents=True)
        self.config.parent.mkdir(parents=True)
        (base / "data-a").mkdir()
        (base / "data-b").mkdir()
        (base / "data").symlink_to(base / "data-a")
        (base / "shown").mkdir()
        (self.home / ".ssh").mkdir()
        (self.home / ".aws").mkdir()
        self.config.write_text('[profile.tight]\ndeny = ["~/.aws"]\n')
        (self.ws / "warren.toml").write_text(f'deny = ["{self.ws / "private"}"]\n')
        (self.ws / "private").mkdir()
        self.env = {"HOME": str(self.home), "PATH": "/usr/bin:/bin"}
        self.env["XDG_CONFIG_HOME"] = str(self.home / ".config")

    def request(
        self, spec: dict[str, object], profile: str | None = None, **env: str
    ) -> tuple[dict[str, object], CallerFacts, protocol.Caller]:
        full = {**self.env, **env}
        caller = CallerFacts(uid=os.getuid(), gid=os.getgid(), home=full["HOME"], env=full, cwd=str(self.ws))
        return spec, caller, protocol.Caller(env=full, cwd=str(self.ws), config=True, profile=profile)


@pytest.fixture
def place(tmp_path: Path) -> Place:
    return Place(tmp_path)


SPECS: list[tuple[dict[str, object], str | None]] = [
    ({}, None),
    ({}, "tight"),
    ({"presets": ["uv", "npm", "cargo", "git"]}, None),
    ({"write": ["../data"], "read": ["../shown"], "deny": ["~/.ssh"]}, None),
    ({"read": ["../none/../shown", "../data/../shown"]}, None),
]


def _memo(place: Place, spec: dict[str, object], profile: str | None = None) -> policymemo.PolicyMemo:
    s, caller, msg = place.request(spec, profile)
    memo = policymemo.make(policymemo.key(s, caller, True, profile), lambda: planning.resolve(s, caller, msg))
    assert memo is not None, "a plain request's policy is kept"
    return memo


def _asked(place: Place, spec: dict[str, object], profile: str | None = None, **env: str) -> policymemo.Key:
    s, caller, _msg = place.request(spec, profile, **env)
    return policymemo.key(s, caller, True, profile)


@pytest.mark.parametrize(("spec", "profile"), SPECS)
def test_a_resolution_records_every_host_path_it_reads(
    place: Place, spec: dict[str, object], profile: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every path a resolution hands to the kernel (lstat, stat, open, listing, readlink)
    is watched by the names the record gives, or read whole (its bytes compared)."""
    s, caller, msg = place.request(spec, profile)
    planning.resolve(s, caller, msg)  # imports done: what follows is the resolution's own
    touched: list[tuple[str, str]] = []

    def spy(kind: str, real: Callable[..., object]) -> Callable[..., object]:
        def call(path: object, *args: object, **kwargs: object) -> object:
            if isinstance(path, (str, os.PathLike)):
                touched.append((kind, os.fspath(path)))
            return real(path, *args, **kwargs)

        return call

    for name in ("lstat", "stat", "scandir", "listdir", "readlink", "access"):
        monkeypatch.setattr(os, name, spy(name, getattr(os, name)))
    monkeypatch.setattr(builtins, "open", spy("open", builtins.open))
    with lookups.recording() as record:
        policy = planning.resolve(s, caller, msg)
    monkeypatch.undo()
    assert policy.denied, "a real resolution ran"
    assert not record.loose
    found = markwatch.lookups_of(record.paths, record.listed)
    assert found is not None
    names, wild, _firm = found
    unwatched = []
    for kind, path in touched:
        if path == "/proc/meminfo":
            continue  # the machine's memory: compared as a number (``PolicyMemo.machine``)
        if kind == "open":
            if path not in record.read:
                unwatched.append((kind, path))
            continue
        if kind in ("scandir", "listdir") and os.path.realpath(path) in wild:
            continue
        # Each name the kernel looks up to reach it (up to the first one missing: its
        # making is what is seen) is watched in its directory, or the directory's every
        # new entry is.
        need = markwatch.lookups_of([path], [])
        assert need is not None, path
        if all(n in names.get(d, ()) or d in wild for d, ns in need[0].items() for n in ns):
            continue
        unwatched.append((kind, path))
    assert touched, "the spy saw the resolution's calls"
    assert not unwatched, f"read but not recorded: {unwatched}"


def test_a_kept_policy_stands_for_the_same_request_on_the_same_host(place: Place) -> None:
    memo = _memo(place, {})
    try:
        s, caller, msg = place.request({})
        assert memo.policy_for(_asked(place, {})) == planning.resolve(s, caller, msg)
        assert memo.policy_for(_asked(place, {})) is memo.policy, "asked again, still kept"
    finally:
        memo.close()


def test_another_request_or_caller_is_not_given_a_kept_policy(place: Place) -> None:
    memo = _memo(place, {})
    try:
        assert memo.policy_for(_asked(place, {"deny": ["~/.ssh"]})) is None
        assert memo.policy_for(_asked(place, {}, profile="tight")) is None
        assert memo.policy_for(_asked(place, {}, CARGO_HOME=str(place.base / "cargo"))) is None
        assert memo.policy_for(_asked(place, {})) is memo.policy, "none of that touched the memo"
    finally:
        memo.close()


def _edit_in_place(path: Path, old: str, new: str) -> None:
    assert len(old) == len(new)
    with open(path, "r+") as f:  # the same file, the same size: no name changes
        text = f.read()
        f.seek(0)
        f.write(text.replace(old, new))


CHANGES: dict[str, Callable[[Place], None]] = {
    "warren.toml edited in place": lambda p: _edit_in_place(p.ws / "warren.toml", "private", "privat2"),
    "warren.toml removed": lambda p: (p.ws / "warren.toml").unlink(),
    "the user config edited in place": lambda p: _edit_in_place(p.config, "tight", "tigh2"),
    "the user config made anew": lambda p: (p.config.unlink(), p.config.write_text('deny = ["~/.aws"]\n')),
    "a --write link pointed elsewhere": lambda p: (
        (p.base / "data.new").symlink_to(p.base / "data-b"),
        os.rename(p.base / "data.new", p.base / "data"),
    ),
    "a default-denied directory replaced by a link": lambda p: (
        os.rmdir(p.home / ".ssh"),
        (p.home / ".ssh").symlink_to(p.base / "shown"),
    ),
    "a default-denied path made where there was none": lambda p: (p.home / ".gnupg").symlink_to(p.base),
    "a link made on the way to the workspace's config": lambda p: (
        os.rename(p.ws / "warren.toml", p.base / "elsewhere.toml"),
        (p.ws / "warren.toml").symlink_to(p.base / "elsewhere.toml"),
    ),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_change_to_what_the_policy_rests_on_drops_the_kept_one(place: Place, change: str) -> None:
    spec: dict[str, object] = {"write": ["../data"]}
    memo = _memo(place, spec)
    try:
        assert memo.policy_for(_asked(place, spec)) is memo.policy
        CHANGES[change](place)
        assert memo.policy_for(_asked(place, spec)) is None, f"{change}: the kept policy is not used"
        assert memo.policy_for(_asked(place, spec)) is None, "and never again"
    finally:
        memo.close()


def test_a_file_a_deny_glob_matches_made_or_removed_drops_the_kept_one(
    place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = place.base / "keys"
    keys.mkdir()
    (keys / "host_a_key").write_text("a")
    monkeypatch.setattr(resolve_mod.system_denied, "__defaults__", ((f"{keys}/host_*_key",),))
    for change in (lambda: (keys / "host_b_key").write_text("b"), lambda: (keys / "host_a_key").unlink()):
        (keys / "other").write_text("not matched")
        memo = _memo(place, {})
        try:
            assert keys / "host_a_key" in [r.path for r in memo.policy.denied]
            (keys / "other").unlink()  # an entry the glob does not match, gone: nothing to drop
            assert memo.policy_for(_asked(place, {})) is memo.policy
            change()
            assert memo.policy_for(_asked(place, {})) is None
        finally:
            memo.close()
        (keys / "host_a_key").write_text("a")


def test_a_request_that_does_not_resolve_keeps_nothing(place: Place) -> None:
    """A resolution that fails (a --write path missing; a config file that cannot be
    read) keeps no policy and raises nothing: the run resolves, and says why."""
    for spec in ({"write": ["../nowhere"]}, {}):
        if not spec:
            place.config.unlink()
            place.config.mkdir()
        s, caller, msg = place.request(spec)
        asked = policymemo.key(s, caller, True, None)
        assert policymemo.make(asked, lambda s=s, c=caller, m=msg: planning.resolve(s, c, m)) is None
        with pytest.raises(WarrenError):
            planning.resolve(s, caller, msg)


def test_recording_is_off_outside_a_recording(place: Place) -> None:
    lookups.looked_up("/etc")
    with lookups.recording() as record:
        lookups.looked_up("/etc/hostname")
        lookups.looked_up("relative")
    lookups.looked_up("/etc/passwd")
    assert record.paths == {"/etc/hostname"} and record.loose


@pytest.fixture(autouse=True)
def _no_leaked_watch() -> Iterator[None]:
    yield
    markwatch.sweep(float("inf"))
