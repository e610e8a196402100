"""Sharded checkpoints of a megatron-core model and its optimizer (megatron ``dist_checkpointing``).

:func:`save_sharded` writes, collectively over all ranks of the job, one ``torch_dist``
checkpoint directory (the format NeMo's ``MegatronGPTModel`` writes, e.g. a ``.nemo``'s
``model_weights/``) holding

- the model's ``sharded_state_dict(prefix=prefix)``: every weight under its global key, TP shards
  placed at their offsets in the full tensor and ``decoder.layers.*`` stacked along a prepended
  layer axis of size ``L`` (global layer index, so PP stages land in one tensor). NeMo's module
  tree names these keys with ``prefix="model."``; ours default to ``""``;
- the optimizer's per-parameter state (AdamW's ``exp_avg``, ``exp_avg_sq``) under
  ``optimizer.state.<name>.<model key>``, sharded exactly like the parameter it belongs to
  (megatron's ``optim_state_to_sharding_state``, as its non-distributed ``FP32Optimizer`` does),
  so it reshards with the weights; the shared ``step`` and the parameter groups'
  hyper-parameters go to the common (rank 0) part;
- :data:`MANIFEST`: the format, the key prefix, the optimizer's state names and ``extra`` (any
  JSON-able dict: scheduler state, step).

Because every tensor is stored at its global offsets, :func:`load_sharded` can load into any
TP × PP × DP layout of the same model (the padded vocabulary must come out the same:
``make_vocab_size_divisible_by × TP`` must give equal ``V'``). Resuming at the same layout is
exact: weights, optimizer state and ``step`` are restored bit for bit.

Pipeline stages: each stage saves and loads only the tensors it holds (its decoder layers at
their global layer index; the embedding on the first stage, the final norm and output layer on
the last). With tied embeddings at PP > 1 the last stage's copy of the word embedding
(``output_layer.weight``) is megatron's replica of ``embedding.word_embeddings.weight``
(``replica_id`` 1): it and its optimizer state are written once, from the first stage, and
every stage holding a copy loads that one tensor.

The optimizer is a plain ``torch.optim.Optimizer`` over this rank's parameters
(:func:`save_sharded` / :func:`load_sharded`), or a ``MegatronOptimizer``
(:func:`save_megatron` / :func:`load_megatron`): megatron's own ``sharded_state_dict`` of its
fp32 main weights and Adam moments in a format that reshards over DP, TP and PP like the weights
(:func:`~.compat.optimizer_sharded_state`).

Atomicity: everything is written into ``.<name>.partial`` beside ``directory`` and renamed into
place by rank 0 after every rank has finished, so ``directory`` is either the old complete
checkpoint or the new complete one. All ranks must see the same filesystem (as
``dist_checkpointing`` itself requires).

CUDA: ``dist_checkpointing.save`` synchronises CUDA and puts its failure flag on
``torch.cuda.current_device()`` (``strategies/filesystem_async.py``,
``strategies/state_dict_saver.py``); these functions therefore run as shipped on GPU ranks, and
the CPU tests redirect those calls (``tests/megatron/workers_ckpt.py``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ...models.megatron_weights.checkpoint_files import (
    FORMAT,
    MANIFEST,
    OPTIMIZER_PREFIX,
    VERSION,
    read_manifest,
    replace_directory,
    tensor_metadata,
)
from . import compat

#: The manifest's ``optimizer_state`` for a checkpoint of megatron's optimizer.
MEGATRON_OPTIMIZER = "megatron"


def save_sharded(
    directory: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    extra: dict,
    *,
    prefix: str = "",
) -> None:
    """Write ``model``, ``optimizer``'s state and the JSON-able ``extra`` to ``directory``.
    Collective: every rank of the job calls it. ``model`` is the unwrapped megatron-core module
    (``GPTModel``: its ``sharded_state_dict`` and ``state_dict`` keys must agree, which a
    ``Float16Module`` or DDP wrapper's do not).

    Bad input (a non-JSON-able ``extra``, optimizer parameters that are not the model's, or
    parameters at different steps) raises before anything is written."""
    directory = Path(directory)
    extra_json = _json_able(extra)
    model_state = model.sharded_state_dict(prefix=prefix)
    state: dict[str, Any] = {"model": model_state}
    state_names: list[str] = []
    if optimizer is not None:
        state_names = _state_names(optimizer)
        state["optimizer"] = _optimizer_sharded_state(
            optimizer, model_state, optimizer.state_dict()
        )
    _write(directory, state, prefix, state_names if optimizer is not None else None, extra_json)


def save_megatron(directory: Path, model: torch.nn.Module, optimizer: Any, extra: dict) -> None:
    """Write ``model`` (the ``GPTModel`` inside megatron's DDP), the ``MegatronOptimizer``'s
    state (module docstring) and the JSON-able ``extra`` to ``directory``. Collective."""
    extra_json = _json_able(extra)
    _refuse_unsupported(optimizer)
    model_state = model.sharded_state_dict()
    optimizer_state = compat.optimizer_sharded_state(optimizer, model_state, is_loading=False)
    state = {"model": model_state, "optimizer": optimizer_state}
    _write(directory, state, "", MEGATRON_OPTIMIZER, extra_json)


def load_megatron(directory: Path, model: torch.nn.Module, optimizer: Any) -> dict:
    """Restore what :func:`save_megatron` wrote into ``model`` and the ``MegatronOptimizer``;
    returns ``extra``. Collective; the model is checked against the checkpoint first, as in
    :func:`load_sharded`."""
    from megatron.core import dist_checkpointing

    directory = Path(directory)
    manifest = read_manifest(directory)
    if manifest["optimizer_state"] != MEGATRON_OPTIMIZER:
        raise ValueError(
            f"{directory} was not written with megatron's optimizer (engine=megatron / aligner)"
        )
    _refuse_unsupported(optimizer)
    _check_model_matches(model.sharded_state_dict(), tensor_metadata(directory), "", directory)
    _materialize_adam_state(optimizer)
    model_state = model.sharded_state_dict()
    optimizer_state = compat.optimizer_sharded_state(optimizer, model_state, is_loading=True)
    state = {"model": model_state, "optimizer": optimizer_state}
    loaded = dist_checkpointing.load(state, str(directory))
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


def _write(
    directory: Path, state: dict[str, Any], prefix: str, optimizer_state: Any, extra: Any
) -> None:
    """``dist_checkpointing.save`` of ``state`` into a staging directory, the manifest beside
    it, then the atomic rename (module docstring). Collective."""
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
            "model_prefix": prefix,
            "optimizer_state": optimizer_state,
            "world_size": dist.get_world_size(),
            "extra": extra,
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1))
        replace_directory(staging, directory)
    dist.barrier()


def load_sharded(
    directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None
) -> dict:
    """Load ``directory`` (written by :func:`save_sharded`) into ``model`` and, when given,
    ``optimizer``; returns the saved ``extra``. Collective over all ranks.

    Raises before loading anything: ``FileNotFoundError`` for a missing checkpoint (before any
    collective), ``ValueError`` naming the key (and both shapes) when the model does not match
    it (on every rank at once, after one exchange of the ranks' key lists: a pipeline stage
    checks the keys it holds, :func:`_check_model_matches`), or when an optimizer is given and
    the checkpoint holds none.
    """
    from megatron.core import dist_checkpointing

    directory = Path(directory)
    manifest = read_manifest(directory)
    prefix = manifest["model_prefix"]
    stored = tensor_metadata(directory)
    model_state = model.sharded_state_dict(prefix=prefix)
    _check_model_matches(model.sharded_state_dict(prefix=prefix), stored, prefix, directory)
    state: dict[str, Any] = {"model": model_state}
    if optimizer is not None:
        names = manifest["optimizer_state"]
        if names is None:
            raise ValueError(f"{directory} holds no optimizer state; load it with optimizer=None")
        if names == MEGATRON_OPTIMIZER:
            raise ValueError(f"{directory} holds megatron's optimizer state: use load_megatron")
        empty = _empty_optimizer_state(optimizer, names)
        state["optimizer"] = _optimizer_sharded_state(optimizer, model_state, empty)
    loaded = dist_checkpointing.load(state, str(directory))
    weights = {key.removeprefix(prefix): value for key, value in loaded["model"].items()}
    model.load_state_dict(weights, strict=True)
    if optimizer is not None:
        optimizer.load_state_dict(_restore_step(loaded["optimizer"]))
    return manifest["extra"]


def _params(optimizer: torch.optim.Optimizer) -> list[torch.nn.Parameter]:
    return [param for group in optimizer.param_groups for param in group["params"]]


def _state_names(optimizer: torch.optim.Optimizer) -> list[str]:
    """Per-parameter state names other than ``step`` (``[]`` before the first step); every
    parameter must carry the same ones (megatron shares one ``step`` across parameters)."""
    params = _params(optimizer)
    names = {tuple(sorted(optimizer.state[p])) if p in optimizer.state else () for p in params}
    if len(names) > 1:
        raise ValueError(
            f"optimizer parameters carry different state entries {sorted(names)}: save_sharded "
            "needs every parameter to have the same ones (take a step on all of them)"
        )
    return [name for name in (names.pop() if names else ()) if name != "step"]


def _empty_optimizer_state(optimizer: torch.optim.Optimizer, names: list[str]) -> dict[str, Any]:
    """An optimizer state dict shaped like the saved one, to be loaded into: per parameter, an
    empty tensor like the parameter for each of ``names``."""
    template = optimizer.state_dict()
    states = {
        index: {name: torch.empty_like(param) for name in names}
        for index, param in enumerate(_params(optimizer))
    }
    return {"state": states if names else {}, "param_groups": template["param_groups"]}


def _optimizer_sharded_state(
    optimizer: torch.optim.Optimizer, model_state: Mapping[str, Any], state_dict: dict[str, Any]
) -> dict[str, Any]:
    """``state_dict`` (an optimizer state dict) with each per-parameter tensor wrapped as a
    sharded tensor of its parameter's key; the common ``step`` is set aside as ``common_step``."""
    from megatron.core.dist_checkpointing.optimizer import (
        get_param_id_to_sharded_param_map,
        optim_state_to_sharding_state,
    )

    params = _params(optimizer)
    sharded = get_param_id_to_sharded_param_map(model_state, params)
    untracked = [index for index in range(len(params)) if index not in sharded]
    if untracked:
        shapes = [tuple(params[index].shape) for index in untracked]
        raise ValueError(
            f"optimizer parameters {untracked} (shapes {shapes}) are not parameters of the model "
            "being checkpointed"
        )
    steps = [entry["step"] for entry in state_dict["state"].values() if "step" in entry]
    if any(not torch.equal(torch.as_tensor(step), torch.as_tensor(steps[0])) for step in steps):
        raise ValueError("optimizer parameters are at different steps; save_sharded needs one")
    optim_state_to_sharding_state(state_dict, sharded, exclude_keys=("step",))
    if steps:
        state_dict["state"]["common_step"] = steps[0]
    return state_dict


def _restore_step(state_dict: dict[str, Any]) -> dict[str, Any]:
    """Give every parameter the shared ``common_step`` back (torch's optimizer state layout)."""
    step = state_dict["state"].pop("common_step", None)
    if step is not None:
        for entry in state_dict["state"].values():
            entry["step"] = step.clone() if isinstance(step, torch.Tensor) else step
    return state_dict


def _check_model_matches(
    model_state: Mapping[str, Any],
    stored: Mapping[str, tuple[tuple[int, ...], torch.dtype]],
    prefix: str,
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
    everyone = [(sorted(expected), problem)]
    if dist.is_initialized() and dist.get_world_size() > 1:
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, (sorted(expected), problem))
    for rank, (_, found) in enumerate(everyone):
        if found is not None:
            raise ValueError(f"{found} (on rank {rank})")
    wanted = {key for keys, _ in everyone for key in keys}
    unexpected = sorted(
        key
        for key in stored
        if key.startswith(prefix) and not key.startswith(OPTIMIZER_PREFIX) and key not in wanted
    )
    if unexpected:
        raise ValueError(
            f"checkpoint {directory} holds model tensors the model lacks: {', '.join(unexpected)}"
        )
