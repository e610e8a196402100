"""What the hf engine's update tests share: the engine settings, the tolerance of their gradients,
random rollouts of the tiny model's token ids and a per-row reference of the response logprobs.
The model itself is the ``model_dir`` fixture (conftest.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from opefo_nemo.config.engines import EngineConfig
from opefo_nemo.models.tiny import TinyModelSpec, build_tiny_model

TEMPERATURE = 0.7
#: fp32 gradients of two reduction orders (micro-batches, padding) against a per-row float64-loss
#: reference, relative to each tensor's terms (tests/metric_bounds.py)
GRAD_REL = 1e-4
ENGINE = EngineConfig(grad_clip=0.0, warmup_steps=0)


def tiny_model(directory: Path) -> Path:
    """The tiny model the update tests train (random weights of scale 0.1), built into
    ``directory``."""
    return build_tiny_model(directory, TinyModelSpec(initializer_range=0.1), seed=0)


def random_rollout(rows: int = 6, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for _ in range(rows):
        p = int(torch.randint(2, 6, (1,), generator=gen))
        r = int(torch.randint(1, 7, (1,), generator=gen))
        prompts.append(torch.randint(3, 60, (p,), generator=gen).tolist())
        responses.append(torch.randint(3, 60, (r,), generator=gen).tolist())
    advantages = torch.randn(rows, generator=gen)
    return prompts, responses, advantages


def response_logprobs(model, prompts, responses) -> list[torch.Tensor]:
    """``log softmax(z / T)`` of each response token, one unpadded forward per row."""
    out = []
    for p, r in zip(prompts, responses, strict=True):
        logits = model(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1 : -1]
        logp = torch.log_softmax(logits.double() / TEMPERATURE, dim=-1)
        out.append(logp.gather(1, torch.tensor(r)[:, None])[:, 0])
    return out
