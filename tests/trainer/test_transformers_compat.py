"""The dtype keyword of ``from_pretrained`` is chosen by what the installed transformers has
(``models/transformers_compat.py``); the weights then load in the requested dtype, equal to the
checkpoint's values cast to it."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from opefo_nemo.models.tiny import build_tiny_model
from opefo_nemo.models.transformers_compat import dtype_keyword, load_causal_lm


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
