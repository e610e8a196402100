"""``ModelShape.attention_width``: where a position's causal attention costs what its linear
layers do, for the presets' models (their published ``config.json`` shapes) and the tiny model."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file

from opefo_nemo.launch.layout import ParallelLayout
from opefo_nemo.models.shape import ModelShape
from opefo_nemo.models.tiny import TinyModelSpec, build_tiny_model
from tests.preset_models import HF_CONFIGS


def test_attention_width_of_the_presets_models():
    """A layer's weights ``W`` (Q, K, V, O with Qwen2's biases; gate, up, down) over the
    query width: 2·W FLOPs a position through them against 2·H·d·w through attention at
    width ``w``, equal at ``w = W / (H·d)``."""
    qwen25_math_7b = ModelShape.from_hf_config(HF_CONFIGS["Qwen2.5-Math-7B"])
    weights = 3584 * 3584 * 2 + 3584 * 512 * 2 + 3584 + 2 * 512 + 3 * 3584 * 18944
    assert qwen25_math_7b.attention_width() == round(weights / 3584) == 65025
    qwen3_4b_base = ModelShape.from_hf_config(HF_CONFIGS["Qwen3-4B-Base"])
    weights = 2560 * 4096 * 2 + 2560 * 1024 * 2 + 3 * 2560 * 9728
    assert qwen3_4b_base.attention_width() == round(weights / 4096) == 24640


def test_attention_width_of_a_model_directory(tmp_path):
    """The tiny model's layer 0 as stored: its projections' weights and biases (not the norms)
    over the query projection's output width."""
    build_tiny_model(tmp_path / "tiny", TinyModelSpec(), seed=0)
    stored = load_file(tmp_path / "tiny" / "model.safetensors")
    layer = {k: v for k, v in stored.items() if k.startswith("model.layers.0.") and "proj" in k}
    weights = sum(v.numel() for v in layer.values())
    query_width = stored["model.layers.0.self_attn.q_proj.weight"].shape[0]
    shape = ModelShape.from_model_dir(tmp_path / "tiny")
    assert shape.attention_width() == round(weights / query_width)


@pytest.mark.parametrize("bad", [0, -2, 2.0, "4", None])
def test_settings_refuse_a_field_that_is_not_a_positive_int_naming_it(bad):
    fields = dict(
        hidden_size=64,
        num_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=100,
    )
    ModelShape(**fields)  # the valid shape builds
    with pytest.raises(
        ValueError, match=rf"^ModelShape\.head_dim must be a positive integer, got {bad!r}$"
    ):
        ModelShape(**{**fields, "head_dim": bad})
    with pytest.raises(ValueError, match=r"^ParallelLayout\.pipeline must be a positive integer"):
        ParallelLayout(tensor=2, pipeline=bad)
