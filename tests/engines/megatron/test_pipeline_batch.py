"""The micro-batches megatron-core's pipelined schedule is fed (``PipelineMicroBatches``): every
micro-batch padded to the schedule's fixed ``[micro_batch_size, seq_length]`` (the sequence
rounded up to a multiple, as sequence parallelism needs), each stage given only the keys it reads,
and the token-stats hand-off (stack, broadcast, unpad) inverting the padding exactly. The
schedule itself at PP 2 and TP 2 × PP 2, against the ``hf`` engine, is ``test_policy.py``'s."""

from __future__ import annotations

import pytest
import torch

from opefo_nemo.engines.megatron.pipeline_batch import (
    FIRST_STAGE_KEYS,
    STATS_KEYS,
    PipelineMicroBatches,
)

from .tiny import random_batch

pytest.importorskip("megatron.core")
ROWS = 5
VOCAB = 100


def _micro_plan(micro_batch_size: int = 2) -> tuple:
    batch = random_batch(ROWS, VOCAB)
    return batch, PipelineMicroBatches.split(batch, micro_batch_size, seq_multiple=4)


def _corner(rows: int, cols: int, shape: tuple[int, int], inside, outside) -> torch.Tensor:
    """``inside`` in the top-left ``[rows, cols]`` of a ``shape`` tensor of ``outside``."""
    out = torch.full(shape, outside)
    out[:rows, :cols] = inside
    return out


def test_items_padded_to_the_schedule_shape_with_keys_per_stage():
    batch, plan = _micro_plan()
    width = batch.input_ids.shape[1]
    assert plan.num_microbatches == 3 and plan.padded_rows == 6
    assert plan.seq_length % 4 == 0 and width <= plan.seq_length < width + 4
    shape = (2, plan.seq_length)
    assert plan.stats_items(first=False, last=False) == [{}] * 3
    assert all(tuple(i) == FIRST_STAGE_KEYS for i in plan.stats_items(first=True, last=False))
    assert all(tuple(i) == STATS_KEYS for i in plan.stats_items(first=False, last=True))
    for micro, item in zip(plan.micros, plan.stats_items(first=True, last=True), strict=True):
        assert set(item) == set(FIRST_STAGE_KEYS + STATS_KEYS)
        rows, cols = micro.input_ids.shape
        assert torch.equal(item["input_ids"], _corner(rows, cols, shape, micro.input_ids, 0))
        assert torch.equal(item["position_ids"], torch.arange(shape[1]).expand(shape))
        per_token = rows, cols - 1
        assert torch.equal(item["targets"], _corner(*per_token, shape, micro.targets, 0))


def test_gather_and_unpad_invert_the_padding():
    batch, plan = _micro_plan()
    stacked = torch.randn(plan.padded_rows, plan.seq_length)
    outputs = [{"logprob": part, "entropy": -part} for part in stacked.split(plan.micro_batch_size)]
    stats = plan.gather_stats(outputs, None)
    assert torch.equal(stats["logprob"], stacked) and torch.equal(stats["entropy"], -stacked)
    first = 0
    for i, (micro, logprob) in enumerate(
        zip(plan.micros, plan.unpad(stats["logprob"]), strict=True)
    ):
        rows, cols = micro.targets.shape
        assert torch.equal(logprob, stacked[2 * i : 2 * i + rows, :cols])
        assert torch.equal(micro.response_mask, batch.response_mask[first : first + rows, :cols])
        first += rows
    assert first == batch.rows

    with pytest.raises(ValueError, match="2 stats outputs for 3 micro-batches"):
        plan.gather_stats(outputs[:2], None)
    with pytest.raises(ValueError, match="unpad expects"):
        plan.unpad(stacked[:, :-1])
