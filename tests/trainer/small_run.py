"""The overrides of a small training run of the first task's embedded model, for the tests that
run the trainer (``make_trainer`` in conftest.py, and the tests that compose a run themselves)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

SMALL_RUN = (
    "model=tiny_arithmetic",  # the first task: its warm start is a quarter of the demo task's
    "trainer.prompts_per_step=4",
    "trainer.responses_per_prompt=4",
    "trainer.max_steps=2",
    "metrics.progress=false",
    "metrics.tensorboard=false",
    "checkpoint.every=0",
)


def run_overrides(model: Path, output_dir: Path, extra: Sequence[str] = ()) -> list[str]:
    return [f"model.path={model}", f"run.output_dir={output_dir}", *SMALL_RUN, *extra]
