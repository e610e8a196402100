"""Data-parallel sharding of the rollout batch over a real gloo group: each rank gets a distinct
contiguous block of whole responses, the shards together are the batch, global token ids kept."""

from __future__ import annotations

import pytest
import torch

from opefo_nemo.engines.batch import build_batch
from opefo_nemo.engines.megatron.data_parallel import shard_batch, shard_rows
from tests.parallel.world import run_world

from . import workers_sharding


def _batch(rows: int):
    generator = torch.Generator().manual_seed(2)
    prompts = [list(range(1, 2 + i % 3)) for i in range(rows)]
    responses = [list(range(10, 11 + (5 * i) % 7)) for i in range(rows)]
    return build_batch(prompts, responses, torch.randn(rows, generator=generator), pad_id=0)


@pytest.mark.parametrize("world", [2, 3])
def test_shards_over_gloo_partition_the_batch(tmp_path, world):
    batch = _batch(6)
    path = tmp_path / "shards.pt"
    run_world(workers_sharding.gather_shards, world, batch, [str(path)])
    shards = torch.load(path)
    assert [s["rank"] for s in shards] == list(range(world))
    each = batch.rows // world
    seen_ids: set[int] = set()
    for rank, shard in enumerate(shards):
        assert shard["input_ids"].shape[0] == each
        for i in range(each):
            row = rank * each + i  # contiguous block of whole responses, in order
            width = shard["input_ids"].shape[1]
            assert torch.equal(shard["input_ids"][i], batch.input_ids[row, :width])
            assert torch.equal(shard["attention_mask"][i], batch.attention_mask[row, :width])
            assert not batch.attention_mask[row, width:].any()  # only padding was trimmed
            for name in ("response_mask", "advantages", "token_ids"):
                assert torch.equal(shard[name][i], getattr(batch, name)[row, : width - 1]), name
        ids = shard["token_ids"][shard["response_mask"]].tolist()
        assert seen_ids.isdisjoint(ids)
        seen_ids.update(ids)
    assert seen_ids == set(batch.token_ids[batch.response_mask].tolist())


def test_shard_rows_blocks_and_errors():
    assert [shard_rows(8, 4, r) for r in range(4)] == [
        range(0, 2),
        range(2, 4),
        range(4, 6),
        range(6, 8),
    ]
    assert shard_batch(_batch(4), 1, 0).rows == 4
    with pytest.raises(ValueError, match="6 responses does not split evenly over 4"):
        shard_rows(6, 4, 0)
    with pytest.raises(ValueError, match="rank 2 is outside 0 … 1"):
        shard_rows(4, 2, 2)
    with pytest.raises(ValueError, match="data-parallel size must be >= 1"):
        shard_rows(4, 0, 0)
