"""Load problems from local files: DAPO-Math-17k parquet (verl's layout), our JSONL, the spec §7
eval sets; nothing is downloaded (docs/rewards_data_eval.md: "Our JSONL schema", "Loaders").
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TypeVar, cast

from opefo_nemo.data.benchmarks import benchmark
from opefo_nemo.data.problem import Problem, prompt_id_for
from opefo_nemo.data.templates import strip_dapo_instruction


class DatasetError(ValueError):
    """A data file is missing, malformed or empty; the message names the file and the field."""


log = logging.getLogger(__name__)
#: What a defective row does to its file: refuse it whole, or be skipped with a warning.
DEFECTIVE_ROWS = ("error", "skip")
#: Defective rows a warning names one by one (the count covers all).
LISTED_DEFECTS = 20
Row = TypeVar("Row")


def read_rows(
    rows: Sequence[Row],
    parse: Callable[[Row, str], Problem],
    where: Callable[[int], str],
    path: Path,
    defective: str,
) -> list[Problem]:
    """``parse`` each row (``where(i)`` names row ``i`` in messages). The rows it refuses with a
    :class:`DatasetError` are counted and listed: in the error that refuses the file
    (``defective="error"``), or in a warning while the others are read (``"skip"``)."""
    if defective not in DEFECTIVE_ROWS:
        raise ValueError(f"defective rows: expected one of {DEFECTIVE_ROWS}, got {defective!r}")
    problems, defects = [], []
    for index, row in enumerate(rows):
        try:
            problems.append(parse(row, where(index)))
        except DatasetError as error:
            defects.append(str(error).removeprefix(str(path)).lstrip(": "))
    if not defects:
        return problems
    listed = "; ".join(defects[:LISTED_DEFECTS])
    if len(defects) > LISTED_DEFECTS:
        listed += f"; and {len(defects) - LISTED_DEFECTS} more"
    summary = f"{path}: {len(defects)} of {len(rows)} rows are defective ({listed})"
    if defective == "error":
        skip = "data.defective_rows=skip (opefo-eval: --defective-rows skip)"
        raise DatasetError(f"{summary}: skip them with {skip}")
    log.warning("%s: skipped", summary)
    return problems


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


def load_jsonl(
    path: str | Path, source: str | None = None, dedup: bool = True, defective: str = "error"
) -> list[Problem]:
    """Problems from our JSONL schema, one object per line (blank lines ignored):
    `{"problem": str, "answer": str | int | float, "id": str (optional), "source": str
    (optional), "messages": [{"role": str, "content": str}, ...] (optional: the chat messages of
    the "messages" template)}`; other fields are ignored. `source` defaults to each line's
    "source" field, else the file stem. `dedup` drops repeated (problem, answer) pairs. A
    defective row (not JSON, a missing or empty problem or answer) refuses the whole file with
    `defective="error"` (the default); with `"skip"` the other rows are read and the defective
    ones counted and listed in a warning."""
    path = existing_file(path)
    with path.open(encoding="utf-8") as handle:
        lines = [(number, line) for number, line in enumerate(handle, start=1) if line.strip()]

    def parse(numbered: tuple[int, str], where: str) -> Problem:
        try:
            row = json.loads(numbered[1])
        except json.JSONDecodeError as error:
            raise DatasetError(f"{where}: not valid JSON ({error.msg})") from None
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
        messages = stored_messages(row.get("messages", []), where)
        return Problem(prompt_id, problem, answer, row_source, messages)

    def where(index: int) -> str:
        return f"{path} line {lines[index][0]}"

    return _finish(read_rows(lines, parse, where, path, defective), path, dedup)


def stored_messages(value: object, where: str) -> tuple[dict[str, str], ...]:
    """A row's optional chat messages: a list of ``{"role": str, "content": str}``."""
    if not isinstance(value, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in value
    ):
        raise DatasetError(f"{where}: field 'messages' must be a list of {{role, content}} strings")
    return tuple({"role": m["role"], "content": m["content"]} for m in value)


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
    path: str | Path, source: str = "dapo_math_17k", dedup: bool = True, defective: str = "error"
) -> list[Problem]:
    """Problems from a verl-layout parquet (DAPO-Math-17k): `prompt` (chat messages) and
    `reward_model.ground_truth`. The bare problem is the last user message with DAPO's
    instruction removed; the messages are kept for the "messages" template. The published
    file repeats each problem many times: `dedup` keeps one copy; `defective`: see the module
    docstring."""
    import pyarrow.parquet as pq

    path = existing_file(path)
    schema = pq.read_schema(path)
    for column in ("prompt", "reward_model"):
        if column not in schema.names:
            raise DatasetError(f"{path}: missing column {column!r} (columns: {schema.names})")
    table = pq.read_table(path, columns=["prompt", "reward_model"])
    rows = list(
        zip(
            table.column("prompt").to_pylist(),
            table.column("reward_model").to_pylist(),
            strict=True,
        )
    )

    def parse(row: tuple[object, object], where: str) -> Problem:
        messages, reward_model = row
        if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
            raise DatasetError(f"{where}: missing column 'reward_model.ground_truth'")
        answer = answer_text(reward_model["ground_truth"], where)
        content = _user_content(messages, where)
        problem = strip_dapo_instruction(content)
        stored = tuple({"role": m["role"], "content": m["content"]} for m in cast(list, messages))
        return Problem(prompt_id_for(source, problem, answer), problem, answer, source, stored)

    def where(index: int) -> str:
        return f"{path} row {index}"

    return _finish(read_rows(rows, parse, where, path, defective), path, dedup)


def load_problems(
    path: str | Path, source: str | None = None, defective: str = "error"
) -> list[Problem]:
    """Problems from a `.parquet` (verl layout) or `.jsonl` (our schema) file."""
    suffix = Path(path).suffix
    if suffix == ".parquet":
        return load_dapo_parquet(path, source or "dapo_math_17k", defective=defective)
    if suffix == ".jsonl":
        return load_jsonl(path, source, defective=defective)
    raise DatasetError(f"{path}: unsupported file type {suffix!r} (expected .parquet or .jsonl)")


def load_eval_set(
    name: str, data_dir: str | Path, check_size: bool = False, defective: str = "error"
) -> list[Problem]:
    """The benchmark `name` (spec §7) from `<data_dir>/<name>.jsonl` in our JSONL schema.
    `check_size` refuses a file whose problem count differs from the paper's."""
    spec = benchmark(name)
    path = Path(data_dir) / f"{name}.jsonl"
    problems = load_jsonl(path, source=name, dedup=False, defective=defective)
    if check_size and len(problems) != spec.size:
        raise DatasetError(
            f"{Path(data_dir) / f'{name}.jsonl'}: {len(problems)} problems, expected {spec.size}"
        )
    return problems
