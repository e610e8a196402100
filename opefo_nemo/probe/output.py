"""``opefo-probe``'s output: the table, the verdict in plain words, and the JSON document (the
bands: docs/training.md, "Which regime is my run in?").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opefo_nemo.probe.group_flows import by_success_rate
from opefo_nemo.probe.step import ProbeResult

#: ``|λ*|`` below this: OPEFO's update is strict GRPO's within a few percent per token.
NEAR_GRPO = 0.05
#: ``|λ*|`` from this on: one side's terms are scaled by 1.3 or more, the other's by 0.7 or less.
STRONG = 0.3
ROLLOUT_ROWS = (
    "reward/mean",
    "reward/group_signal_frac",
    "reward/correct_frac",
    "reward/no_answer_frac",
    "response/length_mean",
    "response/clip_frac",
    "fidelity/abs_logprob_diff",
    "perf/pad_fraction",
    "perf/dp_imbalance",
    "perf/micro_batches",
)


def _number(value: float) -> str:
    return f"{value:.4g}"


def table(result: ProbeResult) -> str:
    """The rollout figures, then every ``prepare`` metric with one column per estimator, and
    the weights OPEFO would apply under each."""
    lines = [f"rollout batch: {result.prompts} prompts × {result.responses} responses"]
    for name in ROLLOUT_ROWS:
        if name in result.rollout:
            lines.append(f"  {name:<34}{_number(result.rollout[name]):>12}")
    lines.append(f"  {dynamic_sampling_line(result)}")
    estimators = list(result.estimators)
    header = "".join(f"{e + ('*' if e == result.configured else ''):>14}" for e in estimators)
    lines += ["", f"  {'ΔH estimator':<34}{header}"]
    names = list(dict.fromkeys(n for m in result.estimators.values() for n in m))
    rows: list[tuple[str, Sequence[float | None]]] = [
        (name, [result.estimators[e].get(name) for e in estimators]) for name in names
    ]
    lambdas = [result.estimators[e]["flow/lambda"] for e in estimators]
    rows += [("w+ = 1 + λ*", [1 + lam for lam in lambdas])]
    rows += [("w- = 1 - λ*", [1 - lam for lam in lambdas])]
    for name, values in rows:
        cells = "".join(f"{'-' if v is None else _number(v):>14}" for v in values)
        lines.append(f"  {name:<34}{cells}")
    lines.append(
        f"  (* the configured estimator, method.entropy_flow.estimator={result.configured})"
    )
    return "\n".join([*lines, "", success_rate_table(result)])


def dynamic_sampling_line(result: ProbeResult) -> str:
    """What dynamic sampling (``trainer.dynamic_sampling``) keeps: with it on, the groups it kept
    from the rounds it generated (the batch probed); off, the groups of this batch it would
    keep, those whose rewards differ."""
    rollout = result.rollout
    if "sampling/rounds" in rollout:
        generated = sum(
            rollout[f"sampling/groups_{kind}"] for kind in ("kept", "dropped", "surplus")
        )
        return (
            f"dynamic sampling kept {rollout['sampling/groups_kept']:.0f} groups with signal of "
            f"{generated:.0f} generated in {rollout['sampling/rounds']:.0f} round(s)"
        )
    return (
        f"dynamic sampling would keep {sum(result.signal)} of {len(result.signal)} groups "
        "(those whose rewards differ)"
    )


def success_rate_table(result: ProbeResult) -> str:
    """One row per success rate of the groups: how many groups, their summed P and N under the
    configured estimator, and λ* of those sums under every estimator ("-": no flow, undefined)."""
    estimators = list(result.groups)
    bins = {e: by_success_rate(result.groups[e]) for e in estimators}
    header = "".join(f"{'λ* ' + e:>16}" for e in estimators)
    lines = [
        f"by the groups' success rate (P, N: {result.configured}):",
        f"  {'success':>9}{'groups':>8}{'P':>12}{'N':>12}{header}",
    ]
    for flows in zip(*bins.values(), strict=True):
        shown = flows[estimators.index(result.configured)]
        cells = "".join(f"{_optional(f.lam):>16}" for f in flows)
        rate = f"{shown.correct}/{shown.responses}"
        lines.append(
            f"  {rate:>9}{shown.groups:>8}{_number(shown.pos):>12}{_number(shown.neg):>12}{cells}"
        )
    return "\n".join(lines)


def _optional(value: float | None) -> str:
    return "-" if value is None else _number(value)


def verdict(result: ProbeResult) -> str:
    """How far OPEFO's weights move the update, in words, from the configured estimator's λ*.
    OPEFO multiplies the policy-gradient term of every entropy-raising token (ΔH > 0) by
    ``w₊ = 1 + λ*`` and of every entropy-lowering one by ``w₋ = 1 − λ*`` (spec §3), so ``|λ*|``
    is how far, relatively, OPEFO moves any token's term away from strict GRPO's."""
    metrics = result.estimators[result.configured]
    lam = metrics["flow/lambda"]
    pos, neg = metrics["flow/pos"], metrics["flow/neg"]
    signal = result.rollout.get("reward/group_signal_frac")
    if pos + neg == 0:
        return (
            "No token has an entropy flow (every advantage is 0: no group's rewards differ), so "
            "λ* = 0 and no method learns from this batch. Raise the share of groups with signal "
            "(more responses per prompt, easier or harder prompts) before reading λ*."
        )
    size = abs(lam)
    weights = f"w+ = 1 + λ* = {1 + lam:.3f}, w- = 1 - λ* = {1 - lam:.3f}"
    if size < NEAR_GRPO:
        regime = (
            f"|λ*| = {size:.3f} < {NEAR_GRPO}: OPEFO's update is strict GRPO's within "
            f"{100 * size:.1f} % on every token ({weights}); the paper's regime "
            "(λ* ≈ 0.001 on Qwen2.5-Math-7B), where OPEFO only trims the entropy drift."
        )
    elif size < STRONG:
        regime = (
            f"|λ*| = {size:.3f}: OPEFO moves each token's term by {100 * size:.0f} % "
            f"({weights}): a moderate reweighting, close to the paper's side."
        )
    else:
        regime = (
            f"|λ*| = {size:.3f} ≥ {STRONG}: OPEFO reshapes the update ({weights}); one side's "
            "terms are nearly switched off. On the embedded toy (λ* ≈ 0.8) this unlearns what "
            "the policy knows (docs/studies/demo.md): try a short run of both methods before a "
            "long one."
        )
    direction = (
        "entropy-lowering tokens dominate (N > P): strict GRPO would lower the entropy and "
        "OPEFO favours the entropy-raising side"
        if lam > 0
        else "entropy-raising tokens dominate (P > N): strict GRPO would raise the entropy and "
        "OPEFO favours the entropy-lowering side"
    )
    signs = {_sign(m["flow/lambda"]) for m in result.estimators.values()}
    agreement = (
        "The three ΔH estimators agree on the sign of λ*."
        if len(signs) == 1
        else "The ΔH estimators disagree on the sign of λ*: the balance is fragile here; compare "
        "their columns."
    )
    shift = _shift(metrics)
    sparse = (
        f" Only {100 * signal:.0f} % of the groups have rewards that differ; the others add "
        "nothing to any update."
        if signal is not None and signal < 0.25
        else ""
    )
    return f"{regime} Here {direction}. {_source(metrics, lam)}{shift}{agreement}{sparse}"


def _source(metrics: Mapping[str, float], lam: float) -> str:
    """Which sign of the advantage the dominant side's flow comes from (spec §6's split)."""
    side, total = ("neg", metrics["flow/neg"]) if lam > 0 else ("pos", metrics["flow/pos"])
    from_positive = metrics.get(f"flow/{side}_adv_pos")
    if from_positive is None or total <= 0:
        return ""
    share = from_positive / total
    name = "N" if side == "neg" else "P"
    return (
        f"{100 * share:.0f} % of {name} comes from responses with A > 0 "
        f"(rewarded ones), {100 * (1 - share):.0f} % from A < 0. "
    )


def _shift(metrics: Mapping[str, float]) -> str:
    """The advantage shift of the weights the configured method applies, over all tokens and
    over the confident ones (spec §6), when the method applies weights."""
    if "flow/adv_shift" not in metrics or "flow/lambda_applied" not in metrics:
        return ""
    return (
        f"Its weights shift the update by {100 * metrics['flow/adv_shift']:+.1f} % of Σ|A| "
        f"over all tokens and {100 * metrics['flow/adv_shift_confident']:+.1f} % over the "
        f"confident ones ({100 * metrics['flow/confident_tokens']:.0f} % of the tokens). "
    )


def _sign(value: float) -> int:
    return (value > 0) - (value < 0)


def document(
    result: ProbeResult, overrides: Sequence[str], settings: Mapping[str, Any]
) -> dict[str, Any]:
    """The JSON document: the overrides and settings that made the batch, the figures, what
    dynamic sampling keeps, the verdict."""
    configured = result.groups.get(result.configured, [])  # none without per-group flows
    return {
        "overrides": list(overrides),
        "settings": dict(settings),
        "prompts": result.prompts,
        "responses_per_prompt": result.responses,
        "configured_estimator": result.configured,
        "rollout": result.rollout,
        "dynamic_sampling": {
            "enabled": "sampling/rounds" in result.rollout,
            "summary": dynamic_sampling_line(result),
            "groups_with_signal": [
                flow.prompt for flow, kept in zip(configured, result.signal, strict=True) if kept
            ],
        },
        "estimators": result.estimators,
        "groups": {
            estimator: {
                "groups": [g.as_dict() for g in groups],
                "by_success_rate": [f.as_dict() for f in by_success_rate(groups)],
            }
            for estimator, groups in result.groups.items()
        },
        "verdict": verdict(result),
    }
