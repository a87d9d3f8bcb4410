"""The messages between the supervisor and a sandbox's PID 1 on their private
channel: PID 1 is ready (or failed to set up), a helper is ready for the next request,
the network comes up (proxy socket, pasta), a writable root was bound anew, a
protected git config changed.
"""

from __future__ import annotations

from .base import ErrorRecord, Message


class Ready(Message):
    """PID 1 finished setting up; it serves handoffs from now on."""

    TAG = "ready"


class Layers(Message):
    """From PID 1, on an image, before ``Ready``: the layer tmpfs and the overlay's
    lower layers (top first) as detached mounts, attached in order over one or more
    of these (a frame carries a few descriptors at most): the supervisor stacks the
    root again with them (``server.restack``)."""

    TAG = "layers"


class Refresh(Message):
    """From the supervisor: a writable root was replaced on the host and bound anew;
    rebuild the Landlock ruleset (rules bind to inodes) before the next request."""

    TAG = "refresh"


class Adopted(Message):
    """From the supervisor: the sandbox booted ahead for a create is that create's
    sandbox now (``server.booting``). Until then its spare stays, however long it
    waits (the supervisor stops it whole when unused, ``server.ahead.IDLE``), so the
    create's first exec finds it; from now on it goes after ``SPARE_IDLE`` without a
    request, as any long-lived sandbox's."""

    TAG = "adopted"


class NetEvents(Message):
    """From the supervisor to a sandbox's network helper (``server.netd``): the pipe
    attached is where its proxy's decisions go from now on, besides its log. A run that
    takes a sandbox booted ahead (``server.ahead``) gives it its client's pipe before
    its command starts; the helper answers ``Ok`` once it writes there."""

    TAG = "net_events"


class Walked(Message):
    """From the supervisor: the hard-link walk made after launch ended (``ok``: every
    file it found has an inode of its own); PID 1 lets the calls it held go on, or
    fails them (``_core.broker.window``)."""

    TAG = "walked"
    ok: bool = True


class Quiesce(Message):
    """From the supervisor, before it stacks the root again (``server.restack``): let
    the spare go, fork none until the next ``Refresh``, and say whether PID 1 is then
    the sandbox's only process. ``stop``: kill the sandbox's other processes first (a
    rollback; ``Quiet.why`` names them)."""

    TAG = "quiesce"
    stop: bool = False
    # how long a process found running may take to end before it counts (an exec's
    # processes may still be on their way out when its answer came), seconds
    grace: float = 0.015
    # the spare (``Spare.pid``) the supervisor let go without handing it a request, and
    # the last one it heard of: a spare of PID 1's that is the first, or not the
    # second (never heard of, so never handed anything), will run nothing: PID 1 kills
    # it (and its command's process) and does not wait for it to notice its channel
    # closed
    untaken: int = 0
    seen: int = 0


class Quiet(Message):
    TAG = "quiet"
    alone: bool
    why: str = ""  # what else runs (a pid and its name), when not alone


class Spare(Message):
    """From PID 1: a helper forked ahead of time, on the socket attached. The supervisor
    hands it the next request itself (one request, a ``Handoff``), not through PID 1:
    a wake-up less on every exec. PID 1 never hands it one of its own."""

    TAG = "spare"
    pid: int = 0  # the helper's, as the sandbox numbers it (``Quiesce.untaken``)
    # How many ``Refresh`` and ``Walked`` PID 1 had read when it forked it: a spare from
    # before the last one the supervisor sent holds rules (or a filter) PID 1 lets go of
    # as it reads that one, and is never handed a request.
    generation: int = 0


class Emptied(Message):
    """From a one-shot sandbox's PID 1: its command ended, every process it left was
    killed and reaped (by its helper, their child subreaper), and no call the broker
    makes for the sandbox is under way. Nothing of the sandbox acts on the host any
    more: the supervisor answers the run now, not after PID 1's own exit and its
    helper's (each a Python process's memory let go, about a millisecond)."""

    TAG = "emptied"


class Leaving(Message):
    """From a long-lived sandbox's keeper (``pid1``, under the native init): the
    sandbox is idle (no process but the init's own, no request for ``SPARE_IDLE``), and
    it leaves once the supervisor agrees (``LeaveOk``). ``received``: how many messages
    it has read from the supervisor; one sent since means a request is on its way. With
    it, for the next keeper: its Landlock ruleset (the first descriptor, if
    ``ruleset``) and the descriptors of the repositories' git directories opened before
    warren's tree covered them (``mounts.git_under``; their paths, ``git``, in order)."""

    TAG = "leaving"
    received: int = 0
    ruleset: bool = False
    git: list[str] = []


class LeaveOk(Message):
    """From the supervisor: nothing was sent since the keeper's ``Leaving``; it may go.
    The next request has the spawner make a keeper that joins the sandbox."""

    TAG = "leave-ok"


class LeaveNow(Message):
    """From the supervisor as it pauses a long-lived sandbox (its spare let go first):
    leave now if the sandbox is idle, rather than be frozen with it for as long as it
    stays paused. Answered with ``Leaving`` (then ``LeaveOk``, as ever) or ``Staying``."""

    TAG = "leave-now"


class Staying(Message):
    """From a keeper asked ``LeaveNow`` (or a Python PID 1, which never leaves): it
    cannot leave now (a process of the sandbox runs, a request waits or is served)."""

    TAG = "staying"


class Failed(Message):
    TAG = "failed"
    error: ErrorRecord


class NetProxy(Message):
    """``--network allow``: the proxy's listening socket, made inside, is attached."""

    TAG = "net-proxy"


class NetReady(Message):
    """``--network open``: the namespace is ready for pasta."""

    TAG = "net-ready"


class NetGo(Message):
    TAG = "net-go"
    go: bool


class NetUp(Message):
    TAG = "net-up"
    ok: bool
