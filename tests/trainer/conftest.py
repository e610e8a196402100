"""Fixtures of the trainer tests: the tiny model the hf update tests train. The models
several areas share (``warm_model``, ``demo_model``) and the trainer on the session's one vLLM
rollout engine (``make_trainer``) are in tests/conftest.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.update_inputs import tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The hf update tests' tiny model (tests/trainer/update_inputs.py), built once per module."""
    return tiny_model(tmp_path_factory.mktemp("m") / "tiny")
