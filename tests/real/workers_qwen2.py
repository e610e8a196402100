"""Rank functions of ``test_packaged_qwen2.py``: ``engine=megatron`` built from the converted
Qwen2 on gloo CPU ranks (spawned by ``tests.parallel.world``)."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from safetensors import safe_open

from opefo_nemo.config.method import load_method
from opefo_nemo.core.objectives import build_objective
from opefo_nemo.trainer.update import update_rollout_batch
from tests.engines.megatron.tiny import release_parallel_state
from tests.engines.megatron.workers_build import _policy

#: The strict-GRPO step of the engine comparison: the lr `tests.engines.megatron.workers_build`
#: builds with.
LR = 1e-3


def stats_export_and_step(
    rank: int, world_size: int, hf_dir: str, settings: dict, step: bool, batch, out: str
) -> None:
    """On the built policy: the token statistics of ``batch`` (rank 0 saves ``stats.pt``), the
    largest difference of each exported weight from the one in ``model.safetensors``
    (``export.pt``), then, with ``step``, one strict-GRPO step whose metrics and weights rank 0
    saves (``step.pt``, the weights memory-mappable)."""
    warnings.filterwarnings("ignore")
    try:
        policy = _policy(hf_dir, settings)
        stats = policy.token_stats(batch)
        exported = {}
        with safe_open(Path(hf_dir) / "model.safetensors", "pt") as stored:
            names = set(stored.keys())
            for name, tensor in policy.named_weights():  # collective: every rank walks it
                if rank == 0:
                    exported[name] = float((tensor - stored.get_tensor(name)).abs().max())
        if rank == 0:
            torch.save((stats.logprob, stats.entropy), Path(out) / "stats.pt")
            torch.save((exported, sorted(names)), Path(out) / "export.pt")
        if not step:
            return
        method = load_method("grpo_strict", [f"lr={LR}"])
        outcome = update_rollout_batch(policy, build_objective(method), batch, 3, 0)
        weights = {name: tensor.clone() for name, tensor in policy.named_weights()}
        if rank == 0:
            torch.save((outcome.metrics, weights), Path(out) / "step.pt")
    finally:
        release_parallel_state()
