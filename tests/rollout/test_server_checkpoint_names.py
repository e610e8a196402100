"""The names a refit may carry (``server.checkpoint_names``), read from the safetensors headers,
against the Hugging Face model's own ``state_dict`` (which lists a tied ``lm_head.weight``)."""

from __future__ import annotations

import torch
from safetensors.torch import save_file

from opefo_nemo.models.tiny import TinyModelSpec, build_tiny_model
from opefo_nemo.rollout.server import checkpoint_names
from tests.rollout.reference import load_hf_model


def test_untied_model_names_are_its_state_dict(tiny_model_dir):
    assert checkpoint_names(tiny_model_dir) == set(load_hf_model(tiny_model_dir).state_dict())


def test_tied_model_accepts_the_lm_head_it_does_not_store(tmp_path):
    model_dir = build_tiny_model(tmp_path / "tied", TinyModelSpec(tie_word_embeddings=True))
    names = checkpoint_names(model_dir)
    assert names == set(load_hf_model(model_dir).state_dict())
    assert "lm_head.weight" in names


def test_names_span_every_shard_and_none_without_safetensors(tmp_path):
    assert checkpoint_names(tmp_path) is None
    save_file({"a.weight": torch.zeros(2), "b.bias": torch.zeros(1)}, tmp_path / "x-1.safetensors")
    save_file({"c.weight": torch.zeros(3)}, tmp_path / "x-2.safetensors", metadata={"k": "v"})
    assert checkpoint_names(tmp_path) == {"a.weight", "b.bias", "c.weight"}
