"""The entropy-neutral correction's arithmetic (core/update_correction.py), the trainer's
correction (trainer/update.py) of an engine's tensors (engines/entropy_correction.py) against
float64 brute force, and the ``entropy_neutral`` method's targets, state and settings."""

from __future__ import annotations

import math

import pytest
import torch

from opefo_nemo.config import load_method
from opefo_nemo.core import SingleProcessReducer
from opefo_nemo.core.objectives import TokenChunk, build_objective, method_config, prepare
from opefo_nemo.core.update_correction import CorrectionResult, correction_size, dot64
from opefo_nemo.engines.entropy_correction import CapturedEntropyGradient, on_one_device
from opefo_nemo.trainer.update import correct_update

from .chunks import batch

FP32_EPS = torch.finfo(torch.float32).eps


def _tensors(seed: int, shapes=((7, 5), (13,), (3, 4, 2))) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator) for shape in shapes]


def test_dot64_is_the_float64_sum_of_exact_products(monkeypatch):
    from opefo_nemo.core import update_correction

    monkeypatch.setattr(update_correction, "DOT_SLICE", 64)  # several slices
    a, b = _tensors(0, ((37, 11),))[0], _tensors(1, ((37, 11),))[0]
    exact = math.fsum(
        x * y for x, y in zip(a.flatten().tolist(), b.flatten().tolist(), strict=True)
    )
    got = dot64(a, b)
    assert got.dtype == torch.float64
    # fp32 × fp32 products are exact in float64: only the float64 sum rounds
    terms = float((a.double() * b.double()).abs().sum())
    assert abs(float(got) - exact) <= 16 * 2.0**-53 * terms
    with pytest.raises(ValueError, match="dot64 of shapes"):
        dot64(a, b.T)


def test_correction_size_solves_for_the_target():
    assert correction_size(0.3, 0.1, 4.0) == pytest.approx(0.05)
    assert correction_size(0.0, 2.0, 0.5) == pytest.approx(-4.0)
    assert correction_size(1.0, 2.0, 0.0) == 0.0  # no entropy gradient: nothing to correct along
    with pytest.raises(ValueError, match="must be finite and >= 0"):
        correction_size(0.0, 1.0, -1.0)


@pytest.mark.parametrize("target", [0.0, -3e-4])
def test_correction_equals_float64_brute_force_and_moves_replicas_alike(target):
    """After a simulated optimizer step (θ_before → θ_after), the correction's α, ``⟨g, Δθ⟩``,
    ``‖g‖`` and the corrected tensors equal the float64 brute force on explicit ``Δθ``; a
    replica that is not counted (a second copy of tensor 0) changes nothing in the sums and
    gets the same correction as its original."""
    before, grads = _tensors(2), _tensors(3)
    params = [t.clone() for t in before] + [before[0].clone()]
    published = []
    captured = CapturedEntropyGradient(
        params,
        [*grads, grads[0]],
        [True] * len(grads) + [False],
        on_one_device,
        lambda: published.append([p.clone() for p in params]),
    )
    with torch.no_grad():  # the optimizer's update, in fp32
        for param, step in zip(params, [*_tensors(4), _tensors(4)[0]], strict=True):
            param.add_(1e-3 * step)
    after = [p.clone() for p in params[: len(grads)]]  # the replica is not counted
    applied = [a.double() - b.double() for a, b in zip(after, before, strict=True)]  # exact Δθ
    flow = math.fsum(float((g.double() * d).sum()) for g, d in zip(grads, applied, strict=True))
    grad_sq = math.fsum(float(dot64(g, g)) for g in grads)
    alpha = (target - flow) / grad_sq
    result = correct_update(captured, target)

    # ⟨g, Δθ⟩ is a difference of two float64 dot products of fp32 values: exact up to float64
    # round-off of the larger sums Σ|g θ|
    terms = sum(
        float((g.double() * t.double()).abs().sum()) for g, t in zip(grads, after, strict=True)
    )
    assert abs(result.flow_before - flow) <= 64 * 2.0**-53 * terms
    assert result.alpha == pytest.approx(alpha, rel=1e-9)
    assert result.grad_norm == pytest.approx(math.sqrt(grad_sq), rel=1e-12)
    assert result.target == target
    # ⟨g, Δθ'⟩ measured on the fp32 corrected tensors: the target up to their rounding
    rounding = (
        sum(float((g.abs() * t.abs()).sum()) for g, t in zip(grads, after, strict=True)) * FP32_EPS
    )
    assert abs(result.flow_after - target) <= rounding
    for param, grad, whole in zip(params, [*grads, grads[0]], [*after, after[0]], strict=True):
        want = whole.double() + alpha * grad.double()
        torch.testing.assert_close(param.double(), want, rtol=FP32_EPS, atol=FP32_EPS * 1e-3)
    assert torch.equal(params[0], params[-1])
    # published once, after the move
    assert len(published) == 1
    assert all(torch.equal(p, q) for p, q in zip(published[0], params, strict=True))


