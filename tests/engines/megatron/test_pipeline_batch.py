"""The micro-batches megatron-core's schedules are fed (``PipelineMicroBatches``): every
micro-batch at its own shape (its rows, its longest row rounded up to the sequence multiple, as
sequence parallelism needs), each stage given only the keys it reads, and the token-stats hand-off
dropping the padding exactly. The schedules themselves (PP 1 and 2, TP 2 × SP, DP 2) against the
``hf`` engine and across layouts are ``test_policy.py``'s and ``test_policy_layout.py``'s."""

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
ROWS = 7
VOCAB = 100
MULTIPLE = 4


def _plan() -> tuple:
    """Micro-batches of 3, 1 and 3 rows, not consecutive, each trimmed to its own longest row."""
    batch = random_batch(ROWS, VOCAB)
    rows = [(6, 0, 3), (5,), (1, 2, 4)]
    micros = tuple(batch.select(r) for r in rows)
    return batch, rows, PipelineMicroBatches(micros, seq_multiple=MULTIPLE)


def _right_padded(tensor: torch.Tensor, width: int) -> torch.Tensor:
    out = torch.zeros((tensor.shape[0], width), dtype=tensor.dtype)
    out[:, : tensor.shape[1]] = tensor
    return out


def test_items_at_each_micro_batchs_own_shape_with_keys_per_stage():
    batch, rows, plan = _plan()
    lengths = batch.attention_mask.sum(dim=1)
    assert plan.num_microbatches == 3 and plan.rows == ROWS
    for (count, width), picked in zip(plan.shapes, rows, strict=True):
        longest = max(int(lengths[r]) for r in picked)
        assert count == len(picked)
        assert width % MULTIPLE == 0 and longest <= width < longest + MULTIPLE
    assert plan.variable_shapes
    assert plan.stats_items(first=False, last=False) == [{}] * 3
    assert all(tuple(i) == FIRST_STAGE_KEYS for i in plan.stats_items(first=True, last=False))
    assert all(tuple(i) == STATS_KEYS for i in plan.stats_items(first=False, last=True))
    items = plan.stats_items(first=True, last=True)
    for micro, item, shape in zip(plan.micros, items, plan.shapes, strict=True):
        assert set(item) == set(FIRST_STAGE_KEYS + STATS_KEYS)
        assert torch.equal(item["input_ids"], _right_padded(micro.input_ids, shape[1]))
        assert torch.equal(item["position_ids"], torch.arange(shape[1]).expand(shape))
        assert torch.equal(item["targets"], _right_padded(micro.targets, shape[1]))


def test_equal_shapes_are_not_variable():
    batch = random_batch(ROWS, VOCAB)
    twins = (batch.select([0, 1]), batch.select([0, 1]))
    assert not PipelineMicroBatches(twins, seq_multiple=MULTIPLE).variable_shapes
    assert PipelineMicroBatches((twins[0], batch.select([0]))).variable_shapes
    with pytest.raises(ValueError, match="at least one micro-batch"):
        PipelineMicroBatches(())
    with pytest.raises(ValueError, match="seq_multiple must be >= 1"):
        PipelineMicroBatches(twins, seq_multiple=0)


def test_gather_stats_keeps_each_micro_batchs_predicted_columns():
    batch, _, plan = _plan()
    names = ("logprob", "entropy")
    outputs = [
        {name: torch.randn(shape) for name in names} for shape in plan.shapes
    ]  # what the last stage's stats functions return: [rows_i, T_i], padding included
    width = batch.targets.shape[1]
    stats = plan.gather_stats(outputs, names, width, None)
    assert stats.shape == (2, ROWS, width)
    start = 0
    for micro, output in zip(plan.micros, outputs, strict=True):
        count, columns = micro.targets.shape
        for field, name in enumerate(names):
            block = stats[field, start : start + count]
            assert torch.equal(block[:, :columns], output[name][:count, :columns])
            assert not block[:, columns:].any()
        start += count

    with pytest.raises(ValueError, match="2 stats outputs for 3 micro-batches"):
        plan.gather_stats(outputs[:2], names, width, None)
