"""The per-sandbox certificate authority that lets the proxy read a secret's requests.

Made when a sandbox with secrets (or HTTP rules) starts, by the supervisor; its
certificate goes into the sandbox's trust bundle, its key only into the memory of
that sandbox's network helper (``server.netd``): never a file, never the sandbox.
EC P-256, valid for a short while around now, and name-constrained to the hosts it
may sign for, so even a copy of it would vouch for nothing else. Leaf certificates
are made on first use per host and kept for the helper's life.

``cryptography`` is imported here only: sandboxes without secrets never load it.
"""

from __future__ import annotations

import datetime
import os
import ssl
import threading
from collections.abc import Sequence
from dataclasses import dataclass

VALIDITY = datetime.timedelta(days=30)  # a long-lived sandbox older than this needs a restart
_SKEW = datetime.timedelta(hours=1)  # clocks a little behind still accept a new certificate


@dataclass(frozen=True)
class CA:
    cert_pem: bytes
    key_pem: bytes  # in the network helper's memory only


def make_ca(label: str, hosts: Sequence[str]) -> CA:
    """A fresh CA for one sandbox, allowed to sign for ``hosts`` (names; ``*.d`` means d's subtree)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"warren sandbox {label} proxy CA")])
    now = datetime.datetime.now(datetime.UTC)
    permitted = [x509.DNSName(h[2:] if h.startswith("*.") else h) for h in dict.fromkeys(hosts)]
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _SKEW)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if permitted:
        builder = builder.add_extension(
            x509.NameConstraints(permitted_subtrees=permitted, excluded_subtrees=None), critical=True
        )
    cert = builder.sign(key, hashes.SHA256())
    return CA(
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )


class Leaves:
    """Server-side TLS contexts per host, signed by one CA, made on first use."""

    def __init__(self, ca: CA) -> None:
        self.ca = ca
        self._lock = threading.Lock()
        self._contexts: dict[str, ssl.SSLContext] = {}
        self._ca_key: object | None = None
        self._ca_cert: object | None = None

    def context(self, host: str) -> ssl.SSLContext:
        with self._lock:
            ctx = self._contexts.get(host)
            if ctx is None:
                ctx = self._contexts[host] = self._make(host)
            return ctx

    def _make(self, host: str) -> ssl.SSLContext:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        if self._ca_key is None:
            self._ca_key = serialization.load_pem_private_key(self.ca.key_pem, None)
            self._ca_cert = x509.load_pem_x509_certificate(self.ca.cert_pem)
        ca_key, ca_cert = self._ca_key, self._ca_cert
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey) and isinstance(ca_cert, x509.Certificate)
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _SKEW)
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
            )
            .sign(ca_key, hashes.SHA256())
        )
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["http/1.1"])
        chain = cert.public_bytes(serialization.Encoding.PEM)
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        # load_cert_chain reads files only: an anonymous file in memory (never on a
        # disk), gone once read.
        fd = os.memfd_create("warren-leaf", os.MFD_CLOEXEC)
        try:
            os.write(fd, chain + key_pem)
            ctx.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return ctx


def upstream_context(extra_cadata: str | None) -> ssl.SSLContext:
    """How the proxy checks the real host: the system's trust, plus the caller's
    ``SSL_CERT_FILE`` (read when the sandbox was made)."""
    ctx = ssl.create_default_context()
    ctx.set_alpn_protocols(["http/1.1"])
    if extra_cadata:
        ctx.load_verify_locations(cadata=extra_cadata)
    return ctx
