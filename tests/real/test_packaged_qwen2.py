"""The real Qwen2 of ``model=qwen2_coder`` (Qwen2.5-Coder-0.5B-Instruct, installed on request by
scripts/install_qwen2.sh) through every path: the converted directory holds what ``transformers``
reads from the joined GGUF file with the Qwen2 shape the presets rely on; ``engine=megatron`` at
TP 1 and TP 2 gives its token statistics, exports the weights it loaded unchanged and takes the
strict-GRPO step of the ``hf`` engine; vLLM generates from it and stops at ``<|im_end|>``. Skipped,
with the reason, where the six packages are not installed."""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
from pathlib import Path

import pytest
import torch

from opefo_nemo.config.engines import EngineConfig
from opefo_nemo.config.method import load_method
from opefo_nemo.core.objectives import build_objective
from opefo_nemo.data import Problem
from opefo_nemo.data.prompt_codec import PromptCodec
from opefo_nemo.data.stop_tokens import stop_tokens
from opefo_nemo.engines.hf import HFPolicy
from opefo_nemo.models.packaged import QWEN2_5_CODER_0_5B_INSTRUCT as QWEN2
from opefo_nemo.models.packaged import converted_model, join_parts
from opefo_nemo.rollout import SamplingConfig, VLLMRolloutEngine
from opefo_nemo.trainer.update import update_rollout_batch
from tests.parallel.world import run_world
from tests.real.chat_reference import (
    QUESTIONS,
    assert_stats_match,
    chat_rows,
    reference_stats,
    rollout_python,
)
from tests.rollout.reference import hf_sampled_logprobs, load_hf_model

from . import workers_qwen2

ROOT = Path(__file__).resolve().parents[2]
FP32_EPS = torch.finfo(torch.float32).eps
#: fp32 round-off of 24 layers of width ≤ 4864 and a 151,936-way softmax, relative to the largest
#: |logprob|: a few roundings per layer grow like the depth times √width, ~24 · 70 · ε ≈ 2e-4;
#: allowed 2¹² ε ≈ 4.9e-4 (the SmolLM2 comparison's bound).
FP32_REL = 4096 * FP32_EPS
FP32 = {"dtype": "float32", "transformer_engine": False}
#: Adam's first step moves a weight by lr·g/(|g| + ε): with the default ε = 1e-8 an embedding
#: row's gradient element near ε (a token seen once) turns its fp32 round-off into a tenth of lr;
#: at 1e-6 such elements move by a hundredth of lr or less, and every |g| ≫ 1e-6 takes its full
#: step.
ADAM_EPS = 1e-6
#: A 630 M-parameter model built, run and stepped on CPU ranks takes minutes on two cores.
DEADLINE_S = 1800.0


def _missing() -> str | None:
    for distribution in (*QWEN2.distributions, "gguf", "accelerate"):
        try:
            importlib.metadata.distribution(distribution)
        except importlib.metadata.PackageNotFoundError:
            return f"{distribution} is not installed (opt-in: bash scripts/install_qwen2.sh)"
    return None


pytestmark = [pytest.mark.slow, pytest.mark.skipif(_missing() is not None, reason=str(_missing()))]


@pytest.fixture(scope="module")
def qwen2_dir():
    """The directory scripts/install_qwen2.sh converted (converted here if it is missing)."""
    cache = Path(os.environ.get("OPEFO_CACHE", ROOT / ".cache" / "opefo"))
    return converted_model(QWEN2.name, cache / QWEN2.name)


@pytest.fixture(scope="module")
def tokenizer(qwen2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qwen2_dir)


@pytest.fixture(scope="module")
def chat_batch(tokenizer):
    """:func:`chat_rows` ended by ``<|im_end|>``, padded with ``<|endoftext|>``; a row's two
    copies have advantages that do not cancel, so that strict GRPO's gradient is not zero."""
    return chat_rows(tokenizer, torch.tensor([1.0, -1.0, 0.5, -0.5, 0.5, -1.0]))


