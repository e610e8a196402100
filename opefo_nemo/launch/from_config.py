"""A composed trainer config (``conf/config.yaml`` + groups + overrides) → a :class:`LaunchPlan`,
for ``opefo-preflight`` (docs/cluster.md, section 7): the layout, the memory settings and the paths
to check.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from opefo_nemo.kernels import FUSED_LINEAR
from opefo_nemo.launch.memory import GIB, MemorySettings
from opefo_nemo.launch.plan import LaunchPlan
from opefo_nemo.models.shape import ModelShape

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
RUNTIME_OVERHEAD_BYTES = 2 * GIB
"""Added on a GPU: CUDA context, NCCL buffers, allocator slack."""
VLLM_ASLEEP_BYTES = 1 * GIB
"""Added on a GPU that vLLM shares: a sleeping vLLM (weights offloaded, KV cache freed)."""
SYNTHETIC_DATA = ("arithmetic", "word_arithmetic")
"""``data.train`` values that name a built-in task instead of a file."""


def _section(config: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = config.get(name) or {}
    if not isinstance(value, Mapping):
        raise ValueError(f"config section {name} must be a mapping, got {type(value).__name__}")
    return value


def _required(section: Mapping[str, Any], prefix: str, key: str) -> Any:
    if key not in section:
        raise ValueError(f"config lacks {prefix}.{key}")
    return section[key]


def _model_shape(model: Mapping[str, Any]) -> ModelShape | None:
    path = model.get("path")
    if not path:
        return None
    try:
        return ModelShape.from_model_dir(path)
    except (OSError, ValueError):
        return None


def memory_settings(
    config: Mapping[str, Any], gpu: bool, corrects_update: bool = False
) -> MemorySettings:
    """The memory-relevant settings of ``config``; ``gpu``: a GPU run; ``corrects_update``: the
    method corrects its update along ``∇θ H̄`` (its objective's ``corrects_update``, which the
    caller looks up: this package does not import torch).

    Keys read (absent ones take the default shown): ``engine.name``, ``engine.micro_batch_size``,
    ``engine.max_tokens_per_micro_batch`` [null: micro_batch_size rows], ``engine.dtype``
    [bfloat16], ``engine.use_distributed_optimizer`` [false], ``engine.recompute_activations``
    [false], ``engine.make_vocab_size_divisible_by`` [128; 1 for hf], ``engine.stats_kernel``
    [auto; fused_linear drops the logits' memory],
    ``rollout.max_new_tokens``, ``rollout.gpu_memory_utilization`` [0: vLLM not on the training
    GPUs], ``data.max_prompt_tokens``. Precision: the ``hf`` engine keeps weights, gradients and
    both AdamW moments in ``engine.dtype``; every other engine is Megatron mixed precision
    (``dtype`` weights, fp32 main gradients, fp32 master weights and moments: 12 bytes per
    parameter)."""
    engine = _section(config, "engine")
    rollout = _section(config, "rollout")
    data = _section(config, "data")
    name = _required(engine, "engine", "name")
    dtype = str(engine.get("dtype", "bfloat16"))
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"engine.dtype {dtype!r} is not one of {sorted(DTYPE_BYTES)}")
    param_bytes = DTYPE_BYTES[dtype]
    single_device = name == "hf"
    budget = engine.get("max_tokens_per_micro_batch")
    vllm_fraction = float(rollout.get("gpu_memory_utilization", 0.0))
    return MemorySettings(
        sequence_length=int(_required(data, "data", "max_prompt_tokens"))
        + int(_required(rollout, "rollout", "max_new_tokens")),
        micro_batch_size=int(_required(engine, "engine", "micro_batch_size")),
        max_tokens_per_micro_batch=None if budget is None else int(budget),
        param_bytes=param_bytes,
        grad_bytes=param_bytes if single_device else 4,
        activation_bytes=param_bytes,
        optimizer_bytes=2 * param_bytes if single_device else 12,
        distributed_optimizer=bool(engine.get("use_distributed_optimizer", False)),
        activation_recompute=bool(engine.get("recompute_activations", False)),
        make_vocab_size_divisible_by=int(
            engine.get("make_vocab_size_divisible_by", 1 if single_device else 128)
        ),
        fused_output_layer=engine.get("stats_kernel") == FUSED_LINEAR,
        entropy_correction=corrects_update,
        vllm_memory_fraction=vllm_fraction,
        vllm_asleep_bytes=VLLM_ASLEEP_BYTES if gpu and vllm_fraction > 0 else 0,
        overhead_bytes=RUNTIME_OVERHEAD_BYTES if gpu else 0,
    )


def plan_from_config(
    config: Mapping[str, Any],
    world_size: int,
    gpu_memory_bytes: int = 0,
    gpus_per_node: int = 0,
    corrects_update: bool = False,
) -> LaunchPlan:
    """The launch plan of a composed config (a plain mapping) on ``world_size`` ranks,
    ``gpus_per_node`` per node (0: all on one node); ``corrects_update``: as for
    :func:`memory_settings`. Reads, beside its keys: ``engine.tensor_model_parallel_size`` [1],
    ``engine.pipeline_model_parallel_size`` [1], ``engine.sequence_parallel`` [false],
    ``engine.rollout_tp_size`` [1], ``data.train``, ``data.validation``,
    ``trainer.prompts_per_step``, ``trainer.responses_per_prompt``,
    ``method.updates_per_rollout`` [1], ``model.path``, ``model.embedded`` [false],
    ``model.packaged`` [null] (either: the model is made at start-up, its path is not checked),
    ``run.output_dir``, ``checkpoint.resume``; the ``hf`` engine has no parallel layout."""
    engine = _section(config, "engine")
    trainer = _section(config, "trainer")
    model = _section(config, "model")
    data = _section(config, "data")
    method = _section(config, "method")
    settings = memory_settings(config, gpu=gpu_memory_bytes > 0, corrects_update=corrects_update)
    tp = int(engine.get("tensor_model_parallel_size", 1))
    pp = int(engine.get("pipeline_model_parallel_size", 1))
    responses = int(_required(trainer, "trainer", "responses_per_prompt"))
    prompts = int(_required(trainer, "trainer", "prompts_per_step"))
    updates = int(method.get("updates_per_rollout", 1))
    data_parallel = max(world_size // max(tp * pp, 1), 1)
    micro_batches = prompts * responses // max(updates, 1) // data_parallel
    if settings.max_tokens_per_micro_batch is None:
        micro_batches //= settings.micro_batch_size
    micro_batches = max(micro_batches, 1)  # with a budget: at most one row each
    built_at_start = bool(model.get("embedded", False)) or bool(model.get("packaged"))
    data_paths = tuple(
        str(data[key])
        for key in ("train", "validation")
        if data.get(key) and str(data[key]) not in SYNTHETIC_DATA
    )
    resume = _section(config, "checkpoint").get("resume")
    return LaunchPlan(
        world_size=world_size,
        tensor_parallel=tp,
        pipeline_parallel=pp,
        micro_batch_size=settings.micro_batch_size,
        prompts_per_step=prompts,
        responses_per_prompt=responses,
        updates_per_rollout=updates,
        memory=replace(settings, num_micro_batches=micro_batches),
        engine=str(engine["name"]),
        sequence_parallel=bool(engine.get("sequence_parallel", False)),
        shape=_model_shape(model),
        gpu_memory_bytes=gpu_memory_bytes,
        model_path=None if built_at_start or not model.get("path") else str(model["path"]),
        data_paths=data_paths,
        checkpoint_dir=str(Path(_required(_section(config, "run"), "run", "output_dir"))),
        resume_path=str(resume)
        if resume and str(resume) not in ("auto", "fresh", "latest")
        else None,
        gpus_per_node=gpus_per_node,
        rollout_tp_size=int(engine.get("rollout_tp_size", 1)),
    )
