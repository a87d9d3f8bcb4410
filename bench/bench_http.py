"""The HTTP API's cost next to the local transport, against a real `warren serve` on
loopback TCP (token auth, keep-alive client):

  exec round trip of `true` in a long-lived sandbox: local transport vs HTTP (median,
  p90; target: HTTP adds <= 3 ms at the median)
  SSE streaming throughput of stdout (`head -c N /dev/zero`, default 100 MiB; target
  >= 100 MiB/s), bytes decoded by the client
  100 concurrent execs over HTTP: p50 and p99 latency per exec

Run: python bench/bench_http.py [--runs 300] [--mib 100] [--concurrent 100]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from warren import PolicySpec
from warren.client.http import HttpTransport
from warren.client.local import LocalTransport
from warren.client.sandbox import Sandbox


def _serve(tmp: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    token = secrets.token_hex(16)
    (tmp / "token").write_text(token)
    log = (tmp / "serve.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "warren",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--token-file",
            str(tmp / "token"),
        ],
        stderr=log,
        stdout=log,
    )
    while not (m := re.search(r"listening on (\S+)", (tmp / "serve.log").read_text())):
        time.sleep(0.02)
    return proc, m.group(1), token


def _timed(fn: object, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append((time.perf_counter() - t) * 1000)
    return sorted(out)


def _pct(values: list[float], p: float) -> float:
    return values[min(len(values) - 1, int(len(values) * p))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--mib", type=int, default=100)
    ap.add_argument("--concurrent", type=int, default=100)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        os.environ["XDG_STATE_HOME"] = str(tmp / "state")
        ws = tmp / "ws"
        ws.mkdir()
        proc, url, token = _serve(tmp)
        try:
            policy = PolicySpec(workspace=str(ws))
            local = Sandbox.create(policy, transport=LocalTransport())
            remote = Sandbox.create(policy, transport=HttpTransport(url, token))
            for sb in (local, remote):
                for _ in range(20):
                    sb.exec(["true"])
            lt = _timed(lambda: local.exec(["true"]), args.runs)
            ht = _timed(lambda: remote.exec(["true"]), args.runs)
            lm, hm = statistics.median(lt), statistics.median(ht)
            print(f"exec `true`, {args.runs} runs: local median {lm:.2f} ms p90 {_pct(lt, 0.9):.2f}")
            print(f"                      http  median {hm:.2f} ms p90 {_pct(ht, 0.9):.2f}")
            print(f"  added by HTTP at the median: {hm - lm:.2f} ms (target <= 3)")

            size = args.mib << 20
            body = {"argv": ["head", "-c", str(size), "/dev/zero"], "output_limit": 1024}
            nodelay = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
            auth = {"Authorization": f"Bearer {token}"}
            with httpx.Client(base_url=url, headers=auth, timeout=120, transport=nodelay) as c:
                t = time.perf_counter()
                got = 0
                with c.stream(
                    "POST",
                    f"/v1/sandboxes/{remote.name}/exec",
                    json=body,
                    headers={"Accept": "text/event-stream"},
                ) as r:
                    for line in r.iter_lines():
                        if line.startswith('data: {"data"'):
                            got += len(base64.b64decode(json.loads(line[5:])["data"]))
                took = time.perf_counter() - t
            assert got == size, (got, size)
            print(f"SSE stdout: {args.mib} MiB in {took:.2f} s = {args.mib / took:.0f} MiB/s (target >= 100)")

            n = args.concurrent
            for label, sb in (("local", local), ("HTTP", remote)):

                def one(_: int, sb: Sandbox = sb) -> float:
                    return _timed(lambda: sb.exec(["true"]), 1)[0]

                with ThreadPoolExecutor(n) as pool:
                    lat = sorted(pool.map(one, range(n * 3)))
                p50, p99 = _pct(lat, 0.5), _pct(lat, 0.99)
                print(f"{n} concurrent execs, {label} ({n * 3} total): p50 {p50:.1f} ms p99 {p99:.1f} ms")
            local.remove()
            remote.remove()
        finally:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
