"""Spawned ranks of the dynamic sampling test (``test_dynamic_sampling.py``): each rank runs the
real :class:`Trainer` with the real ``HFPolicy`` (replicated, so that the ranks' updates are the
one process's without gradient communication) sampling with its own model, and rank 0 scoring
for all (:class:`LoopRanks`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from opefo_nemo.config.compose import compose
from opefo_nemo.data.prompt_codec import PromptCodec
from opefo_nemo.engines.hf import HFPolicy
from opefo_nemo.orchestration.ranks import LoopRanks
from opefo_nemo.trainer.loop import Trainer
from opefo_nemo.trainer.setup import load_datasets, start_engine_rollout


def steps(trainer: Trainer, count: int) -> dict[str, Any]:
    """``count`` rollout steps: each step's kept rows (their token ids) and its metrics but the
    timings."""
    kept: list[list[list[int]]] = []
    collect = trainer.collect

    def recorded():
        collected = collect()
        batch = collected.batch
        kept.append([] if batch is None else batch.input_ids.tolist())
        return collected

    trainer.collect = recorded  # type: ignore[method-assign]
    metrics = []
    for _ in range(count):
        row = trainer.train_step()
        trainer.step += 1
        metrics.append({k: v for k, v in row.items() if not k.startswith("time/")})
    return {"kept": kept, "metrics": metrics}


def two_ranks(rank: int, world_size: int, overrides: list[str], out: str) -> None:
    """Two steps on ``world_size`` ranks; each rank writes what it kept and logged."""
    ranks = LoopRanks(rank, world_size, world_size)
    config, config_dict = compose(overrides)
    model = Path(config.model.path)
    policy = HFPolicy(
        model, config.engine, lr=config.method.lr, temperature=config.rollout.temperature
    )
    codec = PromptCodec(model, config.data.template)
    train, validation = load_datasets(config, codec)
    rollout = start_engine_rollout(config, policy, codec.pad_id)
    trainer = Trainer(
        config, config_dict, policy, rollout, codec, train, validation, Path(out), ranks
    )
    report = steps(trainer, 2)
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(report))
