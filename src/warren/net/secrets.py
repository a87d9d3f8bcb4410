"""Secrets the agent uses but cannot read, and the HTTP rules of intercepted hosts. Pure.

Owns the meaning of a ``--secret`` and an ``--allow-http`` entry, the placeholder a
sandbox sees instead of a secret, and the two substitutions the proxy makes with
them (``net.intercept`` does the I/O):

- in a request to one of the secret's hosts: placeholder -> real value, in header
  values (``Authorization: Bearer``, custom headers, and inside a ``Basic``
  credential, which is base64 of ``user:password``) and in the URL's userinfo;
  never in a request body (the server would get the placeholder there);
- in everything a secret's host answers: every form of the value the proxy sent ->
  the same form of the placeholder, so a server that echoes a request back cannot show
  the sandbox the value. The forms: the value itself, its percent-encoding, the whole
  ``Basic`` credential the proxy built, and the value's base64 at each of the three
  alignments it can have inside longer base64 text (``user:VALUE`` encoded puts it at
  one of them; the characters that mix its first or last byte with a neighbour's bits
  are left, at most 4 bits of each end byte).

Entries:

    TOKEN=GITHUB_TOKEN@api.github.com,github.com   the caller's $GITHUB_TOKEN
    PYPI_PASSWORD=file:~/.config/pypi-token@pypi.example.org   a file's first line
    POST api.example.org/v1/       --allow-http: that method, that path prefix
    * api.example.org/             any method
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..errors import PolicyError
from .allowlist import HostRule, normalize_host, valid_name

PLACEHOLDER_PREFIX = "warren-secret-"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_METHOD = re.compile(r"[A-Z]{1,20}|\*")
_SECRET_HINT = "write NAME=ENVVAR@HOST[,HOST...] or NAME=file:PATH@HOST[,HOST...]"
_HTTP_HINT = "write 'METHOD HOST/PATH-PREFIX', e.g. 'POST api.example.org/v1/' (METHOD * for any)"


@dataclass(frozen=True)
class SecretRule:
    """One ``--secret`` as written: the variable inside, where the real value comes
    from (``env`` a variable name of the caller, or ``file`` a path), its hosts."""

    text: str
    name: str
    hosts: tuple[str, ...]
    env: str | None = None
    file: str | None = None

    @property
    def source(self) -> str:
        return f"${self.env}" if self.env is not None else f"file {self.file}"


@dataclass(frozen=True)
class HttpRule:
    """One ``--allow-http``: ``method`` (``*`` for any) on ``host``, paths under ``prefix``."""

    text: str
    method: str
    host: str
    prefix: str

    def allows(self, method: str, path: str) -> bool:
        """Whether the rule allows ``method`` on ``path`` (a request target), matched as
        the server will read it: unreserved characters percent-decoded. The caller
        refuses an ``ambiguous_path`` first: for one, no answer would be sure."""
        return (self.method in ("*", method)) and decode_unreserved(_path_only(path)).startswith(self.prefix)


@dataclass(frozen=True)
class PlacedSecret:
    """A secret as planned for one sandbox: what it sees (``placeholder``) and where
    the proxy puts the real value in. The value itself is never in a plan."""

    name: str
    placeholder: str
    hosts: tuple[str, ...]
    source: str


def _secret_error(entry: str, why: str, where: str) -> PolicyError:
    return PolicyError(f"{where}: invalid secret {entry!r}: {why}", operation="policy", hint=_SECRET_HINT)


def _hosts(raw: str, entry: str, where: str, bad: type[Exception] | None = None) -> tuple[str, ...]:
    hosts = tuple(normalize_host(h) for h in raw.split(",") if h.strip())
    if not hosts:
        raise _secret_error(entry, "no host after @", where)
    for host in hosts:
        bare = host[2:] if host.startswith("*.") else host
        if not valid_name(bare) or "*" in bare:
            raise _secret_error(entry, f"{host!r} is not a host name (a secret goes to names only)", where)
    return tuple(dict.fromkeys(hosts))


def parse_secret(entry: str, where: str = "--secret") -> SecretRule:
    text = entry.strip()
    name, sep, rest = text.partition("=")
    if not sep or not _NAME.fullmatch(name):
        raise _secret_error(entry, "expected NAME= (letters, digits and _) first", where)
    source, at, hosts_text = rest.rpartition("@")
    if not at or not source:
        raise _secret_error(entry, "expected SOURCE@HOST after NAME=", where)
    hosts = _hosts(hosts_text, entry, where)
    if source.startswith("file:"):
        path = source[5:]
        if not path:
            raise _secret_error(entry, "file: needs a path", where)
        return SecretRule(text, name, hosts, file=path)
    if not _NAME.fullmatch(source):
        raise _secret_error(entry, f"{source!r} is not an environment variable name", where)
    return SecretRule(text, name, hosts, env=source)


def parse_secrets(entries: Iterable[str], where: str = "--secret") -> tuple[SecretRule, ...]:
    rules = tuple(parse_secret(e, where) for e in entries)
    seen: set[str] = set()
    for rule in rules:
        if rule.name in seen:
            raise _secret_error(rule.text, f"{rule.name} is given twice", where)
        seen.add(rule.name)
    return rules


def parse_http_rule(entry: str, where: str = "--allow-http") -> HttpRule:
    method, _, target = entry.strip().partition(" ")
    target = target.strip()
    if not _METHOD.fullmatch(method) or not target:
        raise PolicyError(f"{where}: invalid HTTP rule {entry!r}", operation="policy", hint=_HTTP_HINT)
    host, slash, path = target.partition("/")
    host = normalize_host(host)
    if not valid_name(host):
        raise PolicyError(
            f"{where}: invalid HTTP rule {entry!r}: {host!r} is not a host name",
            operation="policy",
            hint=_HTTP_HINT,
        )
    prefix = "/" + path if slash else "/"
    why = ambiguous_path(prefix)
    if why is not None or "?" in prefix or "#" in prefix:
        raise PolicyError(
            f"{where}: invalid HTTP rule {entry!r}: {why or 'a query or fragment in the path prefix'}",
            operation="policy",
            hint=_HTTP_HINT,
        )
    return HttpRule(entry.strip(), method, host, decode_unreserved(prefix))


def parse_http_rules(entries: Iterable[str], where: str = "--allow-http") -> tuple[HttpRule, ...]:
    return tuple(parse_http_rule(e, where) for e in entries)


def check_hosts_allowed(
    secrets: Sequence[SecretRule], http_rules: Sequence[HttpRule], allowed: Sequence[HostRule]
) -> None:
    """A secret's or HTTP rule's host must be reachable at all: else a typed error
    naming both, at plan time (not a refusal the agent meets later)."""
    pairs = [(h, f"secret {s.name}") for s in secrets for h in s.hosts]
    pairs += [(r.host, f"HTTP rule {r.text!r}") for r in http_rules]
    for host, what in pairs:
        probe = "x." + host[2:] if host.startswith("*.") else host
        if not any(r.name is not None and _name_matches(r.name, probe) for r in allowed):
            raise PolicyError(
                f"{what} names host {host}, which is not an allowed host",
                operation="policy",
                hint=f"add --allow-host {host} (a secret or HTTP rule only applies to hosts the "
                "sandbox may reach), or correct the host",
            )


def _name_matches(rule: str, host: str) -> bool:
    if rule.startswith("*."):
        return host.endswith(rule[1:]) and len(host) > len(rule) - 1
    return host == rule


def host_matches(pattern: str, host: str) -> bool:
    """``host`` (normalized) is ``pattern`` or, for ``*.domain``, below it."""
    return _name_matches(pattern, normalize_host(host))


def placeholder(name: str, nonce: str) -> str:
    """What ``$NAME`` holds inside: recognisable, unique per sandbox (``nonce``) and per
    secret, and long enough (128 random bits) never to occur by chance."""
    digest = hashlib.sha256(f"{nonce}\0{name}".encode()).hexdigest()[:32]
    return f"{PLACEHOLDER_PREFIX}{name}-{digest}"


def _path_only(target: str) -> str:
    return target.split("?", 1)[0].split("#", 1)[0]


_UNRESERVED_ESCAPE = re.compile(r"%(2[dDeE]|5[fF]|7[eE]|3[0-9]|[46][1-9a-fA-F]|[57][0-9aA])")
_SEPARATOR_ESCAPE = re.compile(r"%(2[fF]|5[cC]|00)")


def decode_unreserved(path: str) -> str:
    """``path`` with the percent-escapes of unreserved characters (letters, digits,
    ``-._~``) decoded: RFC 3986 says they mean the same, and servers read them so."""
    return _UNRESERVED_ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), path)


def ambiguous_path(target: str) -> str | None:
    """Why servers may disagree about which path ``target`` names, or None.

    A prefix rule is only as good as the path it is matched against: a dot-segment
    (``/v1/public/../admin``, ``%2e%2e``, Tomcat's ``..;``) is removed by some servers
    and frameworks and not by others, an escaped slash or backslash (``%2f``, ``%5c``)
    or a raw backslash is a separator to some. Rewriting the path would forward a
    request the client did not make; such a path is refused instead. Ordinary clients
    (curl, pip, npm, git, browsers) resolve dot-segments before they send."""
    path = _path_only(target)
    if "\\" in path:
        return "a backslash in the path (a separator to some servers)"
    if _SEPARATOR_ESCAPE.search(path):
        return "an escaped slash, backslash or NUL (%2f, %5c, %00) in the path"
    for segment in decode_unreserved(path).split("/"):
        if segment.split(";", 1)[0] in (".", ".."):
            return "a dot-segment (. or .., written or escaped) in the path"
    return None


# --- substitution (the proxy's; values as bytes) ---------------------------------------------


class Substituter:
    """The swaps for one intercepted host: ``pairs`` maps each placeholder to its real
    value (both bytes; only the secrets whose hosts include this host)."""

    def __init__(self, pairs: Mapping[bytes, bytes]) -> None:
        self.pairs = dict(pairs)
        self.reverse: dict[bytes, bytes] = {}
        self.produced: list[bytes] = []  # credentials built, oldest first (``_produced``)
        for ph, real in self.pairs.items():
            if real:
                for form, replacement in _forms(real, ph).items():
                    self.reverse.setdefault(form, replacement)
        self._sort()

    def _sort(self) -> None:
        # Longest first: a form that contains another (a whole credential, a fragment of
        # it) is replaced whole.
        self._real = sorted(self.reverse, key=len, reverse=True)
        self.longest = max((len(r) for r in self._real), default=0)

    def _produced(self, sent: bytes, original: bytes) -> None:
        """The proxy sent ``sent`` where the sandbox wrote ``original``: an echo of it
        goes back as the sandbox's own text."""
        if sent in self.reverse:
            return
        # A connection may carry any number of requests: only the newest few are kept
        # (an older one echoed later still loses its value to the base64 fragments).
        self.produced.append(sent)
        if len(self.produced) > MAX_PRODUCED:
            del self.reverse[self.produced.pop(0)]
        self.reverse[sent] = original
        self._sort()

    def request_value(self, value: str) -> tuple[str, list[str]]:
        """A request header's value (or a URL's userinfo) with placeholders replaced;
        and the names used. ``Basic`` credentials are decoded, replaced, re-encoded."""
        raw = value.encode("latin-1")
        used: list[str] = []
        out = self._swap(raw, used)
        scheme, _, cred = raw.partition(b" ")
        if scheme.lower() == b"basic" and cred:
            try:
                plain = base64.b64decode(cred.strip(), validate=True)
            except (binascii.Error, ValueError):
                plain = b""
            swapped = self._swap(plain, used)
            if swapped != plain:
                built = base64.b64encode(swapped)
                out = scheme + b" " + built
                self._produced(built, cred.strip())
        return out.decode("latin-1"), used

    def _swap(self, data: bytes, used: list[str]) -> bytes:
        for ph, real in self.pairs.items():
            if ph in data:
                data = data.replace(ph, real)
                used.append(_name_of(ph))
        return data

    def scrub(self, data: bytes) -> bytes:
        """Every form of a real value -> the same form of its placeholder (a response, whole)."""
        for real in self._real:
            data = data.replace(real, self.reverse[real])
        return data

    def occurs_in(self, buf: bytes | bytearray, start: int, end: int) -> bool:
        """Whether a real value lies whole in ``buf[start:end]``. A scan in C per value,
        no copy: the common answer (no) leaves the buffer to be sent as it is."""
        return any(buf.find(real, start, end) >= 0 for real in self._real)

    def held_tail(self, buf: bytes | bytearray, start: int, end: int) -> int:
        """The length of the longest end of ``buf[start:end]`` that begins a value
        without being all of it: what must wait for the next piece of a stream. Looks
        only at the last ``longest - 1`` bytes, wherever the value's first byte is."""
        best = 0
        for real in self._real:
            first = real[:1]
            i = buf.find(first, max(start, end - len(real) + 1), end)
            while i >= 0 and end - i > best:
                if buf[i:end] == real[: end - i]:
                    best = end - i
                    break
                i = buf.find(first, i + 1, end)
        return best


MAX_PRODUCED = 16  # credentials built on one connection, remembered to be restored whole

# Shorter fragments (a value under 7 bytes) would match ordinary base64 by chance and
# corrupt answers; such a value is scrubbed as it is and percent-encoded only.
_MIN_FRAGMENT = 8


def _b64_inner(value: bytes, offset: int) -> bytes:
    """The base64 characters that encode only bits of ``value`` when it starts at byte
    ``offset`` (0-2) of a group of three: the same wherever such text holds it."""
    encoded = base64.b64encode(bytes(offset) + value + bytes(2))
    first = (8 * offset + 5) // 6
    end = 8 * (offset + len(value)) // 6
    return encoded[first:end]


def _forms(real: bytes, placeholder: bytes) -> dict[bytes, bytes]:
    """Each form the proxy can make of ``real`` -> the same form of ``placeholder``."""
    forms = {real: placeholder}
    quoted = urllib.parse.quote_from_bytes(real, safe="").encode()
    forms.setdefault(quoted, urllib.parse.quote_from_bytes(placeholder, safe="").encode())
    for offset in range(3):
        inner = _b64_inner(real, offset)
        if len(inner) >= _MIN_FRAGMENT:
            forms.setdefault(inner, _b64_inner(placeholder, offset))
    return forms


def _name_of(placeholder: bytes) -> str:
    return placeholder.decode("latin-1")[len(PLACEHOLDER_PREFIX) :].rsplit("-", 1)[0]


class StreamScrubber:
    """Real values -> placeholders across a stream cut anywhere: holds back only the
    end of a piece that could be the start of a value (at most the longest value less
    one byte), so a stream that pauses (an event stream waiting for the client) never
    has its last event held back. The proxy's own relay does the same in place
    (``net.intercept``); this is the form for pieces that come as ``bytes`` (a gzip
    body decoded)."""

    def __init__(self, sub: Substituter) -> None:
        self.sub = sub
        self.buf = b""

    def feed(self, data: bytes) -> bytes:
        data = self.buf + data if self.buf else data
        if self.sub.occurs_in(data, 0, len(data)):
            data = self.sub.scrub(data)
        hold = self.sub.held_tail(data, 0, len(data))
        self.buf = data[len(data) - hold :] if hold else b""
        return data[: len(data) - hold] if hold else data

    def flush(self) -> bytes:
        out, self.buf = self.sub.scrub(self.buf), b""
        return out
