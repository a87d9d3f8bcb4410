"""Nested user namespaces (``allow_nested``) and browsers inside a sandbox.

A nested user namespace gives the sandbox's processes new kernel surface (full
capabilities over namespaces they own) but no new reach: Landlock, the mount namespace
(its mounts locked, and Landlock refuses every mount change), the seccomp filter and
the cgroup apply to everything started in it. Judged from the host, as root and as uid
1001, each attack beside a control that shows the detector catching the effect where
the protection is absent (the same script on the host).

Root callers: the kernel lets a nested namespace map onto the host's uid 0 only if its
creator held CAP_SETFCAP (``verify_root_map``), which no process of a sandbox has, so
their nested namespaces have no id maps (``unshare -U`` without ``-r``): the
confinement tests use that shape for them.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import _make_layout, denied_home_dir, module_state, need_tool
from warren import PolicySpec, Sandbox
from warren.plan import CallerFacts, HostFacts, degraded, make_plan
from warren.plan.facts import parse_mountinfo
from warren.plan.landlock import WRITE_FILE, LandlockPlan
from warren.policy import Policy

ROOT = os.getuid() == 0
# A nested user namespace the caller can make inside: mapped to itself, or unmapped for root.
NEST = ["unshare", "-U"] if ROOT else ["unshare", "-Ur"]
ROOT_MAPS = (
    "the kernel maps a nested namespace onto the host's uid 0 only for a creator holding "
    "CAP_SETFCAP (verify_root_map), which no process of a sandbox holds"
)
PIDS = 48
# A mount namespace of the nested user namespace's own. Landlock refuses a confined
# process every mount change (propagation included, hence "unchanged"); for root, whose
# nested namespace has no maps, the kernel refuses the mount namespace itself.
MNTNS = "unshare -m --propagation unchanged"
REFUSED_MOUNT = "unshare failed: Operation not permitted" if ROOT else "must be superuser to unmount"


@pytest.fixture(scope="module", autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from module_state(tmp_path_factory)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("nested")


@pytest.fixture(scope="module")
def secret(base: Path) -> Iterator[Path]:
    """A credential in a default-denied place of HOME, under a name of this module."""
    aws = Path.home() / ".aws"
    made = not aws.exists()
    denied_home_dir(aws, True)
    path = aws / f"credentials-warren-nested-{os.getpid()}"
    path.write_text("aws_secret_access_key = NESTED-SECRET-5c1d\n")
    yield path
    path.unlink(missing_ok=True)
    if made:
        denied_home_dir(aws, False)  # as it was


@pytest.fixture(scope="module")
def nested(base: Path, secret: Path) -> Iterator[Sandbox]:
    layout = _make_layout(base / "allowed")
    with Sandbox.create(PolicySpec(workspace=str(layout.workspace), allow_nested=True, pids=PIDS)) as sb:
        yield sb


def _sh(sb: Sandbox, script: str, nest: bool = True) -> subprocess.CompletedProcess[str]:
    argv = [*NEST, "sh", "-c", script] if nest else ["sh", "-c", script]
    r = sb.exec(argv, timeout=60)
    return subprocess.CompletedProcess(argv, r.exit_code, r.stdout.decode(), r.stderr.decode())


def _host_sh(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60)


def test_only_allow_nested_grants_writes_in_proc_and_never_the_hosts(tmp_path: Path) -> None:
    host = HostFacts(
        mounts=parse_mountinfo(
            "22 1 254:0 / / rw - ext4 /dev/vda rw\n23 22 0:21 / /proc rw - proc proc rw\n"
        ),
        landlock_abi=7,
        cap_last_cap=40,
        machine_supported=True,
        path_kinds={"/run": "dir", "/var/run": "symlink", "/dev/null": "other"},
    )
    caller = CallerFacts(1001, 1001, "/home/u", {"PATH": "/usr/bin:/bin", "HOME": "/home/u"}, "/home/u")

    def proc_writes(ll: LandlockPlan | None) -> list[str]:
        assert ll is not None
        return [r.path for r in ll.rules if r.path.startswith("/proc") and r.access & WRITE_FILE]

    for nested in (False, True):
        policy = Policy(workspace=tmp_path, allow_nested=nested)
        full = make_plan(policy, host, caller)
        assert proc_writes(full.landlock) == (["/proc"] if nested else [])
        # The degraded mode's /proc is the host's: never writable, whatever the policy.
        plain = degraded.make(
            policy, host, caller, abi=7, cwd=str(tmp_path), scratch_id="n", state_dir_denied=[]
        )
        assert proc_writes(plain.landlock) == []


def test_new_user_namespaces_are_refused_without_allow_nested(base: Path) -> None:
    layout = _make_layout(base / "default")
    with Sandbox.create(PolicySpec(workspace=str(layout.workspace))) as sb:
        r = sb.exec(["unshare", "-U", "true"])
    assert r.exit_code != 0
    assert b"Operation not permitted" in r.stderr, r.stderr
    control = _host_sh("unshare -U true")
    assert control.returncode == 0, control.stderr


def test_a_nested_namespace_gets_its_own_id_maps(nested: Sandbox) -> None:
    if ROOT:
        refused = nested.exec(["unshare", "-Ur", "true"])
        assert refused.exit_code != 0 and b"uid_map" in refused.stderr, refused.stderr
        pytest.skip(f"root: {ROOT_MAPS} (checked: the map is refused)")
    r = _sh(nested, "id -u; cat /proc/self/uid_map; unshare -Ur id -u")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    assert lines[0] == "0"
    assert lines[1].split() == ["0", str(os.getuid()), "1"]
    assert lines[2] == "0"  # a namespace nested in the nested one, as bubblewrap or Chromium make


def test_a_nested_namespace_cannot_read_a_denied_file(nested: Sandbox, secret: Path) -> None:
    # Unmounting the empty mount that hides the directory is the nested namespace's one
    # new move: its mount namespace would be its own, with full capabilities over it.
    attack = (
        f"cat {secret}; {MNTNS} sh -c 'umount -l {secret.parent}; cat {secret}'; "
        f"{MNTNS} sh -c 'mount --bind / /mnt && cat /mnt{secret}'"
    )
    r = _sh(nested, attack)
    assert "NESTED-SECRET" not in r.stdout + r.stderr
    assert REFUSED_MOUNT in r.stderr  # the attack got as far as the mount namespace allows
    control = _host_sh(f"cat {secret}")
    assert "NESTED-SECRET" in control.stdout


def test_a_nested_namespace_cannot_write_outside_the_workspace(nested: Sandbox, base: Path) -> None:
    target = base / "outside-target.txt"
    target.write_text("keep me\n")
    made = Path.home() / f".warren-nested-{os.getpid()}-made"
    attack = (
        f"echo changed > {target}; touch {made}; "
        f"{MNTNS} sh -c 'mount -o remount,rw {base}; echo changed > {target}'; "
        f"{MNTNS} sh -c 'mount -t tmpfs none {base}'; "
        "echo x > /proc/sys/kernel/hostname; echo some 1 1000000 > /proc/pressure/cpu"
    )
    r = _sh(nested, attack)
    assert target.read_text() == "keep me\n", r.stderr
    assert not made.exists()
    assert (REFUSED_MOUNT if ROOT else f"mount: {base}: permission denied") in r.stderr
    # /proc takes writes (the id maps), its tunables and triggers stay read-only mounts
    assert "hostname: Read-only file system" in r.stderr
    assert "cpu: Read-only file system" in r.stderr
    control_target = base / "outside-control.txt"
    control_target.write_text("keep me\n")
    _host_sh(f"echo changed > {control_target}")
    assert control_target.read_text() == "changed\n"


def test_nested_processes_count_in_the_sandboxs_pids_limit(nested: Sandbox) -> None:
    forker = (
        "import os, sys, time\n"
        "n, refused = 0, 0\n"
        "while n < 4 * int(sys.argv[1]):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError as e:\n"
        "        refused = e.errno\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(30); os._exit(0)\n"
        "    n += 1\n"
        "print(n, refused, open('/proc/self/cgroup').read().strip(), flush=True)\n"
        "os.killpg(0, 9)\n"
    )
    outer = nested.exec(["cat", "/proc/self/cgroup"]).stdout.decode().strip()
    r = nested.exec([*NEST, "setsid", "-w", sys.executable, "-c", forker, str(PIDS)], timeout=60)
    count, refused, cgroup = r.stdout.decode().split(" ", 2)
    # The limit counts the commands' own tasks (warren's are added to it): about PIDS.
    assert int(refused) == errno.EAGAIN and 0 < int(count) <= PIDS + 2, r.stderr
    assert cgroup.strip() == outer  # the nested processes stay in the sandbox's cgroup
    # Control: the same forker on the host, where no such limit applies, gets past it.
    control = subprocess.run(
        ["setsid", "-w", sys.executable, "-c", forker, str(PIDS)], capture_output=True, text=True, timeout=60
    )
    assert control.stdout.split(" ")[:2] == [str(4 * PIDS), "0"], control.stderr


def test_the_inotify_share_holds_in_a_nested_namespace(nested: Sandbox) -> None:
    flood = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "fds = []\n"
        "while len(fds) < 100000:\n"
        "    fd = libc.inotify_init1(os.O_CLOEXEC)\n"
        "    if fd < 0:\n"
        "        break\n"
        "    fds.append(fd)\n"
        "own = open('/proc/sys/user/max_inotify_instances').read().strip()\n"
        "print(len(fds), own)\n"
    )
    share = int(nested.exec(["cat", "/proc/sys/user/max_inotify_instances"]).stdout)
    r = nested.exec([*NEST, sys.executable, "-c", flood], timeout=60)
    got, own = (int(x) for x in r.stdout.split())
    # The nested namespace's own limit is the kernel's default (no limit); what holds is
    # the sandbox's share, charged at every level above it.
    assert own > share
    assert 0 < got <= share, (got, share)


PAGE = "<title>warren page</title><h1 id=h>served inside</h1>"
SERVE_AND_SHOOT = """
import os, socket, subprocess, sys, time
os.makedirs("site", exist_ok=True)
with open("site/index.html", "w") as f:
    f.write(sys.argv[1])
