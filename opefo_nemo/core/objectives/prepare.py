"""Phase 2 of a step: global sums → per-token coefficients (docs/architecture.md, spec §2–§5).

:func:`prepare` receives *all* of this rank's phase-1 chunks and a reducer that makes the sums
global, so a λ* or a Clip-Cov / KL-Cov selection cannot come from one micro-batch by accident:
there is no default reducer, and one call covers the whole optimizer-step batch.
Communication: one ``reducer.sum`` of a fixed set of sums; selection methods add one
``reducer.top_k``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..entropy_flow import balance, delta_entropy, flow_sums, lambda_star, side_weights
from ..metrics import add_sums, flow_metrics
from ..reduction import BatchReducer, local_top_k, select
from .config import MethodConfig
from .registry import get_objective
from .selection import covariance, selection_count, selection_scores
from .tokens import Coefficients, TokenChunk


@dataclass(frozen=True)
class Prepared:
    """Coefficients of every chunk (same order as given) and the step's global statistics.

    ``n_tokens``: the global count of valid tokens, the loss denominator of spec §5.
    ``sums``: the global sums (0-d float64). ``metrics``: spec §6 flow metrics.
    """

    coefficients: list[Coefficients]
    n_tokens: int
    lambda_star: float
    sums: dict[str, Tensor]
    metrics: dict[str, float]


def local_sums(chunk: TokenChunk, delta_h: Tensor) -> dict[str, Tensor]:
    """This chunk's share of every global sum ``prepare`` needs (0-d float64 each)."""
    mask = chunk.mask
    pos, neg = flow_sums(delta_h, mask)
    return {
        "tokens": mask.sum().double(),
        "entropy": (chunk.entropy.double() * mask).sum(),
        "flow_pos": pos,
        "flow_neg": neg,
        "count_pos": (mask & (delta_h > 0)).sum().double(),
        "count_neg": (mask & (delta_h < 0)).sum().double(),
        "advantages": (chunk.advantages.double() * mask).sum(),
        "logprob": (chunk.logprob.double() * mask).sum(),
    }


@torch.no_grad()
def prepare(
    config: MethodConfig,
    chunks: Sequence[TokenChunk],
    reducer: BatchReducer,
    *,
    seed: int = 0,
) -> Prepared:
    """Per-token coefficients for every chunk of this rank, from sums over the whole batch.

    ``chunks``: all of this rank's chunks of the optimizer-step batch (possibly empty of valid
    tokens, never of chunks). ``reducer``: a ``BatchReducer``; the engines give every rank the
    whole batch's statistics, so the trainer passes
    :class:`~opefo_nemo.core.reduction.SingleProcessReducer`.
    ``seed``: the Clip-Cov random subset's seed (vary it per step).
    """
    if not isinstance(reducer, BatchReducer):
        raise TypeError(
            "prepare needs a BatchReducer: SingleProcessReducer() when this process holds the "
            "whole batch's statistics"
        )
    if isinstance(chunks, TokenChunk) or not chunks:
        raise TypeError("prepare takes a non-empty sequence of TokenChunk (all of this rank's)")
    objective = get_objective(config.name)
    flow = config.entropy_flow

    delta_hs = [
        delta_entropy(c.logprob, c.entropy, c.advantages, flow.estimator, c.sum_p2, c.sum_p2_logp)
        for c in chunks
    ]
    local: dict[str, Tensor] = {}
    for chunk, delta_h in zip(chunks, delta_hs, strict=True):
        local = add_sums(local, local_sums(chunk, delta_h))
    sums = reducer.sum(local)
    n_tokens = round(float(sums["tokens"]))
    if n_tokens == 0:
        raise ValueError("the optimizer-step batch has no valid response token (mask is all False)")

    lam_star = lambda_star(sums["flow_pos"], sums["flow_neg"])
    side_sums = (sums["flow_pos"], sums["flow_neg"])
    _, w_pos, w_neg = side_weights(*side_sums, objective.balance, flow.static_lambda)
    weights = [
        balance(delta_h, chunk.mask, *side_sums, objective.balance, flow.static_lambda)[0]
        for chunk, delta_h in zip(chunks, delta_hs, strict=True)
    ]

    selected = [torch.zeros_like(c.mask) for c in chunks]
    if objective.selection is not None:
        selected = _select(objective.selection, config, chunks, sums, n_tokens, reducer, seed)

    coefficients = [
        Coefficients(delta_h=dh, weight=w, selected=s)
        for dh, w, s in zip(delta_hs, weights, selected, strict=True)
    ]
    metrics = flow_metrics(sums, lam_star, w_pos, w_neg)
    return Prepared(coefficients, n_tokens, float(lam_star), sums, metrics)


def _select(
    kind: str,
    config: MethodConfig,
    chunks: Sequence[TokenChunk],
    sums: dict[str, Tensor],
    n_tokens: int,
    reducer: BatchReducer,
    seed: int,
) -> list[Tensor]:
    """Global top-k selection of spec §5 (one ``reducer.top_k``) mapped back onto each chunk."""
    adv_mean = float(sums["advantages"]) / n_tokens
    logprob_mean = float(sums["logprob"]) / n_tokens
    k = selection_count(kind, n_tokens, config)
    scores, ids = [], []
    for chunk in chunks:
        if chunk.token_ids is None:
            raise ValueError(f"{kind} needs TokenChunk.token_ids (unique global token ids)")
        cov = covariance(chunk, adv_mean, logprob_mean)
        scores.append(selection_scores(kind, chunk, cov, config, seed))
        ids.append(chunk.token_ids.to(torch.int64))
    flat_scores = torch.cat([s.reshape(-1) for s in scores])
    flat_ids = torch.cat([i.reshape(-1) for i in ids])
    candidate = flat_scores > float("-inf")
    top_scores, top_ids = local_top_k(flat_scores[candidate], flat_ids[candidate], k)
    threshold = reducer.top_k(top_scores, top_ids, k)
    return [select(s, i, threshold) for s, i in zip(scores, ids, strict=True)]
