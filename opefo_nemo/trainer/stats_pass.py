"""Phase 1 of the update (docs/architecture.md, "The step: three phases"): the token-statistics
pass over a rollout batch, split like its micro-batches, or with each micro-batch's graph kept
for the backward passes when the policy shares its forward."""

from __future__ import annotations

import operator
from collections.abc import Sequence

from opefo_nemo.engines.batch import TrainBatch
from opefo_nemo.engines.protocols import Policy, SharedForwardPolicy
from opefo_nemo.parallel import TokenStats


def stats_pass(
    policy: Policy, batch: TrainBatch, pieces: Sequence[TrainBatch], sums: Sequence[str]
) -> list[TokenStats]:
    """Phase 1 over ``batch`` in one engine call, forward only, returned split like ``pieces``
    (consecutive row blocks of ``batch``: its micro-batches).

    One call per batch, not per micro-batch: a multi-rank engine spreads the batch over its
    data-parallel ranks and micro-batches it itself (with one call per micro-batch of a few
    rows, most data-parallel ranks would have nothing to do).
    """
    sizes = [piece.rows for piece in pieces]
    if sum(sizes) != batch.rows:
        raise ValueError(f"pieces of {sum(sizes)} rows do not tile a batch of {batch.rows}")
    stats = policy.token_stats(batch, sums=sums)
    result, start = [], 0
    for piece in pieces:  # each piece is trimmed to its own longest row
        rows, columns = slice(start, start + piece.rows), slice(piece.targets.shape[1])
        result.append(stats.map(operator.itemgetter((rows, columns))))
        start += piece.rows
    return result


def kept_forward(
    policy: Policy, micro_batches: Sequence[TrainBatch], sums: Sequence[str]
) -> list[TokenStats] | None:
    """Phase 1 of a strict step with every micro-batch's graph kept for its backward passes, when
    ``policy`` shares its forward (``engine.shared_forward``); else ``None``: :func:`stats_pass`
    and a forward of its own in each backward pass."""
    if isinstance(policy, SharedForwardPolicy) and policy.shares_forward:
        return policy.forward_with_graph(micro_batches, sums)
    return None
