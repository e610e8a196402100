"""``opefo-probe``'s table and verdict from given figures (no model): every metric of every
estimator is shown, the weights are 1 ± λ*, and the verdict's regime follows |λ*|."""

from __future__ import annotations

import pytest

from opefo_nemo.probe.output import NEAR_GRPO, STRONG, document, table, verdict
from opefo_nemo.probe.step import ProbeResult


def _result(flows: dict[str, tuple[float, float]], signal: float = 0.75) -> ProbeResult:
    estimators = {}
    for name, (pos, neg) in flows.items():
        lam = (neg - pos) / (neg + pos) if pos + neg else 0.0
        estimators[name] = {"flow/pos": pos, "flow/neg": neg, "flow/lambda": lam, "x/own": 1.5}
    rollout = {"reward/mean": 0.2, "reward/group_signal_frac": signal}
    return ProbeResult(32, 8, "paper", rollout, estimators, {})


@pytest.mark.parametrize(
    ("pos", "neg", "words"),
    [
        (1000.0, 1001.0, "strict GRPO's within 0.0 %"),
        (1334.0, 1594.0, "moderate reweighting"),
        (100.0, 900.0, "reshapes the update"),
        (900.0, 100.0, "reshapes the update"),
    ],
)
def test_the_verdict_follows_the_size_of_lambda(pos, neg, words):
    result = _result({"paper": (pos, neg), "tabular": (pos, neg)})
    lam = (neg - pos) / (neg + pos)
    assert (abs(lam) < NEAR_GRPO, abs(lam) >= STRONG) == (
        "strict GRPO's" in words,
        "reshapes" in words,
    )
    text = verdict(result)
    assert words in text
    assert f"w+ = 1 + λ* = {1 + lam:.3f}, w- = 1 - λ* = {1 - lam:.3f}" in text
    side = "(N > P)" if neg > pos else "(P > N)"
    assert side in text and "agree on the sign" in text


def test_disagreeing_estimators_sparse_signal_and_no_flow_are_said():
    text = verdict(_result({"paper": (1.0, 3.0), "tabular": (3.0, 1.0)}, signal=0.125))
    assert "disagree on the sign" in text and "Only 12 % of the groups" in text
    assert "no method learns from this batch" in verdict(_result({"paper": (0.0, 0.0)}))


def test_the_reweighting_split_and_shift_are_said():
    result = _result({"paper": (100.0, 300.0)})
    result.estimators["paper"].update(
        {
            "flow/neg_adv_pos": 225.0,
            "flow/lambda_applied": 0.5,
            "flow/adv_shift": -0.0123,
            "flow/adv_shift_confident": -0.5,
            "flow/confident_tokens": 0.42,
        }
    )
    text = verdict(result)
    assert "75 % of N comes from responses with A > 0" in text and "25 % from A < 0" in text
    assert "by -1.2 % of Σ|A| over all tokens and -50.0 % over the confident ones" in text
    assert "(42 % of the tokens)" in text
    assert "shift the update" not in verdict(_result({"paper": (100.0, 300.0)}))


def test_the_table_shows_every_metric_and_the_weights():
    result = _result({"paper": (1334.0, 1594.0), "expectation": (10.0, 30.0)})
    text = table(result)
    for name in ("flow/pos", "flow/neg", "flow/lambda", "x/own", "reward/group_signal_frac"):
        assert name in text
    lam = (1594.0 - 1334.0) / (1594.0 + 1334.0)
    assert f"{1 + lam:.4g}" in text and f"{1 - lam:.4g}" in text and "paper*" in text
    doc = document(result, ["a=1"], {"method": "opefo"})
    assert doc["estimators"] == result.estimators and doc["verdict"] == verdict(result)


def test_the_table_shows_the_batch_layouts_cost():
    """``perf/*`` of the batch as the update would lay it out (spec §11), in the rollout rows."""
    result = _result({"paper": (1.0, 3.0)})
    result.rollout.update(
        {"perf/pad_fraction": 0.0412, "perf/dp_imbalance": 1.0031, "perf/micro_batches": 16.0}
    )
    lines = table(result).splitlines()
    for name, shown in (
        ("perf/pad_fraction", "0.0412"),
        ("perf/dp_imbalance", "1.003"),
        ("perf/micro_batches", "16"),
    ):
        (line,) = [line for line in lines if name in line]
        assert line.split() == [name, shown]
