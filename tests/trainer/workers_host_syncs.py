"""The host synchronisations of each pass of the trainer's update, counted per micro-batch count
(:mod:`tests.host_syncs`), for one engine: ``hf`` in this process, ``megatron`` on one spawned
gloo rank (``tests.parallel.world``)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from opefo_nemo.config.method import load_method
from opefo_nemo.core.entropy_flow import ESTIMATOR_SUMS
from opefo_nemo.core.objectives import build_objective
from opefo_nemo.engines.batch import TrainBatch, build_batch
from opefo_nemo.models.tiny import TinyModelSpec
from opefo_nemo.trainer.stats_pass import stats_pass
from opefo_nemo.trainer.update import optimizer_step
from opefo_nemo.trainer.update_layout import plan_update
from tests.host_syncs import count_host_syncs, host_tensors

VOCAB = 70  # the tiny model's per-character vocabulary
MICRO_BATCH_SIZE = 2
METHOD = "opefo"
#: A tiny model wide enough that a pass does work per micro-batch (the host-sync and the
#: deferred-check tests build it)
SPEC = TinyModelSpec(
    hidden_size=64,
    num_attention_heads=2,
    head_dim=32,
    intermediate_size=128,
    max_position_embeddings=64,
)


def batch(rows: int) -> TrainBatch:
    """``rows`` random responses of different lengths (the micro-batches are trimmed)."""
    generator = torch.Generator().manual_seed(rows)
    prompts = [torch.randint(3, VOCAB, (5,), generator=generator).tolist() for _ in range(rows)]
    responses = [
        torch.randint(3, VOCAB, (6 + row % 3,), generator=generator).tolist() for row in range(rows)
    ]
    return build_batch(prompts, responses, torch.randn(rows, generator=generator), pad_id=0)


def torch_optimizers(optimizer) -> list[torch.optim.Optimizer]:
    """The ``torch.optim`` optimizers inside ``optimizer`` (itself, or megatron-core's wrapper
    and chained optimizers around one)."""
    if isinstance(optimizer, torch.optim.Optimizer):
        return [optimizer]
    chained = getattr(optimizer, "chained_optimizers", None)
    if chained is not None:
        return [inner for part in chained for inner in torch_optimizers(part)]
    return torch_optimizers(optimizer.optimizer)


def step_counts(optimizer) -> list[torch.Tensor]:
    """Adam's per-parameter step counts: ``torch.optim`` keeps them in host memory (unless
    ``capturable`` or ``fused``) and reads them in every step."""
    return [
        state["step"]
        for inner in torch_optimizers(optimizer)
        if not inner.defaults.get("capturable") and not inner.defaults.get("fused")
        for state in inner.state.values()
        if "step" in state
    ]


def count_passes(policy, micro_batch_counts: tuple[int, ...]) -> dict:
    """``{count: {"stats": [[kind, site, n], ...], "loss": ...}}``: each pass of one step on a
    batch of ``count`` micro-batches, after one warm-up step (the optimizer's state exists)."""
    method = load_method(METHOD)
    objective = build_objective(method)
    sums = ESTIMATOR_SUMS[method.entropy_flow.estimator]
    result = {}
    for count in micro_batch_counts:
        whole = batch(count * MICRO_BATCH_SIZE)
        layouts = plan_update(policy, whole, 1, MICRO_BATCH_SIZE, "contiguous")
        micros = [whole.select(rows) for rows in layouts[0].rows]
        (warm,) = stats_pass(policy, whole, layouts, [micros], sums)
        optimizer_step(policy, objective, micros, warm, None, 0)
        inputs = [*host_tensors(whole, micros), *step_counts(policy.optimizer)]
        stats_sites, (stats,) = count_host_syncs(
            inputs, stats_pass, policy, whole, layouts, [micros], sums
        )
        loss_sites, _ = count_host_syncs(
            [*inputs, *host_tensors(stats)],
            optimizer_step,
            policy,
            objective,
            micros,
            stats,
            None,
            0,
        )
        result[count] = {
            "stats": [[*key, n] for key, n in stats_sites.items()],
            "loss": [[*key, n] for key, n in loss_sites.items()],
        }
    return result


def megatron_rank(rank: int, world: int, model_dir: str, counts: tuple[int, ...], out: str):
    from opefo_nemo.config.engines import MegatronEngineConfig
    from opefo_nemo.engines.megatron.build import build_megatron_policy

    engine = MegatronEngineConfig(
        device="cpu", micro_batch_size=MICRO_BATCH_SIZE, make_vocab_size_divisible_by=8
    )
    policy = build_megatron_policy(model_dir, engine, lr=load_method(METHOD).lr, temperature=1.0)
    Path(out).write_text(json.dumps(count_passes(policy, counts)))
