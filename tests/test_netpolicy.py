"""The allowlist's decisions, as pure functions (no sandbox, no sockets)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from warren.errors import PolicyError
from warren.net import live
from warren.net.allowlist import ANY_PORT, Allowlist, parse_resolve, parse_rule, parse_rules


def _allow(*entries: str) -> Allowlist:
    return Allowlist(parse_rules(entries))


@pytest.mark.parametrize(
    ("entry", "name", "network", "ports"),
    [
        ("pypi.org", "pypi.org", None, (80, 443)),
        ("PyPI.org.", "pypi.org", None, (80, 443)),
        ("pypi.org:8443", "pypi.org", None, (8443,)),
        ("*.example.org", "*.example.org", None, (80, 443)),
        ("example.org:*", "example.org", None, (ANY_PORT,)),
        ("127.0.0.2:8080", None, "127.0.0.2/32", (8080,)),
        ("[::1]:8080", None, "::1/128", (8080,)),
        ("::1", None, "::1/128", (80, 443)),
        ("10.0.0.0/8:443", None, "10.0.0.0/8", (443,)),
    ],
)
def test_entries_parse(entry: str, name: str | None, network: str | None, ports: tuple[int, ...]) -> None:
    rule = parse_rule(entry)
    assert rule.name == name
    assert (str(rule.network) if rule.network else None) == network
    assert rule.ports == ports


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ("", "empty"),
        ("pypi.org:0", "port"),
        ("pypi.org:http", "port"),
        ("bad host", "not a host name"),
        ("*.org", "wildcard"),
        ("a.*.org", "not a host name"),
        ("[::1", "missing ]"),
        ("169.254.169.254", "never be allowed"),
        ("169.254.0.0/16:80", "never be allowed"),
        ("[fd00:ec2::254]:80", "never be allowed"),
        ("0.0.0.0/0", "never be allowed"),
    ],
)
def test_bad_entries_are_typed_errors_with_a_hint(entry: str, why: str) -> None:
    with pytest.raises(PolicyError, match=why) as info:
        parse_rule(entry)
    assert info.value.hint and "HOST:PORT" in info.value.hint


def test_names_ports_and_wildcards() -> None:
    al = _allow("pypi.org", "*.example.org:8080", "any.test:*")
    assert al.check_target("pypi.org", 443) is None  # allowed name: resolve next
    assert al.check_target("PYPI.ORG.", 80) is None
    assert not al.check_target("pypi.org", 22).allowed  # type: ignore[union-attr]
    assert not al.check_target("evil-pypi.org", 443).allowed  # type: ignore[union-attr]
    assert al.check_target("a.b.example.org", 8080) is None
    assert not al.check_target("example.org", 8080).allowed  # type: ignore[union-attr]
    assert not al.check_target("badexample.org", 8080).allowed  # type: ignore[union-attr]
    assert al.check_target("any.test", 1) is None


def test_ip_literals_need_an_address_rule_and_metadata_never_passes() -> None:
    al = _allow("pypi.org", "10.1.2.3:443", "192.168.0.0/16:*")
    d = al.check_target("10.1.2.3", 443)
    assert d is not None and d.allowed and d.addresses == ("10.1.2.3",)
    d = al.check_target("10.1.2.3", 80)
    assert d is not None and not d.allowed and "IP literal" in d.reason
    d = al.check_target("93.184.216.34", 443)
    assert d is not None and not d.allowed and "--allow-host 93.184.216.34:443" in d.reason
    for meta in ("169.254.169.254", "fd00:ec2::254", "::ffff:169.254.169.254", "fe80::1"):
        d = al.check_target(meta, 80)
        assert d is not None and not d.allowed and "metadata" in d.reason, meta


def test_answers_filter_rebinding_and_keep_order() -> None:
    al = _allow("pypi.org", "mirror.test", "127.0.0.2:443")
    d = al.check_answers("pypi.org", 443, ["151.101.0.223", "151.101.64.223"])
    assert d.allowed and d.addresses == ("151.101.0.223", "151.101.64.223")
    for internal in (
        "127.0.0.1",
        "10.0.0.1",
        "172.16.5.4",
        "192.168.1.1",
        "100.100.100.200",
        "::1",
        "fd12::1",
    ):
        d = al.check_answers("pypi.org", 443, [internal])
        assert not d.allowed and "DNS rebinding" in d.reason, internal
    d = al.check_answers("pypi.org", 443, ["169.254.169.254"])
    assert not d.allowed and "never reachable" in d.reason
    # Through NAT64 (an IPv6-only network's DNS64 answers): judged as the IPv4 address
    # reached; the control, a public one through it, is kept.
    for nat64, why in (("64:ff9b::a9fe:a9fe", "never reachable"), ("64:ff9b::7f00:1", "DNS rebinding")):
        d = al.check_answers("pypi.org", 443, [nat64])
        assert not d.allowed and why in d.reason, nat64
        assert not al.check_target(nat64, 80).allowed  # type: ignore[union-attr]
    assert al.check_answers("pypi.org", 443, ["64:ff9b::9765:df"]).allowed
    # Mixed answers: the public one is used, the internal one skipped (and said so).
    d = al.check_answers("pypi.org", 443, ["10.0.0.1", "151.101.0.223"])
    assert d.allowed and d.addresses == ("151.101.0.223",) and "skipped 10.0.0.1" in d.reason
    # An internal address the user allowed explicitly (on that port) is fine.
    d = al.check_answers("mirror.test", 443, ["127.0.0.2"])
    assert d.allowed and d.addresses == ("127.0.0.2",)
    assert not al.check_answers("mirror.test", 80, ["127.0.0.2"]).allowed
    assert not al.check_answers("pypi.org", 443, []).allowed


def test_resolve_map_validates_names_and_addresses() -> None:
    assert parse_resolve(["A.test=127.0.0.2", "b.test=[::1]"]) == {"a.test": "127.0.0.2", "b.test": "::1"}
    with pytest.raises(PolicyError, match="NAME=ADDRESS"):
        parse_resolve(["a.test"])
    with pytest.raises(PolicyError, match="not an IP address"):
        parse_resolve({"a.test": "example.org"})


# --- a running sandbox's policy (net.live): changes, and --network ask's queue ---------------


def _live(ask_timeout: float | None = 30.0, attended: bool = True) -> live.LivePolicy:
    return live.LivePolicy(
        parse_rules(["pypi.org", "127.0.0.2:8080"]), ask_timeout=ask_timeout, attended=attended
    )


def test_a_deny_wins_over_every_allow_for_names_and_their_answers() -> None:
    lp = _live()
    lp.deny("pypi.org:443")
    d = lp.current.check_target("pypi.org", 443)
    assert (
        d is not None and not d.allowed and not d.unlisted and "denied by the rule 'pypi.org:443'" in d.reason
    )
    assert lp.current.check_target("pypi.org", 80) is None  # another port: still allowed
    lp.deny("151.101.0.223")
    d = lp.current.check_answers("pypi.org", 80, ["151.101.0.223"])
    assert not d.allowed and "denied by the rule '151.101.0.223'" in d.reason
    lp.allow("pypi.org:443")  # lifts the deny of the same text (and is a rule of its own)
    assert lp.current.check_target("pypi.org", 443) is None
    assert lp.rules() == (["pypi.org", "127.0.0.2:8080"], ["pypi.org:443"], ["151.101.0.223"])


def test_a_change_is_checked_as_an_allow_host_at_create() -> None:
    lp = _live()
    for entry in ("169.254.169.254", "*.com", "a b", "host:0"):
        with pytest.raises(PolicyError) as e:
            lp.allow(entry)
        with pytest.raises(PolicyError) as at_create:
            parse_rule(entry)
        assert e.value.message.split(": ", 1)[1] == at_create.value.message.split(": ", 1)[1]
        assert e.value.hint == at_create.value.hint
    assert lp.rules()[1:] == ([], [])


def test_added_rules_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "MAX_ADDED", 3)
    lp = _live()
    for i in range(3):
        lp.allow(f"h{i}.example.org")
    with pytest.raises(PolicyError, match="3 rules added at run time already"):
        lp.deny("h9.example.org")
    assert lp.allow("h0.example.org") == (parse_rule("h0.example.org"), False)  # no change, no room needed


def _ask_in_thread(lp: live.LivePolicy, host: str, out: list[tuple[str, int]]) -> threading.Thread:
    def ask() -> None:
        answer, asked = lp.wait_for_answer("CONNECT", host, 443)
        out.append((answer, asked.id if asked else 0))

    t = threading.Thread(target=ask)
    t.start()
    return t


def _until_waiting(lp: live.LivePolicy, n: int) -> None:
    deadline = time.monotonic() + 10
    while sum(p.waiting for p in lp.waiting()) < n:
        assert time.monotonic() < deadline
        time.sleep(0.005)


def test_the_pending_queue_is_bounded_and_one_request_serves_one_target(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(live, "MAX_PENDING", 4)
    lp = _live()
    out: list[tuple[str, int]] = []
    threads = [_ask_in_thread(lp, f"h{i}.test", out) for i in range(4)]
    _until_waiting(lp, 4)
    threads.append(_ask_in_thread(lp, "h0.test", out))  # the same target: waits on request 1
    _until_waiting(lp, 5)
    assert lp.wait_for_answer("CONNECT", "h9.test", 443) == (live.FULL, None)  # at once
    first = lp.waiting()[0]
    assert (first.id, first.host, first.waiting) == (1, "h0.test", 2)
    lp.answer(1, approve=True, always=False)
    for p in lp.waiting():
        lp.answer(p.id, approve=False, always=False)
    for t in threads:
        t.join()
    assert sorted(out) == sorted(
        [(live.APPROVED, 1), (live.APPROVED, 1), (live.REJECTED, 2), (live.REJECTED, 3), (live.REJECTED, 4)]
    )
    assert lp.waiting() == [] and lp.rules()[1] == []  # approved once: not added


def test_approve_always_adds_the_target_judged_as_a_rule() -> None:
    lp = _live()
    out: list[tuple[str, int]] = []
    t = _ask_in_thread(lp, "10.1.2.3", out)
    _until_waiting(lp, 1)
    (asked,) = lp.waiting()
    lp.answer(asked.id, approve=True, always=True)
    t.join()
    assert out == [(live.APPROVED_ALWAYS, asked.id)] and lp.rules()[1] == ["10.1.2.3:443"]
    assert lp.current.check_target("10.1.2.3", 443).allowed  # type: ignore[union-attr]


def test_an_unanswered_request_times_out_once_and_cannot_be_answered_after() -> None:
    lp = _live(ask_timeout=0.2)
    start = time.monotonic()
    answer, asked = lp.wait_for_answer("GET", "late.test", 80)
    assert answer == live.TIMED_OUT and 0.2 <= time.monotonic() - start < 5
    assert asked is not None and lp.waiting() == []
    with pytest.raises(PolicyError, match=f"no pending request {asked.id}"):
        lp.answer(asked.id, approve=True, always=False)


def test_nothing_waits_where_nobody_can_answer() -> None:
    assert _live(attended=False).wait_for_answer("GET", "x.test", 80) == (live.UNATTENDED, None)
    assert not _live(ask_timeout=None).asks


def test_who_asked_is_escaped_and_bounded() -> None:
    """The command line is the sandbox's to write: what ``asker`` says of it is escaped
    (no byte of it reaches a terminal raw) and cut."""
    import subprocess
    import sys

    from warren.net import asker

    title = "\x1b]0;owned\x07" + "x" * 5000
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", title])
    try:
        # Popen returns once the exec began, maybe before the new command line is in place.
        deadline = time.monotonic() + 10
        while b"sleep" not in Path(f"/proc/{proc.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)
        said = asker.describe(proc.pid)
        status = Path(f"/proc/{proc.pid}/status").read_text()
    finally:
        proc.kill()
        proc.wait()
    inner = next(line.split()[-1] for line in status.splitlines() if line.startswith("NSpid:"))
    expected = f"pid {inner}: {sys.executable} -c import time; time.sleep(30) \\x1b]0;owned"
    assert said.startswith(expected), (said[:200], status[:600])
    assert "\x1b" not in said and "\x07" not in said
    assert len(said) < asker.SHOWN + 100 and said.endswith("...")
    assert asker.of_connection(os.getpid(), 3128, ("127.0.0.1", 1)) == ""  # no such connection
