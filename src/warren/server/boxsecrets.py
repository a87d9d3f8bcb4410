"""A sandbox's secrets as the supervisor launches it: the real values read from the
caller, the sandbox's CA made, its trust bundle written.

The values come from the caller's environment (``$ENVVAR``) or a file the caller can
read (its first line), read when the sandbox starts; they live on in this process
and in the sandbox's network helper (a fork of it), never in a plan, a file or the
sandbox. The CA's key is the same. The trust bundle is public (the caller's CAs plus
the sandbox's CA certificate): written beneath warren's state directory, which no
sandbox can see, under a fresh name, mounted inside over the system bundle, and
removed when the sandbox ends.
"""

from __future__ import annotations

import contextlib
import os
import re

from ..errors import PolicyError, SetupError
from ..plan import CallerFacts, Plan

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..net.intercept import Interception

MAX_VALUE = 16 * 1024
_BAD = re.compile(rb"[\x00-\x1f\x7f]")  # a header value cannot hold these (CR LF: injection)


def read_value(name: str, source: str, caller: CallerFacts) -> bytes:
    """The real value of secret ``name`` from ``source`` ($VAR or "file PATH")."""
    if source.startswith("$"):
        value = caller.env.get(source[1:], "").encode()
        if not value:
            raise PolicyError(
                f"secret {name}: {source} is not set (or empty) in your environment",
                operation="secret",
                hint=f"export {source[1:]}=... before starting the sandbox, or use NAME=file:PATH@HOST",
            )
    else:
        raw = source.removeprefix("file ")
        path = os.path.join(caller.cwd, caller.home + raw[1:] if raw.startswith("~/") else raw)
        try:
            with open(path, "rb") as f:
                value = f.read(MAX_VALUE + 1).split(b"\n", 1)[0].rstrip(b"\r \t")
        except OSError as e:
            raise PolicyError.from_os(
                e,
                f"secret {name}: cannot read {path}: {e.strerror}",
                "secret",
                path,
                hint="the file's first line is the value; check the path and its permissions",
            ) from None
        if not value:
            raise PolicyError(
                f"secret {name}: the first line of {path} is empty",
                operation="secret",
                path=path,
                hint="put the value on the file's first line",
            )
    if len(value) > MAX_VALUE or _BAD.search(value):
        raise PolicyError(
            f"secret {name}: the value from {source} is longer than {MAX_VALUE} bytes or holds control "
            "characters",
            operation="secret",
            hint="a secret goes into an HTTP header: one line of printable characters",
        )
    return value


def _caller_trust(caller: CallerFacts) -> str | None:
    path = caller.env.get("SSL_CERT_FILE")
    if not path:
        return None
    try:
        with open(os.path.join(caller.cwd, path), "rb") as f:
            return f.read(16 << 20).decode("ascii", errors="replace")
    except OSError as e:
        raise SetupError.from_os(
            e,
            f"cannot read your SSL_CERT_FILE {path}: {e.strerror}",
            "secret",
            path,
            hint="the proxy checks the real hosts of secrets with it; fix or unset SSL_CERT_FILE",
        ) from None


def prepare(plan: Plan, caller: CallerFacts) -> tuple[Interception, bytes] | None:
    """The proxy's interception (values, CA) and the trust bundle's content, or None
    when the plan has no secrets or HTTP rules."""
    net = plan.net
    if not net.intercepts:
        return None
    values = {s.name: read_value(s.name, s.source, caller) for s in net.secrets}
    from ..net import tlsca  # cryptography: only for sandboxes that need it
    from ..net.intercept import Interception

    hosts = [*(h for s in net.secrets for h in s.hosts), *(r.host for r in net.http_rules)]
    ca = tlsca.make_ca(plan.hostname or "warren", hosts)
    extra = _caller_trust(caller)
    base = extra
    if base is None and net.bundle_target is not None:
        with contextlib.suppress(OSError), open(net.bundle_target, "rb") as f:
            base = f.read(16 << 20).decode("ascii", errors="replace")
    bundle = (base or "").rstrip("\n").encode() + b"\n" + ca.cert_pem
    return Interception(net.secrets, values, net.http_rules, ca, extra), bundle


def write_bundle(path: str, data: bytes) -> None:
    """The trust bundle at ``path`` (a fresh name beneath the state directory, which
    no sandbox can see or write)."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise SetupError.from_os(
            e,
            f"cannot write the sandbox's trust bundle {path}: {e.strerror}",
            "secret",
            path,
            hint="check warren's state directory (XDG_STATE_HOME)",
        ) from None
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def remove_bundle(path: str | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError):
            os.unlink(path)
