"""Bad shapes and layouts fail with messages that name the offending thing."""

from __future__ import annotations

import pytest
import torch

from opefo_nemo.engines.aligner import MegatronLayout, hf_to_megatron, split_for_rank
from opefo_nemo.engines.aligner.weight_mapping import Sharding

from .tiny import hf_config, hf_model, hf_weights, layout


def test_kv_heads_not_divisible_by_tp():
    with pytest.raises(
        ValueError, match="num_key_value_heads = 2 is not divisible by tensor parallel 4"
    ):
        layout("qwen2", tp=4)


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
