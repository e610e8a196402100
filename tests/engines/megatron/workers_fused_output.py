"""Rank function of ``test_fused_output.py``: ``engine=megatron``'s own builder on real gloo
ranks, once with ``engine.stats_kernel=torch`` and once with ``fused_linear`` (Triton's
interpreter on CPU tensors), spawned by ``tests.parallel.world``."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from opefo_nemo.core.objectives import LossOutput
from opefo_nemo.parallel import VOCAB_SUMS

from .optimizer_capture import main_grads_at_steps
from .tiny import release_parallel_state
from .workers_build import _policy
from .workers_policy import hf_names

KERNELS = ("torch", "fused_linear")
#: Weight of the entropy term in the test's loss, so both of ``logprob``'s and ``entropy``'s
#: gradients flow back through the output layer.
ENTROPY_WEIGHT = 0.1


def loss_coefficients(batch) -> tuple[torch.Tensor, torch.Tensor]:
    """``(g_l, g_H)`` ``[B, T − 1]``: the loss is ``Σ g_l·logprob + g_H·entropy``, with
    ``g_l = −A·mask/N`` and ``g_H = −ENTROPY_WEIGHT·mask/N`` (``A`` the per-token advantages,
    ``N`` response tokens)."""
    mask = batch.response_mask.float()
    count = float(batch.n_response_tokens)
    return -batch.advantages * mask / count, -ENTROPY_WEIGHT * mask / count


def fused_against_torch(
    rank: int, world_size: int, cases: list[tuple[str, dict]], batch, micro: int, out: str
) -> None:
    """For each ``(hf_dir, engine settings)`` and each kernel of :data:`KERNELS`: the built
    policy's ``token_stats`` of ``batch`` (the four vocabulary sums too), then one
    ``train_step`` over micro-batches of ``micro`` responses with the loss of
    :func:`loss_coefficients`, capturing the reduced ``main_grad`` of every weight at the
    optimizer step (Hugging Face names, gathered over TP and PP) and the returned gradient norm.
    Rank 0 saves ``out/case_<i>.pt``: ``{kernel: {"stats", "grads", "grad_norm"}}``."""
    warnings.filterwarnings("ignore")
    g_l, g_h = loss_coefficients(batch)
    micros = batch.split(micro)
    for index, (hf_dir, settings) in enumerate(cases):
        try:
            results = {}
            for kernel in KERNELS:
                policy = _policy(hf_dir, {**settings, "stats_kernel": kernel})
                stats = policy.token_stats(batch, sums=VOCAB_SUMS)
                grads, norm = _gradients(policy, micros, g_l, g_h, micro)
                results[kernel] = {
                    "stats": {name: getattr(stats, name) for name in ("logprob", "entropy")}
                    | {name: getattr(stats, name) for name in VOCAB_SUMS},
                    "grads": grads,
                    "grad_norm": norm,
                }
            if rank == 0:
                torch.save(results, Path(out) / f"case_{index}.pt")
        finally:
            release_parallel_state()


def _gradients(policy, micros, g_l, g_h, micro: int) -> tuple[dict[str, torch.Tensor], float]:
    def loss_fn(index, stats):
        rows = slice(index * micro, index * micro + micros[index].rows)
        width = stats.logprob.shape[1]
        loss = (g_l[rows, :width] * stats.logprob).sum() + (g_h[rows, :width] * stats.entropy).sum()
        return LossOutput(loss, {})

    with main_grads_at_steps(policy) as steps:
        result = policy.train_step(micros, loss_fn, ())
    assert not result.skipped
    ((grads, _),) = steps
    return hf_names(policy.layout, grads), result.grad_norm
