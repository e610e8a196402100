"""What megatron's optimizer step receives, for tests that compare gradients of ``MegatronPolicy``
(the model in megatron's ``DistributedDataParallel``: gradients live in ``main_grad``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import Tensor


@contextmanager
def main_grads_at_steps(policy) -> Iterator[list[tuple[dict[str, Tensor], float]]]:
    """Inside the block every optimizer step of ``policy`` appends ``(grads, norm)``: each
    weight's reduced ``main_grad`` as the step receives it (megatron names, copied to the CPU,
    before clipping) and the norm the step returns. The step itself is unchanged and restored
    on exit."""
    module, original = policy.model.module, policy.optimizer.step
    steps: list[tuple[dict[str, Tensor], float]] = []

    def step():
        grads = {n: p.main_grad.detach().to("cpu", copy=True) for n, p in module.named_parameters()}
        result = original()
        steps.append((grads, float(result[1])))
        return result

    policy.optimizer.step = step
    try:
        yield steps
    finally:
        policy.optimizer.step = original


def clipped(grads: dict[str, Tensor], norm: float, clip: float) -> dict[str, Tensor]:
    """``grads`` scaled as megatron's step clips them: ``min(1, clip / (‖g‖ + 1e-6))`` (no
    clipping when ``clip`` is 0)."""
    coefficient = min(1.0, clip / (norm + 1e-6)) if clip > 0 else 1.0
    return {name: grad * coefficient for name, grad in grads.items()}
