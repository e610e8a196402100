"""Phase 1 of the update (docs/architecture.md, "The step: three phases"): the token-statistics
pass over a rollout batch in the micro-batches of its layout (docs/batch_layout.md), or with each
micro-batch's graph kept for the backward passes when the policy shares its forward."""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch

from opefo_nemo.engines.batch import TrainBatch
from opefo_nemo.engines.batch_layout import MicroBatchLayout, concatenated
from opefo_nemo.engines.protocols import Policy, SharedForwardPolicy
from opefo_nemo.parallel import TokenStats


def stats_pass(
    policy: Policy,
    batch: TrainBatch,
    layouts: Sequence[MicroBatchLayout],
    pieces: Sequence[Sequence[TrainBatch]],
    sums: Sequence[str],
) -> list[list[TokenStats]]:
    """Phase 1 over ``batch`` in one engine call, forward only, in the micro-batches of all
    ``layouts`` (one pass: :func:`~opefo_nemo.engines.batch_layout.concatenated`); returned as
    the statistics of ``pieces[j][i]``, the micro-batch of rows ``layouts[j].rows[i]`` of
    ``batch``, each trimmed to its own width.

    One call per batch, not per micro-batch: a multi-rank engine runs each rank's micro-batches
    and gathers the rows (with one call per micro-batch of a few rows, most data-parallel ranks
    would have nothing to do).
    """
    stats = policy.token_stats(batch, sums=sums, layout=concatenated(layouts))
    return [
        [
            stats.map(operator.itemgetter((torch.tensor(rows), slice(piece.targets.shape[1]))))
            for rows, piece in zip(layout.rows, micros, strict=True)
        ]
        for layout, micros in zip(layouts, pieces, strict=True)
    ]


def kept_forward(
    policy: Policy, micro_batches: Sequence[TrainBatch], sums: Sequence[str]
) -> list[TokenStats] | None:
    """Phase 1 of a strict step with every micro-batch's graph kept for its backward passes, when
    ``policy`` shares its forward (``engine.shared_forward``); else ``None``: :func:`stats_pass`
    and a forward of its own in each backward pass."""
    if isinstance(policy, SharedForwardPolicy) and policy.shares_forward:
        return policy.forward_with_graph(micro_batches, sums)
    return None
