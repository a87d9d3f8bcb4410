"""``warren serve``: the HTTP API v1 over the same client core as the SDK.

``app`` builds the Starlette application from the route table (``routes``) and its
handlers, grouped by resource (``sandboxes``, ``processes``, ``files``, ``network``),
which call a ``Transport`` (the local one in production); ``body`` and ``fields``
read and check requests, ``status`` turns errors into HTTP answers, ``guard`` checks
the token and the Host/Origin, ``openapi`` describes the routes, ``serve`` runs it
under uvicorn. The JSON forms of warren's values are ``warren.codec``, shared with the
HTTP transport. Nothing here is imported by ``warren run``/``exec``.
"""
