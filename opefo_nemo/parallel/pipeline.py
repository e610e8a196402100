"""Per-token statistics from the last pipeline stage to the others (docs/architecture.md phase 1).

Only the last pipeline-parallel (PP) stage has logits, so only it computes ``token_stats``; the
other stages need the same per-token tensors to build their coefficients. One plain broadcast per
dtype from the last stage's global rank.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch import Tensor


def is_last_stage(pp_group: dist.ProcessGroup | None) -> bool:
    """Whether this process is on the last stage of ``pp_group`` (``None``: no pipeline, so yes)."""
    if pp_group is None:
        return True
    return dist.get_rank(pp_group) == dist.get_world_size(pp_group) - 1


def broadcast_from_last_stage(
    tensors: Mapping[str, Tensor], pp_group: dist.ProcessGroup | None
) -> dict[str, Tensor]:
    """Overwrite ``tensors`` on every stage with the last stage's values and return them.

    On the last stage ``tensors`` holds the values; on the others, buffers of the same names,
    shapes, dtypes and order (their contents are ignored). Tensors of one dtype travel packed in
    one broadcast (bool as uint8). ``pp_group=None`` or one stage: returned unchanged.
    """
    if pp_group is None or dist.get_world_size(pp_group) == 1:
        return dict(tensors)
    src = dist.get_global_rank(pp_group, dist.get_world_size(pp_group) - 1)
    by_dtype: dict[torch.dtype, list[str]] = {}
    for name, value in tensors.items():
        by_dtype.setdefault(value.dtype, []).append(name)
    for names in by_dtype.values():
        wire = [_wire(tensors[name]) for name in names]
        packed = torch.cat([w.reshape(-1) for w in wire])
        dist.broadcast(packed, src=src, group=pp_group)
        offset = 0
        for w in wire:
            w.copy_(packed[offset : offset + w.numel()].view_as(w))
            offset += w.numel()
    return dict(tensors)


def _wire(t: Tensor) -> Tensor:
    """A view of ``t`` that communication backends accept (bool travels as uint8)."""
    if not t.is_contiguous():
        raise ValueError(
            "broadcast_from_last_stage needs contiguous tensors (they are filled in place)"
        )
    return t.view(torch.uint8) if t.dtype == torch.bool else t
