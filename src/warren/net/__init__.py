"""Networking of sandboxes: the allowlist (pure), the proxy, pasta, the handshake with
PID 1 and the network log."""