srv = subprocess.Popen([sys.executable, "-m", "http.server", "-b", "127.0.0.1", "-d", "site", "8123"],
                       stderr=subprocess.DEVNULL)
for _ in range(200):
    try:
        socket.create_connection(("127.0.0.1", 8123)).close()
        break
    except OSError:
        time.sleep(0.05)
try:
    exec(sys.argv[2])
finally:
    srv.kill()
"""
CHROMIUM = """
r = subprocess.run(["chromium", "--headless", "--no-sandbox", "--user-data-dir=profile",
                    "--screenshot=chromium.png", "http://127.0.0.1:8123/"], capture_output=True, timeout=60)
print(r.returncode)
"""
PLAYWRIGHT = """
from playwright.sync_api import sync_playwright
with sync_playwright() as p:
    browser = p.chromium.launch(executable_path="/usr/bin/chromium")
    page = browser.new_page()
    page.goto("http://127.0.0.1:8123/")
    print(page.title(), "|", page.inner_text("#h"))
    page.screenshot(path="playwright.png")
    browser.close()
"""
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def browsing(base: Path) -> Iterator[tuple[Sandbox, Path]]:
    need_tool("chromium", "Debian's chromium drives these pages: apt-get install chromium")
    layout = _make_layout(base / "browser")
    with Sandbox.create(PolicySpec(workspace=str(layout.workspace))) as sb:
        yield sb, layout.workspace


def test_chromium_headless_screenshots_a_page_served_inside(browsing: tuple[Sandbox, Path]) -> None:
    sb, workspace = browsing
    r = sb.exec([sys.executable, "-c", SERVE_AND_SHOOT, PAGE, CHROMIUM], cwd=str(workspace), timeout=90)
    assert r.exit_code == 0 and r.stdout.strip() == b"0", r.stderr.decode()[-2000:]
    shot = workspace / "chromium.png"
    assert shot.read_bytes().startswith(PNG) and shot.stat().st_size > 1000
    assert shot.stat().st_uid == os.getuid()


def test_playwright_drives_chromium_on_a_page_served_inside(browsing: tuple[Sandbox, Path]) -> None:
    pytest.importorskip("playwright", reason="python playwright is not installed in the test venv")
    sb, workspace = browsing
    r = sb.exec(
        [sys.executable, "-c", SERVE_AND_SHOOT, PAGE, PLAYWRIGHT],
        cwd=str(workspace),
        env={"PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1"},
        timeout=90,
    )
    assert r.exit_code == 0, r.stderr.decode()[-2000:]
    assert r.stdout.decode().strip() == "warren page | served inside"
    shot = workspace / "playwright.png"
    assert shot.read_bytes().startswith(PNG) and shot.stat().st_size > 1000


# Chromium with its own sandbox on: while it takes the screenshot, each of its processes
# is looked at (its namespaces against this script's, its seccomp filters).
SANDBOXED = """
import threading
def mine(pid):
    lines = open(f"/proc/{pid}/status").read().splitlines()
    status = dict(l.split(":\\t", 1) for l in lines if ":\\t" in l)
    namespaces = [os.readlink(f"/proc/{pid}/ns/{k}") for k in ("user", "pid", "net")]
    return namespaces, int(status["Seccomp_filters"])
