"""Where this rank sits in a process group, and which vocabulary columns its shard holds.

A tensor-parallel (TP) group may be megatron-core's
(``megatron.core.parallel_state.get_tensor_model_parallel_group()``) or any plain
``torch.distributed`` process group; ``None`` means TP = 1 without communication.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist


def rank_and_size(group: dist.ProcessGroup | None) -> tuple[int, int]:
    """``(rank of this process in group, group size)``; ``(0, 1)`` for ``group=None``."""
    if group is None:
        return 0, 1
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(
            f"global rank {dist.get_rank()} is not a member of the process group it was given"
        )
    return rank, dist.get_world_size(group)


@dataclass(frozen=True)
class VocabShard:
    """The contiguous slice ``[start, start + width)`` of the (padded) vocabulary on one rank.

    Megatron splits a vocabulary padded to a multiple of TP into equal slices of ``width``
    columns; columns whose global index is ``>= vocab_size`` are padding, so only the first
    ``valid`` columns of a shard are real tokens (spec §1).
    """

    rank: int
    world: int
    width: int
    vocab_size: int

    @property
    def start(self) -> int:
        return self.rank * self.width

    @property
    def valid(self) -> int:
        return max(0, min(self.width, self.vocab_size - self.start))

    @classmethod
    def of(cls, width: int, group: dist.ProcessGroup | None, vocab_size: int | None) -> VocabShard:
        """The shard of this rank, checking ``vocab_size`` against the padded vocabulary."""
        rank, world = rank_and_size(group)
        padded = width * world
        if vocab_size is None:
            vocab_size = padded
        if not 0 < vocab_size <= padded:
            raise ValueError(
                f"vocab_size={vocab_size} does not fit the sharded vocabulary: {world} TP ranks × "
                f"{width} columns = {padded}"
            )
        return cls(rank=rank, world=world, width=width, vocab_size=vocab_size)
