"""A file with defective rows (empty answers, a missing problem, a line that is not JSON): refused
whole by default with every defect counted and listed, or read without them (``skip``) with one
warning that counts and lists them; the rows read are exactly the sound ones."""

from __future__ import annotations

import json
import logging

import pytest

from opefo_nemo.data import DatasetError, load_jsonl, load_problems
from opefo_nemo.data.loaders import LISTED_DEFECTS
from tests.data.verl_parquet import write_verl_parquet

SOUND = [(f"What is {i} + {i}?", str(2 * i)) for i in range(7)]


def _jsonl_with_defects(path):
    """The seven sound rows with three defects at lines 2, 5 and 9."""
    lines = [json.dumps({"problem": p, "answer": a}) for p, a in SOUND]
    lines.insert(1, json.dumps({"problem": "What is 1 + 2?", "answer": "  "}))
    lines.insert(4, json.dumps({"answer": "4"}))
    lines.insert(8, "{not json")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_defective_rows_refuse_the_file_by_default_naming_each(tmp_path):
    path = _jsonl_with_defects(tmp_path / "bench.jsonl")
    with pytest.raises(DatasetError) as refused:
        load_jsonl(path)
    message = str(refused.value)
    assert "3 of 10 rows are defective" in message
    for expected in ("line 2: answer is empty", "line 5: missing field 'problem'", "line 9: not"):
        assert expected in message
    assert "data.defective_rows=skip" in message and "--defective-rows skip" in message


def test_skip_reads_the_sound_rows_and_warns_with_count_and_list(tmp_path, caplog):
    path = _jsonl_with_defects(tmp_path / "bench.jsonl")
    with caplog.at_level(logging.WARNING):
        problems = load_jsonl(path, dedup=False, defective="skip")
    assert [(p.problem, p.ground_truth) for p in problems] == SOUND
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "3 of 10 rows are defective" in warning and "skipped" in warning
    assert "line 2: answer is empty" in warning and "line 9" in warning


def test_a_parquet_with_empty_answers_is_skipped_row_by_row(tmp_path, caplog):
    rows = [*SOUND[:3], ("What is 9 + 9?", ""), *SOUND[3:]]
    path = tmp_path / "train.parquet"
    write_verl_parquet(path, rows)
    with pytest.raises(DatasetError, match=r"1 of 8 rows are defective \(row 3: answer is empty\)"):
        load_problems(path)
    with caplog.at_level(logging.WARNING):
        problems = load_problems(path, defective="skip")
    assert [(p.problem, p.ground_truth) for p in problems] == SOUND
    assert "row 3: answer is empty" in caplog.text


def test_a_long_list_of_defects_is_cut_after_the_first_ones(tmp_path):
    many = LISTED_DEFECTS + 5
    path = tmp_path / "many.jsonl"
    rows = [{"problem": f"q{i}", "answer": ""} for i in range(many)] + [
        {"problem": "q", "answer": 1}
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DatasetError) as refused:
        load_jsonl(path)
    message = str(refused.value)
    assert f"{many} of {many + 1} rows are defective" in message and "and 5 more" in message
    assert message.count("answer is empty") == LISTED_DEFECTS
    with pytest.raises(ValueError, match="expected one of"):
        load_jsonl(path, defective="ignore")
