"""``opefo-probe``'s flows per group and per success rate: each prompt's share of P and N, from
the ΔH ``prepare`` computed, and λ* over the groups of each success rate (docs/training.md,
"Which regime is my run in?").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from opefo_nemo.core.entropy_flow import group_flow_sums, lambda_star
from opefo_nemo.core.objectives import Prepared, TokenChunk


def _lambda(pos: float, neg: float) -> float | None:
    """λ* of flow sums; ``None`` where there is no flow (``P + N = 0``), where it is undefined."""
    return float(lambda_star(pos, neg)) if pos + neg > 0 else None


@dataclass(frozen=True)
class Flows:
    """``correct`` of ``responses`` counted correct by the verifier, with their share ``pos`` of
    P and ``neg`` of N."""

    correct: int
    responses: int
    pos: float
    neg: float

    @property
    def success_rate(self) -> float:
        return self.correct / self.responses

    @property
    def lam(self) -> float | None:
        return _lambda(self.pos, self.neg)

    def as_dict(self) -> dict[str, Any]:
        """The fields, ``success_rate`` and ``lambda`` (``None`` where undefined): JSON-ready."""
        return {**asdict(self), "success_rate": self.success_rate, "lambda": self.lam}


@dataclass(frozen=True)
class GroupFlow(Flows):
    """One group: ``prompt``, its index in the batch, and its responses' flows."""

    prompt: int


@dataclass(frozen=True)
class SuccessRateFlow(Flows):
    """The ``groups`` groups whose success rate is ``correct / responses``, their flows summed."""

    groups: int


def group_flows(
    chunks: Sequence[TokenChunk], prepared: Prepared, group_ids: Tensor, correct: Tensor
) -> list[GroupFlow]:
    """Each group's P and N from ``prepared``'s per-token ΔH (the tensors its P and N are summed
    from) of ``chunks``, whose rows, one chunk after the other, have groups ``group_ids``
    ``[B]`` and verdicts ``correct`` ``[B]`` (bool); in the order of the groups' ids."""
    rows = sum(int(c.mask.shape[0]) for c in chunks)
    if tuple(group_ids.shape) != (rows,) or tuple(correct.shape) != (rows,):
        raise ValueError(
            f"{rows} rows in the chunks, {group_ids.numel()} group ids, {correct.numel()} verdicts"
        )
    ids, index = torch.unique(group_ids, return_inverse=True)
    n_groups = int(ids.numel())
    pos = torch.zeros(n_groups, dtype=torch.float64)
    neg = torch.zeros(n_groups, dtype=torch.float64)
    start = 0
    for chunk, coefficients in zip(chunks, prepared.coefficients, strict=True):
        stop = start + int(chunk.mask.shape[0])
        p, n = group_flow_sums(coefficients.delta_h, chunk.mask, index[start:stop], n_groups)
        pos, neg = pos + p.cpu(), neg + n.cpu()
        start = stop
    sizes = torch.bincount(index, minlength=n_groups)
    hits = torch.bincount(index, weights=correct.double(), minlength=n_groups)
    return [
        GroupFlow(
            correct=round(float(hits[g])),
            responses=int(sizes[g]),
            pos=float(pos[g]),
            neg=float(neg[g]),
            prompt=int(ids[g]),
        )
        for g in range(n_groups)
    ]


def by_success_rate(groups: Sequence[GroupFlow]) -> list[SuccessRateFlow]:
    """The groups binned by success rate (``correct / responses``), from 0 up; only the rates
    some group has."""
    bins: dict[tuple[int, int], list[GroupFlow]] = {}
    for group in groups:
        bins.setdefault((group.correct, group.responses), []).append(group)
    return [
        SuccessRateFlow(
            correct=correct,
            responses=responses,
            pos=sum(g.pos for g in members),
            neg=sum(g.neg for g in members),
            groups=len(members),
        )
        for (correct, responses), members in sorted(
            bins.items(), key=lambda item: item[0][0] / item[0][1]
        )
    ]
