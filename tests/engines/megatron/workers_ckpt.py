"""Rank function for the sharded-checkpoint and export tests, and the cached world run they share.

One spawned 2-rank gloo world (``tests.parallel.world.run_world``) does everything that needs a
real megatron-core ``GPTModel`` (a spawn costs more than the checks) and records, per check, the
names that failed, so that each test asserts its own check:

1. TP 2: tiny Hugging Face weights loaded strictly into rope GPTModels. ``qwen2`` and
   ``qwen2_tied`` in megatron's ``DistributedDataParallel`` with megatron's optimizer
   (:func:`megatron_trainer`) take one step (so that optimizer state, which export must skip,
   is in the checkpoint), get the Hugging Face weights back and are saved with
   :func:`save_megatron`; ``llama`` is written as NeMo writes its ``model_weights/``
   (:func:`save_like_nemo`: ``model.`` key prefix, no manifest). The export tests convert these.
2. TP 2: a trainable GPTModel (learned positions) takes one step through
   :class:`~opefo_nemo.engines.megatron.optimizer_step.MegatronOptimizerStep`, is saved, takes two
   more; a save with a non-JSON ``extra`` is refused; a fresh model and optimizer load the
   checkpoint (state bit-equal to the saved one) and take the same two steps (bit-equal again).
3. TP 1 × DP 2: the TP-2 checkpoint loaded into a TP-1 model equals the TP-gathered weights and
   optimizer state; a model of another MLP width is refused, naming the key and both shapes.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from opefo_nemo.config.engines import MegatronEngineConfig
from opefo_nemo.engines.megatron import compat
from opefo_nemo.engines.megatron.checkpoint import load_megatron, save_megatron
from opefo_nemo.engines.megatron.cpu_execution import megatron_on_cpu
from opefo_nemo.engines.megatron.megatron_optimizer import build_megatron_optimizer, wrap_in_ddp
from opefo_nemo.engines.megatron.optimizer_step import MegatronOptimizerStep
from opefo_nemo.models.megatron_weights import (
    MegatronLayout,
    gather_shards,
    hf_to_megatron,
    split_for_rank,
    weight_groups,
)
from opefo_nemo.models.megatron_weights.weight_mapping import Sharding
from tests.parallel.world import run_world

from .tiny import hf_config, hf_model, hf_weights, layout, megatron_gpt, release_parallel_state
from .torch_dist_writer import torch_dist_writer_on_this_torch

#: The families saved for export: ``save_megatron`` for ours, NeMo's layout for ``llama``.
EXPORTED = ("qwen2", "qwen2_tied", "llama")
#: The engine settings of every checkpointed model here: fp32, megatron's non-distributed
#: optimizer (its inner ``torch.optim.AdamW``'s state is per parameter, so it can be compared
#: tensor by tensor), no clipping, warm-up over 3 steps.
ENGINE = MegatronEngineConfig(
    dtype="float32",
    use_distributed_optimizer=False,
    grad_clip=0.0,
    weight_decay=0.1,
    warmup_steps=3,
)
#: The trainable model: vocabulary 100 padded to a multiple of 56 × TP is 112 at TP 1 and TP 2,
#: so its checkpoint reshards between them.
TRAIN_DIVISIBLE_BY = 56
TOKENS = 8
_CACHE: dict[str, Path] = {}


def world_results(root: Path) -> Path:
    """Run the world once per test session (both test modules share it) under ``root``; returns
    ``root``, holding ``results.json``, the checkpoints and ``hf_<family>/`` (the originals)."""
    if "root" not in _CACHE:
        shards = {}
        for family in EXPORTED:
            model = hf_model(family, seed=1)
            model.save_pretrained(root / f"hf_{family}")
            shards[family] = hf_to_megatron(layout(family, tp=2), hf_weights(model))
        run_world(checkpoint_world, 2, shards, str(root))
        _CACHE["root"] = root
    return _CACHE["root"]


@contextmanager
def checkpoint_on_cpu():
    """What ``dist_checkpointing.save`` asks of CUDA pointed at the CPU
    (:func:`~opefo_nemo.engines.megatron.cpu_execution.megatron_on_cpu`) and, on 0.11,
    :func:`~.torch_dist_writer.torch_dist_writer_on_this_torch`."""
    with megatron_on_cpu(), torch_dist_writer_on_this_torch():
        yield


def checkpoint_world(rank: int, world_size: int, shards, root: str) -> None:
    """The module docstring's three parts; rank 0 writes ``results.json``
    (``{check: [failed names]}``, plus the refused load's message)."""
    warnings.filterwarnings("ignore")
    out = Path(root)
    results: dict[str, list[str] | str] = {}
    with megatron_on_cpu():
        compat.initialize_model_parallel(2, 1, gloo_groups=True)
        try:
            _save_for_export(shards, out)
            saved = _train_save_resume(out, results)
        finally:
            release_parallel_state()
        compat.initialize_model_parallel(1, 1, gloo_groups=True)
        try:
            _reshard_to_tp1(out, saved, results)
        finally:
            release_parallel_state()
    if rank == 0:
        (out / "results.json").write_text(json.dumps(results, indent=1))


def megatron_trainer(model):
    """``model`` in megatron's ``DistributedDataParallel`` and megatron's optimizer (lr 1e-2,
    :data:`ENGINE`), as ``engine=megatron`` builds them."""
    ddp = wrap_in_ddp(model, ENGINE)
    return ddp, build_megatron_optimizer(ddp, ENGINE, 1e-2)


def inner_adamw(optimizer) -> torch.optim.Optimizer:
    """The ``torch.optim.AdamW`` inside megatron's (non-distributed, fp32) optimizer: its
    per-parameter state is keyed by the model's own parameters."""
    (inner,) = (part.optimizer for part in getattr(optimizer, "chained_optimizers", [optimizer]))
    return inner


def save_like_nemo(directory: Path, model, prefix: str) -> None:
    """``model``'s ``sharded_state_dict(prefix=prefix)`` as a bare ``torch_dist`` checkpoint:
    what NeMo writes as a ``.nemo``'s ``model_weights/`` (no manifest of ours). Collective."""
    from megatron.core import dist_checkpointing

    if dist.get_rank() == 0:
        directory.mkdir(parents=True)
    dist.barrier()
    with checkpoint_on_cpu():
        dist_checkpointing.save(model.sharded_state_dict(prefix=prefix), str(directory))


def _save_for_export(shards, out: Path) -> None:
    from megatron.core import parallel_state

    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    for family in EXPORTED:
        model = megatron_gpt(layout(family, tp=2))
        extra = {k: v for k, v in model.state_dict().items() if k.endswith("_extra_state")}
        weights = {**extra, **shards[family][(0, tp_rank)]}
        model.load_state_dict(weights, strict=True)
        if family == "llama":
            save_like_nemo(out / "nemo_llama", model, "model.")
            continue
        ddp, optimizer = megatron_trainer(model)
        for param in ddp.parameters():  # optimizer state in the checkpoint, which export skips
            param.main_grad.fill_(1.0)
        optimizer.step()
        with torch.no_grad():  # undo the step: the export must give the loaded weights
            model.load_state_dict(weights, strict=True)
        with checkpoint_on_cpu():
            save_megatron(out / f"sharded_{family}", model, optimizer, {"family": family})


def _train_layout(tp: int, intermediate_size: int = 48) -> MegatronLayout:
    config = {**hf_config("llama"), "num_hidden_layers": 2, "intermediate_size": intermediate_size}
    return MegatronLayout.from_hf_config(
        config, tensor_parallel=tp, make_vocab_size_divisible_by=TRAIN_DIVISIBLE_BY
    )


def _shardings(lay: MegatronLayout) -> dict[str, Sharding]:
    """Stage-local name → TP sharding; names the mapping lacks (positions) are replicated."""
    return {spec.name: spec.sharding for group in weight_groups(lay) for spec in group}


def _train_model(lay: MegatronLayout, seed: int):
    """A GPTModel of ``lay`` whose full weights are drawn from ``seed`` (the same on every
    rank) and split for this TP rank."""
    from megatron.core import parallel_state

    model = megatron_gpt(
        lay, position_embedding_type="learned_absolute", max_sequence_length=TOKENS
    )
    shapes = {spec.name: spec.shape for group in weight_groups(lay) for spec in group}
    shardings = _shardings(lay)
    tp, tp_rank = lay.tensor_parallel, parallel_state.get_tensor_model_parallel_rank()
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for name, tensor in model.state_dict().items():
        if name.endswith("_extra_state"):
            state[name] = tensor
            continue
        noise = torch.randn(shapes.get(name, tuple(tensor.shape)), generator=generator)
        full = 1 + 0.1 * noise if "norm" in name else 0.3 * noise
        sharding = shardings.get(name, Sharding.REPLICATED)
        state[name] = split_for_rank(full, sharding, tp, tp_rank, name)
    model.load_state_dict(state, strict=True)
    return model


def _trainer(model) -> MegatronOptimizerStep:
    """The production step (DP reduction, norm, warm-up lr, megatron's step) over ``model``."""
    from megatron.core import parallel_state

    ddp, optimizer = megatron_trainer(model)
    groups = (
        parallel_state.get_data_parallel_group(),
        parallel_state.get_model_parallel_group(),
    )
    return MegatronOptimizerStep(ddp, optimizer, ENGINE, *groups)


def _train_step(updates: MegatronOptimizerStep, step: int) -> None:
    """One step on next-token cross-entropy of random tokens drawn from ``step``."""
    tokens = torch.randint(0, 100, (2, TOKENS + 1), generator=torch.Generator().manual_seed(step))
    positions = torch.arange(TOKENS).expand(2, TOKENS)
    updates.zero_grad()
    loss = updates.model(tokens[:, :-1], positions, None, labels=tokens[:, 1:])
    loss.mean().backward()
    assert not updates.reduce(torch.zeros(()))
    updates.step()
    updates.advance()


def snapshot(model, optimizer, rename: Callable[[str], str] = str) -> dict[str, torch.Tensor]:
    """Weights (``weight:<name>``), per-parameter optimizer state (``<state>:<name>``: the inner
    AdamW's ``exp_avg``, ``exp_avg_sq``, ``step``) and the learning rates, as copies, of
    ``model`` (the module inside the DDP) and megatron's ``optimizer``; ``rename`` maps a
    parameter name (e.g. to its global layer)."""
    optimizer = inner_adamw(optimizer)
    copies = {"lr": torch.tensor([group["lr"] for group in optimizer.param_groups])}
    for local_name, param in model.named_parameters():
        name = rename(local_name)
        copies[f"weight:{name}"] = param.detach().clone()
        for key, value in optimizer.state[param].items():
            copies[f"{key}:{name}"] = value.detach().clone()
    return copies


def differences(expected: dict, actual: dict) -> list[str]:
    """Keys missing on either side or not bit-equal, from every rank (``r<rank>:<key>``)."""
    mine = sorted(
        key
        for key in expected.keys() | actual.keys()
        if key not in expected or key not in actual or not torch.equal(expected[key], actual[key])
    )
    everyone: list[list[str]] = [[] for _ in range(dist.get_world_size())]
    dist.all_gather_object(everyone, mine)
    return [f"r{rank}:{key}" for rank, keys in enumerate(everyone) for key in keys]


def _train_save_resume(out: Path, results: dict) -> dict[str, torch.Tensor]:
    """Part 2 (TP 2); returns the saved snapshot gathered over TP (the full tensors)."""
    from megatron.core import parallel_state

    lay = _train_layout(2)
    model = _train_model(lay, seed=0)
    updates = _trainer(model)
    _train_step(updates, 0)
    optimizer = updates.optimizer
    with checkpoint_on_cpu():
        save_megatron(out / "train_tp2", model, optimizer, {"steps": updates.steps})
    saved = snapshot(model, optimizer)
    for step in (1, 2):
        _train_step(updates, step)
    after_two = snapshot(model, optimizer)
    results["moved_after_save"] = differences(saved, after_two)
    try:  # refused: the checkpoint on disk must stay the saved one (checked by the next load)
        with checkpoint_on_cpu():
            save_megatron(out / "train_tp2", model, optimizer, {"steps": torch.zeros(1)})
        results["refused_save_error"] = "no error"
    except TypeError as error:
        results["refused_save_error"] = str(error)

    load_megatron(out / "train_tp2", model, optimizer)
    results["load_into_moved_model"] = differences(saved, snapshot(model, optimizer))

    fresh = _train_model(lay, seed=1)
    fresh_updates = _trainer(fresh)
    extra = load_megatron(out / "train_tp2", fresh, fresh_updates.optimizer)
    fresh_updates.steps = extra["steps"]
    results["load_into_fresh_model"] = differences(saved, snapshot(fresh, fresh_updates.optimizer))
    for step in (1, 2):
        _train_step(fresh_updates, step)
    results["resume_equals_uninterrupted"] = differences(
        after_two, snapshot(fresh, fresh_updates.optimizer)
    )
    shardings = _shardings(lay)
    tp_group = parallel_state.get_tensor_model_parallel_group()
    full = {}
    for key, tensor in saved.items():
        name = key.partition(":")[2]
        sharding = shardings.get(name, Sharding.REPLICATED) if tensor.dim() else Sharding.REPLICATED
        parts = [torch.empty_like(tensor) for _ in range(2)]
        dist.all_gather(parts, tensor.contiguous(), group=tp_group)
        full[key] = gather_shards(parts, sharding, key)
    return full


def _reshard_to_tp1(out: Path, saved_full: dict, results: dict) -> None:
    """Part 3 (TP 1 × DP 2)."""
    model = _train_model(_train_layout(1), seed=2)
    _, optimizer = megatron_trainer(model)
    load_megatron(out / "train_tp2", model, optimizer)
    results["tp2_to_tp1"] = differences(saved_full, snapshot(model, optimizer))

    wider = _train_model(_train_layout(1, intermediate_size=64), seed=2)
    _, wider_optimizer = megatron_trainer(wider)
    try:
        load_megatron(out / "train_tp2", wider, wider_optimizer)
        results["shape_mismatch_error"] = "no error"
    except ValueError as error:
        results["shape_mismatch_error"] = str(error)
