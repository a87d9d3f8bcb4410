"""Allowlist proxy throughput and per-connection cost, side by side in one run.

    python bench/bench_net.py [--runs N] [--requests N] [--mib N]

A minimal HTTP/1.1 server (a subprocess of this script, sendfile from a temp file so
it is never the bottleneck) listens on 127.0.0.2; `bench.test` is mapped to it.

  throughput  curl downloads a 100 MiB body: straight from the server; through
              `netproxy.Proxy` alone in this process (plain HTTP and a CONNECT
              tunnel); and from inside `warren.run` (the real `--network allow`
              path, curl finds the proxy through the http_proxy warren sets)
  latency     a tiny body, a new connection per request, from a raw-socket loop in a
              child process (no curl start-up, no GIL shared with the proxy):
              direct against the in-process proxy, plain GET and CONNECT

Targets: proxy throughput >= 80% of direct, < 2 ms added per connection.

Then HTTPS through the proxy that terminates TLS to put a secret in (``--secret``)
vs direct: bench/bench_net_https.py (``--no-https`` skips it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import warren
from warren.net.allowlist import Allowlist, parse_rules
from warren.net.proxy import Proxy
from warren.policy import PolicySpec

SERVER_ADDR = "127.0.0.2"
NAME = "bench.test"
SMALL = b"x" * 64  # the tiny body of /small
LABELS = {"direct": "direct", "plain": "proxy, plain GET", "connect": "proxy, CONNECT"}
MODES = tuple(LABELS)
LATENCY_BUDGET = 8.0  # seconds of requests per mode at most
THROUGHPUT_TARGET = 0.80
LATENCY_TARGET_MS = 2.0


# --- the server (child process) ---------------------------------------------------


def _serve_one(conn: socket.socket, body: Path) -> None:
    with conn:
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = conn.recv(65536)
            if not chunk:
                return
            buf += chunk
        path = buf.split(b" ", 2)[1] if buf.count(b" ") >= 2 else b"/"
        small = path.endswith(b"/small")
        length = len(SMALL) if small else body.stat().st_size
        head = (
            f"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
            f"Content-Length: {length}\r\nConnection: close\r\n\r\n"
        ).encode()
        if small:
            conn.sendall(head + SMALL)
        else:
            conn.sendall(head)
            with body.open("rb") as f:
                conn.sendfile(f)
        conn.shutdown(socket.SHUT_WR)


def serve(body: Path) -> None:
    """Answer every GET: /small with 64 bytes, anything else with ``body``. Prints the
    port, then serves until stdin closes."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((SERVER_ADDR, 0))
    listener.listen(1024)

    def accept() -> None:
        while True:
            conn, _ = listener.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=_serve_one, args=(conn, body), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    print(listener.getsockname()[1], flush=True)
    sys.stdin.read()


# --- the latency client (child process) -------------------------------------------


def _read_all(sock: socket.socket) -> bytes:
    out = bytearray()
    while chunk := sock.recv(65536):
        out += chunk
    return bytes(out)


def _one_request(mode: str, proxy: tuple[str, int], port: int) -> None:
    authority = f"{NAME}:{port}"
    target = proxy if mode != "direct" else (SERVER_ADDR, port)
    with socket.create_connection(target) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        url = f"http://{authority}/small" if mode == "plain" else "/small"
        if mode == "connect":
            sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
            buf = b""
            while b"\r\n\r\n" not in buf:
                chunk = sock.recv(4096)
                if not chunk:
                    raise RuntimeError("proxy closed the CONNECT")
                buf += chunk
            if not buf.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"CONNECT refused: {buf[:200]!r}")
        sock.sendall(f"GET {url} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n".encode())
        reply = _read_all(sock)
    if not reply.startswith(b"HTTP/1.1 200") or not reply.endswith(b"\r\n\r\n" + SMALL):
        raise RuntimeError(f"{mode}: unexpected reply {reply[:200]!r}")


def latency_client(proxy_port: int, port: int, requests: int, budget: float) -> None:
    """Interleave the modes request by request; print seconds per request as JSON. A
    mode that has used up ``budget`` seconds is dropped (a slow proxy must not make
    the run take minutes): fewer samples then, which the report shows."""
    proxy = ("127.0.0.1", proxy_port)
    out: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(10):
        for mode in MODES:
            _one_request(mode, proxy, port)
    for _ in range(requests):
        for mode in MODES:
            if sum(out[mode]) > budget:
                continue
            t = time.perf_counter()
            _one_request(mode, proxy, port)
            out[mode].append(time.perf_counter() - t)
    print(json.dumps(out))


# --- the benchmark ----------------------------------------------------------------


CURL_OUT = "%{speed_download} %{time_total} %{size_download}"


def _curl(*extra: str) -> list[str]:
    return ["curl", "-sS", "-o", "/dev/null", "-w", CURL_OUT, *extra]


def _parse_curl(out: bytes, mib: int) -> float:
    """MiB/s from curl's -w output; checks the whole body arrived."""
    speed, _total, size = out.split()
    if int(size) != mib << 20:
        raise RuntimeError(f"curl fetched {int(size)} bytes, expected {mib << 20}")
    return float(speed) / (1 << 20)


def _curl_host(argv: list[str], mib: int) -> float:
    r = subprocess.run(argv, capture_output=True, check=True)
    return _parse_curl(r.stdout, mib)


