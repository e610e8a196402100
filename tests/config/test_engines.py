"""``engine=megatron`` / ``engine=aligner``: conf/engine/megatron.yaml (and aligner.yaml, which
extends it) compose into a validated MegatronEngineConfig, contradictions name the key, the paper
presets select engine=megatron and validate, ``engine=hf`` is unchanged, and building the NeMo
actor here fails with a clear message (NeMo is not installed)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from opefo_nemo.config.compose import compose
from opefo_nemo.config.engines import EngineConfig, MegatronEngineConfig
from opefo_nemo.engines.aligner.availability import AlignerUnavailableError, build_actor
from tests.preset_models import HF_CONFIGS

QWEN_7B = HF_CONFIGS["Qwen2.5-Math-7B"]


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN_7B))
    return tmp_path


def _aligner(*overrides: str, model=None, engine="aligner"):
    path = [f"model.path={model}", "model.embedded=false"] if model else []
    # the first task's model: the default model's file sets the micro-batch of its runs
    return compose([f"engine={engine}", "model=tiny_arithmetic", *path, *overrides])[0]


def test_aligner_extends_megatron_and_hf_is_unchanged():
    megatron = _aligner(engine="megatron").engine
    assert megatron == MegatronEngineConfig()
    config = _aligner()
    assert config.engine == dataclasses.replace(megatron, name="aligner")
    hf = compose(["model=tiny_arithmetic"])[0].engine
    assert hf == EngineConfig(micro_batch_size=16)
    assert compose(["engine.device=cuda:1"])[0].engine.device == "cuda:1"


@pytest.mark.parametrize("preset", ["opefo_7b", "opefo_4b"])
def test_paper_presets_validate(preset, tmp_path, monkeypatch):
    monkeypatch.setenv("OPEFO_MODEL_DIR", str(tmp_path))
    name = "Qwen2.5-Math-7B" if preset == "opefo_7b" else "Qwen3-4B-Base"
    (tmp_path / name).mkdir()
    (tmp_path / name / "config.json").write_text(json.dumps(QWEN_7B))
    engine = compose([f"+preset={preset}"])[0].engine
    assert isinstance(engine, MegatronEngineConfig) and engine.name == "megatron"
    assert engine.tensor_model_parallel_size == 2 and engine.sequence_parallel
    assert engine.dtype == "bfloat16" and engine.use_distributed_optimizer
    nemo = compose([f"+preset={preset}", "engine=aligner"])[0].engine
    assert nemo == dataclasses.replace(engine, name="aligner")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["engine.sequence_parallel=true"], "engine.sequence_parallel needs engine.tensor_model"),
        (["engine.tensor_model_parallel_size=0"], "engine.tensor_model_parallel_size must be >= 1"),
        (["engine.pipeline_model_parallel_size=0"], "engine.pipeline_model_parallel_size must"),
        (["engine.rollout_tp_size=0"], "engine.rollout_tp_size must be >= 1"),
        (["engine.micro_batch_size=0"], "engine.micro_batch_size must be >= 1"),
        (["engine.make_vocab_size_divisible_by=0"], "engine.make_vocab_size_divisible_by must"),
        (["engine.dtype=float16"], "engine.dtype is 'float16'"),
        (["engine.grad_clip=-1"], "engine.grad_clip must be >= 0"),
        (["+engine.devices=cpu"], "unknown key engine.devices"),
        (["engine.device=gpu"], "engine.device is 'gpu'"),
        (["engine.device=cpu"], "engine.device =cpu is for engine=megatron"),
        (["engine.nemo_checkpoint=x.nemo", "engine.name=megatron"], "engine.nemo_checkpoint is"),
        (["engine.sequence_parallel=2"], "engine.sequence_parallel must be true or false"),
        (["engine.name=nemo"], "engine.name is 'nemo'"),
        (["engine.name=megatron", "engine.device=cpu", "engine.stats_kernel=triton"], "=triton"),
        (
            ["engine.name=megatron", "engine.device=cpu", "engine.stats_kernel=fused_linear"],
            "=fused_linear needs engine.device=cuda",
        ),
    ],
)
def test_contradictions_name_the_key(overrides, message):
    with pytest.raises(ValueError, match=message):
        _aligner(*overrides)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["engine.pipeline_model_parallel_size=32"], r"\(32\) must divide the 28 decoder layers"),
        (["engine.pipeline_model_parallel_size=3"], r"\(3\) must divide the 28 decoder layers"),
        (["engine.tensor_model_parallel_size=8"], r"\(8\) must divide num_attention_heads = 28"),
        (
            ["engine.tensor_model_parallel_size=2", "engine.make_vocab_size_divisible_by=1"],
            None,
        ),
    ],
)
def test_layout_against_the_model(model_dir, overrides, message):
    if message is None:
        assert _aligner(*overrides, model=model_dir).engine.tensor_model_parallel_size == 2
        return
    with pytest.raises(ValueError, match=message):
        _aligner(*overrides, model=model_dir)


def test_building_the_engine_here_fails_clearly():
    with pytest.raises(AlignerUnavailableError) as error:
        build_actor("model", _aligner().engine, lr=1e-6, temperature=1.0)
    text = str(error.value)
    assert "engine.name=aligner" in text
    assert "nemo, nemo_aligner" in text  # NeMo is not installed in this environment


def test_package_imports_without_nemo_or_megatron():
    code = (
        "import sys, opefo_nemo.engines.aligner; "
        "print(sorted({m.split('.')[0] for m in sys.modules} "
        "& {'megatron', 'nemo', 'nemo_aligner'}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
