"""The order test files start in under pytest-xdist (`make test`): the longest first, from
tests/durations.json (seconds per file in a full run), so the files that bound the run start
at once and the short ones fill the gaps (longest-processing-time first). Only the order
changes: each file still runs whole on one process (``--dist loadfile``). A file the table
does not know yet starts first, as if it were long; `python -m tests.support.order
JUNIT.xml` writes the table again from a run's ``--junitxml`` report."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import pytest

TABLE = Path(__file__).resolve().parents[1] / "durations.json"
UNKNOWN = float("inf")


def longest_first(items: list[pytest.Item]) -> None:
    known: dict[str, float] = json.loads(TABLE.read_text()) if TABLE.exists() else {}
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(item.nodeid.split("::")[0], len(first_seen))

    def key(item: pytest.Item) -> tuple[float, int]:
        path = item.nodeid.split("::")[0]
        return (-known.get(path, UNKNOWN), first_seen[path])

    items.sort(key=key)  # stable: a file's tests keep their order


def table(junit: Path) -> dict[str, float]:
    seconds: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit).iter("testcase"):
        path = case.get("classname", "").split(".")
        while path and path[-1][:1].isupper():  # a test class, not a module
            path.pop()
        if path and path[0] == "tests":  # not a collection error's empty name
            seconds["/".join(path) + ".py"] += float(case.get("time", 0))
    return {path: round(s, 1) for path, s in sorted(seconds.items(), key=lambda p: -p[1])}


if __name__ == "__main__":
    TABLE.write_text(json.dumps(table(Path(sys.argv[1])), indent=1) + "\n")
