"""The boundary comparison's numbers and tables: pass@k of every model with its bootstrap band,
Δ(k) of each model against the first with its paired-bootstrap interval, the problems only one of
a pair solves and the distinct answers per problem (spec §12), as JSON-ready data and Markdown
(docs/boundary.md, "Reading the comparison").
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from opefo_nemo.eval.boundary import (
    CONFIDENCE,
    Estimate,
    mean,
    only_solved,
    paired_bootstrap,
    problem_pass_at_k,
    resample_indices,
)
from opefo_nemo.eval.counts import ProblemCount


def boundary_report(
    counts: Mapping[str, Sequence[ProblemCount]],
    ks: Sequence[int],
    resamples: int,
    seed: int,
    calibration: Mapping[str, tuple[int, int]] | None = None,
    settings: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The comparison of the models of ``counts`` (label → the counts of the same problems, in
    the same order; the first label is the reference A, every other one a B). Every interval
    comes from the same ``resamples`` draws of problems (seeded ``seed``). ``calibration``
    (problem id → its calibration count and n) goes beside each problem; ``settings`` is recorded
    as it is."""
    labels = list(counts)
    if len(labels) < 2:
        raise ValueError("a comparison needs two models or more")
    reference = counts[labels[0]]
    ids = [c.prompt_id for c in reference]
    n = reference[0].samples if reference else 0
    for label in labels:
        rows = counts[label]
        if [c.prompt_id for c in rows] != ids or any(c.samples != n for c in rows):
            raise ValueError(f"{label}: not the same problems and samples as {labels[0]}")
    draws = resample_indices(len(ids), resamples, seed)
    per_k = {
        label: {k: problem_pass_at_k([c.correct for c in counts[label]], n, k) for k in ks}
        for label in labels
    }
    models: dict[str, Any] = {}
    comparisons = []
    for label in labels[1:]:
        estimates = {k: paired_bootstrap(per_k[labels[0]][k], per_k[label][k], draws) for k in ks}
        models.setdefault(labels[0], _model(reference, {k: e.a for k, e in estimates.items()}))
        models[label] = _model(counts[label], {k: e.b for k, e in estimates.items()})
        only_a, only_b = only_solved(
            [c.correct for c in reference], [c.correct for c in counts[label]]
        )
        comparisons.append(
            {
                "a": labels[0],
                "b": label,
                "delta": {str(k): asdict(e.delta) for k, e in estimates.items()},
                "only_a": [ids[i] for i in only_a],
                "only_b": [ids[i] for i in only_b],
            }
        )
    calibration = calibration or {}
    per_problem = [
        {
            "id": problem_id,
            "calibration": list(calibration[problem_id]) if problem_id in calibration else None,
            "correct": {label: counts[label][i].correct for label in labels},
            "distinct_answers": {label: counts[label][i].distinct_answers for label in labels},
            "answers": {label: counts[label][i].answers for label in labels},
        }
        for i, problem_id in enumerate(ids)
    ]
    return {
        "settings": dict(settings or {}),
        "problems": len(ids),
        "samples": n,
        "ks": list(ks),
        "resamples": resamples,
        "bootstrap_seed": seed,
        "confidence": CONFIDENCE,
        "models": models,
        "comparisons": comparisons,
        "per_problem": per_problem,
    }


def _model(counts: Sequence[ProblemCount], curve: Mapping[int, Estimate]) -> dict[str, Any]:
    return {
        "pass_at_k": {str(k): asdict(e) for k, e in curve.items()},
        "mean_distinct_answers": mean([float(c.distinct_answers) for c in counts]),
        "samples_drawn": sum(c.samples for c in counts),
        "tokens": sum(c.tokens for c in counts),
        "truncated": sum(c.truncated for c in counts),
    }


def _cell(estimate: Mapping[str, float], signed: bool = False) -> str:
    sign = "+" if signed else ""
    value, low, high = (100 * estimate[key] for key in ("value", "low", "high"))
    return f"{value:{sign}.1f} [{low:{sign}.1f}, {high:{sign}.1f}]"


def render_boundary_markdown(report: Mapping[str, Any]) -> str:
    """The report as Markdown: a pass@k table (percent, each with its 95 % band), a Δ(k) table
    (points, B − A, each with its paired interval; ``*`` where the interval excludes 0), and the
    problems only one model of each pair solves."""
    ks = report["ks"]
    confidence = round(100 * report["confidence"])
    settings = report["settings"]
    lines = ["# Reasoning-boundary comparison", ""]
    lines += [
        f"{report['problems']} problems, {report['samples']} fresh samples each; pass@k in "
        f"percent with the {confidence} % percentile interval of {report['resamples']} "
        f"bootstrap resamples of the problems (seed {report['bootstrap_seed']}).",
        "",
    ]
    for key, value in settings.items():
        if isinstance(value, Mapping):
            value = "; ".join(f"{name}: {item}" for name, item in value.items())
        lines.append(f"- {key}: {value}")
    lines += [""] if settings else []
    header = "| model | " + " | ".join(f"pass@{k}" for k in ks) + " | distinct answers |"
    lines += [header, "|" + " --- |" * (len(ks) + 2)]
    for label, model in report["models"].items():
        cells = " | ".join(_cell(model["pass_at_k"][str(k)]) for k in ks)
        lines.append(f"| {label} | {cells} | {model['mean_distinct_answers']:.2f} |")
    lines += ["", "Δ(k) = pass@k(B) − pass@k(A) in points; * its interval excludes 0.", ""]
    lines += ["| B − A | " + " | ".join(f"Δ@{k}" for k in ks) + " | only A | only B |"]
    lines.append("|" + " --- |" * (len(ks) + 3))
    for pair in report["comparisons"]:
        deltas = []
        for k in ks:
            delta = pair["delta"][str(k)]
            excludes = delta["low"] > 0 or delta["high"] < 0
            deltas.append(_cell(delta, signed=True) + (" *" if excludes else ""))
        name = f"{pair['b']} − {pair['a']}"
        lines.append(
            f"| {name} | {' | '.join(deltas)} | {len(pair['only_a'])} | {len(pair['only_b'])} |"
        )
    if report.get("cost"):
        lines += ["", "Samples drawn by this run:", ""]
        for label, cost in report["cost"].items():
            lines.append(
                f"- {label}: {cost['samples']} samples ({cost['tokens']} tokens) in "
                f"{cost['seconds']:.1f} s after {cost['startup_seconds']:.1f} s of start-up"
            )
    correct = {row["id"]: row["correct"] for row in report["per_problem"]}
    for pair in report["comparisons"]:
        for side, key in ((pair["a"], "only_a"), (pair["b"], "only_b")):
            if not pair[key]:
                continue
            other = pair["b"] if side == pair["a"] else pair["a"]
            lines += [
                "",
                f"Solved by {side} only (against {other}; correct of {report['samples']}):",
            ]
            lines += [f"- {i}: {correct[i][side]}" for i in pair[key]]
    return "\n".join(lines) + "\n"


def write_boundary_report(report: Mapping[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """``boundary.md`` and ``boundary.json`` in ``out_dir``; the Markdown is printed too."""
    out_dir.mkdir(parents=True, exist_ok=True)
    markdown = render_boundary_markdown(report)
    print(markdown, end="")
    md_path, json_path = out_dir / "boundary.md", out_dir / "boundary.json"
    md_path.write_text(markdown, encoding="utf-8")
    json_path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return md_path, json_path
