"""Preflight's checks: each returns every problem it finds, so one run lists them all."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from opefo_nemo.launch.layout import ParallelLayout
from opefo_nemo.launch.memory import GIB, MemoryEstimate, estimate_memory
from opefo_nemo.launch.placement import (
    ColocatedPlacement,
    PlacementError,
    vllm_tensor_parallel_problems,
)
from opefo_nemo.launch.plan import LaunchPlan
from opefo_nemo.models.directory import model_files_problem


@dataclass(frozen=True)
class LaunchProblem:
    """One reason the launch would fail; ``topic`` names the check, ``message`` the fix."""

    topic: str
    message: str

    def __str__(self) -> str:
        return f"[{self.topic}] {self.message}"


SINGLE_PROCESS_ENGINES = ("hf",)
"""Engines that train in one process on one device: their world size is 1."""


def layout_of(plan: LaunchPlan) -> ParallelLayout | None:
    """The plan's layout, or ``None`` when TP × PP does not divide the world size."""
    try:
        return ParallelLayout.for_world(
            plan.world_size, plan.tensor_parallel, plan.pipeline_parallel, plan.sequence_parallel
        )
    except ValueError:
        return None


def check_layout(plan: LaunchPlan) -> list[LaunchProblem]:
    """World size vs TP × PP × DP, and the model's heads and layers vs TP and PP."""
    problems = []
    tp, pp = plan.tensor_parallel, plan.pipeline_parallel
    if tp <= 0 or pp <= 0 or plan.world_size <= 0:
        return [
            LaunchProblem(
                "layout",
                f"world size {plan.world_size}, tensor parallel {tp} and pipeline parallel {pp} "
                "must all be positive",
            )
        ]
    if plan.engine in SINGLE_PROCESS_ENGINES and plan.world_size != 1:
        problems.append(
            LaunchProblem(
                "layout",
                f"engine {plan.engine!r} trains in one process, but the allocation has "
                f"{plan.world_size} tasks: request one task (--ntasks-per-node=1, one node)",
            )
        )
    if plan.world_size % (tp * pp):
        problems.append(
            LaunchProblem(
                "layout",
                f"world size {plan.world_size} is not a multiple of tensor parallel {tp} × "
                f"pipeline parallel {pp} = {tp * pp}: no data-parallel size fits",
            )
        )
    shape = plan.shape
    if shape is not None:
        for name, count in (
            ("num_attention_heads", shape.num_attention_heads),
            ("intermediate_size", shape.intermediate_size),
        ):
            if count % tp:
                problems.append(
                    LaunchProblem(
                        "layout",
                        f"model {name} = {count} is not divisible by tensor parallel {tp}",
                    )
                )
        groups = shape.num_key_value_heads
        if groups % tp and tp % groups:
            problems.append(
                LaunchProblem(
                    "layout",
                    f"model num_key_value_heads = {groups} and tensor parallel {tp}: one must "
                    "divide the other (Megatron replicates key/value heads when TP exceeds them)",
                )
            )
        if shape.num_layers % pp:
            problems.append(
                LaunchProblem(
                    "layout",
                    f"model num_layers = {shape.num_layers} is not divisible by pipeline "
                    f"parallel {pp}",
                )
            )
    return problems


def check_batch(plan: LaunchPlan) -> list[LaunchProblem]:
    """Prompts × responses split into ``updates_per_rollout`` equal mini-batches. Nothing is asked
    of the data-parallel size: the engines run any number of micro-batches on each rank, none
    included, and scale each rank's loss by its own count (docs/batch_layout.md)."""
    total = plan.responses_per_step
    updates = plan.updates_per_rollout
    if updates <= 0 or plan.micro_batch_size <= 0:
        return [
            LaunchProblem(
                "batch",
                f"updates_per_rollout {updates} and micro_batch_size {plan.micro_batch_size} "
                "must be positive",
            )
        ]
    if total % updates:
        return [
            LaunchProblem(
                "batch",
                f"{plan.prompts_per_step} prompts × {plan.responses_per_prompt} responses = "
                f"{total} responses do not split into {updates} equal mini-batches",
            )
        ]
    return []


def _readable_file_or_dir(path: Path) -> bool:
    return os.access(path, os.R_OK) and (path.is_file() or os.access(path, os.X_OK))


