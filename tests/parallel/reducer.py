"""A ``BatchReducer`` over a real gloo group, for tests that spread one optimizer-step batch over
data-parallel ranks (the engines gather the whole batch onto every rank instead, so none ships).

``sum``: one all-reduce SUM of the packed float64 sums (same keys, same order on every rank).
``top_k``: every rank's local top-k candidates gathered, then the threshold of their union.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch import Tensor

from opefo_nemo.core.reduction import Threshold, local_top_k, top_k_threshold


class GroupReducer:
    """Sums and top-k thresholds over the ranks of ``group``."""

    def __init__(self, group: dist.ProcessGroup):
        self.group = group

    def sum(self, sums: Mapping[str, Tensor]) -> dict[str, Tensor]:
        names = list(sums)
        packed = torch.stack([sums[n].to(torch.float64).reshape(()) for n in names])
        dist.all_reduce(packed, group=self.group)
        return dict(zip(names, packed.unbind(), strict=True))

    def top_k(self, scores: Tensor, keys: Tensor, k: int) -> Threshold | None:
        mine = local_top_k(scores.double(), keys.long(), k)
        gathered: list = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(gathered, mine, group=self.group)
        all_scores = torch.cat([s for s, _ in gathered])
        all_keys = torch.cat([key for _, key in gathered])
        return top_k_threshold(all_scores, all_keys, k)
