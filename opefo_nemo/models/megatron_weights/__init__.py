"""The Hugging Face ↔ Megatron weight mapping: names, shapes and TP splits (:func:`stage_specs`),
shards from Hugging Face weights (:func:`hf_to_megatron`) and the stream back
(:func:`hf_named_weights`); torch only (docs/megatron.md, "Weight mapping").
"""

from opefo_nemo.models.megatron_weights.layout import MegatronLayout
from opefo_nemo.models.megatron_weights.streaming import (
    DistributedFetch,
    RankShards,
    fetch_from_shards,
    hf_named_weights,
    hf_to_megatron,
)
from opefo_nemo.models.megatron_weights.tensor_parallel import gather_shards, split_for_rank
from opefo_nemo.models.megatron_weights.weight_mapping import (
    Fusion,
    Sharding,
    WeightSpec,
    fuse,
    stage_specs,
    unfuse,
    weight_groups,
)

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
