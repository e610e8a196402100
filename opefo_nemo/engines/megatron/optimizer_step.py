"""The two ways :class:`~.policy.MegatronPolicy` reduces gradients and steps its optimizer after
megatron's schedule has run the backward of a step's micro-batches (spec §5, §8).

Both expose the same four operations, which ``train_step`` calls in this order: ``zero_grad()``
before the schedule; ``reduce(failed)`` after it (``failed``: a device scalar, > 0 when this rank
saw a non-finite loss or logits; gradients averaged over data parallel; returns whether any rank
of the job failed: a non-finite loss or logits, or a non-finite gradient, so that every rank
skips the step together); ``step()`` (clip to ``config.grad_clip``, the
optimizer's update at the warm-up learning rate; returns ``‖g‖₂`` before clipping);
``advance()`` (the next rollout step's learning rate, ``lr · min(1, (s + 1) / warmup_steps)``).

- :class:`TorchOptimizerStep`: the model's own parameters in ``engine.dtype``, their
  ``param.grad`` averaged by :func:`~.gradients.average_over_data_parallel`, the norm by
  :func:`~.gradients.global_grad_norm`, a torch optimizer (:func:`~.policy.build_adamw`).
- :class:`MegatronOptimizerStep`: the model wrapped in megatron-core's
  ``DistributedDataParallel`` (contiguous fp32 ``main_grad`` buffers; its ``finish_grad_sync``,
  run by megatron's ``finalize_model_grads``, all-reduces them over DP, or reduce-scatters them
  with the distributed optimizer, scaled by ``1/D``: what :class:`~.loss_closure.MegatronScaling`
  assumes) and a ``MegatronOptimizer`` from ``get_megatron_optimizer`` (fp32 main weights for
  bf16 parameters, optionally sharded over DP;
  :func:`~.megatron_optimizer.build_megatron_optimizer`).
  Its ``step()`` computes the global norm, clips and steps, and returns ``(success, ‖g‖₂, _)``;
  the learning rate is written into every parameter group before each step (megatron's
  ``OptimizerParamScheduler`` is not used, so its per-group ``wd_mult`` is not applied either:
  weight decay acts on every parameter, as in ``HFPolicy``).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from megatron.core.distributed import DistributedDataParallel, finalize_model_grads
from megatron.core.optimizer import MegatronOptimizer
from torch import Tensor

from ...config.engines import MegatronEngineConfig
from ..schedule import warmup_factor
from .gradients import average_over_data_parallel, clip_to_norm, global_grad_norm


class TorchOptimizerStep:
    """A torch optimizer over the model's own parameters (module docstring)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        config: MegatronEngineConfig,
        dp_group: dist.ProcessGroup,
        model_parallel_group: dist.ProcessGroup,
    ) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"MegatronPolicy takes a torch optimizer or a MegatronOptimizer, got "
                f"{type(optimizer).__name__}"
            )
        self.optimizer, self.config = optimizer, config
        self.dp_group, self.model_parallel_group = dp_group, model_parallel_group
        self.params = [p for p in model.parameters() if p.requires_grad]
        if any(hasattr(p, "main_grad") for p in self.params):
            raise TypeError(
                "the model's parameters carry megatron DDP main_grad buffers (their gradients "
                "never reach param.grad): pass the DistributedDataParallel-wrapped model and a "
                "MegatronOptimizer instead of a torch optimizer"
            )
        warmup = config.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: warmup_factor(step, warmup)
        )
        self._norm = math.nan

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def reduce(self, failed: Tensor) -> bool:
        failed = average_over_data_parallel(self.params, self.dp_group, bool(failed > 0))
        self._norm, failed = global_grad_norm(self.params, self.model_parallel_group, failed)
        return failed or not math.isfinite(self._norm)

    def step(self) -> float:
        max_norm = self.config.grad_clip if self.config.grad_clip > 0 else math.inf
        clip_to_norm(self.params, max_norm, self._norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return self._norm

    def advance(self) -> None:
        self.scheduler.step()


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
        if not isinstance(model, DistributedDataParallel):
            raise TypeError(
                f"a MegatronOptimizer needs the model wrapped in megatron-core's "
                f"DistributedDataParallel (its main_grad buffers), got {type(model).__name__}"
            )
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
        nonfinite = [(~torch.isfinite(p.main_grad)).any().reshape(1) for p in self.params]
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
