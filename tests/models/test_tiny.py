"""The tiny model: tokenizer, idempotent build, and a Hugging Face round trip (no vLLM)."""

from __future__ import annotations

import json

import pytest
import torch

from opefo_nemo.models.tiny import (
    ALPHABET,
    BOS_ID,
    EOS_ID,
    PAD_ID,
    VOCAB,
    TinyModelSpec,
    build_tiny_model,
    decode,
    encode,
    load_tokenizer,
)
from tests.rollout.reference import load_hf_model

TEXT = "Q: (12+3)*4 = ?\nA: 60. Yes, it is."


def test_alphabet_is_the_documented_one():
    assert VOCAB[:3] == ("<pad>", "<bos>", "<eos>") and (PAD_ID, BOS_ID, EOS_ID) == (0, 1, 2)
    assert len(set(ALPHABET)) == len(ALPHABET) == 10 + 11 + 2 + 26 + 26
    assert set(ALPHABET) >= set("0123456789+-*/=()?:., \nazAZ")


def test_encode_is_one_id_per_character_and_decodes_back():
    ids = encode(TEXT)
    assert len(ids) == len(TEXT)
    assert [VOCAB[i] for i in ids] == list(TEXT)
    assert decode(ids) == TEXT
    with pytest.raises(ValueError, match=r"'é' at position 3"):
        encode("abcé")


def test_hf_tokenizer_matches_encode(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    assert tokenizer(TEXT, add_special_tokens=False).input_ids == encode(TEXT)
    assert tokenizer.decode(encode(TEXT)) == TEXT
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)


def test_config_follows_the_spec(tiny_model_dir):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    spec = TinyModelSpec()
    assert config["model_type"] == "qwen2"
    assert config["vocab_size"] == len(VOCAB)
    assert config["head_dim"] == spec.head_dim == 64
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (2, 1)
    assert config["tie_word_embeddings"] is False
    model = load_hf_model(tiny_model_dir)
    logits = model(torch.tensor([encode(TEXT)])).logits
    assert logits.shape == (1, len(TEXT), len(VOCAB)) and torch.isfinite(logits).all()


def test_build_is_idempotent_seeded_and_refuses_a_different_spec(tmp_path):
    spec = TinyModelSpec(num_hidden_layers=1, intermediate_size=64)
    path = build_tiny_model(tmp_path / "m", spec, seed=1)
    weights = (path / "model.safetensors").read_bytes()
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model(tmp_path / "m", spec, seed=1) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime  # not rewritten
    assert (
        build_tiny_model(tmp_path / "again", spec, seed=1) / "model.safetensors"
    ).read_bytes() == weights
    assert (
        build_tiny_model(tmp_path / "other", spec, seed=2) / "model.safetensors"
    ).read_bytes() != weights
    with pytest.raises(FileExistsError, match="seed=1"):
        build_tiny_model(tmp_path / "m", spec, seed=2)
    with pytest.raises(FileExistsError, match="not a tiny model"):
        build_tiny_model(tmp_path, spec)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again", "m", "other"]  # no staging left


def test_spec_validation():
    with pytest.raises(ValueError, match="multiple of num_key_value_heads"):
        TinyModelSpec(num_attention_heads=3, num_key_value_heads=2)
    with pytest.raises(ValueError, match="hidden_size"):
        TinyModelSpec(hidden_size=0)
