"""SmolLM2's own weights after one AdamW step at lr 1e-6 in ``engine.dtype=bfloat16``: the fp32
masters take the update, which bf16 parameters updated in place would mostly lose (the update is
below bf16's spacing; docs/training.md, "Precision")."""

from __future__ import annotations

import torch

from opefo_nemo.config.engines import EngineConfig
from opefo_nemo.core.objectives.loss import LossOutput
from opefo_nemo.engines.hf import HFPolicy

LR = 1e-6


def test_one_step_at_lr_1e_6_moves_the_masters_where_bf16_weights_would_stay(
    smollm2_dir, chat_batch
):
    engine = EngineConfig(dtype="bfloat16", grad_clip=0.0, warmup_steps=0, micro_batch_size=3)
    policy = HFPolicy(smollm2_dir, engine, lr=LR, temperature=1.0)
    micro = chat_batch.split(engine.micro_batch_size)

    def loss_fn(index, stats):  # the responses' likelihood (the batch's ±1 advantages cancel)
        return LossOutput(stats.logprob[micro[index].response_mask].sum(), {})

    before = [m.detach().clone() for m in policy.weights.masters]
    captured = policy.capture_entropy_gradient(micro, loss_fn)
    assert captured is not None
    assert not policy.train_step(micro, loss_fn, ()).skipped

    total = sum(m.numel() for m in before)
    moved = sum(int((m != b).sum()) for m, b in zip(policy.weights.masters, before, strict=True))
    assert moved >= 0.99 * total, moved / total

    # the same AdamW step applied to bf16 parameters in place (no masters): most entries stay
    in_place = [torch.nn.Parameter(b.to(torch.bfloat16)) for b in before]
    for param, grad in zip(in_place, captured.grads, strict=True):
        param.grad = grad.to(torch.bfloat16)
    torch.optim.AdamW(in_place, lr=LR, weight_decay=0.0).step()
    kept = sum(
        int((p.detach() == b.to(torch.bfloat16)).sum())
        for p, b in zip(in_place, before, strict=True)
    )
    print(f"bf16 in place: {kept / total:.3f} of {total} weights unchanged")
    assert kept >= 0.5 * total
