"""Wiring a run from its validated config: model directory, datasets, policy, rollout, trainer
(docs/training.md: "The loop", "Several ranks").
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from opefo_nemo.config.data import GENERATED_DATA, DataConfig
from opefo_nemo.config.engines import MegatronEngineConfig
from opefo_nemo.config.train import TrainConfig
from opefo_nemo.data import Problem, load_problems
from opefo_nemo.data.prompt_codec import PromptCodec, encode_problems
from opefo_nemo.engines.hf import HFPolicy
from opefo_nemo.engines.hf_generation import HFGenerator
from opefo_nemo.engines.protocols import Policy
from opefo_nemo.engines.startup import startup_problems
from opefo_nemo.launch.placement import ColocatedPlacement, device_slices
from opefo_nemo.models.packaged import converted_model
from opefo_nemo.models.shape import ModelShape
from opefo_nemo.orchestration.colocated_rollout import ColocatedRollout
from opefo_nemo.orchestration.protocols import RolloutEngine
from opefo_nemo.orchestration.ranks import LoopRanks, RankLayoutError
from opefo_nemo.orchestration.rollout_guard import GuardedRollout
from opefo_nemo.rollout import VLLMRolloutEngine
from opefo_nemo.tasks.arithmetic import make_problems
from opefo_nemo.tasks.embedded_model import embedded_model as build_embedded_model
from opefo_nemo.tasks.word_arithmetic import make_word_problems
from opefo_nemo.trainer.inputs import (
    ARITHMETIC,
    check_embedded_model,
    check_inputs,
    check_model,
    warm_start_recipe,
)
from opefo_nemo.trainer.loop import Dataset, Trainer

log = logging.getLogger(__name__)


def arithmetic_split(data: DataConfig) -> tuple[list[Problem], list[Problem]]:
    a = data.arithmetic
    return make_problems(a.digits, a.num_train, a.num_validation, a.seed)


def generated_split(name: str, data: DataConfig) -> tuple[list[Problem], list[Problem]]:
    """Training and validation problems of the built-in task ``name`` (``GENERATED_DATA``)."""
    if name == ARITHMETIC:
        return arithmetic_split(data)
    a = data.arithmetic
    return make_word_problems(
        a.digits, a.num_train, a.num_validation, a.seed, a.operation, a.max_operand
    )


def embedded_model(config: TrainConfig) -> Path:
    """The warm-started tiny model at ``model.path``, built on first use from the arithmetic
    task's training problems (:func:`..tasks.embedded_model.embedded_model`)."""
    data = config.data

    check_embedded_model(config)  # a foreign directory or other data: one line naming the fix

    def problems() -> list[Problem]:
        return arithmetic_split(data)[0]

    return build_embedded_model(
        Path(config.model.path),
        config.model.warm_start,
        warm_start_recipe(config),
        problems,
        lambda base: PromptCodec(base, data.template),
        use_shipped=config.model.shipped_warm_start,
    )


def model_dir(config: TrainConfig) -> Path:
    """The run's model directory: the embedded model (``model.embedded``), built and
    warm-started once into ``model.path`` and reused afterwards; a packaged model, converted on
    first use; else ``model.path``, which must already exist."""
    if config.model.embedded:
        return embedded_model(config)
    if config.model.packaged is not None:
        return converted_model(config.model.packaged, Path(config.model.path))
    check_model(config)
    return Path(config.model.path)


def load_datasets(config: TrainConfig, codec: PromptCodec) -> tuple[Dataset, Dataset | None]:
    """Training and validation problems, encoded; long prompts handled per ``data.long_prompt``."""
    data = config.data

    def load(source: str, which: int, what: str) -> Dataset:
        generated = source in GENERATED_DATA
        problems = (
            generated_split(source, data)[which]
            if generated
            else load_problems(source, defective=data.defective_rows)
        )
        encoded = encode_problems(problems, codec, data.max_prompt_tokens, data.long_prompt, what)
        if encoded.skipped_long:
            log.warning(
                "%s: skipped %d of %d prompts longer than data.max_prompt_tokens=%d",
                what,
                encoded.skipped_long,
                len(problems),
                data.max_prompt_tokens,
            )
        return Dataset(encoded.problems, encoded.prompts)

    train = load(data.train, 0, f"data.train={data.train}")
    validation = (
        None
        if data.validation is None
        else load(data.validation, 1, f"data.validation={data.validation}")
    )
    return train, validation


def start_rollout(
    config: TrainConfig, path: Path, weights: Callable[[], Iterator[tuple[str, Tensor]]]
) -> GuardedRollout:
    """vLLM servers on the model directory, restarted on failure per ``rollout.max_restarts``;
    on GPUs each server gets its own GPU (``launch.placement.device_slices``)."""
    r = config.rollout
    max_len = max(config.data.max_prompt_tokens + r.max_new_tokens, 64)
    slices = device_slices(
        r.num_servers, 1, torch.cuda.device_count(), os.environ.get("CUDA_VISIBLE_DEVICES")
    )

    def start() -> VLLMRolloutEngine:
        return VLLMRolloutEngine.from_config(
            path,
            r,
            seed=config.run.seed,
            max_model_len=max_len,
            dtype=config.engine.dtype,  # sample from the policy the engine trains (spec §1)
            devices=slices,
        )

    return GuardedRollout(start, weights, r.max_restarts)


