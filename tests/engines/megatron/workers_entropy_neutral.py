"""Rank function of ``test_policy_entropy_neutral.py``: the trainer's update with
``entropy_neutral`` on ``engine=megatron``'s own builder (``engine.device=cpu``, gloo ranks,
spawned by ``tests.parallel.world``)."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from opefo_nemo.config.engines import MegatronEngineConfig
from opefo_nemo.config.method import load_method
from opefo_nemo.core.objectives import build_objective
from opefo_nemo.engines.megatron import compat
from opefo_nemo.trainer.update import update_rollout_batch

from .tiny import release_parallel_state

#: The rollout temperature the statistics are taken at (spec §1).
TEMPERATURE = 0.7


def corrected_updates(
    rank: int, world_size: int, hf_dir: str, cases: list[dict], method: list[str], batch, out: str
) -> None:
    """For each case (``engine``: MegatronEngineConfig keys, ``micro_batch_size``): a policy
    built by ``build_megatron_policy``, one update of ``batch`` with ``load_method(*method)``,
    then, on every rank, the check that megatron's model parameters are its main weights
    (rounded to the parameters' dtype) after the correction; rank 0 saves the metrics and the
    weights after the step (Hugging Face names) as ``out/case_<i>.pt``."""
    warnings.filterwarnings("ignore")
    from opefo_nemo.engines.megatron.build import build_megatron_policy

    for index, case in enumerate(cases):
        engine = MegatronEngineConfig(
            device="cpu", make_vocab_size_divisible_by=8, **case["engine"]
        )
        objective = build_objective(load_method(*method))
        try:
            policy = build_megatron_policy(
                hf_dir, engine, lr=objective.config.lr, temperature=TEMPERATURE
            )
            outcome = update_rollout_batch(
                policy, objective, batch, case["micro_batch_size"], seed=0
            )
            copied = _parameters_are_main_weights(policy)
            weights = {name: tensor.clone() for name, tensor in policy.named_weights()}
            if rank == 0:
                result = {
                    "metrics": outcome.metrics,
                    "skipped": outcome.skipped_steps,
                    "weights": weights,
                    "copied": copied,
                }
                torch.save(result, Path(out) / f"case_{index}.pt")
        finally:
            release_parallel_state()


def _parameters_are_main_weights(policy) -> bool:
    """Every model parameter equals megatron's main weight of it, rounded to the parameter's
    dtype: the correction reached the model (the distributed optimizer's shards after the
    all-gather of its parameter buffer). Agreed over all ranks."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    same = True
    for inner in compat.inner_optimizers(policy.optimizer):
        if isinstance(inner, DistributedOptimizer):
            pairs = []
            for model_group, main_group in (
                (inner.model_float16_groups, inner.shard_fp32_from_float16_groups),
                (inner.model_fp32_groups, inner.shard_fp32_groups),
            ):
                for models, mains in zip(model_group, main_group, strict=True):
                    for model_param, main in zip(models, mains, strict=True):
                        span = inner._get_model_param_range_map(model_param)["param"]
                        part = model_param.detach().view(-1)[span.start : span.end]
                        pairs.append((part, main))
        elif hasattr(inner, "fp32_from_float16_groups"):
            pairs = [
                (model_param.detach(), main)
                for models, mains in zip(
                    inner.float16_groups, inner.fp32_from_float16_groups, strict=True
                )
                for model_param, main in zip(models, mains, strict=True)
            ]
        else:  # the fp32 optimizer updates the parameters themselves
            pairs = []
        same = same and all(torch.equal(p, m.detach().to(p.dtype)) for p, m in pairs)
    verdict = torch.tensor([float(same)])
    torch.distributed.all_reduce(verdict, op=torch.distributed.ReduceOp.MIN)
    return bool(verdict[0] > 0)
