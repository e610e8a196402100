"""The tensors the ``hf`` engine's optimizer updates: the model's parameters themselves in fp32,
or fp32 master weights beside bf16 compute parameters (``engine.dtype=bfloat16``, mixed precision
as megatron-core's optimizer does it; docs/training.md, "Precision").
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor


class MasterWeights:
    """fp32 masters of a model's parameters (one per parameter, tied weights once); in fp32 the
    masters are the parameters themselves and the methods below have nothing to copy.

    In mixed precision forwards and backwards run on the bf16 parameters; each backward's bf16
    gradient is added into the master's fp32 gradient (:meth:`accumulate_grads`), AdamW steps
    the masters, and :meth:`publish` rounds them into the parameters: an update below bf16's
    spacing accumulates in the master instead of being lost."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype):
        """Take ``model`` (fp32) and keep fp32 copies of its parameters as masters if ``dtype``
        is not fp32, then convert the model to ``dtype`` in place."""
        named = list(model.named_parameters())
        self.names = [name for name, _ in named]
        self.mixed = dtype != torch.float32
        self.masters: list[Tensor] = [
            param.detach().float().clone() if self.mixed else param for _, param in named
        ]
        model.to(dtype)
        self.params: list[Tensor] = [param for _, param in model.named_parameters()]

    @torch.no_grad()
    def accumulate_grads(self) -> None:
        """Add each parameter's gradient of the last backward into its master's fp32 gradient
        and free it (call after every backward; nothing to do in fp32)."""
        if not self.mixed:
            return
        for param, master in zip(self.params, self.masters, strict=True):
            if param.grad is None:
                continue
            if master.grad is None:
                master.grad = param.grad.float()
            else:
                master.grad.add_(param.grad)
            param.grad = None

    def zero_grad(self) -> None:
        """Drop the gradients of the masters and of the parameters."""
        for tensor in (*self.params, *self.masters):
            tensor.grad = None

    @torch.no_grad()
    def publish(self) -> None:
        """Round the masters into the compute parameters (after an optimizer step, a move along
        the entropy gradient, or a load)."""
        if not self.mixed:
            return
        for param, master in zip(self.params, self.masters, strict=True):
            param.copy_(master)

    @torch.no_grad()
    def load(self, tensors: dict[str, Tensor]) -> None:
        """Set every master (and its parameter) from ``tensors`` by parameter name; a name
        absent from ``tensors`` keeps its value (the caller checks what must be present)."""
        for name, master in zip(self.names, self.masters, strict=True):
            if name in tensors:
                master.copy_(tensors[name])
        self.publish()

    def named_masters(self) -> Iterator[tuple[str, Tensor]]:
        """``(parameter name, fp32 master)``, tied weights once."""
        yield from zip(self.names, self.masters, strict=True)
