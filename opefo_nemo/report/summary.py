"""``summary.md``: one table row per group, the runs read, and the metrics some runs lacked; each
column's figure of one run is in :data:`COLUMNS` (docs/training.md, "Comparing methods and
seeds").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from opefo_nemo.report.derived import LARGEST_PASS
from opefo_nemo.report.runs import Group, Run

#: A run's figure for the table, given the first / last window; ``None`` when it lacks the metric.
Figure = Callable[[Run, int], float | None]


def edge_means(run: Run, key: str, window: int) -> tuple[float, float] | None:
    """Means of the first and of the last ``min(window, n)`` logged values of ``key``."""
    _, values = run.series(key)
    if not len(values):
        return None
    width = min(window, len(values))
    return float(values[:width].mean()), float(values[-width:].mean())


def _first(key: str) -> Figure:
    return lambda run, window: None if (e := edge_means(run, key, window)) is None else e[0]


def _last(key: str) -> Figure:
    return lambda run, window: None if (e := edge_means(run, key, window)) is None else e[1]


def _end(key: str, index: int) -> Figure:
    """The first (``index`` 0) or last (−1) logged value of ``key``, whatever the window."""

    def figure(run: Run, window: int) -> float | None:
        _, values = run.series(key)
        return float(values[index]) if len(values) else None

    return figure


def _relative_change(run: Run, window: int) -> float | None:
    edges = edge_means(run, "entropy/mean", window)
    if edges is None or edges[0] == 0:
        return None
    return 100.0 * (edges[1] - edges[0]) / abs(edges[0])


def _reward_rise(run: Run, window: int) -> float | None:
    edges = edge_means(run, "reward/mean", window)
    return None if edges is None else edges[1] - edges[0]


def _over_run(key: str, reduce: Callable[[np.ndarray], float], steps: int | None = None) -> Figure:
    """``reduce`` of ``key``'s logged values (the first ``steps`` of them when given)."""

    def figure(run: Run, window: int) -> float | None:
        _, values = run.series(key)
        values = values[:steps]
        return float(reduce(values)) if len(values) else None

    return figure


#: Steps over which the early |λ*| is averaged (the regime a run starts in).
EARLY_STEPS = 20


def _mean_abs(values: np.ndarray) -> float:
    return float(np.abs(values).mean())


#: ``(column, figure of one run, format of the mean)``; deviations get two significant digits.
#: "first"/"last" are the means of the first and last ``window`` logged values (pass@k: the first
#: and last validation, the first being the warm start's with validation from the start; pass@k
#: at the largest k logged); the λ*, shift and flow figures are means over the run, |λ*| also
#: over its first ``EARLY_STEPS`` logged steps (before a collapse changes the regime); Σ realized
#: and Σ drift sum over the transitions ``flow/drift`` closes (:mod:`.derived`).
COLUMNS: tuple[tuple[str, Figure, str], ...] = (
    ("H first", _first("entropy/mean"), "{:.3f}"),
    ("H last", _last("entropy/mean"), "{:.3f}"),
    ("H change %", _relative_change, "{:+.1f}"),
    ("reward first", _first("reward/mean"), "{:.3f}"),
    ("reward last", _last("reward/mean"), "{:.3f}"),
    ("reward rise", _reward_rise, "{:+.3f}"),
    ("length first", _first("response/length_mean"), "{:.2f}"),
    ("length last", _last("response/length_mean"), "{:.2f}"),
    ("mean abs λ*", _over_run("flow/lambda", _mean_abs), "{:.3f}"),
    (f"abs λ* steps 1–{EARLY_STEPS}", _over_run("flow/lambda", _mean_abs, EARLY_STEPS), "{:.3f}"),
    ("adv shift", _over_run("flow/adv_shift", np.mean), "{:+.3f}"),
    ("confident shift", _over_run("flow/adv_shift_confident", np.mean), "{:+.3f}"),
    ("mean P − N", _over_run("flow/net", np.mean), "{:.3g}"),
    ("mean realized", _over_run("flow/realized", np.mean), "{:.3g}"),
    ("Σ realized", _end("cumulative/realized", -1), "{:+.3g}"),
    ("Σ drift", _end("cumulative/drift", -1), "{:+.3g}"),
    ("pass@1 first", _end("val/pass@1", 0), "{:.3f}"),
    ("pass@1 last", _end("val/pass@1", -1), "{:.3f}"),
    ("pass@k first", _end(LARGEST_PASS, 0), "{:.3f}"),
    ("pass@k last", _end(LARGEST_PASS, -1), "{:.3f}"),
)


