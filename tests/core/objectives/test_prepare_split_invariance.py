"""spec §3 invariants under any split of the batch into chunks (micro-batches or ranks).

Property-based: the same batch cut at random places must give identical λ*, flow sums, token
count, weights, Clip-Cov / KL-Cov selections, STEER's batch-scope weights and total loss. STEER's
``scope: micro_batch`` maps each chunk on its own, as STEER's code does: its weights depend on the
cut, by design (the last test).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from opefo_nemo.core import SingleProcessReducer
from opefo_nemo.core.objectives import (
    TokenChunk,
    build_objective,
    method_config,
    policy_loss,
    prepare,
)
from opefo_nemo.core.objectives.tokens import LossInputs
from tests.metric_bounds import U32, assert_metrics_close, balanced_flow_bound

CONFIGS = [
    method_config({"name": "opefo", "entropy_flow": {"balance": "adaptive"}}),
    method_config(
        {"name": "opefo", "entropy_flow": {"balance": "adaptive", "estimator": "tabular"}}
    ),
    method_config({"name": "opefo", "entropy_flow": {"balance": "target", "target_entropy": 0.7}}),
    method_config({"name": "kl_cov", "updates_per_rollout": 4, "kl_cov": {"ratio": 0.05}}),
    method_config(
        {
            "name": "clip_cov",
            "updates_per_rollout": 4,
            "clip_cov": {"ratio": 0.05, "lb": -0.5, "ub": 1.0},
        }
    ),
    method_config({"name": "steer", "steer": {"scope": "batch"}}),
    method_config(
        {"name": "steer", "steer": {"scope": "batch", "mapping": "exponential", "weight_max": 1.0}}
    ),
]


def whole_batch(n: int, seed: int, zero_adv_fraction: float) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    probs = torch.rand(n, generator=g).clamp(1e-3, 1)
    adv = torch.randn(n, generator=g)
    adv[torch.rand(n, generator=g) < zero_adv_fraction] = 0.0
    s2 = probs.square() + torch.rand(n, generator=g) * 0.1
    s3 = probs.pow(3) + torch.rand(n, generator=g) * 0.05
    return {
        "logprob": probs.log(),
        "entropy": torch.rand(n, generator=g) * 2,
        "advantages": adv,
        "mask": torch.rand(n, generator=g) > 0.2,
        "old_logprob": probs.log() + torch.randn(n, generator=g) * 0.2,
        "token_ids": torch.randperm(n * 5, generator=g)[:n],
        "sum_p2": s2,
        "sum_p2_logp": s2 * probs.log(),
        "sum_p3": s3,
        "sum_p3_logp": s3 * probs.log(),
    }


def chunks_of(data: dict[str, torch.Tensor], cuts: list[int], strict: bool) -> list[TokenChunk]:
    bounds = [0, *sorted(set(cuts)), len(data["mask"])]
    chunks = []
    for lo, hi in itertools.pairwise(bounds):
        fields = {k: v[lo:hi] for k, v in data.items()}
        if strict:
            fields["old_logprob"] = None
        chunks.append(TokenChunk(**fields))
    return chunks


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(min_value=8, max_value=300),
    seed=st.integers(min_value=0, max_value=10_000),
    cut_fractions=st.lists(st.floats(min_value=0.01, max_value=0.99), max_size=6),
    config_index=st.integers(min_value=0, max_value=len(CONFIGS) - 1),
    zero_adv_fraction=st.sampled_from([0.0, 0.3, 1.0]),
)
def test_any_split_gives_the_same_coefficients_and_loss(
    n, seed, cut_fractions, config_index, zero_adv_fraction
):
    cfg = CONFIGS[config_index]
    data = whole_batch(n, seed, zero_adv_fraction)
    if not data["mask"].any():
        data["mask"][0] = True
    cuts = [max(1, min(n - 1, int(f * n))) for f in cut_fractions]
    strict = cfg.strict_on_policy
    objective = build_objective(cfg)
    one = prepare(objective, chunks_of(data, [], strict), SingleProcessReducer(), seed=seed)
    split_chunks = chunks_of(data, cuts, strict)
    many = prepare(build_objective(cfg), split_chunks, SingleProcessReducer(), seed=seed)

    assert many.n_tokens == one.n_tokens == int(data["mask"].sum())
    # λ* has scale 1; its float64 sums in two orders differ by n·u₆₄ ≤ u₃₂ relative
    assert many.lambda_star == pytest.approx(one.lambda_star, rel=0, abs=U32)
    assert -1.0 <= one.lambda_star <= 1.0
    for key in ("flow_pos", "flow_neg", "entropy"):
        assert float(many.sums[key]) == pytest.approx(float(one.sums[key]), rel=1e-9, abs=1e-12)
    # every spec §6 metric of prepare, the reweighting's included: the same up to the float64
    # round-off of adding the same terms in other groupings
    assert_metrics_close(many.metrics, one.metrics, rel=1e-9)
    for field in ("weight", "selected", "delta_h"):
        joined = torch.cat([getattr(c, field) for c in many.coefficients])
        assert torch.equal(joined, getattr(one.coefficients[0], field)), field

    pos, neg = float(one.sums["flow_pos"]), float(one.sums["flow_neg"])
    if cfg.name == "opefo" and cfg.entropy_flow.balance == "adaptive" and pos + neg > 0:
        assert (1 + one.lambda_star) * pos - (1 - one.lambda_star) * neg == pytest.approx(
            0.0, abs=1e-9 * (pos + neg)
        )
    if pos + neg == 0:
        assert one.lambda_star == 0.0

    full = policy_loss(
        objective,
        data["logprob"],
        data["advantages"],
        data["mask"],
        one.coefficients[0],
        one.n_tokens,
        old_logprob=None if strict else data["old_logprob"],
    ).loss
    parts = sum(
        policy_loss(
            objective,
            c.logprob,
            c.advantages,
            c.mask,
            coef,
            many.n_tokens,
            old_logprob=c.old_logprob,
        ).loss
        for c, coef in zip(split_chunks, many.coefficients, strict=True)
    )
    # fp32 sums of per-token losses of both signs in two orders: n·u₃₂ of Σ|ℓ_t| / n
    terms = _token_loss_terms(objective, data, one.coefficients[0], strict) / one.n_tokens
    assert float(parts) == pytest.approx(float(full), rel=0, abs=one.n_tokens * U32 * terms)


def _token_loss_terms(objective, data, coefficients, strict: bool) -> float:
    """``Σ_t |ℓ_t|`` over the valid tokens: the magnitude of the loss's terms."""
    logprob = data["logprob"]
    inputs = LossInputs(
        logprob=logprob,
        old_logprob=logprob if strict else data["old_logprob"],
        advantages=data["advantages"],
        weight=coefficients.weight,
        selected=coefficients.selected,
    )
    return float((objective.token_loss(inputs).double().abs() * data["mask"]).sum())


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(
        st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, width=32), min_size=1, max_size=50
    )
)
def test_lambda_star_is_bounded_and_zeroes_the_flow(values):
    from opefo_nemo.core import entropy_flow as ef

    dh = torch.tensor(values)
    mask = torch.ones_like(dh, dtype=torch.bool)
    pos, neg = ef.flow_sums(dh, mask)
    weights, lam = ef.balance(dh, mask, pos, neg, "adaptive")
    assert -1.0 <= float(lam) <= 1.0
    net = float((weights.double() * dh.double()).sum())
    if float(pos + neg) >= ef.LAMBDA_EPS:  # below eps, λ* is damped towards 0 by design
        bound = balanced_flow_bound({"flow/pos": float(pos), "flow/neg": float(neg)})
        assert abs(net) <= bound
    assert torch.all(weights[dh == 0] == 1.0)


