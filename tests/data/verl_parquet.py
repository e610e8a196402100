"""A DAPO-Math-17k-style parquet in verl's layout, written for the data tests and the Slurm job
that trains on one."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from opefo_nemo.data.templates import DAPO_PREFIX, DAPO_SUFFIX


def write_verl_parquet(path: Path, rows: list[tuple[str, str]], repeat: int = 1) -> None:
    """A tiny DAPO-Math-17k-style parquet: DAPO-templated user message + reward_model."""
    prompts, reward_models = [], []
    for _ in range(repeat):
        for problem, answer in rows:
            content = DAPO_PREFIX + problem + DAPO_SUFFIX
            prompts.append([{"content": content, "role": "user"}])
            reward_models.append({"ground_truth": answer, "style": "rule-lean"})
    table = pa.table(
        {
            "data_source": ["math_dapo"] * len(prompts),
            "prompt": prompts,
            "reward_model": reward_models,
        }
    )
    pq.write_table(table, path)
