"""What `warren sandboxd`'s contract costs next to warren's own library, both against the
same kind of long-lived sandbox (the daemon's own, and one made with `Sandbox.create`):

  Execute round trip of `true`: library `exec` vs gRPC `Execute` (median, p90)
  Start streaming of stdout (`head -c N /dev/zero`, default 64 MiB): MiB/s received by
  the client, next to the library's `exec` capturing the same output
  a 1 MiB file written and read back: library `files.write`/`read` vs REST PUT/GET

Run: python bench/bench_sandboxd.py [--runs 200] [--mib 64]   (needs warren-sandbox[sandboxd])
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import httpx
from k8s_agent_sandbox.commands._process_stubs import process_pb2 as pb
from k8s_agent_sandbox.commands._process_stubs import process_pb2_grpc as pb_grpc

from warren import PolicySpec
from warren.client.sandbox import Sandbox


def _daemon(workspace: Path, log: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    args = [sys.executable, "-m", "warren", "sandboxd", "--workspace", str(workspace)]
    args += ["--grpc-addr", "127.0.0.1:0", "--rest-addr", "127.0.0.1:0"]
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=out)
    while not (m := re.search(r"grpc (\S+) rest (\S+)", log.read_text())):
        if proc.poll() is not None:
            raise SystemExit(f"warren sandboxd did not start: {log.read_text()}")
        time.sleep(0.02)
    return proc, m.group(1), m.group(2)


def _times(runs: int, fn: Callable[[], object]) -> tuple[float, float]:
    fn()
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.9)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--mib", type=int, default=64)
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "lib").mkdir()
        (tmp / "pod").mkdir()
        proc, grpc_at, rest_at = _daemon(tmp / "pod", tmp / "sandboxd.log")
        stub = pb_grpc.ProcessServiceStub(grpc.insecure_channel(grpc_at))
        http = httpx.Client(base_url=f"http://{rest_at}", timeout=60)
        try:
            with Sandbox.create(PolicySpec(workspace=str(tmp / "lib"))) as sb:
                lib = _times(ns.runs, lambda: sb.exec(["true"]))
                request = pb.ExecuteRequest(config=pb.ProcessConfig(command=["true"]))
                contract = _times(ns.runs, lambda: stub.Execute(request, timeout=60))
                print(
                    f"Execute `true` (ms)     library {lib[0]:6.2f} p90 {lib[1]:6.2f}   "
                    f"sandboxd {contract[0]:6.2f} p90 {contract[1]:6.2f}   ratio {contract[0] / lib[0]:.2f}"
                )

                size = ns.mib << 20
                cmd = ["head", "-c", str(size), "/dev/zero"]
                t = time.perf_counter()
                got = len(sb.exec(cmd, output_limit=size + 1).stdout)
                lib_rate = got / (1 << 20) / (time.perf_counter() - t)
                t, got = time.perf_counter(), 0
                for event in stub.Start(pb.StartRequest(config=pb.ProcessConfig(command=cmd)), timeout=600):
                    got += len(event.stdout)
                start_rate = got / (1 << 20) / (time.perf_counter() - t)
                assert got == size, got
                print(
                    f"stdout {ns.mib} MiB (MiB/s)   library {lib_rate:6.1f}              "
                    f"Start    {start_rate:6.1f}              ratio {start_rate / lib_rate:.2f}"
                )

                data = os.urandom(1 << 20)

                def lib_file() -> None:
                    sb.files.write("f.bin", data)
                    assert sb.files.read("f.bin") == data

                def rest_file() -> None:
                    http.put("/v1/files/f.bin", content=data).raise_for_status()
                    assert http.get("/v1/files/f.bin").content == data

                lib = _times(max(ns.runs // 4, 10), lib_file)
                contract = _times(max(ns.runs // 4, 10), rest_file)
                print(
                    f"1 MiB put+get (ms)      library {lib[0]:6.2f} p90 {lib[1]:6.2f}   "
                    f"REST     {contract[0]:6.2f} p90 {contract[1]:6.2f}   ratio {contract[0] / lib[0]:.2f}"
                )
        finally:
            http.close()
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
