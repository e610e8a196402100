"""Counts files: a problem's count from its samples, a resumed file keeping what was written and
dropping a line cut by an interruption, and a file of other settings or problems refused."""

from __future__ import annotations

import json

import pytest

from opefo_nemo.eval.counts import CountsFile, CountsMismatchError, ProblemCount, read_counts

SETTINGS = {"model": "/m", "samples": 4, "base_seed": 7}
IDS = ["p0", "p1", "p2"]


def test_a_count_from_samples():
    count = ProblemCount.from_samples(
        2, "p2", [True, False, True, False], ["5", "4", "5", None], truncated=1, tokens=30
    )
    assert (count.samples, count.correct, count.no_answer, count.distinct_answers) == (4, 2, 1, 2)
    assert count.answers == {"5": 2, "4": 1}
    assert ProblemCount.from_json(json.loads(json.dumps(count.__dict__))) == count


def test_a_resumed_file_keeps_its_counts_and_drops_a_cut_line(tmp_path):
    path = tmp_path / "counts.jsonl"
    first = CountsFile(path, SETTINGS, IDS)
    assert first.done == {}
    counts = [ProblemCount(i, IDS[i], 4, i) for i in (0, 2)]
    first.append(counts)
    with path.open("a") as handle:  # an interruption in the middle of problem 1's line
        handle.write('{"index": 1, "prompt_id": "p1", "sam')
    again = CountsFile(path, SETTINGS, IDS)
    assert again.done == {0: counts[0], 2: counts[1]}
    again.append([ProblemCount(1, "p1", 4, 3)])
    settings, stored = read_counts(path)
    assert settings == SETTINGS
    assert [c.correct for c in stored] == [0, 3, 2]
    assert [c.correct for c in again.ordered(3)] == [0, 3, 2]


def test_a_file_of_other_settings_or_problems_is_refused(tmp_path):
    path = tmp_path / "counts.jsonl"
    CountsFile(path, SETTINGS, IDS).append([ProblemCount(1, "p1", 4, 1)])
    with pytest.raises(CountsMismatchError, match=r"other settings \(base_seed, samples differ\)"):
        CountsFile(path, {**SETTINGS, "samples": 8, "base_seed": 1}, IDS)
    with pytest.raises(CountsMismatchError, match="holds problem 1 as p1"):
        CountsFile(path, SETTINGS, ["p0", "q1", "p2"])


def test_ordered_needs_every_problem(tmp_path):
    counts = CountsFile(tmp_path / "c.jsonl", SETTINGS, IDS)
    counts.append([ProblemCount(0, "p0", 4, 1)])
    with pytest.raises(ValueError, match=r"problems \[1, 2\] have no counts yet"):
        counts.ordered(3)
