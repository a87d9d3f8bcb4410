"""Network allowlist: which host:port a sandbox in ``allow`` mode may reach. Pure.

Owns the meaning of an ``--allow-host`` entry and every allow/deny decision the
proxy makes; does no I/O (names are resolved by the caller, who passes the answers
in). Entries:

    pypi.org            ports 80 and 443
    pypi.org:8443       that port only
    *.example.org       any subdomain of example.org (not example.org itself)
    example.org:*       any port
    127.0.0.2:8080      an address: CONNECT to it as a literal, or a name that
    [::1]:8080          resolves to it (loopback and private answers need this)
    10.0.0.0/8:443      a network

Rules that hold whatever the allowlist says: link-local and cloud metadata addresses
(169.254.0.0/16, fe80::/10, fd00:ec2::254) are never reached; an IP literal is
reached only when an address rule allows it; a *name* that resolves to a loopback,
private or otherwise internal address is refused unless an address rule allows that
address (DNS rebinding).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import PolicyError
from ..terminal import printable

DEFAULT_PORTS = (80, 443)
PROXY_PORT = 3128  # on 127.0.0.1 inside the sandbox (its own network namespace)
ANY_PORT = -1

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_NEVER = tuple(
    ipaddress.ip_network(n)
    for n in ("169.254.0.0/16", "fe80::/10", "fd00:ec2::254/128", "0.0.0.0/8", "::/128")
)
# Where a name must not lead without an explicit address rule (DNS rebinding): this
# host, its private networks, carrier-grade NAT (cloud internals, tailnets). The
# documentation ranges count as public: some networks route them (this CI's does).
_INTERNAL = tuple(
    ipaddress.ip_network(n)
    for n in (
        "127.0.0.0/8",
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "192.0.0.0/24",
        "198.18.0.0/15",
        "240.0.0.0/4",
        "255.255.255.255/32",
        "::1/128",
        "fc00::/7",
        "fec0::/10",
    )
)
_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)")


@dataclass(frozen=True)
class HostRule:
    """One allowlist entry, parsed. Exactly one of ``name``/``network`` is set."""

    text: str
    name: str | None = None  # "pypi.org" or "*.example.org"
    network: IPNetwork | None = None
    ports: tuple[int, ...] = DEFAULT_PORTS  # (ANY_PORT,) for any

    def port_ok(self, port: int) -> bool:
        return self.ports == (ANY_PORT,) or port in self.ports

    def matches_name(self, host: str, port: int) -> bool:
        if self.name is None or not self.port_ok(port):
            return False
        if self.name.startswith("*."):
            return host.endswith(self.name[1:]) and len(host) > len(self.name) - 1
        return host == self.name

    def matches_address(self, addr: IPAddress, port: int) -> bool:
        return self.network is not None and self.port_ok(port) and addr in self.network


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str
    addresses: tuple[str, ...] = ()  # what to connect to, in order, when allowed
    # Refused only because no rule names the target: what ``--network ask`` may ask about
    # (never a denied, link-local or rebinding refusal).
    unlisted: bool = False
    request: int = 0  # the --network ask request it waited on, if any


@dataclass(frozen=True)
class NetEvent:
    """One record of the network log: a proxy decision (``kind`` "request"); a connection
    of ``--network ask`` starting to wait for an answer ("pending", ``request`` its id);
    or a change of the running sandbox's policy or an answer to a pending request
    ("policy": the method is ALLOW, DENY, APPROVE, APPROVE-ALWAYS or REJECT, ``by`` says
    who asked). A decision that waited names its ``request`` too."""

    time: str
    sandbox: str
    method: str
    host: str
    port: int
    allowed: bool
    reason: str
    address: str | None = None
    kind: str = "request"
    by: str = ""
    request: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NetEvent:
        return cls(
            time=str(data.get("time", "")),
            sandbox=str(data.get("sandbox", "")),
            method=str(data.get("method", "")),
            host=str(data.get("host", "")),
            port=int(data.get("port", 0)),
            allowed=bool(data.get("allowed")),
            reason=str(data.get("reason", "")),
            address=data.get("address"),
            kind=str(data.get("kind") or "request"),
            by=str(data.get("by") or ""),
            request=int(data.get("request") or 0),
        )

    def line(self) -> str:
        """One line for a terminal. Every field may come from the sandbox (a host name
        it asked for): control characters are escaped, so nothing it sends can move
        the cursor or talk to the terminal."""
        if self.kind == "policy":
            by = f" by {self.by}" if self.by else ""
            change = f"POLICY {self.method} {self.host}{by}"
            return printable(f"{self.time} {self.sandbox} {change}: {self.reason}")
        verdict = "allowed" if self.allowed else "DENIED"
        via = f" via {self.address}" if self.address else ""
        target = f"{self.method} {self.host}:{self.port}{via}"
        return printable(f"{self.time} {self.sandbox} {verdict} {target}: {self.reason}")


def _bad(entry: str, why: str, where: str) -> PolicyError:
    return PolicyError(
        f"{where}: invalid allowed host {entry!r}: {why}",
        operation="policy",
        hint="write HOST, HOST:PORT, *.DOMAIN, ADDRESS[:PORT], [IPv6]:PORT or CIDR[:PORT]; "
        "PORT may be * for any port",
    )


def _parse_ports(raw: str, entry: str, where: str) -> tuple[int, ...]:
    if raw == "*":
        return (ANY_PORT,)
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise _bad(entry, f"port {raw!r} is not a number from 1 to 65535 or *", where)
    return (int(raw),)


def normalize_host(host: str) -> str:
    return host.strip().rstrip(".").lower()


def valid_name(host: str) -> bool:
    labels = host.split(".")
    return 0 < len(host) <= 253 and all(_LABEL.fullmatch(label) for label in labels)


def parse_rule(entry: str, where: str = "--allow-host") -> HostRule:
    text = entry.strip()
    if not text:
        raise _bad(entry, "empty", where)
    host = text
    ports: tuple[int, ...] = DEFAULT_PORTS
    if text.startswith("["):  # [v6]:port
        close = text.find("]")
        if close < 0:
            raise _bad(entry, "missing ]", where)
        host, rest = text[1:close], text[close + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise _bad(entry, "expected :PORT after ]", where)
            ports = _parse_ports(rest[1:], entry, where)
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
        ports = _parse_ports(port, entry, where)
    try:
        network = ipaddress.ip_network(host, strict=False)
    except ValueError:
        network = None
    if network is not None:
        if any(network.overlaps(n) for n in _NEVER if n.version == network.version):
            raise _bad(entry, "link-local and metadata addresses can never be allowed", where)
        return HostRule(text, network=network, ports=ports)
    name = normalize_host(host)
    bare = name[2:] if name.startswith("*.") else name
    if "*" in bare or not valid_name(bare):
        raise _bad(entry, "not a host name, address or network", where)
    if name.startswith("*.") and "." not in bare:
        raise _bad(entry, "a wildcard must name a domain below a top-level one (*.example.org)", where)
    return HostRule(text, name=name, ports=ports)


def parse_rules(entries: Iterable[str], where: str = "--allow-host") -> tuple[HostRule, ...]:
    return tuple(parse_rule(e, where) for e in entries)


def parse_resolve(entries: Mapping[str, str] | Iterable[str], where: str = "--resolve") -> dict[str, str]:
    """NAME=ADDRESS pairs (like curl's --resolve): answers used instead of DNS.

    They are treated exactly like DNS answers, so they cannot make an internal
    address reachable on their own."""
    pairs = entries.items() if isinstance(entries, Mapping) else (_split_pair(e, where) for e in entries)
    out: dict[str, str] = {}
    for name, addr in pairs:
        host = normalize_host(name)
        if not valid_name(host):
            raise PolicyError(
                f"{where}: {name!r} is not a host name",
                operation="policy",
                hint="write NAME=ADDRESS, e.g. index.test=127.0.0.2",
            )
        try:
            out[host] = str(ipaddress.ip_address(addr.strip().strip("[]")))
        except ValueError:
            raise PolicyError(
                f"{where}: {addr!r} (for {name}) is not an IP address",
                operation="policy",
                hint="write NAME=ADDRESS, e.g. index.test=127.0.0.2",
            ) from None
    return out


def _split_pair(entry: str, where: str) -> tuple[str, str]:
    name, sep, addr = entry.partition("=")
    if not sep:
        raise PolicyError(
            f"{where}: expected NAME=ADDRESS, got {entry!r}",
            operation="policy",
            hint="write NAME=ADDRESS, e.g. index.test=127.0.0.2",
        )
    return name, addr


def ip_literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


# NAT64's well-known prefix (RFC 6052): on an IPv6-only network with DNS64 a name's
# AAAA answer 64:ff9b::a9fe:a9fe is 169.254.169.254, reached through the gateway.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _unmapped(addr: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 one stands for (IPv4-mapped, NAT64), else itself: an
    address is judged as what it reaches."""
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return addr.ipv4_mapped
        if addr in _NAT64:
            return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return addr


def never_reachable(addr: IPAddress) -> bool:
    addr = _unmapped(addr)
    return any(addr in n for n in _NEVER if n.version == addr.version) or addr.is_multicast


def internal(addr: IPAddress) -> bool:
    """Loopback, private, shared (CGNAT) or reserved: not somewhere on the internet."""
    addr = _unmapped(addr)
    return any(addr in n for n in _INTERNAL if n.version == addr.version)


class Allowlist:
    """``denied``: rules a running sandbox's owner added with ``warren net NAME deny``;
    they win over every allow rule, for names and for the addresses names resolve to."""

    def __init__(self, rules: Sequence[HostRule], denied: Sequence[HostRule] = ()) -> None:
        self.rules = tuple(rules)
        self.denied = tuple(denied)

    def _address_allowed(self, addr: IPAddress, port: int) -> bool:
        return any(r.matches_address(_unmapped(addr), port) for r in self.rules)

    def _denied_by(self, host: str, addr: IPAddress | None, port: int) -> HostRule | None:
        for rule in self.denied:
            if addr is not None and rule.matches_address(_unmapped(addr), port):
                return rule
            if addr is None and rule.matches_name(host, port):
                return rule
        return None

    def check_target(self, host: str, port: int) -> Decision | None:
        """The decision that needs no name resolution; None when ``host`` is a name
        on the allowlist (then resolve it and call ``check_answers``)."""
        if not 0 < port < 65536:
            return Decision(False, f"port {port} is out of range")
        addr = ip_literal(host)
        if addr is not None:
            if never_reachable(addr):
                return Decision(False, f"{addr} is a link-local/metadata address, never reachable")
            if (rule := self._denied_by(host, addr, port)) is not None:
                return Decision(False, f"denied by the rule {rule.text!r} (warren net deny)")
            if self._address_allowed(addr, port):
                return Decision(True, "address on the allowlist", (str(addr),))
            return Decision(
                False,
                f"IP literal {addr}:{port} is not on the allowlist "
                f"(add --allow-host {hostport(str(addr), port)} if it should be reachable)",
                unlisted=True,
            )
        host = normalize_host(host)
        if not valid_name(host):
            return Decision(False, f"{host!r} is not a valid host name")
        if (rule := self._denied_by(host, None, port)) is not None:
            return Decision(False, f"denied by the rule {rule.text!r} (warren net deny)")
        if not any(r.matches_name(host, port) for r in self.rules):
            return Decision(
                False,
                f"{host}:{port} is not on the allowlist (add --allow-host {hostport(host, port)})",
                unlisted=True,
            )
        return None

    def check_answers(self, host: str, port: int, answers: Sequence[str]) -> Decision:
        """Decide on the addresses an allowed name resolved to: keep the ones that
        may be reached, in order; refuse when none is left."""
        keep: list[str] = []
        refused: list[str] = []
        for raw in answers:
            addr = ip_literal(raw)
            if addr is None:
                continue
            if never_reachable(addr):
                refused.append(f"{addr} (link-local/metadata, never reachable)")
            elif (rule := self._denied_by(host, addr, port)) is not None:
                refused.append(f"{addr} (denied by the rule {rule.text!r})")
            elif internal(addr) and not self._address_allowed(addr, port):
                refused.append(
                    f"{addr} (an internal address: possible DNS rebinding; allow it explicitly "
                    f"with --allow-host {hostport(str(addr), port)})"
                )
            elif str(addr) not in keep:
                keep.append(str(addr))
        if keep:
            reason = "on the allowlist"
            if refused:
                reason += "; skipped " + ", ".join(refused)
            return Decision(True, reason, tuple(keep))
        if not refused:
            return Decision(False, f"{host} did not resolve to any address")
        return Decision(False, f"{host} resolved only to refused addresses: " + "; ".join(refused))


def hostport(host: str, port: int) -> str:
    """``host:port`` as an allowlist entry writes it (an IPv6 address in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def proxy_env(port: int = PROXY_PORT) -> dict[str, str]:
    """What tells uv, pip, npm, cargo, git and curl to use the proxy."""
    url = f"http://127.0.0.1:{port}"
    no_proxy = "localhost,127.0.0.1,::1"
    env: dict[str, str] = {}
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[name] = env[name.lower()] = url
    env["NO_PROXY"] = env["no_proxy"] = no_proxy
    # npm reads these spellings from the environment as its config.
    env["npm_config_proxy"] = env["npm_config_https_proxy"] = url
    return env
