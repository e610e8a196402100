"""megatron-core's ``DistributedDataParallel`` and optimizer for :class:`~.policy.MegatronPolicy`
from the engine config: the objects :class:`~.optimizer_step.MegatronOptimizerStep` drives
(docs/megatron.md, "The Megatron policy")."""

from __future__ import annotations

import math

import torch
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.optimizer import MegatronOptimizer, OptimizerConfig, get_megatron_optimizer

from opefo_nemo.config.engines import MegatronEngineConfig

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def wrap_in_ddp(model: GPTModel, engine: MegatronEngineConfig) -> DistributedDataParallel:
    """``model`` (a megatron ``GPTModel`` in ``engine.dtype``) inside megatron's DDP: fp32
    gradient buffers (bf16 parameters accumulate in fp32 ``main_grad``), gradients averaged over
    DP (the ``1/D`` that :class:`~.loss_closure.MegatronScaling` undoes), and the parameter
    buffer the distributed optimizer needs when ``engine.use_distributed_optimizer``. The
    reduction runs once in ``finalize_model_grads`` or, with ``engine.overlap_grad_reduce``,
    bucket by bucket during the last micro-batch's backward (the schedule holds it back for the
    earlier ones through the model config's ``no_sync_func``)."""
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=engine.overlap_grad_reduce,
        use_distributed_optimizer=engine.use_distributed_optimizer,
    )
    wrapped = DistributedDataParallel(model.config, ddp_config, model)
    if engine.overlap_grad_reduce:
        model.config.no_sync_func = wrapped.no_sync
        model.config.grad_sync_func = wrapped.start_grad_sync
    return wrapped


def build_megatron_optimizer(
    model: DistributedDataParallel, engine: MegatronEngineConfig, lr: float
) -> MegatronOptimizer:
    """megatron's Adam(W) over ``model``'s parameters with the engine's β, ε and weight decay;
    fp32 main weights beside bf16 parameters when ``engine.dtype`` is bfloat16; sharded over DP
    when ``engine.use_distributed_optimizer``. No loss scaling (bf16 needs none)."""
    config = OptimizerConfig(
        optimizer="adam",
        lr=lr,
        weight_decay=engine.weight_decay,
        adam_beta1=engine.adam_beta1,
        adam_beta2=engine.adam_beta2,
        adam_eps=engine.adam_eps,
        bf16=engine.dtype == "bfloat16",
        params_dtype=_DTYPES[engine.dtype],
        use_distributed_optimizer=engine.use_distributed_optimizer,
        # ``inf``: no clipping, but megatron still computes and returns the norm.
        clip_grad=engine.grad_clip if engine.grad_clip > 0 else math.inf,
    )
    return get_megatron_optimizer(config, [model])
