"""A calibrated held-out set: the band's parsing and checks, the selection, and the held-out file
read back by the loader the trainer uses, with its calibration counts and stored messages."""

from __future__ import annotations

import pytest

from opefo_nemo.data import Problem, load_jsonl
from opefo_nemo.eval.calibration import (
    Band,
    count_histogram,
    read_calibration,
    select,
    write_heldout,
)
from opefo_nemo.eval.counts import ProblemCount

MESSAGES = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"})
PROBLEMS = [
    Problem("a", "1+1?", "2", "pool"),
    Problem("b", "2+2?", "4", "pool", MESSAGES),
    Problem("c", "3+3?", "6", "pool"),
    Problem("d", "4+4?", "8", "other"),
]
CORRECT = (0, 1, 16, 2)
COUNTS = [ProblemCount(i, p.prompt_id, 16, CORRECT[i]) for i, p in enumerate(PROBLEMS)]


def test_a_band_is_parsed_and_checked_against_the_samples():
    assert Band.parse("1-16", 128) == Band(1, 16)
    assert Band.parse(" 3 ", 8) == Band(3, 3)
    for text, message in (
        ("1-200", "need 0 <= LOW <= HIGH <= --samples \\(128\\), got 1-200"),
        ("9-2", "got 9-2"),
        ("a-b", "expected LOW-HIGH"),
        ("-1-3", "expected LOW-HIGH"),
    ):
        with pytest.raises(ValueError, match=f"--band.*{message}"):
            Band.parse(text, 128)


def test_the_band_keeps_the_problems_whose_count_lies_in_it():
    assert [c.prompt_id for c in select(COUNTS, Band(1, 2))] == ["b", "d"]
    assert [c.prompt_id for c in select(COUNTS, Band(0, 16))] == ["a", "b", "c", "d"]
    assert count_histogram(COUNTS) == "0: 1, 1: 1, 2: 1, 16: 1"
    with pytest.raises(ValueError, match=r"--band 3-15 selects none of the 4 problems.*0: 1"):
        select(COUNTS, Band(3, 15))


def test_the_heldout_file_reads_back_with_its_calibration(tmp_path):
    path = tmp_path / "heldout.jsonl"
    assert write_heldout(path, PROBLEMS, select(COUNTS, Band(1, 2))) == 2
    loaded = load_jsonl(path)
    assert loaded == [PROBLEMS[1], PROBLEMS[3]]  # ids, sources and stored messages kept
    assert read_calibration(path) == {"b": (1, 16), "d": (2, 16)}


def test_a_count_of_another_problem_is_refused(tmp_path):
    wrong = [ProblemCount(0, "b", 16, 1)]
    with pytest.raises(ValueError, match="count of b is not problem 0"):
        write_heldout(tmp_path / "h.jsonl", PROBLEMS, wrong)
