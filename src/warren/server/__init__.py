"""The supervisor side: planning, launching and holding one user's sandboxes
(``supervisor``), its state (``statedir``, ``registry``, ``spawns``), the network
helper (``netd``) and peer checks (``peer``)."""
