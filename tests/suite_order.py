"""The order the suite's files start in on the xdist workers: longest first, from the per-file
seconds of a recorded run (``tests/durations.json``). With ``--dist loadfile`` and
``--no-loadscope-reorder`` (scripts/coverage.sh) the workers take whole files in collection
order, so the long end-to-end files start early instead of making the run's tail.

``OPEFO_TEST_DURATIONS=<file>`` records a run's per-file seconds (setup, call and teardown of
every test, summed; module fixtures count in their file) into ``<file>``, in the layout of
``tests/durations.json``.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
RECORD_ENV = "OPEFO_TEST_DURATIONS"


def test_file(nodeid: str) -> str:
    """The file of a test id, as the ids name it (relative to the repository root)."""
    return nodeid.split("::", 1)[0]


def recorded_seconds(path: Path = DURATIONS) -> dict[str, float]:
    """The per-file seconds of ``path``; empty when it is absent."""
    return json.loads(path.read_text()) if path.is_file() else {}


def longest_first(items: Sequence[pytest.Item], seconds: Mapping[str, float]) -> list[pytest.Item]:
    """``items`` by their file's recorded seconds, longest first; a file with no record (new
    since the recording) first of all, so an unmeasured long file cannot end up last. Within a
    file, and between files of equal seconds, the collection order stays (a stable sort)."""
    return sorted(items, key=lambda item: -seconds.get(test_file(item.nodeid), math.inf))


class DurationRecorder:
    """Adds up each file's test phases as the run reports them (on the xdist controller, or in
    the single process) and writes the sums when the session ends."""

    def __init__(self, path: Path):
        self.path = path
        self.seconds: defaultdict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[test_file(report.nodeid)] += report.duration

    def pytest_sessionfinish(self) -> None:
        ordered = sorted(self.seconds.items(), key=lambda item: -item[1])
        rounded = {name: round(seconds, 1) for name, seconds in ordered}
        self.path.write_text(json.dumps(rounded, indent=1) + "\n")
