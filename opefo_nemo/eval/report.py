"""The paper-style results table: one row per model, the spec §7 benchmarks as columns, avg@k (and
pass@k) as percentages with one decimal; "Avg." is the unweighted mean over the benchmarks
present (docs/training.md, "Validation and ``opefo-eval``").
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from opefo_nemo.data.benchmarks import BENCHMARKS, PASS_AT_K_VALUES
from opefo_nemo.eval.metrics import CorrectMatrix, avg_at_k, mean_pass_at_k


@dataclass(frozen=True)
class BenchmarkScore:
    """avg@k (and pass@k for each k ≤ the samples per problem) of one benchmark, in [0, 1]."""

    benchmark: str
    problems: int
    samples: int
    avg_at_k: float
    pass_at_k: dict[int, float] = field(default_factory=dict)


def score_benchmark(
    name: str, correct_matrix: CorrectMatrix, pass_k: Sequence[int] = PASS_AT_K_VALUES
) -> BenchmarkScore:
    """Scores of one benchmark from its [problems][samples] 0/1 matrix; pass@k for each k in
    `pass_k` that every problem has enough samples for."""
    samples = min(len(row) for row in correct_matrix) if correct_matrix else 0
    passes = {k: mean_pass_at_k(correct_matrix, k) for k in pass_k if 1 <= k <= samples}
    return BenchmarkScore(name, len(correct_matrix), samples, avg_at_k(correct_matrix), passes)


def benchmark_scores(results: Mapping[str, CorrectMatrix]) -> dict[str, BenchmarkScore]:
    """`score_benchmark` for every benchmark in `results` (benchmark name -> matrix)."""
    return {name: score_benchmark(name, matrix) for name, matrix in results.items()}


def _ordered_names(rows: Mapping[str, Mapping[str, BenchmarkScore]]) -> list[str]:
    present = {name for scores in rows.values() for name in scores}
    known = [b.name for b in BENCHMARKS if b.name in present]
    return known + sorted(present - set(known))


def _title(name: str) -> str:
    return next((b.title for b in BENCHMARKS if b.name == name), name)


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def render_markdown(
    rows: Mapping[str, Mapping[str, BenchmarkScore]], verifier: str | None = None
) -> str:
    """The avg@k table (rows: models, columns: benchmarks + Avg.) and, for benchmarks with
    enough samples, a pass@k table per benchmark; with `verifier`, a line above the avg@k table
    and each pass@k heading name it."""
    names = _ordered_names(rows)
    scored_by = "" if verifier is None else f", verifier {verifier}"
    header = "| Method | " + " | ".join(_title(n) for n in names) + " | Avg. |"
    lines = [] if verifier is None else [f"avg@k, verifier {verifier}", ""]
    lines += [header, "|" + " --- |" * (len(names) + 2)]
    for method, scores in rows.items():
        values = [scores[n].avg_at_k if n in scores else None for n in names]
        present = [v for v in values if v is not None]
        average = sum(present) / len(present) if present else None
        cells = " | ".join(_percent(v) for v in [*values, average])
        lines.append(f"| {method} | {cells} |")
    for name in names:
        ks = sorted({k for s in rows.values() if name in s for k in s[name].pass_at_k})
        if not ks:
            continue
        lines += ["", f"pass@k on {_title(name)}{scored_by}", ""]
        lines.append("| Method | " + " | ".join(f"Pass@{k}" for k in ks) + " |")
        lines.append("|" + " --- |" * (len(ks) + 1))
        for method, scores in rows.items():
            passes = scores[name].pass_at_k if name in scores else {}
            lines.append(f"| {method} | " + " | ".join(_percent(passes.get(k)) for k in ks) + " |")
    return "\n".join(lines) + "\n"


def report_json(
    rows: Mapping[str, Mapping[str, BenchmarkScore]], verifier: str | None = None
) -> dict:
    """The same numbers as `render_markdown`, as plain JSON-ready data (fractions in [0, 1]);
    with `verifier`, each method's entry records it under "verifier"."""
    out: dict[str, dict[str, Any]] = {}
    for method, scores in rows.items():
        entries = {name: asdict(score) for name, score in scores.items()}
        values = [score.avg_at_k for score in scores.values()]
        out[method] = {
            "benchmarks": entries,
            "average": sum(values) / len(values) if values else None,
        }
        if verifier is not None:
            out[method]["verifier"] = verifier
    return out


def write_report(
    rows: Mapping[str, Mapping[str, BenchmarkScore]],
    out_dir: str | Path,
    stem: str = "results",
    verifier: str | None = None,
) -> tuple[Path, Path]:
    """Print the markdown table and save `<out_dir>/<stem>.md` and `<stem>.json`; `verifier`
    (the one that scored the responses) is named in both: its scores are not comparable across
    verifiers (`dapo`, `answer` and `math_verify` accept different spellings)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    markdown = render_markdown(rows, verifier)
    print(markdown, end="")
    md_path, json_path = out_dir / f"{stem}.md", out_dir / f"{stem}.json"
    md_path.write_text(markdown, encoding="utf-8")
    json_path.write_text(json.dumps(report_json(rows, verifier), indent=2) + "\n", encoding="utf-8")
    return md_path, json_path
