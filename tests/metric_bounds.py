"""Bounds for comparing what two implementations compute, scaled by the terms behind each number.

Two implementations (engines, layouts, devices, thread counts) sum the same terms in other orders,
so each sum carries round-off of order ``ε · Σ|terms|``; a number that is a difference of sums
keeps that absolute error however small the difference is. So each comparison here is within
``rel`` of the magnitude of the *terms*, never of the value alone and never an absolute constant
(the rule is stated in tests/README.md).

Step metrics (spec §6), :func:`term_scale`:

- ``flow/net = P − N``, ``clip/dh_upper``, ``clip/dh_lower`` (ΔH summed over a subset of the
  tokens): terms ``P + N``;
- ``flow/net_after_balance = (1+λ*)P − (1−λ*)N`` (zero by construction for OPEFO): terms
  ``(1+|λ*|)(P + N)``;
- ``flow/lambda = (P − N)/(P + N)``, ``flow/lambda_applied``, ``flow/predictor_corr``: if ``P`` and
  ``N`` are each within ``δ`` relative, λ* moves by at most ``δ`` (``|∂λ/∂P|·P + |∂λ/∂N|·N =
  4PN/(P+N)² ≤ 1``), so their scale is 1 (a correlation is bounded by 1 likewise); so is that of
  the advantage shifts ``flow/adv_shift*`` (``Σ (w−1) A / Σ|A|``, a difference of terms of both
  signs, each ``|w − 1| ≤ 1``);
- ``flow/realized = H_after − H_before``: terms ``2·entropy/mean``;
- ``flow/drift = H_s − H_{s−1} − R_{s−1}`` (spec §6): the entropies of consecutive steps, of one
  magnitude, and the two of ``R``: terms ``4·entropy/mean``;
- ``fidelity/abs_logprob_diff``, ``fidelity/kl``: means of differences of the sampled tokens'
  log-probabilities, whose magnitude is ``E_y[−log π(y)] = H``: terms ``1 + entropy/mean`` nats;
- ``flow/adv_shift``, ``flow/adv_shift_confident`` (``Σ (w_t − 1) A_t / Σ |A_t|``, advantages of
  both signs): terms ``Σ |w_t A_t| / Σ |A_t| + 1 ≤ 1 + |λ*|`` for weights ``1 ± λ``;
- ``loss`` (``−Σ w_t A_t log π_t / n``, advantages of both signs): ``Σ|w_t A_t log π_t| / n``,
  which only the caller can form (:func:`loss_terms`); from a logged record alone, advantages of
  unit scale and ``E_y[−log π(y)] = H`` give ``(1+|λ*|)·entropy/mean`` (or ``|loss|`` if larger).

Every other metric is a ratio of positive sums or a count: its scale is its own magnitude.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

#: Unit round-off of fp32.
U32 = 2.0**-24

_FLOW_SUBSETS = ("flow/net", "clip/dh_upper", "clip/dh_lower")
_UNIT_SCALE = (
    "flow/lambda",
    "flow/lambda_applied",
    "flow/predictor_corr",
    "flow/adv_shift",
    "flow/adv_shift_confident",
)
_LOGPROB_DIFFERENCES = ("fidelity/abs_logprob_diff", "fidelity/kl")
#: What a step's layout costs (spec §11), not a number of the update
LAYOUT_METRICS = "perf/"


def term_scale(name: str, metrics: Mapping[str, float]) -> float:
    """The magnitude of the terms behind ``metrics[name]`` (module docstring)."""
    flows = abs(metrics.get("flow/pos", 0.0)) + abs(metrics.get("flow/neg", 0.0))
    lam = abs(metrics.get("flow/lambda", 0.0))
    entropy = abs(metrics.get("entropy/mean", 0.0))
    if name in _FLOW_SUBSETS:
        return flows
    if name == "flow/net_after_balance":
        return (1 + lam) * flows
    if name in _UNIT_SCALE:
        return 1.0
    if name in ("flow/adv_shift", "flow/adv_shift_confident"):
        return 1 + lam
    if name == "flow/realized":
        return 2 * entropy
    if name == "flow/drift":
        return 4 * entropy
    if name in _LOGPROB_DIFFERENCES:
        return 1 + entropy
    if name == "loss":
        return max(abs(metrics[name]), (1 + lam) * entropy)
    return abs(metrics[name])


def balanced_flow_bound(metrics: Mapping[str, float]) -> float:
    """Bound on ``|flow/net_after_balance|`` of one balanced (adaptive OPEFO) step, zero in exact
    arithmetic: the fp32 weights ``1 ± λ*`` are each rounded by at most ``u₃₂`` relative, which
    leaves ``u₃₂((1+λ*)P + (1−λ*)N) = u₃₂·4PN/(P+N) ≤ u₃₂(P+N)``; the float64 sums of ``n``
    tokens add ``n·u₆₄ ≤ u₃₂`` of the same terms (``n < 2²⁹``). Bound: ``2u₃₂(P + N)``."""
    return 2 * U32 * (abs(metrics["flow/pos"]) + abs(metrics["flow/neg"]))


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
    the scale of the metrics it names); ``perf/*`` (spec §11) by name only: they describe the
    layout each implementation ran (its ranks, micro-batches and padding), not its numbers."""
    assert ours.keys() == want.keys(), sorted(set(ours) ^ set(want))
    for name, value in want.items():
        if name.startswith(LAYOUT_METRICS):
            continue
        scale = (scales or {}).get(name, term_scale(name, want))
        bound = rel * scale
        assert abs(ours[name] - value) <= bound, (
            f"{name}: {ours[name]!r} vs {value!r}, bound {bound:.3g} ({rel:g} × terms {scale:.3g})"
        )


