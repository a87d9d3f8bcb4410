"""``warren serve``: the HTTP API v1 over the same client core as the SDK.

``app`` builds the Starlette application (routes call a ``Transport``, the local one
in production), ``codec`` is the JSON form of warren's values shared with the HTTP
transport, ``openapi`` describes the routes, ``serve`` runs it under uvicorn.
Nothing here is imported by ``warren run``/``exec``.
"""
