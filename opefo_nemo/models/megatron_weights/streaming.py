"""Stream a (TP × PP)-sharded Megatron GPT model out as Hugging Face ``(name, tensor)`` pairs, at
most one layer's full tensors alive at a time, and the other direction (:func:`hf_to_megatron`);
docs/megatron.md, "Streaming".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import torch
import torch.distributed as dist
from torch import Tensor

from opefo_nemo.models.megatron_weights.layout import MegatronLayout
from opefo_nemo.models.megatron_weights.tensor_parallel import gather_shards, split_for_rank
from opefo_nemo.models.megatron_weights.weight_mapping import (
    Sharding,
    WeightSpec,
    fuse,
    unfuse,
    weight_groups,
)

Fetch = Callable[[WeightSpec], Tensor]
"""``fetch(spec) -> full`` Megatron tensor of ``spec``: TP-gathered, of shape ``spec.shape``."""

RankShards = dict[tuple[int, int], dict[str, Tensor]]
"""``{(pipeline stage, tensor-parallel rank): {stage-local Megatron name: shard}}``."""


def hf_named_weights(layout: MegatronLayout, fetch: Fetch) -> Iterator[tuple[str, Tensor]]:
    """Every Hugging Face weight once, in layer order, converted from Megatron tensors that
    ``fetch(spec)`` returns group by group (:func:`weight_groups`: embedding, each decoder layer,
    head), so at most one group's full tensors are alive at a time; what
    ``RolloutEngine.update_weights`` consumes.

    A tied model yields ``model.embed_tokens.weight`` and no ``lm_head.weight``.
    """
    for group in weight_groups(layout):
        for spec in group:
            if spec.tied_copy:
                continue
            yield from unfuse(layout, spec, fetch(spec))


def hf_to_megatron(layout: MegatronLayout, hf_state: Mapping[str, Tensor]) -> RankShards:
    """The shards every (stage, TP rank) holds for the Hugging Face weights ``hf_state``.

    ``lm_head.weight`` may be absent for a tied model; raises ``KeyError`` naming any other
    missing Hugging Face weight.
    """
    tp = layout.tensor_parallel
    shards: RankShards = {
        (stage, rank): {} for stage in range(layout.pipeline_parallel) for rank in range(tp)
    }
    for group in weight_groups(layout):
        for spec in group:
            missing = [name for name in spec.hf_names if name not in hf_state]
            if missing:
                raise KeyError(f"Hugging Face weights lack {', '.join(missing)} for {spec.name}")
            full = fuse(layout, spec, [hf_state[name] for name in spec.hf_names])
            for rank in range(tp):
                shard = split_for_rank(full, spec.sharding, tp, rank, spec.name)
                shards[(spec.stage, rank)][spec.name] = shard
    return shards


def fetch_from_shards(layout: MegatronLayout, shards: RankShards) -> Fetch:
    """A fetcher over the shards of all ranks held in this process (conversion, tests, export)."""

    def fetch(spec: WeightSpec) -> Tensor:
        parts = [shards[(spec.stage, rank)][spec.name] for rank in range(layout.tensor_parallel)]
        return gather_shards(parts, spec.sharding, spec.name)

    return fetch


class DistributedFetch:
    """Fetch full Megatron tensors over ``torch.distributed`` from the ranks that hold them.

    ``local_state`` is this rank's stage-local state dict (``{name: shard}``); ``tp_group`` and
    ``pp_group`` are this rank's tensor- and pipeline-parallel groups (``None``: size 1), their
    group ranks being the tensor-parallel rank and the pipeline stage, as megatron-core's
    ``parallel_state`` makes them. Ranks off the owning stage receive into a new tensor of
    ``dtype`` on ``device``. One all-gather per sharded weight; one broadcast per weight when
    PP > 1.
    """

    def __init__(
        self,
        layout: MegatronLayout,
        local_state: Mapping[str, Tensor],
        tp_group: dist.ProcessGroup | None,
        pp_group: dist.ProcessGroup | None,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        self.layout = layout
        self.local_state = local_state
        self.tp_group, self.pp_group = tp_group, pp_group
        self.dtype, self.device = dtype, torch.device(device)
        self.stage = dist.get_rank(pp_group) if pp_group is not None else 0
        tp_size = dist.get_world_size(tp_group) if tp_group is not None else 1
        pp_size = dist.get_world_size(pp_group) if pp_group is not None else 1
        if (tp_size, pp_size) != (layout.tensor_parallel, layout.pipeline_parallel):
            raise ValueError(
                f"process groups of TP {tp_size} × PP {pp_size} do not match the layout's "
                f"TP {layout.tensor_parallel} × PP {layout.pipeline_parallel}"
            )

    def __call__(self, spec: WeightSpec) -> Tensor:
        full = self._gather_on_owner(spec) if spec.stage == self.stage else None
        if self.layout.pipeline_parallel == 1:
            assert full is not None
            return full
        if full is None:
            full = torch.empty(spec.shape, dtype=self.dtype, device=self.device)
        assert self.pp_group is not None  # pipeline_parallel > 1 (checked against the group)
        source = dist.get_global_rank(self.pp_group, spec.stage)
        dist.broadcast(full, src=source, group=self.pp_group)
        return full

    def _gather_on_owner(self, spec: WeightSpec) -> Tensor:
        if spec.name not in self.local_state:
            raise KeyError(f"pipeline stage {self.stage} holds no {spec.name}")
        shard = self.local_state[spec.name].detach()
        if shard.dtype != self.dtype:
            raise ValueError(f"{spec.name} is {shard.dtype}, the fetcher expects {self.dtype}")
        if spec.sharding is Sharding.REPLICATED or self.layout.tensor_parallel == 1:
            return shard.contiguous()
        parts = [torch.empty_like(shard) for _ in range(self.layout.tensor_parallel)]
        dist.all_gather(parts, shard.contiguous(), group=self.tp_group)
        return gather_shards(parts, spec.sharding, spec.name)
