"""Comparing one update's metrics (spec §6) between two implementations of the same arithmetic.

Each metric is compared within ``rel`` of the magnitude of the terms it is computed from, not of
its own value. Two implementations (engines, layouts, devices) sum the same terms in other
orders, so each sum carries round-off of order ``ε · Σ|terms|``; a metric that is a difference of
sums keeps that absolute error however small the difference is:

- ``flow/net = P − N``: terms ``P + N``;
- ``flow/net_after_balance = (1+λ*)P − (1−λ*)N`` (zero by construction for OPEFO): terms
  ``(1+|λ*|)(P + N)``;
- ``flow/lambda = (P − N)/(P + N)``: if ``P`` and ``N`` are each within ``δ`` relative, λ* moves by
  at most ``δ`` (``|∂λ/∂P|·P + |∂λ/∂N|·N = 4PN/(P+N)² ≤ 1``), so its scale is 1; the same for
  ``flow/lambda_applied`` (λ* for the adaptive methods);
- ``flow/adv_shift``, ``flow/adv_shift_confident`` (``Σ (w_t − 1) A_t / Σ |A_t|``, advantages of
  both signs): terms ``Σ |w_t A_t| / Σ |A_t| + 1 ≤ 1 + |λ*|`` for weights ``1 ± λ``;
- ``loss`` (``−Σ w_t A_t log π_t / n``, advantages of both signs): ``Σ|w_t A_t log π_t| / n``,
  which only the caller can form (:func:`loss_terms`), else ``|loss|``.

Every other metric is a ratio of positive sums or a count: its scale is its own magnitude.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


def term_scale(name: str, metrics: Mapping[str, float]) -> float:
    """The magnitude of the terms behind ``metrics[name]`` (module docstring)."""
    flows = abs(metrics.get("flow/pos", 0.0)) + abs(metrics.get("flow/neg", 0.0))
    if name == "flow/net":
        return flows
    if name == "flow/net_after_balance":
        return (1 + abs(metrics.get("flow/lambda", 0.0))) * flows
    if name in ("flow/lambda", "flow/lambda_applied"):
        return 1.0
    if name in ("flow/adv_shift", "flow/adv_shift_confident"):
        return 1 + abs(metrics.get("flow/lambda", 0.0))
    return abs(metrics[name])


def loss_terms(
    logprob: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, lam: float
) -> float:
    """``(1+|λ*|) Σ_t |A_t log π_t| / n`` over the response tokens: a bound on the loss's terms
    (``logprob``, ``mask`` ``[B, T]``; ``advantages`` ``[B]``)."""
    terms = (advantages.double()[:, None] * logprob.double()).abs() * mask
    return float((1 + abs(lam)) * terms.sum() / mask.sum())


def assert_metrics_close(
    ours: Mapping[str, float],
    want: Mapping[str, float],
    rel: float,
    scales: Mapping[str, float] | None = None,
) -> None:
    """The same metric names, each within ``rel × term_scale`` of ``want`` (``scales`` replaces
    the scale of the metrics it names)."""
    assert ours.keys() == want.keys(), sorted(set(ours) ^ set(want))
    for name, value in want.items():
        scale = (scales or {}).get(name, term_scale(name, want))
        bound = rel * scale
        assert abs(ours[name] - value) <= bound, (
            f"{name}: {ours[name]!r} vs {value!r}, bound {bound:.3g} ({rel:g} × terms {scale:.3g})"
        )
