"""How batch-level statistics are reduced: the contract between core/ and whoever communicates.
core/ never communicates; it asks a :class:`BatchReducer` for the two global operations an
objective's coefficients (λ*, the Clip-Cov / KL-Cov selections; spec §3, §5) need.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor


@dataclass(frozen=True)
class Threshold:
    """The k-th (score, key) pair of a top-k selection; a token is selected if it sorts no later."""

    score: float
    key: int


@runtime_checkable
class BatchReducer(Protocol):
    """The global operations an objective needs; every method is collective over the ranks."""

    def sum(self, sums: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Sum each named 0-d float64 tensor over all ranks (one packed all-reduce in
        ``parallel/``); same keys, same order on every rank."""
        ...

    def top_k(self, scores: Tensor, keys: Tensor, k: int) -> Threshold | None:
        """k-th (score, key) of the union of all ranks' candidates; ``None`` if there are none.
        The order is total and layout-independent, so a top-k selection is the same tokens
        whatever the layout: higher score first; among equal scores, the smaller key first.

        ``scores`` float64 ``[n]``, ``keys`` int64 ``[n]`` (unique global token ids). If the union
        holds fewer than ``k`` candidates, the last one is returned (all are selected).
        """
        ...


def local_top_k(scores: Tensor, keys: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The first ``min(k, n)`` candidates in the selection order, as (scores, keys), sorted.

    Sorting by key first and then stably by descending score realises the total order
    (score desc, key asc). ``scores``/``keys`` have shape ``[n]``; the result ``[min(k, n)]``.
    """
    if scores.shape != keys.shape or scores.dim() != 1:
        raise ValueError(
            f"top-k candidates need 1-d scores and keys of equal shape, got {tuple(scores.shape)} "
            f"and {tuple(keys.shape)}"
        )
    by_key = torch.argsort(keys, stable=True)
    order = by_key[torch.argsort(scores[by_key], descending=True, stable=True)]
    order = order[: max(k, 0)]
    return scores[order], keys[order]


def top_k_threshold(scores: Tensor, keys: Tensor, k: int) -> Threshold | None:
    """The k-th candidate of ``(scores, keys)`` in the selection order (the last if fewer than k).

    Returns ``None`` when there is no candidate or ``k <= 0``.
    """
    if k <= 0:
        return None
    top_scores, top_keys = local_top_k(scores, keys, k)
    if top_scores.numel() == 0:
        return None
    return Threshold(score=float(top_scores[-1]), key=int(top_keys[-1]))


def select(scores: Tensor, keys: Tensor, threshold: Threshold | None) -> Tensor:
    """Boolean mask of tokens that sort no later than ``threshold`` (none if it is ``None``).

    Scores equal to ``-inf`` mark non-candidates and are never selected.
    """
    if threshold is None:
        return torch.zeros_like(scores, dtype=torch.bool)
    t_score = torch.tensor(threshold.score, dtype=scores.dtype, device=scores.device)
    before = (scores > t_score) | ((scores == t_score) & (keys <= threshold.key))
    return before & (scores > float("-inf"))


class SingleProcessReducer:
    """Reducer for a batch held entirely by this process (one rank, all micro-batches local)."""

    def sum(self, sums: Mapping[str, Tensor]) -> dict[str, Tensor]:
        return {name: value.to(torch.float64) for name, value in sums.items()}

    def top_k(self, scores: Tensor, keys: Tensor, k: int) -> Threshold | None:
        return top_k_threshold(scores, keys, k)