def aggregate_cell(values: Sequence[float | None], fmt: str) -> str:
    """``mean ± s`` (sample standard deviation) over the runs that have the figure; the mean
    alone for one run; ``–`` for none."""
    present = np.array([v for v in values if v is not None], dtype=np.float64)
    if not len(present):
        return "–"
    mean = fmt.format(present.mean())
    if len(present) == 1:
        return mean
    return f"{mean} ± {present.std(ddof=1):.2g}"


def _seeds(group: Group) -> str:
    return ", ".join("?" if s is None else str(s) for s in group.seeds)


def _steps(group: Group) -> str:
    low, high = min(r.steps for r in group.runs), max(r.steps for r in group.runs)
    return str(low) if low == high else f"{low}–{high}"


def summary_markdown(
    groups: Sequence[Group], missing: dict[Run, list[str]], window: int, smooth: int
) -> str:
    """The whole ``summary.md``."""
    runs = [run for group in groups for run in group.runs]
    header = ["group", "seeds", "steps", *(name for name, _, _ in COLUMNS)]
    lines = [
        "# Training report",
        "",
        f"{len(runs)} run(s) in {len(groups)} group(s). First / last: means over the first and the "
        f"last {window} logged steps of each run; H change = (last − first) / first, reward rise "
        f"= last − first. abs λ*: mean |λ*| over the run and over its first {EARLY_STEPS} steps; "
        "adv shift / confident shift: mean `flow/adv_shift` / `flow/adv_shift_confident` "
        "(Σ (w − 1) A / Σ |A| of the applied weights, spec §6). With several "
        "seeds: mean ± sample standard deviation over seeds. P − N sums ΔH over one optimizer "
        "step's batch (spec §3; with several updates per rollout, the mean over its mini-batch "
        "steps); mean realized: mean `flow/realized` (logged every `metrics.realized_every` "
        "steps); Σ realized / Σ drift: their sums over the steps `flow/drift` was logged at "
        "(the sampled entropy's change on the updated batch and off it, spec §6). pass@1 / "
        "pass@k: held-out (`val/pass@k`, k the largest logged), first and last validation; "
        "a first validation at step 0 is the warm start's.",
        f"Figure (report.png): each run smoothed by a {smooth}-step trailing moving average; "
        "lines are the mean over seeds, bands span their minimum to maximum.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for group in groups:
        cells = [group.label, _seeds(group), _steps(group)]
        cells += [
            aggregate_cell([figure(run, window) for run in group.runs], fmt)
            for _, figure, fmt in COLUMNS
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Runs", "", "| run directory | group | method | seed | steps |"]
    lines.append("|---" * 5 + "|")
    for group in groups:
        for run in group.runs:
            seed = "?" if run.seed is None else str(run.seed)
            lines.append(
                f"| {run.path} | {group.label} | {run.method or '?'} | {seed} | {run.steps} |"
            )
    lines += ["", "## Missing metrics", ""]
    if not missing:
        lines.append("Every run logged every metric its panels show.")
    for run, keys in missing.items():
        listed = ", ".join(f"`{k}`" for k in keys)
        lines.append(f"- {run.path} ({run.describe()}): no {listed}; left out of those panels")
    return "\n".join(lines) + "\n"


def write_summary(
    groups: Sequence[Group], missing: dict[Run, list[str]], out_dir: Path, window: int, smooth: int
) -> Path:
    path = out_dir / "summary.md"
    path.write_text(summary_markdown(groups, missing, window, smooth))
    return path
