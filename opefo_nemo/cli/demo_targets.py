"""The embedded demo's figures: what strict GRPO and OPEFO did, against the demo's targets.

Read from each run's ``metrics.jsonl`` (spec §6) under the comparison's output directory, written
to ``targets.md`` beside it and printed. Means over ``WINDOW`` steps smooth the per-step noise
(each step sees other prompts):

- reward and token-mean entropy: mean of the first ``WINDOW`` steps → mean of the last ``WINDOW``;
  the demo's targets are strict GRPO's reward rising by at least ``REWARD_RISE`` (absolute) and
  its entropy falling by at least ``ENTROPY_FALL`` (relative);
- the entropy flow: the predicted net flow the update was built from, per step (``flow/net`` =
  P − N for GRPO; ``flow/net_after_balance`` = (1+λ*)P − (1−λ*)N for OPEFO, zero by construction;
  both Σ ΔH over the batch without the learning rate, spec §2-§3), beside the realized entropy
  change of the same batch (``flow/realized``, after − before the update, every
  ``metrics.realized_every`` steps): its mean and how many steps it was negative.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..trainer.metrics_log import read_metrics

WINDOW = 10
REWARD_RISE = 0.25
ENTROPY_FALL = 0.40
GRPO, OPEFO = "grpo_strict", "opefo"
PREDICTED = {GRPO: "flow/net", OPEFO: "flow/net_after_balance"}


def _values(records: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in records if r.get(key) is not None]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def run_figures(records: Sequence[Mapping[str, Any]], predicted_key: str) -> dict[str, float]:
    """First/last ``WINDOW``-step means of reward and entropy, and the flow figures of one run."""
    reward, entropy = _values(records, "reward/mean"), _values(records, "entropy/mean")
    realized = _values(records, "flow/realized")
    width = min(WINDOW, len(reward))
    entropy_first, entropy_last = _mean(entropy[:width]), _mean(entropy[-width:])
    return {
        "reward_first": _mean(reward[:width]),
        "reward_last": _mean(reward[-width:]),
        "entropy_first": entropy_first,
        "entropy_last": entropy_last,
        "entropy_change": entropy_last / entropy_first - 1.0,
        "lambda_mean": _mean(_values(records, "flow/lambda")),
        "predicted_mean": _mean(_values(records, predicted_key)),
        "realized_mean": _mean(realized),
        "realized_negative": float(sum(x < 0 for x in realized)),
        "realized_steps": float(len(realized)),
    }


def targets_report(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> tuple[str, bool]:
    """The figures of ``runs`` (method → its metric records) as markdown, and whether strict
    GRPO met both targets."""
    lines = [
        f"| method | reward (first → last {WINDOW} steps) | entropy | entropy change | mean λ* "
        "| predicted net flow / step | realized ΔH / update (steps < 0) |",
        "|---|---|---|---|---|---|---|",
    ]
    figures = {}
    for method, records in runs.items():
        f = figures[method] = run_figures(records, PREDICTED.get(method, "flow/net"))
        lines.append(
            f"| {method} | {f['reward_first']:.3f} → {f['reward_last']:.3f} "
            f"| {f['entropy_first']:.3f} → {f['entropy_last']:.3f} "
            f"| {100 * f['entropy_change']:+.0f} % | {f['lambda_mean']:.2f} "
            f"| {f['predicted_mean']:+.3g} | {f['realized_mean']:+.2e} "
            f"({f['realized_negative']:.0f} of {f['realized_steps']:.0f}) |"
        )
    met = False
    if GRPO in figures:
        g = figures[GRPO]
        rise = g["reward_last"] - g["reward_first"]
        rise_ok, fall_ok = rise >= REWARD_RISE, g["entropy_change"] <= -ENTROPY_FALL
        met = rise_ok and fall_ok
        lines += [
            "",
            f"{GRPO} targets: reward rise {rise:+.3f} (target >= +{REWARD_RISE}: "
            f"{'met' if rise_ok else 'NOT met'}), entropy change "
            f"{100 * g['entropy_change']:+.0f} % (target <= -{100 * ENTROPY_FALL:.0f} %: "
            f"{'met' if fall_ok else 'NOT met'})",
        ]
    return "\n".join(lines) + "\n", met


def write_targets(root: Path, methods: Sequence[str]) -> str:
    """Read each method's ``root/<method>/metrics.jsonl``, write ``root/targets.md``; returns
    the markdown."""
    runs = {m: read_metrics(root / m / "metrics.jsonl") for m in methods}
    text, _ = targets_report(runs)
    (root / "targets.md").write_text(text)
    return text
