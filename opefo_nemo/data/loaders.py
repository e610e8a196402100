"""Load problems from local files: DAPO-Math-17k parquet, our JSONL, the spec §7 eval sets.

Our JSONL schema (one JSON object per line, blank lines ignored):
    {"problem": str, "answer": str | int | float, "id": str (optional), "source": str (optional)}
The parquet layout is verl's: `prompt` is a list of chat messages ({"role", "content"}) and the
answer is `reward_model.ground_truth`. Nothing is downloaded: see `convert.py` for turning the
Hugging Face files into ours.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from opefo_nemo.data.benchmarks import benchmark
from opefo_nemo.data.problem import Problem, prompt_id_for
from opefo_nemo.data.templates import strip_dapo_instruction


class DatasetError(ValueError):
    """A data file is missing, malformed or empty; the message names the file and the field."""


def existing_file(path: str | Path) -> Path:
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"data file not found: {path}")
    return path


def answer_text(value: object, where: str) -> str:
    """An answer as a non-empty string (numbers are accepted and written as str)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise DatasetError(f"{where}: answer must be a string or number, got {value!r}")
    text = str(value).strip()
    if not text:
        raise DatasetError(f"{where}: answer is empty")
    return text


def _finish(problems: Iterable[Problem], path: Path, dedup: bool) -> list[Problem]:
    """Drop repeated prompt ids (when `dedup`), and refuse an empty result."""
    out: list[Problem] = []
    seen: set[str] = set()
    for item in problems:
        if dedup and item.prompt_id in seen:
            continue
        seen.add(item.prompt_id)
        out.append(item)
    if not out:
        raise DatasetError(f"no problems in {path}")
    return out


def load_jsonl(path: str | Path, source: str | None = None, dedup: bool = True) -> list[Problem]:
    """Problems from our JSONL schema (module docstring). `source` defaults to each line's
    "source" field, else the file stem. `dedup` drops repeated (problem, answer) pairs."""
    path = existing_file(path)

    def rows() -> Iterable[Problem]:
        with path.open(encoding="utf-8") as handle:
            for line_number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                where = f"{path}:{line_number}"
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as error:
                    raise DatasetError(f"{where}: not valid JSON ({error.msg})") from error
                if not isinstance(row, dict):
                    raise DatasetError(f"{where}: expected a JSON object")
                for column in ("problem", "answer"):
                    if column not in row:
                        raise DatasetError(f"{where}: missing field {column!r}")
                problem = row["problem"]
                if not isinstance(problem, str) or not problem.strip():
                    raise DatasetError(f"{where}: field 'problem' must be a non-empty string")
                answer = answer_text(row["answer"], where)
                row_source = source or str(row.get("source") or path.stem)
                prompt_id = str(row.get("id") or prompt_id_for(row_source, problem, answer))
                yield Problem(prompt_id, problem, answer, row_source)

    return _finish(rows(), path, dedup)


def _user_content(messages: object, where: str) -> str:
    if not isinstance(messages, list) or not messages:
        raise DatasetError(f"{where}: column 'prompt' must be a non-empty list of messages")
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str) and content.strip():
                return content
    raise DatasetError(f"{where}: column 'prompt' has no user message with content")


def load_dapo_parquet(
    path: str | Path, source: str = "dapo_math_17k", dedup: bool = True
) -> list[Problem]:
    """Problems from a verl-layout parquet (DAPO-Math-17k): `prompt` (chat messages) and
    `reward_model.ground_truth`. The bare problem is the last user message with DAPO's
    instruction removed; the messages are kept for the "messages" template. The published
    file repeats each problem many times: `dedup` keeps one copy."""
    import pyarrow.parquet as pq

    path = existing_file(path)
    schema = pq.read_schema(path)
    for column in ("prompt", "reward_model"):
        if column not in schema.names:
            raise DatasetError(f"{path}: missing column {column!r} (columns: {schema.names})")
    table = pq.read_table(path, columns=["prompt", "reward_model"])
    prompts = table.column("prompt").to_pylist()
    rewards = table.column("reward_model").to_pylist()

    def rows() -> Iterable[Problem]:
        for row_index, (messages, reward_model) in enumerate(zip(prompts, rewards, strict=True)):
            where = f"{path} row {row_index}"
            if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
                raise DatasetError(f"{where}: missing column 'reward_model.ground_truth'")
            answer = answer_text(reward_model["ground_truth"], where)
            content = _user_content(messages, where)
            problem = strip_dapo_instruction(content)
            stored = tuple({"role": m["role"], "content": m["content"]} for m in messages)
            yield Problem(prompt_id_for(source, problem, answer), problem, answer, source, stored)

    return _finish(rows(), path, dedup)


def load_problems(path: str | Path, source: str | None = None) -> list[Problem]:
    """Problems from a `.parquet` (verl layout) or `.jsonl` (our schema) file."""
    suffix = Path(path).suffix
    if suffix == ".parquet":
        return load_dapo_parquet(path, source or "dapo_math_17k")
    if suffix == ".jsonl":
        return load_jsonl(path, source)
    raise DatasetError(f"{path}: unsupported file type {suffix!r} (expected .parquet or .jsonl)")


def load_eval_set(name: str, data_dir: str | Path, check_size: bool = False) -> list[Problem]:
    """The benchmark `name` (spec §7) from `<data_dir>/<name>.jsonl` in our JSONL schema.
    `check_size` refuses a file whose problem count differs from the paper's."""
    spec = benchmark(name)
    problems = load_jsonl(Path(data_dir) / f"{name}.jsonl", source=name, dedup=False)
    if check_size and len(problems) != spec.size:
        raise DatasetError(
            f"{Path(data_dir) / f'{name}.jsonl'}: {len(problems)} problems, expected {spec.size}"
        )
    return problems
