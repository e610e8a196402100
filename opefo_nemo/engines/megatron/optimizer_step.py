"""How :class:`~.policy.MegatronPolicy` reduces gradients and steps megatron's optimizer after
the schedule has run the backward of a step's micro-batches (spec §5, §8; docs/megatron.md)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core.distributed import DistributedDataParallel, finalize_model_grads
from megatron.core.optimizer import MegatronOptimizer
from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate
from megatron.core.transformer.module import param_is_not_shared
from torch import Tensor

from opefo_nemo.config.engines import MegatronEngineConfig
from opefo_nemo.engines.entropy_correction import CapturedEntropyGradient
from opefo_nemo.engines.megatron import compat
from opefo_nemo.engines.schedule import warmup_factor


class MegatronOptimizerStep:
    """megatron's ``DistributedDataParallel`` + ``MegatronOptimizer``, driven in this order:
    :meth:`zero_grad` before the schedule, :meth:`reduce` after it, :meth:`step`; :meth:`advance`
    at the end of a rollout step; :meth:`capture_entropy_gradient` after an entropy pass's
    :meth:`reduce`.

    The model's DDP keeps contiguous fp32 ``main_grad`` buffers; its ``finish_grad_sync`` (run by
    megatron's ``finalize_model_grads``) all-reduces them over DP, or reduce-scatters them with
    the distributed optimizer, scaled by ``1/D`` (what :class:`~.loss_closure.MegatronScaling`
    assumes), then ``finalize_model_grads`` sums a tied embedding's two copies over the first and
    last pipeline stage. The optimizer (fp32 main weights for bf16 parameters, optionally sharded
    over DP) computes the global norm (every weight counted once over TP and PP), clips by
    ``min(1, max_norm / (‖g‖ + 1e-6))`` and steps. The base learning rate is the optimizer's at
    construction (``OptimizerConfig.lr``); its ``config.clip_grad`` must be positive
    (``math.inf`` for no clipping), else megatron's ``step()`` returns no norm.
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
        """The base learning rate × :func:`~..schedule.warmup_factor` at this rollout step."""
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
        """Clip and step at :attr:`lr`, written into every parameter group (megatron's
        ``OptimizerParamScheduler`` is not used, so its per-group ``wd_mult`` is not applied:
        weight decay acts on every parameter, as in ``HFPolicy``); returns ``‖g‖₂`` before
        clipping."""
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
        with the distributed optimizer). A move along it is published as megatron's step
        publishes its own: main weights copied into the model's parameters (and the distributed
        optimizer's parameter buffer all-gathered), :func:`~.compat.copy_main_weights_to_model`."""
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

        def publish() -> None:
            compat.copy_main_weights_to_model(self.optimizer)

        return CapturedEntropyGradient(params, grads, counted, all_reduce, publish)