def test_steer_micro_batch_scope_maps_each_chunk_on_its_own():
    """``scope: micro_batch``: each chunk's weights are those of that chunk prepared alone (with
    either scope), so they differ from the weights of the batch left whole."""
    data = whole_batch(200, seed=7, zero_adv_fraction=0.0)
    chunks = chunks_of(data, [50, 120], strict=False)
    per_chunk = build_objective(method_config({"name": "steer", "steer": {"scope": "micro_batch"}}))
    batch_scope = method_config({"name": "steer", "steer": {"scope": "batch"}})
    split = prepare(per_chunk, chunks, SingleProcessReducer()).coefficients
    for chunk, coefficients in zip(chunks, split, strict=True):
        alone = prepare(build_objective(batch_scope), [chunk], SingleProcessReducer())
        assert torch.equal(coefficients.weight, alone.coefficients[0].weight)
    whole = chunks_of(data, [], strict=False)
    unsplit = prepare(build_objective(batch_scope), whole, SingleProcessReducer()).coefficients[0]
    joined = torch.cat([c.weight for c in split])
    valid = data["mask"]
    assert not torch.equal(joined[valid], unsplit.weight[valid])
    assert torch.equal(
        prepare(per_chunk, whole, SingleProcessReducer()).coefficients[0].weight, unsplit.weight
    )
