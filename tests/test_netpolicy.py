"""The allowlist's decisions, as pure functions (no sandbox, no sockets)."""

from __future__ import annotations

import pytest

from warren.errors import PolicyError
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
