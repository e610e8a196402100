"""The ``hf`` engine's training step on CUDA equals its CPU result (fp32, the tiny Qwen2 model).

Both devices compute the same fp32 arithmetic in other reduction orders (cuBLAS and CPU BLAS
tile their sums differently; TF32 is off for fp32 matmuls by torch's default), so every value may
differ by a few fp32 roundings per reduction: token statistics within ``2⁷ ε₃₂`` of the largest
|logprob| (as tests/engines/megatron/test_build.py allows between two implementations); every
gradient within ``10⁻⁵`` of its tensor's largest entry (tests/engines/megatron/test_policy.py's
allowance for two reduction orders) and the norm within ``10⁻⁴`` relative; every weight after the
first AdamW step, ``lr·g/(|g| + ε)``, within ``lr·δg/ε`` of the CPU's (that map's slope is at most
``1/ε``; ``δg`` the gradient allowance; ε raised to 1e-4). The statistics run on CUDA with
``stats_kernel=torch`` and ``triton`` (compiled), the CPU with torch. Skipped without CUDA.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA (README.md)", allow_module_level=True)
pytest.importorskip("transformers")

from opefo_nemo.config.engines import EngineConfig
from opefo_nemo.core.objectives import LossOutput
from opefo_nemo.engines.batch import build_batch
from opefo_nemo.engines.hf import HFPolicy
from opefo_nemo.models.tiny import TinyModelSpec, build_tiny_model

LR = 1e-3
ENGINE = EngineConfig(warmup_steps=0, grad_clip=0.0, adam_eps=1e-4, stats_kernel="torch")
FP32_REL = 128 * torch.finfo(torch.float32).eps


def _batch():
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 70, (n,), generator=gen).tolist() for n in (5, 9, 3, 7)]
    responses = [torch.randint(3, 70, (n,), generator=gen).tolist() for n in (12, 4, 20, 9)]
    advantages = torch.randn(4, generator=gen)
    return build_batch(prompts, responses, advantages, pad_id=0)


def _step(model_dir, device: str, kernel: str):
    config = dataclasses.replace(ENGINE, device=device, stats_kernel=kernel)
    policy = HFPolicy(model_dir, config, lr=LR, temperature=0.7)
    batch = _batch()
    stats = policy.token_stats(batch)
    mask = batch.response_mask.to(policy.device)
    adv = batch.advantages.to(policy.device)

    def loss_fn(index: int, s):
        loss = -(adv * s.logprob * mask).sum() - 0.1 * (s.entropy * mask).sum()
        return LossOutput(loss / float(batch.n_response_tokens), {})

    names = {param: name for name, param in policy.model.named_parameters()}
    grads: dict[str, torch.Tensor] = {}
    policy.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: grads.update(
            {names[p]: p.grad.cpu().clone() for group in opt.param_groups for p in group["params"]}
        )
    )
    update = policy.train_step([batch], loss_fn, ())
    weights = {name: p.detach().cpu().clone() for name, p in policy.model.named_parameters()}
    return stats, update.grad_norm, grads, weights, batch.response_mask


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", TinyModelSpec(), seed=0)


@pytest.mark.parametrize("kernel", ["torch", "triton"])
def test_cuda_step_equals_cpu_step(model_dir, kernel):
    cpu_stats, cpu_norm, cpu_grads, cpu_weights, mask = _step(model_dir, "cpu", "torch")
    stats, norm, grads, weights, _ = _step(model_dir, "cuda", kernel)
    scale = float(cpu_stats.logprob[mask].abs().max())
    for name in ("logprob", "entropy"):
        ours, ref = getattr(stats, name).cpu()[mask], getattr(cpu_stats, name)[mask]
        error = float((ours - ref).abs().max())
        assert error <= 2 * FP32_REL * scale, (name, error, scale)
    assert abs(norm - cpu_norm) <= 1e-4 * cpu_norm, (norm, cpu_norm)
    assert grads.keys() == cpu_grads.keys() == weights.keys() == cpu_weights.keys()
    for name, grad in cpu_grads.items():
        allowance = 1e-5 * float(grad.abs().max()) + 1e-12
        torch.testing.assert_close(grads[name], grad, rtol=0, atol=allowance, msg=name)
        step = LR * allowance / ENGINE.adam_eps
        torch.testing.assert_close(weights[name], cpu_weights[name], rtol=0, atol=step, msg=name)
