"""Rank function for the ``MegatronPolicy`` tests: the trainer's real update of one rollout batch
on a real megatron-core ``GPTModel`` (rope, CPU, gloo) in megatron's ``DistributedDataParallel``
with megatron's optimizer (:func:`~opefo_nemo.engines.megatron.build.wrap_for_training`, fp32,
distributed optimizer off), spawned by ``tests.parallel.world``."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from opefo_nemo.config.engines import MegatronEngineConfig
from opefo_nemo.config.method import load_method
from opefo_nemo.core.objectives import LossOutput, build_objective
from opefo_nemo.engines.megatron import compat
from opefo_nemo.engines.megatron.cpu_execution import megatron_on_cpu
from opefo_nemo.models.megatron_weights import (
    DistributedFetch,
    MegatronLayout,
    hf_named_weights,
    hf_to_megatron,
)
from opefo_nemo.parallel import VOCAB_SUMS
from opefo_nemo.trainer.update import update_rollout_batch
from tests.metric_bounds import assert_close_to_scale

from .optimizer_capture import clipped, main_grads_at_steps
from .tiny import megatron_gpt, release_parallel_state
from .workers_ckpt import checkpoint_on_cpu

#: Vocabulary 100 padded to a multiple of 8 × TP: 104 at TP 1, 112 at TP 2 (padded columns exist).
DIVISIBLE_BY = 8
STAT_FIELDS = ("logprob", "entropy", *VOCAB_SUMS)
#: The rollout's sampling temperature in these tests (spec §1: statistics of softmax(z / T)).
TEMPERATURE = 0.7


def load_hf_into_megatron(
    model, layout: MegatronLayout, hf_dir: Path, stage: int, tp_rank: int
) -> None:
    """The Hugging Face checkpoint's weights, converted and split, loaded strictly."""
    from safetensors.torch import load_file

    shards = hf_to_megatron(layout, load_file(hf_dir / "model.safetensors"))[(stage, tp_rank)]
    extra = {k: v for k, v in model.state_dict().items() if k.endswith("_extra_state")}
    model.load_state_dict({**extra, **shards}, strict=True)


def policy_updates(
    rank: int, world_size: int, cases: list[dict], hf_dirs: dict[str, str], batch, out_dir: str
) -> None:
    """For each case (``family``, ``tp``, optional ``pp``, ``micro_batch_size``, ``method`` =
    load_method args, ``engine`` = MegatronEngineConfig keys; DP = world size / (TP × PP)), in
    one world so the ranks import megatron once: ``token_stats`` of the whole batch, then
    ``update_rollout_batch`` (the trainer's phases 1–3) with the reduced gradients captured at
    each optimizer step (``main_grad``, clipped as megatron's step clips them, in Hugging Face
    names), the weights after it, then a recording
    step: every ``loss_fn`` call's logprob against ``token_stats`` of that micro-batch with the
    same weights, and the warmed-up lr; before it, ``save`` and ``load`` into a fresh policy
    (:func:`_resumes_exactly`), and after it a step that must be skipped on every rank
    (:func:`_skips_everywhere`). Rank 0 writes case ``i``'s results to ``out_dir/result_{i}.pt``.
    """
    warnings.filterwarnings("ignore")
    for index, case in enumerate(cases):
        pp = case.get("pp", 1)
        compat.initialize_model_parallel(case["tp"], pp, gloo_groups=True)
        try:
            with megatron_on_cpu():
                checkpoint = Path(out_dir) / f"checkpoint_{index}"
                result = _run(case, Path(hf_dirs[case["family"]]), batch, checkpoint)
            if rank == 0:
                torch.save(result, Path(out_dir) / f"result_{index}.pt")
        finally:
            release_parallel_state()


def _policy(case: dict, hf_dir: Path):
    """A ``MegatronPolicy`` of the case's layout and engine on the Hugging Face weights."""
    from megatron.core import parallel_state

    from opefo_nemo.engines.megatron.build import wrap_for_training

    config_json = json.loads((hf_dir / "config.json").read_text())
    layout = MegatronLayout.from_hf_config(
        config_json,
        tensor_parallel=case["tp"],
        pipeline_parallel=case.get("pp", 1),
        make_vocab_size_divisible_by=DIVISIBLE_BY,
    )
    stage = parallel_state.get_pipeline_model_parallel_rank()
    model = megatron_gpt(layout, stage)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    load_hf_into_megatron(model, layout, hf_dir, stage, tp_rank)
    config = MegatronEngineConfig(
        dtype="float32",
        micro_batch_size=case["micro_batch_size"],
        use_distributed_optimizer=False,
        **case["engine"],
    )
    lr = load_method(*case["method"]).lr
    return wrap_for_training(model, layout, config, lr=lr, temperature=TEMPERATURE)