own_ns, own_filters = mine(os.getpid())
seen = {}
done = threading.Event()
def watch():
    while not done.is_set():
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read()
                if b"chromium" in cmd:
                    kind = "renderer" if b"--type=renderer" in cmd else "other"
                    ns, filters = mine(pid)
                    own = tuple(a != b for a, b in zip(ns, own_ns))
                    seen.setdefault(kind, set()).add((own, filters - own_filters))
            except (OSError, KeyError):
                pass
        time.sleep(0.02)
t = threading.Thread(target=watch)
t.start()
r = subprocess.run(["chromium", "--headless", "--user-data-dir=profile-sandboxed",
                    "--screenshot=sandboxed.png", "http://127.0.0.1:8123/"], capture_output=True, timeout=60)
done.set(); t.join()
print(json.dumps({"rc": r.returncode, "err": r.stderr.decode()[-3000:],
                  "seen": {k: sorted(v) for k, v in seen.items()}}))
"""


@pytest.fixture(scope="module")
def browsing_nested(base: Path) -> Iterator[tuple[Sandbox, Path]]:
    need_tool("chromium", "Debian's chromium drives these pages: apt-get install chromium")
    layout = _make_layout(base / "browser-sandboxed")
    with Sandbox.create(PolicySpec(workspace=str(layout.workspace), allow_nested=True)) as sb:
        yield sb, layout.workspace


def test_chromium_with_its_own_sandbox_screenshots_a_page_served_inside(
    browsing_nested: tuple[Sandbox, Path],
) -> None:
    """Chromium's own sandbox on (no --no-sandbox), in a sandbox with ``allow_nested``:
    its renderers run in user, pid and network namespaces of their own, under its
    seccomp filter on top of warren's, and the screenshot is taken. Its zygote's
    handshake checks the sender of a unix message (``_core.credsend``). As root Chromium
    refuses its sandbox, on the host as inside: the control is the host's run."""
    sb, workspace = browsing_nested
    script = "import json\n" + SANDBOXED
    r = sb.exec([sys.executable, "-c", SERVE_AND_SHOOT, PAGE, script], cwd=str(workspace), timeout=120)
    assert r.exit_code == 0, r.stderr.decode()[-2000:]
    out = json.loads(r.stdout)
    if ROOT:
        argv = ["chromium", "--headless", "--screenshot=/dev/null", "about:blank"]
        host = subprocess.run(argv, capture_output=True, timeout=60)
        refusal = "Running as root without --no-sandbox is not supported"
        assert host.returncode != 0 and refusal in host.stderr.decode()
        assert out["rc"] != 0 and refusal in out["err"], out["err"]
        return
    assert out["rc"] == 0, out["err"]
    shot = workspace / "sandboxed.png"
    assert shot.read_bytes().startswith(PNG) and shot.stat().st_size > 1000
    # renderers: own user, pid and network namespaces, and at least one more filter
    renderers = [tuple(ns) for ns, extra in out["seen"].get("renderer", []) if extra >= 1]
    assert renderers and all(ns == (True, True, True) for ns in renderers), out["seen"]
