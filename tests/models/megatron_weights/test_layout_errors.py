"""Bad shapes and layouts fail with messages that name the offending thing."""

from __future__ import annotations

import pytest
import torch

from opefo_nemo.models.megatron_weights import (
    MegatronLayout,
    fetch_from_shards,
    hf_named_weights,
    hf_to_megatron,
    split_for_rank,
)
from opefo_nemo.models.megatron_weights.weight_mapping import Sharding
from tests.engines.megatron.tiny import hf_config, hf_model, hf_weights, layout


def test_heads_and_groups_must_fit_tp():
    with pytest.raises(ValueError, match="num_attention_heads = 4 is not divisible by tensor para"):
        layout("qwen2", tp=3)
    three_groups = {**hf_config("qwen2"), "num_attention_heads": 6, "num_key_value_heads": 3}
    with pytest.raises(ValueError, match="num_key_value_heads = 3 and tensor parallel 2"):
        MegatronLayout.from_hf_config(three_groups, tensor_parallel=2)


def test_tp_above_kv_groups_round_trips():
    """TP 4 over 2 key/value groups: each group's fused rows span two ranks (flat row blocks)."""
    weights = hf_weights(hf_model("qwen2"))
    lay = layout("qwen2", tp=4)
    shards = hf_to_megatron(lay, weights)
    qkv = "decoder.layers.0.self_attention.linear_qkv.weight"
    assert shards[(0, 1)][qkv].shape == (16, 32)
    attention = "model.layers.0.self_attn."
    k, v = (weights[f"{attention}{p}_proj.weight"] for p in "kv")
    q = weights[f"{attention}q_proj.weight"]
    assert torch.equal(shards[(0, 0)][qkv], q[:16]), "rank 0: group 0's two query heads"
    assert torch.equal(shards[(0, 1)][qkv], torch.cat([k[:8], v[:8]])), "rank 1: its k and v"
    streamed = dict(hf_named_weights(lay, fetch_from_shards(lay, shards)))
    assert all(torch.equal(streamed[name], weights[name]) for name in weights)


def test_layers_not_divisible_by_pp():
    with pytest.raises(ValueError, match="4 layers cannot be split over 3 pipeline stages"):
        layout("qwen2", pp=3)


def test_mlp_bias_is_refused():
    with pytest.raises(ValueError, match="mlp_bias"):
        MegatronLayout.from_hf_config({**hf_config("llama"), "mlp_bias": True})


def test_padded_vocabulary_is_megatrons():
    assert layout("qwen2", tp=1).padded_vocab_size == 104
    assert layout("qwen2", tp=2).padded_vocab_size == 112


def test_missing_and_misshaped_hf_weights_are_named():
    weights = hf_weights(hf_model("llama"))
    lay = layout("llama")
    broken = {k: v for k, v in weights.items() if k != "model.layers.1.self_attn.k_proj.weight"}
    with pytest.raises(KeyError, match=r"model.layers.1.self_attn.k_proj.weight"):
        hf_to_megatron(lay, broken)
    weights["model.layers.2.mlp.up_proj.weight"] = torch.zeros(47, 32)
    with pytest.raises(ValueError, match=r"model.layers.2.mlp.up_proj.weight has shape \(47, 32\)"):
        hf_to_megatron(lay, weights)


def test_split_names_uneven_shards():
    with pytest.raises(ValueError, match=r"linear_proj.*does not split into 3"):
        split_for_rank(torch.zeros(4, 8), Sharding.ROW, 3, 0, "linear_proj")
