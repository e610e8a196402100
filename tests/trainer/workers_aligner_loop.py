"""Spawned ranks of ``test_aligner_loop_vllm.py``: the real :class:`Trainer` driving
``MegatronPolicy`` (a real megatron-core ``GPTModel``, TP 2 or DP 2 over the two ranks) and a
real :class:`ColocatedRollout` over a real vLLM CPU server.

Test scaffolding only: the model is built with ``tests/aligner``'s ``megatron_gpt`` (local layer
spec, fp32) on ``megatron_on_cpu``'s CUDA-to-CPU redirections, and its norms take the Hugging Face
config's ``rms_norm_eps`` (``megatron_gpt`` builds them with megatron's default 1e-5). Everything
else (policy, loop, checkpoint, resume, refits, rollout routing) is the production code.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import torch

from opefo_nemo.config.compose import compose
from opefo_nemo.engines.megatron.cpu_execution import megatron_on_cpu
from opefo_nemo.models.megatron_weights import MegatronLayout
from opefo_nemo.rollout import Completion, SamplingConfig
from opefo_nemo.trainer.colocated_rollout import ColocatedRollout
from opefo_nemo.trainer.loop import Trainer
from opefo_nemo.trainer.prompts import PromptCodec
from opefo_nemo.trainer.ranks import LoopRanks
from opefo_nemo.trainer.setup import load_datasets
from tests.megatron.tiny import megatron_gpt
from tests.megatron.workers_policy import load_hf_into_megatron
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


def _rms_norms(model: torch.nn.Module) -> list[torch.nn.RMSNorm]:
    return [m for m in model.modules() if isinstance(m, torch.nn.RMSNorm)]


def _megatron_policy(config, model_dir: Path):
    """``MegatronPolicy`` on this rank's TP shard (all of it at TP 1) of the Hugging Face model
    at ``model_dir``."""
    from megatron.core import parallel_state

    from opefo_nemo.engines.megatron.policy import MegatronPolicy, build_adamw

    engine = config.engine
    hf_config = json.loads((model_dir / "config.json").read_text())
    theta = hf_config.get("rope_theta") or hf_config["rope_parameters"]["rope_theta"]
    if theta != MEGATRON_ROPE_THETA:
        raise ValueError(f"{model_dir}: rope_theta {theta}, megatron_gpt uses 10000")
    layout = MegatronLayout.from_hf_config(
        hf_config,
        tensor_parallel=engine.tensor_model_parallel_size,
        pipeline_parallel=engine.pipeline_model_parallel_size,
        make_vocab_size_divisible_by=engine.make_vocab_size_divisible_by,
    )
    stage = parallel_state.get_pipeline_model_parallel_rank()
    model = megatron_gpt(layout, stage, max_sequence_length=hf_config["max_position_embeddings"])
    norms = _rms_norms(model)
    if len(norms) != 2 * len(layout.stage_layers(stage)) + int(
        stage == layout.pipeline_parallel - 1
    ):
        raise ValueError(f"expected two RMSNorms per decoder layer and a final one, {len(norms)}")
    for norm in norms:
        norm.eps = hf_config["rms_norm_eps"]
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    load_hf_into_megatron(model, layout, model_dir, stage, tp_rank)
    optimizer = build_adamw(model, engine, config.method.lr)
    return MegatronPolicy(
        model, optimizer, engine, layout=layout, temperature=config.rollout.temperature
    )


def _trainer(
    ranks: LoopRanks, overrides: list[str], out: Path, rollout: ColocatedRollout | None
) -> tuple[Trainer, RecordingRollout]:
    """The loop as ``build_trainer`` wires it for ``engine=aligner`` on several ranks, with the
    policy built here instead of from a NeMo checkpoint, and one TP-1 vLLM server for the group
    of ``engine.rollout_tp_size`` = 2 ranks (the kind the single-process reference uses; rank 1
    owns none and only walks the weight stream)."""
    config, config_dict = compose(overrides)
    model_dir = Path(config.model.path)
    policy = _megatron_policy(config, model_dir)
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
    if config.checkpoint.resume is not None:
        trainer.resume(config.checkpoint.resume)
    return trainer, recording


def run_and_resume(rank: int, world_size: int, layouts: dict[str, list[str]], out: str) -> None:
    """For each ``name: overrides`` of ``layouts`` in turn (``parallel_state`` set up for its
    TP × PP, DP = the rest; one rollout server for all of them): run to ``trainer.max_steps``
    under ``out/<name>/straight``, checkpointing every ``checkpoint.every`` steps; then a fresh
    policy and trainer resume from the checkpoint of step ``checkpoint.every`` and finish the run
    under ``out/<name>/resumed``. Each rank writes ``out/<name>/rank<r>.json``: statuses, steps
    and ``generate`` calls."""
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
    engine = config.engine
    parallel_state.initialize_model_parallel(
        engine.tensor_model_parallel_size,
        engine.pipeline_model_parallel_size,
        create_gloo_process_groups=False,
    )
    try:
        with megatron_on_cpu():
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
