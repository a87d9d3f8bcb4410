"""The client side: the public API (``Sandbox``, ``AsyncSandbox``, ``warren.run``) over a
``Transport`` (``LocalTransport``: this user's supervisor, over its unix socket)."""
