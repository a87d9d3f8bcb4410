"""warren doctor: probes the filesystem semantics developer tools rely on, where it runs,
and names the cause of every failure with a fix; and which resource-limit mechanisms the
host offers the caller.

Imports nothing but the Python standard library, so ``python -m warren.doctor`` runs on
a host, in a container or inside another sandbox. Modules: ``evidence`` (facts about
mounts and confinement), ``probes`` (the catalogue and
the runner), ``probe_base`` (what every probe shares), ``file_probes`` and
``workspace_probes`` (the checks), ``limits`` (the resource-limit checks),
``diagnose`` (pure: facts + results -> causes), ``report`` (table and JSON),
``probe_main`` (the program).
"""
