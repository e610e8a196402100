"""Against a real megatron-core 0.16.1 GPTModel built on CPU over gloo (no forward of the whole
model: its rotary embedding needs CUDA), and a real multi-process TP gather."""

from __future__ import annotations

import pytest
import torch

from opefo_nemo.models.megatron_weights import hf_to_megatron
from tests.engines.megatron.tiny import hf_model, hf_weights, layout
from tests.engines.megatron.versions import needs_tp_above_kv_heads
from tests.parallel.world import run_world

from . import workers_streaming as workers

pytest.importorskip("megatron.core")
pytest.importorskip("transformers")
TOKENS = 5


def _expected_layers(model, layers) -> dict[int, dict[str, torch.Tensor]]:
    """Per layer: an input ``x`` and the HF q/k/v heads and MLP output for it."""
    generator = torch.Generator().manual_seed(3)
    out = {}
    config = model.config
    d = config.hidden_size // config.num_attention_heads
    for index in layers:
        layer = model.model.layers[index]
        x = torch.randn(TOKENS, config.hidden_size, generator=generator)
        with torch.no_grad():
            out[index] = {
                "x": x,
                "q": layer.self_attn.q_proj(x).view(TOKENS, -1, d),
                "k": layer.self_attn.k_proj(x).view(TOKENS, -1, d),
                "v": layer.self_attn.v_proj(x).view(TOKENS, -1, d),
                "mlp": layer.mlp(x),
            }
    return out


def test_names_and_shapes_equal_megatron_gpt_model():
    run_world(workers.names_match_megatron, 1)


@pytest.mark.parametrize(("tp", "pp"), [(2, 2), pytest.param(4, 1, marks=needs_tp_above_kv_heads)])
def test_sharded_gpt_model_loads_computes_and_streams(tp, pp):
    model = hf_model("qwen2")
    weights = hf_weights(model)
    lay = layout("qwen2", tp, pp)
    shards = hf_to_megatron(lay, weights)
    starts = [lay.stage_layers(stage).start for stage in range(pp)]
    expected = _expected_layers(model, starts)
    run_world(workers.sharded_model_matches, tp * pp, "qwen2", tp, pp, shards, weights, expected)


def test_tp_gather_over_two_gloo_ranks_equals_full_weight():
    weights = hf_weights(hf_model("qwen3"))
    shards = hf_to_megatron(layout("qwen3", tp=2), weights)
    run_world(workers.tp_gather_matches_full, 2, "qwen3", shards, weights)
