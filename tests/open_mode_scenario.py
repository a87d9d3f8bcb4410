"""Run by test_network.py inside a network namespace of the test's own (``unshare``),
with CAP_NET_ADMIN there: builds a tiny network, runs ``warren run --network open``
and prints what the sandbox could reach, as JSON.

    this namespace ("the host")            a second namespace ("the internet")
    wv0 10.213.0.1/24, default route  ───  wv1 10.213.0.2/24, HTTP server :8080
    127.0.0.1:8081 and 0.0.0.0:8082: the host's own services, never for the sandbox
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

PROBE = r"""
import json, socket, urllib.request
out = {}
try:
    out["remote"] = urllib.request.urlopen("http://10.213.0.2:8080/hello.txt", timeout=5).read().decode()
except OSError as e:
    out["remote"] = f"error: {e}"
probes = {"host_loopback": ("127.0.0.1", 8081), "host_any": ("10.213.0.1", 8082),
          "host_any_via_gateway": ("10.213.0.2", 8082), "host_loopback_via_gateway": ("10.213.0.2", 8081)}
for name, addr in probes.items():
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect(addr)
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        out[name] = "REACHED " + s.recv(100).decode(errors="replace")
    except OSError as e:
        out[name] = f"unreachable ({e.__class__.__name__})"
print(json.dumps(out))
"""


def _pasta_processes() -> list[str]:
    """This user's pasta processes (another user's test run may hold its own)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}").st_uid != os.getuid():
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"--config-net" in argv:
            found.append(b" ".join(argv).decode(errors="replace"))
    return found


def _long_lived(workdir: str) -> dict[str, object]:
    """The same through a long-lived sandbox (pasta started by the supervisor)."""
    env = {**os.environ, "XDG_STATE_HOME": f"{workdir}.state"}  # never inside the workspace
    warren = [sys.executable, "-m", "warren"]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*warren, *args], capture_output=True, text=True, cwd=workdir, env=env, timeout=60
        )

    out: dict[str, object] = {}
    created = cli("create", "--network", "open", "openbox")
    if created.returncode != 0:
        return {"error": created.stderr}
    try:
        r = cli("exec", "openbox", "--", "python3", "-c", PROBE)
        out.update(json.loads(r.stdout) if r.returncode == 0 else {"error": r.stderr})
        out["pasta_while_running"] = len(_pasta_processes())
    finally:
        cli("rm", "-f", "openbox")
    deadline = time.monotonic() + 3
    while _pasta_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    out["pasta_left"] = _pasta_processes()
    return out


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True)


def main(workdir: str) -> int:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        sh("ip", "link", "set", "lo", "up")
        holder = subprocess.Popen(["unshare", "--net", "sleep", "120"])
        procs.append(holder)
        remote = f"/proc/{holder.pid}/ns/net"
        time.sleep(0.2)
        sh("ip", "link", "add", "wv0", "type", "veth", "peer", "name", "wv1", "netns", str(holder.pid))
        sh("ip", "addr", "add", "10.213.0.1/24", "dev", "wv0")
        sh("ip", "link", "set", "wv0", "up")
        sh("ip", "route", "add", "default", "via", "10.213.0.2")
        for cmd in (
            ["ip", "link", "set", "lo", "up"],
            ["ip", "addr", "add", "10.213.0.2/24", "dev", "wv1"],
            ["ip", "link", "set", "wv1", "up"],
        ):
            sh("nsenter", f"--net={remote}", *cmd)
        with open(f"{workdir}/hello.txt", "w") as f:
            f.write("hello from the remote host\n")
        serve = [sys.executable, "-m", "http.server", "--directory", workdir, "--bind"]
        procs.append(subprocess.Popen(["nsenter", f"--net={remote}", *serve, "10.213.0.2", "8080"]))
        procs.append(subprocess.Popen([*serve, "127.0.0.1", "8081"], stderr=subprocess.DEVNULL))
        procs.append(subprocess.Popen([*serve, "0.0.0.0", "8082"], stderr=subprocess.DEVNULL))
        time.sleep(0.8)
        r = subprocess.run(
            [sys.executable, "-m", "warren", "run", "--network", "open", "--", "python3", "-c", PROBE],
            capture_output=True,
            text=True,
            cwd=workdir,
            timeout=60,
        )
        result = {"returncode": r.returncode, "stderr": r.stderr}
        if r.returncode == 0:
            result.update(json.loads(r.stdout))
        # pasta ends with the sandbox: no process of it is left (the run returns once
        # nothing of the sandbox runs; pasta is stopped as its PID 1 exits, a moment later).
        deadline = time.monotonic() + 3
        while _pasta_processes() and time.monotonic() < deadline:
            time.sleep(0.05)
        result["pasta_left"] = _pasta_processes()
        result["long_lived"] = _long_lived(workdir)
        print(json.dumps(result))
        return 0
    finally:
        for p in procs:
            p.kill()
            p.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
