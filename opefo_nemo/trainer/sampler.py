"""Seeded, epoch-aware prompt sampling whose position is part of the checkpoint, so a resumed run
draws exactly the batches the uninterrupted run would have.
"""

from __future__ import annotations

import torch


class PromptSampler:
    """``next_batch()`` returns ``batch_size`` problem indices in ``[0, num_problems)``. Epoch
    ``e`` visits the problems in the order ``randperm(n)`` of a generator seeded ``seed + e``; a
    batch that runs past the end of an epoch continues with the next epoch's order. The state is
    ``(epoch, position)``."""

    def __init__(self, num_problems: int, batch_size: int, seed: int):
        if num_problems < 1:
            raise ValueError("cannot sample prompts from an empty dataset")
        if batch_size < 1:
            raise ValueError(f"prompt batch size must be >= 1, got {batch_size}")
        self.num_problems = num_problems
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = 0
        self.position = 0

    def _order(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.num_problems, generator=generator).tolist()

    def next_batch(self) -> list[int]:
        batch: list[int] = []
        while len(batch) < self.batch_size:
            order = self._order(self.epoch)
            take = min(self.batch_size - len(batch), self.num_problems - self.position)
            batch.extend(order[self.position : self.position + take])
            self.position += take
            if self.position == self.num_problems:
                self.epoch, self.position = self.epoch + 1, 0
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "num_problems": self.num_problems}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["num_problems"] != self.num_problems:
            raise ValueError(
                f"checkpoint was taken on a dataset of {state['num_problems']} problems, this run "
                f"has {self.num_problems}: the data position would not mean the same thing"
            )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
