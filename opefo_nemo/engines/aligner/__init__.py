"""The NeMo-Aligner actor's CPU-testable parts: the Megatron ↔ Hugging Face weight mapping,
data-parallel sharding of the rollout batch, and the loss / token-stats functions for
megatron-core's ``forward_backward_func``.

Nothing imported here needs NeMo, NeMo-Aligner or megatron-core (only torch), so these import and
run anywhere; NeMo-dependent modules of the actor live beside it and are imported explicitly.
"""

from .availability import AlignerUnavailableError, build_actor
from .data_parallel import shard_batch, shard_for_group, shard_rows
from .layout import MegatronLayout
from .loss_closure import (
    LossMicroBatch,
    MegatronScaling,
    VocabParallelLogits,
    loss_function,
    loss_micro_batch,
    per_position,
    stats_function,
)
from .streaming import (
    DistributedFetch,
    RankShards,
    fetch_from_shards,
    hf_named_weights,
    hf_to_megatron,
)
from .tensor_parallel import gather_shards, split_for_rank
from .weight_mapping import Fusion, Sharding, WeightSpec, fuse, stage_specs, unfuse, weight_groups

__all__ = [
    "AlignerUnavailableError",
    "DistributedFetch",
    "Fusion",
    "LossMicroBatch",
    "MegatronLayout",
    "MegatronScaling",
    "RankShards",
    "Sharding",
    "VocabParallelLogits",
    "WeightSpec",
    "build_actor",
    "fetch_from_shards",
    "fuse",
    "gather_shards",
    "hf_named_weights",
    "hf_to_megatron",
    "loss_function",
    "loss_micro_batch",
    "per_position",
    "shard_batch",
    "shard_for_group",
    "shard_rows",
    "split_for_rank",
    "stage_specs",
    "stats_function",
    "unfuse",
    "weight_groups",
]
