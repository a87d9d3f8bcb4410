"""What a helper holds: its own channels and nothing PID 1 held when it was forked.

PID 1's broker makes a command's socket calls on a copy of the command's descriptor
(``pidfd_getfd``): a connect that waits holds that copy in PID 1 until it returns. A
helper forked meanwhile (the next spare, forked after every exec) got a copy too, and
kept it for its whole life: the command's connection was then held by a process that
is not the command, never closed by the command's close, and ``warren net`` named the
helper ("pid 9: <warren's boot code>") as the process that asked for a connection.

Judged from the host, as root and as uid 1001: while a command's connect waits (a unix
socket whose listener's queue is full), execs fork new helpers; no process of the
sandbox but the command itself (and PID 1, whose broker makes the connect) holds the
socket; the connect then completes once the listener accepts, as on the host.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from conftest import Layout, server_of
from warren import PolicySpec, Sandbox

# Inside: a listener whose queue (backlog 0: one connection) is full, then a connect
# that waits for room. It says its socket's inode, then waits for "go" (a file) to
# accept, and says whether the connect completed.
CONNECTS = r"""
import os, socket, sys, threading, time
path = "/tmp/helper-fds.sock"
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(path)
listener.listen(0)
first = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
first.connect(path)
waiting = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
print(os.fstat(waiting.fileno()).st_ino, flush=True)
def accept_later():
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.02)
    listener.accept()
    listener.accept()
threading.Thread(target=accept_later, daemon=True).start()
waiting.connect(path)
print("connected", flush=True)
"""


def _tree(pid1: int) -> list[int]:
    found, queue = [], [pid1]
    while queue:
        pid = queue.pop(0)
        found.append(pid)
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    queue += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return found


def _holders(pid1: int, inode: int) -> dict[int, str]:
    """The sandbox's processes holding ``socket:[inode]``, with their command lines."""
    held = {}
    for pid in _tree(pid1):
        try:
            names = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{n}") == f"socket:[{inode}]" for n in names if n.isdigit()):
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    held[pid] = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
    return held


def test_a_helper_forked_while_a_connect_waits_holds_no_copy_of_its_socket(
    layout: Layout, state_home: Path
) -> None:
    go = layout.workspace / "go"
    with Sandbox.create(PolicySpec(workspace=str(layout.workspace))) as sb:
        proc = sb.spawn(["python3", "-c", CONNECTS, str(go)])
        deadline = time.monotonic() + 20
        while not proc.output().stdout.strip() and time.monotonic() < deadline:
            time.sleep(0.05)
        inode = int(proc.output().stdout.split()[0])
        time.sleep(0.3)  # the connect has reached the broker and waits there
        assert b"connected" not in proc.output().stdout, "the connect did not wait"
        for _ in range(3):  # each takes a spare: PID 1 forks the next one now
            assert sb.exec(["true"]).ok
        holders = _holders(sb.pid1, inode)
        command = "helper-fds.sock"  # in the command's own argv
        # PID 1's broker holds a copy while the connect waits (the keeper's, where PID 1
        # became the native init)
        broker = server_of(sb.pid1)
        others = {pid: argv for pid, argv in holders.items() if pid != broker and command not in argv}
        assert not others, f"processes other than the command hold its socket: {others}"
        assert any(command in argv for argv in holders.values()), holders  # the test sees it

        go.touch()
        assert proc.wait(timeout=20) == 0
        assert proc.output().stdout.split()[1:] == [b"connected"]
        # PID 1's copy went with the connect, the command's with the command.
        assert _holders(sb.pid1, inode) == {}
