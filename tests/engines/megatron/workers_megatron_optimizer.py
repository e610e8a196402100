"""Rank function for the ``MegatronPolicy`` tests on megatron's ``DistributedDataParallel`` and
``get_megatron_optimizer`` (fp32 or bf16 parameters, distributed optimizer on or off): the
trainer's real update of one rollout batch on a real megatron-core ``GPTModel`` (rope, CPU,
gloo), spawned by ``tests.parallel.world``; CPU redirections of
:mod:`opefo_nemo.engines.megatron.cpu_execution`."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch

from opefo_nemo.config.engines import MegatronEngineConfig
from opefo_nemo.config.method import load_method
from opefo_nemo.core.objectives import build_objective
from opefo_nemo.engines.megatron import compat
from opefo_nemo.engines.megatron.cpu_execution import megatron_on_cpu
from opefo_nemo.models.megatron_weights import MegatronLayout
from opefo_nemo.trainer.update import update_rollout_batch

from .optimizer_capture import main_grads_at_steps
from .tiny import megatron_gpt
from .workers_policy import DIVISIBLE_BY, TEMPERATURE, _skips_everywhere, load_hf_into_megatron


def megatron_optimizer_updates(
    rank: int, world_size: int, cases: list[dict], hf_dir: str, batch, out_dir: str
) -> None:
    """For each case (``dtype``, ``distributed``, ``micro_batch_size``, ``method`` = load_method
    args, ``engine`` = MegatronEngineConfig keys; TP 1, PP 1, DP = world size): a
    ``MegatronPolicy`` on megatron's DDP + optimizer over the Hugging Face weights (rounded to
    bf16 when ``dtype`` is bfloat16); ``token_stats`` of the whole batch; the trainer's
    ``update_rollout_batch`` with, at its optimizer step, the reduced ``main_grad`` of every
    weight and the returned norm captured; the weights after it (Hugging Face names), the fp32
    starting weights and, without the distributed optimizer, the fp32 main weights after the
    step (megatron names); a step that must be skipped on every rank; the warmed-up lr of the
    next step. Each case first checks that mismatched model/optimizer pairs are refused. Rank 0
    writes case ``i``'s results to ``out_dir/result_{i}.pt``."""
    warnings.filterwarnings("ignore")
    from megatron.core import parallel_state

    compat.initialize_model_parallel(1, 1, gloo_groups=True)
    try:
        with megatron_on_cpu():
            for index, case in enumerate(cases):
                result = _run(case, Path(hf_dir), batch)
                if rank == 0:
                    torch.save(result, Path(out_dir) / f"result_{index}.pt")
    finally:
        parallel_state.destroy_model_parallel()


def _policy(case: dict, hf_dir: Path):
    from opefo_nemo.engines.megatron.megatron_optimizer import (
        build_megatron_optimizer,
        wrap_in_ddp,
    )
    from opefo_nemo.engines.megatron.policy import MegatronPolicy

    layout = MegatronLayout.from_hf_config(
        json.loads((hf_dir / "config.json").read_text()),
        tensor_parallel=1,
        pipeline_parallel=1,
        make_vocab_size_divisible_by=DIVISIBLE_BY,
    )
    model = megatron_gpt(layout)
    if case["dtype"] == "bfloat16":
        model.config.bf16, model.config.params_dtype = True, torch.bfloat16
        model.to(torch.bfloat16)
    load_hf_into_megatron(model, layout, hf_dir, 0, 0)  # copy_ rounds fp32 → bf16
    config = MegatronEngineConfig(
        dtype=case["dtype"],
        micro_batch_size=case["micro_batch_size"],
        use_distributed_optimizer=case["distributed"],
        **case["engine"],
    )
    ddp = wrap_in_ddp(model, config)
    optimizer = build_megatron_optimizer(ddp, config, load_method(*case["method"]).lr)
    return MegatronPolicy(ddp, optimizer, config, layout=layout, temperature=TEMPERATURE)


def _refuses_mismatched_pairs(policy) -> None:
    """A torch optimizer (over the DDP-wrapped model, whose gradients land in ``main_grad``, or
    over the bare model), or a ``MegatronOptimizer`` without the DDP, is refused with a
    ``TypeError`` naming what ``MegatronPolicy`` takes."""
    from opefo_nemo.engines.megatron.policy import MegatronPolicy

    module = policy.model.module
    adamw = torch.optim.AdamW(module.parameters(), lr=1e-3)
    pairs = [(policy.model, adamw), (module, adamw), (module, policy.optimizer)]
    for model, optimizer in pairs:
        try:
            MegatronPolicy(model, optimizer, policy.config, layout=policy.layout, temperature=1.0)
        except TypeError as error:
            assert "MegatronPolicy takes" in str(error), error
            continue
        raise AssertionError(f"{type(optimizer).__name__} over {type(model).__name__} accepted")


def _run(case: dict, hf_dir: Path, batch) -> dict:
    method = load_method(*case["method"])
    policy = _policy(case, hf_dir)
    _refuses_mismatched_pairs(policy)
    module = policy.model.module
    start = {name: p.detach().float().clone() for name, p in module.named_parameters()}
    stats = policy.token_stats(batch)

    with main_grads_at_steps(policy) as steps:
        outcome = update_rollout_batch(
            policy, build_objective(method), batch, case["micro_batch_size"], seed=0
        )
    ((grads, norm),) = steps
    weights = {name: tensor.clone() for name, tensor in policy.named_weights()}
    main = None
    if not case["distributed"] and case["dtype"] == "bfloat16":
        main = {n: p.main_param.detach().clone() for n, p in module.named_parameters()}
        for name, param in module.named_parameters():  # the bf16 copy of the main weights
            assert torch.equal(param.detach(), main[name].to(torch.bfloat16)), name

    policy.advance_schedule()
    micros = batch.split(case["micro_batch_size"])
    _skips_everywhere(policy, micros)
    return {
        "stats": {"logprob": stats.logprob, "entropy": stats.entropy},
        "metrics": outcome.metrics,
        "skipped": outcome.skipped_steps,
        "start": start,
        "grads": grads,
        "norm": norm,
        "main": main,
        "weights": weights,
        "next_lr": policy.lr,
    }