def assert_close_to_scale(got: torch.Tensor, want: torch.Tensor, rel: float, msg: str = "") -> None:
    """Every element of ``got`` within ``rel × max|want|`` of ``want``: each element of a tensor
    computed by sums (a matmul, a backward pass) carries round-off of the magnitude of the
    tensor's terms, also where its own exact value is near 0."""
    assert got.shape == want.shape, (msg, got.shape, want.shape)
    scale = float(want.double().abs().max()) if want.numel() else 0.0
    bound = rel * scale
    error = float((got.double() - want.double()).abs().max()) if want.numel() else 0.0
    assert error <= bound, f"{msg}: max |difference| {error:.3g} > {rel:g} × {scale:.3g}"


def assert_grads_close(
    got: Mapping[str, torch.Tensor], want: Mapping[str, torch.Tensor], rel: float
) -> None:
    """The same parameter names, each gradient within ``rel`` of the magnitude of its terms: the
    largest ``|want|`` of the tensor, and for a ``bias`` that of its layer's ``weight`` too (a
    bias's gradient sums the same back-propagated terms as its weight's without the normalised
    input factor, and can be zero in exact arithmetic, as an attention key bias's is)."""
    assert got.keys() == want.keys(), sorted(set(got) ^ set(want))
    for name, grad in want.items():
        scale = float(grad.double().abs().max())
        if name.endswith("bias") and name[: -len("bias")] + "weight" in want:
            weight = want[name[: -len("bias")] + "weight"]
            scale = max(scale, float(weight.double().abs().max()))
        error = float((got[name].double() - grad.double()).abs().max())
        assert error <= rel * scale, f"{name}: max |difference| {error:.3g} > {rel:g} × {scale:.3g}"


def assert_adam_first_step_close(
    got: Mapping[str, torch.Tensor],
    want: Mapping[str, torch.Tensor],
    got_grads: Mapping[str, torch.Tensor],
    want_grads: Mapping[str, torch.Tensor],
    lr: float,
    eps: float,
) -> None:
    """Weights after one AdamW step from the same weights, each within what the step makes of
    the difference of the gradients it was given. The first step moves a weight by
    ``lr · f(g)``, ``f(g) = g / (|g| + ε)`` (bias-corrected ``m̂ = g``, ``√v̂ = |g|``; weight
    decay is the same on both sides), and ``|f′(ξ)| = ε / (|ξ| + ε)²``; between ``g`` and ``g′``
    ``|ξ| ≥ m`` (the smaller magnitude, 0 when the signs differ), so the weights differ by at
    most ``lr · |g − g′| · ε / (m + ε)²``, plus the fp32 rounding of each side's update (a few
    operations, ``8u₃₂·lr``) and of the weight it is added to (``2u₃₂|θ|``)."""
    assert got.keys() == want.keys() == got_grads.keys() == want_grads.keys()
    for name, weight in want.items():
        g, h = got_grads[name].double(), want_grads[name].double()
        smaller = torch.where(g * h > 0, torch.minimum(g.abs(), h.abs()), torch.zeros_like(g))
        bound = lr * (g - h).abs() * eps / (smaller + eps) ** 2
        bound = bound + 8 * U32 * lr + 2 * U32 * weight.double().abs()
        excess = (got[name].double() - weight.double()).abs() - bound
        assert float(excess.max()) <= 0, f"{name}: exceeds its bound by {float(excess.max()):.3g}"