def test_shape_tokens_and_chat_template(qwen2_dir, tokenizer):
    config = json.loads((qwen2_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and "quantization_config" not in config
    shape = {k: config[k] for k in ("num_attention_heads", "num_key_value_heads", "hidden_size")}
    assert shape == {"num_attention_heads": 14, "num_key_value_heads": 2, "hidden_size": 896}
    assert config["num_hidden_layers"] == 24 and config["intermediate_size"] == 4864
    assert config["tie_word_embeddings"] is False and config["vocab_size"] == 151_936
    rope = config.get("rope_parameters", config).get("rope_theta", config.get("rope_theta"))
    assert rope == 1e6
    from safetensors import safe_open

    with safe_open(qwen2_dir / "model.safetensors", "pt") as weights:
        shapes = {name: weights.get_slice(name).get_shape() for name in weights.keys()}  # noqa: SIM118
    h, f, v, layers, kv = 896, 4864, 151_936, 24, 2 * 64
    per_layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * f + 2 * h
    assert sum(math.prod(s) for s in shapes.values()) == 2 * v * h + layers * per_layer + h
    assert shapes["model.layers.0.self_attn.q_proj.bias"] == [h]  # Qwen2's q/k/v biases
    assert "lm_head.weight" in shapes  # untied
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTIONS[0]}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith(f"<|im_start|>user\n{QUESTIONS[0]}<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == config["eos_token_id"]
    assert tokenizer.pad_token == "<|endoftext|>"


def test_logits_equal_those_of_transformers_reading_the_joined_gguf(
    qwen2_dir, chat_batch, tmp_path
):
    from transformers import AutoModelForCausalLM

    source = join_parts(QWEN2, tmp_path / "qwen2.gguf")
    reference = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=source.name)
    with torch.no_grad():
        want = reference.eval()(input_ids=chat_batch.input_ids).logits
    del reference
    converted = AutoModelForCausalLM.from_pretrained(qwen2_dir, dtype=torch.float32)
    with torch.no_grad():
        got = converted.eval()(input_ids=chat_batch.input_ids).logits
    assert torch.equal(got, want)


@pytest.mark.parametrize("tp", [1, 2])
def test_megatron_engine_stats_export_and_strict_step(qwen2_dir, chat_batch, tp, tmp_path):
    """At TP 1 and 2: statistics and export; the strict-GRPO step at TP 1 (at TP 2 the two ranks'
    optimizer states and the reference's would not fit a 24 GiB machine together)."""
    from tests.engines.megatron.workers_build import TEMPERATURE

    settings = {**FP32, "tensor_model_parallel_size": tp, "warmup_steps": 1, "adam_eps": ADAM_EPS}
    args = (str(qwen2_dir), settings, tp == 1, chat_batch, str(tmp_path))
    run_world(workers_qwen2.stats_export_and_step, tp, *args, deadline_s=DEADLINE_S)

    got = torch.load(tmp_path / "stats.pt")
    assert_stats_match(
        got, reference_stats(qwen2_dir, chat_batch, TEMPERATURE), chat_batch, FP32_REL
    )

    exported, stored = torch.load(tmp_path / "export.pt")
    assert sorted(exported) == stored  # every weight, under its Hugging Face name
    assert max(exported.values()) == 0.0  # the megatron layout maps back bit for bit
    if tp != 1:
        return

    metrics, weights = torch.load(tmp_path / "step.pt", mmap=True)
    engine = EngineConfig(dtype="float32", warmup_steps=1, adam_eps=ADAM_EPS)
    reference = HFPolicy(qwen2_dir, engine, lr=workers_qwen2.LR, temperature=TEMPERATURE)
    method = load_method("grpo_strict", [f"lr={workers_qwen2.LR}"])
    want_metrics = update_rollout_batch(
        reference, build_objective(method), chat_batch, chat_batch.rows, 0
    ).metrics
    assert metrics["grad/norm"] > 0
    rel = abs(metrics["grad/norm"] - want_metrics["grad/norm"]) / want_metrics["grad/norm"]
    assert rel <= 1e-3, (metrics["grad/norm"], want_metrics["grad/norm"])
    for name, weight in reference.named_weights():
        # Adam's first step moves a weight by lr·g/(|g| + ε): a step of about lr wherever
        # |g| ≫ ε (a wrong mapping shows as differences near 2 lr), while an element whose
        # gradient is near ε turns the engines' different fp32 reduction orders into a visible
        # share of lr; so a hundredth of lr on average and a twentieth at most
        diff = (weights[name] - weight).abs()
        assert float(diff.max()) <= 0.05 * workers_qwen2.LR, (name, float(diff.max()))
        assert float(diff.double().mean()) <= 0.01 * workers_qwen2.LR, name


@pytest.mark.vllm
def test_vllm_generates_in_the_chat_template_and_stops_at_im_end(qwen2_dir, tokenizer):
    codec = PromptCodec(qwen2_dir, "raw")
    prompts = [codec.encode(Problem(f"q{i}", q, "", "test")) for i, q in enumerate(QUESTIONS)]
    stop = stop_tokens(codec)
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in stop.ids
    sampling = SamplingConfig(temperature=0.7, max_new_tokens=48, stop_token_ids=stop.ids, seed=3)
    with VLLMRolloutEngine(
        qwen2_dir,
        python=rollout_python(),
        dtype="float32",
        max_model_len=256,
        startup_timeout_s=900,
    ) as engine:
        completions = engine.generate(prompts, 2, sampling)
    assert len(completions) == 6
    model = load_hf_model(qwen2_dir)
    ended = 0
    for c in completions:
        assert 1 <= len(c.token_ids) <= 48 and len(c.logprobs) == len(c.token_ids)
        if c.finish_reason != "length":
            assert c.token_ids[-1] in stop.ids
            ended += c.token_ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
        want = hf_sampled_logprobs(model, prompts[c.prompt_index], c.token_ids, 0.7)
        error = float((torch.tensor(c.logprobs) - want).abs().max())
        assert error <= 1e-3 * max(float(want.abs().max()), 1.0), error
    assert ended >= 1  # an instruct model answers a sum within 48 tokens and ends its turn