def _resumes_exactly(case: dict, hf_dir: Path, policy, checkpoint: Path) -> bool:
    """``save`` then ``load`` into a fresh policy (the untrained weights, fresh optimizer):
    weights, the learning rate and the optimizer's state (megatron's fp32 optimizer hands out its
    inner ``torch.optim.AdamW``'s: ``exp_avg``, ``exp_avg_sq``, ``step`` per parameter) come back
    bit for bit on every rank (every pipeline stage)."""
    with checkpoint_on_cpu():
        policy.save(checkpoint)
    fresh = _policy(case, hf_dir)
    fresh.load(checkpoint)
    same = fresh.lr == policy.lr
    for (name, ours), (other, theirs) in zip(
        fresh.named_weights(), policy.named_weights(), strict=True
    ):
        same = same and name == other and torch.equal(ours, theirs)
    new, old = fresh.optimizer.state_dict()["state"], policy.optimizer.state_dict()["state"]
    same = same and len(old) == len(list(policy.model.parameters()))  # every parameter has state
    for key, state in old.items():
        same = same and state.keys() == new[key].keys() == {"step", "exp_avg", "exp_avg_sq"}
        same = same and all(torch.equal(new[key][k], v) for k, v in state.items())
    verdict = torch.tensor([float(same and new.keys() == old.keys())])
    torch.distributed.all_reduce(verdict, op=torch.distributed.ReduceOp.MIN)
    return bool(verdict[0] > 0)


def _run(case: dict, hf_dir: Path, batch, checkpoint: Path) -> dict:
    micro_batch_size = case["micro_batch_size"]
    method = load_method(*case["method"])
    policy = _policy(case, hf_dir)
    layout, clip = policy.layout, policy.config.grad_clip
    stats = policy.token_stats(batch, sums=VOCAB_SUMS)

    with main_grads_at_steps(policy) as steps:
        outcome = update_rollout_batch(
            policy, build_objective(method), batch, micro_batch_size, seed=0
        )
    captured = [clipped(grads, norm, clip) for grads, norm in steps]
    grads = [hf_names(layout, step) for step in captured]
    weights = {name: tensor.clone() for name, tensor in policy.named_weights()}

    policy.advance_schedule()
    resumed = _resumes_exactly(case, hf_dir, policy, checkpoint)
    micros = batch.split(micro_batch_size)
    expected = [policy.token_stats(m).logprob for m in micros]
    recorded: dict[int, torch.Tensor] = {}

    def loss_fn(index, with_grad):
        recorded[index] = with_grad.logprob.detach().clone()
        mask = micros[index].response_mask
        return LossOutput(-(with_grad.logprob * mask).sum() / batch.n_response_tokens, {})

    second = policy.train_step(micros, loss_fn, ())
    # loss_fn runs on the last pipeline stage of each data-parallel rank, for that rank's own
    # micro-batches: together they are every micro-batch of the step
    seen: list = [None] * dist.get_world_size()
    dist.all_gather_object(seen, sorted(recorded))
    assert sorted({i for indices in seen for i in indices}) == list(range(len(micros)))
    for index, logprob in recorded.items():
        mask = micros[index].response_mask
        # equal up to fp32 round-off (of the largest |logprob|): the two passes pad to different
        # [rows, T] shapes
        assert_close_to_scale(logprob[mask], expected[index][mask], 1e-5, f"micro {index}")
    _skips_everywhere(policy, micros)
    return {
        "stats": {field: getattr(stats, field) for field in STAT_FIELDS},
        "metrics": outcome.metrics,
        "skipped": outcome.skipped_steps,
        "grads": grads,
        "weights": weights,
        "second_lr": second.lr,
        "resumed": resumed,
    }


def _skips_everywhere(policy, micros) -> None:
    """A step whose first micro-batch's loss is +inf (its gradient is finite: only the loss
    value is bad, and only the rank that owns micro-batch 0 sees it) is skipped on every rank:
    no weight moves, ``grad_norm`` is NaN (``HFPolicy``'s rule)."""
    before = {name: tensor.clone() for name, tensor in policy.named_weights()}

    def loss_fn(index, with_grad):
        loss = -(with_grad.logprob * micros[index].response_mask).sum()
        return LossOutput(loss + math.inf if index == 0 else loss, {})

    result = policy.train_step(micros, loss_fn, ())
    assert result.skipped and math.isnan(result.grad_norm)
    for name, tensor in policy.named_weights():
        assert torch.equal(tensor, before[name]), name


def hf_names(layout: MegatronLayout, megatron_grads: dict[str, torch.Tensor]) -> dict:
    """Megatron gradients gathered over TP and converted to Hugging Face names (the same linear
    mapping as the weights: fused rows split, padded vocabulary rows dropped)."""
    from megatron.core import parallel_state

    fetch = DistributedFetch(
        layout,
        megatron_grads,
        parallel_state.get_tensor_model_parallel_group(),
        parallel_state.get_pipeline_model_parallel_group(),
        torch.float32,
    )
    return {name: tensor.clone() for name, tensor in hf_named_weights(layout, fetch)}
