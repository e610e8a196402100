"""The NeMo-Aligner actor's CPU-testable parts: the Megatron ↔ Hugging Face weight mapping.

Nothing imported here needs NeMo, NeMo-Aligner or megatron-core (only torch), so the mapping
imports and runs anywhere; NeMo-dependent modules of the actor live beside it and are imported
explicitly.
"""

from .layout import MegatronLayout
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
    "DistributedFetch",
    "Fusion",
    "MegatronLayout",
    "RankShards",
    "Sharding",
    "WeightSpec",
    "fetch_from_shards",
    "fuse",
    "gather_shards",
    "hf_named_weights",
    "hf_to_megatron",
    "split_for_rank",
    "stage_specs",
    "unfuse",
    "weight_groups",
]
