"""A running sandbox's network policy as its network helper holds it: the allowlist it
started with, the rules its owner added or denied since (``warren net NAME allow|deny``),
and, under ``--network ask``, the connections waiting for an answer.

Owns what a change means and the bounded queue of pending requests; does no I/O
(``server.netd`` calls it from its control channel and from the proxy's threads). Every
rule a change adds is parsed by ``allowlist.parse_rule``, the function that checks an
``--allow-host`` at create, so a change can name exactly what a create could have.

A sandbox decides how many connections it opens, so nothing it does grows this without
bound: at most ``MAX_PENDING`` requests wait at once (one per method, host and port;
further connections to the same target wait on the same request), at most
``MAX_ADDED`` rules are added in a sandbox's life, and a request past the queue's room is
refused at once.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import PolicyError
from .allowlist import Allowlist, HostRule, hostport, ip_literal, parse_rule

MAX_PENDING = 64  # requests waiting for an answer at once (each holds a proxy thread)
MAX_ADDED = 1024  # rules added or denied in a sandbox's life

# How a pending request ended.
APPROVED = "approved"
APPROVED_ALWAYS = "approved-always"
REJECTED = "rejected"
TIMED_OUT = "timed-out"
FULL = "queue-full"
UNATTENDED = "unattended"


@dataclass
class Pending:
    id: int
    method: str
    host: str
    port: int
    since: float  # monotonic
    process: str = ""  # the asking process, when the proxy can tell
    waiting: int = 1  # connections waiting on this answer
    answer: str = ""
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def target(self) -> str:
        return hostport(self.host, self.port)


class LivePolicy:
    """The allowlist now, and the pending requests; thread-safe."""

    def __init__(
        self,
        rules: tuple[HostRule, ...],
        *,
        ask_timeout: float | None = None,
        attended: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base = rules
        self.added: dict[str, HostRule] = {}
        self.denied: dict[str, HostRule] = {}
        self.ask_timeout = ask_timeout  # None: an unlisted host is refused at once
        # False: a one-shot run whose client cannot ask on a terminal; nobody else can
        # answer it (``warren net`` takes a sandbox's name), so nothing waits.
        self.attended = attended
        self.clock = clock
        self.lock = threading.Lock()
        self.pending: dict[int, Pending] = {}
        self.ids = itertools.count(1)
        self.current = Allowlist(rules)

    @property
    def asks(self) -> bool:
        """``--network ask``: an unlisted target waits for an answer (or, unattended, is
        refused saying why it did not)."""
        return self.ask_timeout is not None

    # --- changes ---------------------------------------------------------------------

    def allow(self, entry: str, where: str = "warren net allow") -> tuple[HostRule, bool]:
        """Add ``entry`` (lifting a deny of the same text); the rule, and whether
        anything changed."""
        rule = parse_rule(entry, where)
        with self.lock:
            lifted = self.denied.pop(rule.text, None) is not None
            if rule.text in self.added or rule in self.base:
                self._rebuild()
                return rule, lifted
            self._room(where)
            self.added[rule.text] = rule
            self._rebuild()
        return rule, True

    def deny(self, entry: str, where: str = "warren net deny") -> tuple[HostRule, bool]:
        """Refuse ``entry`` from now on, whatever allows it (and drop an added rule of the
        same text); the rule, and whether anything changed."""
        rule = parse_rule(entry, where)
        with self.lock:
            dropped = self.added.pop(rule.text, None) is not None
            if rule.text in self.denied:
                self._rebuild()
                return rule, dropped
            self._room(where)
            self.denied[rule.text] = rule
            self._rebuild()
        return rule, True

    def _room(self, where: str) -> None:
        if len(self.added) + len(self.denied) >= MAX_ADDED:
            raise PolicyError(
                f"{where}: this sandbox has {MAX_ADDED} rules added at run time already",
                operation="net",
                hint="recreate the sandbox with the hosts it needs (--allow-host), or use wildcards",
            )

    def _rebuild(self) -> None:
        # A new object, swapped in whole: a proxy thread deciding meanwhile sees the
        # old list or the new one, never half of a change.
        self.current = Allowlist((*self.base, *self.added.values()), tuple(self.denied.values()))

    def rules(self) -> tuple[list[str], list[str], list[str]]:
        """(the rules at start, those added since, those denied since), as written."""
        with self.lock:
            return [r.text for r in self.base], list(self.added), list(self.denied)

    # --- approvals -----------------------------------------------------------------------

    def wait_for_answer(
        self,
        method: str,
        host: str,
        port: int,
        who: Callable[[], str] | None = None,
        on_asked: Callable[[Pending], None] | None = None,
    ) -> tuple[str, Pending | None]:
        """Hold a connection to an unlisted ``host:port`` until it is answered or the ask
        timeout passes; how it ended (``APPROVED``...) and the request it waited on.
        ``who``: which process asked, looked up for a new request only; ``on_asked``:
        told of a new request (not of a connection joining one)."""
        if not self.attended or self.ask_timeout is None:
            return UNATTENDED, None
        process = ""
        with self.lock:
            new = self._same(method, host, port) is None and len(self.pending) < MAX_PENDING
        if new and who is not None:
            # Before the request is listed, so the list names it whole; outside the lock
            # (it reads /proc), and informational: never an error of the connection's.
            with contextlib.suppress(Exception):
                process = who()
        with self.lock:
            same = self._same(method, host, port)
            if same is not None:
                same.waiting += 1
                asked = same
            elif len(self.pending) >= MAX_PENDING:
                return FULL, None
            else:
                asked = Pending(next(self.ids), method, host, port, self.clock(), process)
                self.pending[asked.id] = asked
        if same is None and on_asked is not None:
            on_asked(asked)
        asked.done.wait(max(0.0, asked.since + self.ask_timeout - self.clock()))
        with self.lock:
            # Membership is the truth: an answer and the timeout take the request out
            # under this lock, so exactly one of them ends it.
            if self.pending.pop(asked.id, None) is not None:
                asked.answer = TIMED_OUT
                asked.done.set()
            return asked.answer, asked

    def _same(self, method: str, host: str, port: int) -> Pending | None:
        return next(
            (p for p in self.pending.values() if (p.method, p.host, p.port) == (method, host, port)), None
        )

    def answer(self, request_id: int, approve: bool, always: bool) -> Pending:
        """Answer pending request ``request_id``; with ``always`` its host and port are
        added to the allowlist for the sandbox's life."""
        with self.lock:
            asked = self.pending.get(request_id)
        if asked is None:
            raise _no_request(request_id)
        if approve and always:
            # Before the answer, so the waiting connections and every later one see it.
            # parse_rule decides as at create: an address becomes an address rule, a
            # name a name rule (its answers are still judged: rebinding, link-local).
            self.allow(_entry(asked.host, asked.port), "warren net approve --always")
        with self.lock:
            if self.pending.pop(request_id, None) is None:
                raise _no_request(request_id)
            asked.answer = (APPROVED_ALWAYS if always else APPROVED) if approve else REJECTED
            asked.done.set()
        return asked

    def waiting(self) -> list[Pending]:
        with self.lock:
            return sorted(self.pending.values(), key=lambda p: p.id)

    def approved_list(self, asked: Pending) -> Allowlist:
        """The allowlist for the connections an approval let through: the current one
        plus that one host and port, judged as every rule is."""
        extra = parse_rule(_entry(asked.host, asked.port), "warren net approve")
        current = self.current
        return Allowlist((*current.rules, extra), current.denied)


def _no_request(request_id: int) -> PolicyError:
    return PolicyError(
        f"no pending request {request_id}",
        operation="net",
        hint="it was answered, or it timed out; `warren net NAME pending` lists the waiting ones",
    )


def _entry(host: str, port: int) -> str:
    return hostport(host, port) if ip_literal(host) is not None else f"{host}:{port}"
