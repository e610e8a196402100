"""How :class:`~.policy.MegatronPolicy` reduces gradients and steps its optimizer after megatron's
schedule has run the backward of a step's micro-batches (spec §5, §8).

:class:`MegatronOptimizerStep` exposes four operations, which ``train_step`` calls in this order:
``zero_grad()`` before the schedule; ``reduce(failed)`` after it (``failed``: a device scalar,
> 0 when this rank saw a non-finite loss or logits; gradients averaged over data parallel;
returns whether any rank of the job failed: a non-finite loss or logits, or a non-finite
gradient, so that every rank skips the step together); ``step()`` (clip to ``config.grad_clip``,
the optimizer's update at the warm-up learning rate; returns ``‖g‖₂`` before clipping);
``advance()`` (the next rollout step's learning rate, ``lr · min(1, (s + 1) / warmup_steps)``).
A step with an ``EntropyCorrection`` adds two: ``capture_entropy_gradient()`` after the entropy
pass's ``reduce`` (before the policy gradient's ``zero_grad``) and ``correct(captured, target)``
after ``step()``.

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
from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate
from megatron.core.transformer.module import param_is_not_shared
from torch import Tensor

from ...config.engines import MegatronEngineConfig
from ...core.update_correction import CorrectionResult
from ..entropy_correction import CapturedEntropyGradient
from ..schedule import warmup_factor
from . import compat


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

    def capture_entropy_gradient(self) -> CapturedEntropyGradient:
        """``∇θ H̄`` in the optimizer's own layout, after the entropy pass's :meth:`reduce`:
        megatron's ``prepare_grads`` copies the reduced ``main_grad`` into its main tensors'
        ``grad`` (fp32 main weights, or this rank's shard of them with the distributed
        optimizer); each is cloned (they are views of the gradient buffer the next pass
        reuses). A main tensor counts in the sums as megatron's gradient norm counts it: not a
        tied embedding's second copy (``shared``), not a tensor-parallel replica; the sums
        reduce over the group megatron reduces that norm over (model parallel, or every rank
        with the distributed optimizer)."""
        self.optimizer.prepare_grads()
        inner = compat.inner_optimizers(self.optimizer)
        groups = {id(o.get_grad_stats_parallel_group()) for o in inner}
        if len(groups) != 1:
            raise RuntimeError("the entropy correction needs one gradient-statistics group")
        group = inner[0].get_grad_stats_parallel_group()
        params = [p for o in inner for p in o.get_parameters()]
        grads = [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in params]
        counted = [
            param_is_not_shared(p) and param_is_not_tensor_parallel_duplicate(p) for p in params
        ]

        def all_reduce(values: Tensor) -> Tensor:
            dist.all_reduce(values, group=group)
            return values

        return CapturedEntropyGradient(params, grads, counted, all_reduce)

    def correct(self, captured: CapturedEntropyGradient, target: float) -> CorrectionResult:
        """After :meth:`step`: the main tensors corrected (:mod:`..entropy_correction`), then
        copied into the model's parameters as megatron's step copies them."""
        result = captured.correct(target)
        compat.copy_main_weights_to_model(self.optimizer)
        return result
