"""The Hugging Face ↔ Megatron weight mapping (docs/megatron.md, "Weight mapping").

:class:`MegatronLayout` (a model shape + TP, PP and vocabulary padding) decides every Megatron
weight's name, shape and TP split (:func:`stage_specs`); :func:`hf_to_megatron` cuts Hugging Face
weights into per-(stage, TP rank) shards; :func:`hf_named_weights` streams them back under Hugging
Face names one decoder layer at a time (:class:`DistributedFetch` across ranks). Torch only.
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
