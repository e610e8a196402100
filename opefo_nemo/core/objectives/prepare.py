"""Phase 2 of a step: global sums → per-token coefficients, the same for every method, over the
whole optimizer-step batch (docs/architecture.md, "The step: three phases"; spec §2–§5).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from opefo_nemo.core.entropy_flow import delta_entropy, flow_sums, lambda_star
from opefo_nemo.core.metrics import add_sums, flow_metrics
from opefo_nemo.core.objectives.base import BatchStatistics, Objective
from opefo_nemo.core.objectives.tokens import Coefficients, TokenChunk
from opefo_nemo.core.reduction import BatchReducer
from opefo_nemo.core.reweighting import (
    DEFAULT_CONFIDENT_PROB,
    SPLIT_SUMS,
    reweighting_metrics,
    shift_sums,
    split_sums,
)

#: The sums every method's phase 2 computes (keys an objective's own sums must not reuse).
COMMON_SUMS = (
    "tokens",
    "entropy",
    "flow_pos",
    "flow_neg",
    "count_pos",
    "count_neg",
    *SPLIT_SUMS,
)


@dataclass(frozen=True)
class Prepared:
    """Coefficients of every chunk (same order as given) and the step's global statistics.

    ``n_tokens``: the global count of valid tokens, the loss denominator of spec §5.
    ``sums``: the global sums (0-d float64). ``metrics``: spec §6 flow metrics and the
    objective's own. ``update_target``: the first-order entropy change the engine must correct
    the applied update to (``Objective.update_target``), ``None`` for no correction.
    """

    coefficients: list[Coefficients]
    n_tokens: int
    lambda_star: float
    sums: dict[str, Tensor]
    metrics: dict[str, float]
    update_target: float | None = None


def common_sums(chunk: TokenChunk, delta_h: Tensor, confident_prob: float) -> dict[str, Tensor]:
    """This chunk's share of :data:`COMMON_SUMS` (0-d float64 each)."""
    mask = chunk.mask
    pos, neg = flow_sums(delta_h, mask)
    return {
        "tokens": mask.sum().double(),
        "entropy": (chunk.entropy.double() * mask).sum(),
        "flow_pos": pos,
        "flow_neg": neg,
        "count_pos": (mask & (delta_h > 0)).sum().double(),
        "count_neg": (mask & (delta_h < 0)).sum().double(),
        **split_sums(delta_h, chunk.advantages, chunk.logprob, mask, confident_prob),
    }


def chunk_delta_entropy(chunk: TokenChunk, estimator: str) -> Tensor:
    """ΔH_t of every token of ``chunk`` with ``estimator`` (spec §2)."""
    return delta_entropy(
        chunk.logprob,
        chunk.entropy,
        chunk.advantages,
        estimator,
        sum_p2=chunk.sum_p2,
        sum_p2_logp=chunk.sum_p2_logp,
        sum_p3=chunk.sum_p3,
        sum_p3_logp=chunk.sum_p3_logp,
    )


@torch.no_grad()
def prepare(
    objective: Objective,
    chunks: Sequence[TokenChunk],
    reducer: BatchReducer,
    *,
    seed: int = 0,
    confident_prob: float = DEFAULT_CONFIDENT_PROB,
) -> Prepared:
    """Per-token coefficients for every chunk of this rank, from sums over the whole batch: ΔH
    with the configured estimator; the common sums (among them the flows split by the sign of
    the advantage and the confident tokens' sums, :mod:`..reweighting`) plus the objective's own
    in one ``reducer.sum``; the objective's coefficients (a selection adds its ``reducer.top_k``);
    one more ``reducer.sum`` of what the applied weights do (the predicted net flow after
    weighting ``Σ_t w_t ΔH_t``, the advantage shift ``Σ_t (w_t − 1) A_t``). There is no default
    reducer and one call covers the whole optimizer-step batch, so a λ* or a selection cannot
    come from one micro-batch by accident.

    ``chunks``: all of this rank's chunks of the optimizer-step batch (possibly empty of valid
    tokens, never of chunks). ``reducer``: a ``BatchReducer``; the engines give every rank the
    whole batch's statistics, so the trainer passes
    :class:`~opefo_nemo.core.reduction.SingleProcessReducer`.
    ``seed``: the seed of a method's randomness (Clip-Cov's subset; vary it per step).
    ``confident_prob``: a token with ``π(y_t)`` above it is confident (``flow/confident_*`` and
    ``flow/adv_shift_confident``, spec §6).
    """
    if not isinstance(reducer, BatchReducer):
        raise TypeError(
            "prepare needs a BatchReducer: SingleProcessReducer() when this process holds the "
            "whole batch's statistics"
        )
    if isinstance(chunks, TokenChunk) or not chunks:
        raise TypeError("prepare takes a non-empty sequence of TokenChunk (all of this rank's)")
    if not 0 < confident_prob < 1:
        raise ValueError(f"confident_prob must lie in (0, 1), got {confident_prob}")
    estimator = objective.config.entropy_flow.estimator
    delta_hs = [chunk_delta_entropy(c, estimator) for c in chunks]
    local: dict[str, Tensor] = {}
    for chunk, delta_h in zip(chunks, delta_hs, strict=True):
        own = objective.local_sums(chunk, delta_h)
        clash = sorted(set(own) & set(COMMON_SUMS))
        if clash:
            raise ValueError(f"method {objective.config.name!r} reuses common sum names {clash}")
        local = add_sums(local, {**common_sums(chunk, delta_h, confident_prob), **own})
    sums = reducer.sum(local)
    n_tokens = round(float(sums["tokens"]))
    if n_tokens == 0:
        raise ValueError("the optimizer-step batch has no valid response token (mask is all False)")

    lam_star = float(lambda_star(sums["flow_pos"], sums["flow_neg"]))
    batch = BatchStatistics(chunks, delta_hs, sums, n_tokens, lam_star)
    coefficients = objective.coefficients(batch, reducer, seed)
    applied = reducer.sum(_applied_sums(chunks, coefficients, confident_prob))
    metrics = flow_metrics(sums, lam_star, float(applied["net_after_balance"]))
    metrics.update(reweighting_metrics(sums, applied))
    target = objective.update_target(batch)
    metrics.update(objective.metrics(batch))
    return Prepared(coefficients, n_tokens, lam_star, dict(sums), metrics, target)


def _applied_sums(
    chunks: Sequence[TokenChunk], coefficients: Sequence[Coefficients], confident_prob: float
) -> dict[str, Tensor]:
    """This rank's sums of what the applied weights do: ``net_after_balance = Σ_t w_t ΔH_t``
    (the predicted net flow after weighting) and the advantage shifts of :func:`shift_sums`."""
    total: dict[str, Tensor] = {}
    for chunk, c in zip(chunks, coefficients, strict=True):
        net = (c.weight.double() * c.delta_h.double() * chunk.mask).sum()
        shifts = shift_sums(c.weight, chunk.advantages, chunk.logprob, chunk.mask, confident_prob)
        total = add_sums(total, {"net_after_balance": net, **shifts})
    return total
