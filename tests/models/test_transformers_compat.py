"""The dtype keyword of ``from_pretrained`` is chosen by what the installed transformers has
(``models/transformers_compat.py``); the weights then load in the requested dtype, equal to the
checkpoint's values cast to it."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from opefo_nemo.models.tiny import build_tiny_model
from opefo_nemo.models.transformers_compat import dtype_keyword, load_causal_lm, quiet_progress


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_load_causal_lm_gives_the_requested_dtype(tmp_path, dtype):
    model_dir = build_tiny_model(tmp_path / "tiny")
    assert dtype_keyword() in ("dtype", "torch_dtype")
    model = load_causal_lm(model_dir, dtype)
    saved = load_file(model_dir / "model.safetensors")
    loaded = dict(model.named_parameters())
    assert saved.keys() <= loaded.keys()
    for name, tensor in saved.items():
        assert loaded[name].dtype == dtype, name
        assert torch.equal(loaded[name].detach(), tensor.to(dtype)), name  # a cast is exact


def test_loading_and_checkpointing_print_no_progress_bars(tmp_path, capfd):
    """A run's output shows its own progress: no "Loading weights" bar when the engine loads a
    model, no "Writing model shards" bar for each checkpoint; transformers' setting is restored
    after (a caller that wants its bars keeps them)."""
    from transformers.utils import logging as transformers_logging

    from opefo_nemo.config.engines import EngineConfig
    from opefo_nemo.engines.hf import HFPolicy

    model_dir = build_tiny_model(tmp_path / "tiny")
    capfd.readouterr()
    policy = HFPolicy(model_dir, EngineConfig(), lr=1e-3, temperature=1.0)
    policy.save_model(tmp_path / "checkpoint")
    quiet = capfd.readouterr().err
    assert (tmp_path / "checkpoint" / "model.safetensors").is_file()
    assert "Loading weights" not in quiet and "Writing model shards" not in quiet
    assert transformers_logging.is_progress_bar_enabled()
    with quiet_progress():
        assert not transformers_logging.is_progress_bar_enabled()
    assert transformers_logging.is_progress_bar_enabled()
    load_causal_lm(model_dir, torch.float32).save_pretrained(tmp_path / "plain")
    assert "Writing model shards" in capfd.readouterr().err  # the bar quiet_progress removes