def _writable_dir(path: Path) -> bool:
    """``path`` is a writable directory, or can be created under a writable ancestor."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate.is_dir() and os.access(candidate, os.W_OK | os.X_OK)
    return False


def check_paths(plan: LaunchPlan) -> list[LaunchProblem]:
    """The model directory holds what the engines load, by its files
    (:func:`~opefo_nemo.models.directory.model_files_problem`, which start-up checks too), the
    data files and resume checkpoint are readable; the checkpoint directory is writable (or
    creatable)."""
    problems = []
    if plan.model_path is not None:
        model = Path(plan.model_path)
        if model.exists() and not _readable_file_or_dir(model):
            problems.append(LaunchProblem("paths", f"model directory {model} is not readable"))
        else:
            problem = model_files_problem(model, f"model.path={model}")
            if problem is not None:
                problems.append(LaunchProblem("paths", problem))
    for data in plan.data_paths:
        if not Path(data).exists() or not _readable_file_or_dir(Path(data)):
            problems.append(LaunchProblem("paths", f"data path {data} is not readable"))
    if plan.resume_path is not None and not _readable_file_or_dir(Path(plan.resume_path)):
        problems.append(
            LaunchProblem("paths", f"resume checkpoint {plan.resume_path} is not readable")
        )
    if plan.checkpoint_dir is not None and not _writable_dir(Path(plan.checkpoint_dir)):
        problems.append(
            LaunchProblem("paths", f"checkpoint directory {plan.checkpoint_dir} is not writable")
        )
    return problems


def colocated_placement(plan: LaunchPlan) -> ColocatedPlacement | None:
    """Where the plan's vLLM servers run on the training GPUs (``rollout/placement.py``);
    ``None`` for single-process engines and for allocations that cannot host them."""
    if plan.engine in SINGLE_PROCESS_ENGINES:
        return None
    try:
        return ColocatedPlacement(plan.world_size, plan.ranks_per_node, plan.rollout_tp_size)
    except PlacementError:
        return None


def check_rollout(plan: LaunchPlan) -> list[LaunchProblem]:
    """The colocated vLLM servers fit the allocation: ``engine.rollout_tp_size`` GPUs of one
    node per server, and a model vLLM can shard over that many GPUs."""
    if plan.engine in SINGLE_PROCESS_ENGINES:
        return []
    problems = []
    try:
        ColocatedPlacement(plan.world_size, plan.ranks_per_node, plan.rollout_tp_size)
    except PlacementError as error:
        problems.append(LaunchProblem("rollout", str(error)))
    if plan.shape is not None and plan.rollout_tp_size >= 1:
        problems += [
            LaunchProblem("rollout", message)
            for message in vllm_tensor_parallel_problems(
                plan.rollout_tp_size,
                plan.shape.num_attention_heads,
                plan.shape.num_key_value_heads,
            )
        ]
    return problems


def plan_memory(plan: LaunchPlan) -> MemoryEstimate | None:
    """The plan's per-GPU estimate, or ``None`` without a model shape or a valid layout."""
    layout = layout_of(plan)
    if plan.shape is None or layout is None:
        return None
    return estimate_memory(plan.shape, layout, plan.memory, plan.gpu_memory_bytes)


def check_memory(plan: LaunchPlan) -> list[LaunchProblem]:
    """The estimated peak fits in the GPU's memory (skipped for CPU runs: no GPU memory)."""
    estimate = plan_memory(plan)
    if estimate is None or plan.gpu_memory_bytes <= 0:
        return []
    if estimate.peak <= plan.gpu_memory_bytes:
        return []
    phase = "training" if estimate.training >= estimate.generation else "generation"
    return [
        LaunchProblem(
            "memory",
            f"estimated per-GPU peak {estimate.peak / GIB:.1f} GiB ({phase} phase) exceeds the "
            f"GPU's {plan.gpu_memory_bytes / GIB:.1f} GiB: raise tensor/pipeline parallel, "
            "enable the distributed optimizer or activation recomputation, or lower vLLM's "
            "memory fraction",
        )
    ]


def check_engine(plan: LaunchPlan) -> list[LaunchProblem]:
    """The configured engine's module ``opefo_nemo.engines.<engine>`` is installed (found without
    importing it, so a missing NeMo does not crash preflight)."""
    module = f"opefo_nemo.engines.{plan.engine}"
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if found:
        return []
    return [
        LaunchProblem(
            "engine",
            f"engine {plan.engine!r} is not available: module {module} is not installed in "
            "this environment",
        )
    ]


def plan_problems(plan: LaunchPlan) -> list[LaunchProblem]:
    """The problems of the plan's numbers and paths (every check but the engine's)."""
    return [
        *check_layout(plan),
        *check_batch(plan),
        *check_rollout(plan),
        *check_paths(plan),
        *check_memory(plan),
    ]


def all_problems(plan: LaunchPlan) -> list[LaunchProblem]:
    """Every check's problems, in a fixed order: engine, layout, batch, rollout, paths,
    memory."""
    return [*check_engine(plan), *plan_problems(plan)]
