"""The NeMo actor's NeMo-free decisions (``engines/aligner/nemo_config.py``), checked without NeMo
against NeMo 2.2's key names: the model overrides of every engine key, the trainer settings and
data-parallel size, where the NeMo checkpoint is looked for, and the architecture checks against
the Hugging Face ``config.json``."""

from __future__ import annotations

import pytest

from opefo_nemo.config.engines import MegatronEngineConfig
from opefo_nemo.engines.aligner import nemo_config


def test_model_overrides_map_every_layout_key():
    engine = MegatronEngineConfig(
        dtype="bfloat16",
        micro_batch_size=2,
        tensor_model_parallel_size=2,
        pipeline_model_parallel_size=2,
        sequence_parallel=True,
        transformer_engine=False,
        recompute_activations=True,
        use_distributed_optimizer=True,
        make_vocab_size_divisible_by=64,
        weight_decay=0.1,
        adam_beta1=0.8,
        adam_beta2=0.95,
        adam_eps=1e-6,
    )
    cfg = nemo_config.model_overrides(engine, lr=2e-6, data_parallel=4)
    assert cfg["precision"] == "bf16-mixed" and cfg["megatron_amp_O2"] is True
    assert (cfg["tensor_model_parallel_size"], cfg["pipeline_model_parallel_size"]) == (2, 2)
    assert cfg["sequence_parallel"] is True and cfg["transformer_engine"] is False
    assert (cfg["micro_batch_size"], cfg["global_batch_size"]) == (2, 8)
    assert cfg["make_vocab_size_divisible_by"] == 64
    assert cfg["activations_checkpoint_granularity"] == "full"
    assert cfg["activations_checkpoint_method"] == "uniform"
    # NeMo wraps nothing and builds no optimizer: megatron's DDP and optimizer are the engine's
    assert cfg["optim"] == {"name": "adamw", "lr": 2e-6}
    plain = nemo_config.model_overrides(
        MegatronEngineConfig(dtype="float32", use_distributed_optimizer=False),
        lr=1e-6,
        data_parallel=1,
    )
    assert (plain["precision"], plain["megatron_amp_O2"]) == (32, False)
    assert plain["optim"]["name"] == "adamw" and plain["activations_checkpoint_granularity"] is None


def test_trainer_settings_and_world():
    engine = MegatronEngineConfig(name="aligner", grad_clip=0.5, tensor_model_parallel_size=2)
    trainer = nemo_config.trainer_settings(engine, devices=8, num_nodes=4)
    assert (trainer["devices"], trainer["num_nodes"], trainer["precision"]) == (8, 4, "bf16-mixed")
    assert trainer["gradient_clip_val"] == 0.5 and trainer["logger"] is False
    assert nemo_config.data_parallel_size(engine, 32) == 16
    with pytest.raises(ValueError, match="world size 3 is not a multiple of"):
        nemo_config.data_parallel_size(engine, 3)


def test_find_nemo_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"model\.nemo or .*/nemo; neither exists"):
        nemo_config.find_nemo_checkpoint(tmp_path)
    (tmp_path / "nemo").mkdir()
    assert nemo_config.find_nemo_checkpoint(tmp_path) == tmp_path / "nemo"
    (tmp_path / "model.nemo").write_bytes(b"")
    assert nemo_config.find_nemo_checkpoint(tmp_path) == tmp_path / "model.nemo"
    elsewhere = tmp_path / "elsewhere.nemo"
    with pytest.raises(FileNotFoundError, match=r"engine\.nemo_checkpoint=.*elsewhere\.nemo"):
        nemo_config.find_nemo_checkpoint(tmp_path, str(elsewhere))
    elsewhere.touch()
    assert nemo_config.find_nemo_checkpoint(tmp_path, str(elsewhere)) == elsewhere


def test_architecture_mismatches_compare_nemo_with_config_json():
    """Reference: Qwen2.5-Math-7B's published config.json and the NeMo model config its
    converter writes (same shape, RMSNorm ε 1e-6, rope base 10000, untied)."""
    hf = {
        "num_hidden_layers": 28,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    }
    nemo = {
        "num_layers": 28,
        "hidden_size": 3584,
        "ffn_hidden_size": 18944,
        "num_attention_heads": 28,
        "num_query_groups": 4,
        "layernorm_epsilon": 1e-6,
        "rotary_base": 10000,
        "share_embeddings_and_output_weights": False,
    }
    assert nemo_config.architecture_mismatches(nemo, hf) == []
    off = {**nemo, "layernorm_epsilon": 1e-5, "rotary_base": 1000000}
    assert nemo_config.architecture_mismatches(off, hf) == [
        "layernorm_epsilon: 1e-05 vs config.json rms_norm_eps: 1e-06",
        "rotary_base: 1000000 vs config.json rope_theta: 10000.0",
    ]
    # NeMo's defaults when the keys are absent: ε 1e-5 and tied embeddings differ from HF's.
    bare = {k: v for k, v in nemo.items() if k not in ("layernorm_epsilon", "rotary_base")}
    bare.pop("share_embeddings_and_output_weights")
    assert [m.split(":")[0] for m in nemo_config.architecture_mismatches(bare, hf)] == [
        "layernorm_epsilon",
        "share_embeddings_and_output_weights",
    ]
    # No num_query_groups: one group per head; HF without num_key_value_heads: the same.
    mha = {k: v for k, v in nemo.items() if k != "num_query_groups"}
    hf_mha = {k: v for k, v in hf.items() if k != "num_key_value_heads"}
    assert nemo_config.architecture_mismatches(mha, hf_mha) == []
