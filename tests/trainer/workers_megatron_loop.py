"""Spawned ranks of ``test_loop_megatron_vllm.py``: the real :class:`Trainer` driving the
``engine=megatron`` policy exactly as ``build_trainer`` builds it (``build_policy``: the
megatron-core ``GPTModel`` from the Hugging Face directory, megatron DDP and optimizer, CPU ranks
through ``engine.device=cpu``) and a real :class:`ColocatedRollout` over a real vLLM CPU server.
The only test scaffolding: one rollout server shared by the layouts and the recording of every
``generate`` call.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

from opefo_nemo.config.compose import compose
from opefo_nemo.data.prompt_codec import PromptCodec
from opefo_nemo.orchestration.colocated_rollout import ColocatedRollout
from opefo_nemo.orchestration.ranks import LoopRanks
from opefo_nemo.rollout import Completion, SamplingConfig
from opefo_nemo.trainer.loop import Trainer
from opefo_nemo.trainer.setup import build_policy, load_datasets
from tests.trainer.workers_spmd import one_server_per_group

#: ``megatron_gpt``'s rotary base (megatron-core's default); the model's must be the same.
MEGATRON_ROPE_THETA = 10000.0


class RecordingRollout:
    """The trainer's rollout engine, unchanged, with every ``generate`` call's prompts, sampling
    and completions recorded (``calls``) for the test to compare."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.calls: list[dict] = []

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingConfig):
        completions = self.engine.generate(prompts, n, sampling)
        self.calls.append(record_call(prompts, n, sampling, completions))
        return completions

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    def __setattr__(self, name: str, value) -> None:
        if name in ("engine", "calls"):
            object.__setattr__(self, name, value)
        else:
            setattr(self.engine, name, value)


def record_call(
    prompts: list[list[int]], n: int, sampling: SamplingConfig, completions: list[Completion]
) -> dict:
    """One ``generate`` call as JSON-able lists: its arguments, and per completion its prompt
    index, tokens, finish reason and the server's logprobs of the tokens."""
    return {
        "prompts": prompts,
        "n": n,
        "sampling": dataclasses.asdict(sampling),
        "completions": [[c.prompt_index, c.token_ids, c.finish_reason] for c in completions],
        "logprobs": [c.logprobs for c in completions],
    }


def _trainer(
    ranks: LoopRanks, overrides: list[str], out: Path, rollout: ColocatedRollout | None
) -> tuple[Trainer, RecordingRollout]:
    """The loop as ``build_trainer`` wires it for ``engine=megatron`` on several ranks, with one
    TP-1 vLLM server for the group of ``engine.rollout_tp_size`` = 2 ranks (the kind the
    single-process reference uses; rank 1 owns none and only walks the weight stream)."""
    config, config_dict = compose(overrides)
    model_dir = Path(config.model.path)
    policy = build_policy(config, model_dir)
    codec = PromptCodec(model_dir, config.data.template)
    train, validation = load_datasets(config, codec)
    if rollout is None:
        rollout = one_server_per_group(
            ranks, config, model_dir, policy.named_weights, config.engine.rollout_tp_size
        )
    rollout.weights = policy.named_weights
    rollout.update_weights(policy.named_weights())
    recording = RecordingRollout(rollout)
    trainer = Trainer(config, config_dict, policy, recording, codec, train, validation, out, ranks)
    trainer.resume(config.checkpoint.resume)
    return trainer, recording


def run_and_resume(rank: int, world_size: int, layouts: dict[str, list[str]], out: str) -> None:
    """For each ``name: overrides`` of ``layouts`` in turn (the policy sets ``parallel_state``
    up for its TP × PP, DP = the rest; one rollout server for all of them): run to
    ``trainer.max_steps`` under ``out/<name>/straight``, checkpointing every
    ``checkpoint.every`` steps; then a fresh policy and trainer resume from the checkpoint of
    step ``checkpoint.every`` and finish the run under ``out/<name>/resumed``. Each rank writes
    ``out/<name>/rank<r>.json``: statuses, steps and ``generate`` calls."""
    warnings.filterwarnings("ignore")
    ranks = LoopRanks(rank, world_size, world_size)
    rollout = None
    try:
        for name, overrides in layouts.items():
            rollout = _run_and_resume(ranks, overrides, Path(out) / name, rollout)
    finally:
        if rollout is not None:
            rollout.close()


def _run_and_resume(
    ranks: LoopRanks, overrides: list[str], out_dir: Path, rollout: ColocatedRollout | None
) -> ColocatedRollout:
    from megatron.core import parallel_state

    config, _ = compose(overrides)
    try:
        first, first_calls = _trainer(ranks, overrides, out_dir / "straight", rollout)
        status = first.run()
        every = config.checkpoint.every
        checkpoint = out_dir / "straight" / "checkpoints" / f"step_{every:06d}"
        resumed_overrides = [*overrides, f"checkpoint.resume={checkpoint}"]
        second, second_calls = _trainer(
            ranks, resumed_overrides, out_dir / "resumed", first_calls.engine
        )
        resumed_at = second.step
        resumed_status = second.run()
    finally:
        parallel_state.destroy_model_parallel()
    report = {
        "straight": [status, first.step, first_calls.calls],
        "resumed": [resumed_status, resumed_at, second.step, second_calls.calls],
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"rank{ranks.rank}.json").write_text(json.dumps(report))
    return first_calls.engine


def run_straight(rank: int, world_size: int, overrides: list[str], out: str) -> None:
    """The loop to ``trainer.max_steps`` under ``out`` (one vLLM server for the whole world:
    ``engine.rollout_tp_size`` = the world size); each rank writes ``out/rank<r>.json`` with its
    status, steps and ``generate`` calls."""
    from megatron.core import parallel_state

    warnings.filterwarnings("ignore")
    ranks = LoopRanks(rank, world_size, world_size)
    trainer, calls = None, None
    try:
        trainer, calls = _trainer(ranks, overrides, Path(out), None)
        status = trainer.run()
        report = [status, trainer.step, calls.calls]
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"rank{rank}.json").write_text(json.dumps(report))
    finally:
        if calls is not None:
            calls.engine.close()
        parallel_state.destroy_model_parallel()
