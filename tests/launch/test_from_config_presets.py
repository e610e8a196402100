"""The paper presets' layouts hold on their allocation (32 A100-80GB) for every spec §5 method.

The model shapes are the published ``config.json`` values of Qwen2.5-Math-7B and Qwen3-4B-Base,
written to a temporary model directory (nothing is downloaded). The presets select the ``megatron``
engine (``conf/engine/megatron.yaml``); each composed config also passes the trainer's own
start-up validation (``TrainConfig.from_mapping``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from opefo_nemo.cli.preflight import compose_config
from opefo_nemo.config.method import method_names
from opefo_nemo.config.train import TrainConfig
from opefo_nemo.launch import GIB
from opefo_nemo.launch.checks import plan_memory, plan_problems
from opefo_nemo.launch.from_config import plan_from_config
from tests.preset_models import HF_CONFIGS

CONF = Path(__file__).resolve().parents[2] / "conf"

PRESETS = {"opefo_7b": ("Qwen2.5-Math-7B", 3000), "opefo_4b": ("Qwen3-4B-Base", 8000)}


@pytest.fixture
def composed(tmp_path, monkeypatch):
    """Compose ``+preset=<name> method=<m>`` with Hydra over ``conf/``; models are the published
    config.json files, written to a temporary model directory beside empty weight and tokenizer
    files (of those, the checks read only their presence)."""
    for name, config in HF_CONFIGS.items():
        model = tmp_path / "models" / name
        model.mkdir(parents=True)
        (model / "config.json").write_text(json.dumps(config))
        (model / "model.safetensors").write_bytes(b"")
        (model / "tokenizer.json").write_text("{}")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "dapo-math-17k.parquet").write_bytes(b"")
    monkeypatch.setenv("OPEFO_MODEL_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("OPEFO_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("OPEFO_CKPT_DIR", str(tmp_path / "checkpoints"))

    def compose(preset: str, method: str | None = None) -> dict:
        overrides = [f"+preset={preset}"] + ([f"method={method}"] if method else [])
        config, problems = compose_config(overrides)
        assert problems == [] and config is not None, problems
        TrainConfig.from_mapping(config)
        return config

    return compose


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_select_the_megatron_engine_and_opefo(preset):
    defaults = OmegaConf.load(CONF / "preset" / f"{preset}.yaml")["defaults"]
    overrides = {key: value for entry in defaults for key, value in entry.items()}
    assert overrides == {
        "override /model": "local",
        "override /data": "dapo_math",
        "override /engine": "megatron",
        "override /method": "opefo",
    }


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_layout_fits_32_a100s_for_every_method(preset, composed, tmp_path):
    model, max_response = PRESETS[preset]
    assert composed(preset)["method"]["name"] == "opefo"
    for method in method_names():
        config = composed(preset, method)
        assert config["method"]["name"] == method
        assert config["engine"]["name"] == "megatron"
        assert config["model"]["path"] == str(tmp_path / "models" / model)
        assert config["rollout"]["max_new_tokens"] == max_response
        assert (
            config["trainer"]["prompts_per_step"] * config["trainer"]["responses_per_prompt"] == 256
        )
        assert config["engine"]["warmup_steps"] == 10
        plan = plan_from_config(config, world_size=32, gpu_memory_bytes=80 * GIB)
        assert plan.shape is not None and plan.shape.vocab_size == HF_CONFIGS[model]["vocab_size"]
        assert plan_problems(plan) == [], (preset, method)
        estimate = plan_memory(plan)
        # Headroom: the peak stays below 75 GiB of the 80.
        assert estimate is not None and estimate.peak < 75 * GIB, (preset, method)
    # The same preset does not fit on 24 GiB GPUs; 256 responses over DP 15 plan, since ranks
    # may hold different numbers of micro-batches (docs/batch_layout.md).
    small = plan_from_config(config, world_size=32, gpu_memory_bytes=24 * GIB)
    assert [p.topic for p in plan_problems(small)] == ["memory"]
    odd = plan_from_config(config, world_size=30, gpu_memory_bytes=80 * GIB)
    assert odd.world_size // (odd.tensor_parallel * odd.pipeline_parallel) == 15
    assert plan_problems(odd) == []
    # engine.stats_kernel=fused_linear reaches the estimate: no logits on the last stage.
    fused_config = {**config, "engine": {**config["engine"], "stats_kernel": "fused_linear"}}
    fused = plan_memory(plan_from_config(fused_config, world_size=32, gpu_memory_bytes=80 * GIB))
    assert fused is not None and fused.fused_output_layer
    assert fused.logits < estimate.logits and fused.training < estimate.training


def test_a_token_budget_replaces_the_micro_batch_in_the_plan(composed):
    """``engine.max_tokens_per_micro_batch`` reaches the estimate: the widest micro-batch holds
    the budget's tokens (twice the 7B preset's one row of the longest sequence: twice its
    activations and logits), and any count of micro-batches splits over the ranks."""
    config = composed("opefo_7b")
    plan = plan_from_config(config, world_size=32, gpu_memory_bytes=80 * GIB)
    budget = 2 * plan.memory.micro_batch_size * plan.memory.sequence_length
    budgeted = {**config, "engine": {**config["engine"], "max_tokens_per_micro_batch": budget}}
    TrainConfig.from_mapping(budgeted)  # the budget holds the longest row
    with_budget = plan_from_config(budgeted, world_size=32, gpu_memory_bytes=80 * GIB)
    assert with_budget.memory.max_tokens_per_micro_batch == budget
    rows, tokens = plan_memory(plan), plan_memory(with_budget)
    assert rows is not None and tokens is not None
    assert abs(tokens.activations - 2 * rows.activations) <= 1  # each rounded up to a byte
    assert tokens.logits == 2 * rows.logits
    odd = plan_from_config(budgeted, world_size=30, gpu_memory_bytes=80 * GIB)
    assert "batch" not in [p.topic for p in plan_problems(odd)]
