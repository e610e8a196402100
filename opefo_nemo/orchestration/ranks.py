"""The ranks one training run spans, as the loop sees them (SPMD: every rank runs the same loop on
the same data); what must not be repeated or may differ between ranks goes through
:class:`LoopRanks` (docs/training.md, "Several ranks").
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar, cast

import torch
import torch.distributed as dist

T = TypeVar("T")


class RankLayoutError(ValueError):
    """The run's ranks do not fit its engine (e.g. several ranks for the one-process ``hf``)."""


@dataclass(frozen=True)
class LoopRanks:
    """``rank`` of ``world_size`` loop processes, ``local_world_size`` of them per node, over
    the default process group (only used when ``world_size > 1``; with one process, the ``hf``
    engine, every operation is the identity). Rank 0 scores (:meth:`on_main`: a reward with a
    time limit could otherwise time out on one rank only) and writes the metrics and trainer
    files; pre-emption is agreed with :meth:`any` so that all ranks checkpoint the same step."""

    rank: int = 0
    world_size: int = 1
    local_world_size: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} of world size {self.world_size} is impossible")
        if self.local_world_size < 1 or self.world_size % self.local_world_size:
            raise ValueError(
                f"{self.local_world_size} ranks per node do not tile world size {self.world_size}"
            )

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that scores, logs and writes the trainer's files."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @classmethod
    def from_environment(cls) -> LoopRanks:
        """From ``torchrun`` / ``srun`` variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``
        or ``SLURM_NTASKS_PER_NODE``); joins the default process group when there are several
        ranks (NCCL on GPU ``LOCAL_RANK``, else gloo) unless it is already initialized."""
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size == 1:
            return cls()
        rank = int(os.environ["RANK"])
        local = os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("SLURM_NTASKS_PER_NODE")
        local_world_size = int(local.split("(")[0]) if local else world_size
        if not dist.is_initialized():
            backend = "gloo"
            if torch.cuda.is_available():
                backend = _select_cuda_device(rank, local_world_size)
            dist.init_process_group(backend, rank=rank, world_size=world_size)
        return cls(rank, world_size, local_world_size)

    def on_main(self, compute: Callable[[], T]) -> T:
        """``compute()`` on rank 0; every rank returns rank 0's result (a picklable object)."""
        if not self.distributed:
            return compute()
        box = [compute() if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return cast(T, box[0])  # rank 0's result, on every rank

    def gather(self, item: T) -> list[T]:
        """Every rank's ``item``, in rank order, on every rank."""
        if not self.distributed:
            return [item]
        items: list = [None] * self.world_size
        dist.all_gather_object(items, item)
        return items

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank (the same answer on every rank)."""
        if not self.distributed:
            return flag
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        value = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item())

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()


SINGLE_PROCESS = LoopRanks()
"""The ranks of a one-process run: every operation is the identity."""


def _select_cuda_device(rank: int, local_world_size: int) -> str:  # pragma: no cover
    """CUDA only: this rank's GPU is ``LOCAL_RANK`` (else its index on the node); the backend is
    NCCL."""
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank % local_world_size)))
    return "nccl"
