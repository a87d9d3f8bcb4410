"""``warren sandboxd``: warren as the in-pod runtime of kubernetes-sigs/agent-sandbox.

It speaks that project's sandboxd contract — the gRPC ``process.v1.ProcessService``
(``grpc``) and the REST ``/v1/files``, ``/v1/health``, ``/v1/metadata`` (``rest``) —
over one long-lived warren sandbox whose workspace is the pod's ``/workspace``
(``runtime``): every command a client runs, and every file it reads or writes, goes
through that sandbox, so a prompt-injected command cannot read the pod's
service-account token or reach the runtime itself. ``paths`` is the contract's
confinement of a path to the workspace (pure); ``main`` runs both listeners.

The contract's generated stubs are the ones the ``k8s-agent-sandbox[grpc]`` SDK ships
(``stubs``): the extra ``warren-sandbox[sandboxd]``.
"""