def start_colocated_rollout(
    config: TrainConfig,
    path: Path,
    weights: Callable[[], Iterator[tuple[str, Tensor]]],
    ranks: LoopRanks,
) -> ColocatedRollout:
    """One vLLM server per ``engine.rollout_tp_size`` GPUs of each node, started by the lowest
    rank on them with only those GPUs visible (``launch/placement.py``)."""
    r = config.rollout
    rollout_tp = getattr(config.engine, "rollout_tp_size", 1)
    placement = ColocatedPlacement(ranks.world_size, ranks.local_world_size, rollout_tp)
    max_len = max(config.data.max_prompt_tokens + r.max_new_tokens, 64)
    on_gpu = torch.cuda.is_available()

    def start(placement: ColocatedPlacement, index: int) -> RolloutEngine:
        server = placement.server(index)
        devices = server.visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"))
        return VLLMRolloutEngine.from_config(
            path,
            dataclasses.replace(r, num_servers=1),
            seed=config.run.seed,
            max_model_len=max_len,
            dtype=config.engine.dtype,
            devices=[devices] if on_gpu else None,
            tensor_parallel_size=placement.rollout_tp_size,
            weight_transport="cuda_ipc" if on_gpu else "shm",
        )

    return ColocatedRollout(ranks, placement, start, weights, r.max_restarts)


def start_engine_rollout(config: TrainConfig, policy: Policy, pad_id: int) -> HFGenerator:
    """``rollout=engine``: the hf engine's own model samples, ``engine.micro_batch_size`` rows
    a forward (``engines/hf_generation.py``); nothing to start, refits are no-ops."""
    if not isinstance(policy, HFPolicy):  # refused by RolloutConfig.validate before
        raise RankLayoutError(f"rollout=engine needs engine=hf, not engine={config.engine.name}")
    return HFGenerator(policy.model, policy.device, pad_id, config.engine.micro_batch_size)


def model_shape(path: Path) -> ModelShape | None:
    """The shape of the model at ``path`` from its ``config.json`` (``None`` without one)."""
    return ModelShape.from_model_dir(path) if (path / "config.json").is_file() else None


def build_policy(config: TrainConfig, path: Path) -> Policy:
    """The training engine ``engine.name`` selects, on the model at ``path``, after the start-up
    rules preflight reports too (:func:`~opefo_nemo.engines.startup.startup_problems`)."""
    problems = startup_problems(config.engine, model_shape(path))
    if problems:
        raise RankLayoutError("; ".join(problems))
    engine, lr, temperature = config.engine, config.method.lr, config.rollout.temperature
    if isinstance(engine, MegatronEngineConfig) and engine.name == "megatron":
        from opefo_nemo.engines.megatron.build import build_megatron_policy

        return build_megatron_policy(path, engine, lr=lr, temperature=temperature)
    if isinstance(engine, MegatronEngineConfig) and engine.name == "aligner":
        from opefo_nemo.engines.aligner import build_actor

        return build_actor(path, engine, lr=lr, temperature=temperature)
    assert not isinstance(engine, MegatronEngineConfig), engine.name  # validated: hf
    return HFPolicy(path, engine, lr=lr, temperature=temperature)


def build_trainer(
    config: TrainConfig,
    config_dict: dict[str, Any],
    output_dir: Path,
    rollout: GuardedRollout | None = None,
    resume: bool = True,
) -> Trainer:
    """Everything a run needs, started, after :func:`.inputs.check_inputs`; continues the
    checkpoint ``checkpoint.resume`` selects (``resume=False``: from step 0, the probe's view).

    ``rollout``: an already running rollout engine (of the same model architecture) to reuse,
    e.g. across the runs of a comparison; the policy's weights are loaded into it first.
    Otherwise the rollout servers are started on the model directory; with ``rollout=engine``
    the policy generates itself (no ``rollout`` to share).
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1 and config.engine.name == "hf":
        raise RankLayoutError(
            f"engine=hf trains in one process, but this run has WORLD_SIZE={world_size} "
            "ranks: launch one process, or use engine=megatron"
        )
    check_inputs(config, output_dir)
    ranks = LoopRanks.from_environment()
    path = model_dir(config)
    policy = build_policy(config, path)
    codec = PromptCodec(path, config.data.template)
    train, validation = load_datasets(config, codec)
    engine: GuardedRollout | ColocatedRollout | HFGenerator
    if config.rollout.name == "engine":
        if rollout is not None:
            raise ValueError("rollout=engine generates with the policy: no rollout to share")
        engine = start_engine_rollout(config, policy, codec.pad_id)
    elif rollout is None and ranks.distributed:
        engine = start_colocated_rollout(config, path, policy.named_weights, ranks)
    elif rollout is None:
        engine = start_rollout(config, path, policy.named_weights)
    else:
        engine = rollout
        engine.weights = policy.named_weights
        engine.update_weights(policy.named_weights())
    shape = model_shape(path)
    trainer = Trainer(
        config,
        config_dict,
        policy,
        engine,
        codec,
        train,
        validation,
        output_dir,
        ranks,
        attention_width=None if shape is None else shape.attention_width(),
    )
    if resume:
        trainer.resume(config.checkpoint.resume)
    return trainer