def test_capture_refuses_mismatched_gradients():
    with pytest.raises(ValueError, match="entropy gradient of shape"):
        CapturedEntropyGradient([torch.zeros(3)], [torch.zeros(4)], [True], on_one_device)
    with pytest.raises(ValueError, match="1 parameters, 2 gradients"):
        CapturedEntropyGradient([torch.zeros(3)], [torch.zeros(3)] * 2, [True], on_one_device)


def test_result_metrics():
    result = CorrectionResult(
        target=0.0, flow_before=2e-4, flow_after=1e-12, alpha=-0.5, grad_norm=0.3
    )
    assert result.metrics() == {
        "correction/target": 0.0,
        "correction/flow_before": 2e-4,
        "correction/flow_after": 1e-12,
        "correction/alpha": -0.5,
        "correction/entropy_grad_norm": 0.3,
        "correction/norm": pytest.approx(0.15),
    }


def _chunk_with_entropy(seed: int, mean_entropy: float) -> TokenChunk:
    chunk = batch(n=80, seed=seed)
    entropy = torch.full_like(chunk.entropy, mean_entropy)
    return TokenChunk(chunk.logprob, entropy, chunk.advantages, chunk.mask)


def test_entropy_neutral_targets_weights_and_state():
    """Strict GRPO's weights (1) and flows; the update target is 0 (adaptive) or
    ``rate (H_target − H̄)`` with ``initial`` the first step's ``H̄``, kept across a resume."""
    adaptive = build_objective(load_method("entropy_neutral"))
    assert adaptive.corrects_update
    chunk = batch(seed=5)
    prepared = prepare(adaptive, [chunk], SingleProcessReducer())
    assert prepared.update_target == 0.0
    assert torch.equal(prepared.coefficients[0].weight, torch.ones_like(chunk.logprob))
    # weights 1: Σ ΔH against P − N, float64 sums of the same n terms in two orders
    terms = prepared.metrics["flow/pos"] + prepared.metrics["flow/neg"]
    bound = float(chunk.mask.sum()) * 2.0**-53 * terms
    assert prepared.metrics["flow/net_after_balance"] == pytest.approx(
        prepared.metrics["flow/net"], abs=bound
    )
    assert build_objective(load_method("grpo_strict")).corrects_update is False
    assert (
        prepare(
            build_objective(load_method("opefo")), [chunk], SingleProcessReducer()
        ).update_target
        is None
    )

    config = method_config(
        {"name": "entropy_neutral", "entropy_flow": {"balance": "target", "target_rate": 0.25}}
    )
    run = build_objective(config)
    first = prepare(run, [_chunk_with_entropy(1, 0.9)], SingleProcessReducer())
    assert first.update_target == pytest.approx(0.0, abs=1e-7)  # at the target
    assert first.metrics["flow/target_entropy"] == pytest.approx(0.9)
    resumed = build_objective(config)
    resumed.load_state_dict(run.state_dict())
    second = _chunk_with_entropy(2, 0.6)
    want = prepare(run, [second], SingleProcessReducer()).update_target
    got = prepare(resumed, [second], SingleProcessReducer()).update_target
    assert got == want == pytest.approx(0.25 * 0.3, rel=1e-6)  # fp32 copies of 0.9 and 0.6
    fixed = method_config(
        {"name": "entropy_neutral", "entropy_flow": {"balance": "target", "target_entropy": 1.0}}
    )
    objective = build_objective(fixed)
    assert objective.state_dict() == {}
    target = prepare(objective, [_chunk_with_entropy(3, 1.5)], SingleProcessReducer())
    assert target.update_target == pytest.approx(0.1 * -0.5)  # the default rate
