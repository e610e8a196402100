"""Sharded checkpoints of a megatron-core model and megatron's optimizer (``dist_checkpointing``'s
``torch_dist`` format, as NeMo's ``MegatronGPTModel`` writes): weights at their global offsets, so
they reshard to any TP × PP × DP layout. Layout, optimizer state, pipeline stages, atomicity and
CUDA use: docs/megatron.md, "Sharded checkpoints".
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from megatron.core.transformer.module import MegatronModule

from opefo_nemo.engines.megatron import compat
from opefo_nemo.models.megatron_weights.checkpoint_files import (
    FORMAT,
    MANIFEST,
    OPTIMIZER_PREFIX,
    VERSION,
    read_manifest,
    replace_directory,
    tensor_metadata,
)

#: The manifest's ``optimizer_state`` for a checkpoint of megatron's optimizer.
MEGATRON_OPTIMIZER = "megatron"


def save_megatron(directory: Path, model: MegatronModule, optimizer: Any, extra: dict) -> None:
    """Write ``model`` (the ``GPTModel`` inside megatron's DDP; its ``sharded_state_dict()``, keys
    without NeMo's ``model.`` prefix), the ``MegatronOptimizer``'s own sharded state (under
    ``optimizer.*``) and the JSON-able ``extra`` to ``directory``. Collective: every rank of the
    job calls it, each pipeline stage writing the tensors it holds. A non-JSON-able ``extra``
    raises before anything is written. ``dist_checkpointing.save`` synchronises CUDA and puts its
    failure flag on ``torch.cuda.current_device()``: CPU ranks run it inside
    :func:`~.cpu_execution.megatron_on_cpu`."""
    extra_json = _json_able(extra)
    _refuse_unsupported(optimizer)
    model_state = model.sharded_state_dict()
    optimizer_state = compat.optimizer_sharded_state(optimizer, model_state, is_loading=False)
    state = {"model": model_state, "optimizer": optimizer_state}
    _write(directory, state, extra_json)


def load_megatron(directory: Path, model: MegatronModule, optimizer: Any) -> dict:
    """Restore what :func:`save_megatron` wrote into ``model`` (the ``GPTModel`` inside megatron's
    DDP) and the ``MegatronOptimizer``; returns ``extra``. Collective over all ranks.

    Raises before loading anything: ``FileNotFoundError`` for a missing checkpoint (before any
    collective); ``ValueError`` for a checkpoint not written by :func:`save_megatron`, or naming
    the key (and both shapes) when the model does not match it (on every rank at once, after
    one exchange of the ranks' key lists: a pipeline stage checks the keys it holds,
    :func:`_check_model_matches`)."""
    from megatron.core import dist_checkpointing

    directory = Path(directory)
    manifest = read_manifest(directory)
    if manifest["optimizer_state"] != MEGATRON_OPTIMIZER:
        raise ValueError(
            f"{directory} was not written with megatron's optimizer (engine=megatron / aligner)"
        )
    _refuse_unsupported(optimizer)
    _check_model_matches(model.sharded_state_dict(), tensor_metadata(directory), directory)
    _materialize_adam_state(optimizer)
    model_state = model.sharded_state_dict()
    optimizer_state = compat.optimizer_sharded_state(optimizer, model_state, is_loading=True)
    state = {"model": model_state, "optimizer": optimizer_state}
    loaded = dist_checkpointing.load(state, str(directory))
    assert isinstance(loaded, dict)  # a (state, keys, keys) tuple only with a strict mode set
    model.load_state_dict(loaded["model"], strict=True)
    with torch.no_grad():  # fp32 main weights are views of the (trainable) parameters
        optimizer.load_state_dict(loaded["optimizer"])
    _separate_adam_steps(optimizer)
    return manifest["extra"]


def _materialize_adam_state(optimizer: Any) -> None:
    """Give a fresh ``MegatronOptimizer`` whose inner optimizer is torch's AdamW (megatron's
    fallback without Transformer Engine or apex) the per-parameter state it is loaded into.

    megatron's distributed optimizer reads the inner optimizer's ``step`` of every parameter
    when it builds the state dict to load into, and torch's AdamW has none before its first
    step. One step at learning rate 0 with zero gradients creates it (zero moments, step 1)
    without moving any weight; the load then overwrites all of it."""
    for inner in _inner_torch_optimizers(optimizer):
        if inner.state:
            continue
        saved = [group["lr"] for group in inner.param_groups]
        params = [p for group in inner.param_groups for p in group["params"]]
        for group in inner.param_groups:
            group["lr"] = 0.0
        for param in params:
            param.grad = torch.zeros_like(param)
        inner.step()
        for group, lr in zip(inner.param_groups, saved, strict=True):
            group["lr"] = lr
        for param in params:
            param.grad = None


def _refuse_unsupported(optimizer: Any) -> None:
    """A clear error before any collective where megatron-core cannot checkpoint ``optimizer``
    (:func:`~.compat.distributed_optimizer_checkpoint_problem`)."""
    from megatron.core.optimizer import DistributedOptimizer

    parts = getattr(optimizer, "chained_optimizers", [optimizer])
    if any(isinstance(part, DistributedOptimizer) for part in parts):
        problem = compat.distributed_optimizer_checkpoint_problem()
        if problem is not None:
            raise NotImplementedError(f"checkpoint of megatron's optimizer: {problem}")


def _inner_torch_optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    inner = (o.optimizer for o in getattr(optimizer, "chained_optimizers", [optimizer]))
    return [o for o in inner if isinstance(o, torch.optim.Optimizer)]


def _separate_adam_steps(optimizer: Any) -> None:
    """After a load, every parameter's ``step`` its own tensor again. megatron's distributed
    optimizer hands torch's AdamW one shared ``step`` tensor for all parameters, which AdamW
    increments in place once per parameter: the bias correction of the next step would use a
    step count of (number of parameters) instead of 1 more."""
    for inner in _inner_torch_optimizers(optimizer):
        for state in inner.state.values():
            if isinstance(state.get("step"), torch.Tensor):
                state["step"] = state["step"].clone()


def _json_able(extra: dict) -> Any:
    try:
        return json.loads(json.dumps(extra))
    except TypeError as error:
        raise TypeError(f"checkpoint extra must be JSON-able ({error})") from error


def _write(directory: Path, state: dict[str, Any], extra: Any) -> None:
    """``dist_checkpointing.save`` of ``state`` into ``.<name>.partial`` beside ``directory``, the
    manifest beside it, then rank 0 renames it into place once every rank has finished, so
    ``directory`` is either the old complete checkpoint or the new one (all ranks must see the
    same filesystem, as ``dist_checkpointing`` requires). Collective."""
    from megatron.core import dist_checkpointing

    directory = Path(directory)
    staging = directory.parent / f".{directory.name}.partial"
    if dist.get_rank() == 0:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    dist.barrier()
    dist_checkpointing.save(state, str(staging))
    if dist.get_rank() == 0:
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "model_prefix": "",
            "optimizer_state": MEGATRON_OPTIMIZER,
            "world_size": dist.get_world_size(),
            "extra": extra,
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1))
        replace_directory(staging, directory)
    dist.barrier()


def _check_model_matches(
    model_state: dict[str, Any],
    stored: Mapping[str, tuple[tuple[int, ...], torch.dtype]],
    directory: Path,
) -> None:
    """Every model tensor of every rank is in the checkpoint with its global shape, and the
    checkpoint holds no model tensor that no rank's model has; raises ``ValueError`` naming the
    key (and both shapes) on every rank together.

    A pipeline stage holds only its part of the model (its layers; the embedding on the first
    stage, the final norm and output layer on the last), so each rank checks the keys it holds
    and the ranks' key lists are all-gathered (one ``all_gather_object`` over the job, when one
    is initialised) to find the checkpoint's keys that no stage wants and to raise the first
    rank's error everywhere, so that no rank goes on into ``dist_checkpointing.load`` alone."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, apply_factories

    apply_factories(model_state)
    expected = {
        sharded.key: tuple(sharded.global_shape)
        for sharded in nested_values(model_state)
        if isinstance(sharded, ShardedTensor)
    }
    problem = None
    for key, shape in expected.items():
        if key not in stored:
            problem = f"checkpoint {directory} has no {key} (shape {shape} in the model)"
        elif stored[key][0] != shape:
            problem = (
                f"checkpoint {directory}: {key} has shape {stored[key][0]}, the model's is {shape}"
            )
        if problem is not None:
            break
    everyone: list[Any] = [(sorted(expected), problem)]
    if dist.is_initialized() and dist.get_world_size() > 1:
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, (sorted(expected), problem))
    for rank, (_, found) in enumerate(everyone):
        if found is not None:
            raise ValueError(f"{found} (on rank {rank})")
    wanted = {key for keys, _ in everyone for key in keys}
    unexpected = sorted(
        key for key in stored if not key.startswith(OPTIMIZER_PREFIX) and key not in wanted
    )
    if unexpected:
        raise ValueError(
            f"checkpoint {directory} holds model tensors the model lacks: {', '.join(unexpected)}"
        )
