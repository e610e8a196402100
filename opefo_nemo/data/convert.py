"""Convert locally downloaded dataset files into our JSONL schema (see `loaders.py`).

Never downloads anything; usage and the fields read: docs/rewards_data_eval.md, "Converter".
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from opefo_nemo.data.loaders import DatasetError, answer_text, existing_file, load_dapo_parquet
from opefo_nemo.data.problem import Problem, prompt_id_for

PROBLEM_FIELDS = ("problem", "question", "Problem")
ANSWER_FIELDS = ("answer", "final_answer", "Answer")


def read_records(path: Path) -> list[dict]:
    """The rows of a .parquet, .jsonl or .json (list of objects) file, as dicts."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if path.suffix == ".jsonl":
        with path.open(encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]
    if path.suffix == ".json":
        records = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(records, list):
            raise DatasetError(f"{path}: expected a JSON list of objects")
        return records
    raise DatasetError(f"{path}: unsupported file type {path.suffix!r}")


def _pick_field(record: dict, explicit: str | None, defaults: Sequence[str], where: str) -> str:
    if explicit is not None:
        if explicit not in record:
            raise DatasetError(f"{where}: missing column {explicit!r}")
        return explicit
    for name in defaults:
        if name in record:
            return name
    raise DatasetError(f"{where}: none of the columns {list(defaults)} is present")


def _clean_answer(value: object, where: str) -> str:
    if isinstance(value, list):
        if len(value) != 1:
            raise DatasetError(f"{where}: answer list must have one element, got {value!r}")
        value = value[0]
    text = answer_text(value, where)
    if len(text) > 1 and text.startswith("$") and text.endswith("$"):
        text = text.strip("$").strip()
    return text


def convert_records(
    path: Path, source: str, problem_field: str | None, answer_field: str | None
) -> list[Problem]:
    """Problems from a plain record file (one problem and one answer column)."""
    problems = []
    for index, record in enumerate(read_records(path)):
        where = f"{path} row {index}"
        if not isinstance(record, dict):
            raise DatasetError(f"{where}: expected an object")
        problem = record[_pick_field(record, problem_field, PROBLEM_FIELDS, where)]
        if not isinstance(problem, str) or not problem.strip():
            raise DatasetError(f"{where}: problem must be a non-empty string")
        answer = _clean_answer(
            record[_pick_field(record, answer_field, ANSWER_FIELDS, where)], where
        )
        problems.append(Problem(prompt_id_for(source, problem, answer), problem, answer, source))
    if not problems:
        raise DatasetError(f"no problems in {path}")
    return problems


def _is_verl_parquet(path: Path) -> bool:
    if path.suffix != ".parquet":
        return False
    import pyarrow.parquet as pq

    names = pq.read_schema(path).names
    return "prompt" in names and "reward_model" in names


def convert(
    inputs: Sequence[str | Path],
    output: str | Path,
    source: str | None = None,
    problem_field: str | None = None,
    answer_field: str | None = None,
) -> int:
    """Write the problems of `inputs` to `output` (our JSONL); returns the number written."""
    problems: list[Problem] = []
    for raw_path in inputs:
        path = existing_file(raw_path)
        name = source or path.stem
        if _is_verl_parquet(path):
            problems.extend(load_dapo_parquet(path, name))
        else:
            problems.extend(convert_records(path, name, problem_field, answer_field))
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("w", encoding="utf-8") as handle:
        for item in problems:
            row = {"id": item.prompt_id, "problem": item.problem, "answer": item.ground_truth}
            handle.write(json.dumps({**row, "source": item.source}, ensure_ascii=False) + "\n")
    return len(problems)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m opefo_nemo.data.convert", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--input", action="append", required=True, help="local file (repeatable)")
    parser.add_argument("--output", required=True, help="JSONL file to write")
    parser.add_argument("--source", help="dataset name stored with each problem")
    parser.add_argument("--problem-field", help="column holding the problem statement")
    parser.add_argument("--answer-field", help="column holding the final answer")
    args = parser.parse_args(argv)
    try:
        count = convert(args.input, args.output, args.source, args.problem_field, args.answer_field)
    except DatasetError as error:
        parser.exit(2, f"error: {error}\n")
    print(f"wrote {count} problems to {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
