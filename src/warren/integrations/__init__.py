"""Backends that let agent frameworks run their tools in a warren sandbox.

One module per framework (``openai_agents``, ``deepagents``, ``mini_swe_agent``),
each built only on warren's public library (``warren.Sandbox``). None is imported
by warren itself: a framework is loaded only when its module is, so installing warren
never pulls in an agent framework (``pip install 'warren-sandbox[openai-agents]'`` does).
"""
