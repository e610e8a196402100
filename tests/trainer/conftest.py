"""Fixtures of the trainer tests: one vLLM rollout engine per session, a trainer on it, and the
tiny model the hf update tests train (``warm_model`` and ``demo_model``: tests/conftest.py).

Every trainer built with :func:`make_trainer` reuses the session's rollout engine (its policy's
weights are loaded into it first), so the vLLM servers start once for the whole area.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from opefo_nemo.config.compose import compose
from opefo_nemo.trainer.loop import Trainer
from opefo_nemo.trainer.setup import build_trainer, start_rollout
from tests.trainer.small_run import run_overrides
from tests.trainer.update_inputs import tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The hf update tests' tiny model (tests/trainer/update_inputs.py), built once per module."""
    return tiny_model(tmp_path_factory.mktemp("m") / "tiny")


@pytest.fixture(scope="session")
def shared_rollout(warm_model):
    config, _ = compose(["model=tiny_arithmetic", f"model.path={warm_model}"])
    rollout = start_rollout(config, warm_model, lambda: iter(()))
    yield rollout
    rollout.close()


@pytest.fixture
def make_trainer(warm_model, shared_rollout, tmp_path):
    def make(extra: Sequence[str] = (), output_dir: Path | None = None) -> Trainer:
        out = output_dir if output_dir is not None else tmp_path / "run"
        config, config_dict = compose(run_overrides(warm_model, out, extra))
        return build_trainer(config, config_dict, out, shared_rollout)

    return make
