"""``∇θ H̄`` of a Hugging Face model by autograd, the reference of the entropy-neutral tests."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from opefo_nemo.engines.batch import TrainBatch
from opefo_nemo.models.transformers_compat import load_causal_lm


def entropy_gradient(
    model_dir: Path, batch: TrainBatch, dtype: torch.dtype, temperature: float
) -> dict[str, torch.Tensor]:
    """``∇θ H̄`` in ``dtype`` under every parameter's name: ``H̄`` the batch's token-mean
    entropy of ``softmax(logits / temperature)`` (spec §1) over its response tokens, in one
    forward of the whole batch."""
    model = load_causal_lm(model_dir, dtype)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long()).logits
    logp = torch.log_softmax(logits[:, :-1] / temperature, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)
    mask = batch.response_mask
    ((entropy * mask).sum() / mask.sum()).backward()
    return {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def dot(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """``Σ a·b`` over the names of ``a``, in float64."""
    return math.fsum(float((a[k].double() * b[k].double()).sum()) for k in a)
