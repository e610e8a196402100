"""Wiring a run from its validated config: model directory, datasets, policy, rollout, trainer.

The embedded model (``model.embedded``) is built and warm-started once into ``model.path`` and
reused afterwards; every other path must already exist. A run launched on several ranks
(``WORLD_SIZE > 1``: ``torchrun``, or ``srun`` through ``slurm/common.sh``) joins the default
process group first (:class:`.ranks.LoopRanks`) and generates with vLLM servers colocated on its
GPUs (:class:`.colocated_rollout.ColocatedRollout`); only multi-process engines accept that.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..config.engines import MegatronEngineConfig
from ..config.train import GENERATED_DATA, DataConfig, TrainConfig
from ..data import Problem, load_problems
from ..engines.hf import HFPolicy
from ..engines.protocols import Policy
from ..engines.startup import startup_problems
from ..launch.placement import ColocatedPlacement, device_slices
from ..models.packaged import converted_model
from ..models.shape import ModelShape
from ..models.tiny import TinyModelSpec, build_tiny_model
from ..rollout import VLLMRolloutEngine
from ..tasks.arithmetic import make_problems, operands, worked_solution
from ..tasks.warm_start import read_recipe, supervised_warm_start
from ..tasks.word_arithmetic import make_word_problems
from .colocated_rollout import ColocatedRollout
from .inputs import (
    ARITHMETIC,
    ModelPathError,
    check_embedded_model,
    check_inputs,
    check_model,
    is_embedded_default,
)
from .loop import Dataset, Trainer
from .prompts import PromptCodec, encode_problems
from .protocols import RolloutEngine
from .ranks import LoopRanks, RankLayoutError
from .rollout_guard import GuardedRollout

log = logging.getLogger(__name__)


TASK = "column addition with worked steps"
"""Names the embedded task in the warm-start recipe, so a cache of another task is rebuilt."""


def arithmetic_split(data: DataConfig) -> tuple[list[Problem], list[Problem]]:
    a = data.arithmetic
    return make_problems(a.digits, a.num_train, a.num_validation, a.seed)


def generated_split(name: str, data: DataConfig) -> tuple[list[Problem], list[Problem]]:
    """Training and validation problems of the built-in task ``name`` (``GENERATED_DATA``)."""
    if name == ARITHMETIC:
        return arithmetic_split(data)
    a = data.arithmetic
    return make_word_problems(a.digits, a.num_train, a.num_validation, a.seed)


def warm_start_recipe(config: TrainConfig) -> dict[str, Any]:
    """What the embedded model is made from: the task and every warm-start setting."""
    return {
        "task": TASK,
        "steps": config.model.warm_start_steps,
        "lr": config.model.warm_start_lr,
        "batch_size": config.model.warm_start_batch_size,
        "slip_rate": config.model.warm_start_slip_rate,
        "slips": list(config.model.warm_start_slips),
        "swap_rate": config.model.warm_start_swap_rate,
        "carry_first_rate": config.model.warm_start_carry_first_rate,
        "zero_carry_rate": config.model.warm_start_zero_carry_rate,
        "separators": config.model.warm_start_separators,
        "separator_rate": config.model.warm_start_separator_rate,
        "seed": config.model.warm_start_seed,
        "template": config.data.template,
        "arithmetic": dataclasses.asdict(config.data.arithmetic),
    }


def embedded_model(config: TrainConfig) -> Path:
    """The warm-started tiny model at ``model.path``, built on first use (nothing downloaded).

    It is built only into one of :func:`embedded_paths`: any other ``model.path`` must already
    hold it, so that a mistyped path of one's own model (``model.path=...`` without
    ``model=local``) is an error, not a toy model trained in its place. The recipe
    (:func:`warm_start_recipe`) is stored with the model. A warm start in the default place made
    with another recipe (an older task, other settings) is a stale cache: it is replaced by a new
    build. Anywhere else another recipe is an error rather than a silent reuse.
    """
    target = Path(config.model.path)
    check_embedded_model(config)
    recipe = warm_start_recipe(config)
    if target.exists():
        found = read_recipe(target)
        if found == recipe:
            return target
        if not is_embedded_default(target):
            raise ModelPathError(
                f"model.path={target} holds a warm start made with other model.warm_start_* or "
                "data settings: restore those, or leave model.path at its default (rebuilt there)"
            )
        log.warning("%s holds a warm start made with another recipe: rebuilding it", target)
        shutil.rmtree(target)
    log.info("building the embedded tiny model and warm-starting it into %s", target)
    base = build_tiny_model(
        target.parent / f"{target.name}.base", TinyModelSpec(), config.model.warm_start_seed
    )
    codec = PromptCodec(base, config.data.template)
    train, _ = arithmetic_split(config.data)
    prompts = [codec.encode(p) for p in train]
    m = config.model

    def draw(rng: random.Random) -> tuple[list[int], list[int]]:
        index = rng.randrange(len(train))
        solution = worked_solution(
            *operands(train[index].problem),
            m.warm_start_slip_rate,
            rng,
            slips=m.warm_start_slips,
            swap_rate=m.warm_start_swap_rate,
            carry_first_rate=m.warm_start_carry_first_rate,
            zero_carry_rate=m.warm_start_zero_carry_rate,
            separators=m.warm_start_separators,
            separator_rate=m.warm_start_separator_rate,
        )
        response = codec.tokenizer.encode(solution, add_special_tokens=False)
        return prompts[index], [*response, codec.eos_id]

    return supervised_warm_start(
        base,
        target,
        draw,
        steps=config.model.warm_start_steps,
        lr=config.model.warm_start_lr,
        seed=config.model.warm_start_seed,
        pad_id=codec.pad_id,
        recipe=recipe,
        batch_size=config.model.warm_start_batch_size,
    )


def model_dir(config: TrainConfig) -> Path:
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
        return VLLMRolloutEngine(
            path,
            num_servers=r.num_servers,
            python=r.python,
            startup_timeout_s=r.startup_timeout_s,
            seed=config.run.seed,
            max_model_len=max_len,
            gpu_memory_utilization=r.gpu_memory_utilization,
            dtype=config.engine.dtype,  # sample from the policy the engine trains (spec §1)
            server_env=None if slices is None else [{"CUDA_VISIBLE_DEVICES": d} for d in slices],
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
        return VLLMRolloutEngine(
            path,
            num_servers=1,
            python=r.python,
            startup_timeout_s=r.startup_timeout_s,
            seed=config.run.seed,
            max_model_len=max_len,
            gpu_memory_utilization=r.gpu_memory_utilization,
            dtype=config.engine.dtype,
            tensor_parallel_size=placement.rollout_tp_size,
            extra_env={"CUDA_VISIBLE_DEVICES": devices} if on_gpu else None,
            weight_transport="cuda_ipc" if on_gpu else "shm",
        )

    return ColocatedRollout(ranks, placement, start, weights, r.max_restarts)


def build_policy(config: TrainConfig, path: Path) -> Policy:
    """The training engine ``engine.name`` selects, on the model at ``path``, after the start-up
    rules preflight reports too (:func:`~opefo_nemo.engines.startup.startup_problems`)."""
    shape = ModelShape.from_model_dir(path) if (path / "config.json").is_file() else None
    problems = startup_problems(config.engine, shape)
    if problems:
        raise RankLayoutError("; ".join(problems))
    engine, lr, temperature = config.engine, config.method.lr, config.rollout.temperature
    if isinstance(engine, MegatronEngineConfig) and engine.name == "megatron":
        from ..engines.megatron.build import build_megatron_policy

        return build_megatron_policy(path, engine, lr=lr, temperature=temperature)
    if isinstance(engine, MegatronEngineConfig) and engine.name == "aligner":
        from ..engines.aligner import build_actor

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
    Otherwise the rollout servers are started on the model directory.
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
    engine: GuardedRollout | ColocatedRollout
    if rollout is None and ranks.distributed:
        engine = start_colocated_rollout(config, path, policy.named_weights, ranks)
    elif rollout is None:
        engine = start_rollout(config, path, policy.named_weights)
    else:
        engine = rollout
        engine.weights = policy.named_weights
        engine.update_weights(policy.named_weights())
    trainer = Trainer(
        config, config_dict, policy, engine, codec, train, validation, output_dir, ranks
    )
    if resume:
        trainer.resume(config.checkpoint.resume)
    return trainer
