"""The engine side of :class:`~.protocols.EntropyCorrection`: the entropy gradient held between
its backward and the optimizer step, and the correction of the applied update after it.

It works on the tensors the optimizer updates in place (the ``hf`` engine's parameters,
megatron's fp32 main weights or the distributed optimizer's shards of them), each beside its
share of ``g = ∇θ H̄`` in the same layout. Only sums cross ranks:

1. at capture, this rank's ``⟨g, g⟩`` and ``⟨g, θ_before⟩``;
2. after the step, ``⟨g, Δθ⟩ = ⟨g, θ_after⟩ − ⟨g, θ_before⟩`` and ``⟨g, g⟩``, one all-reduce of
   two float64 numbers, then ``α`` (:func:`~opefo_nemo.core.update_correction.correction_size`,
   identical on every rank) and ``θ ← θ + α g`` on every local tensor;
3. ``⟨g, Δθ'⟩`` measured on the corrected tensors: one more all-reduce of one number.

``⟨g, Δθ⟩`` is a difference of two dot products, each exact to float64 round-off
(:func:`~opefo_nemo.core.update_correction.dot64`), so no copy of ``θ_before`` is kept: the
only memory the correction adds is ``g``, one fp32 tensor per optimizer tensor.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ..core.update_correction import CorrectionResult, correction_size, dot64

AllReduce = Callable[[Tensor], Tensor]
"""Sums a float64 vector over the ranks whose counted tensors together make the whole model."""


def on_one_device(values: Tensor) -> Tensor:
    """The :data:`AllReduce` of a single process: the sums are already global."""
    return values


class CapturedEntropyGradient:
    """``g`` of each optimizer tensor, taken before the optimizer step (module docstring).

    ``params``: the tensors the optimizer updates in place; ``grads``: ``g`` of each, same shape
    (this object keeps them: they must not be buffers the engine zeroes or reuses);
    ``counted``: whether this rank's copy of each enters the global sums (``False`` for a copy
    another rank also counts: tensor-parallel replicas, a tied embedding's second copy,
    data-parallel replicas of an unsharded optimizer); ``all_reduce``: sums over the ranks
    whose counted tensors make the whole model. Every copy, counted or not, gets the same
    correction, so replicas stay equal.
    """

    def __init__(
        self,
        params: Sequence[Tensor],
        grads: Sequence[Tensor],
        counted: Sequence[bool],
        all_reduce: AllReduce,
    ) -> None:
        if not len(params) == len(grads) == len(counted):
            raise ValueError(
                f"{len(params)} parameters, {len(grads)} gradients, {len(counted)} flags"
            )
        for param, grad in zip(params, grads, strict=True):
            if param.shape != grad.shape:
                raise ValueError(
                    f"entropy gradient of shape {tuple(grad.shape)} for a parameter of shape "
                    f"{tuple(param.shape)}"
                )
        self.params, self.grads, self.counted = list(params), list(grads), list(counted)
        self.all_reduce = all_reduce
        self.grad_sq = self._sum(self.grads)
        self.before = self._sum(self.params)

    def _sum(self, tensors: Sequence[Tensor]) -> Tensor:
        """``Σ ⟨g_i, tensors_i⟩`` over this rank's counted tensors, 0-d float64."""
        device = self.grads[0].device if self.grads else torch.device("cpu")
        total = torch.zeros((), dtype=torch.float64, device=device)
        for grad, tensor, counted in zip(self.grads, tensors, self.counted, strict=True):
            if counted:
                total += dot64(grad, tensor)
        return total

    @torch.no_grad()
    def correct(self, target: float) -> CorrectionResult:
        """After the optimizer step: ``θ ← θ + α g`` with ``⟨g, Δθ + α g⟩ = target`` (module
        docstring); the caller then copies the corrected tensors wherever the optimizer would
        copy its own (megatron: main weights to the model's parameters)."""
        flow_local = self._sum(self.params) - self.before
        grad_sq, flow = self.all_reduce(torch.stack([self.grad_sq, flow_local])).tolist()
        alpha = correction_size(target, flow, grad_sq)
        for param, grad in zip(self.params, self.grads, strict=True):
            param.add_(grad.to(param.dtype), alpha=alpha)
        after = self.all_reduce((self._sum(self.params) - self.before).reshape(1))
        return CorrectionResult(
            target=target,
            flow_before=flow,
            flow_after=float(after[0]),
            alpha=alpha,
            grad_norm=math.sqrt(grad_sq),
        )
