"""warren's private core: the only package that makes raw system calls (``_sys`` is the
only module touching ctypes). It executes plans and never decides anything: the clone
(``clone``), PID 1 and its helpers (``pid1``, ``shim``, ``fileops``), the mount executor
(``mounts``), hardening (``harden``), processes (``procs``) and the ancestor guard."""
