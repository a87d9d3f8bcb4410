"""TLS over a blocking socket through memory BIOs: both ends of the intercepting proxy.

Owns moving bytes through TLS in large batches; what the bytes mean (HTTP, secrets)
belongs to ``net.intercept``.

Why not ``ssl.SSLSocket``: it reads each TLS record with two syscalls (its 5-byte
header, then its body), writes each record with a syscall of its own, and ``recv``
returns at most one record (16 KiB) per call. Moving a MiB through the proxy cost
about 130 syscalls and as many trips through Python: 2.4 ms of CPU per MiB, three
quarters of it in those socket calls (bench/bench_net_https.py, profiled with
py-spy). Here one ``recv_into`` takes whatever ciphertext the kernel holds (up to
``RECV_SIZE``, many records), ``read_into`` decrypts as many records as fit into the
caller's buffer, and ``write`` encrypts into memory, sent with one ``sendall`` once
``FLUSH_AT`` bytes are pending or before this side waits for anything.

Whatever was written is sent before either side blocks: ``read_into`` flushes its own
stream and its ``peer`` first, so a small answer goes out in one write and nothing
waits in memory while the proxy waits for more.
"""

from __future__ import annotations

import contextlib
import socket
import ssl

RECV_SIZE = 1 << 18  # ciphertext per recv: sixteen full records
FLUSH_AT = 1 << 18  # ciphertext held before it is sent even without a pause


class TlsStream:
    """One TLS connection over ``sock`` (blocking, with the socket's timeout)."""

    def __init__(
        self,
        sock: socket.socket,
        context: ssl.SSLContext,
        *,
        server_side: bool,
        server_hostname: str | None = None,
        recv_size: int = RECV_SIZE,
        session: ssl.SSLSession | None = None,
    ) -> None:
        self.sock = sock
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self.tls = context.wrap_bio(
            self._incoming,
            self._outgoing,
            server_side=server_side,
            server_hostname=server_hostname,
            session=session,
        )
        self._raw_view = memoryview(bytearray(recv_size))
        self.peer: TlsStream | None = None  # flushed before this stream waits
        self.ended = False

    def handshake(self) -> None:
        """Raises what ``SSLObject.do_handshake`` raises (a certificate refused, a protocol
        error), or ``ConnectionError`` for a peer that left in the middle."""
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self.flush()
                if not self._fill():
                    raise ConnectionError("the peer closed during the TLS handshake") from None
        self.flush()

    def selected_alpn_protocol(self) -> str | None:
        return self.tls.selected_alpn_protocol()

    def _fill(self) -> bool:
        """More ciphertext from the socket; False at its end."""
        n = self.sock.recv_into(self._raw_view)
        if not n:
            self._incoming.write_eof()
            return False
        self._incoming.write(self._raw_view[:n])
        return True

    def flush(self) -> None:
        if self._outgoing.pending:
            self.sock.sendall(self._outgoing.read())

    def read_into(self, view: memoryview) -> int:
        """Plaintext into ``view``: as much as has arrived, waiting only while nothing
        has; 0 once the peer ended (close_notify, or the socket closed: a missing
        close_notify is taken as the end, as ``SSLSocket`` does by default)."""
        got = 0
        while got < len(view) and not self.ended:
            try:
                # With a buffer, read returns a count (typeshed knows only the bytes form).
                n: int = self.tls.read(len(view) - got, view[got:])  # type: ignore[assignment]
            except ssl.SSLWantReadError:
                if got:
                    break
                if self.peer is not None:
                    self.peer.flush()
                self.flush()
                self._fill()
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                self.ended = True
                break
            if not n:
                self.ended = True
                break
            got += n
        return got

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Encrypt ``data`` (sent at once if enough is pending, else at the next flush)."""
        view = memoryview(data)
        while view:
            try:
                view = view[self.tls.write(view) :]
            except ssl.SSLWantReadError:  # a renegotiation wants the peer first
                self.flush()
                if not self._fill():
                    raise ConnectionError("the peer closed during a TLS renegotiation") from None
        if self._outgoing.pending >= FLUSH_AT:
            self.flush()

    def send(self, data: bytes | bytearray | memoryview) -> None:
        self.write(data)
        self.flush()

    def close_notify(self) -> None:
        """Say the end in TLS (best effort): a client reading until the connection
        closes can tell the end from a cut."""
        with contextlib.suppress(ssl.SSLError, OSError, ValueError):
            self.tls.unwrap()
        with contextlib.suppress(OSError):
            self.flush()
