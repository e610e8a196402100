"""Rank function for the megatron-core compatibility tests (spawned by ``run_world``)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from opefo_nemo.engines.megatron import compat


def embedding_group_sums(rank: int, world_size: int, out: str) -> None:
    """Pipeline parallel over the whole world (TP 1): each rank writes ``out/<rank>.json``, the
    sum of the global ranks over its :func:`compat.embedding_group` (one all-reduce), or
    ``null`` where it has none."""
    warnings.filterwarnings("ignore")
    from megatron.core import parallel_state

    compat.initialize_model_parallel(1, world_size, gloo_groups=False)
    try:
        group = compat.embedding_group()
        total = None
        if group is not None:
            value = torch.tensor([float(rank)])
            dist.all_reduce(value, group=group)
            total = float(value[0])
        (Path(out) / f"{rank}.json").write_text(json.dumps(total))
    finally:
        parallel_state.destroy_model_parallel()
