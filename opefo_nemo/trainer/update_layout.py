"""Where the rows of an update go (docs/batch_layout.md): the layout of each mini-batch's
micro-batches over the policy's data-parallel ranks, and what the update's passes cost in padding
and waiting (spec §11)."""

from __future__ import annotations

from collections.abc import Sequence

from opefo_nemo.config.engines import BALANCED
from opefo_nemo.engines.batch import TrainBatch
from opefo_nemo.engines.batch_layout import (
    MicroBatchLayout,
    concatenated,
    dp_imbalance,
    pad_fraction,
    plan_layouts,
)
from opefo_nemo.engines.protocols import Policy


def row_lengths(batch: TrainBatch) -> list[int]:
    """Each row's tokens, prompt and response: what a layout plans with."""
    return [int(n) for n in batch.attention_mask.sum(dim=1).tolist()]


def prompt_and_response_tokens(batch: TrainBatch) -> tuple[list[int], list[int]]:
    """Each row's prompt tokens and response tokens (what ``lengths.jsonl`` records)."""
    response = [int(n) for n in batch.response_mask.sum(dim=1).tolist()]
    return [n - r for n, r in zip(row_lengths(batch), response, strict=True)], response


def plan_update(
    policy: Policy,
    batch: TrainBatch,
    mini_batches: int,
    micro_batch_size: int,
    batch_layout: str = BALANCED,
    max_tokens_per_micro_batch: int | None = None,
    attention_width: int | None = None,
) -> list[MicroBatchLayout]:
    """The micro-batches of each of the ``mini_batches`` optimizer steps of ``batch`` and the
    rank that runs each (:func:`~opefo_nemo.engines.batch_layout.plan_layouts` with the policy's
    data-parallel size and sequence multiple, ranks balanced by their work with the model's
    ``attention_width``)."""
    return plan_layouts(
        row_lengths(batch),
        mini_batches=mini_batches,
        data_parallel=policy.data_parallel_size,
        micro_batch_size=micro_batch_size,
        max_tokens=max_tokens_per_micro_batch,
        multiple=policy.sequence_multiple,
        layout=batch_layout,
        attention_width=attention_width,
    )


def layout_metrics(
    layouts: Sequence[MicroBatchLayout],
    lengths: Sequence[int],
    multiple: int,
    attention_width: int | None = None,
) -> dict[str, float]:
    """``perf/pad_fraction``, ``perf/dp_imbalance`` and ``perf/micro_batches`` of an update over
    ``layouts`` (spec §11; the work with the model's ``attention_width``). Its passes: the
    statistics pass over the whole batch, a fresh one of each later mini-batch, and each
    mini-batch's optimizer step; ``perf/micro_batches`` counts the micro-batches of one pass over
    the batch (every mini-batch, every rank)."""
    passes = [concatenated(layouts), *layouts[1:], *layouts]
    return {
        "perf/pad_fraction": pad_fraction(passes, lengths, multiple, attention_width),
        "perf/dp_imbalance": dp_imbalance(passes, lengths, multiple, attention_width),
        "perf/micro_batches": float(sum(len(layout.rows) for layout in layouts)),
    }
