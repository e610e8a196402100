"""Shared fixtures: the warm-started tiny model and one vLLM rollout engine per session.

Every trainer built with :func:`make_trainer` reuses the session's rollout engine (its policy's
weights are loaded into it first), so the vLLM servers start once for the whole area.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from opefo_nemo.config.compose import compose
from opefo_nemo.trainer.loop import Trainer
from opefo_nemo.trainer.setup import build_trainer, embedded_model, start_rollout

SMALL_RUN = (
    "model=tiny_arithmetic",  # the first task: its warm start is a quarter of the demo task's
    "trainer.prompts_per_step=4",
    "trainer.responses_per_prompt=4",
    "trainer.max_steps=2",
    "metrics.progress=false",
    "metrics.tensorboard=false",
    "checkpoint.every=0",
)


@pytest.fixture(scope="session")
def warm_model(tmp_path_factory) -> Path:
    """The first task's embedded model (tiny Qwen2, warm-started on arithmetic), built once into
    the default place under a temporary ``OPEFO_CACHE``."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OPEFO_CACHE", str(tmp_path_factory.mktemp("cache")))
        return embedded_model(compose(["model=tiny_arithmetic"])[0])


@pytest.fixture(scope="session")
def demo_model(tmp_path_factory) -> Path:
    """The demo's warm-started model (``model=tiny_arithmetic_orders``), copied from the package
    into a temporary ``OPEFO_CACHE`` once per session."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OPEFO_CACHE", str(tmp_path_factory.mktemp("cache")))
        return embedded_model(compose([])[0])


@pytest.fixture(scope="session")
def shared_rollout(warm_model):
    config, _ = compose(["model=tiny_arithmetic", f"model.path={warm_model}"])
    rollout = start_rollout(config, warm_model, lambda: iter(()))
    yield rollout
    rollout.close()


def run_overrides(model: Path, output_dir: Path, extra: Sequence[str] = ()) -> list[str]:
    return [f"model.path={model}", f"run.output_dir={output_dir}", *SMALL_RUN, *extra]


@pytest.fixture
def make_trainer(warm_model, shared_rollout, tmp_path):
    def make(extra: Sequence[str] = (), output_dir: Path | None = None) -> Trainer:
        out = output_dir if output_dir is not None else tmp_path / "run"
        config, config_dict = compose(run_overrides(warm_model, out, extra))
        return build_trainer(config, config_dict, out, shared_rollout)

    return make
