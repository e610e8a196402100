"""Rank functions for the real-world tests (spawned by ``tests.parallel.world.run_world``)."""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

from opefo_nemo.engines.megatron import compat
from opefo_nemo.models.megatron_weights import (
    DistributedFetch,
    fuse,
    hf_named_weights,
    weight_groups,
)
from tests.engines.megatron.tiny import FAMILIES, layout, megatron_gpt
from tests.metric_bounds import assert_close_to_scale

#: fp32 matmuls in other orders: within this of each output's largest magnitude
ACTIVATION_REL = 1e-5


def _real_state(model) -> dict[str, tuple[int, ...]]:
    return {
        name: tuple(tensor.shape)
        for name, tensor in model.state_dict().items()
        if not name.endswith("_extra_state")
    }


def _te_names(model) -> set[str]:
    """Megatron's own checkpoint names of the local model: the Transformer Engine (fused
    layernorm) names, with the layer index taken from the state-dict key."""
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    names = set()
    for key, sharded in model.sharded_state_dict().items():
        if isinstance(sharded, ShardedObject):
            continue
        name = sharded.key
        if name.startswith("decoder.layers."):
            index = key.split(".")[2]
            name = f"decoder.layers.{index}.{name.removeprefix('decoder.layers.')}"
        names.add(name)
    return names


def names_match_megatron(rank: int, world_size: int) -> None:
    """TP = PP = 1, every family: state-dict names and shapes, and the TE names."""
    warnings.filterwarnings("ignore")
    from megatron.core import parallel_state

    compat.initialize_model_parallel(1, 1, gloo_groups=False)
    try:
        for family in sorted(FAMILIES):
            lay = layout(family)
            model = megatron_gpt(lay, 0)
            specs = [spec for group in weight_groups(lay) for spec in group]
            assert _real_state(model) == {s.name: s.shape for s in specs}, family
            te = layout(family, fused_layernorm=True)
            te_names = {spec.name for group in weight_groups(te) for spec in group}
            assert _te_names(model) == te_names, family
    finally:
        parallel_state.destroy_model_parallel()


def _layer_semantics(model, stage_layer, expected) -> None:
    """Megatron's own attention split and MLP on the loaded weights equal the HF projections."""
    from megatron.core import parallel_state

    tp = parallel_state.get_tensor_model_parallel_world_size()
    rank = parallel_state.get_tensor_model_parallel_rank()
    layer = model.decoder.layers[stage_layer]
    x = expected["x"].unsqueeze(1)  # [tokens, batch 1, hidden]
    with torch.no_grad():
        mlp_out, _ = layer.mlp(x)
    assert_close_to_scale(mlp_out.squeeze(1), expected["mlp"], ACTIVATION_REL, "mlp")
    groups = expected["k"].shape[1]
    if groups < tp:
        return  # megatron then all-gathers the group's rows into a CUDA buffer: not on CPU
    with torch.no_grad():
        query, key, value = layer.self_attention.get_query_key_value_tensors(x)
    heads = expected["q"].shape[1] // tp
    q = expected["q"][:, rank * heads : (rank + 1) * heads]
    assert_close_to_scale(query.squeeze(1), q, ACTIVATION_REL, "query")
    mine = slice(rank * groups // tp, (rank + 1) * groups // tp)
    assert_close_to_scale(key.squeeze(1), expected["k"][:, mine], ACTIVATION_REL, "key")
    assert_close_to_scale(value.squeeze(1), expected["v"][:, mine], ACTIVATION_REL, "value")


def sharded_model_matches(
    rank: int, world_size: int, family: str, tp: int, pp: int, shards, weights, expected
) -> None:
    """TP × PP world: a real GPTModel per rank has our names, shapes and layer offsets, loads our
    shards, computes the HF projections with them, and streams back the exact HF weights."""
    warnings.filterwarnings("ignore")
    from megatron.core import parallel_state

    compat.initialize_model_parallel(tp, pp, gloo_groups=False)
    try:
        tp_rank = parallel_state.get_tensor_model_parallel_rank()
        stage = parallel_state.get_pipeline_model_parallel_rank()
        lay = layout(family, tp, pp)
        model = megatron_gpt(lay, stage)
        mine = shards[(stage, tp_rank)]
        assert _real_state(model) == {name: tuple(t.shape) for name, t in mine.items()}
        numbers = [layer.layer_number - 1 for layer in model.decoder.layers]
        assert numbers == list(lay.stage_layers(stage))
        extra = {k: v for k, v in model.state_dict().items() if k.endswith("_extra_state")}
        model.load_state_dict({**extra, **mine}, strict=True)
        global_layer = lay.stage_layers(stage).start
        _layer_semantics(model, 0, expected[global_layer])

        state = {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
        fetch = DistributedFetch(
            lay,
            state,
            parallel_state.get_tensor_model_parallel_group(),
            parallel_state.get_pipeline_model_parallel_group(),
            torch.float32,
        )
        streamed = list(hf_named_weights(lay, fetch))
        names = [name for name, _ in streamed]
        assert len(names) == len(set(names)) and set(names) == set(weights)
        for name, tensor in streamed:
            assert torch.equal(tensor, weights[name]), name
    finally:
        parallel_state.destroy_model_parallel()


def tp_gather_matches_full(rank: int, world_size: int, family: str, shards, weights) -> None:
    """Plain 2-process gloo TP group: every gathered weight equals the single-process full one."""
    lay = layout(family, tp=world_size)
    fetch = DistributedFetch(lay, shards[(0, rank)], dist.group.WORLD, None, torch.float32)
    for group in weight_groups(lay):
        for spec in group:
            full = fuse(lay, spec, [weights[name] for name in spec.hf_names])
            assert torch.equal(fetch(spec), full), spec.name