def _curl_sandbox(argv: list[str], policy: PolicySpec, mib: int) -> float:
    r = warren.run(argv, policy=policy)
    if r.exit_code != 0:
        raise RuntimeError(f"curl in the sandbox exited {r.exit_code}: {r.stderr.decode(errors='replace')}")
    return _parse_curl(r.stdout, mib)


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))]


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10, help="downloads per mode")
    ap.add_argument("--requests", type=int, default=300, help="small requests per mode")
    ap.add_argument("--mib", type=int, default=100, help="size of the download")
    ap.add_argument("--no-https", action="store_true", help="skip HTTPS via the secret-substituting proxy")
    ap.add_argument("--serve", metavar="FILE", help=argparse.SUPPRESS)
    ap.add_argument("--client", nargs=2, type=int, metavar=("PROXY", "PORT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(Path(args.serve))
        return
    if args.client:
        latency_client(args.client[0], args.client[1], args.requests, LATENCY_BUDGET)
        return

    base = Path(tempfile.mkdtemp(prefix="warren-bench-net."))
    server: subprocess.Popen[bytes] | None = None
    proxy: Proxy | None = None
    try:
        body = base / "body"
        with body.open("wb") as f:
            block = os.urandom(1 << 20)
            for _ in range(args.mib):
                f.write(block)
        ws = base / "ws"
        ws.mkdir()
        server = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(body)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert server.stdout is not None
        port = int(server.stdout.readline())
        allow = [f"{NAME}:{port}", f"{SERVER_ADDR}:{port}"]
        resolve = {NAME: SERVER_ADDR}

        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        listener.bind(("127.0.0.1", 0))
        listener.listen(512)
        proxy_port = listener.getsockname()[1]
        proxy = Proxy(listener, Allowlist(parse_rules(allow)), sandbox="bench", resolve=resolve).start()
        policy = PolicySpec(workspace=str(ws), allow_hosts=allow, resolve=resolve)

        url = f"http://{NAME}:{port}/"
        via = ["-x", f"http://127.0.0.1:{proxy_port}"]
        host_modes = {
            "direct": _curl("--resolve", f"{NAME}:{port}:{SERVER_ADDR}", url),
            "proxy, plain HTTP": _curl(*via, url),
            "proxy, CONNECT": _curl(*via, "--proxytunnel", url),
        }
        sandbox_modes = {
            "sandbox, plain HTTP": _curl(url),
            "sandbox, CONNECT": _curl("--proxytunnel", url),
        }
        speeds: dict[str, list[float]] = {m: [] for m in [*host_modes, *sandbox_modes]}
        for argv in host_modes.values():  # warm the page cache and the paths
            _curl_host(argv, args.mib)
        for i in range(args.runs + 1):  # interleaved, so drift hits every mode alike
            for mode, argv in host_modes.items():
                speed = _curl_host(argv, args.mib)
                if i:
                    speeds[mode].append(speed)
            for mode, argv in sandbox_modes.items():
                speed = _curl_sandbox(argv, policy, args.mib)
                if i:
                    speeds[mode].append(speed)

        client_argv = [sys.executable, __file__, "--requests", str(args.requests), "--client"]
        client = subprocess.run([*client_argv, str(proxy_port), str(port)], capture_output=True, check=True)
        lat: dict[str, list[float]] = json.loads(client.stdout)
        proxy.stop()
        proxy = None

        print(
            f"{args.mib} MiB download on loopback with curl, median (min .. max) of {args.runs} "
            f"({os.uname().release}, uid {os.getuid()}, {os.cpu_count()} CPUs)"
        )
        direct = statistics.median(speeds["direct"])
        worst = 1.0
        for mode, xs in speeds.items():
            med = statistics.median(xs)
            line = f"  {mode:<22} {med:8.0f} MiB/s   ({min(xs):4.0f} .. {max(xs):4.0f})"
            if mode != "direct":
                ratio = med / direct
                worst = min(worst, ratio)
                line += f"   {ratio:5.2f} of direct"
            else:
                line += "   baseline"
            print(line)
        print(
            f"  worst ratio {worst:.2f}  (target >= {THROUGHPUT_TARGET:.2f}: "
            f"{_met(worst >= THROUGHPUT_TARGET)})"
        )

        print(f"{len(SMALL)}-byte GET, a new connection each, {args.requests} per mode (raw sockets)")
        base_med = statistics.median(lat["direct"])
        most = 0.0
        for mode, label in LABELS.items():
            xs = lat[mode]
            med, p95 = statistics.median(xs), _pct(xs, 0.95)
            line = f"  {label:<22} median {med * 1e3:7.3f} ms   p95 {p95 * 1e3:7.3f} ms"
            if mode != "direct":
                added = (med - base_med) * 1e3
                most = max(most, added)
                line += f"   {added:+.3f} ms per connection"
            else:
                line += "   baseline"
            if len(xs) < args.requests:
                line += f"   [only {len(xs)} requests: {LATENCY_BUDGET:.0f} s budget spent]"
            print(line)
        print(
            f"  most added {most:.3f} ms  (target < {LATENCY_TARGET_MS:.0f} ms: "
            f"{_met(most < LATENCY_TARGET_MS)})"
        )
    finally:
        if proxy is not None:
            proxy.stop()
        if server is not None:
            for stream in (server.stdin, server.stdout):
                if stream is not None:
                    stream.close()  # EOF on stdin ends the server
            try:
                server.wait(timeout=5)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        shutil.rmtree(base, ignore_errors=True)
    if not args.no_https:
        # HTTPS through the secret-substituting proxy (--secret): bench_net_https.py
        sys.path.insert(0, str(Path(__file__).parent))
        import bench_net_https

        print()
        bench_net_https.main(["--runs", str(min(args.runs, 5)), "--requests", str(args.requests)])


if __name__ == "__main__":
    main()
