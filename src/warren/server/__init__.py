"""The supervisor side: planning, launching and holding one user's sandboxes.

``supervisor`` is the loop, the clients and the dispatch; ``daemon`` starts it. A
sandbox is a ``box.Box`` (its networking in ``boxnet``), the set of them
``sandboxes``; a request becomes a plan in ``planning`` and a sandbox through
``launch``; ``handoff`` gives a request to the sandbox's PID 1. State: ``statedir``,
``registry``, ``spawns``, ``stdin``; the network helper ``netd``; peer checks ``peer``;
git protection ``gitkeeper`` and its helpers. docs/layout.md has the whole list."""
