"""The NeMo actor's imports and its NeMo-free decisions.

- Without NeMo (CI): ``build_actor`` fails naming exactly the missing modules, and the actor's
  config mapping (``nemo_config``) is checked against NeMo 2.2's key names.
- With NeMo and NeMo-Aligner installed (the NeMo container, or the CPU environment of
  tests/gpu/README.md): importing ``actor`` succeeds and pulls in no TensorRT-LLM, which is not
  installed there either (NeMo-Aligner's own ``megatron_gpt_reinforce_actor`` then fails to
  import, which is why the actor does not use it).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from opefo_nemo.config.engines import MegatronEngineConfig
from opefo_nemo.engines.aligner import nemo_config
from opefo_nemo.engines.aligner.availability import (
    AlignerUnavailableError,
    build_actor,
    missing_modules,
)

HAVE_NEMO = all(importlib.util.find_spec(name) is not None for name in ("nemo", "nemo_aligner"))


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


@pytest.mark.skipif(HAVE_NEMO, reason="NeMo is installed here")
def test_build_actor_names_the_missing_modules(tmp_path):
    expected = [m for m in ("nemo", "nemo_aligner", "megatron.core") if not _found(m)]
    assert missing_modules() == expected and "nemo" in expected
    with pytest.raises(AlignerUnavailableError) as error:
        build_actor(tmp_path, MegatronEngineConfig(), lr=1e-6, temperature=1.0)
    text = str(error.value)
    assert text.startswith("engine.name=aligner: this environment lacks ")
    assert f"lacks {', '.join(expected)};" in text


def _found(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


@pytest.mark.skipif(not HAVE_NEMO, reason="needs nemo and nemo_aligner (tests/gpu/README.md)")
def test_actor_imports_without_tensorrt_llm():
    assert importlib.util.find_spec("tensorrt_llm") is None, "TensorRT-LLM is installed here"
    code = (
        "import sys, opefo_nemo.engines.aligner.actor as a; "
        "print(a.OpefoActorModel.__mro__[1].__name__, "
        "sorted(m for m in sys.modules if m.split('.')[0] == 'tensorrt_llm' "
        "or m == 'nemo_aligner.utils.trt_llm'))"
    )
    result = _run(code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "MegatronGPTModel []"
    # What the actor avoids: NeMo-Aligner's REINFORCE actor needs TensorRT-LLM to import at all.
    reinforce = _run("import nemo_aligner.models.nlp.gpt.megatron_gpt_reinforce_actor")
    assert "No module named 'tensorrt_llm'" in reinforce.stderr


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
