"""Loaders on the samples in tests/data/samples (JSONL) and a parquet written here (verl layout)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from opefo_nemo.data import (
    DatasetError,
    load_dapo_parquet,
    load_eval_set,
    load_jsonl,
    load_problems,
    prompt_id_for,
    prompt_messages,
    render_prompt,
)
from opefo_nemo.data.templates import DAPO_PREFIX, DAPO_SUFFIX
from tests.data.verl_parquet import write_verl_parquet

DATA = Path(__file__).parent / "samples"


def test_jsonl_sample() -> None:
    problems = load_jsonl(DATA / "train_sample.jsonl")
    assert [p.ground_truth for p in problems] == ["11", "3", "\\frac{3}{4}", "12"]  # dup dropped
    assert problems[0].source == "train_sample" and problems[2].source == "toy"
    assert problems[3].prompt_id == "cube-edges"
    first = problems[0]
    assert first.prompt_id == prompt_id_for("train_sample", first.problem, "11")
    assert len(load_jsonl(DATA / "train_sample.jsonl", dedup=False)) == 5


def test_prompt_ids_are_stable_and_distinct() -> None:
    a = prompt_id_for("s", "What is 1+1?", "2")
    assert a == prompt_id_for("s", "What is 1+1?", "2")
    assert (
        len({a, prompt_id_for("s", "What is 1+1?", "3"), prompt_id_for("t", "What is 1+1?", "2")})
        == 3
    )
    reordered = load_jsonl(DATA / "train_sample.jsonl")[::-1]
    assert {p.prompt_id for p in reordered} == {
        p.prompt_id for p in load_jsonl(DATA / "train_sample.jsonl")
    }


def test_verl_parquet(tmp_path: Path) -> None:
    path = tmp_path / "dapo.parquet"
    write_verl_parquet(path, [("What is $2+2$?", "4"), ("What is $3 \\cdot 3$?", "9")], repeat=3)
    problems = load_dapo_parquet(path)
    assert [(p.problem, p.ground_truth) for p in problems] == [
        ("What is $2+2$?", "4"),
        ("What is $3 \\cdot 3$?", "9"),
    ]
    assert problems[0].source == "dapo_math_17k"
    assert problems[0].messages[0]["content"] == DAPO_PREFIX + "What is $2+2$?" + DAPO_SUFFIX
    assert len(load_dapo_parquet(path, dedup=False)) == 6
    assert load_problems(path) == problems
    # the stored messages and the dapo template render the same prompt
    assert prompt_messages(problems[0], "messages") == prompt_messages(problems[0], "dapo")


def test_eval_sets() -> None:
    aime = load_eval_set("aime24", DATA / "eval")
    assert len(aime) == 3 and {p.source for p in aime} == {"aime24"}
    with pytest.raises(DatasetError, match="3 problems, expected 30"):
        load_eval_set("aime24", DATA / "eval", check_size=True)
    with pytest.raises(DatasetError, match=r"not found: .*aime25\.jsonl"):
        load_eval_set("aime25", DATA / "eval")
    with pytest.raises(KeyError, match="gsm8k"):
        load_eval_set("gsm8k", DATA / "eval")


def test_templates() -> None:
    problem = load_jsonl(DATA / "eval" / "math500.jsonl")[0]
    assert render_prompt(problem, "dapo") == DAPO_PREFIX + "Evaluate $\\sqrt{49}$." + DAPO_SUFFIX
    boxed = render_prompt(problem, "boxed")
    assert boxed.startswith("Evaluate $\\sqrt{49}$.\n") and "\\boxed{}" in boxed
    assert render_prompt(problem, "raw") == "Evaluate $\\sqrt{49}$."
    with pytest.raises(ValueError, match="has none"):
        render_prompt(problem, "messages")
    with pytest.raises(ValueError, match="unknown prompt template"):
        render_prompt(problem, "fewshot")


class _ChatTokenizer:
    """A minimal real chat template (the shape of a Hugging Face tokenizer's method)."""

    def apply_chat_template(self, conversation, tokenize=True, add_generation_prompt=False):
        assert tokenize is False
        text = "".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in conversation)
        return text + ("<|assistant|>" if add_generation_prompt else "")


def test_chat_template() -> None:
    problem = load_jsonl(DATA / "eval" / "math500.jsonl")[1]
    rendered = render_prompt(problem, "raw", tokenizer=_ChatTokenizer())
    assert rendered == "<|user|>Solve $2x + 1 = 4$ for $x$.<|end|><|assistant|>"


def test_jsonl_rows_may_carry_chat_messages(tmp_path: Path) -> None:
    # a parquet's problems written as JSONL keep their messages for the "messages" template
    parquet = tmp_path / "dapo.parquet"
    write_verl_parquet(parquet, [("What is $2+2$?", "4")])
    (problem,) = load_dapo_parquet(parquet)
    row = {
        "id": problem.prompt_id,
        "problem": problem.problem,
        "answer": "4",
        "source": problem.source,
        "messages": list(problem.messages),
        "calibration": {},
    }
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    assert load_jsonl(path) == [problem]
    path.write_text(json.dumps({**row, "messages": [{"role": "user"}]}) + "\n")
    with pytest.raises(DatasetError, match="line 1: field 'messages' must be a list"):
        load_jsonl(path)


def test_error_cases(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="not found"):
        load_jsonl(tmp_path / "missing.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DatasetError, match=r"no problems in .*empty\.jsonl"):
        load_jsonl(empty)
    no_answer = tmp_path / "no_answer.jsonl"
    no_answer.write_text(json.dumps({"problem": "1+1?"}) + "\n")
    with pytest.raises(
        DatasetError,
        match=r"no_answer\.jsonl: 1 of 1 rows are defective \(line 1: missing field 'answer'\)",
    ):
        load_jsonl(no_answer)
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"problem": "x", "answer": "1"}\n{oops\n')
    with pytest.raises(
        DatasetError, match=r"bad\.jsonl: 1 of 2 rows are defective \(line 2: not valid JSON"
    ):
        load_jsonl(bad_json)
    no_reward = tmp_path / "no_reward.parquet"
    pq.write_table(pa.table({"prompt": [[{"content": "q", "role": "user"}]]}), no_reward)
    with pytest.raises(DatasetError, match=r"no_reward\.parquet: missing column 'reward_model'"):
        load_dapo_parquet(no_reward)
    no_truth = tmp_path / "no_truth.parquet"
    pq.write_table(
        pa.table(
            {"prompt": [[{"content": "q", "role": "user"}]], "reward_model": [{"style": "rule"}]}
        ),
        no_truth,
    )
    with pytest.raises(DatasetError, match=r"row 0: missing column 'reward_model.ground_truth'"):
        load_dapo_parquet(no_truth)
    empty_parquet = tmp_path / "empty.parquet"
    write_verl_parquet(empty_parquet, [])
    with pytest.raises(DatasetError, match="no problems"):
        load_dapo_parquet(empty_parquet)
    with pytest.raises(DatasetError, match="unsupported file type"):
        load_problems(tmp_path / "x.csv")
