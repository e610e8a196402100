"""The suite's start order (tests/suite_order.py): files longest first by their recorded seconds,
unrecorded files first of all, each file's tests in collection order; a recorded run writes
every file's seconds, on the xdist controller too; the recording names only files that exist."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from tests.suite_order import DURATIONS, RECORD_ENV, longest_first, recorded_seconds

ROOT = Path(__file__).resolve().parents[1]


def test_files_start_longest_first_and_unrecorded_files_before_them():
    files = {"tests/a.py": 3, "tests/b.py": 1, "tests/c.py": None, "tests/d.py": 7}
    items = [
        SimpleNamespace(nodeid=f"{name}::test_{i}")
        for name in files
        for i in range(3)  # collection order within a file: 0, 1, 2
    ]
    seconds = {name: value for name, value in files.items() if value is not None}
    got = [item.nodeid for item in longest_first(items, seconds)]

    # brute force: the one permutation of whole files that is non-increasing in seconds
    # (unrecorded = infinite) and keeps each file's tests in order
    def cost(name):
        return seconds.get(name, float("inf"))

    orders = [
        [f"{name}::test_{i}" for name in perm for i in range(3)]
        for perm in itertools.permutations(files)
        if all(cost(x) >= cost(y) for x, y in itertools.pairwise(perm))
    ]
    assert orders == [got]


def test_a_recorded_run_on_two_workers_writes_every_files_seconds(tmp_path):
    out = tmp_path / "durations.json"
    files = ["tests/test_module_docstrings.py", "tests/test_launch_lint.py"]
    env = {**os.environ, RECORD_ENV: str(out)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-n",
            "2",
            "--dist",
            "loadfile",
            "-p",
            "no:cacheprovider",
            *files,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    recorded = json.loads(out.read_text())
    assert sorted(recorded) == sorted(files)
    assert all(seconds > 0 for seconds in recorded.values())
    assert list(recorded.values()) == sorted(recorded.values(), reverse=True)


def test_the_recording_names_only_test_files_that_exist():
    recorded = recorded_seconds(DURATIONS)
    missing = [name for name in recorded if not (ROOT / name).is_file()]
    assert not missing, f"{DURATIONS.name} names files that are gone: rerun the recording"
