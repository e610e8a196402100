"""The fused Megatron weights compute what the Hugging Face projections compute.

QKV: project with the fused ``linear_qkv`` and split it as Megatron's attention does (view as
``[tokens, G, (H/G + 2)·d]``, split into ``H/G·d | d | d``); the heads must equal the outputs of
``q_proj``, ``k_proj`` and ``v_proj``. MLP: ``silu(first half) · second half`` of ``linear_fc1``,
then ``linear_fc2``, must equal the Hugging Face MLP. Float64, so the only difference allowed
is the order of a few additions in the matrix products.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from opefo_nemo.models.megatron_weights import fetch_from_shards, hf_to_megatron, weight_groups
from tests.engines.megatron.tiny import hf_model, layout

pytest.importorskip("transformers")
TOKENS = 5


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_fused_qkv_and_mlp_compute_the_hf_projections(family):
    model = hf_model(family).double()
    lay = layout(family)
    weights = {name: p.detach() for name, p in model.named_parameters()}
    fetch = fetch_from_shards(lay, hf_to_megatron(lay, weights))
    layer_specs = list(weight_groups(lay))[1]
    full = {spec.name.removeprefix("decoder.layers.0."): fetch(spec) for spec in layer_specs}
    attention, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    shape = lay.shape
    groups, d, per_group = shape.num_key_value_heads, shape.head_dim, lay.queries_per_group

    x = torch.randn(
        TOKENS, shape.hidden_size, dtype=torch.float64, generator=torch.Generator().manual_seed(1)
    )
    mixed = F.linear(
        x, full["self_attention.linear_qkv.weight"], full.get("self_attention.linear_qkv.bias")
    )
    mixed = mixed.view(TOKENS, groups, (per_group + 2) * d)
    query, key, value = mixed.split([per_group * d, d, d], dim=-1)
    with torch.no_grad():
        expected_q = attention.q_proj(x).view(TOKENS, groups * per_group, d)
        expected_k = attention.k_proj(x).view(TOKENS, groups, d)
        expected_v = attention.v_proj(x).view(TOKENS, groups, d)
        expected_mlp = mlp(x)
    torch.testing.assert_close(query.reshape(TOKENS, -1, d), expected_q, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(key.reshape(TOKENS, groups, d), expected_k, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(value.reshape(TOKENS, groups, d), expected_v, rtol=1e-12, atol=1e-12)

    gate, up = F.linear(x, full["mlp.linear_fc1.weight"]).chunk(2, dim=-1)
    out = F.linear(F.silu(gate) * up, full["mlp.linear_fc2.weight"])
    torch.testing.assert_close(out, expected_mlp, rtol=1e-12, atol=1e-12)
