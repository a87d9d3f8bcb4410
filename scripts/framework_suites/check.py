"""Judge a run of ``scripts/framework-suites``: every test that passes on a framework's
own local backend passes on warren's, but those ``known_differences.txt`` lists (tests of
the local backend's own workings, each with its reason in docs/development.md).

    python check.py WORKDIR

Reads the OpenAI Agents plugin's results (``openai-agents-{local,warren}.json``) and the
Deep Agents runs' JUnit reports (``deepagents-{local,warren}.xml``), prints what differs
and exits 1 if warren failed a test the local backend passed that is not listed. A listed
test that now passes on warren is said too (the list should shrink), without failing.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent


def known() -> set[str]:
    lines = (HERE / "known_differences.txt").read_text().splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def junit(path: Path) -> tuple[set[str], set[str]]:
    """(passed, failed) test ids of a JUnit report; a skipped test is neither."""
    passed, failed = set(), set()
    for case in ET.parse(path).getroot().iter("testcase"):
        ident = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None or case.find("error") is not None:
            failed.add(ident)
        elif case.find("skipped") is None:
            passed.add(ident)
    return passed, failed


def openai(path: Path) -> tuple[set[str], set[str]]:
    data = json.loads(path.read_text())
    failed = set(data["failures"])
    return set(data.get("passes", [])), failed


def main(work: Path) -> int:
    listed = known()
    status = 0
    suites = {
        "openai-agents": lambda side: openai(work / f"openai-agents-{side}.json"),
        "deepagents": lambda side: junit(work / f"deepagents-{side}.xml"),
    }
    for suite, read in suites.items():
        try:
            (local_passed, local_failed), (_, warren_failed) = read("local"), read("warren")
        except (OSError, ValueError, KeyError, ET.ParseError) as e:
            print(f"{suite}: no results to judge ({e}): see the run's logs in {work}")
            status = 1
            continue
        if not local_passed and not local_failed:
            print(f"{suite}: the local backend ran no test: see the run's logs in {work}")
            status = 1
            continue
        regressed = sorted((warren_failed - local_failed) - listed)
        mended = sorted(t for t in listed if t.startswith("tests/") and t not in warren_failed and t in local_passed)
        for test in regressed:
            print(f"{suite}: FAILED on warren, passed on the local backend: {test}")
        for test in mended:
            print(f"{suite}: passes on warren now, still listed in known_differences.txt: {test}")
        print(f"{suite}: {len(regressed)} failing on warren alone (beyond those known_differences.txt lists)")
        status |= 1 if regressed else 0
    return status


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
