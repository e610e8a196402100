"""Rank functions of ``test_build.py``: ``engine=megatron``'s own builder
(:func:`~opefo_nemo.engines.megatron.build.build_megatron_policy`, ``engine.device=cpu``) on
real gloo ranks, spawned by ``tests.parallel.world``."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from opefo_nemo.config.engines import MegatronEngineConfig
from opefo_nemo.config.method import load_method
from opefo_nemo.core.objectives import build_objective
from opefo_nemo.trainer.update import update_rollout_batch

from .tiny import release_parallel_state
from .torch_dist_writer import torch_dist_writer_on_this_torch

#: The rollout temperature the statistics are taken at (spec §1).
TEMPERATURE = 0.7


def _policy(hf_dir: str, settings: dict):
    from opefo_nemo.engines.megatron.build import build_megatron_policy

    engine = MegatronEngineConfig(device="cpu", make_vocab_size_divisible_by=8, **settings)
    return build_megatron_policy(hf_dir, engine, lr=1e-3, temperature=TEMPERATURE)


def token_stats_of_built_engines(
    rank: int, world_size: int, cases: list[tuple[str, dict]], batch, out: str
) -> None:
    """For each ``(hf_dir, engine settings)``: the built policy's ``token_stats`` of ``batch``;
    rank 0 saves them as ``out/stats_<i>.pt``."""
    warnings.filterwarnings("ignore")
    for index, (hf_dir, settings) in enumerate(cases):
        try:
            stats = _policy(hf_dir, settings).token_stats(batch)
            if rank == 0:
                torch.save((stats.logprob, stats.entropy), Path(out) / f"stats_{index}.pt")
        finally:
            release_parallel_state()


def _weights(policy) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in policy.named_weights()}


def update_save_resume(
    rank: int, world_size: int, hf_dir: str, settings: dict, batch, out: str
) -> None:
    """Two OPEFO updates of ``batch`` with a checkpoint after the first; a fresh policy loads it
    and repeats the second. Rank 0 saves ``out/resume.pt``: the first step's metrics, the
    weights after it, after loading, and after the second step on each path, and both second
    steps' metrics."""
    warnings.filterwarnings("ignore")
    method = load_method("opefo", ["lr=1e-3"])
    try:
        policy = _policy(hf_dir, settings)
        first = update_rollout_batch(policy, build_objective(method), batch, 3, 0)
        policy.advance_schedule()
        with torch_dist_writer_on_this_torch():  # megatron-core 0.11's writer on torch 2.13
            policy.save(Path(out) / "checkpoint")
        saved = _weights(policy)
        second = update_rollout_batch(policy, build_objective(method), batch, 3, 0)
        straight = _weights(policy)
        fresh = _policy(hf_dir, settings)
        fresh.load(Path(out) / "checkpoint")
        loaded = _weights(fresh)
        resumed_second = update_rollout_batch(fresh, build_objective(method), batch, 3, 0)
        resumed = _weights(fresh)
        if rank == 0:
            torch.save(
                {
                    "first": first.metrics,
                    "skipped": first.skipped_steps,
                    "saved": saved,
                    "loaded": loaded,
                    "second": second.metrics,
                    "resumed_second": resumed_second.metrics,
                    "straight": straight,
                    "resumed": resumed,
                },
                Path(out) / "resume.pt",
            )
    finally:
        release_parallel_state()


def recompute_changes_nothing(rank: int, world_size: int, hf_dir: str, batch, out: str) -> None:
    """One OPEFO update with activation recomputation off, then on (fresh policies from the same
    checkpoint); rank 0 saves both runs' metrics and weights as ``out/recompute.pt``."""
    warnings.filterwarnings("ignore")
    method = load_method("opefo", ["lr=1e-3"])
    runs = []
    for recompute in (False, True):
        settings = {"dtype": "float32", "transformer_engine": False, "warmup_steps": 1}
        settings.update(tensor_model_parallel_size=2, recompute_activations=recompute)
        try:
            policy = _policy(hf_dir, settings)
            outcome = update_rollout_batch(policy, build_objective(method), batch, 3, 0)
            runs.append((outcome.metrics, _weights(policy)))
        finally:
            release_parallel_state()
    if rank == 0:
        torch.save(runs, Path(out) / "recompute.pt")


def one_update(rank: int, world_size: int, hf_dir: str, settings: dict, batch, out: str) -> None:
    """One OPEFO update of ``batch`` on the built policy; rank 0 saves its metrics and the
    weights after it as ``out/update.pt``."""
    warnings.filterwarnings("ignore")
    method = load_method("opefo", ["lr=1e-3"])
    try:
        policy = _policy(hf_dir, settings)
        outcome = update_rollout_batch(policy, build_objective(method), batch, 3, 0)
        weights = _weights(policy)  # collective: every rank walks the stream
        if rank == 0:
            torch.save((outcome.metrics, weights), Path(out) / "update.pt")
    finally:
        release_parallel_state()
