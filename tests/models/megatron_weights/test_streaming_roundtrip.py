"""HF → Megatron shards (TP × PP) → HF is exact, and each shard holds what Megatron expects."""

from __future__ import annotations

import pytest
import torch

from opefo_nemo.models.megatron_weights import (
    fetch_from_shards,
    hf_named_weights,
    hf_to_megatron,
    stage_specs,
)
from tests.engines.megatron.tiny import FAMILIES, hf_model, hf_weights, layout

pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_weights(request):
    return request.param, hf_weights(hf_model(request.param))


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("pp", [1, 2])
def test_round_trip_is_exact(family_weights, tp, pp):
    family, weights = family_weights
    lay = layout(family, tp, pp)
    shards = hf_to_megatron(lay, weights)
    streamed = list(hf_named_weights(lay, fetch_from_shards(lay, shards)))
    names = [name for name, _ in streamed]
    assert len(names) == len(set(names)), "a Hugging Face name was streamed twice"
    assert set(names) == set(weights)
    for name, tensor in streamed:
        assert torch.equal(tensor, weights[name]), name


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("pp", [1, 2])
def test_every_rank_holds_its_stage_and_shard(family_weights, tp, pp):
    family, weights = family_weights
    lay = layout(family, tp, pp)
    shards = hf_to_megatron(lay, weights)
    assert set(shards) == {(s, r) for s in range(pp) for r in range(tp)}
    for (stage, _rank), state in shards.items():
        specs = stage_specs(lay, stage)
        assert list(state) == [spec.name for spec in specs]
        layers = {int(name.split(".")[2]) for name in state if name.startswith("decoder.layers.")}
        assert layers == set(range(lay.shape.num_layers // pp)), "layer names must be stage-local"
        assert ("embedding.word_embeddings.weight" in state) == (stage == 0)
        assert ("decoder.final_layernorm.weight" in state) == (stage == pp - 1)
        tied = lay.shape.tie_word_embeddings
        has_output = stage == pp - 1 and (not tied or pp > 1)
        assert ("output_layer.weight" in state) == has_output


def _expected_qkv_shard(weights, layer, lay, rank, suffix):
    """Rank ``rank``'s fused QKV rows, assembled head by head from the HF projections."""
    shape, tp = lay.shape, lay.tensor_parallel
    d, per_group = shape.head_dim, lay.queries_per_group
    groups_per_rank = shape.num_key_value_heads // tp
    q, k, v = (weights[f"model.layers.{layer}.self_attn.{p}_proj.{suffix}"] for p in "qkv")
    rows = []
    for group in range(rank * groups_per_rank, (rank + 1) * groups_per_rank):
        for head in range(group * per_group, (group + 1) * per_group):
            rows.append(q[head * d : (head + 1) * d])
        rows.append(k[group * d : (group + 1) * d])
        rows.append(v[group * d : (group + 1) * d])
    return torch.cat(rows)


@pytest.mark.parametrize("tp", [1, 2])
def test_shard_contents_follow_megatron_layout(family_weights, tp):
    family, weights = family_weights
    lay = layout(family, tp, pp=2)
    shards = hf_to_megatron(lay, weights)
    f, vocab = lay.shape.intermediate_size // tp, lay.shape.vocab_size
    rows_per_rank = lay.padded_vocab_size // tp
    for rank in range(tp):
        last = shards[(1, rank)]
        global_layer = 3  # local layer 1 of stage 1
        prefix, hf = "decoder.layers.1.", f"model.layers.{global_layer}."
        suffixes = ["weight"] + (["bias"] if lay.shape.qkv_bias else [])
        for suffix in suffixes:
            expected = _expected_qkv_shard(weights, global_layer, lay, rank, suffix)
            assert torch.equal(last[f"{prefix}self_attention.linear_qkv.{suffix}"], expected)
        gate, up = weights[f"{hf}mlp.gate_proj.weight"], weights[f"{hf}mlp.up_proj.weight"]
        fc1 = torch.cat([gate[rank * f : (rank + 1) * f], up[rank * f : (rank + 1) * f]])
        assert torch.equal(last[f"{prefix}mlp.linear_fc1.weight"], fc1)
        down = weights[f"{hf}mlp.down_proj.weight"]
        assert torch.equal(
            last[f"{prefix}mlp.linear_fc2.weight"], down[:, rank * f : (rank + 1) * f]
        )
        embedding = shards[(0, rank)]["embedding.word_embeddings.weight"]
        assert embedding.shape == (rows_per_rank, lay.shape.hidden_size)
        start = rank * rows_per_rank
        real = max(0, min(vocab - start, rows_per_rank))
        table = weights["model.embed_tokens.weight"]
        assert torch.equal(embedding[:real], table[start : start + real])
        assert not embedding[real:].any(), "padded vocabulary rows must be zero"
        output = last["output_layer.weight"]
        source = "model.embed_tokens.weight" if lay.shape.tie_word_embeddings else "lm_head.weight"
        assert torch.equal(output[:real], weights[source][start : start + real])


def test_uneven_pipeline_split_offsets_layers():
    lay = layout("llama", tp=1, pp=2, first_stage_layers=1)
    assert (lay.stage_layers(0), lay.stage_layers(1)) == (range(0, 1), range(1, 4))
    weights = hf_weights(hf_model("llama"))
    shards = hf_to_megatron(lay, weights)
    assert torch.equal(
        shards[(1, 0)]["decoder.layers.2.mlp.linear_fc2.weight"],
        weights["model.layers.3.mlp.down_proj.weight"],
    )
    streamed = dict(hf_named_weights(lay, fetch_from_shards(lay, shards)))
    assert all(torch.equal(streamed[name], weights[name]) for name in weights)
