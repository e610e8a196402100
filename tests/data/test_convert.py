"""The converter on tiny inputs: a verl parquet, a plain record parquet, a JSON list."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from opefo_nemo.data import load_dapo_parquet, load_eval_set, load_jsonl
from opefo_nemo.data.convert import main
from tests.data.verl_parquet import write_verl_parquet


def test_verl_parquet_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "dapo-math-17k.parquet"
    write_verl_parquet(
        source, [("What is $2+2$?", "4"), ("Name the prime after 7.", "11")], repeat=4
    )
    out = tmp_path / "out" / "dapo.jsonl"
    assert main(["--input", str(source), "--output", str(out), "--source", "dapo_math_17k"]) == 0
    assert "wrote 2 problems" in capsys.readouterr().out
    converted = load_jsonl(out)
    original = load_dapo_parquet(source)
    assert [(p.prompt_id, p.problem, p.ground_truth, p.source) for p in converted] == [
        (p.prompt_id, p.problem, p.ground_truth, p.source) for p in original
    ]


def test_record_files_to_eval_set(tmp_path: Path) -> None:
    records = tmp_path / "olympiad.parquet"
    pq.write_table(
        pa.table(
            {
                "question": ["Find $x$ if $x+1=3$.", "Compute $5!$."],
                "final_answer": [["$2$"], ["120"]],
            }
        ),
        records,
    )
    main(
        [
            "--input",
            str(records),
            "--output",
            str(tmp_path / "olympiadbench.jsonl"),
            "--source",
            "olympiadbench",
        ]
    )
    problems = load_eval_set("olympiadbench", tmp_path)
    assert [(p.problem, p.ground_truth) for p in problems] == [
        ("Find $x$ if $x+1=3$.", "2"),
        ("Compute $5!$.", "120"),
    ]
    listed = tmp_path / "amc.json"
    listed.write_text(json.dumps([{"prompt": "What is 6*7?", "solution": "42"}]))
    main(
        [
            "--input",
            str(listed),
            "--output",
            str(tmp_path / "amc23.jsonl"),
            "--problem-field",
            "prompt",
            "--answer-field",
            "solution",
        ]
    )
    assert load_eval_set("amc23", tmp_path)[0].ground_truth == "42"


def test_errors_name_the_file_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as missing:
        main(["--input", str(tmp_path / "nope.parquet"), "--output", str(tmp_path / "o.jsonl")])
    assert missing.value.code == 2 and "nope.parquet" in capsys.readouterr().err
    records = tmp_path / "r.jsonl"
    records.write_text(json.dumps({"question": "q", "answer": "1"}) + "\n")
    with pytest.raises(SystemExit):
        main(
            [
                "--input",
                str(records),
                "--output",
                str(tmp_path / "o.jsonl"),
                "--answer-field",
                "gold",
            ]
        )
    assert "r.jsonl row 0: missing column 'gold'" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()
