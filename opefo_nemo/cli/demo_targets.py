"""The embedded demo's figures: what strict GRPO and OPEFO did, against the demo's targets, read
from each run's ``metrics.jsonl`` (spec §6) and written to ``targets.md`` beside them
(docs/training.md, "The embedded default").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from opefo_nemo.trainer.metrics_log import read_metrics

WINDOW = 10
"""Steps averaged at each end of a run: the means smooth the per-step noise (each step sees other
prompts)."""
EARLY_STEPS = 20
"""The steps whose mean |λ*| tells the regime the run starts in."""
# The demo's targets are properties of the task under strict GRPO (the paper's regime):
REWARD_RISE = 0.20
"""The least rise of the reward (absolute), first → last ``WINDOW`` steps."""
ENTROPY_FALL = 0.40
"""The least fall of the token-mean entropy (relative), first → last ``WINDOW`` steps."""
LAMBDA_REGIME = 0.2
"""The largest mean |λ*| over the first ``EARLY_STEPS`` steps."""
GRPO, OPEFO = "grpo_strict", "opefo"
PREDICTED = {GRPO: "flow/net", OPEFO: "flow/net_after_balance"}
"""The predicted net flow each update was built from, per step (Σ ΔH over the batch without the
learning rate, spec §2-§3): P − N for GRPO, (1+λ*)P − (1−λ*)N for OPEFO (zero by construction)."""


def _values(records: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in records if r.get(key) is not None]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def run_figures(records: Sequence[Mapping[str, Any]], predicted_key: str) -> dict[str, float]:
    """First/last ``WINDOW``-step means of reward and entropy, and the flow figures of one run:
    the mean |λ*| over the first ``EARLY_STEPS`` steps, the mean advantage shift of the confident
    tokens (``flow/adv_shift_confident``, spec §6), the predicted net flow (``predicted_key``)
    beside the realized entropy change of the same batch (``flow/realized``, after − before the
    update, every ``metrics.realized_every`` steps): its mean and how many steps it was
    negative."""
    reward, entropy = _values(records, "reward/mean"), _values(records, "entropy/mean")
    realized = _values(records, "flow/realized")
    width = min(WINDOW, len(reward))
    entropy_first, entropy_last = _mean(entropy[:width]), _mean(entropy[-width:])
    early = [abs(x) for x in _values(records, "flow/lambda")[:EARLY_STEPS]]
    return {
        "reward_first": _mean(reward[:width]),
        "reward_last": _mean(reward[-width:]),
        "entropy_first": entropy_first,
        "entropy_last": entropy_last,
        "entropy_change": entropy_last / entropy_first - 1.0,
        "lambda_mean": _mean(_values(records, "flow/lambda")),
        "lambda_early": _mean(early),
        "confident_shift": _mean(_values(records, "flow/adv_shift_confident")),
        "predicted_mean": _mean(_values(records, predicted_key)),
        "realized_mean": _mean(realized),
        "realized_negative": float(sum(x < 0 for x in realized)),
        "realized_steps": float(len(realized)),
    }


def targets_report(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> tuple[str, bool]:
    """The figures of ``runs`` (method → its metric records) as markdown, and whether strict
    GRPO met all three targets."""
    lines = [
        f"| method | reward (first → last {WINDOW} steps) | entropy | entropy change | mean λ* "
        f"| mean \\|λ*\\| steps 1–{EARLY_STEPS} | confident shift "
        "| predicted net flow / step | realized ΔH / update (steps < 0) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    figures = {}
    for method, records in runs.items():
        f = figures[method] = run_figures(records, PREDICTED.get(method, "flow/net"))
        lines.append(
            f"| {method} | {f['reward_first']:.3f} → {f['reward_last']:.3f} "
            f"| {f['entropy_first']:.3f} → {f['entropy_last']:.3f} "
            f"| {100 * f['entropy_change']:+.0f} % | {f['lambda_mean']:.2f} "
            f"| {f['lambda_early']:.2f} | {f['confident_shift']:+.2f} "
            f"| {f['predicted_mean']:+.3g} | {f['realized_mean']:+.2e} "
            f"({f['realized_negative']:.0f} of {f['realized_steps']:.0f}) |"
        )
    met = False
    if GRPO in figures:
        g = figures[GRPO]
        rise = g["reward_last"] - g["reward_first"]
        rise_ok, fall_ok = rise >= REWARD_RISE, g["entropy_change"] <= -ENTROPY_FALL
        regime_ok = g["lambda_early"] <= LAMBDA_REGIME
        met = rise_ok and fall_ok and regime_ok
        lines += [
            "",
            f"{GRPO} targets: reward rise {rise:+.3f} (target >= +{REWARD_RISE}: "
            f"{_verdict(rise_ok)}), entropy change {100 * g['entropy_change']:+.0f} % (target "
            f"<= -{100 * ENTROPY_FALL:.0f} %: {_verdict(fall_ok)}), mean |λ*| over steps "
            f"1–{EARLY_STEPS} {g['lambda_early']:.2f} (target <= {LAMBDA_REGIME}: "
            f"{_verdict(regime_ok)})",
        ]
    return "\n".join(lines) + "\n", met


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def write_targets(root: Path, methods: Sequence[str]) -> str:
    """Read each method's ``root/<method>/metrics.jsonl``, write ``root/targets.md``; returns
    the markdown."""
    runs = {m: read_metrics(root / m / "metrics.jsonl") for m in methods}
    text, _ = targets_report(runs)
    (root / "targets.md").write_text(text)
    return text
