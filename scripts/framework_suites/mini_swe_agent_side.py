"""pytest plugin for scripts/framework-suites: runs mini-swe-agent's own tests (from a
checkout of its GitHub repository: its sdist ships none) with warren's environment in
place of ``LocalEnvironment``, or with ``LocalEnvironment`` itself
(``FRAMEWORK_SIDE=local``) for the figures beside it.

Only tests that make an environment count: the plugin notes which ones construct it,
and prints their passed/failed at the end (and writes them as JSON to
``FRAMEWORK_RESULT`` when set). The tests are not copied: the name the test modules
import is swapped before they are collected.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from minisweagent.environments import local
from minisweagent.run import hello_world

SIDE = os.environ.get("FRAMEWORK_SIDE", "warren")
_made_environment: set[str] = set()
_current = {"test": ""}
_outcomes: dict[str, str] = {}
_live: list[Any] = []


def _noted() -> None:
    _made_environment.add(_current["test"])


if SIDE == "warren":
    from warren.integrations.mini_swe_agent import WarrenEnvironment

    class Environment(WarrenEnvironment):
        """warren's environment under the local environment's name; it is removed at the
        end of the test that made it (a test drops its environments without a cleanup)."""

        def __init__(self, **kwargs: Any) -> None:
            _noted()
            super().__init__(**kwargs)
            _live.append(self)

else:

    class Environment(local.LocalEnvironment):  # type: ignore[no-redef]
        def __init__(self, **kwargs: Any) -> None:
            _noted()
            super().__init__(**kwargs)


# Its serialized type names the class the tests look for (they check the name).
Environment.__name__ = Environment.__qualname__ = "LocalEnvironment"
Environment.__module__ = local.__name__
local.LocalEnvironment = Environment  # type: ignore[misc]
hello_world.LocalEnvironment = Environment  # type: ignore[misc]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    _current["test"] = item.nodeid
    try:
        return (yield)
    finally:
        _current["test"] = ""
        while _live:
            _live.pop().cleanup()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    counts = report.when == "call" or report.outcome != "passed"
    if counts and _outcomes.get(report.nodeid) in (None, "passed"):
        _outcomes[report.nodeid] = report.outcome


def pytest_sessionfinish(session: pytest.Session) -> None:
    counted = {t: o for t, o in _outcomes.items() if t in _made_environment}
    figures = {
        "side": SIDE,
        "passed": sum(o == "passed" for o in counted.values()),
        "failed": sum(o == "failed" for o in counted.values()),
        "skipped": sum(o == "skipped" for o in counted.values()),
        "failures": sorted(t for t, o in counted.items() if o == "failed"),
    }
    passed, failed = figures["passed"], figures["failed"]
    print(f"\nmini-swe-agent environment tests on {SIDE}: {passed} passed, {failed} failed")
    if os.environ.get("FRAMEWORK_RESULT"):
        with open(os.environ["FRAMEWORK_RESULT"], "w") as out:
            json.dump(figures, out, indent=1)
