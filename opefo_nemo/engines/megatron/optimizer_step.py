"""How :class:`~.policy.MegatronPolicy` reduces gradients and steps its optimizer after megatron's
schedule has run the backward of a step's micro-batches (spec §5, §8).

:class:`MegatronOptimizerStep` exposes four operations, which ``train_step`` calls in this order:
``zero_grad()`` before the schedule; ``reduce(failed)`` after it (``failed``: a device scalar,
> 0 when this rank saw a non-finite loss or logits; gradients averaged over data parallel;
returns whether any rank of the job failed: a non-finite loss or logits, or a non-finite
gradient, so that every rank skips the step together); ``step()`` (clip to ``config.grad_clip``,
the optimizer's update at the warm-up learning rate; returns ``‖g‖₂`` before clipping);
``advance()`` (the next rollout step's learning rate, ``lr · min(1, (s + 1) / warmup_steps)``).

The model is wrapped in megatron-core's ``DistributedDataParallel`` (contiguous fp32
``main_grad`` buffers; its ``finish_grad_sync``, run by megatron's ``finalize_model_grads``,
all-reduces them over DP, or reduce-scatters them with the distributed optimizer, scaled by
``1/D``: what :class:`~.loss_closure.MegatronScaling` assumes; then ``finalize_model_grads`` sums
a tied embedding's two copies over the first and last pipeline stage) and the optimizer is a
``MegatronOptimizer`` from ``get_megatron_optimizer`` (fp32 main weights for bf16 parameters,
optionally sharded over DP; :func:`~.megatron_optimizer.build_megatron_optimizer`). Its
``step()`` computes the global norm (every weight counted once over TP and PP), clips by
``min(1, max_norm / (‖g‖ + 1e-6))`` and steps, and returns ``(success, ‖g‖₂, _)``; the learning
rate is written into every parameter group before each step (megatron's
``OptimizerParamScheduler`` is not used, so its per-group ``wd_mult`` is not applied either:
weight decay acts on every parameter, as in ``HFPolicy``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core.distributed import DistributedDataParallel, finalize_model_grads
from megatron.core.optimizer import MegatronOptimizer
from torch import Tensor

from ...config.engines import MegatronEngineConfig
from ..schedule import warmup_factor


class MegatronOptimizerStep:
    """megatron's ``DistributedDataParallel`` + ``MegatronOptimizer`` (module docstring).

    The base learning rate is the optimizer's at construction (``OptimizerConfig.lr``); the
    optimizer's ``config.clip_grad`` must be positive (``math.inf`` for no clipping), else
    megatron's ``step()`` returns no norm.
    """

    def __init__(
        self,
        model: DistributedDataParallel,
        optimizer: MegatronOptimizer,
        config: MegatronEngineConfig,
        dp_group: dist.ProcessGroup,
        model_parallel_group: dist.ProcessGroup,
    ) -> None:
        clip = optimizer.config.clip_grad
        if not clip > 0:
            raise ValueError(
                f"the MegatronOptimizer's config.clip_grad is {clip}: it must be > 0 (math.inf "
                "for no clipping) so that step() computes the gradient norm"
            )
        self.model, self.optimizer, self.config = model, optimizer, config
        self.groups = (dp_group, model_parallel_group)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.base_lr = float(optimizer.param_groups[0]["lr"])
        self.steps = 0

    @property
    def lr(self) -> float:
        return self.base_lr * warmup_factor(self.steps, self.config.warmup_steps)

    def zero_grad(self) -> None:
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()

    def reduce(self, failed: Tensor) -> bool:
        """``finalize_model_grads`` (the DDP's reduction, and megatron's first/last-stage
        embedding all-reduce), then one flag over DP and model parallel: this rank failed
        (``failed > 0``, a device scalar) or holds a non-finite ``main_grad`` (after a
        reduce-scatter, a rank's unreduced part is its own gradient: a non-finite sum anywhere
        has a non-finite term on some rank). The flag stays on the device until the one
        host read at the end."""
        finalize_model_grads([self.model])
        grads = [p.main_grad for p in self.params]  # type: ignore[attr-defined]  # set by megatron's DDP
        nonfinite = [(~torch.isfinite(g)).any().reshape(1) for g in grads]
        flag = torch.cat([failed.reshape(1).float(), *(n.float() for n in nonfinite)]).amax()
        flag = flag.reshape(1)
        for group in self.groups:
            if dist.get_world_size(group) > 1:
                dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        return bool(flag[0] > 0)

    def step(self) -> float:
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr
        success, grad_norm, _ = self.optimizer.step()
        if not success or grad_norm is None:
            raise RuntimeError(
                f"megatron's optimizer step returned success={success}, grad_norm={grad_norm} "
                "after finite gradients: its loss scaler or clip_grad is misconfigured"
            )
        return float(grad_norm)

    def advance(self) -> None:
        self.steps += 1
