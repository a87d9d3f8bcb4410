"""E2B's egress rules planned as warren's network policy (``e2b.network``): pure, no
sandbox. What the rules do to a real sandbox's traffic is judged in test_e2b_api."""

from __future__ import annotations

import pytest

pytest.importorskip("e2b")
from warren.e2b.core import E2BError
from warren.e2b.network import Egress, at_create, at_update


def test_deny_all_with_destinations_allowed_is_a_list_on_every_port() -> None:
    config = {"denyOut": ["0.0.0.0/0"], "allowOut": ["1.1.1.1", "8.8.8.0/24", "*.example.org", "2001:db8::1"]}
    assert at_create(config, None) == Egress(
        "allow", ["1.1.1.1:*", "8.8.8.0/24:*", "*.example.org:*", "[2001:db8::1]:*"]
    )
    assert at_create({"denyOut": ["0.0.0.0/0"]}, None) == Egress("none")
    assert at_create({}, False) == Egress("none")  # allow_internet_access=False is the same denial
    assert at_create({"allowOut": ["pypi.org"]}, False) == Egress("allow", ["pypi.org:*"])


def test_without_a_denial_of_all_traffic_the_template_decides_and_allowed_ones_are_reachable() -> None:
    assert at_create(None, None) == Egress()
    assert at_create({"allowPublicTraffic": False}, None) == Egress()
    assert at_create({"allowOut": ["pypi.org"]}, None) == Egress("allow", ["pypi.org:*"])
    assert at_create({"allowOut": ["pypi.org"]}, True) == Egress("open")  # everything is reachable
    assert at_create({"denyOut": ["8.8.8.8"]}, None) == Egress()  # it reaches nothing unlisted


@pytest.mark.parametrize(
    ("config", "internet", "said"),
    [
        ({"denyOut": ["8.8.8.8"]}, True, "no proxy to deny them"),
        ({"rules": {"api.example.com": [{}]}}, None, "open TLS"),
        ({"egressProxy": {"address": "proxy:1080"}}, None, "upstream proxy"),
        ({"maskRequestHost": "x.example.com"}, None, "does not serve"),
        ({"allowOut": ["169.254.169.254"]}, None, "link-local and metadata"),
        ({"allowOut": ["*.com"]}, None, "wildcard"),
        ({"allowOut": "pypi.org"}, None, "list of strings"),
        ({"allowOut": [""]}, None, "non-empty string"),
        ({"allowPublicTraffic": "no"}, None, "true or false"),
        ({"denyAll": True}, None, "unknown field 'denyAll'"),
        ("everything", None, "must be an object"),
    ],
)
def test_what_cannot_be_mapped_is_refused_with_why(config: object, internet: bool | None, said: str) -> None:
    with pytest.raises(E2BError, match=said) as info:
        at_create(config, internet)
    assert info.value.status == 400


def test_a_change_replaces_the_rules_in_force_and_never_opens_a_sandbox() -> None:
    change = at_update(
        {"denyOut": ["0.0.0.0/0"], "allowOut": ["8.8.8.8", "1.1.1.1"]}, True, ["1.1.1.1:*", "a.org:*"]
    )
    assert (change.allow, change.deny) == (["8.8.8.8:*"], ["a.org:*"])
    change = at_update({"allow_internet_access": False}, True, ["1.1.1.1:*"])
    assert (change.allow, change.deny) == ([], ["1.1.1.1:*"])
    assert at_update({"denyOut": ["0.0.0.0/0"]}, False, []).allow == []  # nothing to change
    for opening, listed in (({}, True), ({"allowOut": ["a.org"]}, True), ({"allowOut": ["a.org"]}, False)):
        with pytest.raises(E2BError, match="network list") as info:
            at_update(opening, listed, [])
        assert info.value.status == 400
