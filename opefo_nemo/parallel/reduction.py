"""Global-batch reductions over the data-parallel group (ARCHITECTURE.md phase 2, SPEC §3, §5).

``DataParallelReducer`` implements core's ``BatchReducer`` protocol with torch.distributed, so
``core.objectives.prepare`` computes λ*, the token count and the Clip-Cov / KL-Cov selections over
the whole optimizer-step batch, exactly as if it sat on one rank.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch import Tensor

from opefo_nemo.core.reduction import Threshold, local_top_k, top_k_threshold


class DataParallelReducer:
    """``BatchReducer`` over ``group`` (megatron-core's data-parallel group or a plain one).

    Every method is collective: all ranks of ``group`` call it, with the same keys in the same
    order (``sum``) and the same ``k`` (``top_k``). ``group=None`` means the default (world) group.
    """

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group

    def _size(self) -> int:
        return dist.get_world_size(self.group)

    def sum(self, sums: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Sum each named 0-d tensor over the group: one float64 vector, one all-reduce SUM."""
        names = list(sums)
        if not names:
            return {}
        for name in names:
            if sums[name].numel() != 1:
                raise ValueError(
                    f"sum {name!r} must be a 0-d tensor, got shape {tuple(sums[name].shape)}"
                )
        packed = torch.stack([sums[name].detach().reshape(()).to(torch.float64) for name in names])
        if self._size() > 1:
            dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=self.group)
        return {name: packed[i] for i, name in enumerate(names)}

    def top_k(self, scores: Tensor, keys: Tensor, k: int) -> Threshold | None:
        """k-th (score desc, key asc) candidate of the union of every rank's ``(scores, keys)``.

        Each rank keeps only its own first ``k`` candidates (no candidate beyond them can be in
        the global top k), then one all-gather of ``[count, scores (k), keys (k)]`` packed as
        float64 (the int64 keys travel bit for bit), then core's ``top_k_threshold`` on the union:
        the same answer as ``SingleProcessReducer`` on the whole batch.
        """
        if k <= 0:
            return None
        top_scores, top_keys = local_top_k(scores.to(torch.float64), keys.to(torch.int64), k)
        if self._size() == 1:
            return top_k_threshold(top_scores, top_keys, k)
        n = top_scores.numel()
        packet = torch.zeros(1 + 2 * k, dtype=torch.float64, device=scores.device)
        packet[0] = n
        packet[1 : 1 + n] = top_scores
        packet[1 + k : 1 + k + n] = top_keys.contiguous().view(torch.float64)
        gathered = [torch.empty_like(packet) for _ in range(self._size())]
        dist.all_gather(gathered, packet, group=self.group)
        union_scores, union_keys = [], []
        for other in gathered:
            count = int(other[0])
            union_scores.append(other[1 : 1 + count])
            union_keys.append(other[1 + k : 1 + k + count].contiguous().view(torch.int64))
        return top_k_threshold(torch.cat(union_scores), torch.cat(union_keys), k)
