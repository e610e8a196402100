"""The engines' side of a corrected update (docs/core.md, "The entropy-neutral update"): the
entropy gradient ``g = ∇θ H̄`` kept beside the tensors the optimizer updates, the inner products
that measure the applied update along it, and the move along it. The order of the steps and
``α`` are the trainer's (``trainer/update.py``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from opefo_nemo.core.update_correction import dot64

AllReduce = Callable[[Tensor], Tensor]
"""Sums a float64 vector over the ranks whose counted tensors together make the whole model."""


def on_one_device(values: Tensor) -> Tensor:
    """The :data:`AllReduce` of a single process: the sums are already global."""
    return values


def no_publish() -> None:
    """What an optimizer whose tensors are the model's parameters does after a move: nothing."""


class CapturedEntropyGradient:
    """``g`` of each optimizer tensor, taken before the optimizer step.

    ``params``: the tensors the optimizer updates in place (the ``hf`` engine's parameters,
    megatron's fp32 main weights or the distributed optimizer's shards of them); ``grads``: ``g``
    of each, same shape and layout (this object keeps them: they must not be buffers the engine
    zeroes or reuses); ``counted``: whether this rank's copy of each enters the global sums
    (``False`` for a copy another rank also counts: tensor-parallel replicas, a tied embedding's
    second copy, data-parallel replicas of an unsharded optimizer); ``all_reduce``: sums over the
    ranks whose counted tensors make the whole model; ``publish``: after :meth:`move`, copies the
    moved tensors wherever the optimizer's step copies its own (megatron: main weights into the
    model's parameters). Every copy, counted or not, moves alike, so replicas stay equal.

    The applied update is measured without a copy of ``θ_before``: this rank's ``⟨g, θ_before⟩``
    is summed at capture, and ``⟨g, Δθ⟩ = ⟨g, θ_now⟩ − ⟨g, θ_before⟩``, a difference of two
    float64 sums of exact fp32 products (:func:`~opefo_nemo.core.update_correction.dot64`). The
    only memory added is ``g``, one fp32 tensor per optimizer tensor.
    """

    def __init__(
        self,
        params: Sequence[Tensor],
        grads: Sequence[Tensor],
        counted: Sequence[bool],
        all_reduce: AllReduce,
        publish: Callable[[], None] = no_publish,
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
        self.all_reduce, self.publish = all_reduce, publish
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
    def inner_products(self) -> tuple[float, float]:
        """``(⟨g, g⟩, ⟨g, Δθ⟩)`` over the whole model, ``Δθ`` everything applied to the tensors
        since the capture; one all-reduce of two float64 numbers."""
        flow_local = self._sum(self.params) - self.before
        grad_sq, flow = self.all_reduce(torch.stack([self.grad_sq, flow_local])).tolist()
        return grad_sq, flow

    @torch.no_grad()
    def move(self, alpha: float) -> None:
        """``θ ← θ + α g`` on every local tensor, then :attr:`publish`."""
        for param, grad in zip(self.params, self.grads, strict=True):
            param.add_(grad.to(param.dtype), alpha=alpha)
        self.publish()
