"""Rank function for the data-parallel sharding test (spawned by ``run_world``)."""

from __future__ import annotations

import torch.distributed as dist

from opefo_nemo.engines.megatron.data_parallel import shard_for_group


def gather_shards(rank: int, world_size: int, batch, out: list) -> None:
    """Every rank shards ``batch`` over the world group; rank 0 checks the union (by the caller's
    assertions, through the pickled result written to ``out[0]``)."""
    shard = shard_for_group(batch, None)
    mine = {
        "rank": rank,
        "input_ids": shard.input_ids,
        "attention_mask": shard.attention_mask,
        "response_mask": shard.response_mask,
        "advantages": shard.advantages,
        "token_ids": shard.token_ids,
    }
    gathered = [None] * world_size
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        import torch

        torch.save(gathered, out[0])
