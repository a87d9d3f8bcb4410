"""PID 1's system-call broker: calls the kernel cannot judge by their arguments alone.

Every process of a sandbox carries a second seccomp filter that sends a few calls here,
to PID 1, as user notifications (``plan.seccomp.notify_program``). PID 1 reads what the
process asked for, resolves it as the process would (its cwd, its fds, the same mount
view), decides, and answers. Wherever the verdict depends on the process's memory or
fd table, PID 1 never lets the kernel re-read them (``CONTINUE``): another thread
could rewrite the path or address, or ``dup2`` another socket onto the fd, between
the check and the kernel's read. It performs the call itself on what it checked — a
copy of the process's fd (``pidfd_getfd``, the same open file description) or an
``O_PATH`` fd of the resolved object — and returns the result. ``CONTINUE`` is left
for warren's own processes, and for a call on another process whose pid is the
caller's own (``processes``: its verdict rests on registers and on ids that cannot be
reused while the caller waits).

By concern: ``loop`` (the broker's thread: receive, decide who acts, answer),
``call`` (one call's memory, fds and paths), ``places`` (where a sandbox may act),
``metadata`` (chmod, utimensat, xattrs), ``sockets`` (connect and sends),
``processes`` (limits, priority and scheduling of a process by pid), ``pool``
(the workers that make calls which may block, so the broker's thread never does).
"""

from .loop import Broker, notify_filter, prepare

__all__ = ["Broker", "notify_filter", "prepare"]
